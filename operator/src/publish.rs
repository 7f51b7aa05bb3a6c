//! The config controller's reconcile: compiles every Tier, ModelRoute and ApiKey of the
//! namespace into one GatewayConfig, writes each resource's `Ready` condition, and publishes the
//! config in a Secret that every gateway pod watches. [`crate::controller`] decides when it runs.
//!
//! One reconcile covers the whole namespace because validity is a property of the set (every
//! tier declared once, auto candidates that exist), not of one object. A resource at fault is
//! compiled out (its last published version in its place, if any: see [`crate::isolation`]) and
//! the rest publishes; only problems no resource owns leave the Secret, and so the gateways,
//! on the last good config. No finalizers: deleting a resource only needs a recompile, which
//! its watch event triggers.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use crds::compile::ResourceRef;
use crds::config::{GatewayConfig, SECRET_KEY};
use crds::resources::{ApiKey, ModelRoute, ResourceStatus, Tier};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::isolation::{self, LastGood};
use crate::status::{Verdict, READY};

/// The field manager of everything the operator writes with server-side apply.
pub const MANAGER: &str = "gateway-operator";
/// Annotation on the published Secret: the content version of the config in it.
pub const VERSION_ANNOTATION: &str = "gateway.svc.dev/config-version";

pub struct Context {
    pub client: Client,
    pub namespace: String,
    /// Name of the Secret the config is published in.
    pub secret: String,
    /// The Secrets the operator reads (`--secret`), besides the config Secret: the only ones
    /// resources may refer to.
    pub readable: BTreeSet<String>,
    pub recorder: Recorder,
    /// The version last published by this process, so `Published` is announced once.
    published: Mutex<Option<String>>,
    /// What the last rejected compile said, so `NotPublished` is announced once per problem.
    rejected: Mutex<Option<String>>,
    /// The gateway Deployment, whose `kubectl describe` then also shows why it waits.
    deployment: Option<String>,
    /// The last valid config, for the promotion sweep's thresholds.
    pub latest: watch::Sender<Option<Arc<GatewayConfig>>>,
    /// The resources of the last published config, which stand in for their invalid edits.
    last_good: Mutex<LastGood>,
}

impl Context {
    pub fn new(
        client: Client,
        namespace: String,
        secret: String,
        readable: impl IntoIterator<Item = String>,
        instance: String,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_owned(),
            instance: Some(instance),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace,
            readable: readable
                .into_iter()
                .filter(|name| *name != secret)
                .collect(),
            secret,
            published: Mutex::new(None),
            rejected: Mutex::new(None),
            deployment: None,
            latest: watch::Sender::new(None),
            last_good: Mutex::new(LastGood::default()),
        }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Names the gateway Deployment, on which the events saying why nothing is published are
    /// recorded too.
    pub fn with_deployment(mut self, deployment: Option<String>) -> Self {
        self.deployment = deployment;
        self
    }

    /// The config Secret, which the operator patches but never creates (its RBAC may not):
    /// the chart creates it, owned by the release. When it is missing, a Warning event on the
    /// gateway Deployment says so.
    async fn config_secret(&self) -> Result<Secret> {
        if let Some(secret) = self.api::<Secret>().get_opt(&self.secret).await? {
            return Ok(secret);
        }
        let missing = Error::NoConfigSecret {
            namespace: self.namespace.clone(),
            name: self.secret.clone(),
        };
        if let Some(deployment) = self.deployment_ref().await {
            let event = Event {
                type_: EventType::Warning,
                reason: "NoConfigSecret".to_owned(),
                note: Some(truncate(&missing.to_string(), 1000)),
                action: "Publish".to_owned(),
                secondary: None,
            };
            self.recorder.publish(&event, &deployment).await?;
        }
        Err(missing)
    }

    /// The gateway Deployment's reference (its uid included, which `kubectl describe` matches
    /// events by); none when not named or out of reach, which only costs that event.
    async fn deployment_ref(&self) -> Option<ObjectReference> {
        let name = self.deployment.as_ref()?;
        match self.api::<Deployment>().get_opt(name).await {
            Ok(found) => found.map(|deployment| deployment.object_ref(&())),
            Err(error) => {
                tracing::debug!(%error, deployment = %name, "cannot read the gateway Deployment for its events");
                None
            }
        }
    }
}

/// What one reconcile did, for the log and the tests.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The config with this version is in the Secret.
    Published(String),
    /// Problems no single resource owns; the Secret was left alone.
    Rejected { problems: usize },
}

/// Compiles the namespace, writes the statuses that changed, and publishes a valid config.
pub async fn reconcile(ctx: &Context) -> Result<Outcome> {
    let lp = ListParams::default();
    let tiers = ctx.api::<Tier>().list(&lp).await?.items;
    let routes = ctx.api::<ModelRoute>().list(&lp).await?.items;
    let keys = ctx.api::<ApiKey>().list(&lp).await?.items;
    // Each by name: the operator's RBAC names the Secrets it may read. One its Role does not
    // let it read counts as not read at all: the resources referring to it are at fault, the
    // rest publishes.
    let mut secrets = Vec::new();
    let mut readable = ctx.readable.clone();
    for name in &ctx.readable {
        match ctx.api::<Secret>().get_opt(name).await {
            Ok(Some(secret)) => secrets.push(secret),
            Ok(None) => {}
            Err(kube::Error::Api(status)) if status.is_forbidden() => {
                tracing::warn!(secret = %name, "the operator's Role does not let it read this Secret, given by --secret");
                readable.remove(name);
            }
            Err(error) => return Err(error.into()),
        }
    }
    let mut outcome = {
        let last = ctx
            .last_good
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        isolation::compile(&tiers, &routes, &keys, &secrets, &readable, &last)
    };
    let verdict_of = |resource: &ResourceRef| Verdict::of(resource, &outcome, &ctx.secret);
    report(ctx, &tiers, &verdict_of).await?;
    report(ctx, &routes, &verdict_of).await?;
    report(ctx, &keys, &verdict_of).await?;
    match &outcome.compiled {
        Ok(config) => {
            if !outcome.faults.is_empty() {
                tracing::warn!(
                    faulty = outcome.faults.len(),
                    "publishing without the invalid resources (see their Ready condition)"
                );
            }
            publish(ctx, config).await?;
            *ctx.last_good
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) =
                std::mem::take(&mut outcome.kept);
            ctx.latest.send_replace(Some(Arc::new(config.clone())));
            Ok(Outcome::Published(config.version.clone()))
        }
        Err(errors) => {
            tracing::warn!(%errors, secret = %ctx.secret, "not publishing an invalid gateway configuration");
            not_published(ctx, &errors.to_string()).await?;
            Ok(Outcome::Rejected {
                problems: errors.errors.len(),
            })
        }
    }
}

/// The three custom resources, which share one status type.
pub trait Reported:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + DeserializeOwned
    + Debug
{
    const KIND: &'static str;
    fn reported(&self) -> Option<&ResourceStatus>;
}

impl Reported for Tier {
    const KIND: &'static str = "Tier";
    fn reported(&self) -> Option<&ResourceStatus> {
        self.status.as_ref()
    }
}

impl Reported for ModelRoute {
    const KIND: &'static str = "ModelRoute";
    fn reported(&self) -> Option<&ResourceStatus> {
        self.status.as_ref()
    }
}

impl Reported for ApiKey {
    const KIND: &'static str = "ApiKey";
    fn reported(&self) -> Option<&ResourceStatus> {
        self.status.as_ref()
    }
}

/// Writes the `Ready` condition of each object whose verdict changed, by server-side apply of
/// the status alone; a newly invalid object also gets a Warning event.
async fn report<K: Reported>(
    ctx: &Context,
    objects: &[K],
    verdict_of: &impl Fn(&ResourceRef) -> Verdict,
) -> Result<()> {
    let api = ctx.api::<K>();
    for object in objects {
        let verdict = verdict_of(&ResourceRef::new(K::KIND, object.meta()));
        let generation = object.meta().generation;
        let current = object
            .reported()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
        if verdict.matches(current, generation) {
            continue;
        }
        let status = ResourceStatus {
            conditions: vec![verdict.condition(current, generation, Timestamp::now())],
            observed_generation: generation,
        };
        let patch = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        let params = PatchParams::apply(MANAGER).force();
        api.patch_status(&object.name_any(), &params, &Patch::Apply(&patch))
            .await?;
        if verdict.reason == "Invalid" {
            let event = Event {
                type_: EventType::Warning,
                reason: "Invalid".to_owned(),
                note: Some(truncate(&verdict.message, 1000)),
                action: "Validate".to_owned(),
                secondary: None,
            };
            ctx.recorder
                .publish(&event, &object.object_ref(&()))
                .await?;
        }
    }
    Ok(())
}

/// Event notes are capped at 1 kB by the API server.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Applies the config Secret (idempotent: an unchanged config changes nothing on the server)
/// and announces a new version with an event on it.
async fn publish(ctx: &Context, config: &GatewayConfig) -> Result<()> {
    // Checked first: a server-side apply of a missing object would create it.
    ctx.config_secret().await?;
    let secret = config_secret(&ctx.secret, config)?;
    let params = PatchParams::apply(MANAGER).force();
    let applied = ctx
        .api::<Secret>()
        .patch(&ctx.secret, &params, &Patch::Apply(&secret))
        .await?;
    let is_new = {
        let mut published = ctx
            .published
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let is_new = published.as_deref() != Some(config.version.as_str());
        *published = Some(config.version.clone());
        is_new
    };
    *ctx.rejected
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
    if is_new {
        tracing::info!(version = %config.version, secret = %ctx.secret, "published the gateway configuration");
        let event = Event {
            type_: EventType::Normal,
            reason: "Published".to_owned(),
            note: Some(format!("gateway configuration version {}", config.version)),
            action: "Publish".to_owned(),
            secondary: None,
        };
        ctx.recorder
            .publish(&event, &applied.object_ref(&()))
            .await?;
    }
    Ok(())
}

/// A Warning event on the config Secret (whose readers, the gateway pods, name it while they
/// wait) and on the gateway Deployment when a compile is rejected with problems no resource
/// owns, once per distinct problem: `kubectl describe deploy/NAME` and `kubectl get events`
/// then say why nothing is published.
async fn not_published(ctx: &Context, problems: &str) -> Result<()> {
    let note = truncate(
        &format!(
            "nothing published; gateways keep the last good configuration or wait: {problems}"
        ),
        1000,
    );
    {
        let mut rejected = ctx
            .rejected
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if rejected.as_deref() == Some(note.as_str()) {
            return Ok(());
        }
        *rejected = Some(note.clone());
    }
    let secret = ctx.config_secret().await?;
    let event = Event {
        type_: EventType::Warning,
        reason: "NotPublished".to_owned(),
        note: Some(note),
        action: "Publish".to_owned(),
        secondary: None,
    };
    ctx.recorder
        .publish(&event, &secret.object_ref(&()))
        .await?;
    // `kubectl describe` shows no events of a Secret; it does of the Deployment that waits.
    if let Some(deployment) = ctx.deployment_ref().await {
        ctx.recorder.publish(&event, &deployment).await?;
    }
    Ok(())
}

/// The Secret gateways read: the config as JSON under [`SECRET_KEY`].
pub fn config_secret(name: &str, config: &GatewayConfig) -> Result<Secret> {
    let json = serde_json::to_vec(config)?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: Some(BTreeMap::from([(
                VERSION_ANNOTATION.to_owned(),
                config.version.clone(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(SECRET_KEY.to_owned(), ByteString(json))])),
        ..Secret::default()
    })
}

#[cfg(test)]
mod tests {
    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::Value;
    use tower_test::mock;

    use super::*;
    use crate::testing::{
        api_server, expect, fail, finds_config, list, missing_key_upstream, no_check, reading,
        records_event, route, simulated, writes_config, Expect, CRDS, NS,
    };

    async fn reconcile_against(expected: Vec<Expect>) -> Outcome {
        match reconciles(expected, &[], 1).await.remove(0) {
            Ok(outcome) => outcome,
            Err(error) => panic!("reconcile failed: {error}"),
        }
    }

    /// Runs `times` reconciles of an operator pointed at Secrets `readable` against
    /// `expected`: their results.
    async fn reconciles(
        expected: Vec<Expect>,
        readable: &[&str],
        times: usize,
    ) -> Vec<Result<Outcome>> {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(api_server(handle, expected));
        let ctx = Context::new(
            Client::new(service, NS),
            NS.to_owned(),
            "gateway-config".to_owned(),
            readable.iter().map(|name| (*name).to_owned()),
            "operator-0".to_owned(),
        );
        let mut outcomes = Vec::new();
        for _ in 0..times {
            outcomes.push(reconcile(&ctx).await);
        }
        drop(ctx);
        if let Err(panic) = server.await {
            std::panic::resume_unwind(panic.into_panic());
        }
        outcomes
    }

    /// The config in a server-side apply of the config Secret.
    fn published(body: &Value) -> GatewayConfig {
        let data = body["data"][SECRET_KEY].as_str().unwrap_or_default();
        let bytes: ByteString =
            serde_json::from_value(json!(data)).unwrap_or(ByteString(Vec::new()));
        serde_json::from_slice(&bytes.0).unwrap_or_default()
    }

    fn ready(body: &Value) -> &Value {
        &body["status"]["conditions"][0]
    }

    #[tokio::test]
    async fn a_valid_set_is_published_and_only_changed_statuses_are_written() {
        let outcome = reconcile_against(reading(
            vec![route(simulated())],
            vec![
                expect(
                    Method::PATCH,
                    &format!("{CRDS}/modelroutes/svc-fast/status"),
                    route(simulated()),
                    |body| {
                        assert_eq!(body["kind"], "ModelRoute");
                        assert_eq!(ready(body)["status"], "True");
                        assert_eq!(ready(body)["reason"], "Published");
                        assert_eq!(body["status"]["observedGeneration"], 2);
                    },
                ),
                finds_config(),
                writes_config(|body| {
                    let config = published(body);
                    assert!(config.models.contains_key("svc/fast"), "{config:?}");
                    assert_eq!(
                        body["metadata"]["annotations"][VERSION_ANNOTATION],
                        json!(config.version)
                    );
                }),
                records_event("e1", |body| {
                    assert_eq!(body["reason"], "Published");
                    assert_eq!(body["regarding"]["name"], "gateway-config");
                }),
            ],
        ))
        .await;
        assert!(matches!(outcome, Outcome::Published(_)), "{outcome:?}");
    }

    #[tokio::test]
    async fn an_invalid_route_gets_a_condition_and_an_event_and_the_rest_is_published() {
        let broken = missing_key_upstream();
        let mut expected = reading(vec![route(broken.clone())], vec![]);
        // Pointed at Secret `missing`, the operator looks for it by name: not there.
        expected.push(fail(
            Method::GET,
            "/api/v1/namespaces/gw/secrets/missing",
            404,
            "NotFound",
        ));
        expected.extend([
            // The tiers are already Published: no write for them.
            expect(
                Method::PATCH,
                &format!("{CRDS}/modelroutes/svc-fast/status"),
                route(broken),
                |body| {
                    assert_eq!(ready(body)["status"], "False");
                    assert_eq!(ready(body)["reason"], "Invalid");
                    let message = ready(body)["message"].as_str().unwrap_or_default();
                    assert!(message.contains("Secret missing not found"), "{message}");
                    assert!(message.ends_with("left out of the gateway configuration"));
                },
            ),
            records_event("e1", |body| {
                assert_eq!(body["type"], "Warning");
                assert_eq!(body["regarding"]["name"], "svc-fast");
            }),
            finds_config(),
            writes_config(|body| {
                let config = published(body);
                assert_eq!(config.tiers.len(), 4, "{config:?}");
                assert!(!config.models.contains_key("svc/fast"), "{config:?}");
            }),
            records_event("e2", |body| assert_eq!(body["reason"], "Published")),
        ]);
        let outcome = reconciles(expected, &["missing"], 1).await.remove(0);
        assert!(matches!(outcome, Ok(Outcome::Published(_))), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_route_naming_a_secret_the_operator_is_not_pointed_at_is_invalid_for_that_reason_and_the_secret_is_never_read(
    ) {
        let broken = missing_key_upstream();
        let expected = reading(
            vec![route(broken.clone())],
            vec![
                expect(
                    Method::PATCH,
                    &format!("{CRDS}/modelroutes/svc-fast/status"),
                    route(broken),
                    |body| {
                        assert_eq!(ready(body)["reason"], "Invalid");
                        let message = ready(body)["message"].as_str().unwrap_or_default();
                        assert!(
                            message.starts_with("Secret missing is not one the operator reads"),
                            "{message}"
                        );
                        assert!(!message.contains("not found"), "{message}");
                    },
                ),
                records_event("e1", no_check),
                finds_config(),
                writes_config(no_check),
                records_event("e2", no_check),
            ],
        );
        // Pointed at another Secret: that one is read, `missing` never is.
        let mut expected = expected;
        expected.insert(
            3,
            fail(
                Method::GET,
                "/api/v1/namespaces/gw/secrets/other",
                404,
                "NotFound",
            ),
        );
        let outcome = reconciles(expected, &["other"], 1).await.remove(0);
        assert!(matches!(outcome, Ok(Outcome::Published(_))), "{outcome:?}");
    }

    #[tokio::test]
    async fn without_its_config_secret_the_operator_creates_none_and_says_which_is_missing() {
        let mut expected = reading(
            vec![route(simulated())],
            vec![expect(
                Method::PATCH,
                &format!("{CRDS}/modelroutes/svc-fast/status"),
                route(simulated()),
                no_check,
            )],
        );
        expected.push(fail(
            Method::GET,
            "/api/v1/namespaces/gw/secrets/gateway-config",
            404,
            "NotFound",
        ));
        // No apply follows: the API server would create the Secret.
        let outcome = reconciles(expected, &[], 1).await.remove(0);
        let error = outcome.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            error.starts_with(
                "Secret gw/gateway-config, which the config is published in, does not exist"
            ),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_rejected_namespace_gets_one_not_published_event_on_the_config_secret_per_problem() {
        let lists = |expected: &mut Vec<Expect>| {
            for (path, answer) in [
                (format!("{CRDS}/tiers"), list(vec![])),
                (
                    format!("{CRDS}/modelroutes"),
                    list(vec![route(simulated())]),
                ),
                (format!("{CRDS}/apikeys"), list(vec![])),
            ] {
                expected.push(expect(Method::GET, &path, answer, no_check));
            }
            // The route is valid but blocked: no Tier at all.
            expected.push(expect(
                Method::PATCH,
                &format!("{CRDS}/modelroutes/svc-fast/status"),
                route(simulated()),
                |body| assert_eq!(ready(body)["reason"], "Blocked"),
            ));
        };
        let mut expected = Vec::new();
        lists(&mut expected);
        expected.push(finds_config());
        expected.push(records_event("e1", |body| {
            assert_eq!(body["type"], "Warning");
            assert_eq!(body["reason"], "NotPublished");
            assert_eq!(body["regarding"]["kind"], "Secret");
            assert_eq!(body["regarding"]["name"], "gateway-config");
            let note = body["note"].as_str().unwrap_or_default();
            assert!(note.contains("no Tier declares tier free"), "{note}");
        }));
        // The same problems again: no second event.
        lists(&mut expected);
        let outcomes = reconciles(expected, &[], 2).await;
        for outcome in outcomes {
            assert!(
                matches!(outcome, Ok(Outcome::Rejected { .. })),
                "{outcome:?}"
            );
        }
    }
}
