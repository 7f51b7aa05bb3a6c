//! The compiled gateway configuration: the contract between the operator (or the standalone
//! manifest loader) and the gateway. Gateways only ever read this type; the custom resources
//! are compiled into it in one place (`compile`).

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The tier ids of the spec. Tier resources may add limits for each, but the set is fixed.
pub const TIER_IDS: [&str; 4] = ["free", "pay_as_you_go", "high_volume", "enterprise"];

/// The scopes a key can be restricted to; a key without scopes may use every surface.
/// `messages`: POST /v1/messages and count_tokens; `chat`: POST /v1/chat/completions (and
/// OpenAI's other surfaces: batches, files, POST /v1/embeddings);
/// `responses`: /v1/responses (create, retrieve, delete, input items); `models`: GET
/// /v1/models; `account`: GET /v1/account and /v1/usage.
pub const SCOPES: [&str; 5] = ["messages", "chat", "responses", "models", "account"];

/// The key of the Secret the operator publishes the config in: the config as JSON.
pub const SECRET_KEY: &str = "config.json";

/// The annotation of that Secret with the gateway pod count the operator's scaler last set,
/// which pods failing open divide each key's limits by.
pub const PODS_ANNOTATION: &str = "gateway.svc.dev/gateway-pods";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GatewayConfig {
    /// Content hash of everything below, so pods can report which config they run.
    pub version: String,
    /// Limits by tier id (`free`, `pay_as_you_go`, `high_volume`, `enterprise`).
    pub tiers: BTreeMap<String, TierConfig>,
    /// Virtual models by id (`svc/opus`, ...).
    pub models: BTreeMap<String, ModelConfig>,
    /// Per-key grants from ApiKey resources, by key id.
    pub keys: BTreeMap<String, KeyGrant>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Limits {
    pub requests_per_minute: u32,
    pub input_tokens_per_minute: u64,
    pub concurrent_streams: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TierConfig {
    pub limits: Limits,
    /// Confirmed lifetime top-up (US cents) from which the promotion sweep moves a key into
    /// this tier. `None` for tiers that are only granted by hand (enterprise).
    pub promotion_at_lifetime_cents: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelConfig {
    pub display_name: String,
    pub context_window: u32,
    pub max_output_tokens: u32,
    pub capabilities: Capabilities,
    /// What the client pays, whichever upstream serves the turn.
    pub pricing: Pricing,
    pub route: Route,
    /// How a turn's first upstream is chosen among the route's upstreams.
    #[serde(default)]
    pub affinity: Affinity,
    /// What a batch item served by this route costs, in millionths of the interactive price
    /// (1 to 1,000,000); `None`: the gateway's default (`--batch-price-percent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_price_per_million: Option<u32>,
}

/// How a route spreads turns over its upstreams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Affinity {
    /// The turns of one conversation go to the same upstream while it is healthy, so the
    /// provider's prompt cache (which lives in one account or deployment) keeps serving it;
    /// across conversations the weights hold.
    #[default]
    Conversation,
    /// Every turn draws its upstream by weight.
    None,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Capabilities {
    pub thinking: bool,
    pub vision: bool,
    pub tools: bool,
    /// The route serves `/v1/embeddings` only. Absent when false, so a gateway of the previous
    /// release reads a configuration without embeddings routes as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub embeddings: bool,
}

/// Prices in micro-dollars (1e-6 USD) per million tokens: integers, so money never touches a
/// float on the request path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pricing {
    pub input_micros_per_mtok: u64,
    pub output_micros_per_mtok: u64,
    pub cache_write_micros_per_mtok: u64,
    pub cache_read_micros_per_mtok: u64,
    /// Writes to the 1-hour cache, where the upstream reports them apart; `None`: twice the
    /// input price, the providers' own ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h_micros_per_mtok: Option<u64>,
}

impl Pricing {
    /// What a 1-hour cache write costs per million tokens.
    pub fn cache_write_1h(&self) -> u64 {
        self.cache_write_1h_micros_per_mtok
            .unwrap_or(self.input_micros_per_mtok.saturating_mul(2))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum Route {
    /// Served by these upstreams, in order of preference, weighted among equals.
    Upstreams(Vec<Upstream>),
    /// Served by one of these other virtual models, chosen per request.
    Auto { candidates: Vec<String> },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Upstream {
    pub name: String,
    pub provider: ProviderKind,
    /// The upstream's own model name; internal, never shown to API clients.
    pub model: String,
    pub base_url: Option<String>,
    /// The `api-version` an `azure-openai` upstream is called with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// The AWS region a `bedrock` upstream is signed for, or the Google Cloud region a
    /// `vertex` upstream is served in (whose endpoint is the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// A `bedrock` upstream's credentials; `None`: the gateway's environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_credentials: Option<AwsCredentials>,
    /// The Google Cloud project a `vertex` upstream's calls are made in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// A `vertex` upstream's service-account key file (JSON); `None`: the metadata server's
    /// token (GKE Workload Identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub google_credentials: Option<Secret>,
    pub api_key: Option<Secret>,
    pub weight: u32,
    pub timeouts: Timeouts,
    /// Cleartext HTTP/2 (prior knowledge) to an `http://` base URL.
    #[serde(default)]
    pub http2: bool,
    /// Delay between streamed chunks of the `simulated` provider.
    pub chunk_delay_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProviderKind {
    Anthropic,
    Openai,
    #[serde(rename = "azure-openai")]
    AzureOpenai,
    Bedrock,
    Gemini,
    Vertex,
    Simulated,
}

impl ProviderKind {
    /// The name the ModelRoute spells, as the ledger and logs record it (never a client).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Openai => "openai",
            Self::AzureOpenai => "azure-openai",
            Self::Bedrock => "bedrock",
            Self::Gemini => "gemini",
            Self::Vertex => "vertex",
            Self::Simulated => "simulated",
        }
    }
}

/// AWS access keys (a session's when `session_token` is set), from the Secret a `bedrock`
/// upstream names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AwsCredentials {
    pub access_key_id: Secret,
    pub secret_access_key: Secret,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<Secret>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Timeouts {
    pub connect_ms: u64,
    pub first_byte_ms: u64,
    pub idle_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect_ms: 5_000,
            first_byte_ms: 60_000,
            idle_ms: 60_000,
        }
    }
}

/// What an ApiKey resource grants the key it names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyGrant {
    /// Tier override; `enterprise` with `limits` for custom limits.
    pub tier: Option<String>,
    pub limits: Option<Limits>,
    /// Scopes the key is restricted to; `None` leaves the key's own scopes.
    pub scopes: Option<Vec<String>>,
    pub suspended: bool,
    /// Credits the key may spend per UTC month, overriding the cap it was minted with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend_cap: Option<u64>,
    /// The key's own caps on Message Batches, replacing the gateway's flags where given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches: Option<BatchCaps>,
    /// Standalone only: create the key from this secret if it does not exist yet.
    pub seed: Option<KeySeed>,
}

/// A key's caps on Message Batches: batches processing at once, and requests queued or
/// running over all its batches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BatchCaps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_progress: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued_items: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeySeed {
    pub account: String,
    pub secret: Secret,
    /// A confirmed top-up of the seeded account (US cents), once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_up_usd_cents: Option<u64>,
}

/// A secret value: serialized as is (the compiled config is itself kept in a Secret), never
/// printed by `Debug`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
