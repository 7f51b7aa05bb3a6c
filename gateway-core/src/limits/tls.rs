//! TLS to Redis (`rediss://`, `rediss-cluster://`): the rustls client config fred is given,
//! with ring named as its provider and the CA of `--redis-ca-file` as its only root (the Mozilla
//! roots without one, for a managed Redis with a public certificate), and one handshake at
//! start, so that a certificate the gateway refuses stops the process with `redis: TLS: …`
//! rather than reading as an outage forever.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fred::types::config::Server;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::LimitError;

/// The files of TLS to Redis (`--redis-ca-file`, `--redis-client-cert-file`,
/// `--redis-client-key-file`).
#[derive(Clone, Debug, Default)]
pub struct RedisTlsFiles {
    /// PEM bundle of the CA(s) to trust, instead of the public roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain shown to Redis (`tls-auth-clients yes`), with its key.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

fn refused(what: impl std::fmt::Display) -> LimitError {
    LimitError::Unavailable(format!("redis: TLS: {what}"))
}

impl RedisTlsFiles {
    pub(super) fn any(&self) -> bool {
        self.ca_file.is_some() || self.client_cert_file.is_some() || self.client_key_file.is_some()
    }

    pub(super) fn client_config(&self) -> Result<ClientConfig, LimitError> {
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                for cert in certificates(path)? {
                    roots
                        .add(cert)
                        .map_err(|e| refused(format_args!("{}: {e}", path.display())))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(refused)?
            .with_root_certificates(roots);
        match (&self.client_cert_file, &self.client_key_file) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| refused(format_args!("{}: {e}", key.display())))?;
                builder
                    .with_client_auth_cert(certificates(cert)?, key)
                    .map_err(refused)
            }
            _ => Err(refused(
                "--redis-client-cert-file and --redis-client-key-file go together",
            )),
        }
    }
}

/// The certificates of a PEM file; at least one.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, LimitError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| refused(format_args!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(refused(format_args!(
            "{}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// `url` with its TLS scheme made the plaintext one (fred would otherwise build a TLS config
/// of its own while parsing), and whether it was a TLS one.
pub(super) fn plain_scheme(url: &str) -> (String, bool) {
    match url.split_once("://") {
        Some(("rediss", rest)) => (format!("redis://{rest}"), true),
        Some(("rediss-cluster", rest)) => (format!("redis-cluster://{rest}"), true),
        _ => (url.to_owned(), false),
    }
}

/// A TLS handshake with `server` and one PING read back (with TLS 1.3 a server refusing the
/// client's certificate says so after the client's side of the handshake is done). A refused
/// handshake is an error; a server not reached is not (the outage policy rides that out).
pub(super) async fn handshake(
    server: &Server,
    config: ClientConfig,
    bound: Duration,
) -> Result<(), LimitError> {
    let host: &str = &server.host;
    let name = ServerName::try_from(host.to_owned()).map_err(refused)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let exchange = async {
        let tcp = TcpStream::connect((host, server.port)).await?;
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.map(drop)
    };
    let outcome = match tokio::time::timeout(bound, exchange).await {
        Ok(outcome) => outcome,
        Err(_) => return Ok(()),
    };
    match outcome {
        Err(e) => match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
            Some(tls) => Err(refused(tls)),
            None => Ok(()),
        },
        Ok(()) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_schemes_are_parsed_as_their_plaintext_ones() {
        assert_eq!(
            plain_scheme("rediss://u:p@h:6380/1"),
            ("redis://u:p@h:6380/1".to_owned(), true)
        );
        assert_eq!(
            plain_scheme("rediss-cluster://h:7000?node=h:7001"),
            ("redis-cluster://h:7000?node=h:7001".to_owned(), true)
        );
        assert_eq!(
            plain_scheme("redis-cluster://h:7000"),
            ("redis-cluster://h:7000".to_owned(), false)
        );
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_naming_redis() {
        let dir = std::env::temp_dir().join(format!("redis-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("written");
        let files = RedisTlsFiles {
            ca_file: Some(empty),
            ..RedisTlsFiles::default()
        };
        let Err(e) = files.client_config() else {
            panic!("a CA file without certificates was accepted");
        };
        assert!(e.to_string().starts_with("redis: TLS: "), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_public_roots_are_used_without_a_ca_file() {
        assert!(RedisTlsFiles::default().client_config().is_ok());
    }
}
