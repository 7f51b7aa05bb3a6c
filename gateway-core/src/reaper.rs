//! Cluster mode's reaper: every pod beats its heartbeat in the ledger and releases the
//! reservations of processes that went silent, or of turns older than any turn runs.

use std::sync::Arc;
use std::time::Duration;

use store::ledger::PostgresLedger;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reaping {
    /// A process silent this long is dead.
    pub stale: Duration,
    /// No turn runs longer.
    pub max_turn: Duration,
    /// How long a stopping process announces it may still write.
    pub draining: Duration,
}

/// Beats this process' heartbeat and releases orphaned reservations, every third of `stale`.
/// Every pod runs it; the release is idempotent, so they never conflict. The heartbeat goes
/// on through shutdown, until the ledger has written its last row (a stopping process is not
/// dead); from SIGTERM the process announces how long it may take and stops reaping.
pub async fn run(ledger: Arc<PostgresLedger>, reaping: Reaping, draining: CancellationToken) {
    let mut ticks = tokio::time::interval(reaping.stale / 3);
    let mut announced = false;
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
        match ledger.reap(reaping.stale, reaping.max_turn).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(released = n, "released orphaned reservations"),
            Err(e) => tracing::warn!(error = %e, "reaper failed; retrying at the next tick"),
        }
    }
}
