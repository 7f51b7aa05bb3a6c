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
    process.launch(cmd, timeout, accepts).await?;
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

    /// Spawns `cmd` and polls `ready` until it answers true; an error if the process exits
    /// first or does not get ready within `timeout` (it is then killed).
    pub async fn launch<F, Fut>(
        &mut self,
        mut cmd: Command,
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
            if ready().await {
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
    pub async fn relaunch<C, F, Fut>(&mut self, command: C, timeout: Duration, mut ready: F)
    where
        C: Fn() -> Command,
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        assert!(self.child.is_none(), "restart of a running {}", self.name);
        let mut last_error = String::new();
        for _ in 0..10 {
            match self.launch(command(), timeout, &mut ready).await {
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
