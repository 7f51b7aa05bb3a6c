//! The in-process audit log of standalone mode. The in-process stores append to it while they
//! hold the lock of the change they record. It keeps the latest [`KEPT_ROWS`] rows (oldest
//! dropped first), as the in-process ledger bounds its messages: standalone keeps nothing
//! across a restart anyway.

use std::collections::VecDeque;
use std::sync::Mutex;

use async_trait::async_trait;
use time::OffsetDateTime;

use super::{AuditEntry, AuditError, AuditLog, AuditQuery, AuditRecord};

const KEPT_ROWS: usize = 100_000;

#[derive(Default)]
pub struct MemoryAuditLog {
    rows: Mutex<Rows>,
}

#[derive(Default)]
struct Rows {
    last_id: i64,
    kept: VecDeque<AuditRecord>,
}

impl MemoryAuditLog {
    /// Appends a row; callers hold the lock of the change it records.
    pub fn append(&self, entry: AuditEntry) {
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.last_id += 1;
        let record = AuditRecord {
            id: rows.last_id,
            at: OffsetDateTime::now_utc(),
            entry,
        };
        if rows.kept.len() == KEPT_ROWS {
            rows.kept.pop_front();
        }
        rows.kept.push_back(record);
    }
}

impl MemoryAuditLog {
    /// Of the rows appended at or after `since`, how many `which` says yes to, each of its two
    /// answers counted apart.
    pub fn count_since(
        &self,
        since: OffsetDateTime,
        which: impl Fn(&AuditEntry) -> (bool, bool),
    ) -> (usize, usize) {
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.kept
            .iter()
            .rev()
            .take_while(|r| r.at >= since)
            .map(|r| which(&r.entry))
            .fold((0, 0), |(a, b), (x, y)| {
                (a + usize::from(x), b + usize::from(y))
            })
    }
}

#[async_trait]
impl AuditLog for MemoryAuditLog {
    async fn list(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, AuditError> {
        let rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        Ok(rows
            .kept
            .iter()
            .rev()
            .filter(|r| query.matches(r))
            .take(query.limit)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::audit::{Action, Actor, ActorKind};

    fn entry(n: usize) -> AuditEntry {
        AuditEntry {
            actor: Actor::new(ActorKind::Cli, "test", None),
            account_id: "acct_1".to_owned(),
            action: Action::KeyRevoked,
            target: n.to_string(),
            before: Value::Null,
            after: Value::Null,
        }
    }

    #[tokio::test]
    async fn the_in_process_log_keeps_its_latest_rows_and_drops_the_oldest_past_its_bound() {
        let log = MemoryAuditLog::default();
        for n in 0..KEPT_ROWS + 5 {
            log.append(entry(n));
        }
        let all = AuditQuery {
            limit: usize::MAX,
            ..AuditQuery::default()
        };
        let rows = log.list(&all).await.expect("listed");
        assert_eq!(rows.len(), KEPT_ROWS);
        assert_eq!(
            rows[0].entry.target,
            (KEPT_ROWS + 4).to_string(),
            "newest first"
        );
        assert_eq!(
            rows[KEPT_ROWS - 1].entry.target,
            "5",
            "the five oldest dropped"
        );
        assert_eq!(rows[0].id, i64::try_from(KEPT_ROWS + 5).expect("fits"));
    }
}
