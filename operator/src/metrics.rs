//! The operator's Prometheus metrics, served on `--metrics-listen` with the probes: `/livez`
//! answers while the runtime serves requests; `/readyz` too, except while this replica's last
//! promotion sweep failed (a database it cannot reach, say), so that a sweep that stopped
//! working shows in `kubectl get pods` and in alerts on readiness, not only in a log line.
//!
//! A plain hyper server rather than a router: three fixed paths do not need one, and it keeps
//! axum out of the operator's dependencies.

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// What `/metrics` answers with: the OpenMetrics text format, which Prometheus reads.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A failed reconcile's label: which kind of failure ([`crate::error::Error::reason`]), a
/// small fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// One registry per process, handed to the loops that count; tests build their own.
pub struct Metrics {
    registry: Registry,
    /// Config reconciles run (each compiles the namespace's resources and publishes), failed
    /// ones included.
    pub reconciles: Counter,
    pub reconcile_errors: Family<ReasonLabel, Counter>,
    pub reconcile_duration: Histogram,
    /// 1 while this process's last config reconcile failed: changes to Tiers, ModelRoutes and
    /// ApiKeys are then not published.
    pub reconcile_failing: Gauge,
    pub sweeps: Counter,
    pub sweep_failures: Counter,
    pub promotions: Counter,
    /// 1 while the last promotion sweep of this replica failed; readiness follows it.
    pub sweep_failing: Gauge,
    pub leading: Gauge,
    pub desired_replicas: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let reconciles = Counter::default();
        let reconcile_errors = Family::<ReasonLabel, Counter>::default();
        // 5 ms to about 10 s: a compile and publish takes tens of milliseconds; a slow API
        // server shows in the top buckets.
        let reconcile_duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let reconcile_failing = Gauge::default();
        let sweeps = Counter::default();
        let sweep_failures = Counter::default();
        let promotions = Counter::default();
        let sweep_failing = Gauge::default();
        let leading = Gauge::default();
        let desired_replicas = Gauge::default();
        // Counters are registered without `_total`: the encoder appends it.
        registry.register(
            "gateway_operator_reconciles",
            "Config reconciles run by this process, failed ones included",
            reconciles.clone(),
        );
        registry.register(
            "gateway_operator_reconcile_errors",
            "Config reconciles that failed, by reason",
            reconcile_errors.clone(),
        );
        registry.register_with_unit(
            "gateway_operator_reconcile_duration",
            "How long a config reconcile took, failed ones included",
            prometheus_client::registry::Unit::Seconds,
            reconcile_duration.clone(),
        );
        registry.register(
            "gateway_operator_reconcile_failing",
            "1 while this process's last config reconcile failed (config changes are not published)",
            reconcile_failing.clone(),
        );
        registry.register(
            "gateway_operator_sweeps",
            "Promotion sweeps run by this process",
            sweeps.clone(),
        );
        registry.register(
            "gateway_operator_sweep_failures",
            "Promotion sweeps that failed",
            sweep_failures.clone(),
        );
        registry.register(
            "gateway_operator_promotions",
            "Keys whose tier a sweep changed",
            promotions.clone(),
        );
        registry.register(
            "gateway_operator_sweep_failing",
            "1 while this process's last promotion sweep failed (it then reports not ready)",
            sweep_failing.clone(),
        );
        registry.register(
            "gateway_operator_leading",
            "1 while this process holds the leader Lease",
            leading.clone(),
        );
        registry.register(
            "gateway_operator_desired_replicas",
            "Gateway replicas last set by the scaler",
            desired_replicas.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            reconcile_failing,
            sweeps,
            sweep_failures,
            promotions,
            sweep_failing,
            leading,
            desired_replicas,
        }
    }
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoding error would only cut the page short.
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(%error, "cannot encode the metrics");
        }
        out
    }
}

/// Serves `/metrics`, `/livez` and `/readyz` on `listener` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors, say: the probes failing would restart a pod that
                // works, so wait for some to be freed rather than stop serving.
                tracing::warn!(%error, "cannot accept a metrics connection");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let response = respond(&request, &metrics);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "metrics connection ended");
            }
        });
    }
}

fn respond(request: &Request<Incoming>, metrics: &Metrics) -> Response<String> {
    let (status, content_type, body) = match request.uri().path() {
        "/metrics" => (StatusCode::OK, OPENMETRICS, metrics.render()),
        "/livez" => (StatusCode::OK, "text/plain", "ok".to_owned()),
        "/readyz" if metrics.sweep_failing.get() != 0 => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the promotion sweep is failing (see the log and gateway_operator_sweep_failures_total)"
                .to_owned(),
        ),
        "/readyz" => (StatusCode::OK, "text/plain", "ok".to_owned()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found".to_owned()),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn server() -> (String, Arc<Metrics>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let metrics = Arc::new(Metrics::default());
        tokio::spawn(serve(listener, metrics.clone()));
        (format!("http://{addr}"), metrics)
    }

    async fn get(url: &str) -> (u16, String, String) {
        let response = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client")
            .get(url)
            .send()
            .await
            .expect("response");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        (status, content_type, response.text().await.expect("body"))
    }

    #[tokio::test]
    async fn metrics_keep_their_names_and_types_and_show_what_was_counted() {
        let (url, metrics) = server().await;
        metrics.promotions.inc_by(2);
        metrics.desired_replicas.set(3);
        let (status, content_type, body) = get(&format!("{url}/metrics")).await;
        assert_eq!(status, 200);
        assert!(content_type.starts_with("application/openmetrics-text"));
        for line in [
            "# TYPE gateway_operator_reconciles counter",
            "gateway_operator_reconciles_total 0",
            "# TYPE gateway_operator_reconcile_duration_seconds histogram",
            "gateway_operator_reconcile_duration_seconds_count 0",
            "# TYPE gateway_operator_reconcile_failing gauge",
            "gateway_operator_reconcile_failing 0",
            "# TYPE gateway_operator_sweeps counter",
            "gateway_operator_sweeps_total 0",
            "# TYPE gateway_operator_sweep_failures counter",
            "gateway_operator_sweep_failures_total 0",
            "# TYPE gateway_operator_promotions counter",
            "gateway_operator_promotions_total 2",
            "# TYPE gateway_operator_sweep_failing gauge",
            "gateway_operator_sweep_failing 0",
            "# TYPE gateway_operator_leading gauge",
            "gateway_operator_leading 0",
            "# TYPE gateway_operator_desired_replicas gauge",
            "gateway_operator_desired_replicas 3",
        ] {
            assert!(body.lines().any(|l| l == line), "no `{line}` in\n{body}");
        }
    }

    #[tokio::test]
    async fn the_probes_answer_ok_and_any_other_path_is_not_found() {
        let (url, _) = server().await;
        assert_eq!(get(&format!("{url}/livez")).await.0, 200);
        assert_eq!(get(&format!("{url}/readyz")).await.0, 200);
        assert_eq!(get(&format!("{url}/")).await.0, 404);
        assert_eq!(get(&format!("{url}/metrics/extra")).await.0, 404);
    }

    #[tokio::test]
    async fn a_failing_sweep_makes_the_replica_not_ready_but_still_live() {
        let (url, metrics) = server().await;
        metrics.sweep_failing.set(1);
        let (status, _, body) = get(&format!("{url}/readyz")).await;
        assert_eq!(status, 503);
        assert!(body.contains("promotion sweep is failing"), "{body}");
        assert_eq!(get(&format!("{url}/livez")).await.0, 200);
        metrics.sweep_failing.set(0);
        assert_eq!(get(&format!("{url}/readyz")).await.0, 200);
    }
}
