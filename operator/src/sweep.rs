//! The promotion sweep as a timed loop that only the Lease holder runs, so each change
//! happens once however many operator replicas there are. The sweep itself (which keys move to
//! which tier) belongs to the ledger; this loop only times, logs and counts it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use store::accounts::Promotion;
use tokio::sync::watch;

use crate::error::Result;
use crate::metrics::Metrics;

/// Runs `sweep` every `interval` while `leading` says this process holds the Lease; the first
/// sweep runs as soon as leadership is gained.
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
            if leading.changed().await.is_err() {
                return;
            }
            continue;
        }
        sweep_once(&metrics, &sweep).await;
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            changed = leading.changed() => if changed.is_err() { return },
        }
    }
}

async fn sweep_once<F, Fut>(metrics: &Metrics, sweep: &F)
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
            tracing::info!(changes = promotions.len(), "promotion sweep done");
        }
        Err(error) => {
            metrics.sweep_failures.inc();
            tracing::warn!(%error, "promotion sweep failed");
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
    async fn a_failed_sweep_is_counted_and_changes_nothing() {
        let metrics = Metrics::default();
        sweep_once(&metrics, &|| async { Err(crate::error::Error::NoRules) }).await;
        assert_eq!(metrics.sweep_failures.get(), 1);
        assert_eq!(metrics.sweeps.get(), 0);
        assert_eq!(metrics.promotions.get(), 0);
    }
}
