mod common;

#[test]
fn committed_crds_match_the_types() {
    let path = common::repo_path("charts/gateway/files/crds.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = crds::resources::crd_yaml().unwrap();
    assert!(
        committed == generated,
        "{} is out of date with crds/src/resources.rs; regenerate it with\n\n    \
         cargo run -p crds --bin crdgen > charts/gateway/files/crds.yaml\n",
        path.display()
    );
}
