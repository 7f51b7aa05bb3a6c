//! The `gateway` binary.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use gateway::config::{Cli, Command};
use gateway::{cli, startup};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result: Result<(), Box<dyn std::error::Error>> = match Cli::parse().command {
        Command::Standalone(args) => startup::standalone(args).await.map_err(Into::into),
        Command::Serve(args) => startup::cluster(args).await.map_err(Into::into),
        Command::Migrate(args) => cli::migrate(args).await.map_err(Into::into),
        Command::Keys(command) => cli::keys(command).await.map_err(Into::into),
        Command::Accounts(command) => cli::accounts(command).await.map_err(Into::into),
        Command::Messages(command) => cli::messages(command).await.map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
