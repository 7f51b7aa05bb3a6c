//! Tiers that only top-ups move (the spec: "Tiers derive from confirmed lifetime top-up ...
//! there is no manual promotion"): no path sets a key's tier to free, pay_as_you_go or
//! high_volume by hand, only enterprise is granted; a new key starts at the tier its account's
//! confirmed lifetime top-up gives; the promotion sweep moves it, and its answers then say so
//! in X-RateLimit-Tier.

use std::time::Duration;

use e2e::gateway::{gateway_bin, unique_name};
use e2e::visitor::{new_email, Visitor};
use e2e::{message, poll_until, Gateway, KeySpec, DEV_KEY};
use serde_json::json;

#[tokio::test]
async fn no_path_sets_a_keys_tier_to_free_pay_as_you_go_or_high_volume_by_hand() {
    let gw = Gateway::start().await;
    let account = gw.create_account(1_000_000).await;
    let id = account["id"].as_str().expect("account id");
    for tier in ["free", "pay_as_you_go", "high_volume", "gold"] {
        let body = json!({ "account_id": id, "tier": tier });
        let text = gw
            .admin_post("/admin/keys", &body)
            .await
            .expect_error(400, "invalid_request_error");
        assert!(text.contains("tier"), "{text}");
    }
    let granted = gw
        .admin_post(
            "/admin/keys",
            &json!({ "account_id": id, "tier": "enterprise" }),
        )
        .await;
    granted.expect_status(201);
    assert_eq!(granted.json()["tier"], "enterprise");
    let plain = gw
        .admin_post("/admin/keys", &json!({ "account_id": id }))
        .await;
    plain.expect_status(201);
    assert_eq!(plain.json()["tier"], "free", "no top-up yet");

    // The gateway's own flags: the dev key's tier is no longer set by hand either.
    let out = tokio::process::Command::new(gateway_bin())
        .args(["standalone", "--dev-tier", "high_volume"])
        .output()
        .await
        .expect("run the gateway binary");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--dev-tier"), "{stderr}");
}

#[tokio::test]
async fn a_new_key_starts_at_the_tier_its_accounts_confirmed_top_up_gives() {
    let gw = Gateway::start().await;
    let account = gw.create_account(0).await;
    let id = account["id"].as_str().expect("account id");
    gw.top_up(id, 50_000, &unique_name("tiers-top-up"))
        .await
        .expect_ok();
    let key = gw.mint_key(id, &KeySpec::tier("free")).await;
    let resp = gw
        .post_messages(&key.secret, &message("svc/haiku", "hi", 16))
        .await;
    resp.expect_ok();
    assert_eq!(resp.rate_limit().tier, "high_volume");

    // The dev account is created with a confirmed top-up ($10 by default): pay_as_you_go.
    let dev = Gateway::start().await;
    let account = dev.get("/v1/account", DEV_KEY).await.expect_ok();
    assert_eq!(account["tier"], "pay_as_you_go", "{account}");
    let free = Gateway::builder().dev_top_up_usd("0").start().await;
    let account = free.get("/v1/account", DEV_KEY).await.expect_ok();
    assert_eq!(account["tier"], "free", "{account}");
}

#[tokio::test]
async fn a_key_promoted_only_by_confirmed_top_ups_through_the_sweep_shows_its_new_tier() {
    let gw = Gateway::builder()
        .arg("--promotion-interval-secs")
        .arg("1")
        .start()
        .await;
    let key = gw.new_key(5_000_000, &KeySpec::tier("free")).await;
    let hi = message("svc/haiku", "hi", 16);
    let first = gw.post_messages(&key.secret, &hi).await;
    first.expect_ok();
    assert_eq!(first.rate_limit().tier, "free");

    for (usd_cents, tier) in [(1_000, "pay_as_you_go"), (49_000, "high_volume")] {
        gw.top_up(&key.account_id, usd_cents, &unique_name("sweep-top-up"))
            .await
            .expect_ok();
        poll_until(
            &format!("the sweep to move the key to {tier}"),
            Duration::from_secs(20),
            Duration::from_millis(250),
            || async {
                let resp = gw
                    .count_tokens(&key.secret, &e2e::count_body("svc/haiku", "hi"))
                    .await;
                (resp.status == 200 && resp.rate_limit().tier == tier).then_some(())
            },
        )
        .await;
    }
    let account = gw.get("/v1/account", &key.secret).await.expect_ok();
    assert_eq!(account["tier"], "high_volume", "{account}");
}

/// The overview's tier after a top-up, with the keys still in the tier before it: the spec
/// moves them at the promotion sweep (up to 5 minutes later), so the page says so; once the
/// sweep has moved them, it no longer does.
async fn overview_after_a_top_up(gw: &Gateway) -> Visitor<'_> {
    let mut visitor = Visitor::new(gw);
    visitor.sign_up(&new_email(), &[]).await;
    let (status, page) = visitor.create_key("first").await;
    assert_eq!(status, 200, "{page}");
    let (_, overview) = visitor.get("/developers").await;
    let account_id = overview
        .split("id=\"account-id\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("the overview shows the account id")
        .to_owned();
    assert!(overview.contains("id=\"tier\">free<"), "{overview}");
    assert!(
        !overview.contains("tier-pending"),
        "no top-up yet: {overview}"
    );
    gw.top_up(&account_id, 1_000, &unique_name("tiers-pending"))
        .await
        .expect_ok();
    visitor
}

/// The tier column of the account's only key on the keys page.
async fn key_tier(visitor: &mut Visitor<'_>) -> String {
    let (_, keys) = visitor.get("/developers/keys").await;
    ["free", "pay_as_you_go", "high_volume"]
        .into_iter()
        .find(|tier| keys.contains(&format!("<td>{tier}</td>")))
        .unwrap_or_else(|| panic!("no tier on the keys page: {keys}"))
        .to_owned()
}

#[tokio::test]
async fn the_overview_says_the_keys_take_a_top_ups_tier_at_the_next_sweep_until_it_has_moved_them()
{
    // No sweep during the test: the keys stay where they were.
    let slow = Gateway::builder()
        .arg("--promotion-interval-secs")
        .arg("3600")
        .start()
        .await;
    let mut visitor = overview_after_a_top_up(&slow).await;
    let (_, overview) = visitor.get("/developers").await;
    assert!(
        overview.contains("id=\"tier\">pay_as_you_go<"),
        "{overview}"
    );
    assert!(
        overview.contains("id=\"tier-pending\"") && overview.contains("next promotion sweep"),
        "the page says when the keys move: {overview}"
    );
    assert_eq!(key_tier(&mut visitor).await, "free");

    // A sweep every second: once it has moved the key, the page no longer says it will.
    let swept = Gateway::builder()
        .arg("--promotion-interval-secs")
        .arg("1")
        .start()
        .await;
    let mut visitor = overview_after_a_top_up(&swept).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while key_tier(&mut visitor).await != "pay_as_you_go" {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweep did not move the key"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, overview) = visitor.get("/developers").await;
    assert!(!overview.contains("tier-pending"), "{overview}");
}
