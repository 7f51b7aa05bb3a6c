//! The `gateway` binary.

mod accounts;
mod admin;
mod api;
mod auth;
mod config;
mod error;
mod ids;
mod ledger;
mod limits;
mod providers;
mod routing;
mod serve;
mod standalone;
mod state;
mod tokens;
mod turn;
mod validate;
mod wire;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use config::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Standalone(args) => standalone::run(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
