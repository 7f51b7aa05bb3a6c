//! A mocked Kubernetes API server for the unit tests (kube's tower-test pair) that expects
//! exactly the given requests in order, and the fixtures the reconcile tests share.

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};
use tower_test::mock::Handle;

pub const NS: &str = "gw";
pub const CRDS: &str = "/apis/gateway.svc.dev/v1alpha1/namespaces/gw";

fn tier(name: &str, id: &str, promotion: Option<u64>, published: bool) -> Value {
    let mut tier = json!({
        "apiVersion": "gateway.svc.dev/v1alpha1",
        "kind": "Tier",
        "metadata": {"name": name, "namespace": NS, "generation": 1},
        "spec": {
            "tier": id,
            "requestsPerMinute": 10,
            "inputTokensPerMinute": 1000,
            "concurrentStreams": 2,
        },
    });
    if let Some(cents) = promotion {
        tier["spec"]["promotionAtLifetimeTopUpCents"] = json!(cents);
    }
    if published {
        tier["status"] = json!({
            "observedGeneration": 1,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "Published",
                "message": "part of the gateway configuration in Secret gateway-config",
                "observedGeneration": 1,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }],
        });
    }
    tier
}

pub fn tiers(published: bool) -> Vec<Value> {
    vec![
        tier("free", "free", Some(0), published),
        tier("pay-as-you-go", "pay_as_you_go", Some(1), published),
        tier("high-volume", "high_volume", Some(50_000), published),
        tier("enterprise", "enterprise", None, published),
    ]
}

pub fn route(upstream: Value) -> Value {
    json!({
        "apiVersion": "gateway.svc.dev/v1alpha1",
        "kind": "ModelRoute",
        "metadata": {"name": "svc-fast", "namespace": NS, "generation": 2},
        "spec": {
            "model": "svc/fast",
            "displayName": "Fast",
            "contextWindow": 1000,
            "maxOutputTokens": 100,
            "pricing": {
                "inputUsdPerMTok": "1",
                "outputUsdPerMTok": "2",
                "cacheWriteUsdPerMTok": "1.25",
                "cacheReadUsdPerMTok": "0.1",
            },
            "upstreams": [upstream],
        },
    })
}

pub fn simulated() -> Value {
    json!({"name": "sim", "provider": "simulated", "model": "sim-1"})
}

/// An anthropic upstream whose API key Secret (`missing`) does not exist.
pub fn missing_key_upstream() -> Value {
    json!({
        "name": "anthropic",
        "provider": "anthropic",
        "model": "claude",
        "baseUrl": "https://api.anthropic.com",
        "apiKeySecretRef": {"name": "missing", "key": "apiKey"},
    })
}

pub fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items})
}

/// One request the reconcile must make, in order, and the API server's answer.
pub struct Expect {
    method: Method,
    path: String,
    status: StatusCode,
    answer: Value,
    check: fn(&Value),
}

pub fn expect(method: Method, path: &str, answer: Value, check: fn(&Value)) -> Expect {
    Expect {
        method,
        path: path.to_owned(),
        status: StatusCode::OK,
        answer,
        check,
    }
}

/// A request the API server refuses with `status` and a Kubernetes `Status` body.
pub fn fail(method: Method, path: &str, status: u16, reason: &str) -> Expect {
    Expect {
        method,
        path: path.to_owned(),
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        answer: json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                       "reason": reason, "code": status, "message": reason}),
        check: no_check,
    }
}

pub fn no_check(_: &Value) {}

/// The reconcile reads the config Secret (it never creates one): there.
pub fn finds_config() -> Expect {
    expect(
        Method::GET,
        "/api/v1/namespaces/gw/secrets/gateway-config",
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "gateway-config", "namespace": NS, "uid": "u1"}}),
        no_check,
    )
}

/// The reconcile writes the config Secret, `check`ed; the API server answers it as `u1`.
pub fn writes_config(check: fn(&Value)) -> Expect {
    expect(
        Method::PATCH,
        "/api/v1/namespaces/gw/secrets/gateway-config",
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "gateway-config", "namespace": NS, "uid": "u1"}}),
        check,
    )
}

/// The reconcile records an Event, `check`ed; the API server names it `name`.
pub fn records_event(name: &str, check: fn(&Value)) -> Expect {
    expect(
        Method::POST,
        "/apis/events.k8s.io/v1/namespaces/gw/events",
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
               "metadata": {"name": name, "namespace": NS}, "eventTime": null}),
        check,
    )
}

/// What a reconcile asks first (the tiers, the routes and the keys of the namespace: published
/// tiers, `routes`, no key; an operator pointed at no Secret reads none), then `then`.
pub fn reading(routes: Vec<Value>, then: Vec<Expect>) -> Vec<Expect> {
    let lists = [
        (format!("{CRDS}/tiers"), list(tiers(true))),
        (format!("{CRDS}/modelroutes"), list(routes)),
        (format!("{CRDS}/apikeys"), list(vec![])),
    ];
    lists
        .into_iter()
        .map(|(path, answer)| expect(Method::GET, &path, answer, no_check))
        .chain(then)
        .collect()
}

/// Serves `expected` in order, then asserts the reconcile made no further request.
pub async fn api_server(mut handle: Handle<Request<Body>, Response<Body>>, expected: Vec<Expect>) {
    for e in expected {
        let Some((request, send)) = handle.next_request().await else {
            panic!("no request; expected {} {}", e.method, e.path);
        };
        assert_eq!(
            (request.method(), request.uri().path()),
            (&e.method, e.path.as_str()),
            "unexpected request"
        );
        if e.method == Method::PATCH {
            let query = request.uri().query().unwrap_or_default();
            assert!(
                query.contains("fieldManager=gateway-operator"),
                "not a server-side apply of the operator: {query}"
            );
        }
        let bytes = request
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (e.check)(&body);
        let answer = serde_json::to_vec(&e.answer).unwrap_or_default();
        let mut response = Response::new(Body::from(answer));
        *response.status_mut() = e.status;
        send.send_response(response);
    }
    if let Some((request, _)) = handle.next_request().await {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
}
