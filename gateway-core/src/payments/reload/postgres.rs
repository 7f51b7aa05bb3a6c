//! Auto-reload rules in Postgres (cluster mode), shared by every pod. Starting a reload is one
//! `UPDATE … WHERE armed`: pods sweeping at once queue on the row, and the second finds it
//! disarmed.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{audited, AutoReload, AutoReloads, Due, Outcome, Rule, MAX_DECLINES};
use store::accounts::StoreError;
use store::audit::{append_in, Actor};
use store::db::{from_db, to_db, Database};

pub struct PostgresAutoReloads {
    db: Database,
}

impl PostgresAutoReloads {
    pub fn new(db: Database) -> Self {
        Self { db }
    }
}

fn due_of(row: &PgRow) -> Result<Due, sqlx::Error> {
    Ok(Due {
        account_id: row.try_get("account_id")?,
        attempt: from_db(row.try_get("attempt")?),
        usd_cents: from_db(row.try_get("usd_cents")?),
        customer_id: row.try_get("customer_id")?,
        payment_method_id: row.try_get("payment_method_id")?,
    })
}

#[async_trait]
impl AutoReloads for PostgresAutoReloads {
    async fn save_card(
        &self,
        account_id: &str,
        customer_id: &str,
        payment_method_id: &str,
    ) -> Result<(), StoreError> {
        self.db
            .bounded(
                sqlx::query(
                    "INSERT INTO auto_reloads (account_id, customer_id, payment_method_id)
                     VALUES ($1, $2, $3)
                     ON CONFLICT (account_id) DO UPDATE
                     SET customer_id = EXCLUDED.customer_id,
                         payment_method_id = EXCLUDED.payment_method_id",
                )
                .bind(account_id)
                .bind(customer_id)
                .bind(payment_method_id)
                .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    async fn settings(&self, account_id: &str) -> Result<AutoReload, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query("SELECT * FROM auto_reloads WHERE account_id = $1")
                    .bind(account_id)
                    .fetch_optional(self.db.pool()),
            )
            .await?;
        let Some(row) = row else {
            return Ok(AutoReload::default());
        };
        let read = || -> Result<AutoReload, sqlx::Error> {
            let card: Option<String> = row.try_get("payment_method_id")?;
            let declines: i32 = row.try_get("declines")?;
            Ok(AutoReload {
                card_saved: card.is_some(),
                enabled: row.try_get("enabled")?,
                threshold_credits: from_db(row.try_get("threshold_credits")?),
                usd_cents: from_db(row.try_get("usd_cents")?),
                declines: u32::try_from(declines).unwrap_or(0),
                last_failure: row.try_get("last_failure")?,
            })
        };
        read().map_err(|e| StoreError::Unavailable(e.to_string()))
    }

    async fn configure(&self, account_id: &str, set: Rule, by: &Actor) -> Result<bool, StoreError> {
        // The rule before, locked, the update and its audit row in one transaction.
        let saved = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let Some(row) = sqlx::query(
                    "SELECT enabled, threshold_credits, usd_cents FROM auto_reloads
                     WHERE account_id = $1 AND payment_method_id IS NOT NULL FOR UPDATE",
                )
                .bind(account_id)
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?
                else {
                    return Ok(false);
                };
                let before = Rule {
                    enabled: row.try_get("enabled")?,
                    threshold_credits: from_db(row.try_get("threshold_credits")?),
                    usd_cents: from_db(row.try_get("usd_cents")?),
                };
                sqlx::query(
                    "UPDATE auto_reloads
                     SET declines = CASE WHEN $2 AND NOT enabled THEN 0 ELSE declines END,
                         last_failure = CASE WHEN $2 AND NOT enabled THEN NULL ELSE last_failure END,
                         enabled = $2, threshold_credits = $3, usd_cents = $4, armed = true
                     WHERE account_id = $1",
                )
                .bind(account_id)
                .bind(set.enabled)
                .bind(to_db(set.threshold_credits))
                .bind(to_db(set.usd_cents))
                .persistent(false)
                .execute(&mut *tx)
                .await?;
                if let Some(entry) = audited(account_id, before, set, by) {
                    append_in(&mut tx, &entry).await?;
                }
                tx.commit().await?;
                Ok(true)
            })
            .await?;
        Ok(saved)
    }

    async fn due(&self) -> Result<Vec<Due>, StoreError> {
        self.db
            .bounded(
                sqlx::query(
                    "UPDATE auto_reloads r SET armed = true
                     FROM accounts a
                     WHERE a.id = r.account_id AND r.enabled AND NOT r.armed
                       AND a.balance - a.reserved >= r.threshold_credits",
                )
                .execute(self.db.pool()),
            )
            .await?;
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "UPDATE auto_reloads r SET armed = false, attempt = r.attempt + 1
                     FROM accounts a
                     WHERE a.id = r.account_id AND r.enabled AND r.armed
                       AND r.payment_method_id IS NOT NULL
                       AND a.balance - a.reserved < r.threshold_credits
                     RETURNING r.account_id, r.attempt, r.usd_cents, r.customer_id,
                               r.payment_method_id",
                )
                .fetch_all(self.db.pool()),
            )
            .await?;
        rows.iter()
            .map(due_of)
            .collect::<Result<_, _>>()
            .map_err(|e| StoreError::Unavailable(e.to_string()))
    }

    async fn finish(&self, due: &Due, outcome: &Outcome) -> Result<(), StoreError> {
        let sql = match outcome {
            Outcome::Charged => {
                "UPDATE auto_reloads SET declines = 0, last_failure = NULL WHERE account_id = $1"
            }
            Outcome::Declined(_) => {
                "UPDATE auto_reloads
                 SET declines = declines + 1, last_failure = $2, armed = true,
                     enabled = enabled AND declines + 1 < $3
                 WHERE account_id = $1"
            }
            Outcome::Unreachable(_) => {
                "UPDATE auto_reloads SET last_failure = $2, armed = true, attempt = $3 - 1
                 WHERE account_id = $1"
            }
        };
        let query = sqlx::query(sql).bind(&due.account_id);
        let query = match outcome {
            Outcome::Charged => query,
            Outcome::Declined(why) => query
                .bind(why)
                .bind(i32::try_from(MAX_DECLINES).unwrap_or(i32::MAX)),
            Outcome::Unreachable(why) => query.bind(why).bind(to_db(due.attempt)),
        };
        self.db.bounded(query.execute(self.db.pool())).await?;
        Ok(())
    }
}
