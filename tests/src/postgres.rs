//! A throwaway Postgres for the ledger tests: `initdb` into a temporary folder, `postgres` on
//! a free loopback port with its socket in that folder, trust authentication, no fsync; killed
//! on drop and its folder removed. As root, the server runs as the `postgres` user (or
//! `nobody`), since Postgres refuses to run as root.
//!
//! [`PostgresServer::stop`] / [`PostgresServer::restart`] (same port, same data) simulate an
//! outage and its end. [`PostgresServer::query`] runs SQL through `psql` for assertions, and
//! [`PostgresServer::gateway_cli`] runs the gateway's operator commands against the database.
//!
//! [`PostgresServer::start_tls`] is the same server over TLS only: `ssl=on` with a certificate
//! of a CA made for it ([`TlsFiles`]), and a `pg_hba.conf` of `hostssl` lines (and the local
//! socket), so a plaintext TCP connection is refused; its URL says `sslmode=verify-full` with
//! the CA as `sslrootcert`. [`PostgresServer::start_tls_cert_auth`] demands a client
//! certificate besides (`cert` authentication: the certificate's common name, `gateway`,
//! mapped to the `postgres` user); its URL adds the client certificate (`sslcert`, `sslkey`),
//! and the harness' own psql goes through the local socket.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::gateway::{gateway_bin, unique_name, workspace_root};
use crate::server::{on_a_free_port, ServerProcess};
use crate::tls::TlsFiles;

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

pub struct PostgresServer {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    user: Option<(u32, u32)>,
    /// Over TLS only, with these files.
    tls: Option<TlsFiles>,
    /// TCP connections authenticate with a client certificate (`cert`), not `trust`.
    cert_auth: bool,
    process: ServerProcess,
}

/// How TCP clients of a TLS-only server authenticate.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TcpAuth {
    /// Any client over TLS.
    Trust,
    /// A client certificate of the server's CA, its common name mapped to the user.
    Cert,
}

/// The folder of `initdb` and `postgres`: on PATH, else Debian's /usr/lib/postgresql/*/bin
/// (the newest).
pub(crate) fn bin_dir() -> PathBuf {
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|d| d.join("initdb").is_file()) {
            return dir;
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .filter(|bin| bin.join("initdb").is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!("initdb not found; install Postgres (Debian: apt-get install postgresql, or scripts/test does)")
    })
}

/// The unprivileged user to run as when we are root.
pub(crate) fn server_user() -> Option<(u32, u32)> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    for name in [c"postgres", c"nobody"] {
        // SAFETY: a valid NUL-terminated name; the result is read before any other getpw call.
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: non-null pointer returned by getpwnam.
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            return Some((uid, gid));
        }
    }
    panic!("running as root, but neither a postgres nor a nobody user exists")
}

pub(crate) fn chown(path: &Path, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

impl PostgresServer {
    /// Applies the workspace's migrations numbered below `version`: a database as the code of
    /// before left it, for a migration's own test.
    pub async fn migrate_before(&self, version: i64) {
        let pool = sqlx::PgPool::connect(&self.url()).await.expect("pool");
        let mut before = sqlx::migrate::Migrator::new(workspace_root().join("store/migrations"))
            .await
            .expect("migrations");
        before.migrations = std::borrow::Cow::Owned(
            before
                .migrations
                .iter()
                .filter(|m| m.version < version)
                .cloned()
                .collect(),
        );
        before.run(&pool).await.expect("the migrations of before");
        pool.close().await;
    }

    /// Creates a cluster in a fresh folder and starts it on a free port.
    pub async fn start() -> PostgresServer {
        Self::start_with(None, TcpAuth::Trust).await
    }

    /// [`PostgresServer::start`] accepting TLS connections only (`hostssl`), on a certificate
    /// for `127.0.0.1` and `localhost` signed by a CA of its own ([`PostgresServer::tls`]).
    pub async fn start_tls() -> PostgresServer {
        Self::start_with(Some(&["127.0.0.1", "localhost"]), TcpAuth::Trust).await
    }

    /// [`PostgresServer::start_tls`] authenticating TCP clients by their certificate alone
    /// (`hostssl … cert`): a client without [`TlsFiles::client_cert`] is refused, as a managed
    /// Postgres with certificate authentication refuses it.
    pub async fn start_tls_cert_auth() -> PostgresServer {
        Self::start_with(Some(&["127.0.0.1", "localhost"]), TcpAuth::Cert).await
    }

    /// [`PostgresServer::start_tls`] on a certificate naming `names` only: a client verifying
    /// the host must refuse it under any other name.
    pub async fn start_tls_for(names: &[&str]) -> PostgresServer {
        Self::start_with(Some(names), TcpAuth::Trust).await
    }

    async fn start_with(tls: Option<&[&str]>, auth: TcpAuth) -> PostgresServer {
        let dir = std::env::temp_dir().join(unique_name("e2e-postgres"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let user = server_user();
        chown(&dir, user);
        let bin = bin_dir();
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-N", "-U", "postgres", "--auth=trust", "-E", "UTF8", "-D"])
            .arg(dir.join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let out = initdb.output().await.expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let tls = tls.map(|names| tls_only(&dir, names, user, auth));
        let cert_auth = auth == TcpAuth::Cert;
        let host = psql_host(&dir, cert_auth);
        let started = on_a_free_port(|port| {
            let (bin, dir, tls, host) = (&bin, &dir, &tls, &host);
            async move {
                let mut process = ServerProcess::new("postgres");
                let command = server_command(bin, dir, port, user, tls.as_ref());
                process
                    .launch(command, port, READY_TIMEOUT, || answers(bin, host, port))
                    .await?;
                Ok((port, process))
            }
        })
        .await;
        match started {
            Ok((port, process)) => PostgresServer {
                port,
                dir,
                bin,
                user,
                tls,
                cert_auth,
                process,
            },
            Err(errors) => {
                let _ = std::fs::remove_dir_all(&dir);
                panic!("postgres did not start:\n{errors}");
            }
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`; over TLS with
    /// `?sslmode=verify-full&sslrootcert=CA`.
    pub fn url(&self) -> String {
        self.url_on(self.port)
    }

    /// [`PostgresServer::url`] with another port (a proxy's in front of this server).
    pub fn url_on(&self, port: u16) -> String {
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        match &self.tls {
            Some(tls) if self.cert_auth => format!(
                "{url}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
                tls.ca.display(),
                tls.client_cert.display(),
                tls.client_key.display()
            ),
            Some(tls) => format!("{url}?sslmode=verify-full&sslrootcert={}", tls.ca.display()),
            None => url,
        }
    }

    /// The URL without TLS (`sslmode=disable`), which a TLS-only server refuses.
    pub fn plaintext_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// Whether TCP clients must show a client certificate
    /// ([`PostgresServer::start_tls_cert_auth`]).
    pub fn requires_client_certificates(&self) -> bool {
        self.cert_auth
    }

    /// The CA and certificates of a server started with [`PostgresServer::start_tls`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// Fast shutdown (SIGINT); the port is closed afterwards, the data kept.
    pub async fn stop(&mut self) {
        self.process.stop(libc::SIGINT, STOP_TIMEOUT).await;
    }

    /// Starts again on the same port with the same data.
    pub async fn restart(&mut self) {
        let (bin, dir, port, user) = (self.bin.clone(), self.dir.clone(), self.port, self.user);
        let tls = self.tls.clone();
        let host = self.psql_host();
        self.process
            .relaunch(
                || server_command(&bin, &dir, port, user, tls.as_ref()),
                port,
                READY_TIMEOUT,
                || answers(&bin, &host, port),
            )
            .await;
    }

    /// Where the harness' psql connects: the loopback address, or the local socket of a
    /// server demanding client certificates over TCP.
    fn psql_host(&self) -> String {
        psql_host(&self.dir, self.cert_auth)
    }

    /// Runs `sql` and returns psql's unaligned output (`|` between columns, a line per row).
    pub async fn query(&self, sql: &str) -> String {
        psql(&self.bin, &self.psql_host(), self.port, sql)
            .await
            .unwrap_or_else(|e| panic!("psql {sql:?}: {e}\n{}", self.logs()))
    }

    /// Runs `sql`: psql's unaligned output, or its error.
    pub async fn try_query(&self, sql: &str) -> Result<String, String> {
        psql(&self.bin, &self.psql_host(), self.port, sql).await
    }

    /// One integer from `sql`.
    pub async fn query_i64(&self, sql: &str) -> i64 {
        let text = self.query(sql).await;
        text.parse()
            .unwrap_or_else(|_| panic!("{sql:?} returned {text:?}, not an integer"))
    }

    /// Opens a psql session that runs `sql` (a `SELECT … FOR UPDATE`) inside a transaction and
    /// keeps it open, holding the locks it took, until [`HeldLocks::release`] commits it.
    pub async fn hold_locks(&self, sql: &str) -> HeldLocks {
        let name = unique_name("e2e-locks");
        let mut session = Command::new(psql_path(&self.bin))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", &self.psql_host()])
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .env("PGAPPNAME", &name)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run psql: {e}"));
        let mut stdin = session.stdin.take().expect("psql's stdin is piped");
        stdin
            .write_all(format!("BEGIN;\n{sql};\n").as_bytes())
            .await
            .expect("write to psql");
        stdin.flush().await.expect("flush psql's stdin");
        let held = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}' AND state = 'idle in transaction'"
        );
        crate::poll_until(
            "the psql session to hold its locks",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || async { (self.query_i64(&held).await == 1).then_some(()) },
        )
        .await;
        HeldLocks { session, stdin }
    }

    /// How many sessions are waiting for a lock.
    pub async fn lock_waiters(&self) -> i64 {
        self.query_i64("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            .await
    }

    /// `gateway <args> --database-url URL`; its stdout parsed as JSON, or its stderr as the error.
    pub async fn gateway_cli(&self, args: &[&str]) -> Result<Value, String> {
        self.gateway_cli_with_env(args, &[]).await
    }

    /// [`PostgresServer::gateway_cli`] with these environment variables set.
    pub async fn gateway_cli_with_env(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Value, String> {
        let out = Command::new(gateway_bin())
            .args(args)
            .envs(env.iter().copied())
            .args(["--database-url", &self.url()])
            .current_dir(workspace_root())
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run the gateway binary: {e}"));
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "gateway {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }
}

/// A psql session holding locks in an open transaction (see [`PostgresServer::hold_locks`]);
/// dropped, it is killed and its transaction rolled back.
pub struct HeldLocks {
    session: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
}

impl HeldLocks {
    /// Commits the transaction, releasing the locks, and waits for psql to exit.
    pub async fn release(mut self) {
        self.stdin
            .write_all(b"COMMIT;\n")
            .await
            .expect("write to psql");
        drop(self.stdin);
        let status = self.session.wait().await.expect("wait for psql");
        assert!(
            status.success(),
            "psql holding the locks exited with {status}"
        );
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // SIGQUIT: immediate shutdown, the server's own processes included.
        self.process.abandon(libc::SIGQUIT);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The certificates of a TLS-only server in `dir/tls` (the key readable by the server's user
/// only, as Postgres demands), and a `pg_hba.conf` taking TCP connections over TLS alone.
fn tls_only(dir: &Path, names: &[&str], user: Option<(u32, u32)>, auth: TcpAuth) -> TlsFiles {
    let files = TlsFiles::make_for(&dir.join("tls"), names);
    chown(&dir.join("tls"), user);
    for file in [&files.ca, &files.server_cert, &files.server_key] {
        chown(file, user);
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&files.server_key, std::fs::Permissions::from_mode(0o600))
        .expect("chmod the server key");
    let method = match auth {
        TcpAuth::Trust => "trust",
        TcpAuth::Cert => "cert map=e2e",
    };
    let hba = dir.join("pg_hba.conf");
    std::fs::write(
        &hba,
        format!(
            "local all all trust\n\
             hostssl all all 127.0.0.1/32 {method}\n\
             hostssl all all ::1/128 {method}\n"
        ),
    )
    .expect("write pg_hba.conf");
    chown(&hba, user);
    // The client certificate's common name is `gateway`; the URLs connect as `postgres`.
    let ident = dir.join("pg_ident.conf");
    std::fs::write(&ident, "e2e gateway postgres\n").expect("write pg_ident.conf");
    chown(&ident, user);
    files
}

fn server_command(
    bin: &Path,
    dir: &Path,
    port: u16,
    user: Option<(u32, u32)>,
    tls: Option<&TlsFiles>,
) -> Command {
    let mut cmd = Command::new(bin.join("postgres"));
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string()])
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()))
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off", "-c", "max_connections=200"])
        .current_dir(dir);
    if let Some(tls) = tls {
        cmd.args(["-c", "ssl=on"])
            .arg("-c")
            .arg(format!("ssl_cert_file={}", tls.server_cert.display()))
            .arg("-c")
            .arg(format!("ssl_key_file={}", tls.server_key.display()))
            .arg("-c")
            .arg(format!("ssl_ca_file={}", tls.ca.display()))
            .arg("-c")
            .arg(format!("hba_file={}", dir.join("pg_hba.conf").display()))
            .arg("-c")
            .arg(format!(
                "ident_file={}",
                dir.join("pg_ident.conf").display()
            ));
    }
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// `psql` beside `postgres`, else the one on PATH.
fn psql_path(bin: &Path) -> PathBuf {
    if bin.join("psql").is_file() {
        bin.join("psql")
    } else {
        PathBuf::from("psql")
    }
}

/// The host psql is given: the socket's folder when TCP clients need a certificate it lacks.
fn psql_host(dir: &Path, cert_auth: bool) -> String {
    if cert_auth {
        dir.display().to_string()
    } else {
        "127.0.0.1".to_owned()
    }
}

/// Runs `sql` with psql against the server at `host` (an address, or a socket's folder) and
/// `port`: its unaligned output, or its stderr.
pub(crate) async fn psql(bin: &Path, host: &str, port: u16, sql: &str) -> Result<String, String> {
    let out = Command::new(psql_path(bin))
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", host])
        .args(["-p", &port.to_string(), "-U", "postgres", "-d", "postgres"])
        .args(["-c", sql])
        .output()
        .await
        .map_err(|e| format!("cannot run psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Whether the server on `port` answers a query.
async fn answers(bin: &Path, host: &str, port: u16) -> bool {
    psql(bin, host, port, "SELECT 1").await.is_ok()
}
