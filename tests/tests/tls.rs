//! TLS to the stores: a gateway verifies Postgres' and Redis' certificates against the CA it
//! is given, and refuses to start, naming the store, on one it cannot verify (another CA,
//! another host, no client certificate where Redis demands one) rather than falling back to
//! plaintext; a TLS-only Postgres (`hostssl`) refuses plaintext, so the suites run on
//! `start_tls` servers are over TLS. Turns over TLS stores: ledger_concurrency,
//! ledger_faults, and cluster_limits (a Redis Cluster over TLS among them).

use std::path::Path;
use std::time::Duration;

use e2e::gateway::{gateway_bin, workspace_root};
use e2e::redis::TLS_USER;
use e2e::*;

/// Long enough for a debug build to start and fail; a process still running then has not
/// refused what it should have.
const EXIT_WITHIN: Duration = Duration::from_secs(90);

/// `gateway ARGS` run to its end: whether it succeeded, and its stderr.
async fn run(args: &[String]) -> (bool, String) {
    let out = tokio::time::timeout(
        EXIT_WITHIN,
        tokio::process::Command::new(gateway_bin())
            .args(args)
            .current_dir(workspace_root())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("gateway {args:?} still ran after {EXIT_WITHIN:?}"))
    .expect("run the gateway binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// `gateway serve` on `redis_url` with the cluster manifests and `extra`.
async fn serve(redis_url: &str, extra: &[&str]) -> (bool, String) {
    let manifests = ManifestDir::cluster();
    let mut args = strings(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--admin-token",
        ADMIN_TOKEN,
        "--redis-url",
        redis_url,
        "--manifests",
        path(&manifests.path),
    ]);
    args.extend(strings(extra));
    run(&args).await
}

fn migrate(url: &str, extra: &[&str]) -> Vec<String> {
    let mut args = strings(&["migrate", "--database-url", url]);
    args.extend(strings(extra));
    args
}

/// The failure of a refused certificate, naming the store, and never the URL's password.
fn assert_refused(what: &str, (ok, stderr): &(bool, String), store: &str, reason: &str) {
    assert!(!ok, "{what} succeeded");
    assert!(
        stderr.contains(&format!("{store}: TLS: ")),
        "{what}: the error does not name {store}'s TLS: {stderr}"
    );
    assert!(stderr.contains(reason), "{what}: not {reason}: {stderr}");
    for secret in ["pw-never-shown", TLS_USER.1] {
        assert!(
            !stderr.contains(secret),
            "{what}: the password shows: {stderr}"
        );
    }
}

#[tokio::test]
async fn a_tls_only_postgres_refuses_plaintext_and_migrates_over_verified_tls() {
    let pg = PostgresServer::start_tls().await;
    let (ok, stderr) = run(&migrate(&pg.plaintext_url(), &[])).await;
    assert!(
        !ok,
        "migrate in plaintext succeeded against a hostssl-only Postgres"
    );
    assert!(stderr.contains("pg_hba.conf"), "{stderr}");
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM pg_tables WHERE tablename = '_sqlx_migrations'")
            .await,
        0
    );

    let (ok, stderr) = run(&migrate(&pg.url(), &[])).await;
    assert!(
        ok,
        "migrate over TLS (sslmode=verify-full): {stderr}\n{}",
        pg.logs()
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM pg_tables WHERE tablename = '_sqlx_migrations'")
            .await,
        1
    );
}

#[tokio::test]
async fn migrate_refuses_a_postgres_certificate_of_another_ca_naming_postgres() {
    let pg = PostgresServer::start_tls().await;
    let tls = pg.tls().expect("a TLS server");
    // No sslmode in the URL: the CA file alone asks for verification.
    let url = format!(
        "postgres://postgres:pw-never-shown@127.0.0.1:{}/postgres",
        pg.port
    );
    let refused = run(&migrate(&url, &["--database-ca-file", path(&tls.wrong_ca)])).await;
    assert_refused(
        "migrate trusting another CA",
        &refused,
        "postgres",
        "UnknownIssuer",
    );

    let (ok, stderr) = run(&migrate(&url, &["--database-ca-file", path(&tls.ca)])).await;
    assert!(ok, "migrate trusting the server's CA: {stderr}");
}

#[tokio::test]
async fn migrate_shows_its_client_certificate_to_a_postgres_with_certificate_authentication() {
    let pg = PostgresServer::start_tls_cert_auth().await;
    let tls = pg.tls().expect("a TLS server");
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full",
        pg.port
    );
    let (ok, stderr) = run(&migrate(&url, &["--database-ca-file", path(&tls.ca)])).await;
    assert!(
        !ok,
        "migrate without a client certificate succeeded against `hostssl … cert`"
    );
    // Postgres' own refusal (authentication, after the handshake), passed on.
    assert!(
        stderr.contains("requires a valid client certificate"),
        "{stderr}"
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM pg_tables WHERE tablename = '_sqlx_migrations'")
            .await,
        0
    );

    let with_certificate = [
        "--database-ca-file",
        path(&tls.ca),
        "--database-client-cert-file",
        path(&tls.client_cert),
        "--database-client-key-file",
        path(&tls.client_key),
    ];
    let (ok, stderr) = run(&migrate(&url, &with_certificate)).await;
    assert!(
        ok,
        "migrate with the client certificate: {stderr}\n{}",
        pg.logs()
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM pg_tables WHERE tablename = '_sqlx_migrations'")
            .await,
        1
    );
}

#[tokio::test]
async fn migrate_refuses_a_postgres_certificate_for_another_host() {
    let pg = PostgresServer::start_tls_for(&["localhost"]).await;
    let tls = pg.tls().expect("a TLS server");
    let url = |host: &str| format!("postgres://postgres@{host}:{}/postgres", pg.port);
    let ca = ["--database-ca-file", path(&tls.ca)];
    let refused = run(&migrate(&url("127.0.0.1"), &ca)).await;
    assert_refused(
        "migrate to a host the certificate does not name",
        &refused,
        "postgres",
        "not valid for name",
    );

    let (ok, stderr) = run(&migrate(&url("localhost"), &ca)).await;
    assert!(ok, "migrate to the host the certificate names: {stderr}");
}

#[tokio::test]
async fn serve_refuses_a_postgres_certificate_of_another_ca_naming_postgres() {
    let redis = RedisServer::start().await;
    let pg = PostgresServer::start_tls().await;
    let tls = pg.tls().expect("a TLS server");
    let url = format!(
        "postgres://postgres:pw-never-shown@127.0.0.1:{}/postgres",
        pg.port
    );
    let refused = serve(
        &redis.url(),
        &[
            "--database-url",
            &url,
            "--database-ca-file",
            path(&tls.wrong_ca),
        ],
    )
    .await;
    assert_refused(
        "serve trusting another CA",
        &refused,
        "postgres",
        "UnknownIssuer",
    );
}

/// `serve` on a TLS Redis with these CA and client certificate files.
async fn serve_on_tls_redis(redis: &RedisServer, ca: &Path, client: bool) -> (bool, String) {
    let tls = redis.tls().expect("a TLS server");
    let mut flags = vec!["--redis-ca-file", path(ca)];
    if client {
        flags.extend([
            "--redis-client-cert-file",
            path(&tls.client_cert),
            "--redis-client-key-file",
            path(&tls.client_key),
        ]);
    }
    serve(&redis.url(), &flags).await
}

#[tokio::test]
async fn serve_refuses_a_redis_certificate_of_another_ca_naming_redis() {
    let redis = RedisServer::start_tls().await;
    let tls = redis.tls().expect("a TLS server").clone();
    let refused = serve_on_tls_redis(&redis, &tls.wrong_ca, true).await;
    assert_refused(
        "serve trusting another CA",
        &refused,
        "redis",
        "UnknownIssuer",
    );
}

#[tokio::test]
async fn serve_refuses_a_redis_certificate_for_another_host() {
    let redis = RedisServer::start_tls_for(&["localhost"]).await;
    let tls = redis.tls().expect("a TLS server").clone();
    let refused = serve_on_tls_redis(&redis, &tls.ca, true).await;
    assert_refused(
        "serve to a host the certificate does not name",
        &refused,
        "redis",
        "not valid for name",
    );
}

#[tokio::test]
async fn serve_is_refused_by_a_redis_demanding_a_client_certificate_it_lacks() {
    let redis = RedisServer::start_tls().await;
    let tls = redis.tls().expect("a TLS server").clone();
    let refused = serve_on_tls_redis(&redis, &tls.ca, false).await;
    assert_refused(
        "serve without a client certificate",
        &refused,
        "redis",
        "CertificateRequired",
    );
}

#[tokio::test]
async fn serve_refuses_a_redis_ca_file_with_a_plaintext_url() {
    let tls_redis = RedisServer::start_tls().await;
    let plain = RedisServer::start().await;
    let tls = tls_redis.tls().expect("a TLS server");
    let refused = serve(&plain.url(), &["--redis-ca-file", path(&tls.ca)]).await;
    assert_refused(
        "serve with a CA file and redis://",
        &refused,
        "redis",
        "rediss://",
    );
}

#[tokio::test]
async fn pods_on_tls_stores_serve_and_bill_turns() {
    let pg = PostgresServer::start_tls().await;
    let cluster = Cluster::start_tls(1, |b| b.database(&pg.url())).await;
    let key = cluster.pods[0]
        .new_key(1_000_000, &KeySpec::tier("enterprise"))
        .await;
    let before = cluster.pods[0].balance(&key.secret).await;
    let resp = cluster.pods[0]
        .post_messages(&key.secret, &message("svc/haiku", "hi", 16))
        .await;
    assert_eq!(resp.status, 200, "{resp}\n{}", cluster.logs());
    assert!(
        cluster.pods[0].balance(&key.secret).await < before,
        "the turn was not billed"
    );
    assert_eq!(
        pg.query_i64("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'gateway' AND NOT s.ssl").await,
        0,
        "a gateway connection to Postgres is not over TLS"
    );
    assert!(
        pg.query_i64("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'gateway' AND s.ssl").await > 0,
        "no gateway connection over TLS"
    );
}
