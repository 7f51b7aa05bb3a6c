//! The operator end to end against a real kube-apiserver (`scripts/kube-apiserver` builds it):
//! custom resources applied with kubectl become the config of a running gateway process;
//! invalid ones get a condition while the last good config keeps serving; the schemas reject
//! what they can at apply; a confirmed top-up promotes a free key within one sweep; of two
//! operators exactly one holds the Lease (and so runs the sweep and the scaler), and the other
//! takes over when it dies. The operator and the gateway run under the RBAC of `deploy/rbac/`.
//!
//! Each test skips (with the reason on stderr) where the API server could not be built.

use std::time::Duration;

use e2e::kube::{Identity, KubeApi, Operator};
use e2e::{
    count_body, message, poll_until, Gateway, PostgresServer, RedisServer, DEV_KEY, ENTERPRISE_KEY,
};

/// The gateway must apply a published config within this (the issue's promise).
const APPLY_WITHIN: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(200);

/// The API server with the CRDs, the RBAC and the standalone resources applied.
async fn cluster() -> Option<KubeApi> {
    KubeApi::start_with_gateway_resources().await
}

async fn published_version(api: &KubeApi) -> String {
    poll_until(
        "the operator to publish the config",
        Duration::from_secs(20),
        POLL,
        || async {
            let version = api.jsonpath(
                "secret",
                "gateway-config",
                "{.metadata.annotations.gateway\\.svc\\.dev/config-version}",
            );
            (!version.is_empty()).then_some(version)
        },
    )
    .await
}

async fn gateway(api: &KubeApi, redis: &RedisServer) -> Gateway {
    Gateway::builder()
        .serve(&redis.url())
        .arg("--config-secret")
        .arg("gateway/gateway-config")
        .env("KUBECONFIG", api.kubeconfig(Identity::Gateway))
        .start()
        .await
}

/// The Ready condition's status, reason and message, read in one call so that the three
/// belong to the same version of the resource.
fn ready(api: &KubeApi, kind: &str, name: &str) -> (String, String, String) {
    let field = |field: &str| format!("{{.status.conditions[?(@.type==\"Ready\")].{field}}}");
    let text = api.jsonpath(
        kind,
        name,
        &format!(
            "{}|{}|{}",
            field("status"),
            field("reason"),
            field("message")
        ),
    );
    let mut parts = text.splitn(3, '|').map(str::to_owned);
    let mut next = || parts.next().unwrap_or_default();
    (next(), next(), next())
}

/// A ModelRoute `name` serving `model` from an upstream whose API key is in Secret
/// `no-such-secret`, which the tests do not create unless they say so.
fn route_naming_a_missing_secret(name: &str, model: &str) -> String {
    format!(
        "apiVersion: gateway.svc.dev/v1alpha1\nkind: ModelRoute\nmetadata:\n  name: {name}\n\
         spec:\n  model: {model}\n  displayName: Broken\n  contextWindow: 200000\n  \
         maxOutputTokens: 8192\n  pricing:\n    inputUsdPerMTok: \"0.80\"\n    \
         outputUsdPerMTok: \"4\"\n    cacheWriteUsdPerMTok: \"1\"\n    \
         cacheReadUsdPerMTok: \"0.08\"\n  upstreams:\n  - name: primary\n    \
         provider: anthropic\n    model: claude-haiku\n    baseUrl: https://api.anthropic.com\n    \
         apiKeySecretRef:\n      name: no-such-secret\n      key: apiKey\n"
    )
}

#[tokio::test]
async fn resources_applied_with_kubectl_configure_a_running_gateway_within_ten_seconds() {
    let Some(api) = cluster().await else { return };
    let _operator = Operator::start(&api, "operator-0", &[]);
    published_version(&api).await;
    let redis = RedisServer::start().await;
    let gw = gateway(&api, &redis).await;

    // The ApiKey of deploy/standalone grants its seeded key enterprise limits.
    // (Its account holds no credits: count_tokens is admitted without any.)
    let seeded = gw
        .count_tokens(ENTERPRISE_KEY, &count_body("svc/haiku", "hi"))
        .await;
    seeded.expect_ok();
    assert_eq!(seeded.rate_limit().tier, "enterprise");
    assert_eq!(seeded.rate_limit().limit_requests, 120);

    // A new grant for the running gateway's dev key shows in its next requests' headers.
    let grant = "apiVersion: gateway.svc.dev/v1alpha1\nkind: ApiKey\nmetadata:\n  name: dev\n\
                 spec:\n  keyId: key_dev\n  tier: enterprise\n  limits:\n    \
                 requestsPerMinute: 77\n    inputTokensPerMinute: 7777\n    concurrentStreams: 7\n";
    let out = api.apply(grant);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let limits = poll_until(
        "the grant to reach the gateway",
        APPLY_WITHIN,
        POLL,
        || async {
            let resp = gw
                .post_messages(DEV_KEY, &message("svc/haiku", "hi", 16))
                .await;
            let rl = resp.rate_limit();
            (rl.limit_requests == 77).then_some(rl)
        },
    )
    .await;
    assert_eq!(limits.tier, "enterprise");
    assert_eq!(limits.limit_tokens, 7777);
    assert_eq!(limits.limit_streams, 7);
    assert_eq!(ready(&api, "apikey", "dev").0, "True");

    // A new ModelRoute is listed without a restart.
    let route = std::fs::read_to_string(
        e2e::gateway::workspace_root().join("deploy/standalone/models.yaml"),
    )
    .unwrap_or_default()
    .split("\n---")
    .find(|doc| doc.contains("name: svc-haiku"))
    .unwrap_or_default()
    .replace("name: svc-haiku", "name: svc-mini")
    .replace("model: svc/haiku", "model: svc/mini");
    let out = api.apply(&route);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    poll_until("svc/mini to be listed", APPLY_WITHIN, POLL, || async {
        let models = gw.get("/v1/models", DEV_KEY).await.expect_ok();
        models["data"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["id"] == "svc/mini"))
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_invalid_edit_gets_a_clear_condition_while_its_last_published_version_serves() {
    let Some(api) = cluster().await else { return };
    let operator = Operator::start(&api, "operator-0", &[]);
    let good = published_version(&api).await;
    let redis = RedisServer::start().await;
    let gw = gateway(&api, &redis).await;

    // svc-haiku now routes to a provider whose API key Secret does not exist.
    let out = api.apply(&route_naming_a_missing_secret("svc-haiku", "svc/haiku"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, reason, detail) = poll_until(
        "the Invalid condition",
        Duration::from_secs(20),
        POLL,
        || async {
            let condition = ready(&api, "modelroute", "svc-haiku");
            (condition.1 == "Invalid").then_some(condition)
        },
    )
    .await;
    assert_eq!(status, "False");
    assert!(
        detail.contains("Secret no-such-secret not found")
            && detail.ends_with("its last published version stays in the gateway configuration"),
        "{detail} ({reason})"
    );
    assert_eq!(
        ready(&api, "tier", "free").0,
        "True",
        "the rest is not blocked"
    );
    let events = api.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=Invalid",
        "-o",
        "name",
    ]);
    assert!(
        !String::from_utf8_lossy(&events.stdout).trim().is_empty(),
        "no Warning event"
    );

    // The operator compiled the last published svc-haiku in its place (its log says so once
    // it has): the config is unchanged, and the gateway keeps serving svc/haiku.
    poll_until(
        "the operator to publish without the invalid edit",
        Duration::from_secs(20),
        POLL,
        || async {
            operator
                .logs()
                .contains("publishing without the invalid resources")
                .then_some(())
        },
    )
    .await;
    assert_eq!(published_version(&api).await, good);
    gw.post_messages(DEV_KEY, &message("svc/haiku", "still here?", 16))
        .await
        .expect_ok();

    // Fixing the route publishes again and clears the conditions.
    api.apply_path("deploy/standalone/models.yaml");
    poll_until(
        "the route to be ready again",
        Duration::from_secs(20),
        POLL,
        || async {
            let fixed = ready(&api, "modelroute", "svc-haiku").0 == "True"
                && ready(&api, "tier", "free").0 == "True";
            fixed.then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn the_api_server_rejects_what_the_schemas_forbid_at_apply() {
    let Some(api) = cluster().await else { return };
    let unknown_provider = "apiVersion: gateway.svc.dev/v1alpha1\nkind: ModelRoute\nmetadata:\n  \
                            name: bad-provider\nspec:\n  model: svc/bad\n  displayName: Bad\n  \
                            contextWindow: 1000\n  maxOutputTokens: 100\n  upstreams:\n  \
                            - name: x\n    provider: carrier-pigeon\n    model: m\n";
    let out = api.apply(unknown_provider);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("carrier-pigeon"), "{stderr}");

    let negative = "apiVersion: gateway.svc.dev/v1alpha1\nkind: Tier\nmetadata:\n  name: neg\n\
                    spec:\n  tier: free\n  requestsPerMinute: -5\n  inputTokensPerMinute: 10\n  \
                    concurrentStreams: 1\n";
    let out = api.apply(negative);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("requestsPerMinute"), "{stderr}");

    let bad_model_id = unknown_provider
        .replace("carrier-pigeon", "simulated")
        .replace("svc/bad", "gpt-4");
    let out = api.apply(&bad_model_id);
    assert!(
        !out.status.success(),
        "a model id outside svc/ was accepted"
    );
}

/// `kubectl apply` of `yaml` fails, naming `expected` in its message.
fn refused(api: &KubeApi, yaml: &str, expected: &str) {
    let out = api.apply(yaml);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {yaml}");
    assert!(stderr.contains(expected), "{expected:?} not in: {stderr}");
}

#[tokio::test]
async fn the_api_server_refuses_duplicate_upstreams_hand_granted_tiers_and_made_up_condition_statuses(
) {
    let Some(api) = cluster().await else { return };
    let route = |upstreams: &str| {
        format!(
            "apiVersion: gateway.svc.dev/v1alpha1\nkind: ModelRoute\nmetadata:\n  name: dup\n\
             spec:\n  model: svc/dup\n  displayName: Dup\n  contextWindow: 1000\n  \
             maxOutputTokens: 100\n  upstreams:\n{upstreams}"
        )
    };
    let upstream = "  - name: same\n    provider: simulated\n    model: m\n";
    refused(&api, &route(&upstream.repeat(2)), "Duplicate value");
    refused(
        &api,
        &route("").replace("upstreams:\n", "upstreams: []\n"),
        "upstreams",
    );

    let key = "apiVersion: gateway.svc.dev/v1alpha1\nkind: ApiKey\nmetadata:\n  name: k\n\
               spec:\n  keyId: key_x\n  tier: free\n";
    refused(&api, key, "supported values: \"enterprise\"");
    let scopes = "apiVersion: gateway.svc.dev/v1alpha1\nkind: ApiKey\nmetadata:\n  name: k\n\
                  spec:\n  keyId: key_x\n  scopes: [chat, chat]\n";
    refused(&api, scopes, "Duplicate value");

    // Conditions carry metav1.Condition's own constraints, for whoever writes the status.
    let out = api.kubectl(&[
        "patch",
        "tier",
        "free",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"Maybe","reason":"Guess","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("Maybe"),
        "{stderr}"
    );

    // Optional fields keep their subfields in the published schema. The API server publishes
    // a CRD's schema to its OpenAPI document a while after the CRD is established (longer on
    // a loaded machine), so `kubectl explain` is asked until it knows the kind.
    poll_until(
        "kubectl explain showing pricing's subfields",
        Duration::from_secs(60),
        POLL,
        || async {
            let explain = api.kubectl(&["explain", "modelroutes.spec.pricing"]);
            String::from_utf8_lossy(&explain.stdout)
                .contains("inputUsdPerMTok")
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn of_two_operators_one_leads_and_the_other_takes_the_lease_when_it_dies() {
    let Some(api) = cluster().await else { return };
    let flags = ["--lease-duration", "3s"];
    let mut a = Operator::start(&api, "operator-a", &flags);
    let mut b = Operator::start(&api, "operator-b", &flags);
    let leads = |op: &Operator| op.logs().contains("leading=true");
    poll_until("a leader", Duration::from_secs(20), POLL, || async {
        (leads(&a) || leads(&b)).then_some(())
    })
    .await;
    // Several renewals of the Lease (watched, not slept through): the follower stays one.
    let renewed_at = || api.jsonpath("lease", "gateway-operator", "{.spec.renewTime}");
    let mut last = renewed_at();
    for n in 1..=3 {
        let previous = last.clone();
        last = poll_until(
            &format!("renewal {n} of the Lease"),
            Duration::from_secs(20),
            POLL,
            || async {
                let now = renewed_at();
                (now != previous).then_some(now)
            },
        )
        .await;
    }
    assert!(
        leads(&a) != leads(&b),
        "exactly one operator leads\na: {}\nb: {}",
        a.logs(),
        b.logs()
    );
    let (leader, follower) = if leads(&a) {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    assert_eq!(
        api.jsonpath("lease", "gateway-operator", "{.spec.holderIdentity}"),
        leader.identity
    );

    leader.kill_9().await;
    // After the lease time (3 s) and a renewal period (1 s); never is the failure.
    poll_until(
        "the follower to take the Lease",
        Duration::from_secs(30),
        POLL,
        || async { leads(follower).then_some(()) },
    )
    .await;
    assert_eq!(
        api.jsonpath("lease", "gateway-operator", "{.spec.holderIdentity}"),
        follower.identity
    );
}

/// An operator given the ledger's Postgres (so it sweeps and records grants every `sweep`) and a
/// gateway serving its published config with that Postgres.
struct WithLedger {
    pg: PostgresServer,
    gw: Gateway,
    _operator: Operator,
    _redis: RedisServer,
}

async fn with_ledger(api: &KubeApi, sweep: &str) -> WithLedger {
    let pg = PostgresServer::start().await;
    let operator = Operator::start(
        api,
        "operator-0",
        &["--database-url", &pg.url(), "--sweep-interval", sweep],
    );
    published_version(api).await;
    let redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .serve(&redis.url())
        .database(&pg.url())
        .arg("--config-secret")
        .arg("gateway/gateway-config")
        .env("KUBECONFIG", api.kubeconfig(Identity::Gateway))
        .start()
        .await;
    WithLedger {
        pg,
        gw,
        _operator: operator,
        _redis: redis,
    }
}

#[tokio::test]
async fn a_confirmed_top_up_moves_a_free_key_to_pay_as_you_go_within_one_sweep() {
    let Some(api) = cluster().await else { return };
    // Every part bound: one left to `..` would be dropped, and stopped, at once.
    let WithLedger {
        pg,
        gw,
        _operator,
        _redis,
    } = with_ledger(&api, "2s").await;
    let created = pg
        .gateway_cli(&["keys", "create", "--new-account", "sweep"])
        .await
        .expect("keys create");
    let secret = created["key"].as_str().expect("the secret").to_owned();
    let account_id = created["account_id"].as_str().expect("the account");
    let first = gw
        .count_tokens(&secret, &count_body("svc/haiku", "hi"))
        .await;
    first.expect_ok();
    assert_eq!(first.rate_limit().tier, "free");

    pg.gateway_cli(&[
        "accounts",
        "topup",
        "--account",
        account_id,
        "--usd",
        "25",
        "--reference",
        "pay_sweep_1",
    ])
    .await
    .expect("top-up");
    // One sweep (2 s) plus the gateway's key cache (5 s); polled gently, since the free tier
    // allows 5 requests a minute and every answer, 429s included, names the tier.
    let promoted = poll_until(
        "the sweep to promote the key",
        Duration::from_secs(30),
        Duration::from_secs(1),
        || async {
            let rl = gw
                .count_tokens(&secret, &count_body("svc/haiku", "hi"))
                .await
                .rate_limit();
            (rl.tier == "pay_as_you_go").then_some(rl)
        },
    )
    .await;
    assert_eq!(promoted.limit_requests, 60);
}

/// The `key_grant_changed` rows of `account_id`, oldest first.
async fn grant_rows(gw: &Gateway, account_id: &str) -> Vec<serde_json::Value> {
    let page = gw
        .admin_get(&format!(
            "/admin/audit?account_id={account_id}&action=key_grant_changed&limit=100"
        ))
        .await
        .expect_ok();
    let mut rows = page["data"].as_array().expect("data").clone();
    rows.reverse();
    rows
}

#[tokio::test]
async fn each_change_an_api_key_resource_grants_is_one_audit_row_by_the_operator() {
    let Some(api) = cluster().await else { return };
    // Every part bound: one left to `..` would be dropped, and stopped, at once.
    let WithLedger {
        pg,
        gw,
        _operator,
        _redis,
    } = with_ledger(&api, "1s").await;
    let created = pg
        .gateway_cli(&["keys", "create", "--new-account", "granted"])
        .await
        .expect("keys create");
    let key_id = created["id"].as_str().expect("the key id").to_owned();
    let account_id = created["account_id"]
        .as_str()
        .expect("the account")
        .to_owned();
    let grant = |cap: u64| {
        format!(
            "apiVersion: gateway.svc.dev/v1alpha1\nkind: ApiKey\nmetadata:\n  name: granted\n\
             spec:\n  keyId: {key_id}\n  tier: enterprise\n  monthlySpendCapCredits: {cap}\n"
        )
    };
    let rows_become = |count: usize| {
        let (gw, account_id) = (&gw, &account_id);
        poll_until(
            "the operator to audit the grant",
            Duration::from_secs(30),
            POLL,
            move || async move {
                let rows = grant_rows(gw, account_id).await;
                (rows.len() >= count).then_some(rows)
            },
        )
    };

    assert!(api.apply(&grant(500)).status.success());
    let rows = rows_become(1).await;
    assert_eq!(rows[0]["actor"]["kind"], "operator");
    assert_eq!(rows[0]["actor"]["id"], "ApiKey");
    assert_eq!(rows[0]["target"], key_id.as_str());
    assert_eq!(rows[0]["before"], serde_json::Value::Null);
    assert_eq!(rows[0]["after"]["tier"], "enterprise");
    assert_eq!(rows[0]["after"]["spendCap"], 500);

    assert!(api.apply(&grant(900)).status.success());
    let rows = rows_become(2).await;
    assert_eq!(
        (
            &rows[1]["before"]["spendCap"],
            &rows[1]["after"]["spendCap"]
        ),
        (&serde_json::json!(500), &serde_json::json!(900))
    );
    // The operator records every second and at each publish: the same grants again add none.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        grant_rows(&gw, &account_id).await.len(),
        2,
        "no row without a change"
    );

    let out = api.kubectl(&["delete", "apikey", "granted"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows_become(3).await;
    assert_eq!(rows[2]["before"]["spendCap"], 900);
    assert_eq!(rows[2]["after"], serde_json::Value::Null);
}

#[tokio::test]
async fn a_pod_waiting_for_its_first_config_is_live_but_not_ready_then_ready_on_the_same_port() {
    let Some(api) = cluster().await else { return };
    let redis = RedisServer::start().await;
    let admin = format!("http://127.0.0.1:{}", e2e::server::free_port_for_later());
    let mut cmd = tokio::process::Command::new(e2e::gateway::gateway_bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--admin-listen"])
        .arg(admin.trim_start_matches("http://"))
        .args([
            "--admin-token",
            e2e::ADMIN_TOKEN,
            "--redis-url",
            &redis.url(),
        ])
        .args(["--config-secret", "gateway/gateway-config"])
        .env("KUBECONFIG", api.kubeconfig(Identity::Gateway));
    e2e::tie_to_test(&mut cmd);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let _gateway = cmd.spawn().expect("spawn the gateway");
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let status = |path: &'static str| {
        let (http, admin) = (http.clone(), admin.clone());
        async move {
            match http.get(format!("{admin}{path}")).send().await {
                Ok(resp) => Some(resp.status().as_u16()),
                Err(_) => None,
            }
        }
    };
    // No operator yet: nothing is published.
    poll_until(
        "/livez to answer",
        Duration::from_secs(30),
        POLL,
        || async { (status("/livez").await == Some(200)).then_some(()) },
    )
    .await;
    assert_eq!(status("/readyz").await, Some(503));
    // The readiness answer says what the pod waits for, and where.
    let waiting: serde_json::Value = http
        .get(format!("{admin}/readyz"))
        .send()
        .await
        .expect("/readyz")
        .json()
        .await
        .expect("a JSON answer");
    assert_eq!(waiting["waiting_for"], "config", "{waiting}");
    assert_eq!(
        waiting["config_secret"], "gateway/gateway-config",
        "{waiting}"
    );
    let detail = waiting["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("--field-selector involvedObject.name=gateway-config"),
        "{detail}"
    );

    let _operator = Operator::start(&api, "operator-0", &[]);
    poll_until(
        "/readyz after the first config",
        APPLY_WITHIN,
        POLL,
        || async { (status("/readyz").await == Some(200)).then_some(()) },
    )
    .await;
    assert_eq!(status("/livez").await, Some(200));
}

/// One Pod of the chart's gateway Deployment whose address is the loopback, so that the
/// operator's scraper reaches the real gateway process of the test (the API server runs no
/// kubelet: pods stay objects, with the status we give them).
fn loopback_gateway_pod(api: &KubeApi) {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: gateway-0\n  labels:\n    \
               app.kubernetes.io/name: gateway\n    app.kubernetes.io/instance: gateway\n\
               spec:\n  serviceAccountName: gateway\n  automountServiceAccountToken: false\n  \
               containers: [{name: gateway, image: gateway}]\n";
    let out = api.apply(pod);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = r#"{"status":{"podIP":"127.0.0.1","podIPs":[{"ip":"127.0.0.1"}]}}"#;
    let out = api.kubectl(&[
        "patch",
        "pod",
        "gateway-0",
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn replicas_become(api: &KubeApi, want: &str) {
    poll_until(
        &format!("the gateway Deployment at {want} replicas, with the pod count announced"),
        Duration::from_secs(30),
        POLL,
        || async {
            let replicas = api.jsonpath("deployment", "gateway", "{.spec.replicas}");
            let announced = api.jsonpath(
                "secret",
                "gateway-config",
                "{.metadata.annotations.gateway\\.svc\\.dev/gateway-pods}",
            );
            (replicas == want && announced == want).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn under_the_charts_rbac_the_scaler_follows_the_pods_streams_and_failing_open_pods_share_by_its_count(
) {
    // Release `gateway`: its service accounts are the identities the operator and the gateway
    // run as, so both run under the chart's RBAC (deploy/rbac is not applied).
    let Some(trial) = e2e::helm::Trial::start("gateway").await else {
        return;
    };
    trial.helm("install", &[]);
    let api = &trial.api;
    api.apply_path("deploy/standalone/");
    loopback_gateway_pod(api);
    let admin_port = e2e::server::free_port_for_later().to_string();
    let metrics = format!("127.0.0.1:{}", e2e::server::free_port_for_later());
    let _operator = Operator::start(
        api,
        "operator-0",
        &[
            &format!("--metrics-listen={metrics}"),
            "--scale-deployment=gateway",
            "--scale-pod-selector=app.kubernetes.io/name=gateway,app.kubernetes.io/instance=gateway",
            &format!("--gateway-metrics-port={admin_port}"),
            "--min-replicas=1",
            "--max-replicas=4",
            "--streams-per-pod=1",
            "--scale-every=1s",
            "--scale-down-window=2s",
        ],
    );
    published_version(api).await;
    let mut redis = RedisServer::start().await;
    // Seven pods by the static count: the operator's count must replace it.
    let gw = Gateway::builder()
        .serve(&redis.url())
        .redis_timeout_ms(200)
        .redis_outage("fail-open")
        .pods(7)
        .chunk_delay_ms(500)
        .admin_listen(&format!("127.0.0.1:{admin_port}"))
        .arg("--config-secret")
        .arg("gateway/gateway-config")
        .env("KUBECONFIG", api.kubeconfig(Identity::Gateway))
        .start()
        .await;
    replicas_become(api, "1").await;

    let body = e2e::message_stream("svc/haiku", "hi", 4_000);
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut stream = gw.stream("/v1/messages", DEV_KEY, &body).await;
        stream.expect_sse();
        assert!(stream.next_event().await.is_some(), "the stream opened");
        streams.push(stream);
    }
    replicas_become(api, "3").await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let get = |path: &str| {
        let request = http.get(format!("http://{metrics}{path}")).send();
        async move {
            match request.await {
                Ok(resp) if resp.status() == 200 => resp.text().await.ok(),
                _ => None,
            }
        }
    };
    assert!(get("/livez").await.is_some() && get("/readyz").await.is_some());
    let scraped = get("/metrics").await.unwrap_or_default();
    assert!(
        scraped.contains("gateway_operator_desired_replicas 3"),
        "{scraped}"
    );
    for stream in streams {
        stream.disconnect();
    }
    replicas_become(api, "1").await;
    // Before scaling down it marked the pod with its open streams (none now): idle pods are
    // the ReplicaSet's first to remove.
    assert_eq!(
        api.jsonpath(
            "pod",
            "gateway-0",
            "{.metadata.annotations.controller\\.kubernetes\\.io/pod-deletion-cost}"
        ),
        "0"
    );

    // Failing open, the one pod the operator counts takes the whole of pay-as-you-go's 60
    // requests a minute, not a seventh of them.
    redis.stop().await;
    poll_until(
        "the gateway to share the limits by the announced count",
        APPLY_WITHIN,
        Duration::from_millis(500),
        || async {
            let resp = gw
                .count_tokens(DEV_KEY, &count_body("svc/haiku", "hi"))
                .await;
            (resp.status == 200 && resp.rate_limit().limit_requests == 60).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn an_invalid_resource_beside_valid_ones_is_left_out_and_the_valid_ones_publish() {
    let Some(api) = cluster().await else { return };
    let _operator = Operator::start(&api, "operator-0", &[]);
    published_version(&api).await;
    let redis = RedisServer::start().await;
    let gw = gateway(&api, &redis).await;

    // One apply: svc/mini is valid, svc/broken names a Secret that does not exist.
    let haiku = std::fs::read_to_string(
        e2e::gateway::workspace_root().join("deploy/standalone/models.yaml"),
    )
    .unwrap_or_default()
    .split("\n---")
    .find(|doc| doc.contains("name: svc-haiku"))
    .unwrap_or_default()
    .to_owned();
    let mini = haiku
        .replace("name: svc-haiku", "name: svc-mini")
        .replace("model: svc/haiku", "model: svc/mini");
    let broken = route_naming_a_missing_secret("svc-broken", "svc/broken");
    let out = api.apply(&format!("{mini}\n---\n{broken}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    poll_until("svc/mini to be served", APPLY_WITHIN, POLL, || async {
        let models = gw.get("/v1/models", DEV_KEY).await.expect_ok();
        let ids: Vec<&str> = models["data"]
            .as_array()
            .map(|m| m.iter().filter_map(|m| m["id"].as_str()).collect())
            .unwrap_or_default();
        assert!(!ids.contains(&"svc/broken"), "{ids:?}");
        ids.contains(&"svc/mini").then_some(())
    })
    .await;
    let (status, reason, detail) = ready(&api, "modelroute", "svc-broken");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Invalid"));
    assert!(
        detail.contains("Secret no-such-secret not found")
            && detail.ends_with("left out of the gateway configuration"),
        "{detail}"
    );
    assert_eq!(ready(&api, "modelroute", "svc-mini").0, "True");
}

#[tokio::test]
async fn the_secret_a_route_waits_for_brings_the_route_in_when_it_is_created() {
    let Some(api) = cluster().await else { return };
    // The default resync (5 minutes) is far off: only the Secret's own event can do it.
    let _operator = Operator::start(&api, "operator-0", &[]);
    published_version(&api).await;
    let out = api.apply(&route_naming_a_missing_secret("svc-broken", "svc/broken"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    poll_until("the Invalid condition", APPLY_WITHIN, POLL, || async {
        (ready(&api, "modelroute", "svc-broken").1 == "Invalid").then_some(())
    })
    .await;

    let secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: no-such-secret\n\
                  stringData:\n  apiKey: sk-ant-test\n";
    let out = api.apply(secret);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    poll_until("the route to be published", APPLY_WITHIN, POLL, || async {
        let (status, reason, _) = ready(&api, "modelroute", "svc-broken");
        (status == "True" && reason == "Published").then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_route_naming_a_secret_the_operator_is_not_pointed_at_is_invalid_saying_so() {
    let Some(api) = cluster().await else { return };
    let _operator = Operator::start(&api, "operator-0", &[]);
    published_version(&api).await;
    // The Secret exists, but the operator was not given it (and its Role does not name it).
    let secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: someone-elses\n\
                  stringData:\n  apiKey: sk-ant-test\n";
    let route = route_naming_a_missing_secret("svc-elsewhere", "svc/elsewhere")
        .replace("name: no-such-secret", "name: someone-elses");
    let out = api.apply(&format!("{secret}---\n{route}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, detail) = poll_until("the Invalid condition", APPLY_WITHIN, POLL, || async {
        let (status, reason, detail) = ready(&api, "modelroute", "svc-elsewhere");
        (reason == "Invalid").then_some((status, detail))
    })
    .await;
    assert_eq!(status, "False");
    assert!(
        detail.starts_with("Secret someone-elses is not one the operator reads")
            && detail.ends_with("left out of the gateway configuration"),
        "{detail}"
    );
    // The rest is still published.
    assert_eq!(ready(&api, "modelroute", "svc-haiku").0, "True");
}

#[tokio::test]
async fn when_nothing_can_be_published_kubectl_describe_of_the_gateway_deployment_says_why() {
    let Some(api) = cluster().await else { return };
    // The Deployment as an object (no controllers here): what `kubectl describe` is run on.
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: gateway\n\
                      spec:\n  selector:\n    matchLabels: {app: gateway}\n  template:\n    \
                      metadata:\n      labels: {app: gateway}\n    spec:\n      \
                      containers: [{name: gateway, image: gateway}]\n";
    let out = api.apply(deployment);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let operator = Operator::start(&api, "operator-0", &["--gateway-deployment", "gateway"]);
    published_version(&api).await;
    // Without a free tier no key can fall back to one: a problem no resource owns.
    let out = api.kubectl(&["delete", "tier", "free"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let describe = || {
        let out = api.kubectl(&["describe", "deployment", "gateway"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let described = poll_until("the NotPublished event", APPLY_WITHIN, POLL, || async {
        let text = describe();
        text.contains("NotPublished").then_some(text)
    })
    .await;
    assert!(
        described.contains("Warning") && described.contains("no Tier declares tier free"),
        "{described}\noperator:\n{}",
        operator.logs()
    );
    // The config Secret has it too (`kubectl get events`: describe shows no Secret's events).
    let events = api.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=Secret,involvedObject.name=gateway-config,reason=NotPublished",
        "-o",
        "name",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&events.stdout).lines().count(),
        1,
        "{events:?}"
    );
}
