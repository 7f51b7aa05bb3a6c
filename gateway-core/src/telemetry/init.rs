//! Logging and tracing set-up for the whole process: log lines to stderr (text or JSON), and
//! spans exported over OTLP/HTTP when the standard `OTEL_*` variables ask for it.
//!
//! The OTLP exporter is on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not `true`, nor
//! `OTEL_TRACES_EXPORTER` `none`); the exporter itself reads the rest
//! (`OTEL_EXPORTER_OTLP_PROTOCOL` = `http/protobuf` or `http/json`, `..._HEADERS`,
//! `..._TIMEOUT`), the SDK the `OTEL_BSP_*` batch settings, `OTEL_TRACES_SAMPLER*`,
//! `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`. Incoming W3C `traceparent` headers are
//! honoured either way.

use std::io::IsTerminal;

use clap::ValueEnum;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use thiserror::Error;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Debug, Error)]
pub enum TelemetryError {
    #[error("OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0} is not supported; use http/protobuf or http/json")]
    Protocol(String),
    #[error("logging already set up: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Flushes the spans still buffered when dropped at exit.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub async fn shutdown(self) {
        if let Some(provider) = self.provider {
            // The exporter's HTTP client blocks; keep it off the async workers.
            let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(e)) = flushed {
                tracing::warn!(error = %e, "could not flush the last spans");
            }
        }
    }
}

const DEFAULT_SERVICE_NAME: &str = "svc-gateway";

/// The format chosen at start, for what the process writes outside the log layer (the ready
/// line), so that a collector reading stdout and stderr together sees one format.
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// The log format chosen at start (text until [`init`] runs).
pub fn log_format() -> LogFormat {
    FORMAT.get().copied().unwrap_or_default()
}

pub fn init(format: LogFormat) -> Result<Telemetry, TelemetryError> {
    let _ = FORMAT.set(format);
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = if otlp_requested() {
        Some(tracer_provider()?)
    } else {
        None
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = match format {
        // Colours only for a person at a terminal: a pod's log, a file or a collector would
        // get escape codes in every line, and writing them was 3 % of a proxied turn's work.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(false)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    // Spans are exported whatever RUST_LOG says of log lines: the filter is on the log layer.
    let spans = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("gateway"))
            .with_filter(EnvFilter::new("gateway=info"))
    });
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .try_init()?;
    Ok(Telemetry { provider })
}

fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
}

fn otlp_requested() -> bool {
    let endpoint = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty()));
    endpoint && !env_is("OTEL_SDK_DISABLED", "true") && !env_is("OTEL_TRACES_EXPORTER", "none")
}

fn tracer_provider() -> Result<SdkTracerProvider, TelemetryError> {
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    if !matches!(protocol.trim(), "" | "http/protobuf" | "http/json") {
        return Err(TelemetryError::Protocol(protocol));
    }
    let exporter = SpanExporter::builder().with_http().build()?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}
