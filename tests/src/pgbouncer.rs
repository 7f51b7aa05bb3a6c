//! A throwaway PgBouncer (Debian's `pgbouncer`) in transaction pooling mode in front of a
//! [`PostgresServer`]: a free loopback port, trust authentication, its files in a temporary
//! folder; killed on drop. As root it runs as the Postgres server's user, since PgBouncer
//! refuses to run as root.
//!
//! [`PgBouncer::start`] first applies the gateway's migrations to Postgres directly (the
//! migrator's session lock cannot work through transaction pooling), so the pods behind it
//! start with `--database-pooler transaction` and without `--migrate`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::unique_name;
use crate::postgres::{bin_dir, chown, psql, server_user, PostgresServer};
use crate::server::{on_a_free_port, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Server connections per database and user: what all the pods behind it share.
pub const POOL_SIZE: u32 = 20;

pub struct PgBouncer {
    pub port: u16,
    dir: PathBuf,
    process: ServerProcess,
}

/// `pgbouncer` on PATH, else Debian's /usr/sbin/pgbouncer (sbin is not on every user's PATH).
fn pgbouncer_bin() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("pgbouncer"))
                .find(|bin| bin.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"))
}

fn config(port: u16, postgres_port: u16, dir: &Path) -> String {
    format!(
        "[databases]
postgres = host=127.0.0.1 port={postgres_port} dbname=postgres user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {auth}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 2000
; back within a second of Postgres (the default waits 15 s between login attempts)
server_login_retry = 1
",
        auth = dir.join("userlist.txt").display(),
    )
}

impl PgBouncer {
    /// Migrates `postgres` directly, then starts PgBouncer in front of it and waits until a
    /// query passes through.
    pub async fn start(postgres: &PostgresServer) -> PgBouncer {
        postgres
            .gateway_cli(&["migrate"])
            .await
            .unwrap_or_else(|e| panic!("gateway migrate: {e}"));
        let bin = pgbouncer_bin();
        assert!(
            bin.is_file(),
            "pgbouncer not found; install it (Debian: apt-get install pgbouncer, or scripts/test does)"
        );
        let dir = std::env::temp_dir().join(unique_name("e2e-pgbouncer"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let user = server_user();
        chown(&dir, user);
        let userlist = dir.join("userlist.txt");
        std::fs::write(&userlist, "\"postgres\" \"\"\n").expect("write userlist.txt");
        chown(&userlist, user);
        let psql_dir = bin_dir();
        let started = on_a_free_port(|port| {
            let ini = dir.join("pgbouncer.ini");
            std::fs::write(&ini, config(port, postgres.port, &dir)).expect("write pgbouncer.ini");
            chown(&ini, user);
            let mut cmd = Command::new(&bin);
            cmd.arg(&ini).current_dir(&dir);
            if let Some((uid, gid)) = user {
                cmd.uid(uid).gid(gid);
            }
            let psql_dir = &psql_dir;
            async move {
                let mut process = ServerProcess::new("pgbouncer");
                let ready =
                    || async move { psql(psql_dir, "127.0.0.1", port, "SELECT 1").await.is_ok() };
                process.launch(cmd, port, READY_TIMEOUT, ready).await?;
                Ok((port, process))
            }
        })
        .await;
        match started {
            Ok((port, process)) => PgBouncer { port, dir, process },
            Err(errors) => {
                let _ = std::fs::remove_dir_all(&dir);
                panic!("pgbouncer did not start:\n{errors}");
            }
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, PgBouncer's port.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.process.abandon(libc::SIGKILL);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
