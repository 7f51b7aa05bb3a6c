mod common;

use crds::resources::TierId;

use common::{assert_rejected, rejections, standalone, tier};

#[test]
fn missing_tier_is_rejected() {
    let mut m = standalone();
    m.tiers.retain(|t| t.spec.tier != TierId::HighVolume);
    assert!(rejections(&m)
        .iter()
        .any(|e| e.starts_with("no Tier declares tier high_volume")));
}

#[test]
fn tier_declared_twice_is_rejected_naming_the_second() {
    let mut m = standalone();
    let mut copy = tier(&mut m, TierId::Free).clone();
    copy.metadata.name = Some("free-again".into());
    m.tiers.push(copy);
    assert_rejected(
        &m,
        "Tier free-again:",
        "tier free is already declared by Tier free",
    );
}

#[test]
fn zero_limits_are_rejected() {
    let mut m = standalone();
    let t = tier(&mut m, TierId::PayAsYouGo);
    t.spec.requests_per_minute = 0;
    t.spec.input_tokens_per_minute = 0;
    t.spec.concurrent_streams = 0;
    for field in [
        "requestsPerMinute",
        "inputTokensPerMinute",
        "concurrentStreams",
    ] {
        assert_rejected(
            &m,
            "Tier pay-as-you-go:",
            &format!("{field} must be at least 1"),
        );
    }
}

#[test]
fn enterprise_with_promotion_threshold_is_rejected() {
    let mut m = standalone();
    tier(&mut m, TierId::Enterprise)
        .spec
        .promotion_at_lifetime_top_up_cents = Some(100_000);
    assert_rejected(&m, "Tier enterprise:", "only granted by hand");
}

#[test]
fn tier_other_than_enterprise_without_promotion_threshold_is_rejected() {
    let mut m = standalone();
    tier(&mut m, TierId::HighVolume)
        .spec
        .promotion_at_lifetime_top_up_cents = None;
    assert_rejected(
        &m,
        "Tier high-volume:",
        "promotionAtLifetimeTopUpCents is required on the high_volume tier",
    );
}

#[test]
fn free_tier_with_nonzero_promotion_threshold_is_rejected() {
    let mut m = standalone();
    tier(&mut m, TierId::Free)
        .spec
        .promotion_at_lifetime_top_up_cents = Some(5);
    assert_rejected(&m, "Tier free:", "must be 0 on the free tier");
}

#[test]
fn promotion_thresholds_that_do_not_rise_are_rejected() {
    let mut m = standalone();
    tier(&mut m, TierId::HighVolume)
        .spec
        .promotion_at_lifetime_top_up_cents = Some(1);
    assert_rejected(
        &m,
        "Tier high-volume:",
        "must be above the pay_as_you_go tier's 1",
    );
}
