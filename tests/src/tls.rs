//! The certificates of the TLS stores ([`PostgresServer::start_tls`],
//! [`RedisServer::start_tls`], [`RedisCluster::start_tls`]): a CA made per server, a server
//! certificate for `127.0.0.1` and `localhost` signed by it, a client certificate for the
//! gateway, and a second CA that signed nothing (the wrong CA a gateway must refuse).
//!
//! [`PostgresServer::start_tls`]: crate::PostgresServer::start_tls
//! [`RedisServer::start_tls`]: crate::RedisServer::start_tls
//! [`RedisCluster::start_tls`]: crate::RedisCluster::start_tls

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// PEM files in one folder.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA that signed the server's and the client's certificates.
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed neither: trusting it instead of [`TlsFiles::ca`] must be refused.
    pub wrong_ca: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key")).expect("a CA")
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

impl TlsFiles {
    /// Makes the files in `dir` (created), the server's certificate naming `names`.
    pub fn make_for(dir: &Path, names: &[&str]) -> TlsFiles {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let issuer = ca("e2e test CA");
        let wrong = ca("e2e wrong CA");
        let leaf = |names: Vec<String>, common_name: &str| {
            let key = KeyPair::generate().expect("a key");
            let mut params = CertificateParams::new(names).expect("certificate params");
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            let cert = params
                .signed_by(&key, &issuer)
                .expect("a signed certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            names.iter().map(|n| (*n).to_owned()).collect(),
            names.first().copied().unwrap_or("localhost"),
        );
        let (client_cert, client_key) = leaf(vec!["gateway".to_owned()], "gateway");
        let files = TlsFiles {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
            wrong_ca: dir.join("wrong-ca.crt"),
        };
        write(&files.ca, &issuer.pem());
        write(&files.wrong_ca, &wrong.pem());
        write(&files.server_cert, &server_cert);
        write(&files.server_key, &server_key);
        write(&files.client_cert, &client_cert);
        write(&files.client_key, &client_key);
        files
    }

    /// [`TlsFiles::make_for`] `127.0.0.1` and `localhost`.
    pub fn make(dir: &Path) -> TlsFiles {
        Self::make_for(dir, &["127.0.0.1", "localhost"])
    }

    /// A rustls client trusting [`TlsFiles::ca`] and showing the client certificate, for the
    /// harness' own connections.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.ca).expect("the CA file") {
            roots.add(cert.expect("a CA certificate")).expect("a root");
        }
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.client_cert)
            .expect("the client certificate")
            .collect::<Result<_, _>>()
            .expect("client certificates");
        let key = PrivateKeyDer::from_pem_file(&self.client_key).expect("the client key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .expect("a client certificate");
        Arc::new(config)
    }
}
