//! Compiles the custom resources into the one [`GatewayConfig`] gateways run on.
//!
//! This is the only place resources are validated, so the operator (which sets status
//! conditions from the errors) and standalone mode (which reads files no API server has seen)
//! accept and reject exactly the same things. Every problem is reported, not only the first,
//! because a rejected configuration is fixed in one edit cycle only if the whole list is shown.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::Secret as K8sSecret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::{
    Affinity, AwsCredentials, BatchCaps, Capabilities, GatewayConfig, KeyGrant, KeySeed, Limits,
    ModelConfig, Pricing, ProviderKind, Route, Secret, TierConfig, Timeouts, Upstream,
};
use crate::resources::{
    ApiKey, ModelRoute, Provider, SecretKeyRef, Tier, TierId, TimeoutsSpec, UpstreamSpec,
};

/// Names a resource in error messages the way `kubectl` users know it: `ModelRoute svc-opus`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceRef {
    pub kind: &'static str,
    pub namespace: Option<String>,
    pub name: String,
}

impl ResourceRef {
    pub fn new(kind: &'static str, metadata: &ObjectMeta) -> Self {
        Self {
            kind,
            namespace: metadata.namespace.clone(),
            name: metadata
                .name
                .clone()
                .unwrap_or_else(|| "<unnamed>".to_owned()),
        }
    }
}

impl fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// One problem, attached to the resource that has to change so the operator can put it in
/// that resource's status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct CompileError {
    /// `None` when no single resource is at fault (a tier nobody declares).
    pub resource: Option<ResourceRef>,
    pub message: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.resource {
            Some(resource) => write!(f, "{resource}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Every problem found, in a stable order (resource kinds in dependency order, then input
/// order).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct CompileErrors {
    pub errors: Vec<CompileError>,
}

impl fmt::Display for CompileErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid gateway configuration:")?;
        for error in &self.errors {
            write!(f, "\n  - {error}")?;
        }
        Ok(())
    }
}

/// Compiles the resources of one namespace (or one manifest folder) into a [`GatewayConfig`].
///
/// Secret references resolve against `secrets` in the namespace of the referring resource
/// (`None` matching `None`, as in a manifest folder without namespaces).
pub fn compile(
    tiers: &[Tier],
    routes: &[ModelRoute],
    keys: &[ApiKey],
    secrets: &[K8sSecret],
) -> Result<GatewayConfig, CompileErrors> {
    let mut problems = Problems::default();
    let secrets = Secrets(secrets);
    let tiers = compile_tiers(tiers, &mut problems);
    let models = compile_models(routes, &secrets, &mut problems);
    let keys = compile_keys(keys, &secrets, &mut problems);
    if !problems.0.is_empty() {
        return Err(CompileErrors { errors: problems.0 });
    }
    let version = match content_version(&tiers, &models, &keys) {
        Ok(version) => version,
        Err(error) => {
            problems.general(format!("cannot hash the configuration: {error}"));
            return Err(CompileErrors { errors: problems.0 });
        }
    };
    Ok(GatewayConfig {
        version,
        tiers,
        models,
        keys,
    })
}

#[derive(Default)]
struct Problems(Vec<CompileError>);

impl Problems {
    fn add(&mut self, resource: &ResourceRef, message: impl Into<String>) {
        self.0.push(CompileError {
            resource: Some(resource.clone()),
            message: message.into(),
        });
    }

    fn general(&mut self, message: impl Into<String>) {
        self.0.push(CompileError {
            resource: None,
            message: message.into(),
        });
    }

    /// Records a problem unless `value` is at least 1; returns `value` so callers can keep
    /// building the config and find further problems in the same pass.
    fn at_least_one<T: PartialOrd + From<u8> + Copy>(
        &mut self,
        resource: &ResourceRef,
        field: &str,
        value: T,
    ) -> T {
        if value < T::from(1) {
            self.add(resource, format!("{field} must be at least 1"));
        }
        value
    }
}

/// The Secrets a compilation may read.
struct Secrets<'a>(&'a [K8sSecret]);

impl Secrets<'_> {
    /// `stringData` wins over `data` for the same key, as it does when the API server merges
    /// them on write.
    fn resolve(&self, namespace: Option<&str>, r: &SecretKeyRef) -> Result<Secret, String> {
        let secret = self
            .0
            .iter()
            .find(|s| {
                s.metadata.name.as_deref() == Some(r.name.as_str())
                    && s.metadata.namespace.as_deref() == namespace
            })
            .ok_or_else(|| format!("Secret {} not found", r.name))?;
        let value = match secret.string_data.as_ref().and_then(|d| d.get(&r.key)) {
            Some(value) => value.clone(),
            None => {
                let bytes = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(&r.key))
                    .ok_or_else(|| format!("Secret {} has no key {}", r.name, r.key))?;
                String::from_utf8(bytes.0.clone())
                    .map_err(|_| format!("key {} of Secret {} is not UTF-8", r.key, r.name))?
            }
        };
        if value.is_empty() {
            return Err(format!("key {} of Secret {} is empty", r.key, r.name));
        }
        Ok(Secret(value))
    }
}

fn compile_tiers(tiers: &[Tier], problems: &mut Problems) -> BTreeMap<String, TierConfig> {
    let mut by_id: BTreeMap<TierId, (ResourceRef, TierConfig)> = BTreeMap::new();
    for tier in tiers {
        let resource = ResourceRef::new("Tier", &tier.metadata);
        let spec = &tier.spec;
        let limits = Limits {
            requests_per_minute: problems.at_least_one(
                &resource,
                "requestsPerMinute",
                spec.requests_per_minute,
            ),
            input_tokens_per_minute: problems.at_least_one(
                &resource,
                "inputTokensPerMinute",
                spec.input_tokens_per_minute,
            ),
            concurrent_streams: problems.at_least_one(
                &resource,
                "concurrentStreams",
                spec.concurrent_streams,
            ),
        };
        let promotion = spec.promotion_at_lifetime_top_up_cents;
        match (spec.tier, promotion) {
            (TierId::Enterprise, Some(_)) => problems.add(
                &resource,
                "promotionAtLifetimeTopUpCents must be absent on the enterprise tier: \
                 enterprise is only granted by hand, with an ApiKey",
            ),
            (TierId::Enterprise, None) => {}
            (id, None) => problems.add(
                &resource,
                format!("promotionAtLifetimeTopUpCents is required on the {id} tier"),
            ),
            (TierId::Free, Some(cents)) if cents != 0 => problems.add(
                &resource,
                format!(
                    "promotionAtLifetimeTopUpCents is {cents} but must be 0 on the free tier: \
                     every key starts there"
                ),
            ),
            (_, Some(_)) => {}
        }
        if let Some((first, _)) = by_id.get(&spec.tier) {
            problems.add(
                &resource,
                format!("tier {} is already declared by {first}", spec.tier),
            );
            continue;
        }
        let config = TierConfig {
            limits,
            promotion_at_lifetime_cents: promotion,
        };
        by_id.insert(spec.tier, (resource, config));
    }

    for id in TierId::ALL {
        if !by_id.contains_key(&id) {
            problems.general(format!(
                "no Tier declares tier {id}; each of free, pay_as_you_go, high_volume and \
                 enterprise needs exactly one"
            ));
        }
    }
    // Promotion picks the highest tier whose threshold a key has reached, which only works if
    // the thresholds rise with the tiers.
    for pair in TierId::ALL[..3].windows(2) {
        let (Some((_, lower)), Some((higher_ref, higher))) =
            (by_id.get(&pair[0]), by_id.get(&pair[1]))
        else {
            continue;
        };
        if let (Some(low), Some(high)) = (
            lower.promotion_at_lifetime_cents,
            higher.promotion_at_lifetime_cents,
        ) {
            if high <= low {
                problems.add(
                    higher_ref,
                    format!(
                        "promotionAtLifetimeTopUpCents is {high} but must be above the {} \
                         tier's {low}",
                        pair[0]
                    ),
                );
            }
        }
    }

    by_id
        .into_iter()
        .map(|(id, (_, config))| (id.as_str().to_owned(), config))
        .collect()
}

fn compile_models(
    routes: &[ModelRoute],
    secrets: &Secrets<'_>,
    problems: &mut Problems,
) -> BTreeMap<String, ModelConfig> {
    let mut by_id: BTreeMap<&str, (ResourceRef, &ModelRoute)> = BTreeMap::new();
    for route in routes {
        let resource = ResourceRef::new("ModelRoute", &route.metadata);
        let id = route.spec.model.as_str();
        if !is_model_id(id) {
            problems.add(
                &resource,
                format!(
                    "model {id:?} must be svc/ followed by lowercase letters, digits, '.', '_' \
                     or '-'"
                ),
            );
        }
        if let Some((first, _)) = by_id.get(id) {
            problems.add(
                &resource,
                format!("model {id} is already declared by {first}"),
            );
            continue;
        }
        by_id.insert(id, (resource, route));
    }

    let mut models = BTreeMap::new();
    for (id, (resource, route)) in &by_id {
        let spec = &route.spec;
        if spec.display_name.trim().is_empty() {
            problems.add(resource, "displayName must not be empty");
        }
        match (spec.upstreams.is_empty(), spec.auto.is_some()) {
            (false, false) => {
                let model = compile_upstream_route(resource, route, secrets, problems);
                models.insert((*id).to_owned(), model);
            }
            (true, true) => {}
            (false, true) => problems.add(
                resource,
                "sets both upstreams and auto; exactly one of them is required",
            ),
            (true, false) => problems.add(
                resource,
                "sets neither upstreams nor auto; exactly one of them is required",
            ),
        }
    }
    // Auto routes are compiled from the upstream routes compiled above.
    let mut auto_models = Vec::new();
    for (id, (resource, route)) in &by_id {
        if route.spec.upstreams.is_empty() && route.spec.auto.is_some() {
            let model = compile_auto_route(resource, route, &by_id, &models, problems);
            auto_models.push(((*id).to_owned(), model));
        }
    }
    models.extend(auto_models);
    models
}

/// `svc/` and a name that is safe in a URL path segment (`GET /v1/models/{id}`).
fn is_model_id(id: &str) -> bool {
    let Some(name) = id.strip_prefix("svc/") else {
        return false;
    };
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

fn compile_upstream_route(
    resource: &ResourceRef,
    route: &ModelRoute,
    secrets: &Secrets<'_>,
    problems: &mut Problems,
) -> ModelConfig {
    let spec = &route.spec;
    let context_window = spec.context_window.unwrap_or_else(|| {
        problems.add(resource, "contextWindow is required with upstreams");
        0
    });
    let embeddings = spec.capabilities.embeddings;
    if embeddings {
        check_embeddings_route(resource, route, problems);
    }
    // An embeddings route generates no tokens: it has no maxOutputTokens (0 in the config).
    let max_output_tokens = spec.max_output_tokens.unwrap_or_else(|| {
        if !embeddings {
            problems.add(resource, "maxOutputTokens is required with upstreams");
        }
        0
    });
    if spec.max_output_tokens.is_some() {
        problems.at_least_one(resource, "maxOutputTokens", max_output_tokens);
    }
    if spec.context_window.is_some() && context_window < max_output_tokens {
        problems.add(
            resource,
            format!(
                "contextWindow ({context_window}) must be at least maxOutputTokens \
                 ({max_output_tokens})"
            ),
        );
    }

    let pricing = match &spec.pricing {
        None => {
            problems.add(resource, "pricing is required with upstreams");
            Pricing::default()
        }
        Some(p) => {
            let mut price = |field: &str, value: &str| {
                parse_usd_micros(value).unwrap_or_else(|reason| {
                    problems.add(resource, format!("pricing.{field} {value:?} {reason}"));
                    0
                })
            };
            Pricing {
                input_micros_per_mtok: price("inputUsdPerMTok", &p.input_usd_per_m_tok),
                output_micros_per_mtok: price("outputUsdPerMTok", &p.output_usd_per_m_tok),
                cache_write_micros_per_mtok: price(
                    "cacheWriteUsdPerMTok",
                    &p.cache_write_usd_per_m_tok,
                ),
                cache_read_micros_per_mtok: price(
                    "cacheReadUsdPerMTok",
                    &p.cache_read_usd_per_m_tok,
                ),
                cache_write_1h_micros_per_mtok: p
                    .cache_write1h_usd_per_m_tok
                    .as_deref()
                    .map(|v| price("cacheWrite1hUsdPerMTok", v)),
            }
        }
    };

    let namespace = route.metadata.namespace.as_deref();
    let mut names = BTreeSet::new();
    let upstreams = spec
        .upstreams
        .iter()
        .enumerate()
        .map(|(i, upstream)| {
            let field = format!("upstreams[{i}] ({})", upstream.name);
            if upstream.name.trim().is_empty() {
                problems.add(resource, format!("{field}: name must not be empty"));
            } else if !names.insert(upstream.name.as_str()) {
                problems.add(
                    resource,
                    format!("{field}: name is used twice in this route"),
                );
            }
            compile_upstream(resource, &field, upstream, namespace, secrets, problems)
        })
        .collect();

    ModelConfig {
        display_name: spec.display_name.clone(),
        context_window,
        max_output_tokens,
        capabilities: Capabilities {
            thinking: spec.capabilities.thinking,
            vision: spec.capabilities.vision,
            // An embeddings route calls no tools, whatever the default says.
            tools: spec.capabilities.tools && !embeddings,
            embeddings,
        },
        pricing,
        route: Route::Upstreams(upstreams),
        affinity: spec.affinity.unwrap_or_default(),
        batch_price_per_million: spec
            .batch_price_ratio
            .map(|ratio| batch_price_per_million(resource, ratio, problems)),
    }
}

/// What an embeddings route may not have: a maxOutputTokens, thinking or vision (it generates
/// nothing), or an upstream whose provider has no embeddings adapter.
fn check_embeddings_route(resource: &ResourceRef, route: &ModelRoute, problems: &mut Problems) {
    let spec = &route.spec;
    if spec.max_output_tokens.is_some() {
        problems.add(
            resource,
            "maxOutputTokens is not allowed on an embeddings route: it generates no tokens",
        );
    }
    if spec.capabilities.thinking || spec.capabilities.vision {
        problems.add(
            resource,
            "capabilities.thinking and capabilities.vision are not allowed with \
             capabilities.embeddings",
        );
    }
    for (i, upstream) in spec.upstreams.iter().enumerate() {
        if !matches!(
            upstream.provider,
            Provider::Openai | Provider::AzureOpenai | Provider::Simulated
        ) {
            problems.add(
                resource,
                format!(
                    "upstreams[{i}] ({}): capabilities.embeddings is served by the openai, \
                     azure-openai and simulated providers only",
                    upstream.name
                ),
            );
        }
    }
}

/// The schema's pattern for `apiVersion` (`YYYY-MM-DD`, optionally `-preview`), re-checked for
/// files no API server has seen.
fn is_api_version(version: &str) -> bool {
    let date = version.strip_suffix("-preview").unwrap_or(version);
    let bytes = date.as_bytes();
    bytes.len() == 10
        && bytes.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            _ => b.is_ascii_digit(),
        })
}

/// The schema's pattern for `region` (`us-east-1`, `ap-southeast-2`, `us-gov-west-1`),
/// re-checked for files no API server has seen.
fn is_aws_region(region: &str) -> bool {
    let mut parts = region.split('-');
    let first = parts.next().unwrap_or_default();
    let rest: Vec<&str> = parts.collect();
    let Some((last, middle)) = rest.split_last() else {
        return false;
    };
    first.len() == 2
        && first.bytes().all(|b| b.is_ascii_lowercase())
        && !middle.is_empty()
        && middle
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && !last.is_empty()
        && last.bytes().all(|b| b.is_ascii_digit())
}

/// The schema's rule for a `vertex` upstream's `region` (`us-east5`, `europe-west1`,
/// `northamerica-northeast1`, `global`), re-checked for files no API server has seen.
fn is_google_region(region: &str) -> bool {
    if region == "global" {
        return true;
    }
    let Some((area, place)) = region.split_once('-') else {
        return false;
    };
    let digits = place.trim_start_matches(|c: char| c.is_ascii_lowercase());
    !area.is_empty()
        && area.bytes().all(|b| b.is_ascii_lowercase())
        && digits.len() < place.len()
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The schema's pattern for `project`: a project id (6 to 30 lowercase letters, digits and
/// hyphens, starting with a letter, not ending with a hyphen) or a project number.
fn is_google_project(project: &str) -> bool {
    let bytes = project.as_bytes();
    let id = (6..=30).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    let number = (6..=20).contains(&bytes.len()) && bytes.iter().all(u8::is_ascii_digit);
    id || number
}

/// Whether `text` is a service account's JSON key file with what signing a token request
/// takes; the key itself is parsed by the gateway, which refuses the upstream if it cannot.
fn is_service_account_key(text: &str) -> bool {
    let Ok(serde_json::Value::Object(file)) = serde_json::from_str(text) else {
        return false;
    };
    let has = |name: &str| file.get(name).and_then(|v| v.as_str()).is_some();
    file.get("type").and_then(|v| v.as_str()) == Some("service_account")
        && has("client_email")
        && has("private_key")
        && has("token_uri")
}

/// A route's batch price ratio in millionths, which must be more than 0 and at most 1.
fn batch_price_per_million(resource: &ResourceRef, ratio: f64, problems: &mut Problems) -> u32 {
    const MILLION: f64 = 1_000_000.0;
    if !(ratio > 0.0 && ratio <= 1.0) {
        problems.add(
            resource,
            format!("batchPriceRatio {ratio} must be more than 0 and at most 1"),
        );
        return MILLION as u32;
    }
    // In range, so the cast cannot overflow; at least one millionth.
    ((ratio * MILLION).round() as u32).max(1)
}

fn compile_upstream(
    resource: &ResourceRef,
    field: &str,
    upstream: &UpstreamSpec,
    namespace: Option<&str>,
    secrets: &Secrets<'_>,
    problems: &mut Problems,
) -> Upstream {
    if upstream.model.trim().is_empty() {
        problems.add(resource, format!("{field}: model must not be empty"));
    }
    let (provider, remote) = match upstream.provider {
        Provider::Anthropic => (ProviderKind::Anthropic, Some("anthropic")),
        Provider::Openai => (ProviderKind::Openai, Some("openai")),
        Provider::AzureOpenai => (ProviderKind::AzureOpenai, Some("azure-openai")),
        // Their endpoints default to the region's.
        Provider::Bedrock => (ProviderKind::Bedrock, None),
        // Its endpoint defaults to Google's (`providers::gemini`).
        Provider::Gemini => (ProviderKind::Gemini, None),
        Provider::Vertex => (ProviderKind::Vertex, None),
        Provider::Simulated => (ProviderKind::Simulated, None),
    };
    let bedrock = provider == ProviderKind::Bedrock;
    let vertex = provider == ProviderKind::Vertex;
    match &upstream.region {
        None if bedrock || vertex => problems.add(
            resource,
            format!(
                "{field}: region is required for the {} provider",
                provider.as_str()
            ),
        ),
        Some(_) if !bedrock && !vertex => problems.add(
            resource,
            format!("{field}: region is only for the bedrock and vertex providers"),
        ),
        Some(region) if bedrock && !is_aws_region(region) => problems.add(
            resource,
            format!("{field}: region {region:?} must be an AWS region such as us-east-1"),
        ),
        Some(region) if vertex && !is_google_region(region) => problems.add(
            resource,
            format!(
                "{field}: region {region:?} must be a Google Cloud region such as us-east5, or global"
            ),
        ),
        _ => {}
    }
    match &upstream.project {
        None if vertex => problems.add(
            resource,
            format!("{field}: project is required for the vertex provider"),
        ),
        Some(_) if !vertex => problems.add(
            resource,
            format!("{field}: project is only for the vertex provider"),
        ),
        Some(project) if !is_google_project(project) => problems.add(
            resource,
            format!("{field}: project {project:?} must be a Google Cloud project id or number"),
        ),
        _ => {}
    }
    if !vertex && upstream.google_credentials_secret_ref.is_some() {
        problems.add(
            resource,
            format!("{field}: googleCredentialsSecretRef is only for the vertex provider"),
        );
    }
    if vertex && upstream.api_key_secret_ref.is_some() {
        problems.add(
            resource,
            format!(
                "{field}: apiKeySecretRef is not for the vertex provider: use googleCredentialsSecretRef"
            ),
        );
    }
    if !bedrock && upstream.aws_credentials_secret_ref.is_some() {
        problems.add(
            resource,
            format!("{field}: awsCredentialsSecretRef is only for the bedrock provider"),
        );
    }
    if bedrock && upstream.api_key_secret_ref.is_some() {
        problems.add(
            resource,
            format!(
                "{field}: apiKeySecretRef is not for the bedrock provider: use awsCredentialsSecretRef"
            ),
        );
    }
    if provider == ProviderKind::Gemini && upstream.api_key_secret_ref.is_none() {
        problems.add(
            resource,
            format!("{field}: apiKeySecretRef is required for the gemini provider"),
        );
    }
    match (&upstream.api_version, provider) {
        (None, ProviderKind::AzureOpenai) => problems.add(
            resource,
            format!("{field}: apiVersion is required for the azure-openai provider"),
        ),
        (Some(_), kind) if kind != ProviderKind::AzureOpenai => problems.add(
            resource,
            format!("{field}: apiVersion is only for the azure-openai provider"),
        ),
        (Some(version), _) if !is_api_version(version) => problems.add(
            resource,
            format!("{field}: apiVersion {version:?} must be a date such as 2024-10-21 (optionally -preview)"),
        ),
        _ => {}
    }
    match (&upstream.base_url, remote) {
        (None, Some(name)) => problems.add(
            resource,
            format!("{field}: baseUrl is required for the {name} provider"),
        ),
        (Some(url), _) if !(url.starts_with("https://") || url.starts_with("http://")) => problems
            .add(
                resource,
                format!("{field}: baseUrl {url:?} must start with https:// or http://"),
            ),
        (Some(url), _) if upstream.http2 && !url.starts_with("http://") => problems.add(
            resource,
            format!("{field}: http2 is for http:// upstreams (https:// ones negotiate it)"),
        ),
        _ => {}
    }
    let api_key = upstream.api_key_secret_ref.as_ref().and_then(|r| {
        secrets
            .resolve(namespace, r)
            .map_err(|reason| problems.add(resource, format!("{field}: apiKeySecretRef: {reason}")))
            .ok()
    });
    let aws_credentials = upstream.aws_credentials_secret_ref.as_ref().and_then(|r| {
        let key = |key: &str| SecretKeyRef {
            name: r.name.clone(),
            key: key.to_owned(),
        };
        let mut resolve = |key: SecretKeyRef| {
            secrets.resolve(namespace, &key).map_err(|reason| {
                problems.add(
                    resource,
                    format!("{field}: awsCredentialsSecretRef: {reason}"),
                )
            })
        };
        let access_key_id = resolve(key("accessKeyId"));
        let secret_access_key = resolve(key("secretAccessKey"));
        // Optional: long-term keys have none; a missing Secret is already reported.
        let session_token = secrets.resolve(namespace, &key("sessionToken")).ok();
        Some(AwsCredentials {
            access_key_id: access_key_id.ok()?,
            secret_access_key: secret_access_key.ok()?,
            session_token,
        })
    });
    let google_credentials = upstream
        .google_credentials_secret_ref
        .as_ref()
        .and_then(|r| {
            secrets
                .resolve(namespace, r)
                .and_then(|key| {
                    if is_service_account_key(key.expose()) {
                        return Ok(key);
                    }
                    Err(format!(
                        "the key {} of Secret {} is not a service account's JSON key file \
                     (type service_account, client_email, private_key, token_uri)",
                        r.key, r.name
                    ))
                })
                .map_err(|reason| {
                    problems.add(
                        resource,
                        format!("{field}: googleCredentialsSecretRef: {reason}"),
                    )
                })
                .ok()
        });
    let defaults = Timeouts::default();
    let TimeoutsSpec {
        connect_ms,
        first_byte_ms,
        idle_ms,
    } = upstream.timeouts.unwrap_or(TimeoutsSpec {
        connect_ms: defaults.connect_ms,
        first_byte_ms: defaults.first_byte_ms,
        idle_ms: defaults.idle_ms,
    });
    Upstream {
        name: upstream.name.clone(),
        provider,
        model: upstream.model.clone(),
        base_url: upstream.base_url.clone(),
        api_version: upstream.api_version.clone(),
        region: upstream.region.clone(),
        aws_credentials,
        project: upstream.project.clone(),
        google_credentials,
        api_key,
        weight: problems.at_least_one(resource, &format!("{field}: weight"), upstream.weight),
        timeouts: Timeouts {
            connect_ms: problems.at_least_one(
                resource,
                &format!("{field}: timeouts.connectMs"),
                connect_ms,
            ),
            first_byte_ms: problems.at_least_one(
                resource,
                &format!("{field}: timeouts.firstByteMs"),
                first_byte_ms,
            ),
            idle_ms: problems.at_least_one(resource, &format!("{field}: timeouts.idleMs"), idle_ms),
        },
        http2: upstream.http2,
        chunk_delay_ms: upstream.chunk_delay_ms,
    }
}

/// An auto route advertises what its best candidate can do: the largest context window and
/// output, and vision/tools if any candidate has them, so that a request is not rejected
/// up front when some candidate could serve it. Thinking stays as declared on the auto route
/// because the API spec reserves it for svc/opus. Its pricing is zero: an auto turn is billed
/// at the price of the candidate that serves it, never at a price of its own.
fn compile_auto_route(
    resource: &ResourceRef,
    route: &ModelRoute,
    by_id: &BTreeMap<&str, (ResourceRef, &ModelRoute)>,
    compiled: &BTreeMap<String, ModelConfig>,
    problems: &mut Problems,
) -> ModelConfig {
    let spec = &route.spec;
    let candidates = spec
        .auto
        .as_ref()
        .map(|auto| auto.candidates.clone())
        .unwrap_or_default();
    let derived = "with auto: it is derived from the candidates";
    if spec.affinity.is_some() {
        problems.add(
            resource,
            "affinity is not allowed with auto: each candidate follows its own route's",
        );
    }
    if spec.batch_price_ratio.is_some() {
        problems.add(
            resource,
            "batchPriceRatio is not allowed with auto: a batch item is billed at the chosen \
             candidate's",
        );
    }
    if spec.context_window.is_some() {
        problems.add(resource, format!("contextWindow is not allowed {derived}"));
    }
    if spec.max_output_tokens.is_some() {
        problems.add(
            resource,
            format!("maxOutputTokens is not allowed {derived}"),
        );
    }
    if spec.capabilities.vision {
        problems.add(
            resource,
            format!("capabilities.vision is not allowed {derived}"),
        );
    }
    if !spec.capabilities.tools {
        problems.add(
            resource,
            format!("capabilities.tools is not allowed {derived}"),
        );
    }
    if spec.capabilities.embeddings {
        problems.add(
            resource,
            "capabilities.embeddings is not allowed with auto: an embeddings route names its \
             upstreams",
        );
    }
    if spec.pricing.is_some() {
        problems.add(
            resource,
            "pricing is not allowed with auto: each turn is billed at the price of the \
             candidate that serves it",
        );
    }
    if candidates.is_empty() {
        problems.add(resource, "auto.candidates must name at least one model");
    }

    let mut seen = BTreeSet::new();
    let mut chosen = Vec::new();
    for candidate in &candidates {
        if !seen.insert(candidate.as_str()) {
            problems.add(
                resource,
                format!("auto candidate {candidate} is listed twice"),
            );
            continue;
        }
        match by_id.get(candidate.as_str()) {
            None => problems.add(
                resource,
                format!("auto candidate {candidate} is not declared by any ModelRoute"),
            ),
            Some((_, other)) if other.spec.auto.is_some() => problems.add(
                resource,
                format!("auto candidate {candidate} is itself an auto route"),
            ),
            Some((_, other)) if other.spec.capabilities.embeddings => problems.add(
                resource,
                format!("auto candidate {candidate} is an embeddings route, which serves no turns"),
            ),
            // A candidate that is invalid itself has its own error; only valid ones count.
            Some(_) => chosen.extend(compiled.get(candidate.as_str())),
        }
    }

    let thinking = spec.capabilities.thinking;
    if thinking && !chosen.iter().any(|m| m.capabilities.thinking) {
        problems.add(
            resource,
            "capabilities.thinking needs at least one candidate with thinking",
        );
    }
    ModelConfig {
        display_name: spec.display_name.clone(),
        context_window: chosen.iter().map(|m| m.context_window).max().unwrap_or(0),
        max_output_tokens: chosen
            .iter()
            .map(|m| m.max_output_tokens)
            .max()
            .unwrap_or(0),
        capabilities: Capabilities {
            thinking,
            vision: chosen.iter().any(|m| m.capabilities.vision),
            tools: chosen.iter().any(|m| m.capabilities.tools),
            embeddings: false,
        },
        pricing: Pricing::default(),
        route: Route::Auto { candidates },
        affinity: Affinity::default(),
        batch_price_per_million: None,
    }
}

fn compile_keys(
    keys: &[ApiKey],
    secrets: &Secrets<'_>,
    problems: &mut Problems,
) -> BTreeMap<String, KeyGrant> {
    let mut grants: BTreeMap<String, (ResourceRef, KeyGrant)> = BTreeMap::new();
    for key in keys {
        let resource = ResourceRef::new("ApiKey", &key.metadata);
        let spec = &key.spec;
        if spec.key_id.trim().is_empty() {
            problems.add(&resource, "keyId must not be empty");
        }
        if spec.tier.is_some_and(|t| t != TierId::Enterprise) {
            problems.add(
                &resource,
                "tier: only enterprise is granted by hand; the other tiers follow the \
                 account's confirmed lifetime top-up (the promotion sweep)",
            );
        }
        // Custom limits are what an enterprise grant is; on any other tier they would
        // silently replace the tier's limits and make the promotion sweep meaningless.
        let limits = spec.limits.map(|l| {
            if spec.tier != Some(TierId::Enterprise) {
                problems.add(
                    &resource,
                    "limits are only allowed with tier: enterprise (custom limits are an \
                     enterprise grant)",
                );
            }
            Limits {
                requests_per_minute: problems.at_least_one(
                    &resource,
                    "limits.requestsPerMinute",
                    l.requests_per_minute,
                ),
                input_tokens_per_minute: problems.at_least_one(
                    &resource,
                    "limits.inputTokensPerMinute",
                    l.input_tokens_per_minute,
                ),
                concurrent_streams: problems.at_least_one(
                    &resource,
                    "limits.concurrentStreams",
                    l.concurrent_streams,
                ),
            }
        });
        let scopes = spec.scopes.as_ref().map(|scopes| {
            if scopes.is_empty() {
                problems.add(
                    &resource,
                    "scopes must list at least one scope; use suspended: true to block a key",
                );
            }
            let unique: BTreeSet<_> = scopes.iter().copied().collect();
            unique.into_iter().map(|s| s.as_str().to_owned()).collect()
        });
        let seed = spec.seed.as_ref().and_then(|seed| {
            if seed.account.trim().is_empty() {
                problems.add(&resource, "seed.account must not be empty");
            }
            secrets
                .resolve(key.metadata.namespace.as_deref(), &seed.secret_ref)
                .map_err(|reason| problems.add(&resource, format!("seed.secretRef: {reason}")))
                .ok()
                .map(|secret| KeySeed {
                    account: seed.account.clone(),
                    secret,
                    top_up_usd_cents: seed.top_up_usd_cents,
                })
        });
        let batches = spec.batches.map(|caps| {
            if spec.tier != Some(TierId::Enterprise) {
                problems.add(
                    &resource,
                    "batches caps are only allowed with tier: enterprise (raised caps are an \
                     enterprise grant)",
                );
            }
            BatchCaps {
                max_in_progress: caps
                    .max_in_progress
                    .map(|n| problems.at_least_one(&resource, "batches.maxInProgress", n)),
                max_queued_items: caps
                    .max_queued_items
                    .map(|n| problems.at_least_one(&resource, "batches.maxQueuedItems", n)),
            }
        });
        let grant = KeyGrant {
            tier: spec.tier.map(|t| t.as_str().to_owned()),
            limits,
            scopes,
            suspended: spec.suspended,
            spend_cap: spec.monthly_spend_cap_credits,
            batches,
            seed,
        };
        match grants.get(&spec.key_id) {
            Some((first, _)) => problems.add(
                &resource,
                format!("keyId {} is already granted by {first}", spec.key_id),
            ),
            None => {
                grants.insert(spec.key_id.clone(), (resource, grant));
            }
        }
    }
    grants
        .into_iter()
        .map(|(id, (_, grant))| (id, grant))
        .collect()
}

/// Parses a non-negative decimal number of US dollars exactly (no float on the way) into
/// micro-dollars.
fn parse_usd_micros(value: &str) -> Result<u64, &'static str> {
    const MALFORMED: &str = "must be a non-negative decimal number of US dollars, like \"18.75\"";
    let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (value.contains('.') && !digits(fraction)) {
        return Err(MALFORMED);
    }
    if fraction.len() > 6 {
        return Err("has more than 6 decimal places");
    }
    const TOO_LARGE: &str = "is too large";
    let whole: u64 = whole.parse().map_err(|_| TOO_LARGE)?;
    let fraction = format!("{fraction:0<6}");
    let fraction: u64 = fraction.parse().map_err(|_| MALFORMED)?;
    whole
        .checked_mul(1_000_000)
        .and_then(|micros| micros.checked_add(fraction))
        .ok_or(TOO_LARGE)
}

/// Hashes the canonical JSON of the configuration (maps are sorted, so equal configurations
/// hash equally whatever order the resources came in). 16 hex digits are plenty to tell
/// configurations apart in pod reports and short enough to read.
fn content_version(
    tiers: &BTreeMap<String, TierConfig>,
    models: &BTreeMap<String, ModelConfig>,
    keys: &BTreeMap<String, KeyGrant>,
) -> Result<String, serde_json::Error> {
    #[derive(Serialize)]
    struct Content<'a> {
        tiers: &'a BTreeMap<String, TierConfig>,
        models: &'a BTreeMap<String, ModelConfig>,
        keys: &'a BTreeMap<String, KeyGrant>,
    }
    let json = serde_json::to_vec(&Content {
        tiers,
        models,
        keys,
    })?;
    let digest = Sha256::digest(&json);
    Ok(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::parse_usd_micros;

    #[test]
    fn prices_parse_exactly_into_micro_dollars() {
        assert_eq!(parse_usd_micros("18.75"), Ok(18_750_000));
        assert_eq!(parse_usd_micros("0.3"), Ok(300_000));
        assert_eq!(parse_usd_micros("0.000001"), Ok(1));
        assert_eq!(parse_usd_micros("15"), Ok(15_000_000));
        assert_eq!(parse_usd_micros("0"), Ok(0));
    }

    #[test]
    fn malformed_or_negative_prices_are_rejected() {
        for bad in [
            "", "-1", "1.", ".5", "1e3", "1,5", " 1", "+1", "1.2.3", "NaN",
        ] {
            assert!(parse_usd_micros(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn prices_with_more_than_six_decimals_are_rejected() {
        assert_eq!(
            parse_usd_micros("1.0000001"),
            Err("has more than 6 decimal places")
        );
    }

    #[test]
    fn prices_that_overflow_are_rejected() {
        assert_eq!(
            parse_usd_micros("18446744073709551615"),
            Err("is too large")
        );
        assert_eq!(
            parse_usd_micros("99999999999999999999999"),
            Err("is too large")
        );
    }
}
