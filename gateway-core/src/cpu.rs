//! CPU-heavy work (parsing and tokenizing large inputs, decoding images, hashing passwords) off
//! the async workers: on tokio's blocking threads, at most one job per core at a time. A flood
//! of large requests then queues here, while every other request (and every other key) keeps
//! the async workers; and the memory such jobs take (argon2 alone takes 19 MiB) stays bounded
//! whatever the concurrency.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use thiserror::Error;
use tokio::sync::Semaphore;

use crate::telemetry::metrics;

/// Inputs up to this size are cheap enough to handle in place (a few hundred microseconds at
/// most); larger ones go to [`run`].
pub const INLINE_BYTES: usize = 64 * 1024;

static SLOTS: LazyLock<Semaphore> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Semaphore::new(cores)
});

/// A job that did not finish: it panicked, or the runtime is shutting down.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("a CPU-bound job failed")]
pub struct JobFailed;

/// Runs `job` on a blocking thread once a slot is free.
pub async fn run<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, JobFailed> {
    let _slot = SLOTS.acquire().await.map_err(|_| JobFailed)?;
    tokio::task::spawn_blocking(move || {
        let _running = metrics::cpu_job_running();
        job()
    })
    .await
    .map_err(|e| {
        tracing::error!(error = %e, "a CPU-bound job failed");
        JobFailed
    })
}

/// Set when whoever awaited a job of [`run_abandonable`] has gone (its client hung up); the
/// job checks it between steps and stops.
#[derive(Debug, Default)]
pub struct Abandoned(AtomicBool);

impl Abandoned {
    /// A flag never set, for work done in place.
    pub fn never() -> &'static Self {
        static NEVER: Abandoned = Abandoned(AtomicBool::new(false));
        &NEVER
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Sets its flag when dropped: when the future awaiting the job is.
struct AbandonOnDrop(Arc<Abandoned>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0 .0.store(true, Ordering::Relaxed);
    }
}

/// [`run`], for a job that stops early (checking its [`Abandoned`]) once nobody awaits it.
pub async fn run_abandonable<T: Send + 'static>(
    job: impl FnOnce(&Abandoned) -> T + Send + 'static,
) -> Result<T, JobFailed> {
    let abandoned = Arc::new(Abandoned::default());
    let _guard = AbandonOnDrop(abandoned.clone());
    run(move || job(&abandoned)).await
}
