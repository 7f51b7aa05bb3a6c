//! The `vertex` adapter: Claude on Google Vertex AI through `:streamRawPredict`
//! (`POST {base_url}/v1/projects/{project}/locations/{region}/publishers/anthropic/models/
//! {model}:streamRawPredict`), with a Google OAuth access token as the bearer
//! (`google_auth`). The body is the `anthropic` adapter's Messages body
//! (`wire::anthropic::translate`) without `model`, which the path names, and with
//! `anthropic_version: vertex-2023-10-16`; the answer is the Messages API's own server-sent
//! events, read by the `anthropic` adapter's decoder. Only the endpoint, the token and the
//! meaning of Vertex's statuses are Vertex's.
//!
//! As every adapter, it always asks for a stream (`:rawPredict`, the JSON answer, is never
//! needed: a non-streaming client's answer is gathered from the same events).

use std::sync::Arc;

use async_trait::async_trait;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::StatusCode;
use serde_json::Value;

use super::anthropic;
use super::google_auth::Tokens;
use super::http::{self, Clients, Framing};
use super::{EventStream, Provider, ProviderCall, ProviderError};
use crds::config::Upstream;

/// The Messages API version Vertex AI's Claude models take, in the body.
const ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// A model id (`claude-sonnet-4@20250514`) stays one path segment: everything but RFC 3986's
/// unreserved characters and the `@` of its version is escaped.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'@');

#[derive(Default)]
pub struct Vertex {
    clients: Clients,
    tokens: Arc<Tokens>,
}

#[async_trait]
impl Provider for Vertex {
    async fn start(&self, call: ProviderCall) -> Result<EventStream, ProviderError> {
        let upstream = &call.upstream;
        let (Some(project), Some(region)) =
            (upstream.project.as_deref(), upstream.region.as_deref())
        else {
            tracing::error!(upstream = %upstream.name, "vertex upstream without a project or region");
            return Err(ProviderError::Unavailable);
        };
        let url = format!(
            "{}/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{}:streamRawPredict",
            endpoint(upstream, region),
            utf8_percent_encode(&upstream.model, SEGMENT)
        );
        let body = body(&call)?;
        let source = Tokens::source(upstream);
        let token = self.tokens.token(&source, upstream.timeouts).await?;
        let (client, upstream_call) = self.clients.get(upstream)?;
        let request = client
            .post(url)
            .bearer_auth(token.expose())
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body);
        let tokens = self.tokens.clone();
        http::open_mapping(
            request,
            upstream_call,
            upstream.timeouts,
            Framing::Sse,
            anthropic::Stream::default(),
            move |status| statuses(status, || tokens.forget(&source, &token)),
        )
        .await
    }
}

/// The route's `baseUrl` (a Private Service Connect endpoint, a test server), else the
/// region's public endpoint (`global` has no region in its host).
fn endpoint(upstream: &Upstream, region: &str) -> String {
    match upstream.base_url.as_deref() {
        Some(base) => base.trim_end_matches('/').to_owned(),
        None if region == "global" => "https://aiplatform.googleapis.com".to_owned(),
        None => format!("https://{region}-aiplatform.googleapis.com"),
    }
}

/// Vertex's statuses in the words `http::status_error` reads: its 503 (`UNAVAILABLE`, the
/// model's capacity) is an overload as the Messages API's 529 is, so the breaker and the
/// fallback treat both alike (its 429 `RESOURCE_EXHAUSTED`, a quota, already is one). A 401
/// means the token was refused (revoked, or expired early): it is forgotten, so the next turn
/// fetches another instead of failing until it expires.
fn statuses(status: StatusCode, forget: impl FnOnce()) -> StatusCode {
    match status {
        StatusCode::SERVICE_UNAVAILABLE => StatusCode::from_u16(529).unwrap_or(status),
        StatusCode::UNAUTHORIZED => {
            forget();
            status
        }
        _ => status,
    }
}

/// The Messages body as Vertex takes it: the model is in the path. The client's
/// `anthropic-beta` features are not sent: Vertex refuses a beta it does not offer, which
/// would fail turns the Messages API serves.
pub(super) fn body(call: &ProviderCall) -> Result<Vec<u8>, ProviderError> {
    let mut body = match serde_json::to_value(anthropic::body(call)) {
        Ok(Value::Object(body)) => body,
        other => {
            tracing::error!(?other, "the Messages body is not an object");
            return Err(ProviderError::Upstream);
        }
    };
    body.remove("model");
    body.insert("anthropic_version".to_owned(), ANTHROPIC_VERSION.into());
    serde_json::to_vec(&body).map_err(|e| {
        tracing::error!(error = %e, "cannot serialize the Vertex body");
        ProviderError::Upstream
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_id_with_its_version_is_one_path_segment() {
        let encode = |id: &str| utf8_percent_encode(id, SEGMENT).to_string();
        assert_eq!(
            encode("claude-sonnet-4@20250514"),
            "claude-sonnet-4@20250514"
        );
        assert_eq!(encode("a/b:c"), "a%2Fb%3Ac");
    }

    #[test]
    fn the_default_endpoint_is_the_regions_and_global_has_none_in_its_host() {
        let upstream = |base_url: Option<&str>| Upstream {
            name: "v".into(),
            provider: crds::config::ProviderKind::Vertex,
            model: "m".into(),
            base_url: base_url.map(str::to_owned),
            api_version: None,
            region: None,
            aws_credentials: None,
            project: None,
            google_credentials: None,
            api_key: None,
            weight: 1,
            timeouts: crds::config::Timeouts::default(),
            http2: false,
            chunk_delay_ms: 0,
        };
        assert_eq!(
            endpoint(&upstream(None), "us-east5"),
            "https://us-east5-aiplatform.googleapis.com"
        );
        assert_eq!(
            endpoint(&upstream(None), "global"),
            "https://aiplatform.googleapis.com"
        );
        assert_eq!(
            endpoint(&upstream(Some("http://127.0.0.1:9/")), "global"),
            "http://127.0.0.1:9"
        );
    }

    #[test]
    fn a_503_is_an_overload_and_a_401_forgets_the_token() {
        let mut forgotten = 0;
        assert_eq!(
            statuses(StatusCode::SERVICE_UNAVAILABLE, || forgotten += 1).as_u16(),
            529
        );
        assert_eq!(
            statuses(StatusCode::TOO_MANY_REQUESTS, || forgotten += 1),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(forgotten, 0);
        assert_eq!(
            statuses(StatusCode::UNAUTHORIZED, || forgotten += 1),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(forgotten, 1);
    }
}
