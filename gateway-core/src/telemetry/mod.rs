//! Observability: Prometheus metrics (served on the admin listener), tracing spans exported
//! over OTLP (one per request, keyed by the message id the client sees), trace-context
//! propagation, and the process's log output.

pub mod init;
pub mod metrics;
pub mod propagation;
pub mod request;
pub mod turn_spans;

pub use init::{init, log_format, LogFormat, Telemetry};
pub use propagation::upstream_headers;
pub use turn_spans::TurnTelemetry;
