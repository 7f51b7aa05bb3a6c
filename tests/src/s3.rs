//! A throwaway S3-compatible server: PyPI's `moto` in server mode (from the test venv, like
//! aiosmtpd), on a free loopback port, its buckets in memory; killed on drop. Its objects are
//! read and written here without signing (moto takes unsigned requests), so a test can look
//! at what was exported, or damage it.

use std::time::Duration;

use tokio::process::Command;

use crate::gateway::workspace_root;
use crate::server::{listening_on, on_a_free_port, ServerProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the gateway signs its requests to moto with (moto takes any).
pub const CREDENTIALS: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
];

pub struct S3Server {
    pub port: u16,
    process: ServerProcess,
}

impl S3Server {
    pub async fn start() -> S3Server {
        let python = workspace_root().join(".cache/venv/bin/python");
        assert!(
            python.is_file(),
            "{} not found; scripts/test creates the venv with moto[server]",
            python.display()
        );
        let started = on_a_free_port(|port| {
            let mut cmd = Command::new(&python);
            cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p"])
                .arg(port.to_string());
            listening_on("moto", cmd, port, READY_TIMEOUT)
        })
        .await;
        match started {
            Ok((port, process)) => S3Server { port, process },
            Err(errors) => panic!("moto did not start:\n{errors}"),
        }
    }

    /// The endpoint, for `--s3-endpoint`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A bucket whose policy lets anyone read and write its objects (moto refuses unsigned
    /// requests to the objects of a signed writer otherwise).
    pub async fn create_bucket(&self, bucket: &str) {
        let client = reqwest::Client::new();
        let status = client
            .put(format!("{}/{bucket}", self.url()))
            .send()
            .await
            .expect("moto answers")
            .status();
        assert!(status.is_success(), "create bucket {bucket}: {status}");
        let policy = serde_json::json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Effect": "Allow",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [format!("arn:aws:s3:::{bucket}/*")],
            }],
        });
        let status = client
            .put(format!("{}/{bucket}?policy", self.url()))
            .body(policy.to_string())
            .send()
            .await
            .expect("moto answers")
            .status();
        assert!(status.is_success(), "policy of {bucket}: {status}");
    }

    /// The object at `bucket/key`; `None` when there is none.
    pub async fn object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let answer = reqwest::Client::new()
            .get(format!("{}/{bucket}/{key}", self.url()))
            .send()
            .await
            .expect("moto answers");
        if answer.status() == 404 {
            return None;
        }
        assert!(
            answer.status().is_success(),
            "get {key}: {}",
            answer.status()
        );
        Some(answer.bytes().await.expect("object body").to_vec())
    }

    pub async fn put_object(&self, bucket: &str, key: &str, body: Vec<u8>) {
        let status = reqwest::Client::new()
            .put(format!("{}/{bucket}/{key}", self.url()))
            .body(body)
            .send()
            .await
            .expect("moto answers")
            .status();
        assert!(status.is_success(), "put {key}: {status}");
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.process.abandon(libc::SIGKILL);
    }
}
