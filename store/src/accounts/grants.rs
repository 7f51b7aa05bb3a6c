//! What the ApiKey resources grant keys, compared with what was last recorded, the same way in
//! both stores: the audit log gets one row per grant that changed, not one per publish.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

/// A key's grant that differs from the one last recorded: `null` on the side where the key had
/// none (a new ApiKey resource, or one deleted).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GrantChange {
    pub key_id: String,
    pub account_id: String,
    pub before: Value,
    pub after: Value,
}

/// The keys whose grant in `grants` differs from `recorded`, with the recorded grant (before)
/// and the new one (after), `null` where absent.
pub(super) fn changed(
    recorded: &BTreeMap<String, Value>,
    grants: &BTreeMap<String, Value>,
) -> Vec<(String, Value, Value)> {
    let keys: BTreeSet<&String> = recorded.keys().chain(grants.keys()).collect();
    keys.into_iter()
        .filter_map(|key| {
            let before = recorded.get(key).cloned().unwrap_or(Value::Null);
            let after = grants.get(key).cloned().unwrap_or(Value::Null);
            (before != after).then(|| (key.clone(), before, after))
        })
        .collect()
}
