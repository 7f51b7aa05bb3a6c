//! What a process learnt from its last admissions of a key: that the key's requests or input
//! tokens are used up for the current window. A key over its limit is then refused before
//! its body is read with no round trip ([`super::Limiter::known_refusal`]); a key this process
//! has not seen over its limit is read, and its admission decides.
//!
//! Only keys over a limit are kept, each until its window ends, so the map is bounded by the
//! keys that are over a limit at once.

use std::time::{Duration, Instant};

use crds::config::Limits;
use dashmap::DashMap;

use super::{decide, AdmissionRequest, LimitError, Snapshot};

/// Past this many keys, those whose window ended are dropped at the next record.
const PRUNE_ABOVE: usize = 4_096;

#[derive(Default)]
pub(super) struct OverLimit {
    keys: DashMap<String, Reading>,
}

struct Reading {
    snapshot: Snapshot,
    window_ends: Instant,
}

impl OverLimit {
    /// Records the counts an admission of `key_id` read or left (its `reset_secs` counted
    /// from now): kept when they refuse one more request under `limits`, forgotten otherwise.
    pub(super) fn record(&self, key_id: &str, limits: &Limits, snapshot: Snapshot) {
        if decide(limits, &snapshot, &AdmissionRequest::REQUEST_ONLY).is_ok() {
            self.keys.remove(key_id);
            return;
        }
        let now = Instant::now();
        if self.keys.len() > PRUNE_ABOVE {
            self.keys.retain(|_, r| r.window_ends > now);
        }
        self.keys.insert(
            key_id.to_owned(),
            Reading {
                snapshot,
                window_ends: now + Duration::from_secs(snapshot.reset_secs),
            },
        );
    }

    /// The refusal of one more request of `key_id` under `limits` (which may have been raised
    /// since), by the counts recorded, while their window lasts.
    pub(super) fn refusal(&self, key_id: &str, limits: &Limits) -> Option<LimitError> {
        let now = Instant::now();
        let snapshot = {
            let reading = self.keys.get(key_id)?;
            let left = reading.window_ends.checked_duration_since(now);
            left.filter(|left| !left.is_zero()).map(|left| Snapshot {
                reset_secs: left.as_secs() + u64::from(left.subsec_nanos() > 0),
                ..reading.snapshot
            })
        };
        let Some(snapshot) = snapshot else {
            self.keys.remove_if(key_id, |_, r| r.window_ends <= now);
            return None;
        };
        decide(limits, &snapshot, &AdmissionRequest::REQUEST_ONLY).err()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        requests_per_minute: 5,
        input_tokens_per_minute: 1_000,
        concurrent_streams: 1,
    };

    fn counts(requests: u32, input_tokens: u64, reset_secs: u64) -> Snapshot {
        Snapshot {
            requests,
            input_tokens,
            streams: 0,
            reset_secs,
        }
    }

    #[test]
    fn a_key_whose_requests_are_used_up_is_refused_until_its_window_ends() {
        let known = OverLimit::default();
        known.record("k", &LIMITS, counts(5, 0, 30));
        let refused = known.refusal("k", &LIMITS);
        assert!(
            matches!(
                refused,
                Some(LimitError::Exceeded {
                    retry_after_secs: 30,
                    ..
                })
            ),
            "{refused:?}"
        );
        known.record("k", &LIMITS, counts(5, 0, 0));
        assert!(known.refusal("k", &LIMITS).is_none(), "the window ended");
        assert!(known.keys.is_empty(), "an ended window is forgotten");
    }

    #[test]
    fn a_key_under_its_limits_is_not_known_and_the_admission_decides() {
        let known = OverLimit::default();
        known.record("k", &LIMITS, counts(4, 999, 30));
        assert!(known.refusal("k", &LIMITS).is_none());
        assert!(known.keys.is_empty());
    }

    #[test]
    fn input_tokens_past_the_cap_refuse_and_a_later_reading_under_it_forgets_them() {
        let known = OverLimit::default();
        known.record("k", &LIMITS, counts(1, 1_001, 30));
        assert!(matches!(
            known.refusal("k", &LIMITS),
            Some(LimitError::Exceeded {
                dimension: super::super::Dimension::InputTokens,
                ..
            })
        ));
        known.record("k", &LIMITS, counts(2, 10, 30));
        assert!(known.refusal("k", &LIMITS).is_none());
    }

    #[test]
    fn raised_limits_lift_a_known_refusal() {
        let known = OverLimit::default();
        known.record("k", &LIMITS, counts(5, 0, 30));
        let raised = Limits {
            requests_per_minute: 50,
            ..LIMITS
        };
        assert!(known.refusal("k", &raised).is_none());
    }
}
