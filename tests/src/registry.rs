//! A throwaway OCI registry (Debian's `docker-registry`, the CNCF distribution registry) on a
//! free loopback port, plain HTTP, its blobs in a temporary folder; killed on drop. What a
//! release is pushed to and a cluster pulls from (`scripts/release`).

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::unique_name;
use crate::server::{listening_on, on_a_free_port, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(15);

pub struct Registry {
    pub port: u16,
    dir: PathBuf,
    process: ServerProcess,
}

impl Registry {
    /// Starts the registry and waits until it accepts connections. Panics when
    /// `docker-registry` is missing (scripts/test installs it).
    pub async fn start() -> Registry {
        let bin = PathBuf::from("/usr/bin/docker-registry");
        assert!(
            bin.is_file(),
            "docker-registry not found; apt-get install docker-registry (scripts/test does)"
        );
        let dir = std::env::temp_dir().join(unique_name("e2e-registry"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let started = on_a_free_port(|port| {
            let config = dir.join("config.yml");
            let text = format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                dir.join("blobs").display()
            );
            std::fs::write(&config, text).expect("write the registry's config");
            let mut cmd = Command::new(&bin);
            cmd.arg("serve").arg(&config);
            listening_on("docker-registry", cmd, port, READY_TIMEOUT)
        })
        .await;
        match started {
            Ok((port, process)) => Registry { port, dir, process },
            Err(errors) => {
                let _ = std::fs::remove_dir_all(&dir);
                panic!("docker-registry did not start:\n{errors}");
            }
        }
    }

    /// `127.0.0.1:PORT`, the registry's host as image and chart references name it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.process.abandon(libc::SIGKILL);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
