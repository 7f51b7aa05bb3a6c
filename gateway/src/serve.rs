//! Binding both listeners, the ready line, and shutdown: on SIGTERM stop accepting, give open
//! turns the grace period, then end them (they settle what was generated) and wait for every
//! pending settlement before exiting.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::time::Duration;

use axum::serve::ListenerExt;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

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
    pub dev_key: String,
    pub grace: Duration,
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
    println!(
        "ready api=http://{api_addr} admin=http://{admin_addr} key={} admin_token={}",
        listen.dev_key, listen.admin_token
    );
    tracing::info!(%api_addr, %admin_addr, config_version = %state.catalog().version, "gateway listening; base URL http://{api_addr}");

    telemetry::metrics::config_version(&state.catalog().version);
    let shutdown = state.shutdown.clone();
    tokio::spawn(watch_signals(shutdown.clone(), listen.grace));
    // A router handed to `serve` as it is rebuilds its route table for every connection it
    // accepts (about 17 KiB that each open stream kept, measured with heaptrack); made into a
    // service once, every connection shares the one table.
    let api = axum::serve(
        api_listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        }),
        api::router(state.clone()).into_make_service(),
    )
    .with_graceful_shutdown(shutdown.draining.clone().cancelled_owned());
    let admin = axum::serve(
        admin_listener,
        admin::router(state.clone(), &listen.admin_token).into_make_service(),
    )
    .with_graceful_shutdown(shutdown.draining.clone().cancelled_owned());
    let servers = async { tokio::try_join!(api.into_future(), admin.into_future()) };
    let hard_stop = async {
        shutdown.expired.cancelled().await;
        tokio::time::sleep(HARD_STOP_AFTER_GRACE).await;
    };
    tokio::select! {
        result = servers => { result?; }
        _ = hard_stop => tracing::warn!("connections still open after the grace period; exiting"),
    }
    shutdown.tasks.close();
    shutdown.tasks.wait().await;
    state.ledger.close().await;
    tracing::info!("gateway stopped");
    Ok(())
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
