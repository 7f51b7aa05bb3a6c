//! Per-key rate limits: requests per minute, input tokens per minute and concurrent streams.
//!
//! Both counters use fixed windows aligned to the wall-clock minute: the spec's headers speak
//! of "the current minute window" and its reset, a fixed window gives every pod the same
//! answer from one counter, and its worst case (twice the cap across a window edge) is the
//! documented trade-off. Streams are counted while open and released when they end.

mod address;
mod failover;
mod known;
mod memory;
mod redis;
mod tls;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use crds::config::Limits;
use thiserror::Error;

pub use address::{standing_of, AddressBrake, AddressBucket, AddressLimit};
pub use failover::{Failover, OutagePolicy};
pub use memory::MemoryLimiter;
pub use redis::{RedisLimiter, RedisSettings};
pub use tls::RedisTlsFiles;

pub const WINDOW_SECS: u64 = 60;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Requests,
    InputTokens,
    Streams,
    /// `/v1` requests without a valid key, per client address.
    Unauthenticated,
    /// Dashboard sign-in attempts, per client address.
    SignIns,
    /// Dashboard sign-ups, per client address.
    SignUps,
}

impl Dimension {
    /// The dimension as a metric label or span attribute value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::InputTokens => "input_tokens",
            Self::Streams => "streams",
            Self::Unauthenticated => "unauthenticated",
            Self::SignIns => "sign_ins",
            Self::SignUps => "sign_ups",
        }
    }

    /// Whom the limit is counted for, as a refusal names it.
    pub fn subject(self) -> &'static str {
        match self {
            Self::Requests | Self::InputTokens | Self::Streams => "this key",
            Self::Unauthenticated | Self::SignIns | Self::SignUps => "this client address",
        }
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Requests => "requests per minute",
            Self::InputTokens => "input tokens per minute",
            Self::Streams => "concurrent streams",
            Self::Unauthenticated => "requests without a valid API key per minute",
            Self::SignIns => "sign-in attempts per minute",
            Self::SignUps => "sign-ups per minute",
        })
    }
}

/// A key's usage in the current window, from which the headers are derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub requests: u32,
    pub input_tokens: u64,
    pub streams: u32,
    pub reset_secs: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct AdmissionRequest {
    pub input_tokens: u64,
    pub stream: bool,
    /// Checks and counts one request against RPM: the request's [`RequestCount`], taken by
    /// its first admission.
    pub count_request: bool,
}

impl AdmissionRequest {
    /// The admission that only counts a request: one that ended before any other admission
    /// counted it (an invalid body, say), and every request of the address brake.
    pub const REQUEST_ONLY: Self = Self {
        input_tokens: 0,
        stream: false,
        count_request: true,
    };

    /// The admission of a request that has no input tokens or stream of its own to admit
    /// (count_tokens, a batch's create): its count, if no admission took it yet.
    pub fn counting(count: &RequestCount) -> Self {
        Self {
            input_tokens: 0,
            stream: false,
            count_request: count.take(),
        }
    }
}

/// A request's one count against its key's requests per minute. The turn's admission (or
/// count_tokens') takes it, so that the count rides on the call that admits the tokens and the
/// stream slot instead of a call of its own before the body is read; a request that ends
/// before any admission took it is counted then ([`Limiter::known_refusal`] is what still
/// refuses a key over its limit before its body is read). Clones share the count.
#[derive(Clone, Debug, Default)]
pub struct RequestCount(Arc<AtomicBool>);

impl RequestCount {
    /// Whether the caller is the one to count the request (true once only).
    pub fn take(&self) -> bool {
        !self.0.swap(true, Ordering::Relaxed)
    }
}

/// A held stream slot; given back through [`Limiter::finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamSlot {
    /// Counted in this process.
    Local,
    /// A slot shared by all pods, in Redis, with its id; it expires unless renewed.
    Shared(String),
}

#[derive(Debug)]
pub struct Admission {
    pub snapshot: Snapshot,
    pub stream_slot: Option<StreamSlot>,
}

#[derive(Debug, Error)]
pub enum LimitError {
    #[error(
        "{dimension} exceeded for {subject} (limit {limit}); retry after {retry_after_secs} seconds",
        subject = .dimension.subject()
    )]
    Exceeded {
        dimension: Dimension,
        limit: u64,
        retry_after_secs: u64,
        snapshot: Snapshot,
    },
    #[error("{0}")]
    Unavailable(String),
}

#[async_trait]
pub trait Limiter: Send + Sync {
    /// Admits one request or rejects it, all dimensions at once: a rejection changes nothing.
    async fn admit(
        &self,
        key_id: &str,
        limits: &Limits,
        request: AdmissionRequest,
    ) -> Result<Admission, LimitError>;

    async fn snapshot(&self, key_id: &str) -> Result<Snapshot, LimitError>;

    /// The refusal of a request of `key_id`, with no round trip, when this process already
    /// knows the key's requests or input tokens are used up for the current window (counts
    /// only grow within a window, so what it knows stays true until the window ends); `None`
    /// when it does not know, and the admission decides.
    fn known_refusal(&self, key_id: &str, limits: &Limits) -> Option<LimitError>;

    /// Whether the shared store behind the limits answers now (readiness); in-process
    /// limiters always do.
    async fn reachable(&self) -> Result<(), LimitError> {
        Ok(())
    }

    /// Whether requests go on being served while the shared store is unreachable (failing
    /// open), so that its outage says nothing about whether this pod can serve.
    fn serves_through_outage(&self) -> bool {
        false
    }

    /// How many gateway pods share the limits now (the operator's count), for the share each
    /// takes while failing open; limiters without an outage mode have no use for it.
    fn set_pods(&self, _pods: u32) {}

    /// The limits this limiter enforces right now for a key granted `limits` (a pod failing
    /// open enforces only its share), which the headers must report.
    fn effective(&self, limits: &Limits) -> Limits {
        *limits
    }

    /// How often an open stream must renew its slot; `None` when slots do not expire.
    fn slot_renewal(&self) -> Option<Duration> {
        None
    }

    async fn renew(&self, _key_id: &str, _slot: &StreamSlot) -> Result<(), LimitError> {
        Ok(())
    }

    /// Ends an admitted request: gives the stream slot back and corrects the window's token
    /// count from the admission estimate to the actual input tokens.
    async fn finish(
        &self,
        key_id: &str,
        slot: Option<StreamSlot>,
        estimated_tokens: u64,
        actual_tokens: u64,
    ) -> Result<(), LimitError>;
}

/// The current window's number and the seconds until it ends.
pub fn current_window() -> (u64, u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    (now / WINDOW_SECS, WINDOW_SECS - now % WINDOW_SECS)
}

/// The admission decision on a window's counts, shared by every implementation (the Redis
/// script repeats it).
///
/// Input tokens: a request is admitted when it fits in what is left of the minute, or when
/// the minute still has room to start it (fewer tokens used than the cap). A request larger
/// than the whole per-minute allowance (a long agent conversation, bounded only by the
/// model's context window) therefore starts in a fresh minute, takes it over the cap, and the
/// next requests wait for the window's reset, which Retry-After reports.
pub fn decide(
    limits: &Limits,
    snapshot: &Snapshot,
    request: &AdmissionRequest,
) -> Result<(), LimitError> {
    let exceeded = |dimension, limit: u64, retry_after_secs| LimitError::Exceeded {
        dimension,
        limit,
        retry_after_secs,
        snapshot: *snapshot,
    };
    if request.count_request && snapshot.requests >= limits.requests_per_minute {
        return Err(exceeded(
            Dimension::Requests,
            limits.requests_per_minute.into(),
            snapshot.reset_secs,
        ));
    }
    let tpm = limits.input_tokens_per_minute;
    let fits = snapshot.input_tokens + request.input_tokens <= tpm;
    let room_to_start = snapshot.input_tokens < tpm;
    if !fits && !room_to_start {
        return Err(exceeded(
            Dimension::InputTokens,
            limits.input_tokens_per_minute,
            snapshot.reset_secs,
        ));
    }
    if request.stream && snapshot.streams >= limits.concurrent_streams {
        return Err(exceeded(
            Dimension::Streams,
            limits.concurrent_streams.into(),
            1,
        ));
    }
    Ok(())
}
