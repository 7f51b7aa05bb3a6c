//! Conversation affinity (issue 20): the turns of one conversation reach one upstream of a
//! weighted route, on any pod, however the conversation is recognised (Claude Code's session
//! header, `prompt_cache_key`, `metadata.user_id`, the prompt's stable prefix); across many
//! conversations the weights hold; a conversation whose upstream fails moves to its fallback
//! and stays there until the upstream is healthy again; `affinity: none` draws every turn.

use std::time::Duration;

use e2e::*;
use futures::future::join_all;
use reqwest::Method;
use serde_json::{json, Value};

/// Two mocks on one route, weighted `heavy`:`light`, behind `pods` standalone gateways that
/// share nothing but the manifests, the dev key allowed more than a test sends.
struct Rig {
    pods: Vec<Gateway>,
    heavy: MockUpstream,
    light: MockUpstream,
    _manifests: RoutedManifests,
}

async fn rig(heavy: u32, light: u32, pods: usize, affinity: Option<&str>, flags: &[&str]) -> Rig {
    let (heavy_mock, light_mock) = (answering("heavy").await, answering("light").await);
    let manifests = RoutedManifests::new(&[
        UpstreamDef::anthropic(&heavy_mock)
            .named("heavy")
            .weight(heavy),
        UpstreamDef::anthropic(&light_mock)
            .named("light")
            .weight(light),
    ]);
    if let Some(affinity) = affinity {
        manifests.affinity(affinity);
    }
    let grant = "apiVersion: gateway.svc.dev/v1alpha1
kind: ApiKey
metadata:
  name: dev-unlimited
spec:
  keyId: key_dev
  tier: enterprise
  limits:
    requestsPerMinute: 100000
    inputTokensPerMinute: 100000000
    concurrentStreams: 100
";
    std::fs::write(manifests.path.join("dev-grant.yaml"), grant).expect("write the grant");
    let mut started = Vec::new();
    for _ in 0..pods {
        let mut builder = Gateway::builder().manifests(&manifests.path);
        for flag in flags {
            builder = builder.arg(flag);
        }
        started.push(builder.start().await);
    }
    Rig {
        pods: started,
        heavy: heavy_mock,
        light: light_mock,
        _manifests: manifests,
    }
}

/// A mock that answers every unscripted request with its own name.
async fn answering(name: &str) -> MockUpstream {
    let reply = Reply::text(&format!("served by {name}"));
    MockUpstream::serve("127.0.0.1:0", Unscripted::Always(reply), true).await
}

impl Rig {
    fn counts(&self) -> (usize, usize) {
        (self.heavy.request_count(), self.light.request_count())
    }

    /// Sends one turn to `pod` and answers which upstream served it.
    async fn turn(
        &self,
        pod: usize,
        path: &str,
        body: &Value,
        header: Option<&str>,
    ) -> &'static str {
        let gw = &self.pods[pod];
        let mut request = gw.request(Method::POST, path, Some(&gw.key)).json(body);
        if let Some(session) = header {
            request = request.header("x-claude-code-session-id", session);
        }
        let answer = gw.send(request).await.expect_ok().to_string();
        match (
            answer.contains("served by heavy"),
            answer.contains("served by light"),
        ) {
            (true, false) => "heavy",
            (false, true) => "light",
            _ => panic!("no single upstream served the turn: {answer}"),
        }
    }
}

/// Turn `n` of a conversation whose first user message is `opening`: the whole history so
/// far, growing as an agent's does.
fn history(opening: &str, n: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": opening})];
    for i in 1..n {
        messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
        messages.push(json!({"role": "user", "content": format!("follow-up {i}")}));
    }
    json!({
        "model": "svc/haiku", "max_tokens": 20, "system": "You are a coding agent.",
        "messages": messages,
    })
}

#[tokio::test]
async fn every_turn_of_a_conversation_reaches_one_upstream_on_either_pod_however_it_is_keyed() {
    let rig = rig(3, 1, 2, None, &[]).await;
    for conversation in 0..4 {
        let mut reached = Vec::new();
        for turn in 0..20 {
            let pod = turn % 2;
            // Each way keys the conversation while the rest of the prompt changes every turn,
            // so only the key can hold it together (the prefix way keeps its opening).
            let upstream = match conversation {
                0 => {
                    let body = message("svc/haiku", &format!("turn {turn}"), 20);
                    rig.turn(pod, "/v1/messages", &body, Some("session-claude-code-1"))
                        .await
                }
                1 => {
                    let body = json!({"model": "svc/haiku", "max_output_tokens": 20,
                        "input": format!("turn {turn}"), "prompt_cache_key": "codex-thread-7",
                        "store": false});
                    rig.turn(pod, "/v1/responses", &body, None).await
                }
                2 => {
                    let mut body = message("svc/haiku", &format!("turn {turn}"), 20);
                    body["metadata"] = json!({"user_id": "user_42_session_9"});
                    rig.turn(pod, "/v1/messages", &body, None).await
                }
                _ => {
                    let body = history("Refactor the parser module.", turn + 1);
                    rig.turn(pod, "/v1/messages", &body, None).await
                }
            };
            reached.push(upstream);
        }
        assert!(
            reached.iter().all(|u| *u == reached[0]),
            "conversation {conversation} moved between upstreams: {reached:?}"
        );
    }
}

#[tokio::test]
async fn a_thousand_conversations_split_by_the_route_weights() {
    let rig = rig(3, 1, 1, None, &[]).await;
    let gw = &rig.pods[0];
    for chunk in (0..1_000).collect::<Vec<_>>().chunks(25) {
        join_all(chunk.iter().map(|i| async move {
            let body = message("svc/haiku", &format!("conversation {i} opens"), 10);
            gw.post_messages(&gw.key, &body).await.expect_ok();
        }))
        .await;
    }
    let (heavy, light) = rig.counts();
    assert_eq!(heavy + light, 1_000);
    let share = heavy as f64 / 1_000.0;
    assert!(
        (0.70..=0.80).contains(&share),
        "the 3:1 route sent {heavy} of 1,000 conversations to its heavy upstream"
    );
}

#[tokio::test]
async fn a_conversation_whose_upstream_fails_moves_once_and_stays_on_its_fallback() {
    // A long cooldown: once out, the failed upstream is not probed during the test.
    let rig = rig(
        1,
        1,
        1,
        None,
        &["--breaker-failures", "1", "--breaker-cooldown-ms", "600000"],
    )
    .await;
    let body = |turn: usize| history("Write the release notes.", turn + 1);
    let home = rig.turn(0, "/v1/messages", &body(0), None).await;
    let (home_mock, fallback) = match home {
        "heavy" => (&rig.heavy, "light"),
        _ => (&rig.light, "heavy"),
    };
    home_mock.push(std::iter::repeat_n(Reply::status(500), 50));
    let before = home_mock.request_count();
    for turn in 1..10 {
        assert_eq!(
            rig.turn(0, "/v1/messages", &body(turn), None).await,
            fallback,
            "turn {turn}"
        );
    }
    assert_eq!(
        home_mock.request_count() - before,
        1,
        "the failing upstream was tried once, then left out"
    );
    assert_eq!(
        rig.pods[0].metrics().await.get(
            "gateway_affinity_moves_total",
            &[("model", "svc/haiku"), ("from", home), ("to", fallback)]
        ),
        Some(9.0)
    );
}

#[tokio::test]
async fn a_moved_conversation_goes_back_to_its_upstream_once_it_is_healthy() {
    let rig = rig(
        1,
        1,
        1,
        None,
        &["--breaker-failures", "1", "--breaker-cooldown-ms", "300"],
    )
    .await;
    let body = |turn: usize| history("Plan the migration.", turn + 1);
    let home = rig.turn(0, "/v1/messages", &body(0), None).await;
    let home_mock = if home == "heavy" {
        &rig.heavy
    } else {
        &rig.light
    };
    home_mock.push([Reply::status(500)]);
    assert_ne!(rig.turn(0, "/v1/messages", &body(1), None).await, home);
    // Once the breaker lets a probe through, the healthy upstream takes the conversation back.
    let mut turn = 2;
    while rig.turn(0, "/v1/messages", &body(turn), None).await != home {
        turn += 1;
        assert!(
            turn < 200,
            "the conversation never went back to its upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for later in turn + 1..turn + 6 {
        assert_eq!(rig.turn(0, "/v1/messages", &body(later), None).await, home);
    }
}

#[tokio::test]
async fn without_affinity_every_turn_is_drawn_by_weight() {
    let rig = rig(1, 1, 1, Some("none"), &[]).await;
    let mut reached = Vec::new();
    for turn in 0..40 {
        let body = history("The same conversation throughout.", turn + 1);
        reached.push(rig.turn(0, "/v1/messages", &body, None).await);
    }
    // All 40 on one side of a 1:1 draw would happen once in 2^39 runs.
    assert!(
        reached.contains(&"heavy") && reached.contains(&"light"),
        "{reached:?}"
    );
}
