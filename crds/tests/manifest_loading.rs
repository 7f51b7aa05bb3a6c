mod common;

use std::fs;

use crds::manifests::{load_dir, read_dir, DocumentError, ManifestError};

use common::{repo_path, scratch_dir};

/// A folder holding the standalone manifests plus `extra` as `zz-extra.yaml`.
fn standalone_plus(test: &str, extra: &str) -> std::path::PathBuf {
    let dir = scratch_dir(test);
    for file in ["tiers.yaml", "models.yaml", "apikeys.yaml"] {
        fs::copy(repo_path("deploy/standalone").join(file), dir.join(file)).unwrap();
    }
    fs::write(dir.join("zz-extra.yaml"), extra).unwrap();
    dir
}

fn load_error(test: &str, extra: &str) -> ManifestError {
    match load_dir(&standalone_plus(test, extra)) {
        Ok(_) => panic!("expected the folder to be rejected"),
        Err(e) => e,
    }
}

const ROUTE_HEAD: &str = "
apiVersion: gateway.svc.dev/v1alpha1
kind: ModelRoute
metadata:
  name: svc-extra
spec:
  model: svc/extra
  displayName: Extra
  contextWindow: 1000
  maxOutputTokens: 100
  upstreams: [{name: sim, provider: simulated, model: sim}]
";

#[test]
fn unknown_spec_field_is_rejected_naming_file_document_and_field() {
    let extra = format!(
        "---\n{ROUTE_HEAD}  pricing: {{inputUsdPerMTok: '1', outputUsdPerMTok: '1', \
         cacheWriteUsdPerMTok: '1', cacheReadUsdPerMTok: '1', outputUsdPerMtok: '2'}}\n"
    );
    let error = load_error("unknown_spec_field", &extra);
    let message = error.to_string();
    assert!(
        matches!(&error, ManifestError::Document { origin, problem }
            if matches!(**problem, DocumentError::Malformed { .. })
                && origin.file.ends_with("zz-extra.yaml")
                && origin.document == 1),
        "{message}"
    );
    assert!(
        message.contains("ModelRoute svc-extra: spec.pricing"),
        "{message}"
    );
    assert!(
        message.contains("unknown field `outputUsdPerMtok`"),
        "{message}"
    );
}

#[test]
fn unknown_top_level_field_is_rejected() {
    let extra = format!("{ROUTE_HEAD}specs: {{}}\n");
    let message = load_error("unknown_top_level_field", &extra).to_string();
    assert!(message.contains("unknown field `specs`"), "{message}");
}

#[test]
fn price_written_as_a_number_is_rejected_naming_the_field() {
    let extra = format!(
        "{ROUTE_HEAD}  pricing: {{inputUsdPerMTok: 1.5, outputUsdPerMTok: '1', \
         cacheWriteUsdPerMTok: '1', cacheReadUsdPerMTok: '1'}}\n"
    );
    let message = load_error("price_as_number", &extra).to_string();
    assert!(
        message.contains("spec.pricing.inputUsdPerMTok: invalid type"),
        "{message}"
    );
}

#[test]
fn unknown_kind_of_our_group_is_rejected() {
    let extra = "apiVersion: gateway.svc.dev/v1alpha1\nkind: Model\nmetadata: {name: x}\n";
    let message = load_error("unknown_kind", extra).to_string();
    assert!(
        message.contains("zz-extra.yaml (document 1): unknown kind Model"),
        "{message}"
    );
}

#[test]
fn other_version_of_our_group_is_rejected() {
    let extra = "apiVersion: gateway.svc.dev/v1\nkind: Tier\nmetadata: {name: x}\n";
    let message = load_error("other_version", extra).to_string();
    assert!(
        message.contains("unknown kind Tier in gateway.svc.dev/v1"),
        "{message}"
    );
}

#[test]
fn other_kinds_and_empty_documents_are_skipped() {
    let extra = "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: gateway}\n---\n\
                 apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: gateway}\nspec: {}\n---\n";
    let dir = standalone_plus("other_kinds", extra);
    let config = load_dir(&dir).unwrap();
    assert_eq!(config.models.len(), 6);
}

#[test]
fn only_yaml_files_directly_in_the_folder_are_read() {
    let dir = standalone_plus("only_yaml_files", "");
    let broken = "this is: [not valid";
    fs::write(dir.join("notes.txt"), broken).unwrap();
    fs::create_dir(dir.join("..data")).unwrap();
    fs::write(dir.join("..data").join("tiers.yaml"), broken).unwrap();
    fs::copy(dir.join("models.yaml"), dir.join("models.yml")).unwrap();
    fs::remove_file(dir.join("models.yaml")).unwrap();
    assert_eq!(load_dir(&dir).unwrap().models.len(), 6);
}

#[test]
fn invalid_yaml_is_rejected_naming_the_file() {
    let message = load_error("invalid_yaml", "kind: [unclosed\n").to_string();
    assert!(
        message.contains("zz-extra.yaml (document 1): invalid YAML"),
        "{message}"
    );
}

#[test]
fn document_without_kind_is_rejected() {
    let message = load_error("no_kind", "just: a map\n").to_string();
    assert!(message.contains("not a Kubernetes object"), "{message}");
}

#[test]
fn resource_without_name_is_rejected() {
    let extra = "apiVersion: v1\nkind: Secret\nmetadata: {}\nstringData: {a: b}\n";
    let message = load_error("unnamed", extra).to_string();
    assert!(
        message.contains("zz-extra.yaml (document 1): Secret has no metadata.name"),
        "{message}"
    );
}

#[test]
fn resource_defined_twice_is_rejected_naming_both_files() {
    let extra = fs::read_to_string(repo_path("deploy/standalone/tiers.yaml")).unwrap();
    let message = load_error("defined_twice", &extra).to_string();
    assert!(
        message.contains("zz-extra.yaml (document 1): Tier free is already defined in"),
        "{message}"
    );
    assert!(message.contains("tiers.yaml (document 1)"), "{message}");
}

#[test]
fn compile_errors_name_the_file_of_the_resource() {
    let extra = ROUTE_HEAD.replace("maxOutputTokens: 100", "maxOutputTokens: 100000");
    let error = load_error("compile_error_file", &format!("{extra}  pricing: {{inputUsdPerMTok: '1', outputUsdPerMTok: '1', cacheWriteUsdPerMTok: '1', cacheReadUsdPerMTok: '1'}}\n"));
    let message = error.to_string();
    assert!(matches!(error, ManifestError::Invalid { .. }), "{message}");
    assert!(
        message.contains(
            "zz-extra.yaml (document 1): ModelRoute svc-extra: contextWindow (1000) must be at \
             least maxOutputTokens (100000)"
        ),
        "{message}"
    );
}

#[test]
fn missing_folder_is_an_error_naming_it() {
    let message = read_dir(&repo_path("deploy/no-such-folder"))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(message.contains("no-such-folder"), "{message}");
}
