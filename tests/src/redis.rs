//! A throwaway `redis-server` for the cluster-mode tests: one process per test on a free
//! loopback port, no persistence, its working files in a temporary folder; killed on drop.
//!
//! [`RedisServer::stop`] and [`RedisServer::restart`] (same port) simulate an outage and its
//! end; [`RedisServer::freeze`] / [`RedisServer::thaw`] (SIGSTOP / SIGCONT) simulate a Redis
//! that accepts connections but never answers, which only a client-side timeout survives.
//! [`SharedRedis`] is a minimal RESP client for looking at the keys the gateway writes, the
//! same for one server and for a [`RedisCluster`](crate::redis_cluster::RedisCluster).
//!
//! [`RedisServer::start_tls`] is the same server over TLS only (`port 0`, `tls-port`), on a
//! certificate of a CA made for it, demanding a client certificate (`tls-auth-clients yes`),
//! with the `default` user off and an ACL user with a password ([`TLS_USER`]); its URL is
//! `rediss://` with the user and password, [`SharedRedis::tls_flags`] the gateway's flags for
//! the CA and the client certificate. The harness' own commands go the same way.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

use crate::gateway::unique_name;
use crate::server::{on_a_free_port, ServerProcess};
use crate::tls::TlsFiles;

/// The ACL user of a TLS server, and its password (`default` is off there).
pub const TLS_USER: (&str, &str) = ("gateway", "s3cret-acl-pw");

/// How the harness reaches a server: plaintext, or TLS with the server's CA and client
/// certificate, authenticated as [`TLS_USER`].
#[derive(Clone, Default)]
pub(crate) struct Access(Option<(TlsFiles, Arc<rustls::ClientConfig>, String)>);

impl Access {
    /// TLS to a certificate naming `127.0.0.1`.
    pub(crate) fn tls(files: TlsFiles) -> Access {
        Self::tls_named(files, "127.0.0.1")
    }

    /// TLS to a certificate naming `name`, which the harness asks for at 127.0.0.1.
    pub(crate) fn tls_named(files: TlsFiles, name: &str) -> Access {
        let config = files.client_config();
        Access(Some((files, config, name.to_owned())))
    }

    pub(crate) fn files(&self) -> Option<&TlsFiles> {
        self.0.as_ref().map(|(files, _, _)| files)
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://USER:PASSWORD@127.0.0.1:PORT`.
    pub(crate) fn url(&self, scheme: &str, port: u16) -> String {
        match &self.0 {
            None => format!("{scheme}://127.0.0.1:{port}"),
            Some(_) => format!(
                "{}://{}:{}@127.0.0.1:{port}",
                scheme.replacen("redis", "rediss", 1),
                TLS_USER.0,
                TLS_USER.1
            ),
        }
    }

    /// The gateway's flags for the CA and the client certificate; none in plaintext.
    pub(crate) fn flags(&self) -> Vec<String> {
        match self.files() {
            None => Vec::new(),
            Some(files) => vec![
                "--redis-ca-file".into(),
                files.ca.display().to_string(),
                "--redis-client-cert-file".into(),
                files.client_cert.display().to_string(),
                "--redis-client-key-file".into(),
                files.client_key.display().to_string(),
            ],
        }
    }

    /// The server arguments of TLS only, on `port`; `--port PORT` in plaintext.
    fn server_args(&self, port: u16) -> Vec<String> {
        let Some(files) = self.files() else {
            return vec!["--port".into(), port.to_string()];
        };
        let path = |p: &PathBuf| p.display().to_string();
        let password = format!(">{}", TLS_USER.1);
        [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &path(&files.server_cert),
            "--tls-key-file",
            &path(&files.server_key),
            "--tls-ca-cert-file",
            &path(&files.ca),
            "--tls-auth-clients",
            "yes",
            "--tls-replication",
            "yes",
            "--user",
            "default",
            "off",
            "--user",
            TLS_USER.0,
            "on",
            &password,
            "~*",
            "&*",
            "+@all",
            "--masteruser",
            TLS_USER.0,
            "--masterauth",
            TLS_USER.1,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect()
    }
}

/// How long `redis-server` may take to answer PING after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `redis-server` may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running (or stopped, between [`stop`](Self::stop) and [`restart`](Self::restart))
/// `redis-server`.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    access: Access,
    /// Arguments added to every launch (a cluster node's settings).
    extra: Vec<String>,
    process: ServerProcess,
    frozen: bool,
}

/// One RESP reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

impl Reply {
    /// Integer replies, and bulk strings holding an integer.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Reply::Integer(n) => Some(*n),
            Reply::Bulk(Some(s)) | Reply::Simple(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// A flat array of bulk strings (`KEYS`, `HGETALL`, `ZRANGE`), `None` for other replies.
    pub fn strings(&self) -> Option<Vec<String>> {
        match self {
            Reply::Array(items) => items
                .iter()
                .map(|item| match item {
                    Reply::Bulk(Some(s)) | Reply::Simple(s) => Some(s.clone()),
                    Reply::Integer(n) => Some(n.to_string()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port and waits until it answers PING.
    pub async fn start() -> RedisServer {
        Self::start_with(Vec::new).await
    }

    /// [`start`](Self::start) over TLS only, with an ACL user (see the module's doc).
    pub async fn start_tls() -> RedisServer {
        let dir = std::env::temp_dir().join(unique_name("e2e-redis-ca"));
        Self::start_on(Access::tls(TlsFiles::make(&dir)), Vec::new).await
    }

    /// [`start_tls`](Self::start_tls) on a certificate naming `names` only (a first one the
    /// harness asks for at 127.0.0.1): a gateway given `127.0.0.1` must refuse it.
    pub async fn start_tls_for(names: &[&str]) -> RedisServer {
        let dir = std::env::temp_dir().join(unique_name("e2e-redis-ca"));
        let files = TlsFiles::make_for(&dir, names);
        Self::start_on(Access::tls_named(files, names[0]), Vec::new).await
    }

    /// [`start`](Self::start) with the arguments `extra()` returns added to its command line.
    /// A failed launch asks `extra` again (a cluster node's bus port may have been taken
    /// too); the arguments of the launch that succeeded are kept for restarts.
    pub async fn start_with(extra: impl Fn() -> Vec<String>) -> RedisServer {
        Self::start_on(Access::default(), extra).await
    }

    pub(crate) async fn start_on(access: Access, extra: impl Fn() -> Vec<String>) -> RedisServer {
        let dir = std::env::temp_dir().join(unique_name("e2e-redis"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let started = on_a_free_port(|port| {
            let (dir, extra, access) = (&dir, extra(), &access);
            async move {
                let mut process = ServerProcess::new("redis-server");
                let command = server_command(port, dir, access, &extra);
                process
                    .launch(command, port, READY_TIMEOUT, || pong(access, port))
                    .await?;
                Ok((port, extra, process))
            }
        })
        .await;
        match started {
            Ok((port, extra, process)) => RedisServer {
                port,
                dir,
                access,
                extra,
                process,
                frozen: false,
            },
            Err(errors) => {
                let _ = std::fs::remove_dir_all(&dir);
                panic!("redis-server did not start:\n{errors}");
            }
        }
    }

    /// `redis://127.0.0.1:PORT`; over TLS `rediss://USER:PASSWORD@127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.access.url("redis", self.port)
    }

    /// The CA and certificates of a server started with [`RedisServer::start_tls`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.access.files()
    }

    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// The server's log so far (tail), for failure messages.
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// SIGTERM, then waits for the process to exit (the port is closed afterwards).
    pub async fn stop(&mut self) {
        if self.frozen {
            self.thaw();
        }
        self.process.stop(libc::SIGTERM, STOP_TIMEOUT).await;
    }

    /// Starts redis-server again on the same port (empty: nothing is persisted).
    pub async fn restart(&mut self) {
        let (port, dir, extra) = (self.port, self.dir.clone(), self.extra.clone());
        let access = self.access.clone();
        self.process
            .relaunch(
                || server_command(port, &dir, &access, &extra),
                port,
                READY_TIMEOUT,
                || pong(&access, port),
            )
            .await;
    }

    /// SIGKILL, then waits for the process to exit: a crash, nothing flushed.
    pub async fn kill(&mut self) {
        if self.frozen {
            self.thaw();
        }
        self.process.stop(libc::SIGKILL, STOP_TIMEOUT).await;
    }

    /// SIGSTOP: connections stay open and requests are accepted by the kernel, but nothing is
    /// answered until [`thaw`](Self::thaw).
    pub fn freeze(&mut self) {
        self.process.signal(libc::SIGSTOP);
        self.frozen = true;
    }

    /// SIGCONT after [`freeze`](Self::freeze).
    pub fn thaw(&mut self) {
        self.process.signal(libc::SIGCONT);
        self.frozen = false;
    }
}

impl SharedRedis for RedisServer {
    fn url(&self) -> String {
        RedisServer::url(self)
    }

    fn tls_flags(&self) -> Vec<String> {
        self.access.flags()
    }

    fn logs(&self) -> String {
        RedisServer::logs(self)
    }

    async fn command(&self, args: &[&str]) -> Result<Reply, String> {
        command(&self.access, self.port, args).await
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisServer({})", self.url())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL also ends a stopped (frozen) process.
        self.process.abandon(libc::SIGKILL);
        let _ = std::fs::remove_dir_all(&self.dir);
        // The CA's folder (a cluster's nodes share one; they are dropped together).
        if let Some(dir) = self.access.files().and_then(|f| f.ca.parent()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// What the tests ask of the Redis the pods share, one server or a cluster.
pub trait SharedRedis: Send + Sync {
    /// The URL the pods are given (`redis://…` or `redis-cluster://…`, over TLS `rediss://…`
    /// or `rediss-cluster://…`).
    fn url(&self) -> String;

    /// The flags the pods are given beside the URL: the CA and client certificate of TLS.
    fn tls_flags(&self) -> Vec<String> {
        Vec::new()
    }

    /// The servers' logs so far (tails), for failure messages.
    fn logs(&self) -> String;

    /// Sends one command (to the node serving its key, on a cluster) and reads its reply.
    fn command(&self, args: &[&str]) -> impl Future<Output = Result<Reply, String>> + Send;

    /// [`command`](Self::command), panicking on a transport error or an error reply.
    fn cmd(&self, args: &[&str]) -> impl Future<Output = Reply> + Send {
        async move {
            match self.command(args).await {
                Ok(Reply::Error(e)) => panic!("redis {args:?} failed: {e}"),
                Ok(reply) => reply,
                Err(e) => panic!("redis {args:?}: {e}\n{}", self.logs()),
            }
        }
    }

    /// `HGETALL key` as (field, value) pairs.
    fn hgetall(&self, key: &str) -> impl Future<Output = Vec<(String, String)>> + Send {
        async move {
            let flat = self
                .cmd(&["HGETALL", key])
                .await
                .strings()
                .expect("HGETALL answers an array of strings");
            flat.chunks(2)
                .map(|pair| (pair[0].clone(), pair[1].clone()))
                .collect()
        }
    }
}

/// Sends one command to the server on `port` over a fresh connection (after `AUTH` over TLS)
/// and reads its reply.
pub(crate) async fn command(access: &Access, port: u16, args: &[&str]) -> Result<Reply, String> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect to redis: {e}"))?;
    let Some((_, config, name)) = &access.0 else {
        return exchange(stream, &[args]).await;
    };
    let name = rustls::pki_types::ServerName::try_from(name.clone())
        .map_err(|e| format!("server name {name}: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, stream)
        .await
        .map_err(|e| format!("TLS to redis: {e}"))?;
    exchange(stream, &[&["AUTH", TLS_USER.0, TLS_USER.1], args]).await
}

/// Sends the commands, and returns the last one's reply (the first error reply of the others).
async fn exchange(
    stream: impl AsyncRead + AsyncWrite + Unpin,
    commands: &[&[&str]],
) -> Result<Reply, String> {
    let mut request = Vec::new();
    for args in commands {
        request.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in *args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg.as_bytes());
            request.extend_from_slice(b"\r\n");
        }
    }
    let mut reader = BufReader::new(stream);
    reader
        .get_mut()
        .write_all(&request)
        .await
        .map_err(|e| format!("write to redis: {e}"))?;
    let last = commands.last().copied().unwrap_or_default();
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut reply = Err("no command".to_owned());
        for (i, _) in commands.iter().enumerate() {
            reply = read_reply(&mut reader).await;
            if i + 1 < commands.len() {
                if let Ok(Reply::Error(e)) = &reply {
                    return Err(format!("AUTH refused: {e}"));
                }
            }
        }
        reply
    })
    .await
    .map_err(|_| format!("redis did not answer {last:?} within 5 s"))?
}

/// Whether the server on `port` answers PING.
pub(crate) async fn pong(access: &Access, port: u16) -> bool {
    matches!(command(access, port, &["PING"]).await, Ok(Reply::Simple(p)) if p == "PONG")
}

fn server_command(port: u16, dir: &std::path::Path, access: &Access, extra: &[String]) -> Command {
    let mut cmd = Command::new("redis-server");
    cmd.args(access.server_args(port))
        .args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--protected-mode", "yes"])
        .args(["--logfile", "", "--loglevel", "notice"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .current_dir(dir);
    cmd
}

/// Reads one RESP2 reply.
async fn read_reply(
    reader: &mut BufReader<impl AsyncRead + AsyncWrite + Unpin>,
) -> Result<Reply, String> {
    let mut line = String::new();
    let mut stack: Vec<(Vec<Reply>, usize)> = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .await
            .map_err(|e| format!("read from redis: {e}"))?;
        if n == 0 {
            return Err("redis closed the connection".into());
        }
        let body = line.trim_end_matches(['\r', '\n']);
        let (kind, rest) = body.split_at(1.min(body.len()));
        let number = || {
            rest.parse::<i64>()
                .map_err(|_| format!("bad RESP line {body:?}"))
        };
        let mut reply = match kind {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Integer(number()?),
            "$" => {
                let len = number()?;
                if len < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut buf = vec![0u8; len as usize + 2];
                    reader
                        .read_exact(&mut buf)
                        .await
                        .map_err(|e| format!("read from redis: {e}"))?;
                    buf.truncate(len as usize);
                    Reply::Bulk(Some(String::from_utf8_lossy(&buf).into_owned()))
                }
            }
            "*" => {
                let len = number()?;
                if len > 0 {
                    stack.push((Vec::with_capacity(len as usize), len as usize));
                    continue;
                }
                Reply::Array(Vec::new())
            }
            _ => return Err(format!("bad RESP line {body:?}")),
        };
        // Fold finished replies into their arrays.
        loop {
            match stack.last_mut() {
                None => return Ok(reply),
                Some((items, want)) => {
                    items.push(reply);
                    if items.len() < *want {
                        break;
                    }
                    let (items, _) = stack.pop().expect("non-empty stack");
                    reply = Reply::Array(items);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_are_parsed_from_a_real_server() {
        let redis = RedisServer::start().await;
        assert_eq!(
            redis.cmd(&["SET", "a", "1"]).await,
            Reply::Simple("OK".into())
        );
        assert_eq!(redis.cmd(&["INCR", "a"]).await.as_i64(), Some(2));
        assert_eq!(redis.cmd(&["GET", "missing"]).await, Reply::Bulk(None));
        redis.cmd(&["HSET", "h", "x", "1", "y", "two"]).await;
        let mut pairs = redis.hgetall("h").await;
        pairs.sort();
        assert_eq!(
            pairs,
            vec![("x".into(), "1".into()), ("y".into(), "two".into())]
        );
        assert!(matches!(
            redis.cmd(&["ZRANGE", "nope", "0", "-1"]).await,
            Reply::Array(ref v) if v.is_empty()
        ));
    }
}
