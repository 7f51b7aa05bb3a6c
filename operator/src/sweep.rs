//! The promotion sweep as a timed loop that only the Lease holder runs, so each change
//! happens once however many operator replicas there are. The sweep itself (which keys move to
//! which tier) belongs to the ledger; this loop only times, logs and counts it, and marks the
//! replica not ready while its last sweep failed (`Metrics::sweep_failing`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use store::accounts::Promotion;
use tokio::sync::watch;

use crate::error::Result;
use crate::metrics::Metrics;

/// How soon a failed sweep is tried again (at most `interval`): a database that comes back, or
/// the first config compiled just after leadership was gained, should not leave the replica
/// not ready for a whole interval.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(15);

/// Runs `sweep` every `interval` while `leading` says this process holds the Lease; the first
/// sweep runs as soon as leadership is gained, and a failed one is retried after
/// [`RETRY_AFTER_FAILURE`].
pub async fn run<F, Fut>(
    interval: Duration,
    mut leading: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    sweep: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Vec<Promotion>>>,
{
    loop {
        if !*leading.borrow_and_update() {
            // A follower runs no sweep, so nothing of its readiness depends on one.
            metrics.sweep_failing.set(0);
            if leading.changed().await.is_err() {
                return;
            }
            continue;
        }
        let wait = if sweep_once(&metrics, &sweep).await {
            interval
        } else {
            interval.min(RETRY_AFTER_FAILURE)
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            changed = leading.changed() => if changed.is_err() { return },
        }
    }
}

/// One sweep, counted; whether it succeeded.
async fn sweep_once<F, Fut>(metrics: &Metrics, sweep: &F) -> bool
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Vec<Promotion>>>,
{
    match sweep().await {
        Ok(promotions) => {
            metrics.sweeps.inc();
            for p in &promotions {
                tracing::info!(key = %p.key_id, account = %p.account_id, from = %p.from, to = %p.to, "promotion sweep changed a key's tier");
            }
            metrics.promotions.inc_by(promotions.len() as u64);
            metrics.sweep_failing.set(0);
            tracing::info!(changes = promotions.len(), "promotion sweep done");
            true
        }
        Err(error) => {
            metrics.sweep_failures.inc();
            metrics.sweep_failing.set(1);
            tracing::warn!(%error, "promotion sweep failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn promotion() -> Promotion {
        Promotion {
            key_id: "key_1".to_owned(),
            account_id: "acct_1".to_owned(),
            from: "free".to_owned(),
            to: "pay_as_you_go".to_owned(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_leader_sweeps_and_each_change_is_counted() {
        let metrics = Arc::new(Metrics::default());
        let (leading, rx) = watch::channel(false);
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let task = tokio::spawn(run(
            Duration::from_secs(300),
            rx,
            metrics.clone(),
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok(vec![promotion()]) }
            },
        ));
        tokio::time::sleep(Duration::from_secs(900)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "a follower never sweeps");

        leading.send_replace(true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "the new leader sweeps at once"
        );
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3, "then every interval");
        assert_eq!(metrics.promotions.get(), 3);

        leading.send_replace(false);
        tokio::time::sleep(Duration::from_secs(900)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "a lost Lease stops the sweeps"
        );
        task.abort();
    }

    #[tokio::test]
    async fn a_failed_sweep_is_counted_marks_the_replica_failing_and_changes_nothing() {
        let metrics = Metrics::default();
        let succeeded = sweep_once(&metrics, &|| async { Err(crate::error::Error::NoRules) }).await;
        assert!(!succeeded);
        assert_eq!(metrics.sweep_failures.get(), 1);
        assert_eq!(metrics.sweep_failing.get(), 1);
        assert_eq!(metrics.sweeps.get(), 0);
        assert_eq!(metrics.promotions.get(), 0);

        assert!(sweep_once(&metrics, &|| async { Ok(vec![]) }).await);
        assert_eq!(metrics.sweep_failing.get(), 0, "a good sweep clears it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_sweep_is_retried_soon_and_a_lost_lease_clears_the_failure() {
        let metrics = Arc::new(Metrics::default());
        let (leading, rx) = watch::channel(true);
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let task = tokio::spawn(run(
            Duration::from_secs(300),
            rx,
            metrics.clone(),
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Err(crate::error::Error::NoRules) }
            },
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(metrics.sweep_failing.get(), 1);
        tokio::time::sleep(RETRY_AFTER_FAILURE).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "retried before the interval"
        );

        leading.send_replace(false);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            metrics.sweep_failing.get(),
            0,
            "a follower is not failing a sweep"
        );
        task.abort();
    }
}
