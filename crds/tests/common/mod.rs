//! Tests start from the shipped standalone folder, which must compile, and break one thing at
//! a time, so each test shows only the rule it is about.
#![allow(
    dead_code,
    reason = "each test binary uses a different subset of these helpers"
)]

use std::path::{Path, PathBuf};

use crds::compile::compile;
use crds::config::GatewayConfig;
use crds::manifests::{read_dir, Manifests};
use crds::resources::{ApiKey, ModelRoute, Tier, TierId};

/// A folder of the repository, whatever directory the test runs in.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

/// The resources of `deploy/standalone`.
pub fn standalone() -> Manifests {
    match read_dir(&repo_path("deploy/standalone")) {
        Ok(manifests) => manifests,
        Err(e) => panic!("deploy/standalone does not load: {e}"),
    }
}

pub fn compiles(m: &Manifests) -> GatewayConfig {
    match compile(&m.tiers, &m.routes, &m.keys, &m.secrets) {
        Ok(config) => config,
        Err(e) => panic!("expected the resources to compile, got {e}"),
    }
}

/// The messages of a compilation that must fail.
pub fn rejections(m: &Manifests) -> Vec<String> {
    match compile(&m.tiers, &m.routes, &m.keys, &m.secrets) {
        Ok(_) => panic!("expected the resources to be rejected, but they compiled"),
        Err(e) => e.errors.iter().map(ToString::to_string).collect(),
    }
}

/// Fails unless one message starts with `prefix` (the resource) and contains `needle`.
pub fn assert_rejected(m: &Manifests, prefix: &str, needle: &str) {
    let messages = rejections(m);
    assert!(
        messages
            .iter()
            .any(|msg| msg.starts_with(prefix) && msg.contains(needle)),
        "no error starting with {prefix:?} and containing {needle:?} in {messages:#?}"
    );
}

pub fn route<'a>(m: &'a mut Manifests, model: &str) -> &'a mut ModelRoute {
    match m.routes.iter_mut().find(|r| r.spec.model == model) {
        Some(route) => route,
        None => panic!("no route for {model}"),
    }
}

pub fn tier(m: &mut Manifests, id: TierId) -> &mut Tier {
    match m.tiers.iter_mut().find(|t| t.spec.tier == id) {
        Some(tier) => tier,
        None => panic!("no tier {id}"),
    }
}

pub fn key<'a>(m: &'a mut Manifests, name: &str) -> &'a mut ApiKey {
    match m
        .keys
        .iter_mut()
        .find(|k| k.metadata.name.as_deref() == Some(name))
    {
        Some(key) => key,
        None => panic!("no ApiKey {name}"),
    }
}

/// An empty folder of its own for a test that writes manifest files.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
