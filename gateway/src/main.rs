//! The `gateway` binary.

use std::process::ExitCode;

use clap::Parser;

use gateway::config::{Cli, Command};
use gateway::{startup, telemetry};

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
    let result = match cli.command {
        Command::Standalone(args) => startup::standalone(args).await,
        Command::Serve(args) => startup::cluster(args).await,
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
