//! The operator commands of the `gateway` binary, against the database of cluster mode:
//! `migrate`, `keys create|revoke`, `accounts topup`, `messages show`, `ledger export|retain`. Each
//! prints JSON on stdout, so scripts and tests can read it.

use serde_json::{json, Value};
use thiserror::Error;

use crate::flags::commands::{
    AccountsCommand, KeysCommand, KindArg, LedgerCommand, MessagesCommand,
};
use crate::flags::database::DatabaseArgs;
use gateway_core::auth::{self, KeySpec};
use gateway_core::ledger_export::retention::{retain, RetentionError};
use gateway_core::ledger_export::{self, Destination, ExportError};
use gateway_core::payments::{self, PaymentError, TopUpRequest};
use store::accounts::promotion::{standing, ENTERPRISE};
use store::accounts::{Account, Accounts, KeyKind, PostgresAccounts, StoreError};
use store::audit::{Actor, ActorKind};
use store::db::{Database, DbError};
use store::developers::{owner_verified, PostgresDeveloperStore};
use store::ledger::{Ledger, LedgerError, PostgresLedger};

#[derive(Debug, Error)]
pub enum CliError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Payment(#[from] PaymentError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error(transparent)]
    Retention(#[from] RetentionError),
    #[error("{0}")]
    Usage(String),
}

/// The commands make `--database-url` required, so clap has refused a command line without it.
fn connect(args: &DatabaseArgs) -> Result<Database, CliError> {
    let settings = args
        .settings()
        .ok_or_else(|| CliError::Usage("--database-url is required".to_owned()))?;
    Ok(Database::connect_with(&settings)?)
}

/// The account `id`, when it may take keys and credits from the operator: it exists, and it
/// is not a dashboard account whose email is unverified (anyone can sign up as anyone).
async fn existing_account(db: &Database, id: &str) -> Result<Account, CliError> {
    let account = PostgresAccounts::new(db.clone())
        .account(id)
        .await?
        .ok_or_else(|| {
            CliError::Usage(format!(
                "account `{id}` does not exist; pass the id (acct_…) its owner's dashboard shows"
            ))
        })?;
    let developers = PostgresDeveloperStore::new(db.clone());
    if !owner_verified(&developers, &account.id).await? {
        return Err(CliError::Usage(format!(
            "account `{id}` belongs to a dashboard user whose email is not verified yet; it \
             takes no keys or credits until its owner follows the link sent to it"
        )));
    }
    Ok(account)
}

/// A new account named `name` with `credits` added; never an existing one.
async fn new_account(db: &Database, name: &str, credits: u64) -> Result<Account, CliError> {
    let created = PostgresAccounts::new(db.clone())
        .create_account(name)
        .await
        .map_err(|e| match e {
            StoreError::Conflict(_) => CliError::Usage(format!(
                "an account named `{name}` exists; to key or credit an existing account, pass \
                 its id with --account acct_… (its owner's dashboard shows it)"
            )),
            other => other.into(),
        })?;
    PostgresLedger::new(db.clone())
        .add_credits(&created.id, credits, &cli_actor())
        .await?;
    Ok(created)
}

/// Whoever runs the command, as the audit log names them: the login of the shell (`cli` when
/// it has none); the command line has no other identity than access to the database.
fn cli_actor() -> Actor {
    let login = std::env::var("USER").unwrap_or_else(|_| "cli".to_owned());
    Actor::new(ActorKind::Cli, login, None)
}

fn print(value: Value) {
    println!("{value}");
}

pub async fn migrate(args: DatabaseArgs) -> Result<(), CliError> {
    connect(&args)?.migrate().await?;
    print(json!({ "migrated": true }));
    Ok(())
}

pub async fn keys(command: KeysCommand) -> Result<(), CliError> {
    match command {
        KeysCommand::Create {
            db,
            account,
            new_account,
            enterprise,
            manifests,
            expires_at,
            spend_cap,
            credits,
            kind,
            scopes,
            name,
        } => {
            auth::check_expiry(expires_at, time::OffsetDateTime::now_utc())
                .map_err(|e| CliError::Usage(format!("--expires-at: {e}")))?;
            let db = connect(&db)?;
            let accounts = PostgresAccounts::new(db.clone());
            let account = match (account, new_account) {
                (Some(id), _) => existing_account(&db, &id).await?,
                (None, Some(name)) => self::new_account(&db, &name, credits.unwrap_or(0)).await?,
                (None, None) => {
                    return Err(CliError::Usage(
                        "pass --account acct_… or --new-account NAME".to_owned(),
                    ))
                }
            };
            let tier = if enterprise {
                ENTERPRISE.to_owned()
            } else {
                let config = crate::manifests::load(manifests.as_deref())
                    .map_err(|e| CliError::Usage(format!("--manifests: {e}")))?;
                let lifetime = PostgresLedger::new(db)
                    .balance(&account.id)
                    .await?
                    .lifetime_top_up_cents;
                standing(&config.tiers, lifetime).tier
            };
            let minted = auth::mint(KeySpec {
                id: None,
                account_id: account.id,
                name,
                kind: match kind {
                    KindArg::Api => KeyKind::Api,
                    KindArg::Cli => KeyKind::Cli,
                },
                scopes,
                tier,
                secret: None,
                expires_at,
                spend_cap,
            });
            accounts
                .insert_key(minted.record.clone(), &cli_actor())
                .await?;
            let mut out = json!(minted.record);
            out["key"] = json!(minted.secret);
            print(out);
        }
        KeysCommand::Revoke { db, id } => {
            let key = PostgresAccounts::new(connect(&db)?)
                .revoke_key(&id, &cli_actor())
                .await?
                .ok_or_else(|| CliError::Usage(format!("key `{id}` does not exist")))?;
            print(json!({ "id": key.id, "revoked": true }));
        }
    }
    Ok(())
}

pub async fn accounts(command: AccountsCommand) -> Result<(), CliError> {
    let AccountsCommand::Topup {
        db,
        account,
        usd,
        reference,
        rate,
    } = command;
    let usd_cents = payments::parse_usd(&usd).ok_or_else(|| {
        CliError::Usage(format!(
            "--usd: expected dollars like 25 or 25.50, not `{usd}`"
        ))
    })?;
    let db = connect(&db)?;
    let account = existing_account(&db, &account).await?;
    let accounts = PostgresAccounts::new(db.clone());
    let ledger = PostgresLedger::new(db);
    let request = TopUpRequest {
        account_id: &account.id,
        reference: &reference,
        usd_cents,
        payment_id: None,
        by: &cli_actor(),
    };
    let confirmation = payments::confirm(&accounts, &ledger, rate.credits_per_usd, request).await?;
    let balance = ledger.balance(&account.id).await?;
    let mut out = json!(confirmation.top_up);
    out["replayed"] = json!(!confirmation.first);
    out["balance"] = json!(balance.balance);
    out["lifetime_top_up_cents"] = json!(balance.lifetime_top_up_cents);
    print(out);
    Ok(())
}

pub async fn messages(command: MessagesCommand) -> Result<(), CliError> {
    let MessagesCommand::Show { db, id } = command;
    let record = PostgresLedger::new(connect(&db)?)
        .message(&id)
        .await?
        .ok_or_else(|| CliError::Usage(format!("message `{id}` is not in the ledger")))?;
    print(json!(record));
    Ok(())
}

pub async fn ledger(command: LedgerCommand) -> Result<(), CliError> {
    match command {
        LedgerCommand::Export {
            db,
            from,
            to,
            reaper_max_turn_secs,
            to_dir,
            to_s3,
            s3_endpoint,
        } => {
            let destination = match (to_dir, to_s3) {
                (Some(dir), _) => Destination::Dir(dir),
                (None, Some(url)) => Destination::S3 {
                    url,
                    endpoint: s3_endpoint,
                },
                (None, None) => {
                    return Err(CliError::Usage(
                        "pass --to-dir PATH or --to-s3 s3://bucket/prefix".to_owned(),
                    ))
                }
            };
            let longest_turn = std::time::Duration::from_secs(reaper_max_turn_secs);
            export(&db, destination, (from, to), longest_turn).await
        }
        LedgerCommand::Retain {
            db,
            retention,
            reaper_max_turn_secs,
            dry_run,
            now: _,
        } => {
            let longest_turn = std::time::Duration::from_secs(reaper_max_turn_secs);
            let retention = retention.retention(longest_turn);
            let now = time::OffsetDateTime::now_utc();
            let retained = retain(&connect(&db)?, &retention, now, dry_run).await?;
            print(json!(retained));
            Ok(())
        }
    }
}

async fn export(
    db: &DatabaseArgs,
    destination: Destination,
    (from, to): (time::Date, time::Date),
    longest_turn: std::time::Duration,
) -> Result<(), CliError> {
    if from > to {
        return Err(CliError::Usage(format!("--from {from} is after --to {to}")));
    }
    let target = destination.open()?;
    let exported =
        ledger_export::export_days(&connect(db)?, &target, (from, to), longest_turn).await?;
    print(json!({ "destination": destination.to_string(), "days": exported }));
    Ok(())
}
