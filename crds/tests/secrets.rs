mod common;

use std::collections::BTreeMap;

use crds::config::Route;
use crds::resources::{Provider, SecretKeyRef};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;

use common::{assert_rejected, compiles, route, standalone};

fn secret(name: &str) -> Secret {
    let mut secret = Secret::default();
    secret.metadata.name = Some(name.into());
    secret
}

/// svc/kimi served by an OpenAI-compatible upstream whose key is `key` of Secret `name`.
fn kimi_with_key_from(m: &mut crds::manifests::Manifests, name: &str, key: &str) {
    let upstream = &mut route(m, "svc/kimi").spec.upstreams[0];
    upstream.provider = Provider::Openai;
    upstream.base_url = Some("https://api.example.com/v1".into());
    upstream.api_key_secret_ref = Some(SecretKeyRef {
        name: name.into(),
        key: key.into(),
    });
}

fn kimi_api_key(m: &crds::manifests::Manifests) -> String {
    let config = compiles(m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not an upstream route");
    };
    upstreams[0].api_key.as_ref().unwrap().expose().to_owned()
}

#[test]
fn secret_resolves_from_string_data() {
    let mut m = standalone();
    let mut s = secret("moonshot");
    s.string_data = Some(BTreeMap::from([("token".into(), "sk-plain".into())]));
    m.secrets.push(s);
    kimi_with_key_from(&mut m, "moonshot", "token");
    assert_eq!(kimi_api_key(&m), "sk-plain");
}

#[test]
fn secret_resolves_from_data() {
    let mut m = standalone();
    let mut s = secret("moonshot");
    s.data = Some(BTreeMap::from([(
        "token".into(),
        ByteString(b"sk-decoded".to_vec()),
    )]));
    m.secrets.push(s);
    kimi_with_key_from(&mut m, "moonshot", "token");
    assert_eq!(kimi_api_key(&m), "sk-decoded");
}

#[test]
fn string_data_wins_over_data_as_on_the_api_server() {
    let mut m = standalone();
    let mut s = secret("moonshot");
    s.data = Some(BTreeMap::from([(
        "token".into(),
        ByteString(b"old".to_vec()),
    )]));
    s.string_data = Some(BTreeMap::from([("token".into(), "new".into())]));
    m.secrets.push(s);
    kimi_with_key_from(&mut m, "moonshot", "token");
    assert_eq!(kimi_api_key(&m), "new");
}

#[test]
fn base64_data_in_a_manifest_is_decoded() {
    let secret: Secret = serde_yaml::from_str(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: moonshot}\ndata: {token: c2stYjY0}\n",
    )
    .unwrap();
    let mut m = standalone();
    m.secrets.push(secret);
    kimi_with_key_from(&mut m, "moonshot", "token");
    assert_eq!(kimi_api_key(&m), "sk-b64");
}

#[test]
fn missing_secret_is_rejected_naming_the_route() {
    let mut m = standalone();
    kimi_with_key_from(&mut m, "nowhere", "token");
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "upstreams[0] (simulated): apiKeySecretRef: Secret nowhere not found",
    );
}

#[test]
fn missing_secret_key_is_rejected() {
    let mut m = standalone();
    let mut s = secret("moonshot");
    s.string_data = Some(BTreeMap::from([("other".into(), "x".into())]));
    m.secrets.push(s);
    kimi_with_key_from(&mut m, "moonshot", "token");
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "Secret moonshot has no key token",
    );
}

#[test]
fn empty_or_binary_secret_value_is_rejected() {
    let mut m = standalone();
    let mut s = secret("moonshot");
    s.data = Some(BTreeMap::from([
        ("empty".into(), ByteString(vec![])),
        ("binary".into(), ByteString(vec![0xff, 0xfe])),
    ]));
    m.secrets.push(s);
    kimi_with_key_from(&mut m, "moonshot", "empty");
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "key empty of Secret moonshot is empty",
    );
    kimi_with_key_from(&mut m, "moonshot", "binary");
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "key binary of Secret moonshot is not UTF-8",
    );
}

#[test]
fn secret_of_another_namespace_does_not_resolve() {
    let mut m = standalone();
    let mut s = secret("moonshot");
    s.metadata.namespace = Some("elsewhere".into());
    s.string_data = Some(BTreeMap::from([("token".into(), "sk".into())]));
    m.secrets.push(s);
    kimi_with_key_from(&mut m, "moonshot", "token");
    assert_rejected(&m, "ModelRoute svc-kimi:", "Secret moonshot not found");
}

#[test]
fn seed_secret_that_does_not_resolve_is_rejected_naming_the_api_key() {
    let mut m = standalone();
    m.secrets.clear();
    assert_rejected(
        &m,
        "ApiKey example-enterprise:",
        "seed.secretRef: Secret example-enterprise-key not found",
    );
}
