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

/// `scripts/release` of the test's binaries (`GATEWAY_BIN`'s folder) to a [`Registry`] of its
/// own, as a platform team's CI would publish a release: the image (pushed, then removed from
/// this machine's image storage, so that whoever runs it pulls it from the registry as a
/// cluster's node would) and the packaged chart. Drop removes the image pulled back and the
/// release's files, and stops the registry.
pub struct Release {
    pub registry: Registry,
    /// The chart's (and image's) version.
    pub version: String,
    /// `sha256:…`, the pushed image's manifest digest.
    pub image_digest: String,
    /// `HOST:PORT/svc-gateway`: the repository the image was pushed to.
    pub image_repository: String,
    /// `oci://HOST:PORT/charts/gateway`.
    pub chart: String,
    out: PathBuf,
}

impl Release {
    /// Starts a registry and runs `scripts/release` to it with `PLAIN_HTTP=1`, packaging the
    /// chart at `chart_dir`; panics with the script's output when it fails. The image is then
    /// removed from this machine (it stays in the registry): nothing here has it until a node
    /// pulls it.
    pub async fn publish(chart_dir: &std::path::Path) -> Release {
        let registry = Registry::start().await;
        let root = crate::gateway::workspace_root();
        let out = std::env::temp_dir().join(unique_name("e2e-release"));
        let bin_dir = crate::gateway::gateway_bin()
            .parent()
            .expect("the binaries' folder")
            .to_path_buf();
        let released = Command::new(root.join("scripts/release"))
            .arg(registry.host())
            .arg(&bin_dir)
            .env("PLAIN_HTTP", "1")
            .env("OUT", &out)
            .env("CHART", chart_dir)
            .env("HELM", crate::helm::helm_bin())
            .current_dir(&root)
            .output()
            .await
            .expect("run scripts/release");
        assert!(
            released.status.success(),
            "scripts/release failed:\n{}\nregistry:\n{}",
            String::from_utf8_lossy(&released.stderr),
            registry.logs()
        );
        let text = std::fs::read_to_string(out.join("release.json")).expect("read release.json");
        let json: serde_json::Value = serde_json::from_str(&text).expect("release.json is JSON");
        let field = |name: &str| {
            json[name]
                .as_str()
                .unwrap_or_else(|| panic!("no {name} in release.json: {json}"))
                .to_owned()
        };
        let release = Release {
            version: field("version"),
            image_digest: field("image_digest"),
            image_repository: format!("{}/svc-gateway", registry.host()),
            chart: field("chart"),
            registry,
            out,
        };
        // The build's copy goes (by its ID: removing the tag alone keeps the image under the
        // pushed digest), so that only a pull from the registry brings it back.
        let built = field("image");
        let id = crate::podman::podman(&["image", "inspect", "--format", "{{.Id}}", &built]);
        let id = String::from_utf8_lossy(&id.stdout).trim().to_owned();
        let removed = crate::podman::podman(&["rmi", "--force", &id]);
        assert!(
            removed.status.success(),
            "podman rmi {built} ({id}): {}",
            String::from_utf8_lossy(&removed.stderr)
        );
        assert!(
            !crate::podman::podman(&["image", "exists", &release.image_by_digest()])
                .status
                .success(),
            "{} is still in this machine's image storage",
            release.image_by_digest()
        );
        release
    }

    /// `HOST:PORT/svc-gateway@sha256:…`: the image as a cluster pinning it names it.
    pub fn image_by_digest(&self) -> String {
        format!("{}@{}", self.image_repository, self.image_digest)
    }

    /// The helm values that pin both containers' image by that digest.
    pub fn image_values(&self) -> Vec<String> {
        ["gateway", "operator"]
            .iter()
            .flat_map(|part| {
                [
                    format!("{part}.image.repository={}", self.image_repository),
                    format!("{part}.image.digest={}", self.image_digest),
                ]
            })
            .collect()
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = crate::podman::podman(&["rmi", "--force", &self.image_by_digest()]);
        let _ = std::fs::remove_dir_all(&self.out);
    }
}
