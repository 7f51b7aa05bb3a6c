//! Money under faults (issue 16): two `serve` pods with allotments, mixed JSON and streamed
//! turns on both endpoints from several clients, through the faults of a production drill:
//! Redis frozen then restarted, a pod killed (SIGKILL), a pod drained (SIGTERM) with streams
//! running longer than the reaper's stale time (and two longer than its grace period, cut at
//! its end), Postgres stopped for longer than the stale time, and one pod cut off from
//! Postgres alone (a proxy in between) for longer than the stale time while the other keeps
//! serving. Each fault strikes with turns in flight on the pod it hits (the pod's own
//! `gateway_turns_in_flight`). Then every turn started is accounted for (`account_for`): told a
//! `credits_consumed` its row bills, with a status that says so (a stream cut by the drain's
//! end billed the price of what its client received); or cut before it was told, its row
//! saying why and billing what its client received (no row only when its answer broke off
//! while its pod was being killed: an allotted turn's row is written when it ends, so one in
//! flight goes with its pod, its credits back with the allotment; any other 200 without a row
//! is a turn served and never billed, and fails); or refused with no credits held; or
//! never reached a gateway. The report lists the count in each class, and the classes the
//! faults must hit are not empty. No answer is a 500; balances never go below zero and equal
//! the credits granted minus the rows' bills; once the pods stop, nothing is left reserved and
//! no allotment is left. Both stores take TLS only (`start_tls`), as managed ones do.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::books::{received_text, wait_for_turns_in_flight, RoutePrice};
use e2e::{
    chat_body, chat_stream_body, message, message_stream, poll_until, words, Cluster,
    GatewayBuilder, KeySpec, ManifestDir, PostgresServer, RedisServer, TcpProxy,
};
use serde_json::Value;

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
#[derive(Clone, Debug, Default)]
struct Seen {
    what: &'static str,
    pod: usize,
    /// HTTP status; 0 when no answer came.
    status: u16,
    /// The connection was refused: the turn never reached a gateway.
    connection_refused: bool,
    /// The turn's id (its answer's `request-id`), if the answer's head came.
    id: Option<String>,
    /// The usage it was told (with `credits_consumed`), if its answer got that far.
    usage: Option<Value>,
    /// The output its client received, when it streamed.
    received: String,
    /// Its answer's body broke off (rather than ending).
    cut: bool,
    /// Its pod's kill phase (see [`Targets::killing`]) when it was sent and when its answer
    /// ended.
    phases: (usize, usize),
}

impl Seen {
    /// It ran while its pod was killed: sent during a kill, or a kill began before it ended.
    fn killed_while_running(&self) -> bool {
        let (sent, ended) = self.phases;
        sent % 2 == 1 || ended > sent
    }

    /// The `credits_consumed` it was told.
    fn told(&self) -> Option<u64> {
        self.usage.as_ref()?["credits_consumed"].as_u64()
    }

    /// The input tokens it was told.
    fn input(&self) -> Option<u64> {
        let usage = self.usage.as_ref()?;
        usage["input_tokens"]
            .as_u64()
            .or(usage["prompt_tokens"].as_u64())
    }
}

/// The API base URL of each pod, `None` while it is down or draining; and each pod's kill
/// phase: odd while it is being killed, even otherwise (two more for each kill).
#[derive(Clone, Default)]
struct Targets(Arc<Mutex<Vec<Option<String>>>>, Arc<[AtomicUsize; 2]>);

impl Targets {
    /// Marks the start (before the signal) or the end (once the process is gone) of a kill of
    /// `pod`, so that a turn can tell whether its pod was killed while it ran.
    fn killing(&self, pod: usize) {
        self.1[pod].fetch_add(1, Ordering::SeqCst);
    }

    fn phase(&self, pod: usize) -> usize {
        self.1[pod].load(Ordering::SeqCst)
    }

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

/// Sends one turn; on failure, whether the connection was refused (nothing sent).
async fn send(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    what: &'static str,
    text: &str,
) -> Result<reqwest::Response, bool> {
    let (path, body) = match what {
        "messages" => ("/v1/messages", message("svc/haiku", text, 1_024)),
        "messages-stream" => ("/v1/messages", message_stream("svc/haiku", text, 1_024)),
        "chat" => (
            "/v1/chat/completions",
            chat_body("svc/haiku", text, Some(1_024)),
        ),
        _ => (
            "/v1/chat/completions",
            chat_stream_body("svc/haiku", text, Some(1_024)),
        ),
    };
    http.post(format!("{api}{path}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .map_err(|e| e.is_connect())
}

/// Reads the rest of a turn's answer (`text`: what was read of it already), however it ends.
async fn told(
    what: &'static str,
    pod: usize,
    mut response: reqwest::Response,
    mut text: String,
) -> Seen {
    let status = response.status().as_u16();
    let id = response
        .headers()
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // A stream cut midway still shows what it carried before.
    let cut = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    let mut seen = Seen {
        what,
        pod,
        status,
        id,
        cut,
        ..Seen::default()
    };
    if status != 200 {
        return seen;
    }
    if what.ends_with("stream") {
        let payloads = sse_payloads(&text);
        seen.received = received_text(&payloads);
        seen.usage = payloads
            .iter()
            .rev()
            .find(|p| p["usage"]["credits_consumed"].is_u64())
            .map(|p| p["usage"].clone());
        return seen;
    }
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    seen.usage = Some(body["usage"].clone()).filter(|u| u["credits_consumed"].is_u64());
    seen
}

/// Sends one turn and reads what its client is told.
async fn turn(
    http: &reqwest::Client,
    targets: &Targets,
    (pod, api): (usize, &str),
    key: &str,
    what: &'static str,
    text: &str,
) -> Seen {
    let sent = targets.phase(pod);
    let mut seen = match send(http, api, key, what, text).await {
        Ok(response) => told(what, pod, response, String::new()).await,
        Err(connection_refused) => Seen {
            what,
            pod,
            connection_refused,
            ..Seen::default()
        },
    };
    seen.phases = (sent, targets.phase(pod));
    seen
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
                        // Every kind on every pod (the pod is picked by n, the kind by n / 2).
                        let what =
                            ["messages", "messages-stream", "chat", "chat-stream"][n / 2 % 4];
                        let text = if n % 5 == 0 { long.as_str() } else { "hello" };
                        let one = turn(&http, &targets, (pod, &api), &key, what, text).await;
                        let status = one.status;
                        seen.lock().expect("seen").push(one);
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

/// Waits until a turn on pod `pod` is served again (after a fault ended); every probe is a
/// turn, and goes into `seen` with the others.
async fn served_again(
    cluster: &Cluster,
    targets: &Targets,
    pod: usize,
    key: &str,
    seen: &Mutex<Vec<Seen>>,
    what: &str,
) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    let api = cluster.pods[pod].api.clone();
    poll_until(
        &format!("{what}: turns served again"),
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            let probe = turn(&http, targets, (pod, &api), key, "messages", "hello").await;
            let served = probe.status == 200;
            seen.lock().expect("seen").push(probe);
            served.then_some(())
        },
    )
    .await;
}

/// A ledger row: its status, bill and input tokens.
#[derive(Debug)]
struct Row {
    status: String,
    billed: u64,
    input: u64,
}

/// The ledger's rows by id.
async fn rows(pg: &PostgresServer) -> HashMap<String, Row> {
    pg.query("SELECT id, status, billed, input_tokens FROM message_rows")
        .await
        .lines()
        .filter_map(|line| {
            let mut cols = line.split('|');
            let id = cols.next()?.to_owned();
            let status = cols.next()?.to_owned();
            let billed = cols.next()?.parse().ok()?;
            let input = cols.next()?.parse().ok()?;
            Some((
                id,
                Row {
                    status,
                    billed,
                    input,
                },
            ))
        })
        .collect()
}

/// Nothing held: no reservation, no allotment, no account with credits reserved.
async fn nothing_held(pg: &PostgresServer) -> String {
    pg.query(
        "SELECT (SELECT count(*) FROM message_rows WHERE status = 'reserved') || ' reserved rows, '
             || (SELECT count(*) FROM allotments) || ' allotments, '
             || (SELECT coalesce(sum(reserved), 0) FROM accounts) || ' credits reserved'",
    )
    .await
}

const NOTHING_HELD: &str = "0 reserved rows, 0 allotments, 0 credits reserved";

/// Turns holding credits on the pod a fault hits, at least, when it strikes (its own gauge).
const IN_FLIGHT_AT_FAULT: u64 = 2;
/// Streams on the drained pod that finish within the grace, and that outlive it.
const LONG_STREAMS: usize = 6;
const CUT_STREAMS: usize = 2;

/// The classes of turns the faults must have hit (see [`account_for`]).
const FAULT_HIT: [&str; 3] = [
    "cut by the drain's end, told its bill",
    "cut without a bill told (its pod killed)",
    "refused (no credits held)",
];

/// Every turn started, each in one class, and what disagrees with the ledger.
struct Accounted {
    classes: std::collections::BTreeMap<&'static str, usize>,
    wrong: Vec<String>,
}

/// Accounts for every turn started: it was told a number its row bills; or it was cut without
/// one, and its row (if any) says why and bills what its client received; or it was refused,
/// holding no credits; or it never reached a gateway; or its answer was lost before its head
/// came, and the rows no client knows of are no more than those, each billed nothing (or in
/// the failure matrix' microsecond window of a kill: written, and its answer lost).
fn account_for(seen: &[Seen], ledger: &HashMap<String, Row>) -> Accounted {
    let price = RoutePrice::of("svc/haiku");
    let mut classes = std::collections::BTreeMap::new();
    let mut wrong = Vec::new();
    let cut_statuses = [
        "abandoned",
        "client_disconnected",
        "interrupted",
        "failed",
        "unbilled",
    ];
    for s in seen {
        if s.status == 500 {
            wrong.push(format!("answered 500: {s:?}"));
        }
        let row = s.id.as_ref().and_then(|id| ledger.get(id));
        let class = match (s.status, s.told(), row) {
            (0, _, _) if s.connection_refused => "never reached a gateway (connection refused)",
            (0, _, _) => "answer lost before its head (no id)",
            (200, Some(told), None) => {
                wrong.push(format!("told {told}, no ledger row: {s:?}"));
                "told, no row"
            }
            (200, Some(told), Some(row)) if row.billed != told => {
                wrong.push(format!(
                    "told {told}, billed {} ({}): {s:?}",
                    row.billed, row.status
                ));
                "told other than billed"
            }
            (200, Some(told), Some(row)) if row.status == "interrupted" => {
                let input = s.input().unwrap_or(row.input);
                let due = price.cut_stream(input, &s.received);
                if told != due {
                    wrong.push(format!(
                        "cut by the drain and told {told}, but its input and the output received cost {due}: {s:?}"
                    ));
                }
                "cut by the drain's end, told its bill"
            }
            (200, Some(told), Some(row)) if told > 0 && row.status != "completed" => {
                wrong.push(format!("told {told}, but the row is {}: {s:?}", row.status));
                "told, wrong status"
            }
            (200, Some(0), Some(row))
                if !["unbilled", "abandoned", "failed"].contains(&row.status.as_str()) =>
            {
                wrong.push(format!("told 0, but the row is {}: {s:?}", row.status));
                "told 0, wrong status"
            }
            (200, Some(_), Some(_)) => "told, billed as told",
            // Cut before its bill was told, and no row: only an allotted turn whose pod was
            // killed while it ran (its row is written when it ends; its allotment goes back
            // whole). Any other 200 without a row is a turn served and never billed.
            (200, None, None) if s.cut && s.killed_while_running() => {
                "cut without a bill told (its pod killed)"
            }
            (200, None, None) => {
                wrong.push(format!(
                    "answered 200, told no bill and has no ledger row, though its pod was not killed while it ran: {s:?}"
                ));
                "200 without a row"
            }
            (200, None, Some(row)) => {
                let due = if s.received.is_empty() || row.status == "abandoned" {
                    // Nothing received; or written off, as the failure matrix says of a
                    // killed pod's streams.
                    0
                } else {
                    price.cut_stream(row.input, &s.received)
                };
                if !cut_statuses.contains(&row.status.as_str()) || row.billed != due {
                    wrong.push(format!(
                        "cut before its bill was told, row {row:?}, where {due} was due: {s:?}"
                    ));
                }
                "cut without a bill told (its pod killed)"
            }
            (_, _, None) => "refused (no credits held)",
            (_, _, Some(row)) => {
                if row.billed != 0 || !cut_statuses.contains(&row.status.as_str()) {
                    wrong.push(format!("refused, but its row is {row:?}: {s:?}"));
                }
                "refused (no credits held)"
            }
        };
        *classes.entry(class).or_insert(0) += 1;
    }
    let known: std::collections::HashSet<&String> =
        seen.iter().filter_map(|s| s.id.as_ref()).collect();
    let unknown: Vec<(&String, &Row)> = ledger
        .iter()
        .filter(|(id, _)| !known.contains(id))
        .collect();
    let lost = classes
        .get("answer lost before its head (no id)")
        .copied()
        .unwrap_or(0);
    if unknown.len() > lost {
        wrong.push(format!(
            "{} rows no client knows of, for {lost} turns whose answers were lost: {unknown:?}",
            unknown.len()
        ));
    }
    for (id, row) in unknown {
        // A client that gave up before its answer's head (its timeout) left a non-streamed
        // turn: it pays the input its upstream was sent (docs/ledger.md, "Hang-ups").
        let hung_up =
            row.status == "client_disconnected" && row.billed == price.credits(row.input, 0);
        if row.billed != 0 && row.status != "completed" && !hung_up {
            wrong.push(format!("{id}: a row no client knows of bills {row:?}"));
        }
    }
    Accounted { classes, wrong }
}

#[tokio::test]
async fn through_kills_drains_and_outages_every_turn_is_billed_what_its_client_was_told() {
    // Both stores over TLS only, as managed ones are.
    let mut pg = PostgresServer::start_tls().await;
    // Pod 1 reaches Postgres through a proxy, so that it alone can be cut off.
    let link = TcpProxy::start(pg.port).await;
    let direct = pg.url();
    let proxied = pg.url_on(link.port);
    let mut cluster = Cluster::start_with_redis(
        RedisServer::start_tls().await,
        ManifestDir::cluster(),
        &[&|b| pod(b, &direct), &|b| pod(b, &proxied)],
    )
    .await;
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
    let seen = load.seen.clone();
    served_again(&cluster, &targets, 0, &probe, &seen, "pod 0").await;

    // Redis frozen (only a client-side timeout gets past it), then stopped and restarted.
    let mut in_flight = vec![(
        "Redis frozen",
        wait_for_turns_in_flight(&cluster.pods[0], 1).await,
    )];
    cluster.redis.freeze();
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.redis.thaw();
    cluster.redis.stop().await;
    cluster.redis.restart().await;
    served_again(
        &cluster,
        &targets,
        0,
        &probe,
        &seen,
        "after Redis came back",
    )
    .await;

    // Pod 0 killed mid-traffic, with turns (a stream among them) in flight, then replaced.
    let (turns, streams) = poll_until(
        "pod 0 to have turns in flight, a stream among them",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || async {
            let scrape = cluster.pods[0].metrics().await;
            let turns = scrape.value("gateway_turns_in_flight", &[]) as u64;
            let streams = scrape.value("gateway_streams_in_flight", &[]) as u64;
            (turns >= IN_FLIGHT_AT_FAULT && streams >= 1).then_some((turns, streams))
        },
    )
    .await;
    targets.killing(0);
    cluster.pods[0].kill_9().await;
    targets.killing(0);
    in_flight.push(("pod 0 killed (turns)", turns));
    in_flight.push(("pod 0 killed (streams)", streams));
    targets.set(0, None);
    cluster.pods[0] = pod(cluster.pod_builder(), &direct).start().await;
    targets.set(0, Some(cluster.pods[0].api.clone()));
    served_again(&cluster, &targets, 0, &probe, &seen, "the replaced pod 0").await;

    // Pod 1 drained with streams running past the stale time: they finish within the grace
    // and are billed what they were told; and streams longer than the grace, cut at its end,
    // told their bills all the same.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("http client");
    targets.set(1, None);
    let mut long_streams = Vec::new();
    for i in 0..LONG_STREAMS + CUT_STREAMS {
        let what = if i % 2 == 0 {
            "messages-stream"
        } else {
            "chat-stream"
        };
        // Past the grace period: max_tokens (1,024) at 4 tokens a chunk, 60 ms apart, is 15 s.
        let text = if i < LONG_STREAMS {
            words(400)
        } else {
            words(1_200)
        };
        let key = &keys[i % keys.len()];
        let mut response = send(&http, &cluster.pods[1].api, key, what, &text)
            .await
            .expect("a long stream started");
        // Its first bytes: the stream runs on pod 1.
        let first = response.chunk().await.ok().flatten().unwrap_or_default();
        let first = String::from_utf8_lossy(&first).into_owned();
        long_streams.push(tokio::spawn(told(what, 1, response, first)));
    }
    let drained_in_flight =
        wait_for_turns_in_flight(&cluster.pods[1], (LONG_STREAMS + CUT_STREAMS) as u64).await;
    in_flight.push(("pod 1 drained", drained_in_flight));
    cluster.pods[1].send_sigterm();
    let mut drained = Vec::new();
    for stream in long_streams {
        drained.push(stream.await.expect("long stream"));
    }
    cluster.pods[1]
        .wait_exit(Duration::from_secs(GRACE_SECS * 3))
        .await;
    assert!(
        drained.iter().all(|s| s.told().is_some()),
        "a stream was not told its bill during the drain: {drained:?}"
    );
    cluster.pods[1] = pod(cluster.pod_builder(), &proxied).start().await;
    targets.set(1, Some(cluster.pods[1].api.clone()));
    served_again(&cluster, &targets, 1, &probe, &seen, "the replaced pod 1").await;

    // Postgres stopped for longer than the stale time.
    in_flight.push((
        "Postgres stopped",
        wait_for_turns_in_flight(&cluster.pods[0], 1).await,
    ));
    pg.stop().await;
    tokio::time::sleep(Duration::from_secs(STALE_SECS + 2)).await;
    pg.restart().await;
    served_again(
        &cluster,
        &targets,
        0,
        &probe,
        &seen,
        "pod 0 after Postgres came back",
    )
    .await;
    served_again(
        &cluster,
        &targets,
        1,
        &probe,
        &seen,
        "pod 1 after Postgres came back",
    )
    .await;

    // Pod 1 alone cut off from Postgres for longer than the stale time; pod 0 serves on, and
    // takes pod 1 for dead.
    in_flight.push((
        "pod 1 cut off",
        wait_for_turns_in_flight(&cluster.pods[1], 1).await,
    ));
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
        &cluster,
        &targets,
        1,
        &probe,
        &seen,
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
    let accounted = account_for(&seen, &ledger);
    eprintln!(
        "turns in flight at each fault: {in_flight:?}\nevery turn started, by class: {:#?}",
        accounted.classes
    );
    let told: Vec<&Seen> = seen.iter().filter(|s| s.told().is_some()).collect();
    let mut mix: HashMap<(usize, &str), usize> = HashMap::new();
    for s in &told {
        *mix.entry((s.pod, s.what)).or_default() += 1;
    }
    assert!(
        told.len() >= 200 && told.iter().any(|s| s.told() > Some(0)),
        "too few turns answered to tell anything: {} of {}, by pod and kind: {mix:?}",
        told.len(),
        seen.len()
    );
    assert!(
        accounted.wrong.is_empty(),
        "{} of {} turns started disagree with the ledger, e.g.:\n{}\n{}",
        accounted.wrong.len(),
        seen.len(),
        accounted
            .wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        cluster.logs()
    );
    for class in FAULT_HIT {
        assert!(
            accounted.classes.get(class).copied().unwrap_or(0) > 0,
            "no turn was {class}: the faults hit nothing ({:?})",
            accounted.classes
        );
    }

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
        // Through kills, voids and the reaper, the rollups never fell behind the rows.
        e2e::books::assert_rollups_match_rows(&pg, account).await;
    }
}
