//! A throwaway nginx (Debian's) as a reverse proxy in front of a gateway, configured the way
//! ingress-nginx forwards: `X-Forwarded-For` with the peer appended, `X-Real-IP`; either every
//! path unbuffered, or the [`Routes`] of the chart's rendered Ingress or HTTPRoute. A free loopback port, its files in a temporary folder; killed on drop. It can
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
    routes: Routes,
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

/// What an ingress controller serves for the gateway, as nginx directives: which paths reach
/// the Service (anything else is the controller's own 404) and the proxy settings of each.
/// Built from the chart's rendered Ingress (as ingress-nginx reads it) or HTTPRoute (as a
/// Gateway API implementation does), so a journey through the harness's nginx goes only where
/// the chart's objects route it, with their settings.
#[derive(Clone, Debug)]
pub struct Routes {
    /// Path prefixes routed to the gateway.
    prefixes: Vec<String>,
    /// Directives of every routed location (`client_max_body_size 256m;` …).
    directives: Vec<String>,
}

/// ingress-nginx's own defaults (its ConfigMap's), which its annotations override.
const INGRESS_NGINX_DEFAULTS: &[(&str, &str)] = &[
    ("proxy-body-size", "1m"),
    ("proxy-read-timeout", "60"),
    ("proxy-send-timeout", "60"),
    ("proxy-connect-timeout", "5"),
    ("proxy-buffering", "off"),
    ("proxy-request-buffering", "on"),
];

/// An ingress-nginx annotation (after `nginx.ingress.kubernetes.io/`) as an nginx directive.
fn directive(annotation: &str, value: &str) -> Option<String> {
    let seconds = |d: &str| format!("{d} {}s;", value.trim_end_matches('s'));
    Some(match annotation {
        "proxy-body-size" => format!("client_max_body_size {value};"),
        "proxy-read-timeout" => seconds("proxy_read_timeout"),
        "proxy-send-timeout" => seconds("proxy_send_timeout"),
        "proxy-connect-timeout" => seconds("proxy_connect_timeout"),
        "proxy-buffering" => format!("proxy_buffering {value};"),
        "proxy-request-buffering" => format!("proxy_request_buffering {value};"),
        _ => return None,
    })
}

impl Routes {
    /// Every path to the gateway, unbuffered: a proxy with no opinion of its own.
    pub fn everything() -> Routes {
        Routes {
            prefixes: vec!["/".to_owned()],
            directives: vec![
                "client_max_body_size 0;".to_owned(),
                "proxy_buffering off;".to_owned(),
            ],
        }
    }

    /// The Ingress object (JSON, as the API server has it) as ingress-nginx serves it: each
    /// `Prefix` path, ingress-nginx's defaults under the Ingress's annotations. Panics on an
    /// ingress-nginx annotation this does not translate, or a path type other than `Prefix`,
    /// so the harness never silently drops what the chart sets.
    pub fn from_ingress(ingress: &serde_json::Value) -> Routes {
        const PREFIX: &str = "nginx.ingress.kubernetes.io/";
        let mut settings: std::collections::BTreeMap<String, String> = INGRESS_NGINX_DEFAULTS
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if let Some(annotations) = ingress["metadata"]["annotations"].as_object() {
            for (key, value) in annotations {
                if let Some(name) = key.strip_prefix(PREFIX) {
                    settings.insert(
                        name.to_owned(),
                        value.as_str().unwrap_or_default().to_owned(),
                    );
                }
            }
        }
        let directives = settings
            .iter()
            .map(|(name, value)| {
                directive(name, value).unwrap_or_else(|| {
                    panic!("the harness does not translate the Ingress annotation {PREFIX}{name}")
                })
            })
            .collect();
        let mut prefixes = Vec::new();
        for rule in ingress["spec"]["rules"].as_array().into_iter().flatten() {
            for path in rule["http"]["paths"].as_array().into_iter().flatten() {
                assert_eq!(
                    path["pathType"], "Prefix",
                    "only Prefix paths are translated: {path}"
                );
                prefixes.push(path["path"].as_str().unwrap_or("/").to_owned());
            }
        }
        assert!(
            !prefixes.is_empty(),
            "the Ingress routes no path: {ingress}"
        );
        Routes {
            prefixes,
            directives,
        }
    }

    /// An HTTPRoute (JSON, as rendered) as a Gateway API implementation serves it: each
    /// `PathPrefix` match, the route's `backendRequest` timeout (else `request`) as the
    /// upstream read and send timeouts, bodies and answers streamed (Envoy buffers neither).
    pub fn from_http_route(route: &serde_json::Value) -> Routes {
        let mut prefixes = Vec::new();
        let mut timeout = None;
        for rule in route["spec"]["rules"].as_array().into_iter().flatten() {
            for matched in rule["matches"].as_array().into_iter().flatten() {
                assert_eq!(
                    matched["path"]["type"], "PathPrefix",
                    "only PathPrefix matches are translated: {matched}"
                );
                prefixes.push(matched["path"]["value"].as_str().unwrap_or("/").to_owned());
            }
            let timeouts = &rule["timeouts"];
            timeout = timeouts["backendRequest"]
                .as_str()
                .or(timeouts["request"].as_str())
                .map(str::to_owned)
                .or(timeout);
        }
        assert!(
            !prefixes.is_empty(),
            "the HTTPRoute matches no path: {route}"
        );
        let mut directives = vec![
            "client_max_body_size 0;".to_owned(),
            "proxy_buffering off;".to_owned(),
            "proxy_request_buffering off;".to_owned(),
        ];
        if let Some(timeout) = timeout {
            let seconds = duration_secs(&timeout);
            directives.push(format!("proxy_read_timeout {seconds}s;"));
            directives.push(format!("proxy_send_timeout {seconds}s;"));
        }
        Routes {
            prefixes,
            directives,
        }
    }

    /// The nginx locations: a prefix `/p` matches `/p` and `/p/…` (what `Prefix` and
    /// `PathPrefix` mean), the rest is 404.
    fn locations(&self) -> String {
        let proxy = format!(
            "proxy_pass http://gateway;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-Proto $scheme;
            {}",
            self.directives.join("\n            ")
        );
        let mut out = String::new();
        for prefix in &self.prefixes {
            let prefix = prefix.trim_end_matches('/');
            if prefix.is_empty() {
                out += &format!("        location / {{ {proxy} }}\n");
                return out;
            }
            out += &format!("        location = {prefix} {{ {proxy} }}\n");
            out += &format!("        location {prefix}/ {{ {proxy} }}\n");
        }
        out += "        location / { return 404; }\n";
        out
    }
}

/// Seconds of a Gateway API duration (`1h`, `90s`, `1h30m`, `500ms`, rounded up).
fn duration_secs(duration: &str) -> u64 {
    let mut total_ms = 0u64;
    let mut number = String::new();
    let mut chars = duration.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number
            .parse()
            .unwrap_or_else(|_| panic!("a bad duration {duration:?}"));
        number.clear();
        total_ms += match c {
            'h' => n * 3_600_000,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                n
            }
            'm' => n * 60_000,
            's' => n * 1_000,
            _ => panic!("a bad duration {duration:?}"),
        };
    }
    total_ms.div_ceil(1_000)
}

fn config(port: u16, upstreams: &[String], dir: &Path, routes: &Routes) -> String {
    let dir = dir.display();
    let servers: String = upstreams.iter().map(|u| format!("server {u}; ")).collect();
    // A worker started by root would run as nobody, who cannot write the temporary folders.
    // SAFETY: geteuid(2) cannot fail.
    let user = if unsafe { libc::geteuid() } == 0 {
        "user root;"
    } else {
        ""
    };
    let locations = routes.locations();
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
{locations}    }}
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
        Nginx::start_routing(&Routes::everything(), upstreams).await
    }

    /// Starts nginx serving `routes` (an Ingress's or an HTTPRoute's) over `upstreams`.
    pub async fn start_routing(routes: &Routes, upstreams: &[String]) -> Nginx {
        Nginx::launch(routes, upstreams, None).await
    }

    /// [`Nginx::start_routing`] on `port`, chosen before (with [`crate::server::free_port`]):
    /// for a gateway whose public URL names the ingress before it runs. Panics when the port
    /// was taken meanwhile.
    pub async fn start_routing_on(port: u16, routes: &Routes, upstreams: &[String]) -> Nginx {
        Nginx::launch(routes, upstreams, Some(port)).await
    }

    async fn launch(routes: &Routes, upstreams: &[String], port: Option<u16>) -> Nginx {
        let bin = nginx_bin();
        assert!(
            bin.is_file(),
            "nginx not found; install it (Debian: apt-get install nginx, or scripts/test does)"
        );
        let dir = std::env::temp_dir().join(unique_name("e2e-nginx"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let launch = |port| {
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, config(port, upstreams, &dir, routes)).expect("write nginx.conf");
            let mut cmd = Command::new(&bin);
            cmd.arg("-e")
                .arg("stderr")
                .arg("-p")
                .arg(&dir)
                .arg("-c")
                .arg(&conf);
            listening_on("nginx", cmd, port, READY_TIMEOUT)
        };
        let started = match port {
            Some(port) => launch(port).await,
            None => on_a_free_port(launch).await,
        };
        match started {
            Ok((port, process)) => Nginx {
                port,
                dir,
                routes: routes.clone(),
                process,
            },
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
        let conf = config(self.port, upstreams, &self.dir, &self.routes);
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
