//! The flags and variables users know (the README, the chart, scripts) keep their names,
//! values and defaults whatever section holds them: each is set to a value other than its
//! default, on the command line and then through its variable, and read back from its section.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;

use super::{Cli, Command, CommonArgs, ServeArgs, StandaloneArgs};
use crate::api::message_batches::BatchSettings;
use gateway_core::limits::OutagePolicy;
use gateway_core::routing::breaker::BreakerPolicy;
use gateway_core::telemetry::LogFormat;
use store::db::Pooler;

/// A flag, its variable, and a value other than its default (`None`: a switch, set).
type Flag = (&'static str, &'static str, Option<&'static str>);

const COMMON: &[Flag] = &[
    ("--listen", "GATEWAY_LISTEN", Some("0.0.0.0:9000")),
    (
        "--admin-listen",
        "GATEWAY_ADMIN_LISTEN",
        Some("0.0.0.0:9001"),
    ),
    (
        "--metrics-listen",
        "GATEWAY_METRICS_LISTEN",
        Some("0.0.0.0:9002"),
    ),
    (
        "--admin-token",
        "GATEWAY_ADMIN_TOKEN",
        Some("admin-token-0123456789"),
    ),
    (
        "--manifests",
        "GATEWAY_MANIFESTS",
        Some("/etc/gateway/manifests"),
    ),
    (
        "--dev-key",
        "GATEWAY_DEV_KEY",
        Some("sk-svc-0123456789abcdefghij"),
    ),
    ("--dev-top-up-usd", "GATEWAY_DEV_TOP_UP_USD", Some("25.50")),
    ("--dev-enterprise", "GATEWAY_DEV_ENTERPRISE", None),
    ("--dev-credits", "GATEWAY_DEV_CREDITS", Some("7")),
    (
        "--simulated-chunk-delay-ms",
        "GATEWAY_SIMULATED_CHUNK_DELAY_MS",
        Some("3"),
    ),
    (
        "--shutdown-grace-secs",
        "GATEWAY_SHUTDOWN_GRACE_SECS",
        Some("11"),
    ),
    (
        "--shutdown-delay-secs",
        "GATEWAY_SHUTDOWN_DELAY_SECS",
        Some("5"),
    ),
    ("--credits-per-usd", "GATEWAY_CREDITS_PER_USD", Some("1000")),
    (
        "--dashboard-secure-cookies",
        "GATEWAY_DASHBOARD_SECURE_COOKIES",
        None,
    ),
    ("--signup-credits", "GATEWAY_SIGNUP_CREDITS", Some("500")),
    (
        "--payment-webhook-secret",
        "GATEWAY_PAYMENT_WEBHOOK_SECRET",
        Some("webhook-secret-0123456789"),
    ),
    (
        "--stripe-api-key",
        "GATEWAY_STRIPE_API_KEY",
        Some("sk_test_123"),
    ),
    (
        "--stripe-webhook-secret",
        "GATEWAY_STRIPE_WEBHOOK_SECRET",
        Some("whsec_123"),
    ),
    (
        "--stripe-api-base",
        "GATEWAY_STRIPE_API_BASE",
        Some("http://127.0.0.1:12111"),
    ),
    (
        "--auto-reload-interval-ms",
        "GATEWAY_AUTO_RELOAD_INTERVAL_MS",
        Some("700"),
    ),
    ("--breaker-failures", "GATEWAY_BREAKER_FAILURES", Some("9")),
    (
        "--breaker-cooldown-ms",
        "GATEWAY_BREAKER_COOLDOWN_MS",
        Some("1500"),
    ),
    (
        "--responses-secret",
        "GATEWAY_RESPONSES_SECRET",
        Some("responses-secret-0123456789"),
    ),
    (
        "--responses-retention-secs",
        "GATEWAY_RESPONSES_RETENTION_SECS",
        Some("3600"),
    ),
    (
        "--responses-capacity",
        "GATEWAY_RESPONSES_CAPACITY",
        Some("12"),
    ),
    (
        "--responses-max-bytes",
        "GATEWAY_RESPONSES_MAX_BYTES",
        Some("4096"),
    ),
    (
        "--batch-concurrency",
        "GATEWAY_BATCH_CONCURRENCY",
        Some("3"),
    ),
    ("--batch-lease-secs", "GATEWAY_BATCH_LEASE_SECS", Some("45")),
    (
        "--batch-expiry-secs",
        "GATEWAY_BATCH_EXPIRY_SECS",
        Some("90"),
    ),
    (
        "--batch-price-percent",
        "GATEWAY_BATCH_PRICE_PERCENT",
        Some("40"),
    ),
    (
        "--batch-max-in-progress",
        "GATEWAY_BATCH_MAX_IN_PROGRESS",
        Some("2"),
    ),
    (
        "--batch-max-requests",
        "GATEWAY_BATCH_MAX_REQUESTS",
        Some("500"),
    ),
    ("--batch-poll-ms", "GATEWAY_BATCH_POLL_MS", Some("250")),
    (
        "--header-read-timeout-secs",
        "GATEWAY_HEADER_READ_TIMEOUT_SECS",
        Some("7"),
    ),
    (
        "--body-read-timeout-secs",
        "GATEWAY_BODY_READ_TIMEOUT_SECS",
        Some("8"),
    ),
    (
        "--body-min-bytes-per-sec",
        "GATEWAY_BODY_MIN_BYTES_PER_SEC",
        Some("1024"),
    ),
    (
        "--body-idle-timeout-secs",
        "GATEWAY_BODY_IDLE_TIMEOUT_SECS",
        Some("5"),
    ),
    ("--max-connections", "GATEWAY_MAX_CONNECTIONS", Some("99")),
    (
        "--trusted-proxies",
        "GATEWAY_TRUSTED_PROXIES",
        Some("10.0.0.0/8,192.168.1.1"),
    ),
    (
        "--unauthenticated-per-minute",
        "GATEWAY_UNAUTHENTICATED_PER_MINUTE",
        Some("31"),
    ),
    (
        "--sign-ins-per-minute",
        "GATEWAY_SIGN_INS_PER_MINUTE",
        Some("12"),
    ),
    (
        "--sign-ups-per-minute",
        "GATEWAY_SIGN_UPS_PER_MINUTE",
        Some("4"),
    ),
    ("--log-format", "GATEWAY_LOG_FORMAT", Some("json")),
];

const SERVE: &[Flag] = &[
    ("--redis-url", "REDIS_URL", Some("redis://127.0.0.1:6390/2")),
    (
        "--redis-timeout-ms",
        "GATEWAY_REDIS_TIMEOUT_MS",
        Some("300"),
    ),
    ("--redis-outage", "GATEWAY_REDIS_OUTAGE", Some("fail-open")),
    ("--pods", "GATEWAY_PODS", Some("3")),
    (
        "--config-secret",
        "GATEWAY_CONFIG_SECRET",
        Some("gateway/gateway-config"),
    ),
    (
        "--stream-lease-secs",
        "GATEWAY_STREAM_LEASE_SECS",
        Some("20"),
    ),
    (
        "--database-url",
        "DATABASE_URL",
        Some("postgres://u:p@db:5432/gw"),
    ),
    (
        "--database-timeout-ms",
        "GATEWAY_DATABASE_TIMEOUT_MS",
        Some("900"),
    ),
    (
        "--database-pool-size",
        "GATEWAY_DATABASE_POOL_SIZE",
        Some("4"),
    ),
    (
        "--database-pooler",
        "GATEWAY_DATABASE_POOLER",
        Some("transaction"),
    ),
    ("--migrate", "GATEWAY_MIGRATE", None),
    (
        "--reaper-stale-secs",
        "GATEWAY_REAPER_STALE_SECS",
        Some("40"),
    ),
    (
        "--reaper-max-turn-secs",
        "GATEWAY_REAPER_MAX_TURN_SECS",
        Some("1800"),
    ),
    ("--allotment-turns", "GATEWAY_ALLOTMENT_TURNS", Some("8")),
    (
        "--redis-ca-file",
        "GATEWAY_REDIS_CA_FILE",
        Some("/tls/r/ca.crt"),
    ),
    (
        "--redis-client-cert-file",
        "GATEWAY_REDIS_CLIENT_CERT_FILE",
        Some("/tls/rc/tls.crt"),
    ),
    (
        "--redis-client-key-file",
        "GATEWAY_REDIS_CLIENT_KEY_FILE",
        Some("/tls/rc/tls.key"),
    ),
    (
        "--database-ca-file",
        "GATEWAY_DATABASE_CA_FILE",
        Some("/tls/p/ca.crt"),
    ),
    (
        "--database-client-cert-file",
        "GATEWAY_DATABASE_CLIENT_CERT_FILE",
        Some("/tls/pc/tls.crt"),
    ),
    (
        "--database-client-key-file",
        "GATEWAY_DATABASE_CLIENT_KEY_FILE",
        Some("/tls/pc/tls.key"),
    ),
];

/// What `serve` cannot start without.
const SERVE_REQUIRED: &[Flag] = &[("--redis-url", "REDIS_URL", Some("redis://r"))];

const STANDALONE: &[Flag] = &[(
    "--promotion-interval-secs",
    "GATEWAY_PROMOTION_INTERVAL_SECS",
    Some("60"),
)];

/// The process environment is shared by the tests of this file.
static ENV: Mutex<()> = Mutex::new(());

fn argv(command: &str, flags: &[&[Flag]]) -> Vec<String> {
    let mut argv = vec!["gateway".to_owned(), command.to_owned()];
    for (flag, _, value) in flags.iter().flat_map(|f| f.iter()) {
        argv.push(match value {
            Some(value) => format!("{flag}={value}"),
            None => (*flag).to_owned(),
        });
    }
    argv
}

/// Parses `argv` with exactly the variables of `env` set (`true` for a switch), none of the
/// others the gateway reads.
fn parse(argv: &[String], env: &[&[Flag]]) -> Cli {
    let _guard = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let every = [COMMON, SERVE, STANDALONE];
    for (_, var, _) in every.iter().flat_map(|f| f.iter()) {
        std::env::remove_var(var);
    }
    for (_, var, value) in env.iter().flat_map(|f| f.iter()) {
        std::env::set_var(var, value.unwrap_or("true"));
    }
    let parsed = Cli::try_parse_from(argv);
    for (_, var, _) in every.iter().flat_map(|f| f.iter()) {
        std::env::remove_var(var);
    }
    parsed.unwrap_or_else(|e| panic!("{argv:?} parses: {e}"))
}

fn serve(cli: Cli) -> (ServeArgs, LogFormat) {
    match cli.command {
        Command::Serve(args) => (*args, cli.telemetry.log_format),
        other => panic!("parsed as {other:?}"),
    }
}

fn standalone(cli: Cli) -> (StandaloneArgs, LogFormat) {
    match cli.command {
        Command::Standalone(args) => (*args, cli.telemetry.log_format),
        other => panic!("parsed as {other:?}"),
    }
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The values of [`COMMON`], read from their sections.
fn assert_common(common: &CommonArgs, log_format: LogFormat) {
    assert_eq!(log_format, LogFormat::Json);
    let server = &common.server;
    let listen = server
        .listen(None, Vec::new())
        .expect("an admin token was given");
    assert_eq!(listen.api, addr("0.0.0.0:9000"));
    assert_eq!(listen.admin, addr("0.0.0.0:9001"));
    assert_eq!(listen.metrics, Some(addr("0.0.0.0:9002")));
    assert_eq!(listen.admin_token, "admin-token-0123456789");
    assert_eq!(listen.grace, Duration::from_secs(11));
    assert_eq!(listen.delay, Duration::from_secs(5));
    assert_eq!(listen.edge.header_read_timeout, Duration::from_secs(7));
    assert_eq!(listen.edge.body.base, Duration::from_secs(8));
    assert_eq!(listen.edge.body.min_bytes_per_sec, 1024);
    assert_eq!(listen.edge.max_connections, 99);
    assert_eq!(
        server.trusted_proxies,
        vec![
            "10.0.0.0/8".parse().unwrap(),
            "192.168.1.1/32".parse().unwrap()
        ]
    );
    assert_eq!(
        common.catalog.manifests.as_deref(),
        Some(Path::new("/etc/gateway/manifests"))
    );
    assert_eq!(common.catalog.simulated_chunk_delay_ms, Some(3));
    let dev = &common.dev_account;
    assert_eq!(dev.dev_key.as_deref(), Some("sk-svc-0123456789abcdefghij"));
    assert_eq!(dev.dev_top_up_usd, "25.50");
    assert!(dev.dev_enterprise);
    assert_eq!(dev.dev_credits, 7);
    let payments = &common.payments;
    assert_eq!(payments.credits_per_usd(), 1000);
    assert_eq!(
        payments.payment_webhook_secret.as_deref(),
        Some("webhook-secret-0123456789")
    );
    let stripe = payments.stripe();
    assert_eq!(stripe.api_key, Some("sk_test_123"));
    assert_eq!(stripe.webhook_secret, Some("whsec_123"));
    assert_eq!(stripe.api_base, "http://127.0.0.1:12111");
    assert_eq!(payments.auto_reload_interval(), Duration::from_millis(700));
    let dashboard = crate::dashboard::DashboardSettings::from(&common.dashboard);
    assert!(dashboard.secure_cookies);
    assert_eq!(dashboard.signup_credits, 500);
    let breaker = BreakerPolicy::from(&common.breaker);
    assert_eq!(breaker.failures, 9);
    assert_eq!(breaker.cooldown, Duration::from_millis(1500));
    let responses = &common.responses;
    assert_eq!(
        responses.responses_secret.as_deref(),
        Some("responses-secret-0123456789")
    );
    let memory = responses.memory_limits();
    assert_eq!(memory.retention.0, Duration::from_secs(3600));
    assert_eq!((memory.max_responses, memory.max_bytes), (12, 4096));
    let batches = BatchSettings::from(&common.batches);
    assert_eq!((batches.concurrency, batches.price_percent), (3, 40));
    assert_eq!(batches.lease, Duration::from_secs(45));
    assert_eq!(batches.expiry, Duration::from_secs(90));
    assert_eq!((batches.max_in_progress, batches.max_requests), (2, 500));
    assert_eq!(batches.poll, Duration::from_millis(250));
    let brakes = &common.brakes;
    assert_eq!(brakes.unauthenticated_per_minute, 31);
    assert_eq!(brakes.sign_ins_per_minute, 12);
    assert_eq!(brakes.sign_ups_per_minute, 4);
}

/// The values of [`SERVE`], read from their sections.
fn assert_serve(args: &ServeArgs, log_format: LogFormat) {
    assert_common(&args.common, log_format);
    let redis = args.redis.settings();
    assert_eq!(redis.url, "redis://127.0.0.1:6390/2");
    assert_eq!(redis.timeout, Duration::from_millis(300));
    assert_eq!(redis.slot_ttl, Duration::from_secs(20));
    let path =
        |p: &Option<std::path::PathBuf>| p.as_ref().and_then(|p| p.to_str()).map(str::to_owned);
    assert_eq!(path(&redis.tls.ca_file).as_deref(), Some("/tls/r/ca.crt"));
    assert_eq!(
        path(&redis.tls.client_cert_file).as_deref(),
        Some("/tls/rc/tls.crt")
    );
    assert_eq!(
        path(&redis.tls.client_key_file).as_deref(),
        Some("/tls/rc/tls.key")
    );
    assert_eq!(args.outage.redis_outage, OutagePolicy::FailOpen);
    assert_eq!(args.outage.pods, 3);
    let secret = args
        .published
        .config_secret
        .as_ref()
        .expect("a config secret");
    assert_eq!(
        (secret.namespace.as_str(), secret.name.as_str()),
        ("gateway", "gateway-config")
    );
    let db = args.database.connection.settings().expect("a database url");
    assert_eq!(db.url, "postgres://u:p@db:5432/gw");
    assert_eq!(db.timeout, Duration::from_millis(900));
    assert_eq!(db.pool_size, 4);
    assert_eq!(db.pooler, Pooler::Transaction);
    assert_eq!(path(&db.tls.ca_file).as_deref(), Some("/tls/p/ca.crt"));
    assert_eq!(
        path(&db.tls.client_cert_file).as_deref(),
        Some("/tls/pc/tls.crt")
    );
    assert_eq!(
        path(&db.tls.client_key_file).as_deref(),
        Some("/tls/pc/tls.key")
    );
    assert!(args.database.migrate);
    let reaping = args.ledger.reaping(Duration::from_secs(1));
    assert_eq!(reaping.stale, Duration::from_secs(40));
    assert_eq!(reaping.max_turn, Duration::from_secs(1800));
    assert_eq!(args.ledger.allotment_turns, 8);
}

#[test]
fn every_serve_flag_keeps_its_name_and_value() {
    let (args, log_format) = serve(parse(&argv("serve", &[COMMON, SERVE]), &[]));
    assert_serve(&args, log_format);
}

#[test]
fn every_serve_flag_keeps_its_environment_variable() {
    let (args, log_format) = serve(parse(&argv("serve", &[]), &[COMMON, SERVE]));
    assert_serve(&args, log_format);
}

#[test]
fn every_standalone_flag_keeps_its_name_and_value() {
    let (args, log_format) = standalone(parse(&argv("standalone", &[COMMON, STANDALONE]), &[]));
    assert_common(&args.common, log_format);
    assert_eq!(args.promotion.interval(), Duration::from_secs(60));
}

#[test]
fn every_standalone_flag_keeps_its_environment_variable() {
    let (args, log_format) = standalone(parse(&argv("standalone", &[]), &[COMMON, STANDALONE]));
    assert_common(&args.common, log_format);
    assert_eq!(args.promotion.interval(), Duration::from_secs(60));
}

#[test]
fn the_defaults_are_unchanged() {
    let (args, log_format) = serve(parse(&argv("serve", &[SERVE_REQUIRED]), &[]));
    assert_eq!(log_format, LogFormat::Text);
    let common = &args.common;
    let server = &common.server;
    assert!(server.listen(None, Vec::new()).is_none(), "no admin token");
    assert_eq!(server.listen, addr("127.0.0.1:8080"));
    assert_eq!(server.admin_listen, addr("127.0.0.1:8081"));
    assert_eq!(server.metrics_listen, None);
    assert_eq!(server.shutdown_grace(), Duration::from_secs(30));
    assert_eq!(server.shutdown_delay_secs, 0);
    assert_eq!(
        (
            server.header_read_timeout_secs,
            server.body_read_timeout_secs
        ),
        (30, 30)
    );
    assert_eq!(server.body_min_bytes_per_sec, 32 * 1024);
    assert_eq!(server.body_idle_timeout_secs, 10);
    assert_eq!(server.max_connections, 10_000);
    assert!(server.trusted_proxies.is_empty());
    assert_eq!(common.catalog.manifests, None, "the built-in set");
    assert_eq!(common.catalog.simulated_chunk_delay_ms, None);
    let dev = &common.dev_account;
    assert_eq!(dev.dev_key, None);
    assert_eq!(dev.dev_top_up_usd, "10");
    assert!(!dev.dev_enterprise);
    assert_eq!(dev.dev_credits, 10_000_000);
    let payments = &common.payments;
    assert_eq!(payments.credits_per_usd(), 100_000);
    assert_eq!(payments.payment_webhook_secret, None);
    let stripe = payments.stripe();
    assert_eq!((stripe.api_key, stripe.webhook_secret), (None, None));
    assert_eq!(stripe.api_base, "https://api.stripe.com");
    assert_eq!(payments.auto_reload_interval(), Duration::from_secs(5));
    let dashboard = crate::dashboard::DashboardSettings::from(&common.dashboard);
    assert!(!dashboard.secure_cookies);
    assert_eq!(dashboard.signup_credits, 0);
    assert_eq!(dashboard.session_idle, time::Duration::minutes(30));
    assert_eq!(dashboard.session_max, time::Duration::hours(12));
    let breaker = BreakerPolicy::from(&common.breaker);
    assert_eq!(breaker.failures, BreakerPolicy::default().failures);
    assert_eq!(breaker.cooldown, BreakerPolicy::default().cooldown);
    let memory = common.responses.memory_limits();
    assert_eq!(common.responses.responses_secret, None);
    assert_eq!(memory.retention.0, Duration::from_secs(30 * 24 * 3600));
    assert_eq!(
        (memory.max_responses, memory.max_bytes),
        (10_000, 256 * 1024 * 1024)
    );
    assert_eq!(memory.quota.account_max_bytes, 32 * 1024 * 1024);
    let batches = BatchSettings::from(&common.batches);
    assert_eq!((batches.concurrency, batches.price_percent), (4, 50));
    assert_eq!(batches.lease, Duration::from_secs(600));
    assert_eq!(batches.expiry, Duration::from_secs(24 * 3600));
    assert_eq!(
        (batches.max_in_progress, batches.max_requests),
        (10, 100_000)
    );
    assert_eq!(batches.poll, Duration::from_secs(1));
    let brakes = &common.brakes;
    assert_eq!(
        (
            brakes.unauthenticated_per_minute,
            brakes.sign_ins_per_minute,
            brakes.sign_ups_per_minute
        ),
        (30, 10, 3)
    );
    let redis = args.redis.settings();
    assert_eq!(redis.timeout, Duration::from_millis(250));
    assert_eq!(redis.slot_ttl, Duration::from_secs(10));
    assert_eq!(args.outage.redis_outage, OutagePolicy::FailClosed);
    assert_eq!(args.outage.pods, 1);
    assert!(args.published.config_secret.is_none());
    assert!(
        args.database.connection.settings().is_none(),
        "no database url"
    );
    assert_eq!(args.database.connection.database_timeout_ms, 2_000);
    assert_eq!(args.database.connection.database_pool_size, 16);
    assert_eq!(args.database.connection.database_pooler, Pooler::None);
    assert!(!args.database.migrate);
    let reaping = args.ledger.reaping(Duration::from_secs(1));
    assert_eq!(reaping.stale, Duration::from_secs(30));
    assert_eq!(reaping.max_turn, Duration::from_secs(3_600));
    assert_eq!(args.ledger.allotment_turns, 32);
    let (standalone, _) = standalone(parse(&argv("standalone", &[]), &[]));
    assert_eq!(standalone.promotion.interval(), Duration::from_secs(300));
}

#[test]
fn the_database_commands_require_a_database_url_and_serve_does_not() {
    let _guard = ENV.lock().unwrap_or_else(|e| e.into_inner());
    std::env::remove_var("DATABASE_URL");
    for command in [
        &["gateway", "migrate"][..],
        &["gateway", "keys", "revoke", "key_1"],
        &["gateway", "keys", "create", "--account", "a"],
        &[
            "gateway",
            "accounts",
            "topup",
            "--account",
            "acct_1",
            "--usd",
            "10",
            "--reference",
            "r",
        ],
        &["gateway", "messages", "show", "msg_1"],
    ] {
        let error = Cli::try_parse_from(command).expect_err("no --database-url");
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{command:?}"
        );
        let with_url = [command, &["--database-url", "postgres://db/gw"]].concat();
        assert!(Cli::try_parse_from(&with_url).is_ok(), "{with_url:?}");
    }
    assert!(Cli::try_parse_from(["gateway", "serve", "--redis-url", "redis://r"]).is_ok());
}

#[test]
fn keys_create_takes_an_existing_account_by_id_or_a_new_one_by_name_and_credits_only_a_new_one() {
    use clap::error::ErrorKind;
    let db = ["--database-url", "postgres://db"];
    for (args, kind) in [
        (
            &["gateway", "keys", "create"][..],
            ErrorKind::MissingRequiredArgument,
        ),
        (
            &[
                "gateway",
                "keys",
                "create",
                "--account",
                "acct_1",
                "--new-account",
                "a",
            ],
            ErrorKind::ArgumentConflict,
        ),
        (
            &[
                "gateway",
                "keys",
                "create",
                "--account",
                "acct_1",
                "--credits",
                "5",
            ],
            ErrorKind::ArgumentConflict,
        ),
    ] {
        let line: Vec<&str> = args.iter().chain(&db).copied().collect();
        let error = Cli::try_parse_from(&line).expect_err("refused");
        assert_eq!(error.kind(), kind, "{line:?}");
    }
    for args in [
        &["gateway", "keys", "create", "--account", "acct_1"][..],
        &[
            "gateway",
            "keys",
            "create",
            "--new-account",
            "a",
            "--credits",
            "5",
        ],
    ] {
        let line: Vec<&str> = args.iter().chain(&db).copied().collect();
        assert!(Cli::try_parse_from(&line).is_ok(), "{line:?}");
    }
}
