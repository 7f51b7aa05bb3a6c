//! Money under faults (issue 16): two `serve` pods with allotments, mixed JSON and streamed
//! turns on both endpoints from several clients, through the faults of a production drill:
//! Redis frozen then restarted, a pod killed (SIGKILL), a pod drained (SIGTERM) with streams
//! running longer than the reaper's stale time, Postgres stopped for longer than the stale
//! time, and one pod cut off from Postgres alone (a proxy in between) for longer than the
//! stale time while the other keeps serving. Then, for every turn a client was told a
//! `credits_consumed`: the ledger row bills exactly that, with a status that says so
//! (`completed` when billed, a not-billed status when told 0); no answer is a 500; balances
//! never go below zero and equal the credits granted minus the rows' bills; once the pods
//! stop, nothing is left reserved and no allotment is left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::{
    chat_body, message, message_stream, poll_until, words, Cluster, GatewayBuilder, KeySpec,
    PostgresServer, TcpProxy,
};
use serde_json::{json, Value};

const CREDITS: u64 = 50_000_000;
const ACCOUNTS: usize = 3;
const CLIENTS: usize = 6;
/// Short enough for the drill to take it for dead within seconds.
const STALE_SECS: u64 = 4;
/// Longer than the streams the drain test runs, which are longer than the stale time.
const GRACE_SECS: u64 = 12;
/// The simulated upstream's pause between chunks: a short reply takes a few hundred
/// milliseconds, a long stream several seconds.
const CHUNK_DELAY_MS: u64 = 60;

/// A pod of the drill, on Postgres at `database_url`.
fn pod(b: GatewayBuilder, database_url: &str) -> GatewayBuilder {
    b.database(database_url)
        .chunk_delay_ms(CHUNK_DELAY_MS)
        .shutdown_grace_secs(GRACE_SECS)
        .arg("--reaper-stale-secs")
        .arg(&STALE_SECS.to_string())
        .arg("--database-timeout-ms")
        .arg("1000")
        .arg("--allotment-turns")
        .arg("16")
}

/// What one client saw of one turn.
#[derive(Clone, Debug)]
struct Seen {
    /// The message id its answer carried (none when it got no answer).
    id: Option<String>,
    what: &'static str,
    pod: usize,
    /// HTTP status; 0 when the connection failed.
    status: u16,
    /// The `credits_consumed` it was told, if its answer got that far.
    told: Option<u64>,
}

/// The API base URL of each pod, `None` while it is down or draining.
#[derive(Clone, Default)]
struct Targets(Arc<Mutex<Vec<Option<String>>>>);

impl Targets {
    fn set(&self, pod: usize, api: Option<String>) {
        let mut targets = self.0.lock().expect("targets");
        let len = targets.len().max(pod + 1);
        targets.resize(len, None);
        targets[pod] = api;
    }

    /// The `n`th pick among the pods up, round robin.
    fn pick(&self, n: usize) -> Option<(usize, String)> {
        let targets = self.0.lock().expect("targets");
        let up: Vec<(usize, String)> = targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.clone().map(|t| (i, t)))
            .collect();
        (!up.is_empty()).then(|| up[n % up.len()].clone())
    }
}

/// The data payloads of an SSE body, parsed.
fn sse_payloads(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str(data.trim()).ok())
        .collect()
}

/// Sends one turn; `None` when the connection failed.
async fn send(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    what: &'static str,
    text: &str,
) -> Option<reqwest::Response> {
    let (path, body) = match what {
        "messages" => ("/v1/messages", message("svc/haiku", text, 1_024)),
        "messages-stream" => ("/v1/messages", message_stream("svc/haiku", text, 1_024)),
        "chat" => (
            "/v1/chat/completions",
            chat_body("svc/haiku", text, Some(1_024)),
        ),
        _ => {
            let mut body = chat_body("svc/haiku", text, Some(1_024));
            body["stream"] = json!(true);
            body["stream_options"] = json!({ "include_usage": true });
            ("/v1/chat/completions", body)
        }
    };
    http.post(format!("{api}{path}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .ok()
}

/// Reads the rest of a turn's answer (`text`: what was read of it already): (status, message
/// id, the `credits_consumed` it told), however it ends.
async fn told(
    what: &str,
    mut response: reqwest::Response,
    mut text: String,
) -> (u16, Option<String>, Option<u64>) {
    let status = response.status().as_u16();
    // A stream cut midway still shows what it carried before.
    while let Ok(Some(chunk)) = response.chunk().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    if status != 200 {
        return (status, None, None);
    }
    if what.ends_with("stream") {
        let mut id = None;
        let mut told = None;
        for event in sse_payloads(&text) {
            if let Some(start) = event["message"]["id"].as_str() {
                id = Some(start.to_owned());
            }
            if let Some(chunk) = event["id"].as_str() {
                id = Some(chunk.to_owned());
            }
            if let Some(credits) = event["usage"]["credits_consumed"].as_u64() {
                told = Some(credits);
            }
        }
        return (status, id, told);
    }
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    (
        status,
        body["id"].as_str().map(str::to_owned),
        body["usage"]["credits_consumed"].as_u64(),
    )
}

/// Sends one turn and reads what its client is told.
async fn turn(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    what: &'static str,
    text: &str,
) -> (u16, Option<String>, Option<u64>) {
    match send(http, api, key, what, text).await {
        Some(response) => told(what, response, String::new()).await,
        None => (0, None, None),
    }
}

/// Clients sending turns round robin over the pods up until told to stop.
struct Load {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(targets: &Targets, keys: &[String]) -> Load {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let turns = Arc::new(AtomicUsize::new(0));
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("http client");
        let clients = (0..CLIENTS)
            .map(|client| {
                let (seen, stop, turns) = (seen.clone(), stop.clone(), turns.clone());
                let (targets, http) = (targets.clone(), http.clone());
                let key = keys[client % keys.len()].clone();
                tokio::spawn(async move {
                    let long = words(40);
                    while !stop.load(Ordering::Relaxed) {
                        let n = turns.fetch_add(1, Ordering::Relaxed);
                        let Some((pod, api)) = targets.pick(n) else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        let what = ["messages", "messages-stream", "chat", "chat-stream"][n % 4];
                        let text = if n % 5 == 0 { long.as_str() } else { "hello" };
                        let (status, id, told) = turn(&http, &api, &key, what, text).await;
                        seen.lock().expect("seen").push(Seen {
                            id,
                            what,
                            pod,
                            status,
                            told,
                        });
                        if status != 200 {
                            // Refused or cut off: no hammering a pod that is down.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            seen,
            stop,
            clients,
        }
    }

    async fn finish(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.await.expect("client task");
        }
        let seen = self.seen.lock().expect("seen").clone();
        seen
    }
}

/// Waits until a turn on `api` is served again (after a fault ended).
async fn served_again(api: &str, key: &str, what: &str) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    poll_until(
        &format!("{what}: turns served again"),
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let (status, _, _) = turn(&http, api, key, "messages", "hello").await;
            (status == 200).then_some(())
        },
    )
    .await;
}

/// The ledger's rows: id -> (status, billed).
async fn rows(pg: &PostgresServer) -> HashMap<String, (String, u64)> {
    pg.query("SELECT id, status, billed FROM messages")
        .await
        .lines()
        .filter_map(|line| {
            let mut cols = line.split('|');
            let id = cols.next()?.to_owned();
            let status = cols.next()?.to_owned();
            let billed = cols.next()?.parse().ok()?;
            Some((id, (status, billed)))
        })
        .collect()
}

/// Nothing held: no reservation, no allotment, no account with credits reserved.
async fn nothing_held(pg: &PostgresServer) -> String {
    pg.query(
        "SELECT (SELECT count(*) FROM messages WHERE status = 'reserved') || ' reserved rows, '
             || (SELECT count(*) FROM allotments) || ' allotments, '
             || (SELECT coalesce(sum(reserved), 0) FROM accounts) || ' credits reserved'",
    )
    .await
}

const NOTHING_HELD: &str = "0 reserved rows, 0 allotments, 0 credits reserved";

#[tokio::test]
async fn through_kills_drains_and_outages_every_turn_is_billed_what_its_client_was_told() {
    let mut pg = PostgresServer::start().await;
    // Pod 1 reaches Postgres through a proxy, so that it alone can be cut off.
    let link = TcpProxy::start(pg.port).await;
    let direct = pg.url();
    let proxied = format!("postgres://postgres@127.0.0.1:{}/postgres", link.port);
    let mut cluster = Cluster::start_each(&[&|b| pod(b, &direct), &|b| pod(b, &proxied)]).await;
    let targets = Targets::default();
    for (i, gw) in cluster.pods.iter().enumerate() {
        targets.set(i, Some(gw.api.clone()));
    }
    let mut keys = Vec::new();
    let mut accounts = Vec::new();
    for _ in 0..ACCOUNTS {
        let key = cluster.pods[0]
            .new_key(CREDITS, &KeySpec::tier("enterprise"))
            .await;
        let second = cluster.pods[0]
            .mint_key(&key.account_id, &KeySpec::tier("enterprise"))
            .await;
        accounts.push(key.account_id.clone());
        keys.push(key.secret);
        keys.push(second.secret);
    }
    let probe = keys[0].clone();
    let load = Load::start(&targets, &keys);
    served_again(&cluster.pods[0].api, &probe, "pod 0").await;

    // Redis frozen (only a client-side timeout gets past it), then stopped and restarted.
    cluster.redis.freeze();
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.redis.thaw();
    cluster.redis.stop().await;
    cluster.redis.restart().await;
    served_again(&cluster.pods[0].api, &probe, "after Redis came back").await;

    // Pod 0 killed mid-traffic, then replaced.
    cluster.pods[0].kill_9().await;
    targets.set(0, None);
    cluster.pods[0] = pod(cluster.pod_builder(), &direct).start().await;
    targets.set(0, Some(cluster.pods[0].api.clone()));
    served_again(&cluster.pods[0].api, &probe, "the replaced pod 0").await;

    // Pod 1 drained with streams running past the stale time: they finish within the grace
    // and are billed what they were told.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    targets.set(1, None);
    let mut long_streams = Vec::new();
    for i in 0..6 {
        let what = if i % 2 == 0 {
            "messages-stream"
        } else {
            "chat-stream"
        };
        let key = &keys[i % keys.len()];
        let mut response = send(&http, &cluster.pods[1].api, key, what, &words(400))
            .await
            .expect("a long stream started");
        // Its first bytes: the stream runs on pod 1.
        let first = response.chunk().await.ok().flatten().unwrap_or_default();
        let first = String::from_utf8_lossy(&first).into_owned();
        long_streams.push(tokio::spawn(async move {
            let (status, id, told) = told(what, response, first).await;
            Seen {
                id,
                what,
                pod: 1,
                status,
                told,
            }
        }));
    }
    cluster.pods[1].send_sigterm();
    let mut drained = Vec::new();
    for stream in long_streams {
        drained.push(stream.await.expect("long stream"));
    }
    cluster.pods[1]
        .wait_exit(Duration::from_secs(GRACE_SECS * 3))
        .await;
    assert!(
        drained.iter().all(|s| s.told.is_some()),
        "a stream did not finish during the drain: {drained:?}"
    );
    cluster.pods[1] = pod(cluster.pod_builder(), &proxied).start().await;
    targets.set(1, Some(cluster.pods[1].api.clone()));
    served_again(&cluster.pods[1].api, &probe, "the replaced pod 1").await;

    // Postgres stopped for longer than the stale time.
    pg.stop().await;
    tokio::time::sleep(Duration::from_secs(STALE_SECS + 2)).await;
    pg.restart().await;
    served_again(
        &cluster.pods[0].api,
        &probe,
        "pod 0 after Postgres came back",
    )
    .await;
    served_again(
        &cluster.pods[1].api,
        &probe,
        "pod 1 after Postgres came back",
    )
    .await;

    // Pod 1 alone cut off from Postgres for longer than the stale time; pod 0 serves on, and
    // takes pod 1 for dead.
    link.cut();
    // Polled by hand rather than with `poll_until`, so that a gateway that never takes it for
    // dead still runs the drill to its money checks.
    let deadline = Instant::now() + Duration::from_secs(STALE_SECS * 5);
    let mut taken = false;
    while !taken && Instant::now() < deadline {
        let leases = pg.try_query("SELECT count(*) FROM gateway_instances").await;
        taken = leases.as_deref() == Ok("1");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    link.restore();
    served_again(
        &cluster.pods[1].api,
        &probe,
        "pod 1 after its link came back",
    )
    .await;

    let mut seen = load.finish().await;
    seen.extend(drained);

    // Idle, every pod returns its allotments; the killed pod's are returned by the reaper.
    let held = poll_until(
        "the pods to return everything they hold",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let held = nothing_held(&pg).await;
            (held == NOTHING_HELD).then_some(held)
        },
    )
    .await;
    assert_eq!(held, NOTHING_HELD);
    for gw in &mut cluster.pods {
        gw.send_sigterm();
        gw.wait_exit(Duration::from_secs(GRACE_SECS * 3)).await;
    }
    assert_eq!(
        nothing_held(&pg).await,
        NOTHING_HELD,
        "held once the pods stopped"
    );

    let ledger = rows(&pg).await;
    let mut wrong = Vec::new();
    for s in &seen {
        if s.status == 500 {
            wrong.push(format!("answered 500: {s:?}"));
        }
        let (Some(told), Some(id)) = (s.told, &s.id) else {
            continue;
        };
        match ledger.get(id) {
            None => wrong.push(format!("told {told}, no ledger row: {s:?}")),
            Some((status, billed)) if *billed != told => {
                wrong.push(format!("told {told}, billed {billed} ({status}): {s:?}"))
            }
            Some((status, _)) if told > 0 && status != "completed" => {
                wrong.push(format!("told {told}, but the row is {status}: {s:?}"))
            }
            Some((status, _))
                if told == 0 && !["unbilled", "abandoned", "failed"].contains(&status.as_str()) =>
            {
                wrong.push(format!("told 0, but the row is {status}: {s:?}"))
            }
            Some(_) => {}
        }
    }
    let told: Vec<&Seen> = seen.iter().filter(|s| s.told.is_some()).collect();
    let mut mix: HashMap<(usize, &str), usize> = HashMap::new();
    for s in &told {
        *mix.entry((s.pod, s.what)).or_default() += 1;
    }
    assert!(
        told.len() >= 200 && told.iter().any(|s| s.told > Some(0)),
        "too few turns answered to tell anything: {} of {}, by pod and kind: {mix:?}",
        told.len(),
        seen.len()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} told turns disagree with the ledger, e.g.:\n{}\n{}",
        wrong.len(),
        told.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        cluster.logs()
    );

    assert!(
        taken,
        "the drill did not take the cut-off pod for dead: fencing not exercised"
    );
    for account in &accounts {
        let books = pg
            .query(&format!(
                "SELECT a.balance, (SELECT coalesce(sum(billed), 0) FROM messages
                                    WHERE account_id = a.id)
                 FROM accounts a WHERE a.id = '{account}'"
            ))
            .await;
        let (balance, billed) = books.split_once('|').expect("two columns");
        let (balance, billed): (i64, i64) = (
            balance.parse().expect("balance"),
            billed.parse().expect("billed"),
        );
        assert!(balance >= 0, "{account}: balance {balance}");
        assert_eq!(
            balance,
            CREDITS as i64 - billed,
            "{account}: the balance is not what was granted minus the rows' bills"
        );
    }
}
