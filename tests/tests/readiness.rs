//! Probes on the admin listener, for Kubernetes: `/livez` answers while the process runs;
//! `/readyz` is 200 only while the config is loaded and the shared stores answer, so a pod cut
//! off from Redis leaves the Service until Redis is back.

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
async fn a_serving_pod_is_not_ready_while_redis_is_unreachable_and_ready_again_after() {
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
    let down = gw.admin_unauthenticated("/readyz").await;
    down.expect_status(503);
    assert_eq!(down.json()["limits_store"], "unreachable", "{down}");
    gw.admin_unauthenticated("/livez").await.expect_status(200);

    redis.restart().await;
    poll_until(
        "readiness after Redis returned",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async { (gw.admin_unauthenticated("/readyz").await.status == 200).then_some(()) },
    )
    .await;
}
