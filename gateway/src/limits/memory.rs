//! The in-process limiter of standalone mode: one small record per key, each behind its own
//! map shard, so keys never contend with each other.

use async_trait::async_trait;
use crds::config::Limits;
use dashmap::DashMap;

use super::{
    current_window, decide, Admission, AdmissionRequest, LimitError, Limiter, Snapshot, StreamLease,
};

#[derive(Default)]
struct Window {
    number: u64,
    requests: u32,
    input_tokens: u64,
    streams: u32,
}

impl Window {
    /// Moves to the current window, keeping open streams (they are not per-window).
    fn roll(&mut self, number: u64) {
        if self.number != number {
            self.number = number;
            self.requests = 0;
            self.input_tokens = 0;
        }
    }

    fn snapshot(&self, reset_secs: u64) -> Snapshot {
        Snapshot {
            requests: self.requests,
            input_tokens: self.input_tokens,
            streams: self.streams,
            reset_secs,
        }
    }
}

#[derive(Default)]
pub struct MemoryLimiter {
    keys: DashMap<String, Window>,
}

#[async_trait]
impl Limiter for MemoryLimiter {
    async fn admit(
        &self,
        key_id: &str,
        limits: &Limits,
        request: AdmissionRequest,
    ) -> Result<Admission, LimitError> {
        let (number, reset_secs) = current_window();
        let mut window = self.keys.entry(key_id.to_owned()).or_default();
        window.roll(number);
        decide(limits, &window.snapshot(reset_secs), &request)?;
        window.requests += u32::from(request.count_request);
        window.input_tokens += request.input_tokens;
        let lease = request.stream.then(|| {
            window.streams += 1;
            StreamLease::Local
        });
        Ok(Admission {
            snapshot: window.snapshot(reset_secs),
            lease,
        })
    }

    async fn snapshot(&self, key_id: &str) -> Result<Snapshot, LimitError> {
        let (number, reset_secs) = current_window();
        Ok(match self.keys.get_mut(key_id) {
            Some(mut window) => {
                window.roll(number);
                window.snapshot(reset_secs)
            }
            None => Snapshot {
                reset_secs,
                ..Snapshot::default()
            },
        })
    }

    async fn finish(
        &self,
        key_id: &str,
        lease: Option<StreamLease>,
        estimated_tokens: u64,
        actual_tokens: u64,
    ) -> Result<(), LimitError> {
        let (number, _) = current_window();
        if let Some(mut window) = self.keys.get_mut(key_id) {
            if lease.is_some() {
                window.streams = window.streams.saturating_sub(1);
            }
            if window.number == number {
                window.input_tokens =
                    (window.input_tokens + actual_tokens).saturating_sub(estimated_tokens);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        requests_per_minute: 2,
        input_tokens_per_minute: 100,
        concurrent_streams: 1,
    };

    fn req(input_tokens: u64, stream: bool) -> AdmissionRequest {
        AdmissionRequest {
            input_tokens,
            stream,
            count_request: true,
        }
    }

    #[tokio::test]
    async fn the_request_past_the_rpm_cap_is_rejected_and_changes_nothing() {
        let limiter = MemoryLimiter::default();
        for _ in 0..2 {
            limiter
                .admit("k", &LIMITS, req(1, false))
                .await
                .expect("admitted under the cap");
        }
        let before = limiter.snapshot("k").await.expect("snapshot");
        assert_eq!(before.requests, 2, "{before:?}");
        let err = limiter.admit("k", &LIMITS, req(1, false)).await;
        assert!(matches!(err, Err(LimitError::Exceeded { .. })));
        assert_eq!(limiter.snapshot("k").await.expect("snapshot"), before);
    }

    #[tokio::test]
    async fn a_stream_slot_is_free_again_once_finished() {
        let limiter = MemoryLimiter::default();
        let first = limiter
            .admit("k", &LIMITS, req(1, true))
            .await
            .expect("the first stream admitted");
        let lease = first.lease.expect("a stream holds a lease");
        assert!(limiter.admit("k", &LIMITS, req(1, true)).await.is_err());
        limiter
            .finish("k", Some(lease), 1, 1)
            .await
            .expect("finished");
        assert!(limiter.admit("k", &LIMITS, req(1, true)).await.is_ok());
    }

    #[tokio::test]
    async fn finishing_corrects_the_token_estimate() {
        let limiter = MemoryLimiter::default();
        limiter
            .admit("k", &LIMITS, req(80, false))
            .await
            .expect("admitted");
        limiter.finish("k", None, 80, 10).await.expect("finished");
        let snapshot = limiter.snapshot("k").await.expect("snapshot");
        assert_eq!(snapshot.input_tokens, 10, "{snapshot:?}");
    }

    #[tokio::test]
    async fn a_request_larger_than_the_tpm_cap_starts_when_the_minute_has_room_then_others_wait() {
        let limiter = MemoryLimiter::default();
        assert!(limiter.admit("k", &LIMITS, req(150, false)).await.is_ok());
        let err = limiter.admit("k", &LIMITS, req(1, false)).await;
        assert!(matches!(
            err,
            Err(LimitError::Exceeded {
                dimension: super::super::Dimension::InputTokens,
                ..
            })
        ));
    }

    #[tokio::test]
    async fn a_request_that_does_not_fit_still_starts_while_the_minute_has_room() {
        let limiter = MemoryLimiter::default();
        assert!(limiter.admit("k", &LIMITS, req(60, false)).await.is_ok());
        assert!(limiter.admit("k", &LIMITS, req(60, false)).await.is_ok());
    }
}
