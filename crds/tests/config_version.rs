mod common;

use crds::resources::TierId;

use common::{compiles, standalone, tier};

#[test]
fn version_is_sixteen_hex_digits() {
    let version = compiles(&standalone()).version;
    assert_eq!(version.len(), 16);
    assert!(version
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
}

#[test]
fn version_is_stable_across_runs_and_resource_order() {
    let first = compiles(&standalone());
    assert_eq!(first, compiles(&standalone()));

    let mut reordered = standalone();
    reordered.tiers.reverse();
    reordered.routes.reverse();
    reordered.keys.reverse();
    assert_eq!(first.version, compiles(&reordered).version);
}

#[test]
fn version_changes_when_a_limit_changes() {
    let before = compiles(&standalone()).version;
    let mut m = standalone();
    tier(&mut m, TierId::Free).spec.requests_per_minute += 1;
    assert_ne!(before, compiles(&m).version);
}

#[test]
fn version_changes_when_a_secret_rotates() {
    let before = compiles(&standalone()).version;
    let mut m = standalone();
    m.secrets[0]
        .string_data
        .as_mut()
        .unwrap()
        .insert("apiKey".into(), "sk-svc-rotated".into());
    assert_ne!(
        before,
        compiles(&m).version,
        "pods must pick up a rotated key"
    );
}
