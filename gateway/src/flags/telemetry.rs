//! How the process logs (traces follow the standard `OTEL_*` variables, read by
//! `telemetry::init`).

use clap::Args;

use gateway_core::telemetry::LogFormat;

#[derive(Debug, Args)]
pub struct TelemetryArgs {
    /// Log lines as text or as one JSON object per line; neither ever holds a key, a prompt
    /// or a completion.
    #[arg(
        long,
        global = true,
        env = "GATEWAY_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}
