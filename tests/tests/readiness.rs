//! Probes on the admin listener, for Kubernetes: `/livez` answers while the process runs;
//! `/readyz` is 200 while the config is loaded and the process is not draining, whatever the
//! shared stores answer: failing closed a pod cut off from Redis answers turns with the
//! envelope's 503 and `Retry-After`, failing open it serves on its share of the limits.

use std::time::Duration;

use e2e::*;

#[tokio::test]
async fn a_standalone_gateway_is_live_and_ready_without_a_token() {
    let gw = Gateway::start().await;
    gw.admin_unauthenticated("/livez").await.expect_status(200);
    let ready = gw.admin_unauthenticated("/readyz").await;
    let body = ready.expect_ok();
    assert_eq!(body["status"], "ready", "{body}");
    assert!(
        body["config_version"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn failing_closed_a_pod_stays_ready_through_a_redis_outage_and_answers_it_with_503_and_retry_after(
) {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .serve(&redis.url())
        .redis_timeout_ms(200)
        .start()
        .await;
    assert_eq!(
        gw.admin_unauthenticated("/readyz").await.expect_ok()["limits_store"],
        "ok"
    );

    redis.stop().await;
    // Every pod shares the store: taking them all out of the Service would turn the
    // envelope below into a load balancer's bare 502 or 503.
    let during = gw.admin_unauthenticated("/readyz").await;
    let body = during.expect_ok();
    assert_eq!(body["status"], "ready", "{body}");
    assert_eq!(body["limits_store"], "unreachable", "{body}");
    assert_eq!(body["store_outage"], "fail-closed", "{body}");
    let refused = gw
        .post_messages(DEV_KEY, &message("svc/haiku", "hi", 16))
        .await;
    refused.expect_status(503);
    assert_eq!(refused.json()["type"], "error", "{refused}");
    assert!(refused.header("retry-after").is_some(), "{refused}");
    gw.admin_unauthenticated("/livez").await.expect_status(200);

    redis.restart().await;
    poll_until(
        "a turn served after Redis returned",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async {
            let served = gw
                .post_messages(DEV_KEY, &message("svc/haiku", "hi", 16))
                .await;
            (served.status == 200).then_some(())
        },
    )
    .await;
    assert_eq!(
        gw.admin_unauthenticated("/readyz").await.expect_ok()["limits_store"],
        "ok"
    );
}

#[tokio::test]
async fn failing_open_a_pod_stays_ready_and_serving_through_a_redis_outage() {
    let mut redis = RedisServer::start().await;
    let gw = Gateway::builder()
        .serve(&redis.url())
        .redis_timeout_ms(200)
        .redis_outage("fail-open")
        .start()
        .await;
    gw.admin_unauthenticated("/readyz").await.expect_ok();

    redis.stop().await;
    let during = gw.admin_unauthenticated("/readyz").await;
    let body = during.expect_ok();
    assert_eq!(body["status"], "ready", "{body}");
    assert_eq!(body["limits_store"], "unreachable", "{body}");
    assert_eq!(body["store_outage"], "fail-open", "{body}");
    gw.count_tokens(DEV_KEY, &count_body("svc/haiku", "hi"))
        .await
        .expect_ok();
    gw.admin_unauthenticated("/readyz").await.expect_ok();
}

#[tokio::test]
async fn the_metrics_listener_serves_the_scrape_and_the_probes_but_never_the_admin_api() {
    let metrics = format!("http://127.0.0.1:{}", server::free_port_for_later());
    let gw = Gateway::builder()
        .arg("--metrics-listen")
        .arg(metrics.trim_start_matches("http://"))
        .start()
        .await;
    let get = |path: &str| {
        gw.client()
            .get(format!("{metrics}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    for path in ["/metrics", "/livez", "/readyz"] {
        let resp = get(path).await.expect("the metrics listener answers");
        assert_eq!(resp.status(), 200, "{path}");
    }
    // An account the admin listener serves is unknown to the metrics listener, token or not.
    let account = gw.create_account(0).await;
    let id = account["id"].as_str().unwrap_or_default().to_owned();
    assert!(!id.is_empty(), "{account}");
    gw.admin_get(&format!("/admin/accounts/{id}"))
        .await
        .expect_ok();
    let admin = get(&format!("/admin/accounts/{id}"))
        .await
        .expect("answers");
    assert_eq!(admin.status(), 404, "the admin API is on the metrics port");
}
