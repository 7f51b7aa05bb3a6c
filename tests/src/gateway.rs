//! The gateway process: spawn, wait for the ready line, talk to it, kill it on drop.
//!
//! `gateway standalone` by default; [`GatewayBuilder::serve`] starts `gateway serve` (cluster
//! mode: limits in Redis) instead, with the same flags plus the Redis ones.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, RequestBuilder};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::response::Resp;
use crate::scrape::Scrape;
use crate::sse::SseStream;

/// Admin token every test gateway is started with.
pub const ADMIN_TOKEN: &str = "e2e-admin-token-5f1c2a9b7d";
/// Dev key every test gateway is started with (its account holds `--dev-credits`).
pub const DEV_KEY: &str = "sk-svc-e2e-dev-0123456789abcdef0123456789abcdef";
/// The enterprise key seeded by the standalone example manifests.
pub const ENTERPRISE_KEY: &str = "sk-svc-example-enterprise-0000000000000000";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of the gateway's stderr is kept for failure messages.
const LOG_TAIL_BYTES: usize = 64 * 1024;

static NAMES: AtomicU64 = AtomicU64::new(0);

/// A name no other account or key of this test process uses.
pub fn unique_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NAMES.fetch_add(1, Ordering::Relaxed)
    )
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `$GATEWAY_BIN`, else `$CARGO_TARGET_DIR/debug/gateway`, else `<workspace>/target/debug/gateway`.
pub fn gateway_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("GATEWAY_BIN") {
        return PathBuf::from(bin);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("debug").join("gateway")
}

/// Which subcommand the gateway runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// `gateway standalone`: everything in-process.
    #[default]
    Standalone,
    /// `gateway serve`: rate limits shared through Redis (`--redis-url`).
    Serve,
}

impl Mode {
    fn subcommand(self) -> &'static str {
        match self {
            Mode::Standalone => "standalone",
            Mode::Serve => "serve",
        }
    }
}

/// Where a test gateway's manifests come from.
#[derive(Clone, Debug, Default)]
enum Manifests {
    /// `--manifests <workspace>/deploy/standalone`.
    #[default]
    Workspace,
    /// `--manifests DIR`.
    Folder(PathBuf),
    /// No `--manifests`: the binary's own set.
    BuiltIn,
}

/// The least room [`Gateway::wait_for_roomy_window`] asks of a window, whatever the caller's
/// margin: on a CI machine busy with the rest of the suite, six requests given a 5 s margin
/// straddled a window's end (the last one counted in the next window and admitted where the
/// test expected a 429).
pub const ROOMY_WINDOW_FLOOR_SECS: u64 = 15;

/// Options for one gateway process; everything else is the contract's default.
#[derive(Clone, Debug, Default)]
pub struct GatewayBuilder {
    args: Vec<String>,
    envs: Vec<(String, std::ffi::OsString)>,
    mode: Mode,
    manifests: Manifests,
    /// The folder the gateway runs in; the workspace root when `None`.
    working_dir: Option<PathBuf>,
    /// Leave out `--admin-token` / `--dev-key` (the harness passes its own by default).
    no_admin_token: bool,
    no_dev_key: bool,
    /// The gateway's open file limit (RLIMIT_NOFILE), when lowered.
    max_open_files: Option<u64>,
    /// The admin listener's address, when a test must know it before the start.
    admin_listen: Option<String>,
    /// A command line that runs the gateway binary with the arguments appended (a container
    /// of the image: [`crate::podman`]); the binary itself when `None`.
    launcher: Option<Vec<std::ffi::OsString>>,
}

impl GatewayBuilder {
    /// `gateway serve --redis-url URL`: cluster mode against that Redis.
    pub fn serve(mut self, redis_url: &str) -> Self {
        self.mode = Mode::Serve;
        self.arg("--redis-url").arg(redis_url)
    }

    /// `--database-url URL --migrate` (serve): accounts, keys and credits in that Postgres.
    pub fn database(self, url: &str) -> Self {
        self.arg("--database-url").arg(url).arg("--migrate")
    }

    /// `--database-url URL --database-pooler transaction` (serve): accounts, keys and credits
    /// in the Postgres behind the PgBouncer at `url`, already migrated (see [`crate::PgBouncer`]).
    pub fn database_through_pooler(self, url: &str) -> Self {
        self.arg("--database-url")
            .arg(url)
            .arg("--database-pooler")
            .arg("transaction")
    }

    /// `--manifests DIR` instead of `deploy/standalone`.
    pub fn manifests(mut self, dir: &Path) -> Self {
        self.manifests = Manifests::Folder(dir.to_path_buf());
        self
    }

    /// No `--manifests`: the set built into the binary.
    pub fn built_in_manifests(mut self) -> Self {
        self.manifests = Manifests::BuiltIn;
        self
    }

    /// Runs the gateway in `dir` instead of the workspace root.
    pub fn working_dir(mut self, dir: &Path) -> Self {
        self.working_dir = Some(dir.to_path_buf());
        self
    }

    /// `--redis-timeout-ms` (serve): the limit on every Redis call.
    pub fn redis_timeout_ms(self, ms: u64) -> Self {
        self.arg("--redis-timeout-ms").arg(&ms.to_string())
    }

    /// `--redis-outage fail-closed|fail-open` (serve).
    pub fn redis_outage(self, policy: &str) -> Self {
        self.arg("--redis-outage").arg(policy)
    }

    /// `--pods` (serve): the pod count local limits are divided by when failing open.
    pub fn pods(self, pods: u32) -> Self {
        self.arg("--pods").arg(&pods.to_string())
    }

    /// `--stream-lease-secs` (serve): how long a stream slot outlives its pod.
    pub fn stream_lease_secs(self, secs: u64) -> Self {
        self.arg("--stream-lease-secs").arg(&secs.to_string())
    }

    /// `--dev-top-up-usd`: the dev account's confirmed top-up, which gives the dev key its
    /// tier ("0": none, so the free tier; the default $10 gives pay_as_you_go).
    pub fn dev_top_up_usd(self, usd: &str) -> Self {
        self.arg("--dev-top-up-usd").arg(usd)
    }

    /// `--dev-enterprise`: the dev key is granted the enterprise tier.
    pub fn dev_enterprise(self) -> Self {
        self.arg("--dev-enterprise")
    }

    /// `--dev-credits`: the starting balance of the dev key's account.
    pub fn dev_credits(self, credits: u64) -> Self {
        self.arg("--dev-credits").arg(&credits.to_string())
    }

    /// `--simulated-chunk-delay-ms`: delay between streamed chunks of the simulated upstreams.
    pub fn chunk_delay_ms(self, ms: u64) -> Self {
        self.arg("--simulated-chunk-delay-ms").arg(&ms.to_string())
    }

    /// `--shutdown-grace-secs`: how long open streams may run on after SIGTERM.
    pub fn shutdown_grace_secs(self, secs: u64) -> Self {
        self.arg("--shutdown-grace-secs").arg(&secs.to_string())
    }

    pub fn shutdown_delay_secs(self, secs: u64) -> Self {
        self.arg("--shutdown-delay-secs").arg(&secs.to_string())
    }

    /// An environment variable of the gateway process (e.g. `OTEL_*`, `KUBECONFIG`).
    pub fn env(mut self, name: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.envs
            .push((name.to_string(), value.as_ref().to_os_string()));
        self
    }

    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// Lowers the gateway's open file limit (`ulimit -n`), to flood it with few sockets.
    pub fn max_open_files(mut self, files: u64) -> Self {
        self.max_open_files = Some(files);
        self
    }

    /// No `--admin-token`: standalone makes one and shows it on the ready line.
    /// `--admin-listen ADDR` instead of a free loopback port.
    pub fn admin_listen(mut self, addr: &str) -> Self {
        self.admin_listen = Some(addr.to_owned());
        self
    }

    pub fn without_admin_token(mut self) -> Self {
        self.no_admin_token = true;
        self
    }

    /// No `--dev-key`: standalone makes one and shows it on the ready line; serve has none.
    pub fn without_dev_key(mut self) -> Self {
        self.no_dev_key = true;
        self
    }

    /// Runs the gateway through `launcher` (program first), which appends its arguments to
    /// the gateway binary's: the image under podman, say.
    pub fn launched_by(mut self, launcher: Vec<std::ffi::OsString>) -> Self {
        self.launcher = Some(launcher);
        self
    }

    /// Spawns the gateway and waits (at most 30 s) for its ready line.
    pub async fn start(self) -> Gateway {
        let mut args = Vec::new();
        match self.manifests {
            Manifests::Workspace => args.extend([
                "--manifests".to_string(),
                workspace_root()
                    .join("deploy")
                    .join("standalone")
                    .display()
                    .to_string(),
            ]),
            Manifests::Folder(dir) => {
                args.extend(["--manifests".to_string(), dir.display().to_string()])
            }
            Manifests::BuiltIn => {}
        }
        if !self.no_admin_token {
            args.extend(["--admin-token".to_string(), ADMIN_TOKEN.to_string()]);
        }
        if !self.no_dev_key {
            args.extend(["--dev-key".to_string(), DEV_KEY.to_string()]);
        }
        args.extend([
            "--admin-listen".to_string(),
            self.admin_listen
                .unwrap_or_else(|| "127.0.0.1:0".to_string()),
        ]);
        // The production bound on a Redis call (250 ms) is for a release build on cores of its
        // own: debug pods sharing two cores with a build miss it with no outage at all, which
        // tests the machine's scheduler, not the gateway. A test of an outage sets its own.
        if self.mode == Mode::Serve && !self.args.iter().any(|a| a == "--redis-timeout-ms") {
            args.extend(["--redis-timeout-ms".to_string(), "2000".to_string()]);
        }
        args.extend(self.args);
        Gateway::spawn(
            self.mode,
            self.working_dir.unwrap_or_else(workspace_root),
            args,
            self.envs,
            self.max_open_files,
            self.launcher,
        )
        .await
    }
}

/// Tail of a child's output, shared with the task that drains it.
#[derive(Clone, Default)]
pub(crate) struct LogTail(Arc<Mutex<String>>);

impl LogTail {
    pub(crate) fn push_line(&self, line: &str) {
        let mut buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        buf.push_str(line);
        buf.push('\n');
        if buf.len() > LOG_TAIL_BYTES {
            let mut cut = buf.len() - LOG_TAIL_BYTES;
            while !buf.is_char_boundary(cut) {
                cut += 1;
            }
            buf.drain(..cut);
        }
    }

    pub(crate) fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The ready line's fields (`api`, `admin`, and the secrets standalone generated), from the
/// text form `ready api=URL admin=URL [name=value...]` or, under `--log-format json`, the
/// object `{"message":"ready",...}`; `None` for any other line.
pub fn ready_fields(line: &str) -> Option<Vec<(String, String)>> {
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("ready ") {
        return Some(
            rest.split_whitespace()
                .filter_map(|part| part.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    let object: Value = serde_json::from_str(line).ok()?;
    (object["message"] == "ready").then(|| {
        object
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect()
    })
}

/// Reads `reader` line by line until EOF into `tail`; the first ready line (see
/// [`ready_fields`]) goes to `ready` as well. Draining never stops, so the gateway never
/// blocks on a full pipe.
pub(crate) fn drain(
    reader: impl AsyncRead + Unpin + Send + 'static,
    tail: LogTail,
    mut ready: Option<oneshot::Sender<String>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(reader).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tail.push_line(&line);
            if ready_fields(&line).is_some() {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(line);
                }
            }
        }
    })
}

/// A running gateway process, killed when dropped.
pub struct Gateway {
    /// Base URL of the public API, e.g. `http://127.0.0.1:39123`.
    pub api: String,
    /// Base URL of the admin listener.
    pub admin: String,
    /// The dev key: [`DEV_KEY`], or the one a standalone gateway generated (ready line).
    pub key: String,
    /// The admin token: [`ADMIN_TOKEN`], or the one standalone generated (ready line).
    pub admin_token: String,
    /// The ready line as printed.
    pub ready_line: String,
    child: Child,
    stdout: LogTail,
    stderr: LogTail,
    http: reqwest::Client,
}

impl Gateway {
    /// A gateway with the contract's defaults (dev key on pay_as_you_go with $100 of credits).
    pub async fn start() -> Gateway {
        Gateway::builder().start().await
    }

    pub fn builder() -> GatewayBuilder {
        GatewayBuilder::default()
    }

    async fn spawn(
        mode: Mode,
        working_dir: PathBuf,
        extra: Vec<String>,
        envs: Vec<(String, std::ffi::OsString)>,
        max_open_files: Option<u64>,
        launcher: Option<Vec<std::ffi::OsString>>,
    ) -> Gateway {
        let bin = gateway_bin();
        let mut cmd = match &launcher {
            Some(line) => {
                let mut cmd = Command::new(&line[0]);
                cmd.args(&line[1..]);
                cmd
            }
            None => Command::new(&bin),
        };
        cmd.arg(mode.subcommand())
            .args(["--listen", "127.0.0.1:0"])
            .args(&extra)
            .envs(envs)
            .current_dir(&working_dir);
        crate::tie_to_test(&mut cmd);
        if let Some(files) = max_open_files {
            // SAFETY: setrlimit is async-signal-safe, as pre_exec requires.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: files,
                        rlim_max: files,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start {} ({e}); build it with `cargo build -p gateway`",
                bin.display()
            )
        });

        let stdout = LogTail::default();
        let stderr = LogTail::default();
        let (ready_tx, ready_rx) = oneshot::channel();
        let out_task = drain(
            child.stdout.take().expect("piped stdout"),
            stdout.clone(),
            Some(ready_tx),
        );
        let err_task = drain(
            child.stderr.take().expect("piped stderr"),
            stderr.clone(),
            None,
        );

        let ready = tokio::time::timeout(READY_TIMEOUT, ready_rx).await;
        let line = match ready {
            Ok(Ok(line)) => line,
            Ok(Err(_)) | Err(_) => {
                let status = match tokio::time::timeout(Duration::from_secs(2), child.wait()).await
                {
                    Ok(status) => format!("exited with {status:?}"),
                    Err(_) => {
                        let _ = child.start_kill();
                        "still running after 30 s without a ready line".to_string()
                    }
                };
                let _ = tokio::time::timeout(Duration::from_secs(2), out_task).await;
                let _ = tokio::time::timeout(Duration::from_secs(2), err_task).await;
                panic!(
                    "gateway {} {} {status}\nargs: {extra:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    bin.display(),
                    mode.subcommand(),
                    stdout.text(),
                    stderr.text()
                );
            }
        };

        let fields = ready_fields(&line).unwrap_or_default();
        let optional = |name: &str| -> Option<String> {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let field = |name: &str| -> String {
            optional(name).unwrap_or_else(|| panic!("ready line lacks {name}=: {line:?}"))
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build()
            .expect("reqwest client");
        Gateway {
            api: field("api").trim_end_matches('/').to_string(),
            admin: field("admin").trim_end_matches('/').to_string(),
            key: optional("key").unwrap_or_else(|| DEV_KEY.to_string()),
            admin_token: optional("admin_token").unwrap_or_else(|| ADMIN_TOKEN.to_string()),
            ready_line: line.clone(),
            child,
            stdout,
            stderr,
            http,
        }
    }

    /// The shared HTTP client (no proxy, loopback only).
    pub fn client(&self) -> &reqwest::Client {
        &self.http
    }

    /// The gateway's stdout and stderr so far (tail), for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout.text(),
            self.stderr.text()
        )
    }

    /// The gateway's stderr so far (tail): its log lines.
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("gateway still running") as i32
    }

    /// The process' peak resident memory so far (`VmHWM`), in bytes.
    pub fn peak_rss(&self) -> u64 {
        self.proc_status_kib("VmHWM:") * 1024
    }

    /// The process' resident memory now (`VmRSS`), in bytes.
    pub fn rss(&self) -> u64 {
        self.proc_status_kib("VmRSS:") * 1024
    }

    fn proc_status_kib(&self, field: &str) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/{}/status", self.pid()))
    }

    /// The CPU time the process has used so far (user and system, from `/proc/<pid>/stat`).
    pub fn cpu_time(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("proc stat");
        // Fields after the command name (which may hold spaces), from field 3: utime is 14,
        // stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks: u64 = fields[11..13]
            .iter()
            .map(|f| f.parse::<u64>().expect("a tick count"))
            .sum();
        // SAFETY: sysconf reads a constant of the system.
        let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / per_sec)
    }

    /// SIGKILL (no shutdown, no grace: a crashed pod), then reaps the process.
    pub async fn kill_9(&mut self) {
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
        let rc = unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        assert_eq!(
            rc,
            0,
            "kill(SIGKILL) failed: {}",
            std::io::Error::last_os_error()
        );
        self.wait_exit(Duration::from_secs(10)).await;
    }

    /// Sends SIGTERM to the gateway.
    pub fn send_sigterm(&self) {
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
        let rc = unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        assert_eq!(
            rc,
            0,
            "kill(SIGTERM) failed: {}",
            std::io::Error::last_os_error()
        );
    }

    /// Waits for the process to exit; panics (with the logs) after `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.expect("wait for gateway"),
            Err(_) => panic!("gateway did not exit within {within:?}\n{}", self.logs()),
        }
    }

    // ----- /v1 -----

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.api, path)
    }

    /// A request to the public API with `Authorization: Bearer key`.
    pub fn request(&self, method: Method, path: &str, key: Option<&str>) -> RequestBuilder {
        let rb = self.http.request(method, self.url(path));
        match key {
            Some(key) => rb.bearer_auth(key),
            None => rb,
        }
    }

    /// Sends a request and reads the whole response (checked for provider names).
    pub async fn send(&self, rb: RequestBuilder) -> Resp {
        let response = rb
            .send()
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}\n{}", self.logs()));
        Resp::read(response).await
    }

    pub async fn post_json(&self, path: &str, key: &str, body: &Value) -> Resp {
        self.send(self.request(Method::POST, path, Some(key)).json(body))
            .await
    }

    /// `POST /v1/messages`.
    pub async fn post_messages(&self, key: &str, body: &Value) -> Resp {
        self.post_json("/v1/messages", key, body).await
    }

    /// `POST /v1/messages/count_tokens`.
    pub async fn count_tokens(&self, key: &str, body: &Value) -> Resp {
        self.post_json("/v1/messages/count_tokens", key, body).await
    }

    /// `POST /v1/chat/completions`.
    pub async fn chat(&self, key: &str, body: &Value) -> Resp {
        self.post_json("/v1/chat/completions", key, body).await
    }

    pub async fn get(&self, path: &str, key: &str) -> Resp {
        self.send(self.request(Method::GET, path, Some(key))).await
    }

    /// A scrape of the admin listener's `/metrics` (no token: probes and scrapers have none).
    pub async fn metrics(&self) -> Scrape {
        let resp = self.admin_unauthenticated("/metrics").await;
        resp.expect_status(200);
        Scrape::parse(&resp.text)
    }

    /// `GET path` on the admin listener without the admin token.
    pub async fn admin_unauthenticated(&self, path: &str) -> Resp {
        let rb = self.http.get(format!("{}{path}", self.admin));
        self.admin_send(rb).await
    }

    /// `POST path` with a streaming body; the response is read event by event.
    pub async fn stream(&self, path: &str, key: &str, body: &Value) -> SseStream {
        let rb = self.request(Method::POST, path, Some(key)).json(body);
        let response = rb
            .send()
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}\n{}", self.logs()));
        SseStream::new(response)
    }

    /// `GET /v1/account` of `key`, expecting 200.
    pub async fn account(&self, key: &str) -> Value {
        self.get("/v1/account", key).await.expect_ok()
    }

    /// `credits.balance` from `GET /v1/account`.
    pub async fn balance(&self, key: &str) -> i64 {
        let account = self.account(key).await;
        account["credits"]["balance"]
            .as_i64()
            .unwrap_or_else(|| panic!("GET /v1/account has no integer credits.balance: {account}"))
    }

    /// If the key's current RPM or TPM window resets within `margin_secs` (at least
    /// [`ROOMY_WINDOW_FLOOR_SECS`]), waits for the next one, so that a burst of requests lands
    /// in a single fixed window. A reset of 0 means no window is open. GETs do not count
    /// against the limits.
    pub async fn wait_for_roomy_window(&self, key: &str, margin_secs: u64) {
        let margin_secs = margin_secs.max(ROOMY_WINDOW_FLOOR_SECS);
        for _ in 0..3 {
            let limits = self.get("/v1/models", key).await.rate_limit();
            let soonest = [limits.reset_requests, limits.reset_tokens]
                .into_iter()
                .filter(|&reset| reset > 0)
                .min();
            match soonest {
                Some(reset) if reset < margin_secs => {
                    tokio::time::sleep(Duration::from_millis(reset * 1000 + 1100)).await;
                }
                _ => return,
            }
        }
    }

    // ----- admin -----

    pub fn admin_request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.admin, path))
            .bearer_auth(&self.admin_token)
    }

    /// Sends an admin request; admin answers are internal, so not checked for provider names.
    pub async fn admin_send(&self, rb: RequestBuilder) -> Resp {
        let response = rb
            .send()
            .await
            .unwrap_or_else(|e| panic!("admin request failed: {e}\n{}", self.logs()));
        Resp::read_unchecked(response).await
    }

    pub async fn admin_post(&self, path: &str, body: &Value) -> Resp {
        self.admin_send(self.admin_request(Method::POST, path).json(body))
            .await
    }

    pub async fn admin_get(&self, path: &str) -> Resp {
        self.admin_send(self.admin_request(Method::GET, path)).await
    }

    /// `GET` on the admin listener, `None` when it cannot be reached (e.g. during shutdown).
    pub async fn try_admin_get(&self, path: &str) -> Option<Resp> {
        let response = self.admin_request(Method::GET, path).send().await.ok()?;
        Some(Resp::read_unchecked(response).await)
    }

    /// `POST /admin/accounts`, expecting 201; returns the account.
    pub async fn create_account(&self, credits: u64) -> Value {
        let body = json!({ "name": unique_name("e2e-account"), "credits": credits });
        let resp = self.admin_post("/admin/accounts", &body).await;
        resp.expect_status(201);
        resp.json()
    }

    /// `POST /admin/keys`, expecting 201.
    pub async fn mint_key(&self, account_id: &str, spec: &KeySpec) -> ApiKey {
        let mut body = json!({
            "account_id": account_id,
            "name": unique_name("e2e-key"),
            "kind": spec.kind,
        });
        if let Some(scopes) = &spec.scopes {
            body["scopes"] = json!(scopes);
        }
        match spec.tier.as_deref() {
            None | Some("free") => {}
            Some("enterprise") => body["tier"] = json!("enterprise"),
            // The way users get there: a confirmed top-up; the key starts at its tier.
            Some(tier) => {
                let usd_cents = top_up_cents_for(tier);
                self.top_up(account_id, usd_cents, &unique_name("e2e-tier-top-up"))
                    .await
                    .expect_ok();
            }
        }
        if let Some(at) = &spec.expires_at {
            body["expires_at"] = json!(at);
        }
        if let Some(cap) = spec.spend_cap {
            body["spend_cap_credits"] = json!(cap);
        }
        let resp = self.admin_post("/admin/keys", &body).await;
        resp.expect_status(201);
        let key = resp.json();
        ApiKey {
            id: key["id"].as_str().expect("key id").to_string(),
            secret: key["key"].as_str().expect("key secret").to_string(),
            account_id: account_id.to_string(),
        }
    }

    /// A fresh account holding `credits` and one key on it.
    pub async fn new_key(&self, credits: u64, spec: &KeySpec) -> ApiKey {
        let account = self.create_account(credits).await;
        let id = account["id"].as_str().expect("account id").to_string();
        self.mint_key(&id, spec).await
    }

    /// `POST /admin/accounts/{id}/topups`.
    pub async fn top_up(&self, account_id: &str, usd_cents: u64, reference: &str) -> Resp {
        let body = json!({ "usd_cents": usd_cents, "reference": reference });
        self.admin_post(&format!("/admin/accounts/{account_id}/topups"), &body)
            .await
    }

    pub async fn suspend(&self, account_id: &str) {
        self.admin_post(&format!("/admin/accounts/{account_id}/suspend"), &json!({}))
            .await
            .expect_ok();
    }

    pub async fn resume(&self, account_id: &str) {
        self.admin_post(&format!("/admin/accounts/{account_id}/resume"), &json!({}))
            .await
            .expect_ok();
    }

    /// `DELETE /admin/keys/{id}`.
    pub async fn revoke(&self, key_id: &str) {
        let resp = self
            .admin_send(self.admin_request(Method::DELETE, &format!("/admin/keys/{key_id}")))
            .await;
        let body = resp.expect_ok();
        assert_eq!(body["revoked"], json!(true), "revocation answer: {body}");
    }

    /// `GET /admin/accounts/{id}`.
    pub async fn admin_account(&self, account_id: &str) -> Value {
        self.admin_get(&format!("/admin/accounts/{account_id}"))
            .await
            .expect_ok()
    }

    /// `GET /admin/messages/{id}`: the ledger row of a message.
    pub async fn message_record(&self, message_id: &str) -> Value {
        self.admin_get(&format!("/admin/messages/{message_id}"))
            .await
            .expect_ok()
    }

    /// Polls the admin account until nothing is reserved any more (every turn settled).
    pub async fn wait_settled(&self, account_id: &str) -> Value {
        self.try_wait_settled(account_id).await.unwrap_or_else(|account| {
            panic!("timed out after 10s waiting for the account's reservations to be settled: {account}")
        })
    }

    /// [`wait_settled`](Self::wait_settled), the account as last read when 10 s pass with
    /// credits still reserved.
    pub async fn try_wait_settled(&self, account_id: &str) -> Result<Value, Value> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let account = self.admin_account(account_id).await;
            if account["reserved"].as_i64() == Some(0) {
                return Ok(account);
            }
            if std::time::Instant::now() > deadline {
                return Err(account);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The confirmed lifetime top-up (US cents) that gives a new key `tier`, by the example
/// manifests' Tier resources (a top-up is $10 at least).
pub fn top_up_cents_for(tier: &str) -> u64 {
    match tier {
        "pay_as_you_go" => 1_000,
        "high_volume" => 50_000,
        other => panic!("no top-up gives the `{other}` tier"),
    }
}

/// What kind of key to mint.
#[derive(Clone, Debug, Default)]
pub struct KeySpec {
    pub kind: &'static str,
    pub scopes: Option<Vec<String>>,
    /// The tier the key should have, reached the way users reach it: `free` with no top-up,
    /// `pay_as_you_go` and `high_volume` by a confirmed top-up of the account before the key
    /// is minted (which adds its credits to the account), `enterprise` by the grant.
    pub tier: Option<String>,
    /// RFC 3339.
    pub expires_at: Option<String>,
    pub spend_cap: Option<u64>,
}

impl KeySpec {
    /// An API key at the tier its account's confirmed top-ups give, without adding one.
    pub fn api() -> KeySpec {
        KeySpec {
            kind: "api",
            ..KeySpec::default()
        }
    }

    /// An API key on the given tier (see [`KeySpec::tier`]'s field for how it gets there).
    pub fn tier(tier: &str) -> KeySpec {
        KeySpec {
            kind: "api",
            tier: Some(tier.to_string()),
            ..KeySpec::default()
        }
    }

    /// A CLI key (not allowed on `/v1/*`).
    pub fn cli() -> KeySpec {
        KeySpec {
            kind: "cli",
            ..KeySpec::default()
        }
    }

    /// Expires at this RFC 3339 time.
    pub fn expiring(mut self, at: &str) -> KeySpec {
        self.expires_at = Some(at.to_string());
        self
    }

    /// With a monthly spend cap of `credits`.
    pub fn capped(mut self, credits: u64) -> KeySpec {
        self.spend_cap = Some(credits);
        self
    }

    pub fn with_scopes(mut self, scopes: &[&str]) -> KeySpec {
        self.scopes = Some(scopes.iter().map(|s| s.to_string()).collect());
        self
    }
}

/// A minted key.
#[derive(Clone, Debug)]
pub struct ApiKey {
    pub id: String,
    pub secret: String,
    pub account_id: String,
}
