//! The README's first command from anywhere (issue 59): `gateway standalone` needs no folder of
//! its own, neither the checkout's `deploy/standalone` nor a mount in the image; the set it
//! carries can be written out to start from, and `serve` never falls back to it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use e2e::gateway::{gateway_bin, unique_name, workspace_root};
use e2e::podman::{self, Container};
use e2e::{message, Gateway, GatewayBuilder, ENTERPRISE_KEY};
use tokio::process::Command;

/// An empty folder of its own, removed on drop.
struct EmptyDir(PathBuf);

impl EmptyDir {
    fn new() -> EmptyDir {
        let dir = std::env::temp_dir().join(unique_name("e2e-first-run"));
        std::fs::create_dir_all(&dir).expect("create a temporary folder");
        EmptyDir(dir)
    }
}

impl Drop for EmptyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `gateway standalone` as a first-time user runs it: no flag but its ports.
fn first_run() -> GatewayBuilder {
    Gateway::builder()
        .built_in_manifests()
        .without_admin_token()
        .without_dev_key()
}

/// Runs the gateway binary in `dir` with `args` to its exit: code, stdout, stderr.
async fn run_in(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(gateway_bin());
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("GATEWAY_") {
            cmd.env_remove(name);
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("gateway {args:?} did not exit"))
        .expect("run the gateway");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn standalone_run_from_an_empty_folder_with_no_flags_but_its_ports_serves_a_turn_on_the_built_in_manifests(
) {
    let dir = EmptyDir::new();
    let gw = first_run().working_dir(&dir.0).start().await;
    // The key generated on the ready line, with the dev account's credits.
    let reply = gw
        .post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    assert_eq!(reply["type"], "message", "{reply}");
    // The example key the built-in set seeds is known (its account has no credits yet).
    gw.post_messages(ENTERPRISE_KEY, &message("svc/haiku", "hi", 16))
        .await
        .expect_status(402);
    let stderr = gw.stderr();
    assert!(
        stderr.contains("manifests: loaded the built-in standalone example set"),
        "a log line says which set was loaded:\n{stderr}"
    );
    assert!(
        stderr.contains("WARNING: seeding the public example key `key_example_enterprise`"),
        "the public example key is still warned about:\n{stderr}"
    );
}

#[tokio::test]
async fn print_manifests_writes_the_built_in_set_as_the_checkouts_files_and_never_overwrites_one() {
    let dir = EmptyDir::new();
    let out = dir.0.join("manifests");
    let out_arg = out.to_str().expect("a UTF-8 path");
    let (code, stdout, stderr) =
        run_in(&dir.0, &["standalone", "--print-manifests", out_arg]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let source = workspace_root().join("deploy").join("standalone");
    let mut names: Vec<String> = std::fs::read_dir(&source)
        .expect("deploy/standalone")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    for name in &names {
        let printed = std::fs::read_to_string(out.join(name))
            .unwrap_or_else(|e| panic!("{name} not written ({e}); printed:\n{stdout}"));
        let checked_in = std::fs::read_to_string(source.join(name)).expect("read the source");
        assert_eq!(
            printed, checked_in,
            "{name} differs from deploy/standalone's"
        );
        assert!(
            stdout.contains(name),
            "the files written are listed:\n{stdout}"
        );
    }
    // An edited file stays as the user left it.
    let edited = out.join("tiers.yaml");
    std::fs::write(&edited, "# mine\n").expect("edit");
    let (code, _, stderr) = run_in(&dir.0, &["standalone", "--print-manifests", out_arg]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--print-manifests"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&edited).expect("read"),
        "# mine\n",
        "the edited file was replaced"
    );
}

#[tokio::test]
async fn serve_with_neither_manifests_nor_the_operators_config_is_refused_naming_both() {
    let dir = EmptyDir::new();
    let (code, _, stderr) = run_in(
        &dir.0,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--admin-token",
            "e2e-admin-token-0123456789",
            "--redis-url",
            "redis://127.0.0.1:1",
        ],
    )
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--config-secret") && stderr.contains("--manifests"),
        "{stderr}"
    );
}

/// The README's trial in the image: no folder mounted, no flag but the listener.
#[tokio::test]
async fn the_image_runs_standalone_with_nothing_mounted_and_serves_a_turn() {
    if !podman::image_available() {
        return;
    }
    let (_container, launcher) = Container::run_command(&[], &[], None);
    let gw = first_run().launched_by(launcher).start().await;
    let reply = gw
        .post_messages(&gw.key, &message("svc/haiku", "hi", 16))
        .await
        .expect_ok();
    assert_eq!(reply["type"], "message", "{reply}");
    assert!(
        gw.stderr()
            .contains("manifests: loaded the built-in standalone example set"),
        "{}",
        gw.stderr()
    );
}
