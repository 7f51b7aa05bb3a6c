//! The process' shutdown, as the turns and the servers see it.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Shutdown in three steps: `stopping` when SIGTERM arrives (not ready any more, but still
/// accepting for the shutdown delay, while load balancers take the pod out of rotation),
/// `draining` after it (stop accepting), `expired` when the grace period is over (open turns
/// end with an error event). `tasks` tracks the settlements that run after a client went
/// away, so none is lost at exit.
#[derive(Clone, Default)]
pub struct Shutdown {
    pub stopping: CancellationToken,
    pub draining: CancellationToken,
    pub expired: CancellationToken,
    pub tasks: TaskTracker,
}
