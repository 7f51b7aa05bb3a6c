//! A turn's way through its model's upstreams: each in the model's plan whose breaker lets it
//! through is tried until one has produced its first event. Connect errors, 5xx, 529 and
//! timeouts move on to the next (nothing has reached the client yet); a rejection of the
//! request's content does not, since every upstream would reject it too. When all fail, the
//! last failure is the turn's error; when every breaker is open, the model is unavailable.

use std::sync::Arc;

use crds::config::Upstream;

use crate::providers::{EventStream, ProviderCall, ProviderError, Providers};
use crate::telemetry;
use crate::wire::anthropic::MessagesRequest;

pub struct Attempt<'a> {
    pub model: &'a str,
    pub plan: &'a [Upstream],
    pub request: Arc<MessagesRequest>,
    pub input_tokens: u32,
}

/// Returns the events of the first upstream that answered, and that upstream.
pub async fn start<'a>(
    providers: &Providers,
    attempt: Attempt<'a>,
) -> Result<(EventStream, &'a Upstream), ProviderError> {
    let breakers = providers.breakers();
    let mut last = ProviderError::Unavailable;
    for upstream in attempt.plan {
        let key = format!("{}/{}", attempt.model, upstream.name);
        if !breakers.admit(&key) {
            continue;
        }
        let call = ProviderCall {
            request: attempt.request.clone(),
            upstream: upstream.clone(),
            served_model: attempt.model.to_owned(),
            input_tokens: attempt.input_tokens,
        };
        match providers.adapter(upstream.provider).start(call).await {
            Ok(events) => {
                breakers.succeeded(&key);
                return Ok((events, upstream));
            }
            Err(ProviderError::Rejected(message)) => {
                breakers.succeeded(&key);
                return Err(ProviderError::Rejected(message));
            }
            Err(e) => {
                tracing::warn!(upstream = %key, error = %e, "upstream attempt failed; trying the next");
                telemetry::metrics::upstream_error(&upstream.name, e.kind());
                breakers.failed(&key);
                last = e;
            }
        }
    }
    Err(last)
}
