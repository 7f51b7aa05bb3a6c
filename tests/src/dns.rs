//! A throwaway DNS server: PyPI's `dnslib` (from the test venv, `tests/python/dns_server.py`),
//! UDP and TCP on a free loopback port, answering TXT queries from a zone the test sets; killed
//! on drop. The gateway looks its TXT records up there with `--dns-resolver`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::{unique_name, workspace_root};
use crate::server::{listening_on, on_a_free_port, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

pub struct DnsServer {
    pub port: u16,
    zone: PathBuf,
    _process: ServerProcess,
}

impl DnsServer {
    /// A server with an empty zone (every name NXDOMAIN).
    pub async fn start() -> DnsServer {
        let python = workspace_root().join(".cache/venv/bin/python");
        assert!(
            python.is_file(),
            "{} not found; scripts/test creates the venv with dnslib",
            python.display()
        );
        let zone = std::env::temp_dir().join(unique_name("e2e-dns-zone") + ".json");
        std::fs::write(&zone, "{}").expect("write the zone");
        let script = workspace_root().join("tests/python/dns_server.py");
        let started = on_a_free_port(|port| {
            let mut cmd = Command::new(&python);
            cmd.arg(&script).arg(port.to_string()).arg(&zone);
            listening_on("dnslib", cmd, port, READY_TIMEOUT)
        })
        .await;
        match started {
            Ok((port, process)) => DnsServer {
                port,
                zone,
                _process: process,
            },
            Err(errors) => panic!("the DNS server did not start:\n{errors}"),
        }
    }

    /// For `--dns-resolver`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Sets the zone: each name (without its final dot) and its TXT values; every other name
    /// is NXDOMAIN. Replaces the file at once, so a query reads the old zone or the new one.
    pub fn set_txt(&self, records: &[(&str, &[&str])]) {
        let zone: BTreeMap<String, Vec<&str>> = records
            .iter()
            .map(|(name, values)| (format!("{}.", name.to_lowercase()), values.to_vec()))
            .collect();
        let next = self.zone.with_extension("next");
        std::fs::write(&next, serde_json::to_string(&zone).expect("zone json"))
            .expect("write the zone");
        std::fs::rename(&next, &self.zone).expect("replace the zone");
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.zone);
    }
}
