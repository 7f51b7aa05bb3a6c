//! Refunds and disputes in Postgres: each runs in one transaction that locks the top-up's row
//! first, so that pods applying the same Stripe event at once queue on it and the second finds
//! the movement done (a refund total already reached, a dispute already in that state).
//! Their statements are unnamed (`persistent(false)`), so they also work through a transaction
//! pooler, which may give the next transaction another server (see `db::pool`).

use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};

use super::super::reversal::{
    dispute_step, give, kept_cents, moved_lifetime, share, take, DisputeStatus, Movement, Reversal,
    ReversalKind,
};
use super::super::{audited, DisputeStage, LedgerError};
use crate::audit::{append_in, Actor};
use crate::db::{from_db, to_db, DbPool};

type Outcome = Result<Option<Reversal>, LedgerError>;

struct Paid {
    reference: String,
    account_id: String,
    usd_cents: u64,
    credits: u64,
    refunded_cents: u64,
}

async fn lock_top_up(
    tx: &mut Transaction<'_, Postgres>,
    payment_id: &str,
) -> Result<Option<Paid>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT reference, account_id, usd_cents, credits, refunded_cents
         FROM top_ups WHERE payment_id = $1 AND status = 'confirmed' FOR UPDATE",
    )
    .bind(payment_id)
    .persistent(false)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(|row| {
        Ok(Paid {
            reference: row.try_get("reference")?,
            account_id: row.try_get("account_id")?,
            usd_cents: from_db(row.try_get("usd_cents")?),
            credits: from_db(row.try_get("credits")?),
            refunded_cents: from_db(row.try_get("refunded_cents")?),
        })
    })
    .transpose()
}

/// Moves `usd_cents` of `paid` off the account (or back onto it) and records it under `id`.
async fn reverse(
    tx: &mut Transaction<'_, Postgres>,
    id: String,
    paid: &Paid,
    kind: ReversalKind,
    usd_cents: u64,
) -> Result<Reversal, sqlx::Error> {
    let credits = share(paid.credits, usd_cents, paid.usd_cents);
    let earlier = sqlx::query(
        "SELECT kind, sum(usd_cents)::bigint AS cents FROM payment_reversals
         WHERE reference = $1 GROUP BY kind",
    )
    .bind(&paid.reference)
    .persistent(false)
    .fetch_all(&mut **tx)
    .await?
    .iter()
    .map(|row| {
        let kind: String = row.try_get("kind")?;
        let kind = ReversalKind::parse(&kind)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown reversal kind `{kind}`").into()))?;
        Ok((kind, from_db(row.try_get("cents")?)))
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    let kept_before = kept_cents(paid.usd_cents, earlier.iter().copied());
    let kept_after = kept_cents(
        paid.usd_cents,
        earlier.into_iter().chain([(kind, usd_cents)]),
    );
    let account = sqlx::query(
        "SELECT balance, reserved, owed_credits, lifetime_top_up_cents FROM accounts
         WHERE id = $1 FOR UPDATE",
    )
    .bind(&paid.account_id)
    .persistent(false)
    .fetch_one(&mut **tx)
    .await?;
    let balance = from_db(account.try_get("balance")?);
    let reserved = from_db(account.try_get("reserved")?);
    let owed = from_db(account.try_get("owed_credits")?);
    let lifetime = moved_lifetime(
        from_db(account.try_get("lifetime_top_up_cents")?),
        kept_before,
        kept_after,
    );
    let (moved, owed_part, statement) = match kind {
        ReversalKind::DisputeWon => {
            let (cleared, given) = give(owed, credits);
            (
                given,
                cleared,
                "UPDATE accounts SET balance = balance + $2, owed_credits = owed_credits - $3,
                        lifetime_top_up_cents = $4
                 WHERE id = $1",
            )
        }
        ReversalKind::Refund | ReversalKind::Dispute => {
            let (taken, owed) = take(balance.saturating_sub(reserved), credits);
            (
                taken,
                owed,
                "UPDATE accounts SET balance = balance - $2, owed_credits = owed_credits + $3,
                        lifetime_top_up_cents = $4
                 WHERE id = $1",
            )
        }
    };
    sqlx::query(statement)
        .bind(&paid.account_id)
        .bind(to_db(moved))
        .bind(to_db(owed_part))
        .bind(to_db(lifetime))
        .persistent(false)
        .execute(&mut **tx)
        .await?;
    let row = sqlx::query(
        "INSERT INTO payment_reversals (id, account_id, reference, kind, usd_cents, credits, owed)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         RETURNING *",
    )
    .bind(&id)
    .bind(&paid.account_id)
    .bind(&paid.reference)
    .bind(kind.as_str())
    .bind(to_db(usd_cents))
    .bind(to_db(moved))
    .bind(to_db(owed_part))
    .persistent(false)
    .fetch_one(&mut **tx)
    .await?;
    reversal_of(&row)
}

pub async fn refund(
    pool: &DbPool,
    payment_id: &str,
    refunded_cents: u64,
    by: &Actor,
) -> Result<Outcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let Some(paid) = lock_top_up(&mut tx, payment_id).await? else {
        return Ok(Err(LedgerError::UnknownPayment(payment_id.to_owned())));
    };
    let total = refunded_cents.min(paid.usd_cents);
    if total <= paid.refunded_cents {
        return Ok(Ok(None));
    }
    let id = format!("{payment_id}:refunded:{total}");
    let cents = total - paid.refunded_cents;
    let reversal = reverse(&mut tx, id, &paid, ReversalKind::Refund, cents).await?;
    let entry = audited::refund(&reversal, payment_id, paid.refunded_cents, by);
    append_in(&mut tx, &entry).await?;
    sqlx::query("UPDATE top_ups SET refunded_cents = $2 WHERE reference = $1")
        .bind(&paid.reference)
        .bind(to_db(total))
        .persistent(false)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Ok(Some(reversal)))
}

pub struct Dispute<'a> {
    pub id: &'a str,
    pub payment_id: &'a str,
    pub usd_cents: u64,
    pub stage: DisputeStage,
    pub by: &'a Actor,
}

pub async fn dispute(pool: &DbPool, d: Dispute<'_>) -> Result<Outcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let Some(paid) = lock_top_up(&mut tx, d.payment_id).await? else {
        return Ok(Err(LedgerError::UnknownPayment(d.payment_id.to_owned())));
    };
    let known: Option<String> =
        sqlx::query_scalar("SELECT status FROM payment_disputes WHERE id = $1")
            .bind(d.id)
            .persistent(false)
            .fetch_optional(&mut *tx)
            .await?;
    let known = known.as_deref().and_then(DisputeStatus::parse);
    let Some((status, movement)) = dispute_step(known, d.stage) else {
        return Ok(Ok(None));
    };
    let reversal = match movement {
        None => None,
        Some(movement) => {
            let (kind, suffix) = match movement {
                Movement::TakeBack => (ReversalKind::Dispute, "taken"),
                Movement::GiveBack => (ReversalKind::DisputeWon, "returned"),
            };
            let id = format!("{}:{suffix}", d.id);
            let cents = d.usd_cents.min(paid.usd_cents);
            Some(reverse(&mut tx, id, &paid, kind, cents).await?)
        }
    };
    let entry = audited::dispute(
        d.id,
        &paid.account_id,
        known,
        status,
        reversal.as_ref(),
        d.by,
    );
    append_in(&mut tx, &entry).await?;
    sqlx::query(
        "INSERT INTO payment_disputes (id, reference, status) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status",
    )
    .bind(d.id)
    .bind(&paid.reference)
    .bind(status.as_str())
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Ok(reversal))
}

pub async fn of_account(pool: &DbPool, account_id: &str) -> Result<Vec<Reversal>, sqlx::Error> {
    sqlx::query("SELECT * FROM payment_reversals WHERE account_id = $1 ORDER BY created_at DESC")
        .bind(account_id)
        .fetch_all(pool)
        .await?
        .iter()
        .map(reversal_of)
        .collect()
}

fn reversal_of(row: &PgRow) -> Result<Reversal, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    Ok(Reversal {
        id: row.try_get("id")?,
        account_id: row.try_get("account_id")?,
        reference: row.try_get("reference")?,
        kind: ReversalKind::parse(&kind)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown reversal kind `{kind}`").into()))?,
        usd_cents: from_db(row.try_get("usd_cents")?),
        credits: from_db(row.try_get("credits")?),
        owed: from_db(row.try_get("owed")?),
        created_at: row.try_get("created_at")?,
    })
}
