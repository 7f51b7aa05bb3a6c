//! A turn's money steps run on tasks of their own, so that a hang-up cannot cut one in half.
//!
//! hyper drops a request's future when its client goes away, wherever that future is waiting.
//! A ledger step dropped while it waited for Postgres has usually landed, or is about to:
//! - a reservation that landed after its turn was dropped was settled by nobody, and held its
//!   credits until the reaper's longest turn (an hour by default);
//! - on a pod with allotments, a turn dropped between the write of its row and the pod's
//!   bookkeeping, or while its allotment's grant was in flight, kept that allotment from ever
//!   going back to its account: its credits were held until the pod stopped.
//!
//! On its own task a step always finishes, and its bookkeeping with it. A reservation that
//! lands for a turn that is gone is released at once (its row ends `client_disconnected`,
//! billed nothing), as any turn whose client left before it was answered.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinError;
use tokio_util::task::TaskTracker;

use store::ledger::{Ledger, LedgerError, MessageStatus, NewReservation, Settlement};

/// Runs `step` to its end on a task of `tasks` (a stopping process waits for them), whatever
/// becomes of the future awaiting its result.
pub(super) async fn run<F>(tasks: &TaskTracker, step: F) -> Result<F::Output, JoinError>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tasks.spawn(step).await
}

/// Reserves `r` on a task of its own. The credits held are the turn's once it takes the
/// answer; a reservation that nobody takes is released.
pub(super) async fn reserve(
    ledger: &Arc<dyn Ledger>,
    tasks: &TaskTracker,
    r: NewReservation,
) -> Result<u64, LedgerError> {
    let (answer, answered) = oneshot::channel();
    let unclaimed = Unclaimed {
        ledger: ledger.clone(),
        tasks: tasks.clone(),
        message_id: Some(r.record.id.clone()),
    };
    let ledger = ledger.clone();
    tasks.spawn(async move {
        let reserved = match ledger.reserve(r).await {
            Ok(amount) => Ok((amount, unclaimed)),
            Err(e) => {
                unclaimed.claim();
                Err(e)
            }
        };
        // Refused when the turn is gone: the answer is dropped here, releasing what it holds.
        let _ = answer.send(reserved);
    });
    match answered.await {
        Ok(reserved) => reserved.map(|(amount, unclaimed)| {
            unclaimed.claim();
            amount
        }),
        Err(_) => Err(LedgerError::Unavailable(
            "the reservation's task ended without an answer".into(),
        )),
    }
}

/// A landed reservation no turn has taken yet; dropped unclaimed (its answer lost with the
/// turn), it releases the credits.
struct Unclaimed {
    ledger: Arc<dyn Ledger>,
    tasks: TaskTracker,
    /// `None` once claimed.
    message_id: Option<String>,
}

impl Unclaimed {
    fn claim(mut self) {
        self.message_id = None;
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(message_id) = self.message_id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(%message_id, "a reservation nobody took, dropped while exiting; the reaper will release it");
            return;
        };
        let ledger = self.ledger.clone();
        self.tasks.spawn_on(
            async move {
                let release = Settlement::nothing(message_id, MessageStatus::ClientDisconnected);
                if let Err(e) = ledger.settle(release).await {
                    tracing::warn!(error = %e, "could not release the reservation of a turn whose client left; the reaper will");
                }
            },
            &runtime,
        );
    }
}
