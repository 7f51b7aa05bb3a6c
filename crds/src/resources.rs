//! The custom resources operators write (`kubectl apply`, or files in standalone mode).
//!
//! The schemas only use what a Kubernetes 1.20 API server enforces (types, `required`, `enum`,
//! `minimum`, `pattern`): CEL rules would be silently ignored there. Everything that spans
//! fields or resources (one of `upstreams`/`auto`, candidates that exist, secrets that resolve)
//! is checked by [`crate::compile::compile`], which also re-checks the schema rules because
//! standalone mode reads files that no API server has seen.
//!
//! Every spec rejects unknown fields so that a typo fails loudly instead of silently falling
//! back to a default.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::config::Affinity;

/// The API group of every resource in this module.
pub const GROUP: &str = "gateway.svc.dev";
/// The only served version; `apiVersion` is `gateway.svc.dev/v1alpha1`.
pub const VERSION: &str = "v1alpha1";

/// Rate limits and promotion threshold of one tier. The set of tiers is fixed by the API spec;
/// these resources only set their numbers, so all four must exist exactly once.
#[allow(
    clippy::duplicated_attributes,
    reason = "every printcolumn(...) has a type_; they are not duplicates"
)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gateway.svc.dev",
    version = "v1alpha1",
    kind = "Tier",
    namespaced,
    status = "ResourceStatus",
    derive = "PartialEq",
    shortname = "tr",
    category = "svc-gateway",
    doc = "Rate limits of one API key tier (free, pay_as_you_go, high_volume, enterprise).",
    printcolumn(name = "Tier", type_ = "string", json_path = ".spec.tier"),
    printcolumn(name = "RPM", type_ = "integer", json_path = ".spec.requestsPerMinute"),
    printcolumn(
        name = "TPM",
        type_ = "integer",
        json_path = ".spec.inputTokensPerMinute"
    ),
    printcolumn(
        name = "Streams",
        type_ = "integer",
        json_path = ".spec.concurrentStreams"
    ),
    printcolumn(
        name = "Promotion",
        type_ = "integer",
        json_path = ".spec.promotionAtLifetimeTopUpCents",
        description = "Lifetime top-up (US cents) that promotes a key into this tier"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TierSpec {
    /// Which tier these limits are for. The resource name is free (a DNS name such as
    /// `pay-as-you-go`) because tier ids contain underscores, which names cannot.
    pub tier: TierId,
    /// Requests per minute per key.
    #[schemars(range(min = 1))]
    pub requests_per_minute: u32,
    /// Input tokens per minute per key.
    #[schemars(range(min = 1))]
    pub input_tokens_per_minute: u64,
    /// Streams a key may hold open at the same time.
    #[schemars(range(min = 1))]
    pub concurrent_streams: u32,
    /// Confirmed lifetime top-up (US cents) from which the promotion sweep moves a key into
    /// this tier: 0 for free, 1 for pay_as_you_go (any first top-up), 50000 for high_volume
    /// ($500). Required on every tier but enterprise, where it must be absent because
    /// enterprise is only granted by hand (ApiKey).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promotion_at_lifetime_top_up_cents: Option<u64>,
}

/// A virtual model (`svc/...`) that clients name in requests, and how it is served.
#[allow(
    clippy::duplicated_attributes,
    reason = "every printcolumn(...) has a type_; they are not duplicates"
)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gateway.svc.dev",
    version = "v1alpha1",
    kind = "ModelRoute",
    namespaced,
    status = "ResourceStatus",
    derive = "PartialEq",
    shortname = "mr",
    category = "svc-gateway",
    doc = "A virtual model id offered to API clients and the upstreams that serve it.",
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model"),
    printcolumn(name = "Context", type_ = "integer", json_path = ".spec.contextWindow"),
    printcolumn(
        name = "MaxOutput",
        type_ = "integer",
        json_path = ".spec.maxOutputTokens"
    ),
    printcolumn(
        name = "InputPrice",
        type_ = "string",
        json_path = ".spec.pricing.inputUsdPerMTok"
    ),
    printcolumn(
        name = "OutputPrice",
        type_ = "string",
        json_path = ".spec.pricing.outputUsdPerMTok"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelRouteSpec {
    /// The virtual model id clients send, e.g. `svc/opus`. Provider model names never appear
    /// here because clients must not see them.
    #[schemars(regex(pattern = r"^svc/[a-z0-9][a-z0-9._-]*$"))]
    pub model: String,
    /// Human-readable name shown in the models listing.
    #[schemars(length(min = 1))]
    pub display_name: String,
    /// Tokens of context (input plus output). Required with `upstreams`; not allowed with
    /// `auto`, which takes the largest of its candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub context_window: Option<u32>,
    /// Upper bound for a request's `max_tokens`; at most `contextWindow`. Required with
    /// `upstreams`; not allowed with `auto`, which takes the largest of its candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_output_tokens: Option<u32>,
    /// What requests may use. With `auto`, only `thinking` may be set: vision and tools are
    /// those of the candidates.
    #[serde(default)]
    pub capabilities: CapabilitiesSpec,
    /// What clients pay, whichever upstream serves the turn. Required with `upstreams`; not
    /// allowed with `auto`, whose turns are billed at the chosen candidate's price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<PricingSpec>,
    /// Upstreams in order of preference, weighted among equals. Exactly one of `upstreams`
    /// and `auto` must be set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<UpstreamSpec>,
    /// Serve each request with one of other (non-auto) virtual models, chosen per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoSpec>,
    /// How turns spread over `upstreams`: `conversation` (the default) keeps each
    /// conversation on one upstream while it is healthy, so the provider's prompt cache keeps
    /// serving it, with the weights holding across conversations; `none` draws every turn by
    /// weight. Not allowed with `auto` (each candidate follows its own route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CapabilitiesSpec {
    /// Extended thinking; the API spec offers it on `svc/opus` only.
    #[serde(default)]
    pub thinking: bool,
    /// Image content blocks.
    #[serde(default)]
    pub vision: bool,
    /// Tool definitions and tool_use blocks; on unless switched off, as most models have it.
    #[serde(default = "default_true")]
    pub tools: bool,
}

impl Default for CapabilitiesSpec {
    fn default() -> Self {
        Self {
            thinking: false,
            vision: false,
            tools: true,
        }
    }
}

fn default_true() -> bool {
    true
}

/// Prices are decimal strings ("18.75") rather than numbers because Kubernetes API
/// conventions avoid floats; they are parsed exactly into integer micro-dollars.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PricingSpec {
    /// USD per million input tokens, at most 6 decimal places.
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]{1,6})?$"))]
    pub input_usd_per_m_tok: String,
    /// USD per million output tokens, at most 6 decimal places.
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]{1,6})?$"))]
    pub output_usd_per_m_tok: String,
    /// USD per million tokens written to the prompt cache, at most 6 decimal places.
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]{1,6})?$"))]
    pub cache_write_usd_per_m_tok: String,
    /// USD per million tokens read from the prompt cache, at most 6 decimal places.
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]{1,6})?$"))]
    pub cache_read_usd_per_m_tok: String,
    /// USD per million tokens written to the 1-hour prompt cache, where the upstream reports
    /// those writes apart (Anthropic's `ephemeral_1h_input_tokens`). Default: twice the input
    /// price, the providers' published ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]{1,6})?$"))]
    pub cache_write1h_usd_per_m_tok: Option<String>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UpstreamSpec {
    /// Unique within the route; names the upstream in health state and the ledger.
    #[schemars(length(min = 1))]
    pub name: String,
    pub provider: Provider,
    /// The provider's own model name; never shown to API clients.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Required for `anthropic` and `openai`: the root the provider's paths are appended to,
    /// as in the providers' own SDKs: `https://api.anthropic.com` (+ `/v1/messages`) or
    /// `https://api.openai.com/v1` (+ `/chat/completions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"))]
    pub base_url: Option<String>,
    /// The upstream API key, read from a Secret in the same namespace so it never sits in
    /// the route itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeyRef>,
    /// Share of traffic among upstreams of equal preference.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1))]
    pub weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<TimeoutsSpec>,
    /// Speak HTTP/2 over cleartext (h2c, with prior knowledge) to an `http://` baseUrl, as
    /// in-cluster servers behind a Service often can: every turn to the upstream shares a few
    /// connections instead of holding one each. `https://` upstreams negotiate HTTP/2 on their
    /// own (ALPN) and need no flag.
    #[serde(default)]
    pub http2: bool,
    /// Delay between streamed chunks; only the `simulated` provider uses it, to make streams
    /// look like real ones.
    #[serde(default)]
    pub chunk_delay_ms: u64,
}

fn default_weight() -> u32 {
    1
}

/// Which wire format and adapter an upstream uses.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    Anthropic,
    Openai,
    Simulated,
}

/// Timeouts that decide when the gateway gives up on an upstream and falls back to the next;
/// a missing field keeps its default.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeoutsSpec {
    /// Milliseconds to establish the connection (default 5000).
    #[serde(default = "default_connect_ms")]
    #[schemars(range(min = 1))]
    pub connect_ms: u64,
    /// Milliseconds until the first byte of the response (default 60000).
    #[serde(default = "default_first_byte_ms")]
    #[schemars(range(min = 1))]
    pub first_byte_ms: u64,
    /// Milliseconds allowed between two chunks of a stream (default 60000).
    #[serde(default = "default_idle_ms")]
    #[schemars(range(min = 1))]
    pub idle_ms: u64,
}

fn default_connect_ms() -> u64 {
    crate::config::Timeouts::default().connect_ms
}

fn default_first_byte_ms() -> u64 {
    crate::config::Timeouts::default().first_byte_ms
}

fn default_idle_ms() -> u64 {
    crate::config::Timeouts::default().idle_ms
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AutoSpec {
    /// Virtual model ids to choose from, in order of preference; none of them may be `auto`.
    #[schemars(length(min = 1))]
    pub candidates: Vec<String>,
}

/// A grant for one gateway-minted API key: tier, custom limits, scopes, suspension.
#[allow(
    clippy::duplicated_attributes,
    reason = "every printcolumn(...) has a type_; they are not duplicates"
)]
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gateway.svc.dev",
    version = "v1alpha1",
    kind = "ApiKey",
    namespaced,
    status = "ResourceStatus",
    derive = "PartialEq",
    shortname = "ak",
    category = "svc-gateway",
    doc = "Grants a gateway-minted API key a tier, custom limits, scopes or suspension.",
    printcolumn(name = "Key", type_ = "string", json_path = ".spec.keyId"),
    printcolumn(name = "Tier", type_ = "string", json_path = ".spec.tier"),
    printcolumn(name = "Suspended", type_ = "boolean", json_path = ".spec.suspended"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiKeySpec {
    /// The id of the key as the gateway minted it (not the secret).
    #[schemars(length(min = 1))]
    pub key_id: String,
    /// Only `enterprise`, the tier granted by hand: every other tier follows the account's
    /// confirmed lifetime top-up through the promotion sweep (the spec: "there is no manual
    /// promotion"), so the operator refuses them here.
    // The schema is the plain enum: the derived `Option` schema lists `null` among the enum
    // values, which Kubernetes before 1.23 mishandles; an absent field means the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "TierId")]
    pub tier: Option<TierId>,
    /// Custom limits; only with `tier: enterprise`, because custom limits are what an
    /// enterprise grant is. Enterprise without limits uses the enterprise Tier's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsSpec>,
    /// Restricts the key to these surfaces; absent keeps the key's own scopes. Use
    /// `suspended` rather than an empty list to block a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub scopes: Option<Vec<Scope>>,
    /// Rejects every request of the key with 403 while true.
    #[serde(default)]
    pub suspended: bool,
    /// Credits the key may spend per UTC month; a turn that would pass it gets 402. Overrides
    /// the cap the key was minted with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly_spend_cap_credits: Option<u64>,
    /// Standalone mode only: creates the key with this account and secret if it does not
    /// exist, so a fresh local stack has a working key without the dashboard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<SeedSpec>,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsSpec {
    #[schemars(range(min = 1))]
    pub requests_per_minute: u32,
    #[schemars(range(min = 1))]
    pub input_tokens_per_minute: u64,
    #[schemars(range(min = 1))]
    pub concurrent_streams: u32,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SeedSpec {
    /// The account the seeded key belongs to (created if missing).
    #[schemars(length(min = 1))]
    pub account: String,
    /// The key's secret value (`sk-svc-...`).
    pub secret_ref: SecretKeyRef,
    /// A confirmed top-up of the seeded account in US cents, as if it had paid (once, by a
    /// reference naming the key): the key starts at the tier it gives, as a user's would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000, max = 1000000))]
    pub top_up_usd_cents: Option<u64>,
}

/// A key of a Secret in the namespace of the referring resource.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1))]
    pub name: String,
    #[schemars(length(min = 1))]
    pub key: String,
}

/// A tier id of the API spec, spelled as clients see it in `X-RateLimit-Tier`.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum TierId {
    Free,
    PayAsYouGo,
    HighVolume,
    Enterprise,
}

impl TierId {
    /// In promotion order, so the promotion thresholds can be checked pairwise.
    pub const ALL: [TierId; 4] = [
        TierId::Free,
        TierId::PayAsYouGo,
        TierId::HighVolume,
        TierId::Enterprise,
    ];

    /// The id used in [`crate::config::GatewayConfig`] (one of [`crate::config::TIER_IDS`]).
    pub fn as_str(self) -> &'static str {
        match self {
            TierId::Free => "free",
            TierId::PayAsYouGo => "pay_as_you_go",
            TierId::HighVolume => "high_volume",
            TierId::Enterprise => "enterprise",
        }
    }
}

impl fmt::Display for TierId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An API surface: `messages` (POST /v1/messages and count_tokens), `chat`
/// (POST /v1/chat/completions), `responses` (/v1/responses), `models` (GET /v1/models),
/// `account` (GET /v1/account, /v1/usage).
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Messages,
    Chat,
    Responses,
    Models,
    Account,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Messages => "messages",
            Scope::Chat => "chat",
            Scope::Responses => "responses",
            Scope::Models => "models",
            Scope::Account => "account",
        }
    }
}

/// Written by the operator only; `Ready` says whether the resource made it into the
/// published configuration, and why not.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` the conditions describe, so stale status is recognisable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The three CRDs as one multi-document YAML file, as committed in the Helm chart. It lives
/// here rather than in `crdgen` so that a test can compare the committed file with it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;

    let mut out = String::from(
        "# Generated by `cargo run -p crds --bin crdgen > charts/gateway/files/crds.yaml`.\n\
         # Do not edit: change the types in crds/src/resources.rs and regenerate.\n",
    );
    for mut crd in [Tier::crd(), ModelRoute::crd(), ApiKey::crd()] {
        // The chart renders these as templates, so `helm upgrade` updates them; `keep` leaves
        // them (and with them every Tier, ModelRoute and ApiKey) in place on `helm uninstall`.
        crd.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("helm.sh/resource-policy".to_owned(), "keep".to_owned());
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
