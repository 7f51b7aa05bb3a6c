//! The in-process limiter of standalone mode: one small record per key, each behind its own
//! map shard, so keys never contend with each other.

use async_trait::async_trait;
use crds::config::Limits;
use dashmap::DashMap;

use super::{
    current_window, decide, Admission, AdmissionRequest, LimitError, Limiter, Snapshot, StreamSlot,
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
        let stream_slot = request.stream.then(|| {
            window.streams += 1;
            StreamSlot::Local
        });
        Ok(Admission {
            snapshot: window.snapshot(reset_secs),
            stream_slot,
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

    fn known_refusal(&self, key_id: &str, limits: &Limits) -> Option<LimitError> {
        // The counts are here: the answer is exact.
        let (number, reset_secs) = current_window();
        let mut window = self.keys.get_mut(key_id)?;
        window.roll(number);
        decide(
            limits,
            &window.snapshot(reset_secs),
            &AdmissionRequest::REQUEST_ONLY,
        )
        .err()
    }

    async fn finish(
        &self,
        key_id: &str,
        slot: Option<StreamSlot>,
        estimated_tokens: u64,
        actual_tokens: u64,
    ) -> Result<(), LimitError> {
        let (number, _) = current_window();
        if let Some(mut window) = self.keys.get_mut(key_id) {
            if slot.is_some() {
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
