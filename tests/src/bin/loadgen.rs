//! Load generator for the gateway's model endpoints: `POST /v1/messages` (the default),
//! `/v1/chat/completions` or `/v1/responses` (`--endpoint messages|chat|responses`).
//!
//! Modes:
//! - `--mode json`: a fixed number of connections (`--connections`), each sending one tiny
//!   non-streamed request after the other for `--duration` seconds (and never more than
//!   `--max-requests` in total); reports requests/s, latency percentiles and status counts.
//! - `--mode stream`: the same with `"stream": true`; latency is reported twice, as time to the
//!   first body byte and time to the last byte, and every 200 stream must end in its
//!   endpoint's final event (`message_stop`, `[DONE]`, `response.completed`).
//! - `--mode hold --streams N --pid PID`: opens N concurrent streams against a gateway whose
//!   simulated upstream has a long chunk delay, waits until every stream got its first bytes,
//!   and reads the gateway's VmRSS from `/proc/PID/status` before and while holding them; it
//!   reports the resident memory per 1,000 open streams.
//!
//! `--disconnect-after-bytes N` makes every stream go away after its first N body bytes (a
//! client that disconnects mid-stream), and `--no-preflight` skips the check that the key gets
//! a 200 (a key whose answers are meant to be 402s, 429s or 401s): `scripts/soak` mixes such
//! runs against one gateway.
//!
//! Only loopback targets are meant; nothing here retries, so every non-200 is reported as is.
//! Output is a human summary (`--format text`) or markdown table rows (`--format markdown`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Client, StatusCode, Url};
use tokio::sync::{mpsc, watch, Semaphore};

const USAGE: &str = "\
usage: loadgen --mode json|stream|hold [options]
  --url URL              gateway API base (default http://127.0.0.1:8080)
  --key KEY              API key sent as Authorization: Bearer (default $GATEWAY_KEY)
  --model ID             virtual model (default svc/haiku)
  --endpoint NAME        messages|chat|responses (default messages)
  --max-tokens N         max_tokens of the tiny request (default 16)
  --connections N        json/stream: concurrent connections (default 32)
  --duration SECS        json/stream: measured duration (default 10)
  --warmup SECS          json/stream: unmeasured warm-up before it (default 1)
  --max-requests N       json/stream: hard cap on requests sent, warm-up included (default 10000000)
  --rate N               json/stream: paced total requests/s over all connections (default: back to back)
  --timeout SECS         per-request timeout (default 30)
  --disconnect-after-bytes N  stream: drop each stream after its first N body bytes
  --no-preflight         json/stream: do not require a first 200 (refusals are the point)
  --local-address IP     connect from this address (e.g. 127.0.0.2: another client to the gateway)
  --streams N            hold: concurrent streams to open (default 1000)
  --pid PID              hold: gateway process whose VmRSS is read
  --open-concurrency N   hold: streams being opened at the same time (default 100)
  --hold-timeout SECS    hold: how long opening all streams may take (default 60)
  --threads N            runtime worker threads (default: number of CPUs)
  --format text|markdown output (default text)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Json,
    Stream,
    Hold,
}

/// The bytes kept of a stream's end to find its final event: the Responses API's
/// `response.completed` carries the whole response after its type, so a few KiB.
const STREAM_TAIL: usize = 4096;

/// The model endpoint under load, and how its answers are recognised as whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Messages,
    Chat,
    Responses,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Self::Messages => "/v1/messages",
            Self::Chat => "/v1/chat/completions",
            Self::Responses => "/v1/responses",
        }
    }

    fn body(self, model: &str, max_tokens: u32, stream: bool) -> serde_json::Value {
        let mut body = match self {
            Self::Messages | Self::Chat => serde_json::json!({
                "model": model,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "ping"}],
            }),
            Self::Responses => serde_json::json!({
                "model": model,
                "max_output_tokens": max_tokens,
                "input": "ping",
                "store": false,
            }),
        };
        if stream {
            body["stream"] = serde_json::Value::Bool(true);
        }
        body
    }

    /// What the last bytes of a whole stream contain.
    fn stream_end(self) -> &'static [u8] {
        match self {
            Self::Messages => b"message_stop",
            Self::Chat => b"[DONE]",
            Self::Responses => b"response.completed",
        }
    }

    /// What a whole JSON answer contains: its id's prefix.
    fn id_prefix(self) -> &'static str {
        match self {
            Self::Messages => "msg_",
            Self::Chat => "chatcmpl_",
            Self::Responses => "resp_",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Text,
    Markdown,
}

#[derive(Debug)]
struct Args {
    mode: Mode,
    url: String,
    key: String,
    model: String,
    endpoint: Endpoint,
    max_tokens: u32,
    connections: usize,
    duration: Duration,
    warmup: Duration,
    max_requests: u64,
    /// Paced total requests per second; `None`: each connection sends back to back.
    rate: Option<f64>,
    timeout: Duration,
    disconnect_after_bytes: Option<u64>,
    preflight: bool,
    local_address: Option<std::net::IpAddr>,
    streams: usize,
    pid: Option<u32>,
    open_concurrency: usize,
    hold_timeout: Duration,
    format: Format,
    threads: usize,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        mode: Mode::Json,
        url: "http://127.0.0.1:8080".into(),
        key: std::env::var("GATEWAY_KEY").unwrap_or_default(),
        model: "svc/haiku".into(),
        endpoint: Endpoint::Messages,
        max_tokens: 16,
        connections: 32,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(1),
        max_requests: 10_000_000,
        rate: None,
        timeout: Duration::from_secs(30),
        disconnect_after_bytes: None,
        preflight: true,
        local_address: None,
        streams: 1000,
        pid: None,
        open_concurrency: 100,
        hold_timeout: Duration::from_secs(60),
        format: Format::Text,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if flag == "--no-preflight" {
            args.preflight = false;
            continue;
        }
        let value = it
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        let secs = |v: &str| -> Result<Duration> {
            let s: f64 = v
                .parse()
                .with_context(|| format!("{flag}: not a number of seconds"))?;
            ensure!(
                s >= 0.0 && s.is_finite(),
                "{flag}: must be a non-negative number"
            );
            Ok(Duration::from_secs_f64(s))
        };
        match flag.as_str() {
            "--mode" => {
                args.mode = match value.as_str() {
                    "json" => Mode::Json,
                    "stream" => Mode::Stream,
                    "hold" => Mode::Hold,
                    other => bail!("unknown mode {other}\n{USAGE}"),
                }
            }
            "--url" => args.url = value.trim_end_matches('/').to_string(),
            "--key" => args.key = value,
            "--model" => args.model = value,
            "--endpoint" => {
                args.endpoint = match value.as_str() {
                    "messages" => Endpoint::Messages,
                    "chat" => Endpoint::Chat,
                    "responses" => Endpoint::Responses,
                    other => bail!("unknown endpoint {other}\n{USAGE}"),
                }
            }
            "--max-tokens" => args.max_tokens = value.parse()?,
            "--connections" => args.connections = value.parse()?,
            "--duration" => args.duration = secs(&value)?,
            "--warmup" => args.warmup = secs(&value)?,
            "--max-requests" => args.max_requests = value.parse()?,
            "--rate" => {
                let rate: f64 = value.parse()?;
                ensure!(rate > 0.0 && rate.is_finite(), "--rate must be positive");
                args.rate = Some(rate);
            }
            "--timeout" => args.timeout = secs(&value)?,
            "--disconnect-after-bytes" => args.disconnect_after_bytes = Some(value.parse()?),
            "--local-address" => args.local_address = Some(value.parse()?),
            "--streams" => args.streams = value.parse()?,
            "--pid" => args.pid = Some(value.parse()?),
            "--open-concurrency" => args.open_concurrency = value.parse()?,
            "--hold-timeout" => args.hold_timeout = secs(&value)?,
            "--threads" => args.threads = value.parse()?,
            "--format" => {
                args.format = match value.as_str() {
                    "text" => Format::Text,
                    "markdown" => Format::Markdown,
                    other => bail!("unknown format {other}"),
                }
            }
            other => bail!("unknown flag {other}\n{USAGE}"),
        }
    }
    ensure!(!args.key.is_empty(), "--key (or $GATEWAY_KEY) is required");
    ensure!(
        args.connections > 0 && args.connections <= 10_000,
        "--connections must be 1..=10000"
    );
    ensure!(
        args.streams > 0 && args.streams <= 100_000,
        "--streams must be 1..=100000"
    );
    ensure!(
        args.open_concurrency > 0,
        "--open-concurrency must be positive"
    );
    ensure!(args.max_requests > 0, "--max-requests must be positive");
    ensure!(args.threads > 0, "--threads must be positive");
    Ok(args)
}

/// The request every connection sends: built once, shared by reference.
struct Target {
    endpoint: Endpoint,
    url: Url,
    headers: HeaderMap,
    body: &'static [u8],
    /// Streams are dropped after this many body bytes.
    disconnect_after_bytes: Option<u64>,
}

impl Target {
    fn new(args: &Args, stream: bool) -> Result<Self> {
        let endpoint = args.endpoint;
        let url = Url::parse(&format!("{}{}", args.url, endpoint.path())).context("--url")?;
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {}", args.key))?,
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let body = endpoint.body(&args.model, args.max_tokens, stream);
        // Leaked once so that every request borrows the same bytes instead of copying them.
        let body: &'static [u8] = Box::leak(serde_json::to_vec(&body)?.into_boxed_slice());
        Ok(Self {
            endpoint,
            url,
            headers,
            body,
            disconnect_after_bytes: args.disconnect_after_bytes.filter(|_| stream),
        })
    }

    fn request(&self, client: &Client) -> reqwest::RequestBuilder {
        client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(self.body)
    }
}

/// What one connection saw; merged after the run.
#[derive(Default)]
struct Stats {
    /// Whole-request latency (json) or time to the last byte (stream), in microseconds.
    total_us: Vec<u32>,
    /// Time to the first body byte (stream only), in microseconds.
    first_us: Vec<u32>,
    statuses: BTreeMap<u16, u64>,
    failures: BTreeMap<&'static str, u64>,
    /// Streams dropped on purpose (`--disconnect-after-bytes`).
    disconnected: u64,
    bytes: u64,
    last_finish: Option<Instant>,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.total_us.extend(other.total_us);
        self.first_us.extend(other.first_us);
        for (k, v) in other.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
        for (k, v) in other.failures {
            *self.failures.entry(k).or_default() += v;
        }
        self.bytes += other.bytes;
        self.disconnected += other.disconnected;
        self.last_finish = self.last_finish.max(other.last_finish);
    }

    fn fail(&mut self, what: &'static str) {
        *self.failures.entry(what).or_default() += 1;
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn transport_failure(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect error"
    } else if e.is_body() || e.is_decode() {
        "body error"
    } else {
        "transport error"
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// When one connection sends: from `measure_from` its requests count, at `deadline` it stops;
/// paced, its first send is at `pace.0` and the next ones every `pace.1`.
#[derive(Clone, Copy)]
struct Schedule {
    pace: Option<(Instant, Duration)>,
    measure_from: Instant,
    deadline: Instant,
}

/// One connection: requests back to back (or paced) until the deadline or the global cap.
async fn connection(
    client: Client,
    target: Arc<Target>,
    stream: bool,
    issued: Arc<AtomicU64>,
    max_requests: u64,
    schedule: Schedule,
) -> Stats {
    let Schedule {
        pace,
        measure_from,
        deadline,
    } = schedule;
    let mut stats = Stats::default();
    let mut seen: Vec<u8> = Vec::with_capacity(4096);
    let id_marker = format!("\"{}", target.endpoint.id_prefix());
    let mut next = pace.map(|(first, _)| first);
    while Instant::now() < deadline && issued.fetch_add(1, Ordering::Relaxed) < max_requests {
        // Paced: each send is scheduled; a late one goes at once and its latency is measured
        // from when it was sent.
        if let (Some(at), Some((_, every))) = (next.as_mut(), pace) {
            tokio::time::sleep_until((*at).into()).await;
            *at += every;
        }
        let start = Instant::now();
        let measured = start >= measure_from;
        let mut response = match target.request(&client).send().await {
            Ok(r) => r,
            Err(e) => {
                if measured {
                    stats.fail(transport_failure(&e));
                }
                continue;
            }
        };
        let status = response.status();
        let mut first: Option<Instant> = None;
        let mut bytes = 0u64;
        let mut complete = true;
        let mut disconnected = false;
        // json: the whole body (a few hundred bytes); stream: its last STREAM_TAIL bytes, enough to
        // see the final SSE event. The buffer keeps its capacity from request to request.
        seen.clear();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    first.get_or_insert_with(Instant::now);
                    bytes += chunk.len() as u64;
                    if target.disconnect_after_bytes.is_some_and(|n| bytes >= n) {
                        disconnected = true;
                        break;
                    }
                    if stream {
                        seen.extend_from_slice(&chunk[chunk.len().saturating_sub(STREAM_TAIL)..]);
                        if seen.len() > STREAM_TAIL {
                            seen.drain(..seen.len() - STREAM_TAIL);
                        }
                    } else {
                        seen.extend_from_slice(&chunk);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    if measured {
                        stats.fail(transport_failure(&e));
                    }
                    complete = false;
                    break;
                }
            }
        }
        // Dropping the response mid-body closes its connection: the gateway sees the client go.
        drop(response);
        let end = Instant::now();
        if !measured {
            continue;
        }
        if disconnected {
            stats.disconnected += 1;
            continue;
        }
        *stats.statuses.entry(status.as_u16()).or_default() += 1;
        stats.bytes += bytes;
        stats.last_finish = Some(end);
        if status != StatusCode::OK {
            continue;
        }
        if !complete {
            continue;
        }
        if stream && !contains(&seen, target.endpoint.stream_end()) {
            stats.fail("200 stream without its final event");
            continue;
        }
        if !stream && !contains(&seen, id_marker.as_bytes()) {
            stats.fail("200 without an id");
            continue;
        }
        stats.total_us.push(micros(end - start));
        if stream {
            stats.first_us.push(micros(first.unwrap_or(end) - start));
        }
    }
    stats
}

/// Sends one request and checks that the gateway answers the way the benchmark assumes.
async fn preflight(client: &Client, target: &Target, stream: bool) -> Result<()> {
    let response = target
        .request(client)
        .send()
        .await
        .context("preflight request")?;
    let status = response.status();
    let text = response.text().await?;
    ensure!(status == StatusCode::OK, "preflight: {status} {text}");
    if stream {
        ensure!(
            contains(text.as_bytes(), target.endpoint.stream_end()),
            "preflight: stream without its final event: {text}"
        );
    } else {
        let body: serde_json::Value = serde_json::from_str(&text)?;
        ensure!(
            body["id"]
                .as_str()
                .is_some_and(|id| id.starts_with(target.endpoint.id_prefix())),
            "preflight: unexpected body {text}"
        );
    }
    Ok(())
}

struct Percentiles {
    p50: u32,
    p90: u32,
    p99: u32,
    max: u32,
}

fn percentiles(values: &mut [u32]) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let at =
        |q: f64| values[(((values.len() as f64) * q).ceil() as usize).clamp(1, values.len()) - 1];
    Some(Percentiles {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: values[values.len() - 1],
    })
}

fn ms(us: u32) -> String {
    format!("{:.2} ms", f64::from(us) / 1000.0)
}

fn outcome_summary(stats: &Stats) -> String {
    let mut out = String::new();
    for (status, n) in &stats.statuses {
        if *status != 200 {
            let _ = write!(
                out,
                "{}{status}×{n}",
                if out.is_empty() { "" } else { ", " }
            );
        }
    }
    for (what, n) in &stats.failures {
        let _ = write!(out, "{}{what}×{n}", if out.is_empty() { "" } else { ", " });
    }
    if stats.disconnected > 0 {
        let n = stats.disconnected;
        let _ = write!(
            out,
            "{}disconnected mid-stream×{n}",
            if out.is_empty() { "" } else { ", " }
        );
    }
    if out.is_empty() {
        out.push_str("none");
    }
    out
}

async fn run_load(args: &Args) -> Result<()> {
    let stream = args.mode == Mode::Stream;
    let target = Arc::new(Target::new(args, stream)?);
    let build_client = || {
        Client::builder()
            .timeout(args.timeout)
            .local_address(args.local_address)
            .pool_max_idle_per_host(1)
            .tcp_nodelay(true)
            .build()
    };
    if args.preflight {
        preflight(&build_client()?, &target, stream).await?;
    }

    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let measure_from = started + args.warmup;
    let deadline = measure_from + args.duration;
    let mut tasks = Vec::with_capacity(args.connections);
    // Paced: connection i sends every connections/rate seconds, offset by i/rate.
    let every = args
        .rate
        .map(|rate| Duration::from_secs_f64(args.connections as f64 / rate));
    for i in 0..args.connections {
        let pace = every.map(|every| {
            let offset = every.mul_f64(i as f64 / args.connections as f64);
            (started + offset, every)
        });
        // One client per connection: each worker keeps exactly one keep-alive connection.
        tasks.push(tokio::spawn(connection(
            build_client()?,
            target.clone(),
            stream,
            issued.clone(),
            args.max_requests,
            Schedule {
                pace,
                measure_from,
                deadline,
            },
        )));
    }
    let mut stats = Stats::default();
    for task in tasks {
        stats.merge(task.await?);
    }

    let requests: u64 = stats.statuses.values().sum();
    let window = stats
        .last_finish
        .map_or(args.duration, |t| t.saturating_duration_since(measure_from));
    let rps = requests as f64 / window.as_secs_f64().max(1e-9);
    let capped = issued.load(Ordering::Relaxed) >= args.max_requests;
    let mode = if stream { "stream" } else { "json" };
    let outcomes = outcome_summary(&stats);
    let total = percentiles(&mut stats.total_us);
    let first = percentiles(&mut stats.first_us);

    match args.format {
        Format::Text => {
            println!(
                "mode={mode} connections={} measured={:.1}s requests={requests} ({} ok) rps={rps:.0}{}",
                args.connections,
                window.as_secs_f64(),
                stats.total_us.len(),
                if capped { " (request cap reached)" } else { "" }
            );
            let print = |label: &str, p: &Option<Percentiles>| match p {
                Some(p) => println!(
                    "  {label}: p50={} p90={} p99={} max={}",
                    ms(p.p50),
                    ms(p.p90),
                    ms(p.p99),
                    ms(p.max)
                ),
                None => println!("  {label}: no successful requests"),
            };
            if stream {
                print("first byte", &first);
                print("last byte ", &total);
            } else {
                print("latency", &total);
            }
            println!(
                "  statuses: {:?}; non-200/failures: {outcomes}",
                stats.statuses
            );
        }
        Format::Markdown => {
            let row = |label: &str, p: &Option<Percentiles>| {
                let cells = p.as_ref().map_or_else(
                    || "– | – | – | –".to_string(),
                    |p| {
                        format!(
                            "{} | {} | {} | {}",
                            ms(p.p50),
                            ms(p.p90),
                            ms(p.p99),
                            ms(p.max)
                        )
                    },
                );
                println!(
                    "| {label} | {} | {:.1} | {requests} | {rps:.0} | {cells} | {outcomes} |",
                    args.connections,
                    window.as_secs_f64()
                );
            };
            if stream {
                row("stream, first byte", &first);
                row("stream, last byte", &total);
            } else {
                row("json", &total);
            }
        }
    }
    Ok(())
}

fn read_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kib = line
        .split_whitespace()
        .nth(1)
        .context("malformed VmRSS line")?
        .parse()?;
    Ok(kib)
}

/// Median of a few VmRSS samples taken `every` apart.
async fn sample_rss_kib(pid: u32, samples: usize, every: Duration) -> Result<u64> {
    let mut values = Vec::with_capacity(samples);
    for i in 0..samples {
        if i > 0 {
            tokio::time::sleep(every).await;
        }
        values.push(read_rss_kib(pid)?);
    }
    values.sort_unstable();
    Ok(values[values.len() / 2])
}

enum Opened {
    Ok(Duration),
    Status(u16),
    Failed(&'static str),
}

/// Opens one stream, reports when its first bytes arrived, then keeps reading until told to stop.
async fn hold_one(
    client: Client,
    target: Arc<Target>,
    opening: Arc<Semaphore>,
    report: mpsc::Sender<Opened>,
    mut stop: watch::Receiver<bool>,
    ended_early: Arc<AtomicUsize>,
) {
    let permit = opening.acquire_owned().await;
    let start = Instant::now();
    let mut response = match target.request(&client).send().await {
        Ok(r) => r,
        Err(e) => {
            let _ = report.send(Opened::Failed(transport_failure(&e))).await;
            return;
        }
    };
    if response.status() != StatusCode::OK {
        let _ = report
            .send(Opened::Status(response.status().as_u16()))
            .await;
        return;
    }
    match response.chunk().await {
        Ok(Some(_)) => {
            let _ = report.send(Opened::Ok(start.elapsed())).await;
        }
        Ok(None) => {
            let _ = report
                .send(Opened::Failed("stream ended before any byte"))
                .await;
            return;
        }
        Err(e) => {
            let _ = report.send(Opened::Failed(transport_failure(&e))).await;
            return;
        }
    }
    drop(permit);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            chunk = response.chunk() => match chunk {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    ended_early.fetch_add(1, Ordering::Relaxed);
                    // Stay parked until the stop signal, so the count above stays meaningful.
                    let _ = stop.changed().await;
                    return;
                }
            },
        }
    }
}

async fn run_hold(args: &Args) -> Result<()> {
    let pid = args.pid.context("--mode hold needs --pid of the gateway")?;
    let target = Arc::new(Target::new(args, true)?);
    let client = Client::builder()
        .pool_max_idle_per_host(0)
        .tcp_nodelay(true)
        .build()?;

    let before = sample_rss_kib(pid, 3, Duration::from_millis(100)).await?;
    let (report_tx, mut report_rx) = mpsc::channel(args.streams);
    let (stop_tx, stop_rx) = watch::channel(false);
    let opening = Arc::new(Semaphore::new(args.open_concurrency));
    let ended_early = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.streams);
    for _ in 0..args.streams {
        tasks.push(tokio::spawn(hold_one(
            client.clone(),
            target.clone(),
            opening.clone(),
            report_tx.clone(),
            stop_rx.clone(),
            ended_early.clone(),
        )));
    }
    drop(report_tx);

    let mut opened = 0usize;
    let mut first_bytes = Vec::with_capacity(args.streams);
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    let give_up = tokio::time::Instant::now() + args.hold_timeout;
    for _ in 0..args.streams {
        match tokio::time::timeout_at(give_up, report_rx.recv()).await {
            Ok(Some(Opened::Ok(d))) => {
                opened += 1;
                first_bytes.push(micros(d));
            }
            Ok(Some(Opened::Status(s))) => *failures.entry(format!("status {s}")).or_default() += 1,
            Ok(Some(Opened::Failed(what))) => *failures.entry(what.to_string()).or_default() += 1,
            Ok(None) => break,
            Err(_) => {
                *failures
                    .entry("not open before --hold-timeout".into())
                    .or_default() += 1;
                break;
            }
        }
    }
    let open_time = started.elapsed();
    // Let the allocator settle, then sample while every stream is still open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let holding = sample_rss_kib(pid, 5, Duration::from_millis(200)).await?;
    let ended = ended_early.load(Ordering::Relaxed);

    let _ = stop_tx.send(true);
    for task in tasks {
        task.abort();
        let _ = task.await;
    }
    drop(client);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = read_rss_kib(pid)?;

    let still_open = opened.saturating_sub(ended);
    let delta = holding.saturating_sub(before);
    let per_1000_mib = if still_open > 0 {
        delta as f64 / 1024.0 * 1000.0 / still_open as f64
    } else {
        f64::NAN
    };
    let per_stream_kib = if still_open > 0 {
        delta as f64 / still_open as f64
    } else {
        f64::NAN
    };
    let fb = percentiles(&mut first_bytes);
    let fail_text = if failures.is_empty() && ended == 0 {
        "none".to_string()
    } else {
        let mut s: Vec<String> = failures.iter().map(|(k, v)| format!("{k}×{v}")).collect();
        if ended > 0 {
            s.push(format!("ended before the RSS sample×{ended}"));
        }
        s.join(", ")
    };
    let mib = |kib: u64| kib as f64 / 1024.0;
    match args.format {
        Format::Text => {
            println!(
                "mode=hold streams={} opened={opened} held={still_open} open_time={:.1}s",
                args.streams,
                open_time.as_secs_f64()
            );
            println!(
                "  gateway VmRSS: before={:.1} MiB holding={:.1} MiB after release={:.1} MiB",
                mib(before),
                mib(holding),
                mib(after)
            );
            println!("  per stream: {per_stream_kib:.1} KiB; per 1,000 open streams: {per_1000_mib:.1} MiB");
            if let Some(p) = fb {
                println!(
                    "  first byte: p50={} p99={} max={}",
                    ms(p.p50),
                    ms(p.p99),
                    ms(p.max)
                );
            }
            println!("  failures: {fail_text}");
        }
        Format::Markdown => println!(
            "| {} | {still_open} | {:.1} | {:.1} | {:.1} | {per_stream_kib:.1} | {per_1000_mib:.1} | {:.1} s | {fail_text} |",
            args.streams,
            mib(before),
            mib(holding),
            mib(after),
            open_time.as_secs_f64()
        ),
    }
    ensure!(
        still_open == args.streams,
        "only {still_open} of {} streams were open while sampling",
        args.streams
    );
    Ok(())
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match args.mode {
            Mode::Json | Mode::Stream => run_load(&args).await,
            Mode::Hold => run_hold(&args).await,
        }
    })
}
