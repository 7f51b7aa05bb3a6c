//! The `gateway` binary.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use gateway::config::{Cli, Command};
use gateway::startup;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Standalone(args) => startup::standalone(args).await,
        Command::Serve(args) => startup::cluster(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
