//! The custom resources operators write (`kubectl apply`, or files in standalone mode).
//!
//! The schemas refuse at admission what a single object can get wrong: types, `required`,
//! `enum`, bounds and patterns everywhere; list-map keys (duplicate upstream names); and, on
//! API servers from 1.25 (CEL), the cross-field rules as `x-kubernetes-validations` (one of
//! `upstreams`/`auto`, `maxOutputTokens` at most `contextWindow`, promotion thresholds,
//! `limits` only on an enterprise grant). Older servers ignore the CEL rules. What spans
//! resources (candidates that exist, secrets that resolve, one Tier per tier) is checked by
//! [`crate::compile::compile`], which also re-checks every schema rule because standalone mode
//! reads files that no API server has seen.
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
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.tier == 'enterprise' ? !has(self.promotionAtLifetimeTopUpCents) : has(self.promotionAtLifetimeTopUpCents)",
        "message": "promotionAtLifetimeTopUpCents is required on every tier but enterprise, where it must be absent: enterprise is only granted by hand, with an ApiKey"
    },
    {
        "rule": "self.tier != 'free' || !has(self.promotionAtLifetimeTopUpCents) || self.promotionAtLifetimeTopUpCents == 0",
        "message": "promotionAtLifetimeTopUpCents must be 0 on the free tier: every key starts there"
    }
]))]
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
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.upstreams) != has(self.auto)",
        "message": "exactly one of upstreams and auto is required"
    },
    {
        "rule": "!has(self.upstreams) || (has(self.contextWindow) && (has(self.maxOutputTokens) || (has(self.capabilities) && has(self.capabilities.embeddings) && self.capabilities.embeddings)) && has(self.pricing))",
        "message": "contextWindow, maxOutputTokens and pricing are required with upstreams"
    },
    {
        "rule": "!has(self.capabilities) || !has(self.capabilities.embeddings) || !self.capabilities.embeddings || (has(self.upstreams) && !has(self.maxOutputTokens) && !(has(self.capabilities.thinking) && self.capabilities.thinking) && !(has(self.capabilities.vision) && self.capabilities.vision) && self.upstreams.all(u, u.provider in ['openai', 'azure-openai', 'simulated']))",
        "message": "an embeddings route has upstreams of the openai, azure-openai or simulated provider, and no maxOutputTokens, thinking or vision: it generates no tokens"
    },
    {
        "rule": "!has(self.auto) || !(has(self.contextWindow) || has(self.maxOutputTokens) || has(self.pricing) || has(self.affinity))",
        "message": "contextWindow, maxOutputTokens, pricing and affinity are not allowed with auto: they come from its candidates"
    },
    {
        "rule": "!has(self.maxOutputTokens) || !has(self.contextWindow) || self.maxOutputTokens <= self.contextWindow",
        "message": "maxOutputTokens must be at most contextWindow"
    }
]))]
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
    /// `upstreams` (but on an embeddings route, which generates none); not allowed with
    /// `auto`, which takes the largest of its candidates.
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
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
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
    /// What a batch item (Message Batches, `/v1/batches`) served by this route costs, as a
    /// fraction of the same turn sent alone: more than 0, at most 1 (the same price). Default:
    /// the gateway's `--batch-price-percent` (50, half). Not allowed with `auto`, whose turns
    /// are billed at the chosen candidate's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0), extend("exclusiveMinimum" = true))]
    pub batch_price_ratio: Option<f64>,
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
    /// The route serves `POST /v1/embeddings` and nothing else (no messages, chat or
    /// responses). Its `contextWindow` is the most tokens one input may have; it takes no
    /// `maxOutputTokens`, and its upstreams are `openai`, `azure-openai` or `simulated`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub embeddings: bool,
}

impl Default for CapabilitiesSpec {
    fn default() -> Self {
        Self {
            thinking: false,
            vision: false,
            tools: true,
            embeddings: false,
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
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.provider in ['simulated', 'bedrock', 'gemini', 'vertex'] || has(self.baseUrl)",
        "message": "baseUrl is required for every provider but simulated, bedrock, gemini and vertex"
    },
    {
        "rule": "self.provider != 'gemini' || has(self.apiKeySecretRef)",
        "message": "apiKeySecretRef is required for the gemini provider"
    },
    {
        "rule": "(self.provider == 'azure-openai') == has(self.apiVersion)",
        "message": "apiVersion is required for the azure-openai provider, and only for it"
    },
    {
        "rule": "(self.provider in ['bedrock', 'vertex']) == has(self.region)",
        "message": "region is required for the bedrock and vertex providers, and only for them"
    },
    {
        "rule": "self.provider != 'bedrock' || !has(self.region) || self.region.matches('^[a-z]{2}(-[a-z]+)+-[0-9]+$')",
        "message": "region must be an AWS region such as us-east-1 for the bedrock provider"
    },
    {
        "rule": "self.provider != 'vertex' || !has(self.region) || self.region.matches('^(global|[a-z]+-[a-z]+[0-9]+)$')",
        "message": "region must be a Google Cloud region such as us-east5, or global, for the vertex provider"
    },
    {
        "rule": "(self.provider == 'vertex') == has(self.project)",
        "message": "project is required for the vertex provider, and only for it"
    },
    {
        "rule": "self.provider == 'vertex' || !has(self.googleCredentialsSecretRef)",
        "message": "googleCredentialsSecretRef is only for the vertex provider"
    },
    {
        "rule": "self.provider != 'vertex' || !has(self.apiKeySecretRef)",
        "message": "apiKeySecretRef is not for the vertex provider: use googleCredentialsSecretRef"
    },
    {
        "rule": "self.provider == 'bedrock' || !has(self.awsCredentialsSecretRef)",
        "message": "awsCredentialsSecretRef is only for the bedrock provider"
    },
    {
        "rule": "self.provider != 'bedrock' || !has(self.apiKeySecretRef)",
        "message": "apiKeySecretRef is not for the bedrock provider: use awsCredentialsSecretRef"
    }
]))]
pub struct UpstreamSpec {
    /// Unique within the route; names the upstream in health state and the ledger.
    #[schemars(length(min = 1))]
    pub name: String,
    pub provider: Provider,
    /// The provider's own model name; never shown to API clients.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Required for `anthropic`, `openai` and `azure-openai`: the root the provider's paths
    /// are appended to, as in the providers' own SDKs: `https://api.anthropic.com`
    /// (+ `/v1/messages`), `https://api.openai.com/v1` (+ `/chat/completions`), or the Azure
    /// OpenAI resource's endpoint `https://RESOURCE.openai.azure.com`
    /// (+ `/openai/deployments/{model}/chat/completions`, `model` being the deployment name).
    /// Optional for `bedrock` (default `https://bedrock-runtime.{region}.amazonaws.com`; a VPC
    /// endpoint, + `/model/{model}/invoke-with-response-stream`), `gemini` (default
    /// `https://generativelanguage.googleapis.com`, with
    /// `/v1beta/models/{model}:streamGenerateContent` appended) and `vertex` (default
    /// `https://{region}-aiplatform.googleapis.com`, `https://aiplatform.googleapis.com` for
    /// `global`, with `/v1/projects/{project}/locations/{region}/publishers/anthropic/models/
    /// {model}:streamRawPredict` appended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"))]
    pub base_url: Option<String>,
    /// Required for `azure-openai`, and only there: the Azure OpenAI data-plane API version
    /// every call names (`?api-version=`), e.g. `2024-10-21`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(-preview)?$"))]
    pub api_version: Option<String>,
    /// Required for `bedrock` and `vertex`, and only there: the AWS region the calls are
    /// signed for (e.g. `us-east-1`), or the Google Cloud region the model is served in (e.g.
    /// `us-east5`, or `global`); its endpoint is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[a-z0-9]+(-[a-z0-9]+)*$"), length(max = 64))]
    pub region: Option<String>,
    /// Required for `vertex`, and only there: the Google Cloud project (its id, or its
    /// number) whose Vertex AI quota and billing serve the calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{6,20})$"))]
    pub project: Option<String>,
    /// A `vertex` upstream's Google credentials: the key of a Secret holding a service
    /// account's JSON key file (`{"type": "service_account", ...}`); the gateway signs a token
    /// request with it at the file's `token_uri`. Without it the gateway takes its Pod's
    /// service account from the metadata server (GKE Workload Identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub google_credentials_secret_ref: Option<SecretKeyRef>,
    /// A `bedrock` upstream's AWS credentials: a Secret with the keys `accessKeyId`,
    /// `secretAccessKey` and optionally `sessionToken`. Without it the gateway signs with the
    /// standard environment variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_credentials_secret_ref: Option<SecretRef>,
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
    /// Chat completions on an Azure OpenAI resource: the `openai` wire format, Azure's paths
    /// and `api-key` header.
    #[serde(rename = "azure-openai")]
    AzureOpenai,
    /// Claude on Amazon Bedrock: the Messages body through `InvokeModelWithResponseStream`,
    /// signed with SigV4.
    Bedrock,
    /// The Gemini API (`generativelanguage.googleapis.com`): `streamGenerateContent` with the
    /// `x-goog-api-key` header, the conversation translated to Gemini's contents.
    Gemini,
    /// Claude on Google Vertex AI: the Messages body through `:streamRawPredict`, with an
    /// OAuth access token of a service account.
    Vertex,
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
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub candidates: Vec<String>,
}

/// The schema of ApiKey `tier`: only the tier granted by hand is admitted.
fn enterprise_only(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "enum": ["enterprise"] })
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
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.limits) || has(self.tier)",
        "message": "limits are only allowed with tier: enterprise, the grant they belong to"
    },
    {
        "rule": "!has(self.batches) || has(self.tier)",
        "message": "batches caps are only allowed with tier: enterprise, the grant they belong to"
    }
]))]
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
    #[schemars(schema_with = "enterprise_only")]
    pub tier: Option<TierId>,
    /// Custom limits; only with `tier: enterprise`, because custom limits are what an
    /// enterprise grant is. Enterprise without limits uses the enterprise Tier's limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsSpec>,
    /// Restricts the key to these surfaces; absent keeps the key's own scopes. Use
    /// `suspended` rather than an empty list to block a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub scopes: Option<Vec<Scope>>,
    /// Rejects every request of the key with 403 while true.
    #[serde(default)]
    pub suspended: bool,
    /// Credits the key may spend per UTC month; a turn that would pass it gets 402. Overrides
    /// the cap the key was minted with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly_spend_cap_credits: Option<u64>,
    /// The key's own caps on Message Batches; only with `tier: enterprise`. Each one given
    /// replaces the gateway's flag (`--batch-max-in-progress`, `--batch-max-queued-items`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches: Option<BatchCapsSpec>,
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

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BatchCapsSpec {
    /// Batches the key may have processing at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_in_progress: Option<u32>,
    /// Requests the key may have queued or running, over all its batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_queued_items: Option<u64>,
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

/// A whole Secret in the namespace of the referring resource, whose keys the referring field
/// names.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretRef {
    #[schemars(length(min = 1))]
    pub name: String,
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
/// (POST /v1/chat/completions, batches, files and POST /v1/embeddings), `responses`
/// (/v1/responses), `models` (GET /v1/models), `account` (GET /v1/account, /v1/usage).
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
    let mut out = String::from(
        "# Generated by `cargo run -p crds --bin crdgen > charts/gateway/files/crds.yaml`.\n\
         # Do not edit: change the types in crds/src/resources.rs and regenerate.\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

/// The three CRDs as the API server gets them: the derived schemas, finished by hand where
/// the derive cannot express the rule.
pub fn crds() -> [serde_json::Value; 3] {
    use kube::CustomResourceExt;

    let mut tier = crd_json(Tier::crd());
    // Tiers are unique per tier id only across objects, which no schema sees; tying the name to
    // the id lets the API server refuse a second `free` Tier as a name conflict.
    tier["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = serde_json::json!([{
        "rule": "self.metadata.name == {'free': 'free', 'pay_as_you_go': 'pay-as-you-go', 'high_volume': 'high-volume', 'enterprise': 'enterprise'}[self.spec.tier]",
        "message": "a Tier is named after its tier: free, pay-as-you-go, high-volume or enterprise, so that each tier is declared once"
    }]);
    [tier, crd_json(ModelRoute::crd()), crd_json(ApiKey::crd())]
}

fn crd_json(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> serde_json::Value {
    let mut crd = serde_json::to_value(crd).unwrap_or_default();
    // The chart renders these as templates, so `helm upgrade` updates them; `keep` leaves them
    // (and with them every Tier, ModelRoute and ApiKey) in place on `helm uninstall`.
    crd["metadata"]["annotations"] = serde_json::json!({ "helm.sh/resource-policy": "keep" });
    let schema = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    // Optional fields are simply absent (every `Option` skips serializing `None`). `nullable`
    // would only admit an explicit null, and it makes the published OpenAPI lose the field's
    // subfields (`kubectl explain` shows `<>`).
    drop_nullable(schema);
    condition_constraints(&mut schema["properties"]["status"]["properties"]["conditions"]["items"]);
    crd
}

fn drop_nullable(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(map) => {
            map.remove("nullable");
            map.values_mut().for_each(drop_nullable);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nullable),
        _ => {}
    }
}

/// The validation of metav1.Condition that Kubernetes' own types carry (the derived schema has
/// only the types), so a status such as `Maybe` is refused.
fn condition_constraints(condition: &mut serde_json::Value) {
    let constraints = serde_json::json!({
        "type": {
            "maxLength": 316,
            "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
        },
        "status": { "enum": ["True", "False", "Unknown"] },
        "reason": {
            "minLength": 1,
            "maxLength": 1024,
            "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
        },
        "message": { "maxLength": 32768 },
        "observedGeneration": { "minimum": 0 }
    });
    for (field, extra) in constraints.as_object().into_iter().flatten() {
        if let (Some(target), Some(extra)) = (
            condition["properties"][field].as_object_mut(),
            extra.as_object(),
        ) {
            target.extend(extra.clone());
        }
    }
}
