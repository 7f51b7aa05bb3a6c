//! The `gateway` binary.

use std::process::ExitCode;

use clap::Parser;

use gateway::config::{Cli, Command};
use gateway::{cli, startup, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = match telemetry::init(cli.log_format) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), Box<dyn std::error::Error>> = match cli.command {
        Command::Standalone(args) => startup::standalone(args).await.map_err(Into::into),
        Command::Serve(args) => startup::cluster(args).await.map_err(Into::into),
        Command::Migrate(args) => cli::migrate(args).await.map_err(Into::into),
        Command::Keys(command) => cli::keys(command).await.map_err(Into::into),
        Command::Accounts(command) => cli::accounts(command).await.map_err(Into::into),
        Command::Messages(command) => cli::messages(command).await.map_err(Into::into),
    };
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway: {e}");
            ExitCode::FAILURE
        }
    }
}
