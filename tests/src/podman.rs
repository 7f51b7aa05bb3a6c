//! The gateway's image under podman, run as the chart runs it: read-only root filesystem, user
//! 65532, every capability dropped, the host's network (so the test's Redis, Postgres, mock
//! upstream and API server on loopback are reachable, and the test reaches the container's
//! ports). `scripts/test` builds the image once per run with `scripts/image` and exports its
//! name as `GATEWAY_IMAGE`; the default is the chart's default image.
//!
//! Podman runs as root with the vfs storage driver `scripts/image` committed to, runc, the
//! cgroupfs manager and `scripts/containers.conf` (no default ulimits): the combination that
//! works on a machine without systemd, overlay mounts or user namespaces.

use std::ffi::OsString;
use std::path::Path;
use std::process::Output;

use crate::gateway::{unique_name, workspace_root};

/// The chart's `appVersion`: the tag of its default image.
pub fn app_version() -> String {
    let chart = std::fs::read_to_string(workspace_root().join("charts/gateway/Chart.yaml"))
        .expect("read Chart.yaml");
    chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .expect("Chart.yaml has an appVersion")
        .trim()
        .trim_matches('"')
        .to_owned()
}

/// The chart's default image, which `scripts/image` tags: `localhost/svc-gateway:APPVERSION`.
pub fn default_image() -> String {
    format!("localhost/svc-gateway:{}", app_version())
}

/// `$GATEWAY_IMAGE`, else [`default_image`].
pub fn image() -> String {
    std::env::var("GATEWAY_IMAGE").unwrap_or_else(|_| default_image())
}

/// `podman` with this machine's global options and containers.conf, as a command line
/// (program first: `env`, which sets CONTAINERS_CONF).
pub fn podman_command() -> Vec<OsString> {
    let conf = format!("CONTAINERS_CONF={}", containers_conf().display());
    [
        "env",
        &conf,
        "podman",
        "--storage-driver",
        "vfs",
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

fn containers_conf() -> std::path::PathBuf {
    workspace_root().join("scripts/containers.conf")
}

/// `podman ARGS`, waited for.
pub fn podman(args: &[&str]) -> Output {
    let command = podman_command();
    std::process::Command::new(&command[0])
        .args(&command[1..])
        .args(args)
        .output()
        .expect("run podman")
}

/// Whether podman is installed and the image is in its storage; says why not (a failure under
/// CI) when it is not.
pub fn image_available() -> bool {
    let image = image();
    let reason = match std::process::Command::new("podman")
        .arg("--version")
        .output()
    {
        Err(_) => Some("podman is not installed".to_owned()),
        Ok(_) if !podman(&["image", "exists", &image]).status.success() => Some(format!(
            "no image {image}: build it with `scripts/image target/debug` (scripts/test does)"
        )),
        Ok(_) => None,
    };
    match reason {
        Some(reason) => {
            crate::missing_dependency(&reason);
            false
        }
        None => true,
    }
}

/// One container of the image, by name; removed (killed if running) on drop.
pub struct Container {
    pub name: String,
}

impl Container {
    /// A container name for this test, and its `podman run` command line up to the image
    /// (included): the chart's security settings, host network, `env` and read-only `mounts`
    /// (host path = container path), the binary `entrypoint` (the image's, the gateway, when
    /// `None`). The arguments of the binary follow.
    pub fn run_command(
        env: &[(&str, &str)],
        mounts: &[&Path],
        entrypoint: Option<&str>,
    ) -> (Container, Vec<OsString>) {
        let name = unique_name("e2e-image");
        let mut command = podman_command();
        let mut push = |arg: &str| command.push(OsString::from(arg));
        for arg in [
            "run",
            "--name",
            &name,
            "--read-only",
            "--user",
            "65532:65532",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--network",
            "host",
            "--pull",
            "never",
        ] {
            push(arg);
        }
        for (key, value) in env {
            push("--env");
            push(&format!("{key}={value}"));
        }
        for path in mounts {
            let path = path.to_str().expect("a UTF-8 path");
            push("--volume");
            push(&format!("{path}:{path}:ro"));
        }
        if let Some(entrypoint) = entrypoint {
            push("--entrypoint");
            push(entrypoint);
        }
        push(&image());
        (Container { name }, command)
    }

    /// `podman stop -t GRACE`: SIGTERM, then SIGKILL after the grace.
    pub fn stop(&self, grace_secs: u32) -> Output {
        podman(&["stop", "-t", &grace_secs.to_string(), &self.name])
    }

    /// The exit code podman recorded.
    pub fn exit_code(&self) -> String {
        let out = podman(&["inspect", "--format", "{{.State.ExitCode}}", &self.name]);
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.name]);
    }
}
