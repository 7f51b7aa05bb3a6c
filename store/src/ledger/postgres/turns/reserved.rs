//! The statements that end a turn held in `reservations` (migration 0026): each takes the
//! turn out of `reservations` and writes its ledger row once, final, in the same statement as
//! the money it moves. A turn found in neither table was ended already (or reaped): nothing
//! changes.

use super::{answer_billed, Batch, Columns, SettleColumns};
use crate::db::{Database, DbError};
use crate::ledger::postgres::name_keys::NameKeys;
use crate::ledger::{LedgerError, Settlement};
use crate::metrics;

/// Settles the turns held in `reservations`; `None` for one not held there.
pub async fn settle(
    db: &Database,
    names: &NameKeys,
    turns: &[&Settlement],
) -> Vec<Result<Option<u64>, LedgerError>> {
    let n = turns.len();
    metrics::ledger_batch("settle", n);
    let c = SettleColumns::of(turns.iter().copied());
    let upstream_id = match c.upstream_keys(db, names).await {
        Ok(keys) => keys,
        Err(e) => return answer_billed(Err(e), std::iter::empty(), n),
    };
    let rows = db
        .bounded(
            sqlx::query(concat!(
                "WITH turn AS (
                     SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[],
                         $5::bigint[], $6::bigint[], $7::bigint[], $8::text[], $9::bigint[],
                         $10::integer[])
                     AS t(id, status, cost, input_tokens, output_tokens,
                          cache_creation_input_tokens, cache_read_input_tokens, stop_reason,
                          latency_ms, upstream_id)
                 ), ended AS (
                     DELETE FROM reservations o USING turn t WHERE o.id = t.id
                     RETURNING o.id, o.account_id, o.key_id, o.route_id,
                         -- The upstream that served it, when fallback moved it on.
                         coalesce(t.upstream_id, o.upstream_id) AS upstream_id, o.stream,
                         t.status, o.reserved,
                         CASE WHEN t.status = 'failed' THEN 0 ELSE least(t.cost, o.reserved) END
                             AS billed,
                         t.input_tokens, t.output_tokens, t.cache_creation_input_tokens,
                         t.cache_read_input_tokens, t.stop_reason, t.latency_ms,
                         o.instance_id, o.instance_epoch, o.created_at, o.batch_id,
                         o.end_user
                 ), settled AS (",
                written!(),
                "
                 ), ",
                after_settled!()
            ))
            .bind(c.id)
            .bind(c.status)
            .bind(c.cost)
            .bind_usage(c.usage)
            .bind(upstream_id)
            .fetch_all(db.pool()),
        )
        .await;
    answer_billed(rows, turns.iter().map(|t| t.message_id.as_str()), n)
}

/// Ends a turn held in `reservations` billed nothing, releasing what it held: its row is
/// written `unbilled`. Whether it was held there.
pub async fn void(db: &Database, message_id: &str) -> Result<bool, DbError> {
    let found: i64 = db
        .bounded(
            sqlx::query_scalar(concat!(
                "WITH ended AS (
                     DELETE FROM reservations WHERE id = $1 ",
                ended_billing_nothing!("'unbilled'"),
                "
                 ), account AS (
                     SELECT id FROM accounts WHERE id IN (SELECT account_id FROM ended)
                     FOR NO KEY UPDATE
                 ), voided AS (",
                written!(),
                "
                 ), key_voided AS (
                     UPDATE api_keys k
                     SET month_reserved = greatest(k.month_reserved - v.reserved, 0)
                     FROM voided v WHERE k.id = v.key_id
                 ), released AS (
                     UPDATE accounts a SET reserved = a.reserved - v.reserved
                     FROM voided v JOIN account ON account.id = v.account_id
                     WHERE a.id = v.account_id
                 ), ",
                rolled_up!("SELECT v.*, 1 AS sign FROM voided v"),
                "
                 SELECT count(*) FROM ended"
            ))
            .bind(message_id)
            .fetch_one(db.pool()),
        )
        .await?;
    Ok(found > 0)
}

/// Ends a turn held in `reservations` as `unbilled`, moving no money (see
/// [`super::mark_unbilled`]). Whether it was held there.
pub async fn mark_unbilled(db: &Database, message_id: &str) -> Result<bool, DbError> {
    let marked: i64 = db
        .bounded(
            sqlx::query_scalar(concat!(
                "WITH ended AS (
                     DELETE FROM reservations WHERE id = $1 ",
                ended_billing_nothing!("'unbilled'"),
                "
                 ), marked AS (",
                written!(),
                "
                 ), ",
                rolled_up!("SELECT m.*, 1 AS sign FROM marked m"),
                "
                 SELECT count(*) FROM ended"
            ))
            .bind(message_id)
            .fetch_one(db.pool()),
        )
        .await?;
    Ok(marked > 0)
}
