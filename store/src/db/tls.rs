//! TLS to Postgres: the CA and client certificate files the flags give (over the URL's
//! `sslrootcert`, `sslcert`, `sslkey`), and the handshake's failures told apart from outages,
//! named `postgres: TLS: …`.
//!
//! sqlx does the handshake (rustls on ring, the Mozilla roots compiled in, the CA file added to
//! them) as the URL's `sslmode` says: `disable` and `allow` never, `prefer` (the default) when
//! the server offers it and in plaintext otherwise, `require` unverified, `verify-ca` the chain,
//! `verify-full` the chain and the host. A CA file given by flag means verification: the mode
//! becomes `verify-full` unless the URL asks `verify-ca`, and a weaker one written out is
//! refused rather than silently not verifying.

use std::path::PathBuf;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::DbError;

/// The files of TLS to Postgres (`--database-ca-file`, `--database-client-cert-file`,
/// `--database-client-key-file` of every process that connects: `gateway serve`, `migrate`,
/// the database commands, the operator).
#[derive(Clone, Debug, Default)]
pub struct PgTlsFiles {
    /// PEM bundle of the CA that signed Postgres' certificate (a managed service's CA,
    /// downloaded). Turns `sslmode` to `verify-full` unless the URL says `verify-ca`.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate this process shows Postgres (`cert` authentication), with its key.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

impl PgTlsFiles {
    /// `options` (parsed from `url`) with these files.
    pub(super) fn apply(
        &self,
        url: &str,
        mut options: PgConnectOptions,
    ) -> Result<PgConnectOptions, DbError> {
        if let Some(ca) = &self.ca_file {
            options = match options.get_ssl_mode() {
                PgSslMode::VerifyCa | PgSslMode::VerifyFull => options,
                PgSslMode::Prefer if !mode_written(url) => options.ssl_mode(PgSslMode::VerifyFull),
                weaker => {
                    return Err(DbError::TlsSettings(format!(
                        "--database-ca-file is for verifying the server, but sslmode is `{}`; \
                         use sslmode=verify-full",
                        mode_name(weaker)
                    )))
                }
            }
            .ssl_root_cert(ca);
        }
        match (&self.client_cert_file, &self.client_key_file) {
            (Some(cert), Some(key)) => {
                options = options.ssl_client_cert(cert).ssl_client_key(key);
            }
            (None, None) => {}
            _ => {
                return Err(DbError::TlsSettings(
                    "--database-client-cert-file and --database-client-key-file go together"
                        .to_owned(),
                ))
            }
        }
        Ok(options)
    }
}

/// Whether the URL (or PGSSLMODE, which sqlx reads too) says which `sslmode`.
fn mode_written(url: &str) -> bool {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    std::env::var_os("PGSSLMODE").is_some()
        || query.split('&').any(|pair| {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            key == "sslmode" || key == "ssl-mode"
        })
}

fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// What went wrong in a TLS handshake, when `e` is one: sqlx's own TLS errors, and rustls'
/// (a refused certificate, an alert from the server), which sqlx passes on as I/O errors.
pub(super) fn failure(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Tls(e) => Some(e.to_string()),
        sqlx::Error::Io(e) => e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(ToString::to_string),
        _ => None,
    }
}

pub(super) fn describe(e: &sqlx::Error) -> String {
    match failure(e) {
        Some(tls) => format!("postgres: TLS: {tls}"),
        None => e.to_string(),
    }
}

pub(super) fn describe_migrate(e: &sqlx::migrate::MigrateError) -> String {
    match e {
        sqlx::migrate::MigrateError::Execute(e) => describe(e),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn with_ca(url: &str) -> Result<PgConnectOptions, DbError> {
        let args = PgTlsFiles {
            ca_file: Some("/ca.pem".into()),
            ..PgTlsFiles::default()
        };
        args.apply(url, PgConnectOptions::from_str(url).expect("a url"))
    }

    #[test]
    fn a_ca_file_makes_an_unwritten_sslmode_verify_full() {
        let options = with_ca("postgres://u@db:5432/x").expect("accepted");
        assert!(matches!(options.get_ssl_mode(), PgSslMode::VerifyFull));
    }

    #[test]
    fn a_ca_file_keeps_verify_ca_when_the_url_asks_it() {
        let options = with_ca("postgres://u@db/x?sslmode=verify-ca").expect("accepted");
        assert!(matches!(options.get_ssl_mode(), PgSslMode::VerifyCa));
    }

    #[test]
    fn a_ca_file_with_an_unverifying_sslmode_is_refused_naming_postgres() {
        for mode in ["disable", "prefer", "require"] {
            let url = format!("postgres://u:secret-pw@db/x?sslmode={mode}");
            let Err(e) = with_ca(&url) else {
                panic!("sslmode={mode} with a CA file was accepted");
            };
            let text = e.to_string();
            assert!(text.starts_with("postgres: TLS: "), "{text}");
            assert!(text.contains(mode), "{text}");
            assert!(!text.contains("secret-pw"), "{text}");
        }
    }

    #[test]
    fn a_client_certificate_without_its_key_is_refused() {
        let args = PgTlsFiles {
            client_cert_file: Some("/c.pem".into()),
            ..PgTlsFiles::default()
        };
        let url = "postgres://u@db/x";
        assert!(args
            .apply(url, PgConnectOptions::from_str(url).expect("a url"))
            .is_err());
    }
}
