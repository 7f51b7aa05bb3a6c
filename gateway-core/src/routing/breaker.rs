//! One circuit breaker per upstream of a model: after `failures` consecutive failed attempts
//! (an attempt fails before its first byte or at any point of its stream, and succeeds only
//! when its stream finishes) the upstream is out for `cooldown`; then the next turn that reaches it is its probe (one at
//! a time), and the probe's outcome closes the breaker or opens it for another cooldown.
//! An upstream that limits us and says when to come back (`retry-after`) is out until then at
//! once, at most [`LONGEST_RETRY_AFTER`]: every turn sent before would be refused the same way,
//! and their fallbacks are better served now.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::telemetry::metrics::{self, CircuitState};

/// The longest an upstream's `retry-after` keeps it out: the providers' limits are per minute,
/// and a wrong or hostile header must not take an upstream away for a day.
pub const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
pub struct BreakerPolicy {
    pub failures: u32,
    pub cooldown: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            failures: 5,
            cooldown: Duration::from_secs(30),
        }
    }
}

#[derive(Default)]
struct State {
    consecutive_failures: u32,
    open_until: Option<Instant>,
    probe_started: Option<Instant>,
}

/// Shared by the turns' streams, which report their outcome when they end.
#[derive(Clone)]
pub struct Breakers {
    policy: BreakerPolicy,
    states: Arc<DashMap<String, State>>,
}

impl Breakers {
    pub fn new(policy: BreakerPolicy) -> Self {
        Self {
            policy,
            states: Arc::new(DashMap::new()),
        }
    }

    /// Whether a turn may try this upstream now; when it is the probe, it is marked as such.
    pub fn admit(&self, key: &str) -> bool {
        let Some(mut state) = self.states.get_mut(key) else {
            return true;
        };
        let Some(open_until) = state.open_until else {
            return true;
        };
        let now = Instant::now();
        if now < open_until {
            return false;
        }
        // A probe whose turn vanished (cancelled before an outcome) stops blocking after a
        // cooldown of its own.
        let probing = state
            .probe_started
            .is_some_and(|at| now < at + self.policy.cooldown);
        if probing {
            return false;
        }
        state.probe_started = Some(now);
        metrics::circuit_state(key, CircuitState::HalfOpen);
        true
    }

    pub fn succeeded(&self, key: &str) {
        if let Some(mut state) = self.states.get_mut(key) {
            if state.open_until.is_some() {
                tracing::info!(upstream = key, "upstream probe succeeded; back in rotation");
                metrics::circuit_state(key, CircuitState::Closed);
            }
            *state = State::default();
        }
    }

    /// A failed attempt; `retry_after` is when the upstream said to come back, if it did.
    pub fn failed(&self, key: &str, retry_after: Option<Duration>) {
        let mut state = self.states.entry(key.to_owned()).or_default();
        state.consecutive_failures += 1;
        if let Some(wait) = retry_after.filter(|wait| !wait.is_zero()) {
            let until = Instant::now() + wait.min(LONGEST_RETRY_AFTER);
            if state.open_until.is_none_or(|open| open < until) {
                tracing::warn!(
                    upstream = key,
                    retry_after_ms = wait.as_millis() as u64,
                    "upstream limits us; out of rotation until it said to come back"
                );
                state.open_until = Some(until);
                state.probe_started = None;
                metrics::circuit_state(key, CircuitState::Open);
            }
            return;
        }
        let probe_failed = state.probe_started.take().is_some();
        if probe_failed || state.consecutive_failures >= self.policy.failures {
            if state.open_until.is_none() || probe_failed {
                tracing::warn!(
                    upstream = key,
                    cooldown_ms = self.policy.cooldown.as_millis() as u64,
                    "upstream taken out of rotation"
                );
            }
            state.open_until = Some(Instant::now() + self.policy.cooldown);
            metrics::circuit_state(key, CircuitState::Open);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakers(cooldown_ms: u64) -> Breakers {
        Breakers::new(BreakerPolicy {
            failures: 2,
            cooldown: Duration::from_millis(cooldown_ms),
        })
    }

    #[test]
    fn consecutive_failures_open_the_breaker_and_a_success_resets_the_count() {
        let b = breakers(60_000);
        b.failed("u", None);
        b.succeeded("u");
        b.failed("u", None);
        assert!(b.admit("u"));
        b.failed("u", None);
        assert!(!b.admit("u"));
    }

    #[test]
    fn after_the_cooldown_one_probe_goes_through_and_its_failure_reopens() {
        let b = breakers(0);
        b.failed("u", None);
        b.failed("u", None);
        assert!(b.admit("u"), "the probe");
        b.failed("u", None);
        assert!(b.admit("u"), "cooldown of 0: the next probe");
        b.succeeded("u");
        assert!(b.admit("u"));
        assert!(b.admit("u"), "closed again: everyone goes through");
    }

    #[test]
    fn a_throttle_with_a_retry_after_takes_the_upstream_out_at_once_until_then() {
        let b = breakers(0);
        b.failed("u", Some(Duration::from_millis(30)));
        assert!(
            !b.admit("u"),
            "out after one throttle, where failures alone need two"
        );
        std::thread::sleep(Duration::from_millis(35));
        assert!(
            b.admit("u"),
            "back once the wait it gave is over, as a probe"
        );
        b.succeeded("u");
        b.failed("u", Some(Duration::ZERO));
        assert!(b.admit("u"), "a wait of 0 counts as a plain failure");
    }

    #[test]
    fn a_retry_after_keeps_the_upstream_out_a_minute_at_most() {
        let b = breakers(0);
        b.failed("u", Some(Duration::from_secs(86_400)));
        let until = b.states.get("u").and_then(|s| s.open_until);
        let longest = Instant::now() + LONGEST_RETRY_AFTER;
        assert!(until.is_some_and(|until| until <= longest), "{until:?}");
    }

    #[test]
    fn only_one_probe_runs_at_a_time() {
        let b = Breakers::new(BreakerPolicy {
            failures: 1,
            cooldown: Duration::from_millis(20),
        });
        b.failed("u", None);
        std::thread::sleep(Duration::from_millis(25));
        assert!(b.admit("u"));
        assert!(!b.admit("u"));
    }
}
