mod common;

use crds::resources::{Scope, TierId};

use common::{assert_rejected, compiles, key, standalone};

#[test]
fn custom_limits_without_enterprise_tier_are_rejected() {
    for tier in [None, Some(TierId::HighVolume)] {
        let mut m = standalone();
        key(&mut m, "example-enterprise").spec.tier = tier;
        assert_rejected(
            &m,
            "ApiKey example-enterprise:",
            "limits are only allowed with tier: enterprise",
        );
    }
}

#[test]
fn no_apikey_pins_a_tier_that_top_ups_give() {
    for tier in [TierId::Free, TierId::PayAsYouGo, TierId::HighVolume] {
        let mut m = standalone();
        let spec = &mut key(&mut m, "example-enterprise").spec;
        spec.tier = Some(tier);
        spec.limits = None;
        assert_rejected(
            &m,
            "ApiKey example-enterprise:",
            "tier: only enterprise is granted by hand",
        );
    }
}

#[test]
fn a_monthly_spend_cap_is_compiled_into_the_grant() {
    let mut m = standalone();
    key(&mut m, "example-enterprise")
        .spec
        .monthly_spend_cap_credits = Some(5_000);
    assert_eq!(
        compiles(&m).keys["key_example_enterprise"].spend_cap,
        Some(5_000)
    );
}

#[test]
fn zero_custom_limits_are_rejected() {
    let mut m = standalone();
    key(&mut m, "example-enterprise")
        .spec
        .limits
        .as_mut()
        .unwrap()
        .concurrent_streams = 0;
    assert_rejected(
        &m,
        "ApiKey example-enterprise:",
        "limits.concurrentStreams must be at least 1",
    );
}

#[test]
fn enterprise_without_custom_limits_keeps_the_enterprise_tier_limits() {
    let mut m = standalone();
    key(&mut m, "example-enterprise").spec.limits = None;
    let grant = &compiles(&m).keys["key_example_enterprise"];
    assert_eq!(grant.tier.as_deref(), Some("enterprise"));
    assert_eq!(grant.limits, None);
}

#[test]
fn key_id_granted_twice_is_rejected() {
    let mut m = standalone();
    let mut copy = key(&mut m, "example-enterprise").clone();
    copy.metadata.name = Some("example-enterprise-2".into());
    m.keys.push(copy);
    assert_rejected(
        &m,
        "ApiKey example-enterprise-2:",
        "keyId key_example_enterprise is already granted by ApiKey example-enterprise",
    );
}

#[test]
fn empty_key_id_is_rejected() {
    let mut m = standalone();
    key(&mut m, "example-enterprise").spec.key_id = String::new();
    assert_rejected(&m, "ApiKey example-enterprise:", "keyId must not be empty");
}

#[test]
fn empty_scope_list_is_rejected() {
    let mut m = standalone();
    key(&mut m, "example-enterprise").spec.scopes = Some(vec![]);
    assert_rejected(
        &m,
        "ApiKey example-enterprise:",
        "use suspended: true to block a key",
    );
}

#[test]
fn scopes_are_compiled_without_duplicates_in_a_stable_order() {
    let mut m = standalone();
    key(&mut m, "example-enterprise").spec.scopes =
        Some(vec![Scope::Models, Scope::Messages, Scope::Models]);
    let grant = &compiles(&m).keys["key_example_enterprise"];
    assert_eq!(
        grant.scopes.as_deref(),
        Some(&["messages".to_owned(), "models".to_owned()][..])
    );
}

#[test]
fn suspension_is_compiled_into_the_grant() {
    let mut m = standalone();
    key(&mut m, "example-enterprise").spec.suspended = true;
    assert!(compiles(&m).keys["key_example_enterprise"].suspended);
}

#[test]
fn seed_without_account_is_rejected() {
    let mut m = standalone();
    key(&mut m, "example-enterprise")
        .spec
        .seed
        .as_mut()
        .unwrap()
        .account = " ".into();
    assert_rejected(
        &m,
        "ApiKey example-enterprise:",
        "seed.account must not be empty",
    );
}
