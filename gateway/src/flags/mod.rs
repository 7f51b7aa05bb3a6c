//! Command line and environment, by concern: each file holds one section, a clap `Args`
//! struct flattened into the commands below, and turns it into the plain settings its module
//! takes, so that nothing below the edge knows clap. Each flag has a `GATEWAY_*` variable;
//! secrets (the admin token, the dev key, ...) are never echoed by `--help` from the
//! environment.

pub mod batches;
pub mod breaker;
pub mod catalog;
pub mod commands;
pub mod dashboard;
pub mod database;
pub mod dev_account;
pub mod ledger;
pub mod limits;
pub mod payments;
pub mod published;
pub mod redis;
pub mod responses;
pub mod secrets;
pub mod server;
pub mod telemetry;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use batches::BatchesArgs;
use breaker::BreakerArgs;
use catalog::{CatalogArgs, PublishedArgs};
use commands::{AccountsCommand, KeysCommand, LedgerCommand, MessagesCommand};
use dashboard::DashboardArgs;
use database::{DatabaseArgs, ServeDatabaseArgs};
use dev_account::DevAccountArgs;
use ledger::{LedgerArgs, PromotionArgs};
use limits::{AddressBrakeArgs, OutageArgs};
use payments::PaymentsArgs;
use redis::RedisArgs;
use responses::ResponsesArgs;
use server::ServerArgs;
use telemetry::TelemetryArgs;

#[derive(Debug, Parser)]
#[command(name = "gateway", version, about = "LLM API gateway")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One process, no external services: in-process limits and credits, config from a folder
    /// of manifests, every model on the built-in simulated provider unless routed elsewhere.
    Standalone(Box<StandaloneArgs>),
    /// Cluster mode: rate limits and stream slots shared with every other pod through Redis;
    /// accounts, keys and credits in Postgres with `--database-url` (without it they stay in
    /// process: every pod seeds the same dev key, if given, and manifest keys, with credits of
    /// its own). The two boxed: their flags outweigh the other commands' many times over.
    Serve(Box<ServeArgs>),
    /// Applies the database migrations (embedded in the binary) and exits.
    #[command(mut_arg(database::URL, |a| a.required(true)))]
    Migrate(DatabaseArgs),
    /// API keys in the database.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Accounts in the database.
    #[command(subcommand)]
    Accounts(AccountsCommand),
    /// The message ledger.
    #[command(subcommand)]
    Messages(MessagesCommand),
    /// The ledger's days: their export to Parquet files.
    #[command(subcommand)]
    Ledger(LedgerCommand),
}

#[derive(Debug, Args)]
pub struct StandaloneArgs {
    /// Writes the built-in example manifests into DIR (created if missing; an existing file
    /// is never replaced) and exits: a set to edit and run with `--manifests DIR`.
    #[arg(long, value_name = "DIR")]
    pub print_manifests: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub promotion: PromotionArgs,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub redis: RedisArgs,
    #[command(flatten)]
    pub outage: OutageArgs,
    #[command(flatten)]
    pub published: PublishedArgs,
    #[command(flatten)]
    pub database: ServeDatabaseArgs,
    #[command(flatten)]
    pub ledger: LedgerArgs,
}

/// The sections both modes share.
#[derive(Debug, Args)]
pub struct CommonArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub catalog: CatalogArgs,
    #[command(flatten)]
    pub dev_account: DevAccountArgs,
    #[command(flatten)]
    pub payments: PaymentsArgs,
    #[command(flatten)]
    pub dashboard: DashboardArgs,
    #[command(flatten)]
    pub breaker: BreakerArgs,
    #[command(flatten)]
    pub responses: ResponsesArgs,
    #[command(flatten)]
    pub batches: BatchesArgs,
    #[command(flatten)]
    pub brakes: AddressBrakeArgs,
    /// Secrets `standalone` generated because none was given, shown once on the ready line.
    #[arg(skip)]
    pub generated: Vec<(&'static str, String)>,
}
