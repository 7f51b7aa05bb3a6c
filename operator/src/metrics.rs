//! The operator's Prometheus metrics, served as text on `--metrics-listen`, with the probes:
//! `/livez` and `/readyz` answer while the runtime serves requests (the operator takes no
//! traffic, so there is nothing else for readiness to gate).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::Router;

#[derive(Default)]
pub struct Metrics {
    pub sweeps: AtomicU64,
    pub sweep_failures: AtomicU64,
    pub promotions: AtomicU64,
    pub leading: AtomicU64,
    pub desired_replicas: AtomicU64,
}

impl Metrics {
    pub fn render(&self) -> String {
        let line = |name: &str, kind: &str, help: &str, value: &AtomicU64| {
            format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}\n",
                value.load(Ordering::Relaxed)
            )
        };
        [
            line(
                "gateway_operator_sweeps_total",
                "counter",
                "Promotion sweeps run by this process.",
                &self.sweeps,
            ),
            line(
                "gateway_operator_sweep_failures_total",
                "counter",
                "Promotion sweeps that failed.",
                &self.sweep_failures,
            ),
            line(
                "gateway_operator_promotions_total",
                "counter",
                "Keys whose tier a sweep changed.",
                &self.promotions,
            ),
            line(
                "gateway_operator_leading",
                "gauge",
                "1 while this process holds the leader Lease.",
                &self.leading,
            ),
            line(
                "gateway_operator_desired_replicas",
                "gauge",
                "Gateway replicas last set by the scaler.",
                &self.desired_replicas,
            ),
        ]
        .concat()
    }
}

pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move { m.render() }),
        )
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}
