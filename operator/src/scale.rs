//! Sets the gateway Deployment's replicas from the load the gateway pods report on their admin
//! `/metrics`: streams in flight (`gateway_streams_in_flight`) and the request rate (from the
//! `gateway_requests_total` counters between two scrapes).
//!
//! desired = clamp(ceil(max(streams / streams_per_pod, rps / rps_per_pod)), min, max)
//!
//! Scaling up happens at once. Scaling down takes the highest recommendation of the last
//! `scale_down_window`, so a short lull does not drop pods that the next burst needs (the
//! same rule as the HorizontalPodAutoscaler's stabilisation window).
//!
//! The replicas it sets are also written on the config Secret (annotation
//! [`PODS_ANNOTATION`]): gateways failing open during a Redis outage divide each key's limits
//! by that count, so the pods together still grant about the key's limits.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crds::config::PODS_ANNOTATION;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

const STREAMS: &str = "gateway_streams_in_flight";
/// The annotation by which a ReplicaSet scaling down picks the pods to remove, lowest first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// A pod's deletion cost: its open streams (what removing it would cut), within `i32`.
pub fn deletion_cost(streams: f64) -> i32 {
    // `as` saturates: NaN is 0, a count past i32 the largest cost.
    streams.round().max(0.0) as i32
}
const REQUESTS: &str = "gateway_requests_total";

#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub min: u32,
    pub max: u32,
    pub streams_per_pod: f64,
    pub rps_per_pod: f64,
    pub scale_down_window: Duration,
}

/// Load summed over every gateway pod.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    pub streams: f64,
    pub rps: f64,
}

impl Policy {
    /// The replicas this load needs, before stabilisation.
    pub fn recommend(&self, load: Load) -> u32 {
        let by_streams = load.streams / self.streams_per_pod.max(f64::MIN_POSITIVE);
        let by_rate = load.rps / self.rps_per_pod.max(f64::MIN_POSITIVE);
        let needed = by_streams.max(by_rate).ceil();
        let floor = self.min.max(1);
        let ceiling = self.max.max(floor);
        if needed.is_nan() || needed <= f64::from(floor) {
            floor
        } else if needed >= f64::from(ceiling) {
            ceiling
        } else {
            // In range (floor, ceiling): the cast cannot truncate.
            needed as u32
        }
    }
}

/// Recommendations of the last window, for the scale-down rule.
#[derive(Default)]
pub struct Stabilizer {
    history: VecDeque<(Instant, u32)>,
}

impl Stabilizer {
    /// The replicas to set now: up at once, down only as far as the window's highest
    /// recommendation allows.
    pub fn desired(&mut self, now: Instant, recommended: u32, window: Duration) -> u32 {
        self.history.push_back((now, recommended));
        while let Some(&(at, _)) = self.history.front() {
            if now.duration_since(at) > window {
                self.history.pop_front();
            } else {
                break;
            }
        }
        self.history
            .iter()
            .map(|&(_, r)| r)
            .max()
            .unwrap_or(recommended)
    }
}

/// The two series the scaler reads from one pod's Prometheus text.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PodReport {
    pub streams: f64,
    pub requests: f64,
}

pub fn parse_report(pod: &str, text: &str) -> Result<PodReport> {
    let sum = |metric: &'static str| -> Option<f64> {
        let values: Vec<f64> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let name = series.split('{').next()?;
                (name == metric).then(|| value.parse::<f64>().ok())?
            })
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    };
    let missing = |metric| Error::MissingMetric {
        pod: pod.to_owned(),
        metric,
    };
    Ok(PodReport {
        streams: sum(STREAMS).ok_or_else(|| missing(STREAMS))?,
        // No request answered yet means no counter series yet.
        requests: sum(REQUESTS).unwrap_or(0.0),
    })
}

/// Turns successive reports into load: the request rate comes from each pod's counter
/// increase since its previous scrape (a restarted pod's counter starts again at zero).
#[derive(Default)]
pub struct Sampler {
    previous: BTreeMap<String, (Instant, f64)>,
}

impl Sampler {
    pub fn load(&mut self, now: Instant, reports: &[(String, PodReport)]) -> Load {
        let mut load = Load::default();
        let mut seen = BTreeMap::new();
        for (pod, report) in reports {
            load.streams += report.streams;
            if let Some(&(at, before)) = self.previous.get(pod) {
                let secs = now.duration_since(at).as_secs_f64();
                if secs > 0.0 && report.requests >= before {
                    load.rps += (report.requests - before) / secs;
                }
            }
            seen.insert(pod.clone(), (now, report.requests));
        }
        self.previous = seen;
        load
    }
}

pub struct Scaler {
    pub deployments: Api<Deployment>,
    pub pods: Api<Pod>,
    pub secrets: Api<Secret>,
    /// The config Secret, annotated with the replicas.
    pub config_secret: String,
    pub deployment: String,
    pub pod_selector: String,
    /// The gateway pods' port serving `/metrics` (the admin port, or `--metrics-listen`).
    pub metrics_port: u16,
    pub policy: Policy,
    pub every: Duration,
    pub http: reqwest::Client,
}

impl Scaler {
    /// Scales every `every` while this process leads.
    pub async fn run(self, mut leading: watch::Receiver<bool>, metrics: Arc<Metrics>) {
        let mut sampler = Sampler::default();
        let mut stabilizer = Stabilizer::default();
        loop {
            if *leading.borrow_and_update() {
                match self.round(&mut sampler, &mut stabilizer).await {
                    Ok(replicas) => {
                        metrics.desired_replicas.set(i64::from(replicas));
                    }
                    Err(error) => tracing::warn!(%error, "scaling round failed"),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.every) => {}
                changed = leading.changed() => if changed.is_err() { return },
            }
        }
    }

    async fn round(&self, sampler: &mut Sampler, stabilizer: &mut Stabilizer) -> Result<u32> {
        let pods = self
            .pods
            .list(&ListParams::default().labels(&self.pod_selector))
            .await?;
        let mut reports = Vec::new();
        for pod in &pods.items {
            let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) else {
                continue;
            };
            match self.scrape(&pod.name_any(), ip).await {
                Ok(report) => reports.push((pod.name_any(), report)),
                // A pod that cannot answer is starting or dying: it carries no load to count.
                Err(error) => tracing::debug!(%error, "skipping a gateway pod"),
            }
        }
        let now = Instant::now();
        let load = sampler.load(now, &reports);
        let replicas = stabilizer.desired(
            now,
            self.policy.recommend(load),
            self.policy.scale_down_window,
        );
        let current = self
            .deployments
            .get_scale(&self.deployment)
            .await?
            .spec
            .and_then(|s| s.replicas)
            .unwrap_or(0);
        if u32::try_from(current).is_ok_and(|current| replicas < current) {
            self.rank_for_removal(&pods.items, &reports).await;
        }
        if u32::try_from(current).ok() != Some(replicas) {
            tracing::info!(deployment = %self.deployment, from = current, to = replicas, streams = load.streams, rps = load.rps, "scaling the gateway");
            let patch = json!({ "spec": { "replicas": replicas } });
            self.deployments
                .patch_scale(
                    &self.deployment,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        self.announce(replicas).await?;
        Ok(replicas)
    }

    /// Before a scale-down, marks each scraped pod with its open streams as its
    /// `controller.kubernetes.io/pod-deletion-cost`, so that the ReplicaSet removes idle pods
    /// first and streams are not cut (Kubernetes 1.22 and later honour it). Only then: the
    /// annotation is a write to the API server per pod, too many to keep current every round.
    /// A pod that cannot be marked is only logged; the scale-down goes on.
    async fn rank_for_removal(&self, pods: &[Pod], reports: &[(String, PodReport)]) {
        for (name, report) in reports {
            let cost = deletion_cost(report.streams).to_string();
            let marked = pods
                .iter()
                .find(|p| p.name_any() == *name)
                .and_then(|p| p.annotations().get(DELETION_COST));
            if marked == Some(&cost) {
                continue;
            }
            let patch = json!({ "metadata": { "annotations": { DELETION_COST: cost } } });
            if let Err(error) = self
                .pods
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(pod = %name, %error, "could not mark the pod's deletion cost");
            }
        }
    }

    /// Writes the pod count on the config Secret when it changed. A merge patch, not an
    /// apply, which would create a missing Secret: the operator never creates one.
    async fn announce(&self, replicas: u32) -> Result<()> {
        let Some(secret) = self.secrets.get_opt(&self.config_secret).await? else {
            return Ok(());
        };
        let value = replicas.to_string();
        if secret.annotations().get(PODS_ANNOTATION) == Some(&value) {
            return Ok(());
        }
        let patch = json!({ "metadata": { "annotations": { PODS_ANNOTATION: value } } });
        self.secrets
            .patch(
                &self.config_secret,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(())
    }

    async fn scrape(&self, pod: &str, ip: &str) -> Result<PodReport> {
        let failed = |error| Error::Scrape {
            pod: pod.to_owned(),
            error,
        };
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_owned()
        };
        let text = self
            .http
            .get(format!("http://{host}:{}/metrics", self.metrics_port))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?
            .text()
            .await
            .map_err(failed)?;
        parse_report(pod, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            min: 2,
            max: 10,
            streams_per_pod: 100.0,
            rps_per_pod: 50.0,
            scale_down_window: Duration::from_secs(300),
        }
    }

    fn load(streams: f64, rps: f64) -> Load {
        Load { streams, rps }
    }

    #[test]
    fn replicas_cover_the_larger_of_stream_and_request_load() {
        assert_eq!(
            policy().recommend(load(450.0, 10.0)),
            5,
            "450 streams / 100"
        );
        assert_eq!(
            policy().recommend(load(10.0, 301.0)),
            7,
            "301 rps / 50, rounded up"
        );
    }

    #[test]
    fn replicas_stay_within_min_and_max() {
        assert_eq!(policy().recommend(load(0.0, 0.0)), 2);
        assert_eq!(policy().recommend(load(5_000.0, 0.0)), 10);
        let no_floor = Policy { min: 0, ..policy() };
        assert_eq!(no_floor.recommend(load(0.0, 0.0)), 1, "never zero gateways");
    }

    #[test]
    fn scaling_up_is_immediate_and_down_waits_for_the_window() {
        let window = Duration::from_secs(300);
        let start = Instant::now();
        let mut s = Stabilizer::default();
        assert_eq!(s.desired(start, 3, window), 3);
        assert_eq!(s.desired(start + Duration::from_secs(30), 8, window), 8);
        assert_eq!(s.desired(start + Duration::from_secs(60), 2, window), 8);
        assert_eq!(s.desired(start + Duration::from_secs(320), 2, window), 8);
        assert_eq!(
            s.desired(start + Duration::from_secs(331), 2, window),
            2,
            "the burst of second 30 has left the window"
        );
    }

    #[test]
    fn request_rate_comes_from_counter_increases_between_scrapes() {
        let start = Instant::now();
        let mut sampler = Sampler::default();
        let report = |streams, requests| PodReport { streams, requests };
        let first = sampler.load(
            start,
            &[
                ("a".into(), report(3.0, 100.0)),
                ("b".into(), report(1.0, 50.0)),
            ],
        );
        assert_eq!(first, load(4.0, 0.0), "one scrape gives no rate yet");
        let second = sampler.load(
            start + Duration::from_secs(10),
            &[
                ("a".into(), report(2.0, 300.0)),
                ("b".into(), report(0.0, 10.0)),
            ],
        );
        assert_eq!(
            second,
            load(2.0, 20.0),
            "b restarted: its reset counter adds no rate"
        );
    }

    #[test]
    fn a_report_sums_the_series_of_each_metric() {
        let text = "# HELP gateway_streams_in_flight x\n\
                    # TYPE gateway_streams_in_flight gauge\n\
                    gateway_streams_in_flight 4\n\
                    gateway_requests_total{endpoint=\"messages\",status=\"200\"} 10\n\
                    gateway_requests_total{endpoint=\"chat\",status=\"429\"} 5\n";
        assert_eq!(
            parse_report("a", text).ok(),
            Some(PodReport {
                streams: 4.0,
                requests: 15.0
            })
        );
    }

    #[test]
    fn a_pods_deletion_cost_is_its_open_streams_so_idle_pods_go_first() {
        assert_eq!(deletion_cost(0.0), 0);
        assert_eq!(deletion_cost(7.0), 7);
        assert!(deletion_cost(3.0) > deletion_cost(1.0));
        assert_eq!(deletion_cost(-1.0), 0);
        assert_eq!(deletion_cost(f64::NAN), 0);
        assert_eq!(deletion_cost(1e12), i32::MAX);
    }

    #[test]
    fn a_pod_without_the_stream_gauge_is_an_error() {
        assert!(matches!(
            parse_report("a", "gateway_requests_total 3\n"),
            Err(Error::MissingMetric {
                metric: STREAMS,
                ..
            })
        ));
    }
}
