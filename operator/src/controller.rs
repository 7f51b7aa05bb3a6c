//! The config controller's loop: kube-runtime's `Controller` runs [`publish::reconcile`] for
//! one trigger object, the config Secret's reference, to which every Tier, ModelRoute and
//! ApiKey event of the namespace maps, and the events of the Secrets the operator reads (the
//! config Secret and those of `--secret`, each watched by name: a `metadata.name` field
//! selector is what lets RBAC authorize a list or watch restricted to `resourceNames`).
//!
//! One trigger because validity is a property of the whole set (see [`crate::publish`]): every
//! change recompiles everything, so mapping all events to one reference lets the controller
//! coalesce a burst (a `kubectl apply` of a folder) into one reconcile and never run two at
//! once. The trigger is held, not watched: the config Secret does not exist until the first
//! valid config is published, and a `Controller` only reconciles objects in its store, so the
//! store is seeded with the reference (name and namespace, nothing else) instead of filled by a
//! watch. The config Secret, created by the chart, is watched too: an edit or a deletion of it
//! calls for a republication.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::resources::{ApiKey, ModelRoute, Tier};
use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, Controller};

use crate::error::{Error, Result};
use crate::metrics::{Metrics, ReasonLabel};
use crate::publish::{self, Context};

/// A `kubectl apply` of a folder arrives as a burst of events: wait this long after the last
/// one, then compile once.
const BURST: Duration = Duration::from_millis(200);
/// The first retry after a failed reconcile; each further failure doubles the wait.
const FIRST_RETRY: Duration = Duration::from_secs(5);
/// A failing API server or missing RBAC is retried at least this often.
const LONGEST_RETRY: Duration = Duration::from_secs(300);

/// What the reconcile and the error policy share.
pub struct State {
    ctx: Context,
    /// Recompile this long after a success even without an event, as a safety net for missed
    /// watch events.
    resync: Duration,
    backoff: Backoff,
    metrics: Arc<Metrics>,
}

impl State {
    pub fn new(ctx: Context, resync: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            ctx,
            resync,
            backoff: Backoff::default(),
            metrics,
        }
    }
}

/// Consecutive failed reconciles, so that each retry waits longer than the last.
#[derive(Default)]
struct Backoff {
    failures: AtomicU32,
}

impl Backoff {
    /// Counts a failure and returns how long to wait before the next attempt.
    fn failed(&self) -> Duration {
        let before = self.failures.fetch_add(1, Ordering::Relaxed);
        FIRST_RETRY
            .saturating_mul(2u32.saturating_pow(before.min(16)))
            .min(LONGEST_RETRY)
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }
}

/// Reconciles on every change of the namespace's resources and Secrets, `resync` after each
/// success, and with a growing backoff after failures; returns only if every watch ends.
pub async fn run(state: State) {
    let trigger = trigger(&state.ctx);
    let target = ObjectRef::from_obj(&trigger);
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::InitApply(trigger.clone()));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let state = Arc::new(state);
    let ctx = &state.ctx;
    let all = watcher::Config::default;
    let mut controller = Controller::for_stream(stream::iter([Ok(trigger)]), store)
        .with_config(controller::Config::default().debounce(BURST))
        .watches(ctx.api::<Tier>(), all(), to(&target))
        .watches(ctx.api::<ModelRoute>(), all(), to(&target))
        .watches(ctx.api::<ApiKey>(), all(), to(&target));
    for name in std::iter::once(&ctx.secret).chain(&ctx.readable) {
        let by_name = all().fields(&format!("metadata.name={name}"));
        controller = controller.watches(ctx.api::<Secret>(), by_name, to(&target));
    }
    controller
        .run(reconcile, error_policy, state.clone())
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                // Already logged by the error policy, with its retry.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(error) => tracing::warn!(%error, "watch failed; retrying"),
            }
        })
        .await;
}

/// The reference every event maps to: the config Secret, by name alone.
fn trigger(ctx: &Context) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(ctx.secret.clone()),
            namespace: Some(ctx.namespace.clone()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    }
}

fn to<K>(target: &ObjectRef<Secret>) -> impl Fn(K) -> Option<ObjectRef<Secret>> + Send + Sync {
    let target = target.clone();
    move |_| Some(target.clone())
}

async fn reconcile(_trigger: Arc<Secret>, state: Arc<State>) -> Result<Action> {
    let metrics = &state.metrics;
    let started = Instant::now();
    let result = publish::reconcile(&state.ctx).await;
    metrics.reconciles.inc();
    metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let outcome = result.inspect_err(|error| {
        metrics
            .reconcile_errors
            .get_or_create(&ReasonLabel {
                reason: error.reason(),
            })
            .inc();
        metrics.reconcile_failing.set(1);
    })?;
    metrics.reconcile_failing.set(0);
    tracing::debug!(?outcome, "reconciled");
    state.backoff.succeeded();
    Ok(Action::requeue(state.resync))
}

fn error_policy(_trigger: Arc<Secret>, error: &Error, state: Arc<State>) -> Action {
    let retry = state.backoff.failed();
    tracing::warn!(%error, retry_in = ?retry, "reconcile failed; retrying");
    Action::requeue(retry)
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;
    use crate::testing::{
        api_server, expect, fail, finds_config, no_check, reading, records_event, route, simulated,
        writes_config, Expect, CRDS, NS,
    };

    /// The requests of a reconcile of a valid namespace that publishes.
    fn publishing() -> Vec<Expect> {
        reading(
            vec![route(simulated())],
            vec![
                expect(
                    Method::PATCH,
                    &format!("{CRDS}/modelroutes/svc-fast/status"),
                    route(simulated()),
                    no_check,
                ),
                finds_config(),
                writes_config(no_check),
                records_event("e1", no_check),
            ],
        )
    }

    /// The API server refuses the first list: the operator's RBAC is missing.
    fn refused() -> Expect {
        fail(Method::GET, &format!("{CRDS}/tiers"), 403, "Forbidden")
    }

    /// Runs one attempt the way the controller does: the reconcile, then on failure the error
    /// policy; the action says when the controller tries again.
    async fn attempt(state: &Arc<State>) -> Action {
        let trigger = Arc::new(trigger(&state.ctx));
        match reconcile(trigger.clone(), state.clone()).await {
            Ok(action) => action,
            Err(error) => error_policy(trigger, &error, state.clone()),
        }
    }

    #[tokio::test]
    async fn a_failing_reconcile_is_retried_later_and_later_and_a_success_resets_the_wait() {
        let (service, handle) = tower_test::mock::pair();
        let mut requests = vec![refused(), refused(), refused()];
        requests.extend(publishing());
        requests.push(refused());
        let server = tokio::spawn(api_server(handle, requests));
        let ctx = Context::new(
            kube::Client::new(service, NS),
            NS.to_owned(),
            "gateway-config".to_owned(),
            Vec::new(),
            "operator-0".to_owned(),
        );
        let metrics = Arc::new(Metrics::default());
        let state = Arc::new(State::new(ctx, Duration::from_secs(600), metrics.clone()));

        let mut waits = Vec::new();
        for _ in 0..5 {
            waits.push(attempt(&state).await);
        }
        drop(state);
        if let Err(panic) = server.await {
            std::panic::resume_unwind(panic.into_panic());
        }
        let secs = |s| Action::requeue(Duration::from_secs(s));
        assert_eq!(
            waits,
            [secs(5), secs(10), secs(20), secs(600), secs(5)],
            "three failures wait 5, 10, 20 s; a success waits the resync; the next failure 5 s again"
        );
    }

    #[tokio::test]
    async fn every_reconcile_is_counted_and_timed_failures_by_reason_and_the_last_one_shown() {
        let (service, handle) = tower_test::mock::pair();
        let mut requests = vec![refused(), refused()];
        requests.extend(publishing());
        requests.push(refused());
        let server = tokio::spawn(api_server(handle, requests));
        let ctx = Context::new(
            kube::Client::new(service, NS),
            NS.to_owned(),
            "gateway-config".to_owned(),
            Vec::new(),
            "operator-0".to_owned(),
        );
        let metrics = Arc::new(Metrics::default());
        let state = Arc::new(State::new(ctx, Duration::from_secs(600), metrics.clone()));

        let mut failing = Vec::new();
        for _ in 0..4 {
            attempt(&state).await;
            failing.push(metrics.reconcile_failing.get());
        }
        drop(state);
        if let Err(panic) = server.await {
            std::panic::resume_unwind(panic.into_panic());
        }
        assert_eq!(
            failing,
            [1, 1, 0, 1],
            "the gauge follows the last reconcile"
        );
        assert_eq!(metrics.reconciles.get(), 4);
        let forbidden = ReasonLabel {
            reason: "api_forbidden",
        };
        assert_eq!(metrics.reconcile_errors.get_or_create(&forbidden).get(), 3);
        let page = metrics.render();
        for line in [
            r#"gateway_operator_reconcile_errors_total{reason="api_forbidden"} 3"#,
            "gateway_operator_reconcile_duration_seconds_count 4",
        ] {
            assert!(page.lines().any(|l| l == line), "no `{line}` in\n{page}");
        }
    }

    #[test]
    fn the_wait_between_retries_stops_growing_at_five_minutes() {
        let backoff = Backoff::default();
        let waits: Vec<Duration> = (0..40).map(|_| backoff.failed()).collect();
        assert_eq!(waits[6], LONGEST_RETRY);
        assert_eq!(waits[39], LONGEST_RETRY);
    }
}
