//! A throwaway `redis-server` for the cluster-mode tests: one process per test on a free
//! loopback port, no persistence, its working files in a temporary folder; killed on drop.
//!
//! [`RedisServer::stop`] and [`RedisServer::restart`] (same port) simulate an outage and its
//! end; [`RedisServer::freeze`] / [`RedisServer::thaw`] (SIGSTOP / SIGCONT) simulate a Redis
//! that accepts connections but never answers, which only a client-side timeout survives.
//! [`SharedRedis`] is a minimal RESP client for looking at the keys the gateway writes, the
//! same for one server and for a [`RedisCluster`](crate::redis_cluster::RedisCluster).

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::Command;

use crate::gateway::unique_name;
use crate::server::{on_a_free_port, ServerProcess};

/// How long `redis-server` may take to answer PING after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long `redis-server` may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running (or stopped, between [`stop`](Self::stop) and [`restart`](Self::restart))
/// `redis-server`.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
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

    /// [`start`](Self::start) with the arguments `extra()` returns added to its command line.
    /// A failed launch asks `extra` again (a cluster node's bus port may have been taken
    /// too); the arguments of the launch that succeeded are kept for restarts.
    pub async fn start_with(extra: impl Fn() -> Vec<String>) -> RedisServer {
        let dir = std::env::temp_dir().join(unique_name("e2e-redis"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let started = on_a_free_port(|port| {
            let (dir, extra) = (&dir, extra());
            async move {
                let mut process = ServerProcess::new("redis-server");
                let command = server_command(port, dir, &extra);
                process
                    .launch(command, READY_TIMEOUT, || pong(port))
                    .await?;
                Ok((port, extra, process))
            }
        })
        .await;
        match started {
            Ok((port, extra, process)) => RedisServer {
                port,
                dir,
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

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
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
        self.process
            .relaunch(
                || server_command(port, &dir, &extra),
                READY_TIMEOUT,
                || pong(port),
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

    fn logs(&self) -> String {
        RedisServer::logs(self)
    }

    async fn command(&self, args: &[&str]) -> Result<Reply, String> {
        command(self.port, args).await
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
    }
}

/// What the tests ask of the Redis the pods share, one server or a cluster.
pub trait SharedRedis: Send + Sync {
    /// The URL the pods are given (`redis://…` or `redis-cluster://…`).
    fn url(&self) -> String;

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

/// Sends one command to the server on `port` over a fresh connection and reads its reply.
pub(crate) async fn command(port: u16, args: &[&str]) -> Result<Reply, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect to redis: {e}"))?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    stream
        .write_all(&request)
        .await
        .map_err(|e| format!("write to redis: {e}"))?;
    let mut reader = BufReader::new(stream);
    tokio::time::timeout(Duration::from_secs(5), read_reply(&mut reader))
        .await
        .map_err(|_| format!("redis did not answer {args:?} within 5 s"))?
}

/// Whether the server on `port` answers PING.
pub(crate) async fn pong(port: u16) -> bool {
    matches!(command(port, &["PING"]).await, Ok(Reply::Simple(p)) if p == "PONG")
}

fn server_command(port: u16, dir: &std::path::Path, extra: &[String]) -> Command {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
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
async fn read_reply(reader: &mut BufReader<TcpStream>) -> Result<Reply, String> {
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
