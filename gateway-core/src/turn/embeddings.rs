//! `POST /v1/embeddings`: one call, answered whole, through the same steps and the same money
//! as a turn: resolve the model (an embeddings route: `capabilities.embeddings`), count each
//! input's tokens, admit against the key's RPM and TPM (no stream slot), reserve the input's
//! price, call the route's upstreams in the plan's order (fallback and breakers as for a turn),
//! and settle once: the upstream's `usage.prompt_tokens` (the gateway's count where it reports
//! none) at the route's input price, output 0; a failed call bills nothing. The ledger row's
//! endpoint is `embeddings`.

use std::sync::Arc;

use store::ledger::{MessageRecord, MessageStatus, NewReservation, ServedBy};
use store::usage::TokenUsage;

use super::{
    admit, message_record, provider_name, resolve_any_model, Endpoint, Input, Meter, OpenTurn,
    TurnError, Turns,
};
use crate::auth::Principal;
use crate::conversation::BilledUsage;
use crate::limits::Snapshot;
use crate::providers::embeddings::EmbeddingsCall;
use crate::providers::ProviderError;
use crate::routing::{fallback, AffinityKey};
use crate::telemetry::TurnTelemetry;

/// The most inputs one request may have (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;
/// The most tokens all of one request's inputs may have together (OpenAI's limit). Each input
/// may have at most the route's `contextWindow`.
pub const MAX_TOTAL_TOKENS: u32 = 300_000;
/// The most numbers a vector may be asked to have (`dimensions`).
pub const MAX_DIMENSIONS: u32 = 4096;

/// A request as the edge parsed it.
pub struct EmbeddingsRequest {
    pub id: String,
    pub model: String,
    pub inputs: Vec<String>,
    pub dimensions: Option<u32>,
    /// The client's end user, as its row keeps it.
    pub user: Option<String>,
}

/// The answer: one vector per input, in order, and the bill.
pub struct Embeddings {
    /// The virtual model id asked for.
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
    /// `tokens.input_tokens` is what was billed.
    pub usage: BilledUsage,
    pub snapshot: Snapshot,
}

/// Serves one embeddings request.
pub async fn embed(
    state: &Turns,
    principal: &Principal,
    request: EmbeddingsRequest,
) -> Result<Embeddings, TurnError> {
    let EmbeddingsRequest {
        id,
        model,
        inputs,
        dimensions,
        user,
    } = request;
    let requested = resolve_any_model(state, &model)?;
    if !requested.config.capabilities.embeddings {
        return Err(TurnError::Invalid(format!(
            "model: {model} does not serve embeddings; GET /v1/models lists the models with \
             `capabilities.embeddings`"
        )));
    }
    check(&inputs, dimensions)?;
    if let Some(user) = &user {
        crate::validate::end_user("user", user)?;
    }
    let telemetry = TurnTelemetry::begin(&id, &requested.id, 0, false);
    let user = user.filter(|u| !u.is_empty());
    if let Some(user) = &user {
        telemetry.end_user(user);
    }
    let (inputs, counts) = count(state, inputs).await?;
    let per_input = requested.config.context_window;
    if let Some((i, tokens)) = counts.iter().enumerate().find(|(_, n)| **n > per_input) {
        return Err(TurnError::Invalid(format!(
            "input[{i}]: {tokens} tokens, past the {per_input} tokens one input of {model} may have"
        )));
    }
    let total = counts.iter().fold(0u32, |sum, n| sum.saturating_add(*n));
    if total > MAX_TOTAL_TOKENS {
        return Err(TurnError::Invalid(format!(
            "input: {total} tokens in all, past the {MAX_TOTAL_TOKENS} one request may have"
        )));
    }
    telemetry.input_tokens(total);

    let admission = telemetry
        .step("admission", admit(state, principal, total, false))
        .await;
    let admission = telemetry.admission(admission)?;
    let price = requested.price;
    let input = Input {
        sent: total,
        unsent: 0,
    };
    let mut meter = Meter {
        state: state.clone(),
        turn: OpenTurn {
            key_id: principal.key.id.clone(),
            admitted: true,
            stream_slot: admission.stream_slot,
            message_id: id.clone(),
            price,
            input,
            usage: TokenUsage {
                input_tokens: total,
                ..TokenUsage::default()
            },
            telemetry,
            ..OpenTurn::default()
        },
    };
    // The same input goes to the same upstream (its cache, if any), else the key's.
    let affinity = user.as_deref().unwrap_or(&principal.key.id);
    let plan = requested.plan(|| AffinityKey::named(affinity));
    let Some(first) = plan.first() else {
        meter.release().await;
        return Err(ProviderError::Unavailable.into());
    };
    let cost = price.credits(&TokenUsage {
        input_tokens: total,
        ..TokenUsage::default()
    });
    let reservation = NewReservation {
        record: MessageRecord {
            end_user: user.clone(),
            ..message_record(
                &id,
                principal,
                Endpoint::Embeddings,
                &requested,
                &requested,
                first,
                false,
            )
        },
        spend_cap: principal.spend_cap,
        min: cost,
        max: cost,
    };
    meter.reserve(reservation).await?;

    let call = EmbeddingsCall {
        inputs: Arc::new(inputs),
        dimensions,
        user,
    };
    let calling = meter.turn.telemetry.calling(false);
    let answered = tracing::Instrument::instrument(
        fallback::embed(
            &state.providers,
            &state.breakers,
            &requested.id,
            &plan,
            &call,
        ),
        calling,
    )
    .await;
    let (answer, upstream) = match answered {
        Ok(answered) => answered,
        Err(e) => {
            meter.turn.telemetry.upstream_failed(&e);
            meter.settle(MessageStatus::Failed, None).await;
            return Err(e.into());
        }
    };
    meter
        .turn
        .telemetry
        .upstream_selected(&requested.id, &upstream.name);
    meter.turn.served_by = Some(ServedBy {
        provider: provider_name(upstream),
        upstream: upstream.name.clone(),
        upstream_model: upstream.model.clone(),
    });
    let usage = TokenUsage {
        input_tokens: answer.prompt_tokens.unwrap_or(total),
        ..TokenUsage::default()
    };
    let credits = meter
        .settle_as(MessageStatus::Completed, true, usage, None)
        .await;
    Ok(Embeddings {
        model: requested.id.clone(),
        vectors: answer.vectors,
        usage: BilledUsage {
            tokens: usage,
            credits,
        },
        snapshot: admission.snapshot,
    })
}

/// What is refused before anything is counted: no input, too many, an empty one, and
/// `dimensions` out of range.
fn check(inputs: &[String], dimensions: Option<u32>) -> Result<(), TurnError> {
    if inputs.is_empty() {
        return Err(TurnError::Invalid(
            "input: at least one input is required".to_owned(),
        ));
    }
    if inputs.len() > MAX_INPUTS {
        return Err(TurnError::Invalid(format!(
            "input: {} inputs, past the {MAX_INPUTS} one request may have",
            inputs.len()
        )));
    }
    if let Some(i) = inputs.iter().position(String::is_empty) {
        return Err(TurnError::Invalid(format!(
            "input[{i}]: an input must not be empty"
        )));
    }
    if let Some(d) = dimensions.filter(|d| !(1..=MAX_DIMENSIONS).contains(d)) {
        return Err(TurnError::Invalid(format!(
            "dimensions: {d} is not between 1 and {MAX_DIMENSIONS}"
        )));
    }
    Ok(())
}

/// Each input's tokens, off the async workers when the inputs are large.
async fn count(state: &Turns, inputs: Vec<String>) -> Result<(Vec<String>, Vec<u32>), TurnError> {
    let tokens = state.tokens;
    let bytes: usize = inputs.iter().map(String::len).sum();
    let counting = move || {
        let counts = inputs.iter().map(|i| tokens.count(i)).collect();
        (inputs, counts)
    };
    if bytes <= crate::cpu::INLINE_BYTES {
        return Ok(counting());
    }
    crate::cpu::run(counting)
        .await
        .map_err(|e| TurnError::Tokens(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_input_an_empty_input_too_many_inputs_and_odd_dimensions_are_refused() {
        let one = vec!["a".to_owned()];
        assert!(check(&one, None).is_ok());
        assert!(check(&one, Some(MAX_DIMENSIONS)).is_ok());
        assert!(check(&[], None).is_err());
        assert!(check(&["a".to_owned(), String::new()], None).is_err());
        assert!(check(&vec!["a".to_owned(); MAX_INPUTS + 1], None).is_err());
        assert!(check(&one, Some(0)).is_err());
        assert!(check(&one, Some(MAX_DIMENSIONS + 1)).is_err());
    }
}
