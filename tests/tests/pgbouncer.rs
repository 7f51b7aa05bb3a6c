//! The gateway behind PgBouncer in transaction pooling mode (`--database-pooler transaction`):
//! the operator CLI works through it, and migrations, which need a session lock that a
//! transaction pooler cannot hold, are refused with the direct way named. The ledger's
//! concurrency and outage specs through PgBouncer are in `ledger_concurrency.rs` and
//! `ledger_outage.rs` (the `through_pgbouncer_` tests).

use e2e::gateway::{gateway_bin, workspace_root};
use e2e::{PgBouncer, PostgresServer};
use tokio::process::Command;

/// `gateway ARGS --database-url <pgbouncer> --database-pooler transaction`: exit code, stdout,
/// stderr.
async fn through_pooler(bouncer: &PgBouncer, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(gateway_bin())
        .args(args)
        .args(["--database-url", &bouncer.url()])
        .args(["--database-pooler", "transaction"])
        .current_dir(workspace_root())
        .output()
        .await
        .expect("run the gateway");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn through_pgbouncer_migrations_are_refused_naming_the_direct_way_and_the_cli_works() {
    let pg = PostgresServer::start().await;
    let bouncer = PgBouncer::start(&pg).await;

    let (code, _, stderr) = through_pooler(&bouncer, &["migrate"]).await;
    assert_ne!(
        code,
        Some(0),
        "migrate through a transaction pooler: {stderr}"
    );
    assert!(
        stderr.contains("gateway migrate") && stderr.contains("Postgres itself"),
        "the refusal names the way that works: {stderr}"
    );

    let (code, stdout, stderr) = through_pooler(
        &bouncer,
        &[
            "keys",
            "create",
            "--new-account",
            "acme",
            "--credits",
            "1000",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "keys create through PgBouncer: {stderr}");
    let created: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let key_id = created["id"].as_str().expect("key id");
    assert_eq!(
        pg.query(&format!(
            "SELECT count(*) FROM api_keys WHERE id = '{key_id}'"
        ))
        .await,
        "1",
        "{created}"
    );
}
