//! The `bedrock` adapter: Claude on Amazon Bedrock through `InvokeModelWithResponseStream`
//! (`POST {base_url}/model/{model}/invoke-with-response-stream`, the model id or inference
//! profile escaped as one path segment), signed with SigV4 (service `bedrock`). The body is
//! the `anthropic` adapter's Messages body (`wire::anthropic::translate`) without `model`,
//! `stream` and `metadata`, which Bedrock refuses, and with
//! `anthropic_version: bedrock-2023-05-31`; the answer is an AWS event stream whose chunks
//! are the Messages API's events, decoded by the `anthropic` adapter's own decoder. Only the
//! endpoint, the signing and the framing (`eventstream`) are Bedrock's.
//!
//! As every adapter, it always asks for a stream (the `InvokeModel` JSON answer is never
//! needed: a non-streaming client's answer is gathered from the same events).

use std::time::SystemTime;

use async_trait::async_trait;
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_json::Value;

use super::anthropic;
use super::http::{self, Clients, Decoder, Framing, SseEvent};
use super::{EventStream, Provider, ProviderCall, ProviderError, ProviderEvent};
use crate::wire::anthropic::translate::request_to_messages;
use crds::config::Upstream;
use store::usage::TokenUsage;

/// The Messages API version Bedrock's Claude models take, in the body.
const ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";

/// The SigV4 service name of the Bedrock runtime.
const SERVICE: &str = "bedrock";

/// Everything but RFC 3986's unreserved characters is escaped: a model id's `:` and an
/// inference profile ARN's `/` stay inside their one path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[derive(Default)]
pub struct Bedrock {
    clients: Clients,
}

#[async_trait]
impl Provider for Bedrock {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError> {
        let upstream = &call.upstream;
        let region = upstream.region.as_deref().ok_or_else(|| {
            tracing::error!(upstream = %upstream.name, "bedrock upstream without a region");
            ProviderError::Unavailable
        })?;
        let url = format!(
            "{}/model/{}/invoke-with-response-stream",
            endpoint(upstream, region),
            utf8_percent_encode(&upstream.model, SEGMENT)
        );
        let body = body(&call)?;
        let credentials = credentials(upstream)?;
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/vnd.amazon.eventstream"),
        ];
        let signed = signature(
            &url,
            &headers,
            &body,
            region,
            credentials,
            SystemTime::now(),
        )?;
        let (client, upstream_call) = self.clients.get(upstream)?;
        let mut request = client.post(url);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        for (name, value) in signed {
            request = request.header(name, value);
        }
        http::open(
            request.body(body),
            upstream_call,
            upstream.timeouts,
            Framing::AwsEventStream,
            Stream::default(),
        )
        .await
    }
}

/// The route's `baseUrl` (a VPC endpoint, a test server), else the region's public endpoint.
fn endpoint(upstream: &Upstream, region: &str) -> String {
    match upstream.base_url.as_deref() {
        Some(base) => base.trim_end_matches('/').to_owned(),
        None => format!("https://bedrock-runtime.{region}.amazonaws.com"),
    }
}

/// The Messages body as Bedrock takes it. The client's `anthropic-beta` features are not
/// sent: Bedrock refuses a beta it does not offer, which would fail turns the Messages API
/// serves.
pub(super) fn body(call: &ProviderCall) -> Result<Vec<u8>, ProviderError> {
    let messages = request_to_messages(&call.request, &call.upstream.model);
    let mut body = match serde_json::to_value(&messages) {
        Ok(Value::Object(body)) => body,
        other => {
            tracing::error!(?other, "the Messages body is not an object");
            return Err(ProviderError::Upstream);
        }
    };
    for field in ["model", "stream", "metadata"] {
        body.remove(field);
    }
    body.insert("anthropic_version".to_owned(), ANTHROPIC_VERSION.into());
    serde_json::to_vec(&body).map_err(|e| {
        tracing::error!(error = %e, "cannot serialize the Bedrock body");
        ProviderError::Upstream
    })
}

/// The route's Secret, else the standard environment variables, read at each call (a
/// process's environment does not change, and a rotated Secret comes with a new config).
fn credentials(upstream: &Upstream) -> Result<Credentials, ProviderError> {
    if let Some(keys) = &upstream.aws_credentials {
        return Ok(Credentials::new(
            keys.access_key_id.expose(),
            keys.secret_access_key.expose(),
            keys.session_token.as_ref().map(|t| t.expose().to_owned()),
            None,
            "modelroute-secret",
        ));
    }
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => Ok(Credentials::new(
            id,
            secret,
            var("AWS_SESSION_TOKEN"),
            None,
            "environment",
        )),
        _ => {
            tracing::error!(
                upstream = %upstream.name,
                "bedrock upstream without credentials: no awsCredentialsSecretRef and no \
                 AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the environment"
            );
            Err(ProviderError::Unavailable)
        }
    }
}

/// The SigV4 headers (`authorization`, `x-amz-date`, and `x-amz-security-token` for a
/// session's keys) for a POST of `body` to `url` with `headers`, which are signed too (the
/// host is taken from the URL, as the HTTP client sends it).
fn signature(
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    region: &str,
    credentials: Credentials,
    time: SystemTime,
) -> Result<Vec<(&'static str, String)>, ProviderError> {
    let failed = |e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, "cannot sign the Bedrock request");
        ProviderError::Upstream
    };
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| failed(&e))?
        .into();
    let request = SignableRequest::new(
        "POST",
        url,
        headers.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| failed(&e))?;
    let (instructions, _) = sign(request, &params).map_err(|e| failed(&e))?.into_parts();
    let (headers, _) = instructions.into_parts();
    Ok(headers
        .into_iter()
        .map(|h| (h.name(), h.value().to_owned()))
        .collect())
}

/// The `anthropic` decoder, with Bedrock's own count of the turn
/// (`amazon-bedrock-invocationMetrics`, in the last chunk) as the usage when the Messages
/// events reported none.
#[derive(Default)]
pub(super) struct Stream {
    messages: anthropic::Stream,
}

#[derive(Deserialize)]
struct LastChunk {
    #[serde(rename = "amazon-bedrock-invocationMetrics")]
    metrics: Metrics,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metrics {
    #[serde(default)]
    input_token_count: u32,
    #[serde(default)]
    output_token_count: u32,
    #[serde(default)]
    cache_read_input_token_count: u32,
    #[serde(default)]
    cache_write_input_token_count: u32,
}

const METRICS: &[u8] = b"amazon-bedrock-invocationMetrics";

impl Decoder for Stream {
    fn event(&mut self, event: SseEvent) -> Result<Vec<ProviderEvent>, ProviderError> {
        // Only the last chunk carries them: the others are not parsed twice.
        let metrics = memchr::memmem::find(&event.data, METRICS)
            .and_then(|_| serde_json::from_slice::<LastChunk>(&event.data).ok())
            .map(|last| last.metrics);
        let mut events = self.messages.event(event)?;
        if let Some(metrics) = metrics {
            for event in &mut events {
                if let ProviderEvent::Finish { usage, .. } = event {
                    reconcile(usage, &metrics);
                }
            }
        }
        Ok(events)
    }

    fn end(&mut self) -> Result<Vec<ProviderEvent>, ProviderError> {
        self.messages.end()
    }
}

/// The Messages events' usage is billed; Bedrock's metrics stand in when it is empty, and a
/// disagreement is logged (the two come from the same service and should not differ).
fn reconcile(usage: &mut TokenUsage, metrics: &Metrics) {
    if usage.input_tokens == 0 && usage.output_tokens == 0 {
        usage.input_tokens = metrics.input_token_count;
        usage.output_tokens = metrics.output_token_count;
        usage.cache_read_input_tokens = metrics.cache_read_input_token_count;
        usage.cache_creation_input_tokens = metrics.cache_write_input_token_count;
    } else if (usage.input_tokens, usage.output_tokens)
        != (metrics.input_token_count, metrics.output_token_count)
    {
        tracing::debug!(
            input = usage.input_tokens,
            output = usage.output_tokens,
            metrics_input = metrics.input_token_count,
            metrics_output = metrics.output_token_count,
            "bedrock's invocation metrics differ from the stream's usage"
        );
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn feed(stream: &mut Stream, events: &[&str]) -> Vec<ProviderEvent> {
        let mut out = Vec::new();
        for data in events {
            out.extend(
                stream
                    .event(SseEvent {
                        data: Bytes::copy_from_slice(data.as_bytes()),
                    })
                    .expect("a good event"),
            );
        }
        out
    }

    fn finish_usage(events: &[ProviderEvent]) -> TokenUsage {
        match events.last() {
            Some(ProviderEvent::Finish { usage, .. }) => *usage,
            other => panic!("no finish: {other:?}"),
        }
    }

    const STOP_WITH_METRICS: &str = r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":30,"outputTokenCount":8,"invocationLatency":500,"firstByteLatency":200}}"#;

    #[test]
    fn the_stream_usage_is_billed_and_the_invocation_metrics_fill_in_when_it_is_missing() {
        let events = feed(
            &mut Stream::default(),
            &[
                r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}"#,
                STOP_WITH_METRICS,
            ],
        );
        let usage = finish_usage(&events);
        assert_eq!((usage.input_tokens, usage.output_tokens), (12, 7));

        let events = feed(
            &mut Stream::default(),
            &[
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":0}}"#,
                STOP_WITH_METRICS,
            ],
        );
        let usage = finish_usage(&events);
        assert_eq!((usage.input_tokens, usage.output_tokens), (30, 8));
    }

    #[test]
    fn a_model_id_or_an_inference_profile_arn_is_one_path_segment() {
        let encode = |id: &str| utf8_percent_encode(id, SEGMENT).to_string();
        assert_eq!(
            encode("anthropic.claude-sonnet-4-20250514-v1:0"),
            "anthropic.claude-sonnet-4-20250514-v1%3A0"
        );
        assert_eq!(
            encode("arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.x-v1:0"),
            "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.x-v1%3A0"
        );
    }

    #[test]
    fn a_session_token_is_sent_and_signed() {
        let credentials = Credentials::new("AKID", "secret", Some("token".into()), None, "test");
        let headers = signature(
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke-with-response-stream",
            &[("content-type", "application/json")],
            b"{}",
            "us-east-1",
            credentials,
            SystemTime::UNIX_EPOCH,
        )
        .expect("signed");
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(header("x-amz-security-token"), Some("token"));
        assert_eq!(header("x-amz-date"), Some("19700101T000000Z"));
        let authorization = header("authorization").expect("an authorization header");
        assert!(
            authorization.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKID/19700101/us-east-1/bedrock/aws4_request, \
                 SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature="
            ),
            "{authorization}"
        );
    }
}
