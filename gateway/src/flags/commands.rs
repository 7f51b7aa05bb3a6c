//! The operator commands against the database of cluster mode (`gateway keys|accounts|
//! messages`); each makes `--database-url` required, since it has nothing to work on without.

use std::path::PathBuf;

use clap::Subcommand;
use crds::config::SCOPES;

use super::database::{DatabaseArgs, URL};
use super::ledger::RetentionArgs;
use super::payments::CreditRateArgs;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Creates a key for an existing account (by id) or a new one (by name); prints the
    /// secret once.
    #[command(mut_arg(URL, |a| a.required(true)))]
    Create {
        #[command(flatten)]
        db: DatabaseArgs,
        /// The existing account's id (acct_…, shown on its owner's dashboard). Never a name: a
        /// stranger may have signed up under any name.
        #[arg(
            long,
            required_unless_present = "new_account",
            conflicts_with = "new_account"
        )]
        account: Option<String>,
        /// Creates an account of this name for the key; refused when the name is taken.
        #[arg(long)]
        new_account: Option<String>,
        /// Grants the key the enterprise tier (custom limits via its ApiKey resource). Without
        /// it the key starts at the tier its account's confirmed lifetime top-up gives (by the
        /// Tier manifests in --manifests) and only the promotion sweep moves it.
        #[arg(long)]
        enterprise: bool,
        /// Folder of the Tier manifests that set the starting tier; the example tiers built
        /// into the binary without it.
        #[arg(long, env = "GATEWAY_MANIFESTS")]
        manifests: Option<PathBuf>,
        /// When the key stops working (RFC 3339, e.g. 2027-01-31T00:00:00Z); default never.
        #[arg(long, value_parser = rfc3339)]
        expires_at: Option<time::OffsetDateTime>,
        /// Credits the key may spend per UTC month; default no cap.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        spend_cap: Option<u64>,
        /// apiCredits granted to the new account (not a top-up).
        #[arg(long, conflicts_with = "account")]
        credits: Option<u64>,
        #[arg(long, value_enum, default_value = "api")]
        kind: KindArg,
        /// Surfaces the key may use (messages, chat, responses, models, account); none: all.
        #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(SCOPES))]
        scopes: Vec<String>,
        #[arg(long, default_value = "key")]
        name: String,
    },
    /// Revokes a key by id.
    #[command(mut_arg(URL, |a| a.required(true)))]
    Revoke {
        #[command(flatten)]
        db: DatabaseArgs,
        id: String,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum KindArg {
    Api,
    Cli,
}

#[derive(Debug, Subcommand)]
pub enum AccountsCommand {
    /// Confirms a top-up; idempotent by payment reference.
    #[command(mut_arg(URL, |a| a.required(true)))]
    Topup {
        #[command(flatten)]
        db: DatabaseArgs,
        /// The account's id (acct_…, shown on its owner's dashboard), never its name.
        #[arg(long)]
        account: String,
        /// US dollars, e.g. 25 or 25.50 ($10 to $10,000).
        #[arg(long)]
        usd: String,
        /// The payment's unique reference.
        #[arg(long)]
        reference: String,
        #[command(flatten)]
        rate: CreditRateArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum MessagesCommand {
    /// Prints the ledger row of a message as JSON.
    #[command(mut_arg(URL, |a| a.required(true)))]
    Show {
        #[command(flatten)]
        db: DatabaseArgs,
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Exports each UTC day of ledger rows as a Parquet file with a JSON manifest (rows, sum
    /// of `billed`, size, SHA-256), verified by reading it back; a day exported again is
    /// only verified when its manifest already matches. Prints the manifests as JSON.
    #[command(mut_arg(URL, |a| a.required(true)))]
    #[command(group(clap::ArgGroup::new("destination").required(true).args(["to_dir", "to_s3"])))]
    Export {
        #[command(flatten)]
        db: DatabaseArgs,
        /// The first day (UTC), e.g. 2026-11-01.
        #[arg(long, value_parser = day)]
        from: time::Date,
        /// The last day (UTC), included; a day not final yet is refused.
        #[arg(long, value_parser = day)]
        to: time::Date,
        /// No turn runs longer (as `serve`'s flag): a day is final, and exported, once it has
        /// been over this long.
        #[arg(long, env = "GATEWAY_REAPER_MAX_TURN_SECS", default_value_t = 3_600)]
        reaper_max_turn_secs: u64,
        /// A folder (made when missing).
        #[arg(long)]
        to_dir: Option<PathBuf>,
        /// A bucket and prefix, `s3://bucket/prefix`; credentials and region from the usual
        /// AWS_* variables.
        #[arg(long)]
        to_s3: Option<String>,
        /// An S3-compatible server's URL (default: AWS_ENDPOINT, else AWS itself).
        #[arg(long, env = "GATEWAY_S3_ENDPOINT", requires = "to_s3")]
        s3_endpoint: Option<String>,
    },
    /// Runs the ledger's retention once, as `serve` does hourly: each day older than
    /// --ledger-retention-days is exported to the archive, verified, then dropped. Prints
    /// what it dropped, kept and why, as JSON.
    #[command(mut_arg(URL, |a| a.required(true)))]
    #[command(group(clap::ArgGroup::new("mode").required(true).args(["dry_run", "now"])))]
    Retain {
        #[command(flatten)]
        db: DatabaseArgs,
        #[command(flatten)]
        retention: RetentionArgs,
        /// As `serve`'s flag: a day is final once it has been over this long.
        #[arg(long, env = "GATEWAY_REAPER_MAX_TURN_SECS", default_value_t = 3_600)]
        reaper_max_turn_secs: u64,
        /// Lists the days due, changes nothing.
        #[arg(long)]
        dry_run: bool,
        /// Exports, verifies and drops the days due now.
        #[arg(long)]
        now: bool,
    },
}

fn day(value: &str) -> Result<time::Date, String> {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(value, &format).map_err(|e| format!("expected a day like 2026-11-01: {e}"))
}

fn rfc3339(value: &str) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("expected an RFC 3339 time like 2027-01-31T00:00:00Z: {e}"))
}
