//! A throwaway nginx (Debian's) as a reverse proxy in front of a gateway, configured the way
//! ingress-nginx forwards: `X-Forwarded-For` with the peer appended, `X-Real-IP`, streaming
//! unbuffered. A free loopback port, its files in a temporary folder; killed on drop. It can
//! follow a Service's endpoints as they change (a reload), so it runs a master and one
//! worker: a reload in nginx's single-process mode leaves it refusing every request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::unique_name;
use crate::server::{listening_on, on_a_free_port, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Nginx {
    pub port: u16,
    dir: PathBuf,
    process: ServerProcess,
}

/// `nginx` on PATH, else Debian's /usr/sbin/nginx (sbin is not on every user's PATH).
fn nginx_bin() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("nginx"))
                .find(|bin| bin.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"))
}

fn config(port: u16, upstreams: &[String], dir: &Path) -> String {
    let dir = dir.display();
    let servers: String = upstreams.iter().map(|u| format!("server {u}; ")).collect();
    // A worker started by root would run as nobody, who cannot write the temporary folders.
    // SAFETY: geteuid(2) cannot fail.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root;"
    } else {
        ""
    };
    // One worker, killed with its master on drop.
    format!(
        "{user}
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream gateway {{ {servers}keepalive 16; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://gateway;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_buffering off;
        }}
    }}
}}
"
    )
}

impl Nginx {
    /// Starts nginx proxying to `upstream` (`127.0.0.1:PORT`) and waits until it answers.
    pub async fn start(upstream: &str) -> Nginx {
        Nginx::start_in_front_of(&[upstream.to_owned()]).await
    }

    /// Starts nginx balancing over `upstreams` (`ADDRESS:PORT` each), as an ingress controller
    /// over a Service's endpoints, and waits until it answers.
    pub async fn start_in_front_of(upstreams: &[String]) -> Nginx {
        let bin = nginx_bin();
        assert!(
            bin.is_file(),
            "nginx not found; install it (Debian: apt-get install nginx, or scripts/test does)"
        );
        let dir = std::env::temp_dir().join(unique_name("e2e-nginx"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let started = on_a_free_port(|port| {
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, config(port, upstreams, &dir)).expect("write nginx.conf");
            let mut cmd = Command::new(&bin);
            cmd.arg("-e")
                .arg("stderr")
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(&conf);
            listening_on("nginx", cmd, port, READY_TIMEOUT)
        })
        .await;
        match started {
            Ok((port, process)) => Nginx { port, dir, process },
            Err(errors) => {
                let _ = std::fs::remove_dir_all(&dir);
                panic!("nginx did not start:\n{errors}");
            }
        }
    }

    /// Balances over `upstreams` from now on, as an ingress controller follows a Service's
    /// endpoints: the config rewritten and reloaded (SIGHUP); requests in flight finish where
    /// they are.
    /// Waits (at most 5 s) until the master runs a worker it did not run before: that worker
    /// has the new config, and the old ones stop taking connections.
    pub async fn follow(&self, upstreams: &[String]) {
        let conf = config(self.port, upstreams, &self.dir);
        std::fs::write(self.dir.join("nginx.conf"), conf).expect("write nginx.conf");
        let before = self.workers();
        self.process.signal(libc::SIGHUP);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if self.workers().iter().any(|w| !before.contains(w)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("nginx did not reload within 5 s:\n{}", self.logs());
    }

    /// The master's worker processes.
    fn workers(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("nginx.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<i32>().ok())
            .map(children_of)
            .unwrap_or_default()
    }

    /// `http://127.0.0.1:PORT{path}`, through nginx.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

/// The processes whose parent is `pid`, from /proc.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            // `pid (comm) state ppid ...`; comm may hold spaces, so after its last `)`.
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = &stat[stat.rfind(')')? + 1..];
                    after.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // A killed master leaves its worker running: the worker goes too (after the master,
        // which would start another).
        let workers = self.workers();
        self.process.abandon(libc::SIGKILL);
        for worker in workers {
            // SAFETY: kill(2) of a worker of the nginx this harness started.
            unsafe { libc::kill(worker, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
