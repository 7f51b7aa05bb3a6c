//! One memory budget per process for the request bodies being read, parsed and tokenized: a
//! semaphore whose permits are KiB. A body takes its share before it is buffered (its declared
//! `Content-Length` at once, or chunk by chunk when it declares none) and gives it back when
//! its request has its answer ([`hold`]). Past the budget a body waits [`WAIT`], then gets
//! 503 with `Retry-After`; one that could never fit gets 413. Small bodies ([`FREE_BYTES`]:
//! the forms, most `/v1` calls) take no share, so large bodies held open cannot keep them out;
//! their memory is bounded by the connection cap instead.

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
/// Bodies up to this size take no share of the budget.
pub const FREE_BYTES: usize = 16 * 1024;
/// How long a body waits for its share before the 503.
pub const WAIT: Duration = Duration::from_secs(2);
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
}

impl Budget {
    fn new(bytes: usize) -> Self {
        let total_kib = (bytes / KIB).clamp(1, u32::MAX as usize);
        Self {
            kib: Semaphore::new(total_kib),
            total_kib,
        }
    }
}

/// The share of the budget one body holds; given back on drop.
#[derive(Debug, Default)]
pub struct Reservation {
    permits: Option<SemaphorePermit<'static>>,
    /// Body bytes received so far (the free allowance is counted against this).
    body_bytes: usize,
}

impl Reservation {
    /// Takes the share of a body of `body_bytes` in all (its declared length), waiting
    /// at most [`WAIT`].
    pub async fn for_body(body_bytes: usize) -> Result<Self, BudgetError> {
        let mut reservation = Self::default();
        reservation.grow_to(body_bytes).await?;
        Ok(reservation)
    }

    /// Extends the share to cover a body of `body_bytes` so far (for bodies that declared no
    /// length); a no-op while the body is within what is already held.
    pub async fn grow_to(&mut self, body_bytes: usize) -> Result<(), BudgetError> {
        if body_bytes <= self.body_bytes {
            return Ok(());
        }
        let needed = cost_kib(body_bytes);
        let held = cost_kib(self.body_bytes);
        self.body_bytes = body_bytes;
        if needed == held {
            return Ok(());
        }
        let budget = budget();
        if needed > budget.total_kib {
            return Err(BudgetError::TooLarge {
                body_bytes,
                budget_bytes: budget.total_kib * KIB,
            });
        }
        let more = u32::try_from(needed - held).map_err(|_| BudgetError::Busy)?;
        let permit = tokio::time::timeout(WAIT, budget.kib.acquire_many(more))
            .await
            .map_err(|_| BudgetError::Busy)?
            .map_err(|_| BudgetError::Busy)?;
        match &mut self.permits {
            Some(held) => held.merge(permit),
            None => self.permits = Some(permit),
        }
        Ok(())
    }
}

/// The KiB of budget a body of `body_bytes` costs.
fn cost_kib(body_bytes: usize) -> usize {
    if body_bytes <= FREE_BYTES {
        return 0;
    }
    body_bytes.saturating_mul(BYTES_PER_BODY_BYTE).div_ceil(KIB)
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
    fn small_bodies_cost_nothing_and_larger_ones_four_times_their_size() {
        assert_eq!(cost_kib(FREE_BYTES), 0);
        assert_eq!(cost_kib(1024 * 1024), 4 * 1024);
    }
}
