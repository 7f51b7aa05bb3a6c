//! A turn's steps that hold something (its admission, its credits) finish even when the turn
//! is dropped in their middle, so that a hang-up cannot cut one in half.
//!
//! hyper drops a request's future when its client goes away, wherever that future is waiting.
//! A step dropped while it waited for Redis or Postgres has usually landed, or is about to:
//! - a reservation that landed after its turn was dropped was settled by nobody, and held its
//!   credits until the reaper's longest turn (an hour by default);
//! - on a pod with allotments, a turn dropped between the write of its row and the pod's
//!   bookkeeping, or while its allotment's refill was in flight, kept that allotment from ever
//!   going back to its account: its credits were held until the pod stopped;
//! - an admission that landed for a turn already gone kept its stream slot until the slot
//!   expired.
//!
//! Such a step is boxed and polled in place while its turn waits for it; dropped before it
//! ends, the rest of it runs on a task of the shutdown tracker, so it always finishes, and its
//! bookkeeping with it. What it gives to a turn that is gone by then is undone at once: a
//! reservation released (its row ends `client_disconnected`, billed nothing), an admission
//! finished. A step that ends while polled hands its result over within that poll, so no
//! result is lost between the two. (A task for every step instead cost 7,600 instructions a
//! step, a tenth of a standalone turn: docs/benchmarks-history.md, "A turn's steps finish when
//! their client hangs up".)

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use tokio_util::task::TaskTracker;

/// The log line of a turn dropped (its client gone) while one of its steps ran.
pub const DROPPED_MID_STEP: &str =
    "a turn was dropped (its client went away) in the middle of a step; the step finishes on its own task";

/// What to do with the result of a step that was dropped before it ended.
type Undo<T> = Box<dyn FnOnce(T) -> BoxFuture<'static, ()> + Send>;

/// `step`, finished on a task of `tasks` (a stopping process waits for them) if dropped before
/// it ends.
pub(super) fn finish<F, T>(tasks: &TaskTracker, step: F) -> Finishing<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    Finishing {
        step: Some(Box::pin(step)),
        undo: None,
        tasks: tasks.clone(),
    }
}

/// [`finish`], and then `undo` run on what the step gave, since no turn will take it.
pub(super) fn finish_or_undo<F, T, U, UF>(tasks: &TaskTracker, step: F, undo: U) -> Finishing<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    U: FnOnce(T) -> UF + Send + 'static,
    UF: Future<Output = ()> + Send + 'static,
{
    Finishing {
        step: Some(Box::pin(step)),
        undo: Some(Box::new(move |given| -> BoxFuture<'static, ()> {
            Box::pin(undo(given))
        })),
        tasks: tasks.clone(),
    }
}

/// A step that finishes whatever becomes of its caller: see [`finish`] and [`finish_or_undo`].
///
/// The step is boxed as a trait object: a step's own type carries the lifetimes of the function
/// that made it, and a `'static` bound on it here would not hold for the compiler wherever a
/// handler's future must be `Send`.
pub(super) struct Finishing<T: Send + 'static> {
    /// `None` once it ended and handed its result over.
    step: Option<BoxFuture<'static, T>>,
    undo: Option<Undo<T>>,
    tasks: TaskTracker,
}

impl<T: Send + 'static> Future for Finishing<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        // Polled again after it ended (a misuse): it never ends twice.
        let Some(step) = self.step.as_mut() else {
            return Poll::Pending;
        };
        let given = ready!(step.as_mut().poll(cx));
        self.step = None;
        Poll::Ready(given)
    }
}

impl<T: Send + 'static> Drop for Finishing<T> {
    fn drop(&mut self) {
        let Some(step) = self.step.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!("a step cut off while exiting: not finished (the reaper and the stream slots' expiry will see to it)");
            return;
        };
        // Said, so that a hang-up in the middle of a step can be told apart from none.
        tracing::info!("{DROPPED_MID_STEP}");
        let undo = self.undo.take();
        self.tasks.spawn_on(
            async move {
                let given = step.await;
                if let Some(undo) = undo {
                    undo(given).await;
                }
            },
            &runtime,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    type Record<T> = Arc<Mutex<T>>;

    fn read<T: Clone>(record: &Record<T>) -> T {
        record.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A step giving `value` after `after`.
    async fn step(value: Given, after: Duration) -> Given {
        tokio::time::sleep(after).await;
        value
    }

    type Given = Result<u64, &'static str>;

    /// An undo recording what it undid (what a step gave; nothing for an error), and its record.
    fn undoing() -> (
        impl FnOnce(Given) -> BoxFuture<'static, ()>,
        Record<Vec<u64>>,
    ) {
        let undone: Record<Vec<u64>> = Record::default();
        let record = undone.clone();
        let undo = move |given: Given| -> BoxFuture<'static, ()> {
            Box::pin(async move {
                if let Ok(v) = given {
                    record.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
            })
        };
        (undo, undone)
    }

    /// Waits for every task, undoes included.
    async fn settle(tasks: &TaskTracker) {
        tasks.close();
        tasks.wait().await;
    }

    const LANDS_AFTER: Duration = Duration::from_millis(50);
    const GIVES_UP_AFTER: Duration = Duration::from_millis(5);

    #[tokio::test]
    async fn what_a_step_gives_to_a_caller_that_is_gone_is_undone_once_it_lands() {
        let tasks = TaskTracker::new();
        let (undo, undone) = undoing();
        let waiting = finish_or_undo(&tasks, step(Ok(7), LANDS_AFTER), undo);
        let gone = tokio::time::timeout(GIVES_UP_AFTER, waiting).await;
        assert!(gone.is_err(), "the caller gave up before the step landed");
        settle(&tasks).await;
        assert_eq!(read(&undone), vec![7]);
    }

    #[tokio::test]
    async fn what_the_caller_takes_is_its_own_and_nothing_is_undone() {
        let tasks = TaskTracker::new();
        let (undo, undone) = undoing();
        let taken = finish_or_undo(&tasks, step(Ok(7), GIVES_UP_AFTER), undo).await;
        assert_eq!(taken, Ok(7));
        settle(&tasks).await;
        assert!(read(&undone).is_empty());
    }

    #[tokio::test]
    async fn a_failed_step_passes_its_error_on_and_has_nothing_to_undo() {
        let tasks = TaskTracker::new();
        let (undo, undone) = undoing();
        let failed = finish_or_undo(&tasks, step(Err("refused"), Duration::ZERO), undo).await;
        assert_eq!(failed, Err("refused"));

        let (undo, undone_while_gone) = undoing();
        let waiting = finish_or_undo(&tasks, step(Err("refused"), LANDS_AFTER), undo);
        assert!(tokio::time::timeout(GIVES_UP_AFTER, waiting).await.is_err());
        settle(&tasks).await;
        assert!(read(&undone).is_empty());
        assert!(read(&undone_while_gone).is_empty());
    }

    #[tokio::test]
    async fn a_step_runs_to_its_end_when_its_caller_is_gone() {
        let tasks = TaskTracker::new();
        let ended: Record<Option<Given>> = Record::default();
        let record = ended.clone();
        let whole = async move {
            let value = step(Ok(7), LANDS_AFTER).await;
            *record.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        };
        let gone = tokio::time::timeout(GIVES_UP_AFTER, finish(&tasks, whole)).await;
        assert!(gone.is_err(), "the caller gave up before the step ended");
        settle(&tasks).await;
        assert_eq!(read(&ended), Some(Ok(7)));
    }
}
