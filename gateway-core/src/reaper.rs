//! Cluster mode's reaper: every pod beats its heartbeat in the ledger and releases the
//! reservations of processes that went silent, or of turns older than any turn runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use store::ledger::PostgresLedger;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

/// How often a pod's reap reads every day's reservations (and its first reap does): a
/// reservation older than the longest turn is released by the first reap that sees it, so one
/// older than the recent days' window is left only after every pod was down for longer, and
/// these reaps find it.
const EVERY_DAY_EVERY: Duration = Duration::from_secs(3_600);
/// How far back past the longest turn the other reaps read (a day: room for a clock's skew and
/// for an outage of every pod shorter than that).
const WINDOW_PAST_MAX_TURN: Duration = Duration::from_secs(86_400);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reaping {
    /// A process silent this long is dead.
    pub stale: Duration,
    /// No turn runs longer.
    pub max_turn: Duration,
    /// How long a stopping process announces it may still write.
    pub draining: Duration,
}

/// Beats this process' heartbeat and releases orphaned reservations, every third of `stale`:
/// those of the last day past the longest turn, and every day's at the first reap and hourly.
/// Every pod runs it; the release is idempotent, so they never conflict. The heartbeat goes
/// on through shutdown, until the ledger has written its last row (a stopping process is not
/// dead); from SIGTERM the process announces how long it may take and stops reaping.
pub async fn run(ledger: Arc<PostgresLedger>, reaping: Reaping, draining: CancellationToken) {
    let mut ticks = tokio::time::interval(reaping.stale / 3);
    let mut announced = false;
    let mut read_every_day_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ledger.closed() => return,
            _ = draining.cancelled(), if !announced => {
                announced = true;
                if let Err(e) = ledger.drain(reaping.draining).await {
                    tracing::warn!(error = %e, "could not announce the drain; the heartbeat keeps the lease");
                }
                continue;
            }
            _ = ticks.tick() => {}
        }
        if let Err(e) = ledger.heartbeat().await {
            tracing::warn!(error = %e, "ledger heartbeat failed");
            continue;
        }
        if announced || !ledger.may_reap(reaping.stale) {
            continue;
        }
        let since = read_every_day_at
            .filter(|at| at.elapsed() < EVERY_DAY_EVERY)
            .and_then(|_| window_start(reaping.max_turn));
        match ledger.reap(reaping.stale, reaping.max_turn, since).await {
            Ok(n) => {
                if since.is_none() {
                    read_every_day_at = Some(Instant::now());
                }
                if n > 0 {
                    tracing::warn!(released = n, "released orphaned reservations");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reaper failed; retrying at the next tick"),
        }
    }
}

/// Where the recent days' window starts; `None` (every day) when the longest turn is too long
/// to count back from now.
fn window_start(max_turn: Duration) -> Option<OffsetDateTime> {
    let back = max_turn.checked_add(WINDOW_PAST_MAX_TURN)?;
    OffsetDateTime::now_utc().checked_sub(time::Duration::try_from(back).ok()?)
}
