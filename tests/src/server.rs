//! What every throwaway server of the tests (Redis, Postgres, chromedriver, the API server)
//! does the same way: a free loopback port, a process tied to the test with its output in a
//! log tail, readiness polled until the process answers or exits, a stop by signal that must
//! finish in time, and a restart on the same port.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::gateway::{drain, LogTail};

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Where [`free_port_for_later`] picks: below Linux's ephemeral range (32768 and up), where
/// [`free_port`] and every outgoing connection take their ports.
const FOR_LATER: std::ops::Range<u16> = 20_000..32_768;

/// A free port for a process that binds it only later and cannot try another (a rendered
/// chart's containers, told their ports by the chart): picked outside the range [`free_port`]
/// and outgoing connections draw from, so no other test takes it meanwhile. A free port from
/// [`free_port`] was taken by another test between the rendering and the container's start
/// (`Address already in use`) on a CI machine busy with the suite.
pub fn free_port_for_later() -> u16 {
    use std::hash::{BuildHasher, RandomState};
    let span = u64::from(FOR_LATER.end - FOR_LATER.start);
    let start = RandomState::new().hash_one(std::process::id()) % span;
    (0..span)
        .map(|i| FOR_LATER.start + u16::try_from((start + i * 7_919) % span).unwrap_or(0))
        .find(|&port| std::net::TcpListener::bind(("0.0.0.0", port)).is_ok())
        .expect("a free port below the ephemeral range")
}

/// Starts a server on a free loopback port: `launch(port)` tries one, up to five times, since a
/// port free when asked may be taken before the server binds it. The error lists every
/// attempt's. A caller builds its server (whose drop cleans its folder up) only once a launch
/// succeeded: a failed attempt must leave the folder to the next one.
pub(crate) async fn on_a_free_port<T, F, Fut>(mut launch: F) -> Result<T, String>
where
    F: FnMut(u16) -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let mut errors = Vec::new();
    for attempt in 1..=5 {
        let port = free_port();
        match launch(port).await {
            Ok(started) => return Ok(started),
            Err(e) => errors.push(format!("attempt {attempt} (port {port}): {e}")),
        }
    }
    Err(errors.join("\n"))
}

/// Runs `cmd` as `name` and waits (at most `timeout`) until it accepts connections on `port`.
pub(crate) async fn listening_on(
    name: &'static str,
    cmd: Command,
    port: u16,
    timeout: Duration,
) -> Result<(u16, ServerProcess), String> {
    let mut process = ServerProcess::new(name);
    let accepts = || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    };
    process.launch(cmd, port, timeout, accepts).await?;
    Ok((port, process))
}

pub(crate) fn signal(child: &Child, sig: libc::c_int) {
    let pid = child.id().expect("child not yet reaped") as i32;
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({sig}): {}", std::io::Error::last_os_error());
}

/// One server process (absent between [`stop`](Self::stop) and the next launch).
pub(crate) struct ServerProcess {
    name: &'static str,
    child: Option<Child>,
    log: LogTail,
}

impl ServerProcess {
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            child: None,
            log: LogTail::default(),
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process's output so far (tail), for failure messages.
    pub fn logs(&self) -> String {
        self.log.text()
    }

    /// Spawns `cmd` and polls `ready` until it answers true while the process (or a process
    /// it started) listens on `port`; an error if the process exits first or does not get
    /// ready within `timeout` (it is then killed). The second condition tells this server
    /// from another test's answering on the same port: a port free when asked may be taken by
    /// another test's server before this one binds it, and this one's readiness must not be
    /// the other's (a test would then run on a stranger's database).
    pub async fn launch<F, Fut>(
        &mut self,
        mut cmd: Command,
        port: u16,
        timeout: Duration,
        mut ready: F,
    ) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        crate::tie_to_test(&mut cmd);
        let name = self.name;
        let mut child = cmd.spawn().map_err(|e| format!("cannot run {name}: {e}"))?;
        if let Some(stdout) = child.stdout.take() {
            drain(stdout, self.log.clone(), None);
        }
        if let Some(stderr) = child.stderr.take() {
            drain(stderr, self.log.clone(), None);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("{name} exited with {status}\n{}", self.logs()));
            }
            if ready().await && child.id().is_some_and(|pid| listens(pid, port)) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.start_kill();
                return Err(format!(
                    "{name} not ready within {timeout:?}\n{}",
                    self.logs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// [`launch`](Self::launch) again after a [`stop`](Self::stop), a few times: the old
    /// listening socket is gone, but the kernel may take a moment to agree.
    pub async fn relaunch<C, F, Fut>(
        &mut self,
        command: C,
        port: u16,
        timeout: Duration,
        mut ready: F,
    ) where
        C: Fn() -> Command,
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        assert!(self.child.is_none(), "restart of a running {}", self.name);
        let mut last_error = String::new();
        for _ in 0..10 {
            match self.launch(command(), port, timeout, &mut ready).await {
                Ok(()) => return,
                Err(e) => last_error = e,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{} did not restart: {last_error}", self.name);
    }

    /// Sends `sig` to the running process.
    pub fn signal(&self, sig: libc::c_int) {
        let name = self.name;
        signal(
            self.child
                .as_ref()
                .unwrap_or_else(|| panic!("{name} is not running")),
            sig,
        );
    }

    /// Sends `sig` and waits for the process to exit; panics (after a kill) past `timeout`.
    pub async fn stop(&mut self, sig: libc::c_int, timeout: Duration) {
        let name = self.name;
        let mut child = self
            .child
            .take()
            .unwrap_or_else(|| panic!("{name} is not running"));
        signal(&child, sig);
        if tokio::time::timeout(timeout, child.wait()).await.is_err() {
            let _ = child.start_kill();
            let _ = child.wait().await;
            panic!("{name} did not exit within {timeout:?}\n{}", self.logs());
        }
    }

    /// For `Drop`: `sig` if running, without waiting.
    pub fn abandon(&mut self, sig: libc::c_int) {
        if let Some(child) = &self.child {
            signal(child, sig);
        }
    }
}

/// Whether process `pid`, or a process it started, holds a socket listening on loopback TCP
/// `port` (read from /proc: the sockets in LISTEN state on the port, then the processes'
/// descriptors).
fn listens(pid: u32, port: u16) -> bool {
    let sockets: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| listening_sockets(&table, port))
        .map(|inode| format!("socket:[{inode}]"))
        .collect();
    if sockets.is_empty() {
        return false;
    }
    let mut family = vec![pid];
    let mut next = 0;
    while let Some(&parent) = family.get(next) {
        family.extend(children(parent));
        next += 1;
    }
    family.iter().any(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|link| sockets.iter().any(|s| link.as_os_str() == s.as_str()))
    })
}

/// The inodes of a /proc/net/tcp table's sockets listening (state 0A) on `port`.
fn listening_sockets(table: &str, port: u16) -> Vec<String> {
    let port = format!("{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit(':').next()?;
            (local_port == port && *fields.get(3)? == "0A")
                .then(|| fields.get(9).map(|i| (*i).to_owned()))?
        })
        .collect()
}

/// The processes `pid`'s threads started.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|child| child.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_answering_on_a_port_it_does_not_hold_is_not_this_ones() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        assert!(
            listens(std::process::id(), port),
            "this process holds {port}"
        );
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        assert!(
            !listens(other.id(), port),
            "a process that holds no socket on {port} was taken for its listener"
        );
        let _ = other.kill();
        let _ = other.wait();
    }
}
