//! A throwaway SMTP server that keeps what it receives: PyPI's `aiosmtpd` (from the test venv)
//! with its `Mailbox` handler, writing each message into a maildir. A free loopback port, its
//! maildir in a temporary folder; killed on drop.

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::{unique_name, workspace_root};
use crate::server::{listening_on, on_a_free_port, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(20);

pub struct SmtpSink {
    pub port: u16,
    dir: PathBuf,
    process: ServerProcess,
}

/// The venv's python, where `scripts/test` installs aiosmtpd (tests/python/requirements.txt).
fn python() -> PathBuf {
    workspace_root().join(".cache/venv/bin/python")
}

impl SmtpSink {
    pub async fn start() -> SmtpSink {
        let python = python();
        assert!(
            python.is_file(),
            "{} not found; scripts/test creates the venv with aiosmtpd",
            python.display()
        );
        let dir = std::env::temp_dir().join(unique_name("e2e-smtp"));
        let started = on_a_free_port(|port| {
            let mut cmd = Command::new(&python);
            cmd.args(["-m", "aiosmtpd", "--nosetuid", "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .args(["--class", "aiosmtpd.handlers.Mailbox"])
                .arg(&dir);
            listening_on("aiosmtpd", cmd, port, READY_TIMEOUT)
        })
        .await;
        match started {
            Ok((port, process)) => SmtpSink { port, dir, process },
            Err(errors) => panic!("aiosmtpd did not start:\n{errors}"),
        }
    }

    /// `smtp://127.0.0.1:PORT`, for `--smtp-url`.
    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every message received so far, raw (headers and body).
    pub fn messages(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("new")) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .collect()
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.process.abandon(libc::SIGKILL);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
