//! The operator's one error type: every failure of a reconcile, a lease round or a scaling
//! round, so loops log it and retry the same way.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot serialize the gateway configuration: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("cannot scrape gateway pod {pod}: {error}")]
    Scrape { pod: String, error: reqwest::Error },
    #[error("gateway pod {pod} reports no `{metric}` metric")]
    MissingMetric { pod: String, metric: &'static str },
    #[error("the promotion sweep failed: {0}")]
    Sweep(#[from] store::accounts::StoreError),
    #[error(
        "Secret {namespace}/{name}, which the config is published in, does not exist: the \
         operator never creates Secrets; create it (the chart does) or point --config-secret at \
         the one that exists"
    )]
    NoConfigSecret { namespace: String, name: String },
    #[error("no valid configuration compiled yet, so no promotion thresholds")]
    NoRules,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The failure's kind as a metric label (`gateway_operator_reconcile_errors_total`): a
    /// small fixed set, so an alert can tell missing RBAC from an unreachable API server.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(status)) => match status.code {
                401 | 403 => "api_forbidden",
                404 => "api_not_found",
                409 => "api_conflict",
                422 => "api_invalid",
                429 => "api_throttled",
                _ => "api_error",
            },
            Error::Kube(_) => "api_unreachable",
            Error::Serialize(_) => "serialize",
            Error::Scrape { .. } => "scrape",
            Error::MissingMetric { .. } => "missing_metric",
            Error::Sweep(_) => "sweep",
            Error::NoConfigSecret { .. } => "no_config_secret",
            Error::NoRules => "no_rules",
        }
    }
}
