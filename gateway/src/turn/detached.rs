//! A turn's steps that hold something (its admission, its credits) run on tasks of their own,
//! so that a hang-up cannot cut one in half.
//!
//! hyper drops a request's future when its client goes away, wherever that future is waiting.
//! A step dropped while it waited for Redis or Postgres has usually landed, or is about to:
//! - a reservation that landed after its turn was dropped was settled by nobody, and held its
//!   credits until the reaper's longest turn (an hour by default);
//! - on a pod with allotments, a turn dropped between the write of its row and the pod's
//!   bookkeeping, or while its allotment's grant was in flight, kept that allotment from ever
//!   going back to its account: its credits were held until the pod stopped;
//! - an admission that landed for a turn already gone kept its stream slot until the slot's
//!   lease ran out.
//!
//! On its own task a step always finishes, and its bookkeeping with it. What a step gives to
//! a turn that is gone by then is undone at once: a reservation released (its row ends
//! `client_disconnected`, billed nothing), an admission finished.

use std::future::Future;

use tokio::sync::oneshot;
use tokio::task::JoinError;
use tokio_util::task::TaskTracker;

/// Runs `step` to its end on a task of `tasks` (a stopping process waits for them), whatever
/// becomes of the future awaiting its result.
pub(super) async fn run<F>(tasks: &TaskTracker, step: F) -> Result<F::Output, JoinError>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tasks.spawn(step).await
}

/// Runs `step` on a task of `tasks` and hands what it gives over to the caller; when the
/// caller is gone before taking it, `undo` runs on it instead. `None`: the task ended without
/// an answer (it panicked).
pub(super) async fn hand_over<T, E, F, U, UF>(
    tasks: &TaskTracker,
    step: F,
    undo: U,
) -> Option<Result<T, E>>
where
    T: Send + 'static,
    E: Send + 'static,
    F: Future<Output = Result<T, E>> + Send + 'static,
    U: FnOnce(T) -> UF + Send + 'static,
    UF: Future<Output = ()> + Send + 'static,
{
    let (answer, answered) = oneshot::channel();
    let undo_on = tasks.clone();
    tasks.spawn(async move {
        let given = step.await.map(|value| Unclaimed {
            value: Some(value),
            undo: Some(undo),
            tasks: undo_on,
        });
        // Refused when the caller is gone: the answer is dropped here, and undone.
        let _ = answer.send(given);
    });
    let given = answered.await.ok()?;
    given.map(Unclaimed::claim).transpose()
}

/// What a step gave and no caller has taken yet: undone when dropped so (with the turn that
/// was waiting for it, or in the channel on its way there).
struct Unclaimed<T, U, UF>
where
    T: Send + 'static,
    U: FnOnce(T) -> UF,
    UF: Future<Output = ()> + Send + 'static,
{
    value: Option<T>,
    undo: Option<U>,
    tasks: TaskTracker,
}

impl<T, U, UF> Unclaimed<T, U, UF>
where
    T: Send + 'static,
    U: FnOnce(T) -> UF,
    UF: Future<Output = ()> + Send + 'static,
{
    /// The value, now the caller's: nothing is undone.
    fn claim(mut self) -> Option<T> {
        self.undo = None;
        self.value.take()
    }
}

impl<T, U, UF> Drop for Unclaimed<T, U, UF>
where
    T: Send + 'static,
    U: FnOnce(T) -> UF,
    UF: Future<Output = ()> + Send + 'static,
{
    fn drop(&mut self) {
        let (Some(value), Some(undo)) = (self.value.take(), self.undo.take()) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.tasks.spawn_on(undo(value), &runtime);
            }
            Err(_) => tracing::error!(
                "a step's result nobody took, dropped while exiting: not undone (the reaper and the leases' expiry will)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::future::BoxFuture;

    use super::*;

    type Record<T> = Arc<Mutex<T>>;

    fn read<T: Clone>(record: &Record<T>) -> T {
        record.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A step giving `value` after `after`.
    async fn step(value: Result<u64, &'static str>, after: Duration) -> Result<u64, &'static str> {
        tokio::time::sleep(after).await;
        value
    }

    /// An undo recording what it undid, and its record.
    fn undoing() -> (impl FnOnce(u64) -> BoxFuture<'static, ()>, Record<Vec<u64>>) {
        let undone: Record<Vec<u64>> = Record::default();
        let record = undone.clone();
        let undo = move |v: u64| -> BoxFuture<'static, ()> {
            Box::pin(async move { record.lock().unwrap_or_else(|e| e.into_inner()).push(v) })
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
        let waiting = hand_over(&tasks, step(Ok(7), LANDS_AFTER), undo);
        let gone = tokio::time::timeout(GIVES_UP_AFTER, waiting).await;
        assert!(gone.is_err(), "the caller gave up before the step landed");
        settle(&tasks).await;
        assert_eq!(read(&undone), vec![7]);
    }

    #[tokio::test]
    async fn what_the_caller_takes_is_its_own_and_nothing_is_undone() {
        let tasks = TaskTracker::new();
        let (undo, undone) = undoing();
        let taken = hand_over(&tasks, step(Ok(7), GIVES_UP_AFTER), undo).await;
        assert_eq!(taken, Some(Ok(7)));
        settle(&tasks).await;
        assert!(read(&undone).is_empty());
    }

    #[tokio::test]
    async fn a_failed_step_passes_its_error_on_and_has_nothing_to_undo() {
        let tasks = TaskTracker::new();
        let (undo, undone) = undoing();
        let failed = hand_over(&tasks, step(Err("refused"), Duration::ZERO), undo).await;
        assert_eq!(failed, Some(Err("refused")));

        let (undo, undone_while_gone) = undoing();
        let waiting = hand_over(&tasks, step(Err("refused"), LANDS_AFTER), undo);
        assert!(tokio::time::timeout(GIVES_UP_AFTER, waiting).await.is_err());
        settle(&tasks).await;
        assert!(read(&undone).is_empty());
        assert!(read(&undone_while_gone).is_empty());
    }

    #[tokio::test]
    async fn a_step_runs_to_its_end_when_its_caller_is_gone() {
        let tasks = TaskTracker::new();
        let ended: Record<Option<Result<u64, &str>>> = Record::default();
        let record = ended.clone();
        let whole = async move {
            let value = step(Ok(7), LANDS_AFTER).await;
            *record.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
        };
        let gone = tokio::time::timeout(GIVES_UP_AFTER, run(&tasks, whole)).await;
        assert!(gone.is_err(), "the caller gave up before the step ended");
        settle(&tasks).await;
        assert_eq!(read(&ended), Some(Ok(7)));
    }
}
