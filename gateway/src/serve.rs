//! Binding both listeners, the ready line, and shutdown: on SIGTERM stop accepting, give open
//! turns the grace period, then end them (they settle what was generated) and wait for every
//! pending settlement before exiting.

use std::net::SocketAddr;
use std::time::Duration;

use axum::serve::{Listener, ListenerExt};
use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::state::AppState;
use crate::{admin, api, telemetry};

/// How long connections may linger after the grace period before the process exits anyway.
const HARD_STOP_AFTER_GRACE: Duration = Duration::from_secs(5);

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
    pub admin_token: String,
    /// Secrets this process generated itself (standalone only), shown once on the ready line
    /// as `name=value`: nobody else knows them. Secrets the operator supplied never appear.
    pub generated: Vec<(&'static str, String)>,
    pub grace: Duration,
}

/// The line on stdout that says both listeners are bound: `ready api=URL admin=URL`, then any
/// generated secrets; one JSON object with the same fields under `--log-format json`.
fn ready_line(api: SocketAddr, admin: SocketAddr, generated: &[(&'static str, String)]) -> String {
    let (api, admin) = (format!("http://{api}"), format!("http://{admin}"));
    match telemetry::log_format() {
        telemetry::LogFormat::Text => {
            let mut line = format!("ready api={api} admin={admin}");
            for (name, value) in generated {
                line.push_str(&format!(" {name}={value}"));
            }
            line
        }
        telemetry::LogFormat::Json => {
            let mut object = serde_json::json!({ "message": "ready", "api": api, "admin": admin });
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

pub async fn run(state: AppState, listen: Listen) -> Result<(), ServeError> {
    let api_listener = bind(listen.api).await?;
    let admin_listener = bind(listen.admin).await?;
    let api_addr = api_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    println!("{}", ready_line(api_addr, admin_addr, &listen.generated));
    tracing::info!(%api_addr, %admin_addr, config_version = %state.catalog().version, "gateway listening; base URL http://{api_addr}");

    telemetry::metrics::config_version(&state.catalog().version);
    let shutdown = state.shutdown.clone();
    tokio::spawn(watch_signals(shutdown.clone(), listen.grace));
    let api = serve_http1(
        api_listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        }),
        api::router(state.clone()),
        shutdown.draining.clone(),
    );
    let admin = serve_http1(
        admin_listener,
        admin::router(state.clone(), &listen.admin_token),
        shutdown.draining.clone(),
    );
    let servers = async { tokio::join!(api, admin) };
    let hard_stop = async {
        shutdown.expired.cancelled().await;
        tokio::time::sleep(HARD_STOP_AFTER_GRACE).await;
    };
    tokio::select! {
        _ = servers => {}
        _ = hard_stop => tracing::warn!("connections still open after the grace period; exiting"),
    }
    shutdown.tasks.close();
    shutdown.tasks.wait().await;
    state.ledger.close().await;
    tracing::info!("gateway stopped");
    Ok(())
}

/// Serves `router` over HTTP/1.1 until `draining` fires, then stops accepting and lets every
/// open connection finish its response in flight.
///
/// Not `axum::serve`: it also serves HTTP/2 without TLS on the same port, so it first reads 24
/// bytes of every connection to look for the HTTP/2 preface. hyper then starts parsing from those
/// 24 bytes, and reading the rest of the request head doubles its read buffer from 8 to 16 KiB,
/// which the connection keeps while its stream is open: 8 MiB per 1,000 open streams, found with
/// heaptrack. Clients, SDKs and load balancers speak HTTP/1.1 to plain-text ports; nothing
/// here relied on cleartext HTTP/2.
///
/// Each connection gets a clone of the router, which shares one route table (an `Arc`).
async fn serve_http1<L>(mut listener: L, router: Router, draining: CancellationToken)
where
    L: Listener,
    L::Io: Unpin,
{
    let http = hyper::server::conn::http1::Builder::new();
    let connections = GracefulShutdown::new();
    loop {
        // `Listener::accept` retries failed accepts itself (and backs off when out of files).
        let (io, _addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = draining.cancelled() => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = connections.watch(http.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    connections.shutdown().await;
}

async fn watch_signals(shutdown: crate::state::Shutdown, grace: Duration) {
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
        grace_secs = grace.as_secs(),
        "shutting down: draining open requests"
    );
    shutdown.draining.cancel();
    tokio::time::sleep(grace).await;
    shutdown.expired.cancel();
}
