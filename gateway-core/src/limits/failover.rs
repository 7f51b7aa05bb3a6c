//! What the gateway does while Redis is away, chosen at start-up: fail closed (503, the
//! default: no request runs unmetered) or fail open to per-pod local limits, each pod taking
//! its share of the key's limits (divided by the pod count, rounded up: `--pods` at start, then
//! the count the operator publishes as the scaler changes it). Each switch is
//! logged once. Redis is down after [`DOWN_AFTER`] failed calls in a row: a single slow call
//! (a busy node, a pause of this process) refuses or localises its own request only, never
//! the requests after it. While Redis is down, requests do not each wait out the timeout: one
//! call per second probes Redis, the others follow the policy at once; recovery is by itself, on the
//! first probe Redis answers. A probe still failing [`RECONNECT_EVERY_MS`] after the last
//! attempt makes the client's connections again, with the error logged: the way out of a client
//! stuck on a stale connection or slot map while Redis itself is back.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use clap::ValueEnum;
use crds::config::Limits;

use super::{
    Admission, AdmissionRequest, LimitError, Limiter, MemoryLimiter, RedisLimiter, Snapshot,
    StreamSlot,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutagePolicy {
    FailClosed,
    FailOpen,
}

const PROBE_EVERY_MS: u64 = 1_000;
/// Failed calls in a row that mean Redis is down. Calls in flight when Redis goes away fail
/// together, so an outage under traffic is seen at once; an isolated timeout between answers
/// is not an outage.
const DOWN_AFTER: u32 = 3;
/// How long probes may fail before the connections are made again, and again after that.
const RECONNECT_EVERY_MS: u64 = 5_000;

pub struct Failover {
    shared: RedisLimiter,
    local: MemoryLimiter,
    policy: OutagePolicy,
    pods: AtomicU32,
    down: AtomicBool,
    /// Failed calls since the last answer.
    failures: AtomicU32,
    /// While down: when Redis may next be tried (ms since the epoch).
    next_probe_ms: AtomicU64,
    /// While down: when the connections may next be made again (ms since the epoch).
    next_reconnect_ms: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Whether `now` has reached the time in `next` (ms since the epoch), moving it `every` ms on
/// for the one caller that wins: of callers at the same moment, one goes.
fn claim(next: &AtomicU64, now: u64, every: u64) -> bool {
    let due = next.load(Ordering::Relaxed);
    now >= due
        && next
            .compare_exchange(due, now + every, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

impl Failover {
    pub fn new(shared: RedisLimiter, policy: OutagePolicy, pods: u32) -> Self {
        Self {
            shared,
            local: MemoryLimiter::default(),
            policy,
            pods: AtomicU32::new(pods.max(1)),
            down: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            next_probe_ms: AtomicU64::new(0),
            next_reconnect_ms: AtomicU64::new(0),
        }
    }

    /// Whether to call Redis now: always while it is up; once per probe interval while down.
    fn try_shared(&self) -> bool {
        if !self.down.load(Ordering::Relaxed) {
            return true;
        }
        claim(&self.next_probe_ms, now_ms(), PROBE_EVERY_MS)
    }

    fn skipped<T>() -> Result<T, LimitError> {
        Err(LimitError::Unavailable(
            "redis down; waiting for the next probe".into(),
        ))
    }

    fn observe<T>(&self, result: &Result<T, LimitError>) {
        match result {
            Err(LimitError::Unavailable(detail)) => {
                let failures = self
                    .failures
                    .fetch_add(1, Ordering::Relaxed)
                    .saturating_add(1);
                if failures < DOWN_AFTER && !self.down.load(Ordering::Relaxed) {
                    return;
                }
                let now = now_ms();
                self.next_probe_ms
                    .store(now + PROBE_EVERY_MS, Ordering::Relaxed);
                if !self.down.swap(true, Ordering::Relaxed) {
                    self.next_reconnect_ms
                        .store(now + RECONNECT_EVERY_MS, Ordering::Relaxed);
                    tracing::error!(error = %detail, policy = ?self.policy, "redis unavailable; rate limiting switches to the outage policy");
                } else if self.reconnect_due(now) {
                    tracing::warn!(error = %detail, "redis still unavailable; making its connections again");
                    self.shared.reconnect();
                }
            }
            _ => {
                self.failures.store(0, Ordering::Relaxed);
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!("redis reachable again; rate limits are shared again");
                }
            }
        }
    }

    /// Whether this caller is the one to make the connections again now.
    fn reconnect_due(&self, now: u64) -> bool {
        claim(&self.next_reconnect_ms, now, RECONNECT_EVERY_MS)
    }

    fn pods(&self) -> u32 {
        self.pods.load(Ordering::Relaxed)
    }

    fn failing_open(&self, result: &Result<impl Sized, LimitError>) -> bool {
        self.policy == OutagePolicy::FailOpen && matches!(result, Err(LimitError::Unavailable(_)))
    }
}

#[async_trait]
impl Limiter for Failover {
    async fn admit(
        &self,
        key_id: &str,
        limits: &Limits,
        request: AdmissionRequest,
    ) -> Result<Admission, LimitError> {
        let result = if self.try_shared() {
            let result = self.shared.admit(key_id, limits, request).await;
            self.observe(&result);
            result
        } else {
            Self::skipped()
        };
        if self.failing_open(&result) {
            return self
                .local
                .admit(key_id, &share(limits, self.pods()), request)
                .await;
        }
        result
    }

    async fn snapshot(&self, key_id: &str) -> Result<Snapshot, LimitError> {
        // Headers never probe: a snapshot while down would only add the timeout to a refusal.
        let result = if self.down.load(Ordering::Relaxed) {
            Self::skipped()
        } else {
            let result = self.shared.snapshot(key_id).await;
            self.observe(&result);
            result
        };
        if self.failing_open(&result) {
            return self.local.snapshot(key_id).await;
        }
        result
    }

    fn known_refusal(&self, key_id: &str, limits: &Limits) -> Option<LimitError> {
        if self.policy == OutagePolicy::FailOpen && self.down.load(Ordering::Relaxed) {
            self.local
                .known_refusal(key_id, &share(limits, self.pods()))
        } else {
            self.shared.known_refusal(key_id, limits)
        }
    }

    async fn reachable(&self) -> Result<(), LimitError> {
        self.shared.reachable().await
    }

    fn serves_through_outage(&self) -> bool {
        self.policy == OutagePolicy::FailOpen
    }

    fn set_pods(&self, pods: u32) {
        let before = self.pods.swap(pods.max(1), Ordering::Relaxed);
        if before != pods.max(1) {
            tracing::info!(
                from = before,
                to = pods.max(1),
                "gateway pod count for the fail-open share"
            );
        }
    }

    fn effective(&self, limits: &Limits) -> Limits {
        if self.policy == OutagePolicy::FailOpen && self.down.load(Ordering::Relaxed) {
            share(limits, self.pods())
        } else {
            *limits
        }
    }

    fn slot_renewal(&self) -> Option<Duration> {
        self.shared.slot_renewal()
    }

    async fn renew(&self, key_id: &str, slot: &StreamSlot) -> Result<(), LimitError> {
        self.shared.renew(key_id, slot).await
    }

    async fn finish(
        &self,
        key_id: &str,
        slot: Option<StreamSlot>,
        estimated_tokens: u64,
        actual_tokens: u64,
    ) -> Result<(), LimitError> {
        // Stream slots go back where they were taken; while Redis is down, non-stream token
        // corrections stay local too rather than each waiting out the timeout.
        let local = matches!(slot, Some(StreamSlot::Local))
            || (slot.is_none() && self.down.load(Ordering::Relaxed));
        if local {
            self.local
                .finish(key_id, slot, estimated_tokens, actual_tokens)
                .await
        } else {
            self.shared
                .finish(key_id, slot, estimated_tokens, actual_tokens)
                .await
        }
    }
}

/// One pod's part of a key's limits while failing open: rounded up, so a key never loses all
/// of a dimension (a free key's single stream stays available on every pod).
fn share(limits: &Limits, pods: u32) -> Limits {
    Limits {
        requests_per_minute: limits.requests_per_minute.div_ceil(pods),
        input_tokens_per_minute: limits.input_tokens_per_minute.div_ceil(u64::from(pods)),
        concurrent_streams: limits.concurrent_streams.div_ceil(pods),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_or_a_reconnection_is_claimed_by_one_caller_per_interval() {
        let next = AtomicU64::new(0);
        assert!(claim(&next, 1_000, 500));
        assert!(
            !claim(&next, 1_000, 500),
            "a second caller at the same moment"
        );
        assert!(!claim(&next, 1_499, 500));
        assert!(claim(&next, 1_500, 500));
    }

    #[test]
    fn failing_open_each_pod_takes_its_share_of_the_limits_rounded_up() {
        let free = Limits {
            requests_per_minute: 5,
            input_tokens_per_minute: 20_000,
            concurrent_streams: 1,
        };
        let part = share(&free, 2);
        assert_eq!(part.requests_per_minute, 3);
        assert_eq!(part.input_tokens_per_minute, 10_000);
        assert_eq!(part.concurrent_streams, 1);
    }
}
