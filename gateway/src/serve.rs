//! Binding the listeners, the ready line, and shutdown: on SIGTERM report not ready, keep
//! accepting for the shutdown delay (load balancers still send traffic while they learn the
//! pod is going), then stop accepting, give open turns the grace period, then end them (they
//! settle what was generated) and wait for every pending settlement before exiting. The admin
//! and metrics listeners (probes, `/metrics`) stay open until then: a draining pod is alive,
//! not ready, and its last numbers can still be scraped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::{Listener, ListenerExt};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONNECTION};
use hyper::service::{service_fn, Service as _};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::client_address::Peer;
use crate::edge::body_reader::BodyDeadline;
use crate::state::AppState;
use crate::{admin, api};
use gateway_core::telemetry;

/// How long connections may linger after the grace period before the process exits anyway.
pub const HARD_STOP_AFTER_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

pub struct Listen {
    pub api: SocketAddr,
    pub admin: SocketAddr,
    /// The admin socket, when it was bound before the config arrived ([`WaitingAdmin`]).
    pub admin_bound: Option<TcpListener>,
    /// `/metrics` and the probes on a listener of their own, without the admin API.
    pub metrics: Option<SocketAddr>,
    pub admin_token: String,
    /// Secrets this process generated itself (standalone only), shown once on the ready line
    /// as `name=value`: nobody else knows them. Secrets the operator supplied never appear.
    pub generated: Vec<(&'static str, String)>,
    /// SIGTERM to closing the listeners.
    pub delay: Duration,
    pub grace: Duration,
    pub edge: Edge,
}

/// How long a client may take to send a request, and how many may be connected at once.
#[derive(Clone, Copy, Debug)]
pub struct Edge {
    pub header_read_timeout: Duration,
    pub body: BodyDeadline,
    pub max_connections: usize,
    /// The process' memory budget for request bodies (`edge::budget`).
    pub body_memory_budget_mib: usize,
}

/// File descriptors kept free of client connections: the admin listener and its probes,
/// upstream, Redis and Postgres connections, log and config files.
const RESERVED_FDS: u64 = 256;

/// `wanted`, lowered so that client connections leave [`RESERVED_FDS`] of the process' open
/// file limit (or a quarter of it, when the limit is small) to everything else: once accept
/// fails with EMFILE nothing works, probes included.
fn connection_cap(wanted: usize) -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own, nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return wanted;
    }
    let files = limit.rlim_cur;
    let usable = files.saturating_sub(RESERVED_FDS.min(files / 4)).max(1);
    wanted.min(usize::try_from(usable).unwrap_or(usize::MAX))
}

/// The line on stdout that says the listeners are bound: `ready api=URL admin=URL`, then
/// `metrics=URL` when it has its own, then any generated secrets; one JSON object with the
/// same fields under `--log-format json`.
fn ready_line(
    api: SocketAddr,
    admin: SocketAddr,
    metrics: Option<SocketAddr>,
    generated: &[(&'static str, String)],
) -> String {
    let (api, admin) = (format!("http://{api}"), format!("http://{admin}"));
    let metrics = metrics.map(|addr| format!("http://{addr}"));
    match telemetry::log_format() {
        telemetry::LogFormat::Text => {
            let mut line = format!("ready api={api} admin={admin}");
            if let Some(metrics) = &metrics {
                line.push_str(&format!(" metrics={metrics}"));
            }
            for (name, value) in generated {
                line.push_str(&format!(" {name}={value}"));
            }
            line
        }
        telemetry::LogFormat::Json => {
            let mut object = serde_json::json!({ "message": "ready", "api": api, "admin": admin });
            if let Some(metrics) = metrics {
                object["metrics"] = serde_json::Value::from(metrics);
            }
            for (name, value) in generated {
                object[*name] = serde_json::Value::from(value.as_str());
            }
            object.to_string()
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// The admin socket while a pod waits for its first published config, answering only the
/// probes ([`admin::waiting_router`]). The socket is handed over to [`run`] as it is, so a
/// probe arriving during the switch waits in the backlog instead of being refused.
pub struct WaitingAdmin {
    listener: std::net::TcpListener,
    stop: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl WaitingAdmin {
    /// `config_secret`: the `NAMESPACE/NAME` of the Secret the config is awaited in, if any.
    pub async fn bind(addr: SocketAddr, config_secret: Option<String>) -> Result<Self, ServeError> {
        let listener = bind(addr).await?.into_std()?;
        let serving = TcpListener::from_std(listener.try_clone()?)?;
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_http1(
            serving,
            admin::waiting_router(config_secret),
            Closing {
                hint: CancellationToken::new(),
                now: stop.clone(),
            },
            Http1Limits {
                header_read_timeout: Duration::from_secs(10),
                max_connections: None,
            },
        ));
        Ok(Self {
            listener,
            stop,
            server,
        })
    }

    /// Stops answering and returns the socket, still bound and listening.
    pub async fn hand_over(self) -> Result<TcpListener, ServeError> {
        self.stop.cancel();
        if let Err(e) = self.server.await {
            tracing::warn!(error = %e, "the waiting admin listener ended abnormally");
        }
        Ok(TcpListener::from_std(self.listener)?)
    }
}

pub async fn run(state: AppState, listen: Listen) -> Result<(), ServeError> {
    let api_listener = bind(listen.api).await?;
    let admin_listener = match listen.admin_bound {
        Some(listener) => listener,
        None => bind(listen.admin).await?,
    };
    let api_addr = api_listener.local_addr()?;
    state.api_listening_on(api_addr);
    let admin_addr = admin_listener.local_addr()?;
    let metrics_listener = match listen.metrics {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let metrics_addr = match &metrics_listener {
        Some(listener) => Some(listener.local_addr()?),
        None => None,
    };
    println!(
        "{}",
        ready_line(api_addr, admin_addr, metrics_addr, &listen.generated)
    );
    tracing::info!(%api_addr, %admin_addr, config_version = %state.catalog().version, "gateway listening; base URL http://{api_addr}");

    telemetry::metrics::config_version(&state.catalog().version);
    let shutdown = state.shutdown().clone();
    tokio::spawn(watch_signals(shutdown.clone(), listen.delay, listen.grace));
    let edge = listen.edge;
    crate::edge::budget::configure(edge.body_memory_budget_mib);
    let max_connections = connection_cap(edge.max_connections);
    if max_connections < edge.max_connections {
        tracing::warn!(
            max_connections,
            wanted = edge.max_connections,
            "the open file limit lowers the client connection cap; raise `ulimit -n` for more"
        );
    }
    let api = serve_http1(
        api_listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        }),
        api::service(state.clone(), edge.body),
        Closing::on(&shutdown),
        Http1Limits {
            header_read_timeout: edge.header_read_timeout,
            max_connections: Some(max_connections),
        },
    );
    // The admin listener (probes, metrics, operators) is not counted in the cap, so a flood
    // of clients never fails a liveness probe. It and the metrics listener close last, once
    // the public listener has drained and the settlements are written.
    let exiting = CancellationToken::new();
    let probes_closing = || Closing {
        hint: shutdown.stopping.clone(),
        now: exiting.clone(),
    };
    let admin = serve_http1(
        admin_listener,
        admin::router(state.clone(), &listen.admin_token).layer(axum::Extension(edge.body)),
        probes_closing(),
        Http1Limits {
            header_read_timeout: edge.header_read_timeout,
            max_connections: None,
        },
    );
    let metrics = async {
        if let Some(listener) = metrics_listener {
            serve_http1(
                listener,
                admin::metrics_router(state.clone()),
                probes_closing(),
                Http1Limits {
                    header_read_timeout: edge.header_read_timeout,
                    max_connections: None,
                },
            )
            .await;
        }
    };
    let hard_stop = async {
        shutdown.expired.cancelled().await;
        tokio::time::sleep(HARD_STOP_AFTER_GRACE).await;
    };
    let drain = async {
        tokio::select! {
            () = api => {}
            () = hard_stop => tracing::warn!("connections still open after the grace period; exiting"),
        }
        shutdown.tasks.close();
        shutdown.tasks.wait().await;
        state.ledger().close().await;
        exiting.cancel();
    };
    let probes = async {
        tokio::join!(admin, metrics);
    };
    tokio::pin!(probes);
    tokio::select! {
        // Not before the drain: they close when `exiting` fires.
        () = &mut probes => {}
        () = drain => {
            // A probe or a scrape in flight gets a moment to be answered; nothing waits for
            // more.
            if tokio::time::timeout(PROBES_LINGER, probes).await.is_err() {
                tracing::debug!("an admin request was still open at exit");
            }
        }
    }
    tracing::info!("gateway stopped");
    Ok(())
}

/// How long answers in flight on the admin and metrics listeners may take once the process
/// has drained.
const PROBES_LINGER: Duration = Duration::from_secs(1);

/// Serves `router` over HTTP/1.1 until `draining` fires, then stops accepting and lets every
/// open connection finish its response in flight. Once the process is `stopping`, responses
/// carry `Connection: close`, so kept-alive clients reconnect elsewhere before the listener
/// closes instead of racing its close with their next request.
///
/// Not `axum::serve`: it also serves HTTP/2 without TLS on the same port, so it first reads 24
/// bytes of every connection to look for the HTTP/2 preface. hyper then starts parsing from those
/// 24 bytes, and reading the rest of the request head doubles its read buffer from 8 to 16 KiB,
/// which the connection keeps while its stream is open: 8 MiB per 1,000 open streams, found with
/// heaptrack. Clients, SDKs and load balancers speak HTTP/1.1 to plain-text ports; nothing
/// here relied on cleartext HTTP/2.
///
/// Each connection gets a clone of the router, which shares one route table (an `Arc`).
///
/// A connection that does not finish sending a request head within `header_read_timeout`
/// (from when it opened or its last response ended, so idle keep-alive connections too) is
/// closed by hyper. With `max_connections`, the listener accepts no more while that many are
/// open: the rest wait in the kernel's backlog instead of taking file descriptors.
///
/// Every request carries its connection's [`Peer`] address (the per-address limits count by
/// it).
async fn serve_http1<L, S>(mut listener: L, service: S, closing: Closing, limits: Http1Limits)
where
    L: Listener<Addr = SocketAddr>,
    L::Io: Unpin,
    S: api::HttpService,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let slots = limits.max_connections.map(|n| Arc::new(Semaphore::new(n)));
    let connections = GracefulShutdown::new();
    let draining = &closing.now;
    loop {
        let slot = match &slots {
            Some(slots) => tokio::select! {
                slot = slots.clone().acquire_owned() => slot.ok(),
                () = draining.cancelled() => break,
            },
            None => None,
        };
        // `Listener::accept` retries failed accepts itself (and backs off when out of files).
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = draining.cancelled() => break,
        };
        let routes = TowerToHyperService::new(service.clone());
        let stopping = closing.hint.clone();
        let connection_service = service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(Peer(addr));
            let answer = routes.call(req.map(axum::body::Body::new));
            let stopping = stopping.clone();
            async move {
                let mut response: axum::response::Response = answer.await?;
                if stopping.is_cancelled() {
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                Ok::<_, Infallible>(response)
            }
        });
        let connection =
            connections.watch(http.serve_connection(TokioIo::new(io), connection_service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    connections.shutdown().await;
}

/// When a listener closes (`now`), and from when its answers tell clients not to keep their
/// connection (`hint`).
struct Closing {
    hint: CancellationToken,
    now: CancellationToken,
}

impl Closing {
    fn on(shutdown: &gateway_core::shutdown::Shutdown) -> Self {
        Self {
            hint: shutdown.stopping.clone(),
            now: shutdown.draining.clone(),
        }
    }
}

#[derive(Clone, Copy)]
struct Http1Limits {
    header_read_timeout: Duration,
    max_connections: Option<usize>,
}

async fn watch_signals(
    shutdown: gateway_core::shutdown::Shutdown,
    delay: Duration,
    grace: Duration,
) {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!(
        delay_secs = delay.as_secs(),
        grace_secs = grace.as_secs(),
        "shutting down: not ready; closing the listener after the delay, then draining open requests"
    );
    shutdown.stopping.cancel();
    tokio::time::sleep(delay).await;
    shutdown.draining.cancel();
    tokio::time::sleep(grace).await;
    shutdown.expired.cancel();
}
