//! One memory budget per process for the request bodies being read, parsed and tokenized: a
//! semaphore whose permits are KiB. A body takes its share before it is buffered (its declared
//! `Content-Length` at once, or chunk by chunk when it declares none), grows it to what its
//! parsed form will take once it is in ([`parsed_cost`]), and gives it back when its request
//! has its answer ([`hold`]). Past the budget a body waits [`WAIT`], then gets 503 with
//! `Retry-After`; one that could never fit gets 413. Cheap bodies ([`FREE_BYTES`]: the forms,
//! most `/v1` calls) take no share, so large bodies held open cannot keep them out; their
//! memory is bounded by the connection cap instead.
//!
//! No one holder can take the budget (issue 51: one account's trickled batch create held all
//! of it for 22 minutes, and 1,024 unsigned webhook posts held it for 30 s):
//! - an account ([`BudgetOwner`]) holds at most [`OWNER_MOST`] of the budget with one body,
//!   its first included, and [`OWNER_SHARE`] with several: a body needing more is 413, one
//!   past the account's share 503, while the rest stays for other accounts;
//! - bodies with no account (the webhooks, the dashboard's forms, sign-in callbacks) share
//!   [`ANONYMOUS_SHARE`] of the budget, and each client address (as `--trusted-proxies`
//!   tells it, by [`AddressBucket`]) at most [`ADDRESS_SHARE`] of that.
//!
//! The 503's `Retry-After` says when the budget should have the room asked for: the holders
//! in the way (the account's own bodies, the address', the anonymous ones, or all) are taken
//! in the order of their read deadlines as they stand (when the body reader cuts each unless
//! more of it comes; a body already read lets go when its request is answered, counted as
//! now), until what they hold covers what is missing; at least 1 s, at most
//! [`MAX_RETRY_AFTER_SECS`]. A holder that keeps sending may hold longer than it said (the
//! next 503 tells the new deadline); one stalled, as in issue 51, is cut when it said.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use gateway_core::limits::AddressBucket;
use thiserror::Error;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::client_address::{ClientAddress, TrustedProxies};

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
/// The fraction of the budget one account's bodies may hold together: a quarter, so three
/// other accounts' largest bodies still fit beside them.
pub const OWNER_SHARE: usize = 4;
/// The fraction of the budget one account may hold with a single body, its first included:
/// a half. A body needing more is 413 at this budget (the operator may raise it), and whatever
/// one account holds, the other half stays for the others. A Message Batch create, parsed as it
/// arrives, holds its largest request, not its whole body.
pub const OWNER_MOST: usize = 2;
/// The fraction of the budget the bodies with no account hold together: an eighth (32 MiB of
/// the default budget, 128 webhook bodies of 64 KiB).
pub const ANONYMOUS_SHARE: usize = 8;
/// The fraction of the anonymous share one client address holds: an eighth (16 webhook
/// bodies of 64 KiB at the default budget).
pub const ADDRESS_SHARE: usize = 8;
/// The least an anonymous share or an address' share is, so that one largest webhook body
/// (64 KiB, four times that in the budget) fits even in a small budget.
const ANONYMOUS_FLOOR_KIB: usize = 256;
/// The longest wait a 503 tells.
pub const MAX_RETRY_AFTER_SECS: u64 = 3600;

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
    /// The body alone needs more than one client may hold.
    #[error("a request body of {body_bytes} bytes needs more memory than one client may hold of what this server reads at once ({share_bytes} bytes)")]
    TooLargeForOne {
        body_bytes: usize,
        share_bytes: usize,
    },
    /// Other bodies (the same client's, or all) hold the budget.
    #[error("the server is reading as many large requests as it can hold for this client, or for all; retry after {retry_after_secs} second(s)")]
    Busy { retry_after_secs: u64 },
}

/// Whose share a body counts against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Holder {
    Account(BudgetOwner),
    /// A body with no account, by its client's address (`None`: not from a listener).
    Address(Option<AddressBucket>),
}

impl Default for Holder {
    fn default() -> Self {
        Self::Address(None)
    }
}

/// Until when a body being read holds its share at the latest unless more of it comes: its
/// read deadline as the body reader last set it; `None` once the body is read.
#[derive(Debug, Default)]
struct Reading(Mutex<Option<Instant>>);

impl Reading {
    fn set(&self, until: Option<Instant>) {
        // One assignment, which cannot panic: a poisoned lock still holds a whole value.
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }

    fn release_in(&self, now: Instant) -> Duration {
        let until = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        until.map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
    }
}

/// What one reservation holds, for the 503's `Retry-After`.
struct HeldBody {
    holder: Holder,
    kib: usize,
    reading: Option<Arc<Reading>>,
}

impl HeldBody {
    fn release_in(&self, now: Instant) -> Duration {
        self.reading
            .as_ref()
            .map_or(Duration::ZERO, |r| r.release_in(now))
    }
}

#[derive(Default)]
struct Holdings {
    /// KiB held by each holder's bodies; a holder is removed when it holds none.
    kib_of: HashMap<Holder, usize>,
    /// KiB held by the bodies with no account, together.
    anonymous_kib: usize,
    /// Each reservation holding KiB, by its id.
    bodies: HashMap<u64, HeldBody>,
    next_id: u64,
}

impl Holdings {
    /// Seconds until the bodies `in_the_way` will have let `missing` KiB go (see the module's
    /// documentation), at least 1.
    fn retry_after(&self, missing: usize, in_the_way: impl Fn(&HeldBody) -> bool) -> u64 {
        let now = Instant::now();
        let mut ends: Vec<(Duration, usize)> = self
            .bodies
            .values()
            .filter(|b| in_the_way(b))
            .map(|b| (b.release_in(now), b.kib))
            .collect();
        ends.sort_unstable_by_key(|&(end, _)| end);
        let (mut freed, mut at) = (0, Duration::ZERO);
        for (end, kib) in ends {
            at = end;
            freed += kib;
            if freed >= missing {
                break;
            }
        }
        (at.as_secs_f64().ceil() as u64).clamp(1, MAX_RETRY_AFTER_SECS)
    }

    /// Counts `kib` more against reservation `id` (a new one when `None`) of `holder`.
    fn add(
        &mut self,
        id: Option<u64>,
        holder: &Holder,
        kib: usize,
        reading: Option<Arc<Reading>>,
    ) -> u64 {
        *self.kib_of.entry(holder.clone()).or_default() += kib;
        if matches!(holder, Holder::Address(_)) {
            self.anonymous_kib += kib;
        }
        let id = id.unwrap_or_else(|| {
            self.next_id += 1;
            self.next_id
        });
        self.bodies
            .entry(id)
            .or_insert_with(|| HeldBody {
                holder: holder.clone(),
                kib: 0,
                reading,
            })
            .kib += kib;
        id
    }

    /// Counts `kib` less against reservation `id`, all of it when `None`.
    fn remove(&mut self, id: u64, kib: Option<usize>) {
        let Some(body) = self.bodies.get_mut(&id) else {
            return;
        };
        let kib = kib.unwrap_or(body.kib).min(body.kib);
        body.kib -= kib;
        let holder = body.holder.clone();
        if body.kib == 0 {
            self.bodies.remove(&id);
        }
        if let Some(total) = self.kib_of.get_mut(&holder) {
            *total = total.saturating_sub(kib);
            if *total == 0 {
                self.kib_of.remove(&holder);
            }
        }
        if matches!(holder, Holder::Address(_)) {
            self.anonymous_kib = self.anonymous_kib.saturating_sub(kib);
        }
    }
}

struct Budget {
    kib: Semaphore,
    total_kib: usize,
    holdings: Mutex<Holdings>,
}

impl Budget {
    fn new(bytes: usize) -> Self {
        let total_kib = (bytes / KIB).clamp(1, u32::MAX as usize);
        Self {
            kib: Semaphore::new(total_kib),
            total_kib,
            holdings: Mutex::default(),
        }
    }

    fn holdings(&self) -> std::sync::MutexGuard<'_, Holdings> {
        // Each update is a few map operations that cannot panic: a poisoned map is still whole.
        self.holdings.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn anonymous_share(&self) -> usize {
        (self.total_kib / ANONYMOUS_SHARE)
            .max(ANONYMOUS_FLOOR_KIB)
            .min(self.total_kib)
    }

    fn address_share(&self) -> usize {
        (self.anonymous_share() / ADDRESS_SHARE)
            .max(ANONYMOUS_FLOOR_KIB)
            .min(self.anonymous_share())
    }

    /// The most one body of `holder` may hold.
    fn most_for(&self, holder: &Holder) -> usize {
        match holder {
            Holder::Account(_) => self.total_kib / OWNER_MOST,
            Holder::Address(_) => self.address_share(),
        }
    }

    /// Counts `more` KiB against `holder`, whose reservation `id` holds `held` already:
    /// refused when the holder's bodies would pass its share (an account: [`OWNER_MOST`]
    /// with this body alone, [`OWNER_SHARE`] with others; no account: its address' share and
    /// the anonymous share). Returns the reservation's id.
    fn take_share(
        &self,
        id: Option<u64>,
        holder: &Holder,
        held: usize,
        more: usize,
        reading: Option<Arc<Reading>>,
    ) -> Result<u64, BudgetError> {
        let mut holdings = self.holdings();
        let total = holdings.kib_of.get(holder).copied().unwrap_or(0);
        let limit = match holder {
            Holder::Account(_) if total > held => self.total_kib / OWNER_SHARE,
            Holder::Account(_) => self.total_kib / OWNER_MOST,
            Holder::Address(_) => self.address_share(),
        };
        let mine = |b: &HeldBody| b.holder == *holder;
        if total + more > limit {
            let retry_after_secs = holdings.retry_after(total + more - limit, mine);
            return Err(BudgetError::Busy { retry_after_secs });
        }
        let anonymous = self.anonymous_share();
        if matches!(holder, Holder::Address(_)) && holdings.anonymous_kib + more > anonymous {
            let missing = holdings.anonymous_kib + more - anonymous;
            let anonymous = |b: &HeldBody| matches!(b.holder, Holder::Address(_));
            let retry_after_secs = holdings.retry_after(missing, anonymous);
            return Err(BudgetError::Busy { retry_after_secs });
        }
        Ok(holdings.add(id, holder, more, reading))
    }

    /// Seconds until the bodies held will have let `more` KiB of the budget go.
    fn retry_for_room(&self, more: usize) -> u64 {
        let missing = more.saturating_sub(self.kib.available_permits()).max(1);
        self.holdings().retry_after(missing, |_| true)
    }
}

/// Whose bodies a body's share is counted with: its API key's account, set by `/v1`'s
/// authentication before the body is read (the admin API's: [`BudgetOwner::admin`]). Bodies
/// without one (forms, webhooks) are counted by their client's address, in the anonymous
/// share.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BudgetOwner(pub Arc<str>);

impl BudgetOwner {
    /// The admin API's bodies, counted as one owner's (no account id has a space).
    pub fn admin() -> Self {
        Self(Arc::from("admin API"))
    }
}

/// The share of the budget one body holds; given back on drop.
#[derive(Debug, Default)]
pub struct Reservation {
    permits: Option<SemaphorePermit<'static>>,
    holder: Holder,
    /// Its entry in the budget's holdings, once it holds some.
    id: Option<u64>,
    /// The read deadline of the body being read; `None` for what is not a body being read.
    reading: Option<Arc<Reading>>,
    /// Body bytes received so far (for the 413's message).
    body_bytes: usize,
}

impl Reservation {
    /// A reservation holding nothing yet, counted with `owner`'s (with no owner: in the
    /// anonymous share, as one address).
    pub fn of(owner: Option<BudgetOwner>) -> Self {
        Self::of_client(owner, None)
    }

    /// [`Reservation::of`], a body with no owner counted by its client's `address`.
    pub fn of_client(owner: Option<BudgetOwner>, address: Option<IpAddr>) -> Self {
        let holder = match owner {
            Some(owner) => Holder::Account(owner),
            None => Holder::Address(address.map(AddressBucket::of)),
        };
        Self {
            permits: None,
            holder,
            id: None,
            reading: None,
            body_bytes: 0,
        }
    }

    /// The reservation of a body being read, which the body reader cuts at `until` unless
    /// more of it comes: others' 503s tell when it will let go.
    pub fn reading(mut self, until: Instant) -> Self {
        self.reading = Some(Arc::new(Reading(Mutex::new(Some(until)))));
        self
    }

    /// More of the body came: the reader now cuts it at `until` unless more comes.
    pub fn read_until(&self, until: Instant) {
        if let Some(reading) = &self.reading {
            reading.set(Some(until));
        }
    }

    /// The whole body has come: what it holds goes back as soon as its request is answered.
    pub fn read(&self) {
        if let Some(reading) = &self.reading {
            reading.set(None);
        }
    }

    /// Extends the share to cover a body of `body_bytes` so far (its declared length, or
    /// what came of a body that declared none); a no-op while the body is within what is
    /// already held.
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
        let most = budget.most_for(&self.holder);
        if needed > most {
            return Err(BudgetError::TooLargeForOne {
                body_bytes: self.body_bytes,
                share_bytes: most * KIB,
            });
        }
        let more_kib = needed - held;
        let busy = || BudgetError::Busy {
            retry_after_secs: budget.retry_for_room(more_kib),
        };
        let more = u32::try_from(more_kib).map_err(|_| busy())?;
        let id = budget.take_share(self.id, &self.holder, held, more_kib, self.reading.clone())?;
        self.id = Some(id);
        let acquired = tokio::time::timeout(WAIT, budget.kib.acquire_many(more)).await;
        let Ok(Ok(permit)) = acquired else {
            budget.holdings().remove(id, Some(more_kib));
            if held == 0 {
                self.id = None;
            }
            return Err(busy());
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
        if let Some(id) = self.id.take() {
            budget().holdings().remove(id, None);
        }
    }
}

/// Sets the client's address on every request, for the share of the bodies with no account
/// ([`ADDRESS_SHARE`]).
pub async fn address(
    State(proxies): State<Arc<TrustedProxies>>,
    mut req: Request,
    next: Next,
) -> Response {
    let address = ClientAddress::of(&proxies, req.extensions(), req.headers());
    req.extensions_mut().insert(address);
    next.run(req).await
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

    const MIB_KIB: usize = 1024;

    fn account(name: &str) -> Holder {
        Holder::Account(BudgetOwner(Arc::from(name)))
    }

    fn address(last: u8) -> Holder {
        Holder::Address(Some(AddressBucket::of(IpAddr::from([192, 0, 2, last]))))
    }

    fn busy<T: std::fmt::Debug>(taken: Result<T, BudgetError>) -> bool {
        matches!(taken, Err(BudgetError::Busy { .. }))
    }

    #[test]
    fn one_account_holds_half_the_budget_with_one_body_its_first_included() {
        let budget = Budget::new(256 * MIB_KIB * KIB);
        let hog = account("hog");
        assert_eq!(budget.most_for(&hog), 128 * MIB_KIB);
        // The first body, and the same body growing (it holds all its account holds).
        let first = budget.take_share(None, &hog, 0, 120 * MIB_KIB, None);
        let id = first.expect("a first body within half the budget");
        assert!(budget
            .take_share(Some(id), &hog, 120 * MIB_KIB, 8 * MIB_KIB, None)
            .is_ok());
        assert!(busy(budget.take_share(
            Some(id),
            &hog,
            128 * MIB_KIB,
            1,
            None
        )));
    }

    #[test]
    fn a_body_needing_more_than_half_the_budget_is_413_not_held() {
        // The process' budget (never configured in unit tests: the default, 256 MiB).
        let mut reservation = Reservation::of(Some(BudgetOwner(Arc::from("big"))));
        let taken = futures::executor::block_on(reservation.grow_to(33 * 1024 * 1024));
        assert!(
            matches!(taken, Err(BudgetError::TooLargeForOne { .. })),
            "{taken:?}"
        );
        assert_eq!(reservation.held_kib(), 0);
    }

    #[test]
    fn one_accounts_several_bodies_hold_a_quarter_of_the_budget_together() {
        let budget = Budget::new(256 * MIB_KIB * KIB);
        let hog = account("hog");
        assert!(budget.take_share(None, &hog, 0, 30 * MIB_KIB, None).is_ok());
        assert!(budget.take_share(None, &hog, 0, 30 * MIB_KIB, None).is_ok());
        assert!(busy(budget.take_share(None, &hog, 0, 30 * MIB_KIB, None)));
        // A first body past the quarter leaves the account no second.
        let big = account("big");
        assert!(budget
            .take_share(None, &big, 0, 120 * MIB_KIB, None)
            .is_ok());
        assert!(busy(budget.take_share(None, &big, 0, 300, None)));
        // Another account is counted apart.
        assert!(budget
            .take_share(None, &account("other"), 0, 60 * MIB_KIB, None)
            .is_ok());
    }

    #[test]
    fn bodies_with_no_account_hold_an_eighth_and_each_address_an_eighth_of_that() {
        let budget = Budget::new(256 * MIB_KIB * KIB);
        let webhook = 256; // KiB: a 64 KiB body, four times over
        for n in 0..16 {
            let taken = budget.take_share(None, &address(1), 0, webhook, None);
            assert!(taken.is_ok(), "body {n}: {taken:?}");
        }
        assert!(busy(budget.take_share(None, &address(1), 0, webhook, None)));
        for last in 2..=8 {
            for _ in 0..16 {
                assert!(budget
                    .take_share(None, &address(last), 0, webhook, None)
                    .is_ok());
            }
        }
        // 32 MiB held by eight addresses: the anonymous share is full for a ninth, and not
        // for an account.
        assert!(busy(budget.take_share(None, &address(9), 0, webhook, None)));
        assert!(budget
            .take_share(None, &account("a"), 0, webhook, None)
            .is_ok());
    }

    #[test]
    fn a_small_budget_still_fits_one_webhook_body_for_each_address() {
        let budget = Budget::new(16 * MIB_KIB * KIB);
        assert_eq!(budget.anonymous_share(), 2 * MIB_KIB);
        assert_eq!(budget.address_share(), 256);
        assert!(budget.take_share(None, &address(1), 0, 256, None).is_ok());
        assert!(busy(budget.take_share(None, &address(1), 0, 256, None)));
        assert!(budget.take_share(None, &address(2), 0, 256, None).is_ok());
    }

    /// A body being read whose reader cuts it in `secs` unless more comes.
    fn reading(secs: u64) -> Option<Arc<Reading>> {
        let until = Instant::now() + Duration::from_secs(secs);
        Some(Arc::new(Reading(Mutex::new(Some(until)))))
    }

    #[test]
    fn a_body_being_read_lets_go_at_its_read_deadline_and_one_read_at_once() {
        let body = reading(600).expect("a body being read");
        let secs = body.release_in(Instant::now()).as_secs();
        assert!((598..=600).contains(&secs), "{secs}");
        body.set(None);
        assert_eq!(body.release_in(Instant::now()), Duration::ZERO);
    }

    #[test]
    fn retry_after_waits_for_the_holders_in_the_way_until_they_free_what_is_missing() {
        let mut holdings = Holdings::default();
        let (hog, other) = (account("hog"), account("other"));
        holdings.add(None, &hog, 100, reading(10));
        holdings.add(None, &hog, 50, reading(2));
        holdings.add(None, &other, 1_000, reading(100));
        let hogs = |b: &HeldBody| b.holder == hog;
        // 40 KiB: the first to go is enough; 120 KiB: both of the hog's.
        assert!((1..=2).contains(&holdings.retry_after(40, hogs)));
        assert!((9..=10).contains(&holdings.retry_after(120, hogs)));
        assert!((99..=100).contains(&holdings.retry_after(2_000, |_| true)));
        // Nothing in the way that will let go later than now: at least a second.
        let read = account("read");
        holdings.add(None, &read, 10, None);
        assert_eq!(holdings.retry_after(10, |b| b.holder == read), 1);
        // Taking back what a body held: it is no longer in the way.
        holdings.remove(1, None);
        holdings.remove(2, None);
        assert_eq!(holdings.retry_after(10, hogs), 1);
        assert!(!holdings.kib_of.contains_key(&hog));
    }

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
