//! The config the operator publishes in a Secret, followed through the Kubernetes API so every
//! pod applies a new version within seconds, without a restart.
//!
//! A version that cannot be used (malformed, incomplete) and a Secret that is gone or out of
//! reach all leave the running config in place: the operator only publishes valid configs, so
//! anything else is a fault elsewhere, and serving the last good config beats serving none.

use std::fmt;
use std::str::FromStr;

use crds::config::{GatewayConfig, PODS_ANNOTATION, SECRET_KEY, TIER_IDS};
use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PublishedError {
    #[error("--config-secret must be NAMESPACE/NAME, got `{0}`")]
    BadReference(String),
    #[error("no Kubernetes API (set KUBECONFIG or run in a pod): {0}")]
    NoApi(kube::Error),
    #[error("Secret {secret} has no `{SECRET_KEY}` key")]
    MissingKey { secret: SecretRef },
    #[error("Secret {secret} holds no valid config: {error}")]
    Malformed {
        secret: SecretRef,
        error: serde_json::Error,
    },
    #[error("the config in Secret {secret} has no `{tier}` tier")]
    MissingTier {
        secret: SecretRef,
        tier: &'static str,
    },
}

/// `NAMESPACE/NAME` of the Secret the operator publishes the config in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl FromStr for SecretRef {
    type Err = PublishedError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(PublishedError::BadReference(text.to_owned())),
        }
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How often a pod waiting for its first config says so at WARN.
const WAITING_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// The stream of versions of the config Secret.
pub struct Published {
    secret: SecretRef,
    updates: BoxStream<'static, Result<Option<Secret>, watcher::Error>>,
    /// The gateway pod count last announced on the Secret, if any.
    pods: Option<u32>,
}

impl Published {
    pub async fn connect(secret: SecretRef) -> Result<Self, PublishedError> {
        let client = Client::try_default().await.map_err(PublishedError::NoApi)?;
        let api: Api<Secret> = Api::namespaced(client, &secret.namespace);
        let fields = format!("metadata.name={}", secret.name);
        let updates = watcher(api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .filter_map(|event| async move {
                match event {
                    Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                        Some(Ok(Some(s)))
                    }
                    Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                    Err(error) => Some(Err(error)),
                }
            })
            .boxed();
        Ok(Self {
            secret,
            updates,
            pods: None,
        })
    }

    /// Waits for the first usable config: a pod must not serve before it has one. Says so
    /// at WARN every [`WAITING_WARN_EVERY`], naming the Secret, so that a pod that never turns
    /// ready explains itself in its log.
    pub async fn first(&mut self) -> Option<GatewayConfig> {
        tracing::info!(secret = %self.secret, "waiting for the published config");
        let started = tokio::time::Instant::now();
        let mut reminder =
            tokio::time::interval_at(started + WAITING_WARN_EVERY, WAITING_WARN_EVERY);
        loop {
            tokio::select! {
                // Cancel-safe: the update is only awaited, never half taken.
                update = self.next_usable(None) => {
                    if let Some(config) = update? {
                        return Some(config);
                    }
                }
                _ = reminder.tick() => tracing::warn!(
                    secret = %self.secret,
                    waited_secs = started.elapsed().as_secs(),
                    "still waiting for the operator to publish a gateway configuration in Secret \
                     {}: not ready until then; see the operator's log, the events of that Secret \
                     and the Ready condition of the Tiers, ModelRoutes and ApiKeys",
                    self.secret
                ),
            }
        }
    }

    /// The next config that differs from version `current`; `Ok(None)` after an update that
    /// was not usable (logged), `None` when the watch ended.
    async fn next_usable(&mut self, current: Option<&str>) -> Option<Option<GatewayConfig>> {
        let update = self.updates.next().await?;
        let kept = current.unwrap_or("none");
        if let Ok(Some(secret)) = &update {
            self.pods = pods(secret).or(self.pods);
        }
        Some(match update {
            Ok(Some(secret)) => match parse(&self.secret, &secret) {
                Ok(config) if Some(config.version.as_str()) == current => None,
                Ok(config) => Some(config),
                // The chart creates the Secret empty; the operator fills it with the first
                // valid config. Nothing is wrong with it until then.
                Err(PublishedError::MissingKey { .. }) if current.is_none() => {
                    tracing::debug!(secret = %self.secret, "config Secret holds no config yet");
                    None
                }
                Err(error) => {
                    tracing::error!(%error, kept_version = %kept, "published config rejected; keeping the last good one");
                    None
                }
            },
            Ok(None) => {
                tracing::warn!(secret = %self.secret, kept_version = %kept, "config Secret is absent; keeping the last good config");
                None
            }
            Err(error) => {
                tracing::warn!(%error, secret = %self.secret, kept_version = %kept, "cannot watch the config Secret; keeping the last good config");
                None
            }
        })
    }

    /// The gateway pod count the operator last announced on the Secret.
    pub fn pods(&self) -> Option<u32> {
        self.pods
    }

    /// Hands every new usable config to `apply`, and every new pod count to `pods`, for as
    /// long as the process runs.
    pub async fn follow(
        mut self,
        mut version: String,
        apply: impl Fn(GatewayConfig),
        pods: impl Fn(u32),
    ) {
        let mut announced = self.pods;
        while let Some(update) = self.next_usable(Some(&version)).await {
            if self.pods != announced {
                announced = self.pods;
                if let Some(count) = announced {
                    pods(count);
                }
            }
            if let Some(config) = update {
                tracing::info!(from = %version, to = %config.version, "applying the published config");
                version = config.version.clone();
                apply(config);
            }
        }
    }
}

/// The pod count annotation; a missing or malformed one is no announcement.
fn pods(secret: &Secret) -> Option<u32> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(PODS_ANNOTATION)?
        .parse()
        .ok()
        .filter(|&n| n > 0)
}

fn parse(reference: &SecretRef, secret: &Secret) -> Result<GatewayConfig, PublishedError> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY))
        .ok_or_else(|| PublishedError::MissingKey {
            secret: reference.clone(),
        })?;
    let config: GatewayConfig =
        serde_json::from_slice(&bytes.0).map_err(|error| PublishedError::Malformed {
            secret: reference.clone(),
            error,
        })?;
    // Keys fall back to these tiers, so a config without one cannot serve every key.
    if let Some(tier) = TIER_IDS
        .into_iter()
        .find(|t| !config.tiers.contains_key(*t))
    {
        return Err(PublishedError::MissingTier {
            secret: reference.clone(),
            tier,
        });
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;

    fn reference() -> SecretRef {
        SecretRef {
            namespace: "gw".to_owned(),
            name: "gateway-config".to_owned(),
        }
    }

    fn secret(data: &[u8]) -> Secret {
        Secret {
            data: Some(BTreeMap::from([(
                SECRET_KEY.to_owned(),
                ByteString(data.to_vec()),
            )])),
            ..Secret::default()
        }
    }

    #[test]
    fn a_secret_reference_is_namespace_slash_name() {
        assert_eq!(
            "gw/gateway-config".parse::<SecretRef>().ok(),
            Some(reference())
        );
        for bad in ["gateway-config", "/x", "gw/", "a/b/c"] {
            assert!(bad.parse::<SecretRef>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn only_a_positive_pod_count_annotation_is_an_announcement() {
        let annotated = |value: &str| Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    PODS_ANNOTATION.to_owned(),
                    value.to_owned(),
                )])),
                ..Default::default()
            },
            ..Secret::default()
        };
        assert_eq!(pods(&annotated("3")), Some(3));
        for bad in ["0", "-2", "three", ""] {
            assert_eq!(pods(&annotated(bad)), None, "{bad}");
        }
        assert_eq!(pods(&Secret::default()), None);
    }

    #[test]
    fn a_config_missing_a_tier_is_not_applied() {
        let config = GatewayConfig::default();
        let json = serde_json::to_vec(&config).unwrap_or_default();
        assert!(matches!(
            parse(&reference(), &secret(&json)),
            Err(PublishedError::MissingTier { tier: "free", .. })
        ));
    }

    #[test]
    fn a_malformed_or_missing_config_is_not_applied() {
        assert!(matches!(
            parse(&reference(), &secret(b"{\"version\": 1}")),
            Err(PublishedError::Malformed { .. })
        ));
        assert!(matches!(
            parse(&reference(), &Secret::default()),
            Err(PublishedError::MissingKey { .. })
        ));
    }
}
