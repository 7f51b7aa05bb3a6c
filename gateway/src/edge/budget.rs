//! One memory budget per process for the request bodies being read, parsed and tokenized: a
//! semaphore whose permits are KiB. A body takes its share before it is buffered (its declared
//! `Content-Length` at once, or chunk by chunk when it declares none), grows it to what its
//! parsed form will take once it is in ([`parsed_cost`]), and gives it back when its request
//! has its answer ([`hold`]). Past the budget a body waits [`WAIT`], then gets 503 with
//! `Retry-After`; one that could never fit gets 413. Cheap bodies ([`FREE_BYTES`]: the forms,
//! most `/v1` calls) take no share, so large bodies held open cannot keep them out; their
//! memory is bounded by the connection cap instead. One account ([`BudgetOwner`]) holds at
//! most its first body or [`OWNER_SHARE`] of the budget, whichever is more, so one account's
//! bodies held open cannot keep another account's large bodies out either.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use thiserror::Error;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The default budget, for the chart's 1 GiB memory limit: a quarter of it.
pub const DEFAULT_MIB: usize = 256;
/// A body byte costs this many bytes of the budget: the raw body, its parsed form, the
/// provider-neutral request and the upstream's serialized copy live together at the peak.
pub const BYTES_PER_BODY_BYTE: usize = 4;
/// What each JSON value costs once parsed, on top of its bytes: a `serde_json::Value` is 32
/// bytes, and the request holds two parsed copies at its peak.
pub const BYTES_PER_VALUE: usize = 64;
/// What each JSON object costs once parsed, on top of its values: the map a `serde_json::Value`
/// object allocates is several hundred bytes even for one key, and stored or hosted items are
/// parsed twice. Measured on the release build: 14.5 MiB of one-key objects (1.9 million)
/// stored through `/v1/responses` grew the peak by 2.7 GB, about 1.4 KiB an object; so a body
/// that is mostly tiny objects is 413 here instead of several GB there.
pub const BYTES_PER_OBJECT: usize = 1536;
/// Bodies that cost at most this much take no share of the budget.
pub const FREE_BYTES: usize = 64 * 1024;
/// How long a body waits for its share before the 503.
pub const WAIT: Duration = Duration::from_secs(2);
/// The fraction of the budget one account's bodies may hold together (beyond its first body,
/// which may be as large as the budget allows): a quarter, so three other accounts' largest
/// bodies still fit beside it.
pub const OWNER_SHARE: usize = 4;
/// What the 503 tells the client to wait.
pub const RETRY_AFTER_SECS: u64 = 1;

const KIB: usize = 1024;

static BUDGET: OnceLock<Budget> = OnceLock::new();

/// Sets the process' budget; only the first call counts (the server calls it once at start,
/// before any body is read). Without it, [`DEFAULT_MIB`].
pub fn configure(mib: usize) {
    let _ = BUDGET.set(Budget::new(mib.max(1) * KIB * KIB));
}

fn budget() -> &'static Budget {
    BUDGET.get_or_init(|| Budget::new(DEFAULT_MIB * KIB * KIB))
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BudgetError {
    /// The body alone needs more than the whole budget.
    #[error("a request body of {body_bytes} bytes needs more memory than this server reads at once ({budget_bytes} bytes)")]
    TooLarge {
        body_bytes: usize,
        budget_bytes: usize,
    },
    /// Other bodies hold the budget.
    #[error("the server is reading as many large requests as it can hold; retry shortly")]
    Busy,
}

struct Budget {
    kib: Semaphore,
    total_kib: usize,
    /// KiB held by each owner's bodies; an owner is removed when it holds none.
    owners: Mutex<HashMap<BudgetOwner, usize>>,
}

impl Budget {
    fn new(bytes: usize) -> Self {
        let total_kib = (bytes / KIB).clamp(1, u32::MAX as usize);
        Self {
            kib: Semaphore::new(total_kib),
            total_kib,
            owners: Mutex::default(),
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<BudgetOwner, usize>> {
        // Each update is one map operation that cannot panic: a poisoned map is still whole.
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `more` KiB against `owner`, whose body holds `held` already: refused when the
    /// owner's other bodies hold some and all would pass its share.
    fn take_share(&self, owner: &BudgetOwner, held: usize, more: usize) -> Result<(), BudgetError> {
        let mut owners = self.owners();
        let total = owners.entry(owner.clone()).or_default();
        let others = *total - held;
        if others > 0 && *total + more > self.total_kib / OWNER_SHARE {
            if *total == 0 {
                owners.remove(owner);
            }
            return Err(BudgetError::Busy);
        }
        *total += more;
        Ok(())
    }

    fn give_share(&self, owner: &BudgetOwner, kib: usize) {
        let mut owners = self.owners();
        if let Some(total) = owners.get_mut(owner) {
            *total = total.saturating_sub(kib);
            if *total == 0 {
                owners.remove(owner);
            }
        }
    }
}

/// Whose bodies a body's share is counted with: its API key's account, set by `/v1`'s
/// authentication before the body is read. Bodies without one (forms, webhooks, the admin
/// API) are small or trusted, and count only against the whole budget.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BudgetOwner(pub Arc<str>);

/// The share of the budget one body holds; given back on drop.
#[derive(Debug, Default)]
pub struct Reservation {
    permits: Option<SemaphorePermit<'static>>,
    owner: Option<BudgetOwner>,
    /// Body bytes received so far (for the 413's message).
    body_bytes: usize,
}

impl Reservation {
    /// Takes the share of a body of `body_bytes` in all (its declared length), waiting
    /// at most [`WAIT`].
    pub async fn for_body(
        owner: Option<BudgetOwner>,
        body_bytes: usize,
    ) -> Result<Self, BudgetError> {
        let mut reservation = Self::of(owner);
        reservation.grow_to(body_bytes).await?;
        Ok(reservation)
    }

    /// A reservation holding nothing yet, counted with `owner`'s.
    pub fn of(owner: Option<BudgetOwner>) -> Self {
        Self {
            permits: None,
            owner,
            body_bytes: 0,
        }
    }

    /// Extends the share to cover a body of `body_bytes` so far (for bodies that declared no
    /// length); a no-op while the body is within what is already held.
    pub async fn grow_to(&mut self, body_bytes: usize) -> Result<(), BudgetError> {
        let cost = body_bytes.saturating_mul(BYTES_PER_BODY_BYTE);
        self.cover(body_bytes, cost).await
    }

    /// Extends the share to what the whole `body` costs once parsed ([`parsed_cost`]).
    pub async fn grow_to_parsed(&mut self, body: &[u8]) -> Result<(), BudgetError> {
        self.cover(body.len(), parsed_cost(body)).await
    }

    /// Extends the share to `cost` bytes (when that is more than it holds), what a body of
    /// `body_bytes` takes once its handler has worked out its shape (a batch, indexed).
    pub async fn grow_to_cost(
        &mut self,
        body_bytes: usize,
        cost: usize,
    ) -> Result<(), BudgetError> {
        self.cover(body_bytes, cost).await
    }

    /// Holds `cost` bytes of the budget for a body of `body_bytes`, waiting at most [`WAIT`]
    /// for what is not held yet; never gives back what is held.
    async fn cover(&mut self, body_bytes: usize, cost: usize) -> Result<(), BudgetError> {
        self.body_bytes = self.body_bytes.max(body_bytes);
        let needed = cost_kib(cost);
        let held = self.held_kib();
        if needed <= held {
            return Ok(());
        }
        let budget = budget();
        if needed > budget.total_kib {
            return Err(BudgetError::TooLarge {
                body_bytes: self.body_bytes,
                budget_bytes: budget.total_kib * KIB,
            });
        }
        let more_kib = needed - held;
        let more = u32::try_from(more_kib).map_err(|_| BudgetError::Busy)?;
        if let Some(owner) = &self.owner {
            budget.take_share(owner, held, more_kib)?;
        }
        let acquired = tokio::time::timeout(WAIT, budget.kib.acquire_many(more)).await;
        let Ok(Ok(permit)) = acquired else {
            if let Some(owner) = &self.owner {
                budget.give_share(owner, more_kib);
            }
            return Err(BudgetError::Busy);
        };
        match &mut self.permits {
            Some(held) => held.merge(permit),
            None => self.permits = Some(permit),
        }
        Ok(())
    }

    fn held_kib(&self) -> usize {
        self.permits.as_ref().map_or(0, |p| p.num_permits())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(owner) = &self.owner {
            budget().give_share(owner, self.held_kib());
        }
    }
}

/// The KiB of budget a body costing `cost` bytes takes.
fn cost_kib(cost: usize) -> usize {
    if cost <= FREE_BYTES {
        return 0;
    }
    cost.div_ceil(KIB)
}

/// What a JSON body takes at its peak once parsed: [`BYTES_PER_BODY_BYTE`] a byte, plus
/// [`BYTES_PER_VALUE`] a value and [`BYTES_PER_OBJECT`] an object, counted in one pass over
/// the bytes outside strings (a string's bytes are skipped with `memchr`). The cost of parsing
/// is driven by how many values a body has, not by its length: 14.5 MiB of tiny objects takes
/// a thousand times what 14.5 MiB of text does. Not JSON (a form) costs what its bytes say.
pub fn parsed_cost(body: &[u8]) -> usize {
    let (mut values, mut objects) = (0usize, 0usize);
    let mut at = 0;
    while let Some(&byte) = body.get(at) {
        at += 1;
        match byte {
            b'"' => at = string_end(body, at),
            b'{' => {
                objects += 1;
                values += 1;
            }
            b'[' | b',' | b':' => values += 1,
            _ => {}
        }
    }
    body.len()
        .saturating_mul(BYTES_PER_BODY_BYTE)
        .saturating_add(values.saturating_mul(BYTES_PER_VALUE))
        .saturating_add(objects.saturating_mul(BYTES_PER_OBJECT))
}

/// Where the string whose content starts at `from` ends (just past its closing quote).
fn string_end(body: &[u8], mut from: usize) -> usize {
    while let Some(found) = body
        .get(from..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        let at = from + found;
        if body.get(at) == Some(&b'"') {
            return at + 1;
        }
        from = at + 2; // an escape and the byte it escapes
    }
    body.len()
}

/// Where a request's body reader leaves its [`Reservation`] for [`hold`] to keep until the
/// answer is ready: parsing and tokenizing happen in the handler, after the body was read.
#[derive(Clone, Default)]
pub struct Held(Arc<Mutex<Vec<Reservation>>>);

impl Held {
    pub fn keep(&self, reservation: Reservation) {
        if reservation.permits.is_none() {
            return;
        }
        if let Ok(mut held) = self.0.lock() {
            held.push(reservation);
        }
    }
}

/// The layer of every surface that reads bodies: a request's share of the budget stays taken
/// until its handler has answered (for a stream, until its first event is ready: by then the
/// raw body is gone and the request has been counted).
pub async fn hold(mut req: Request, next: Next) -> Response {
    let held = Held::default();
    req.extensions_mut().insert(held.clone());
    let response = next.run(req).await;
    drop(held);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cheap_bodies_cost_nothing_and_others_what_they_cost() {
        assert_eq!(cost_kib(FREE_BYTES), 0);
        assert_eq!(cost_kib(4 * 1024 * 1024), 4 * 1024);
    }

    #[test]
    fn structure_inside_strings_is_not_counted() {
        let text = br#"{"t":"a{b[c,d:e\"{[,:"}"#;
        // One object, its `:`: the braces, brackets, commas and colons inside the string
        // (escaped quote included) are not counted.
        let expected = text.len() * BYTES_PER_BODY_BYTE + 2 * BYTES_PER_VALUE + BYTES_PER_OBJECT;
        assert_eq!(parsed_cost(text), expected);
    }

    #[test]
    fn each_object_and_value_costs_what_it_takes_parsed() {
        let objects = br#"[{"u":1},{"u":2}]"#;
        let values = 1 + 2 * 2 + 1; // the array, each object and its `:`, the `,`
        let expected =
            objects.len() * BYTES_PER_BODY_BYTE + values * BYTES_PER_VALUE + 2 * BYTES_PER_OBJECT;
        assert_eq!(parsed_cost(objects), expected);
    }

    #[test]
    fn an_unterminated_string_ends_the_count() {
        assert_eq!(
            parsed_cost(br#"{"a\"#),
            4 * BYTES_PER_BODY_BYTE + BYTES_PER_VALUE + BYTES_PER_OBJECT
        );
    }
}
