//! CPU-heavy work (parsing and tokenizing large inputs, decoding images, hashing passwords) off
//! the async workers: on tokio's blocking threads, at most one job per core at a time. A flood
//! of large requests then queues here, while every other request (and every other key) keeps
//! the async workers; and the memory such jobs take (argon2 alone takes 19 MiB) stays bounded
//! whatever the concurrency.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use thiserror::Error;
use tokio::sync::Semaphore;

/// Inputs up to this size are cheap enough to handle in place (a few hundred microseconds at
/// most); larger ones go to [`run`].
pub const INLINE_BYTES: usize = 64 * 1024;

static SLOTS: LazyLock<Semaphore> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Semaphore::new(cores)
});

/// The jobs' counts, registered by `telemetry::metrics` (`gateway_cpu_jobs_*`). Kept here, so
/// that this module, below the tokenizer, imports nothing of the crate.
pub struct JobCounts {
    pub running: Gauge,
    pub started: Counter,
    /// Stopped early because their caller left ([`job_abandoned`]).
    pub abandoned: Counter,
}

pub static JOBS: LazyLock<JobCounts> = LazyLock::new(|| JobCounts {
    running: Gauge::default(),
    started: Counter::default(),
    abandoned: Counter::default(),
});

/// Counts a job that stopped early because its caller left.
pub fn job_abandoned() {
    JOBS.abandoned.inc();
}

/// A job running, counted until dropped (a job that panics included).
struct Running;

impl Running {
    fn start() -> Self {
        JOBS.started.inc();
        JOBS.running.inc();
        Self
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        JOBS.running.dec();
    }
}

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
        let _running = Running::start();
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
