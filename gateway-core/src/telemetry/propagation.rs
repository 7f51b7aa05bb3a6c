//! W3C trace context in and out: the incoming `traceparent`/`tracestate` headers become the
//! request span's parent, and [`upstream_headers`] gives the provider adapters the headers that
//! continue the trace at the upstream.

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::Context;
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct Incoming<'a>(&'a HeaderMap);

impl Extractor for Incoming<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct Outgoing(Vec<(String, String)>);

impl Injector for Outgoing {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

pub fn extract(headers: &HeaderMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&Incoming(headers)))
}

/// The trace-context headers (`traceparent`, `tracestate`) an upstream call made in the
/// current span should carry; empty when tracing is off.
pub fn upstream_headers() -> Vec<(String, String)> {
    let context = tracing::Span::current().context();
    let mut out = Outgoing(Vec::new());
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&context, &mut out));
    out.0
}
