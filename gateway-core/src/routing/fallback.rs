//! A turn's way through its model's upstreams: each in the model's plan whose breaker lets it
//! through is tried until one has produced its first event. Connect errors, 5xx, 529 and
//! timeouts move on to the next (nothing has reached the client yet); a rejection of the
//! request's content does not, since every upstream would reject it too. When all fail, the
//! last failure is the turn's error; when every breaker is open, the model is unavailable.
//!
//! An upstream that answered has not succeeded yet: a stream that errors, stalls or turns
//! malformed later counts against its breaker like a refused connection (an upstream that
//! fails only after its first byte would otherwise never leave the rotation), though the turn
//! cannot move on, its client having had bytes. Only a finished stream counts as a success.

use std::sync::Arc;

use crds::config::Upstream;
use futures::StreamExt;

use crate::conversation::Request;
use crate::providers::embeddings::{EmbeddingsAnswer, EmbeddingsCall};
use crate::providers::{EventStream, ProviderCall, ProviderError, ProviderEvent, Providers};
use crate::routing::breaker::Breakers;
use crate::telemetry;

pub struct Attempt<'a> {
    pub model: &'a str,
    pub plan: &'a [Upstream],
    pub request: Arc<Request>,
    pub anthropic_beta: Option<&'a str>,
    pub input_tokens: u32,
}

/// Returns the events of the first upstream that answered, and that upstream.
pub async fn start<'a>(
    providers: &Providers,
    breakers: &Breakers,
    attempt: Attempt<'a>,
) -> Result<(EventStream, &'a Upstream), ProviderError> {
    let (events, upstream, key) = first_answer(breakers, attempt.model, attempt.plan, |upstream| {
        let call = ProviderCall {
            request: attempt.request.clone(),
            anthropic_beta: attempt.anthropic_beta.map(str::to_owned),
            upstream: upstream.clone(),
            served_model: attempt.model.to_owned(),
            input_tokens: attempt.input_tokens,
        };
        providers.adapter(upstream.provider).start(call)
    })
    .await?;
    Ok((outcome_reported(events, breakers.clone(), key), upstream))
}

/// Embeds on the first upstream of the plan that answers, by the same rules as a turn's
/// [`start`]; an answer is whole, so it is the upstream's success at once.
pub async fn embed<'a>(
    providers: &Providers,
    breakers: &Breakers,
    model: &str,
    plan: &'a [Upstream],
    call: &EmbeddingsCall,
) -> Result<(EmbeddingsAnswer, &'a Upstream), ProviderError> {
    let (answer, upstream, key) = first_answer(breakers, model, plan, |upstream| {
        providers.embed(upstream, call)
    })
    .await?;
    breakers.succeeded(&key);
    Ok((answer, upstream))
}

/// Tries each upstream of `plan` whose breaker lets it through until one answers: that answer,
/// the upstream, and its breaker key (whose success the caller reports when it knows it).
async fn first_answer<'a, T, F, Fut>(
    breakers: &Breakers,
    model: &str,
    plan: &'a [Upstream],
    mut call: F,
) -> Result<(T, &'a Upstream, String), ProviderError>
where
    F: FnMut(&'a Upstream) -> Fut,
    Fut: std::future::Future<Output = Result<T, ProviderError>>,
{
    let mut last = ProviderError::Unavailable;
    for upstream in plan {
        let key = format!("{model}/{}", upstream.name);
        if !breakers.admit(&key) {
            continue;
        }
        match call(upstream).await {
            Ok(answer) => return Ok((answer, upstream, key)),
            Err(ProviderError::Rejected(message)) => {
                breakers.succeeded(&key);
                return Err(ProviderError::Rejected(message));
            }
            Err(e) => {
                tracing::warn!(upstream = %key, error = %e, "upstream attempt failed; trying the next");
                telemetry::metrics::upstream_error(&upstream.name, e.kind());
                breakers.failed(&key, e.retry_after());
                last = e;
            }
        }
    }
    Err(last)
}

/// The stream, reporting to the breaker how it ends. A stream dropped before its end (the
/// client left, the server shut down) says nothing about the upstream and reports nothing.
fn outcome_reported(events: EventStream, breakers: Breakers, key: String) -> EventStream {
    Box::pin(events.inspect(move |event| match event {
        Ok(ProviderEvent::Finish { .. }) => breakers.succeeded(&key),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(upstream = %key, error = %e, "upstream stream failed after its first byte");
            breakers.failed(&key, e.retry_after());
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;
    use crate::routing::breaker::BreakerPolicy;
    use store::usage::{StopReason, TokenUsage};

    fn events(items: Vec<Result<ProviderEvent, ProviderError>>) -> EventStream {
        Box::pin(futures::stream::iter(items))
    }

    fn first_event() -> Result<ProviderEvent, ProviderError> {
        Ok(ProviderEvent::BlockStop { index: 0 })
    }

    fn breakers() -> Breakers {
        Breakers::new(BreakerPolicy {
            failures: 2,
            cooldown: Duration::from_secs(60),
        })
    }

    #[tokio::test]
    async fn streams_that_fail_after_their_first_event_open_the_breaker() {
        let b = breakers();
        for _ in 0..2 {
            let failing = events(vec![first_event(), Err(ProviderError::Timeout)]);
            outcome_reported(failing, b.clone(), "m/u".into())
                .collect::<Vec<_>>()
                .await;
        }
        assert!(!b.admit("m/u"));
    }

    #[tokio::test]
    async fn a_finished_stream_resets_the_count_and_an_abandoned_one_reports_nothing() {
        let b = breakers();
        let failing = events(vec![first_event(), Err(ProviderError::Upstream)]);
        outcome_reported(failing, b.clone(), "m/u".into())
            .collect::<Vec<_>>()
            .await;
        let finished = events(vec![
            first_event(),
            Ok(ProviderEvent::Finish {
                stop_reason: StopReason::EndTurn,
                stop_sequence: None,
                usage: TokenUsage::default(),
            }),
        ]);
        outcome_reported(finished, b.clone(), "m/u".into())
            .collect::<Vec<_>>()
            .await;
        let mut abandoned = outcome_reported(
            events(vec![first_event(), Err(ProviderError::Upstream)]),
            b.clone(),
            "m/u".into(),
        );
        abandoned.next().await;
        drop(abandoned);
        let failing = events(vec![first_event(), Err(ProviderError::Upstream)]);
        outcome_reported(failing, b.clone(), "m/u".into())
            .collect::<Vec<_>>()
            .await;
        assert!(
            b.admit("m/u"),
            "one failure since the finished stream; the abandoned one did not count"
        );
    }
}
