//! The CRDs' CEL rules (`x-kubernetes-validations`), evaluated by kube-cel against objects as
//! `kubectl apply` sends them: what an API server from 1.25 refuses at admission, and the
//! message the user then reads. The test API server (1.20) predates CEL, so the rules run
//! here; they are also compiled here, so a rule that does not compile fails this suite rather
//! than a platform team's `helm install`.

mod common;

use serde::Deserialize;
use serde_json::{json, Value};

fn schema(kind: &str) -> Value {
    crds::resources::crds()
        .into_iter()
        .find(|crd| crd["spec"]["names"]["kind"] == kind)
        .map(|crd| crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone())
        .unwrap_or_else(|| panic!("no {kind} CRD"))
}

fn object(kind: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "gateway.svc.dev/v1alpha1",
        "kind": kind,
        "metadata": { "name": name, "namespace": "llm" },
        "spec": spec,
    })
}

/// The messages of the rules `object` breaks; empty when it is admitted.
fn refusals(object: &Value) -> Vec<String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    match kube_cel::validate(&schema(kind), object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

fn assert_refused(object: Value, message: &str) {
    let found = refusals(&object);
    assert!(
        found.iter().any(|m| m.contains(message)),
        "{message:?} not among {found:?} for {object}"
    );
}

#[test]
fn every_rule_compiles() {
    for kind in ["Tier", "ModelRoute", "ApiKey"] {
        let compiled = kube_cel::compile_schema(&schema(kind));
        assert!(
            !compiled.has_errors(),
            "{kind}: {:?}",
            compiled.compilation_errors()
        );
    }
}

#[test]
fn the_shipped_manifests_are_admitted() {
    let mut checked = 0;
    for folder in ["deploy/standalone", "deploy/examples"] {
        for entry in std::fs::read_dir(common::repo_path(folder))
            .into_iter()
            .flatten()
        {
            let path = entry.map(|e| e.path()).unwrap_or_default();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for document in serde_yaml::Deserializer::from_str(&text) {
                let Ok(object) = Value::deserialize(document) else {
                    continue;
                };
                if ["Tier", "ModelRoute", "ApiKey"].contains(&object["kind"].as_str().unwrap_or(""))
                {
                    assert_eq!(
                        refusals(&object),
                        Vec::<String>::new(),
                        "{}",
                        path.display()
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} resources found");
}

fn upstream_route() -> Value {
    json!({
        "model": "svc/fast",
        "displayName": "Fast",
        "contextWindow": 1000,
        "maxOutputTokens": 100,
        "pricing": {
            "inputUsdPerMTok": "1", "outputUsdPerMTok": "2",
            "cacheWriteUsdPerMTok": "1.25", "cacheReadUsdPerMTok": "0.1"
        },
        "upstreams": [{ "name": "sim", "provider": "simulated", "model": "sim-1" }],
    })
}

#[test]
fn a_route_with_both_upstreams_and_auto_or_neither_is_refused() {
    let mut both = upstream_route();
    both["auto"] = json!({ "candidates": ["svc/haiku"] });
    assert_refused(
        object("ModelRoute", "r", both),
        "exactly one of upstreams and auto",
    );
    let mut neither = upstream_route();
    neither.as_object_mut().map(|o| o.remove("upstreams"));
    assert_refused(
        object("ModelRoute", "r", neither),
        "exactly one of upstreams and auto",
    );
}

#[test]
fn max_output_tokens_above_the_context_window_is_refused() {
    let mut route = upstream_route();
    route["maxOutputTokens"] = json!(2000);
    assert_refused(
        object("ModelRoute", "r", route),
        "maxOutputTokens must be at most contextWindow",
    );
}

#[test]
fn a_route_with_upstreams_needs_its_context_window_and_pricing() {
    let mut route = upstream_route();
    route.as_object_mut().map(|o| o.remove("pricing"));
    assert_refused(object("ModelRoute", "r", route), "required with upstreams");
}

#[test]
fn an_auto_route_takes_its_window_and_price_from_its_candidates() {
    let auto = json!({
        "model": "svc/auto", "displayName": "Auto", "contextWindow": 1000,
        "auto": { "candidates": ["svc/haiku"] },
    });
    assert_refused(object("ModelRoute", "r", auto), "not allowed with auto");
}

#[test]
fn custom_limits_on_a_key_without_the_enterprise_grant_are_refused() {
    let key = json!({
        "keyId": "key_x",
        "limits": { "requestsPerMinute": 10, "inputTokensPerMinute": 10, "concurrentStreams": 1 },
    });
    assert_refused(
        object("ApiKey", "k", key),
        "limits are only allowed with tier: enterprise",
    );
}

fn tier(id: &str, promotion: Option<u64>) -> Value {
    let mut spec = json!({
        "tier": id, "requestsPerMinute": 5, "inputTokensPerMinute": 10, "concurrentStreams": 1,
    });
    if let Some(cents) = promotion {
        spec["promotionAtLifetimeTopUpCents"] = json!(cents);
    }
    spec
}

#[test]
fn promotion_thresholds_are_refused_where_the_tier_cannot_have_them() {
    assert_refused(
        object("Tier", "enterprise", tier("enterprise", Some(100))),
        "must be absent",
    );
    assert_refused(
        object("Tier", "pay-as-you-go", tier("pay_as_you_go", None)),
        "required on every tier but enterprise",
    );
    assert_refused(
        object("Tier", "free", tier("free", Some(5))),
        "must be 0 on the free tier",
    );
}

#[test]
fn a_tier_is_named_after_its_id_so_a_second_free_tier_is_a_name_conflict() {
    assert_eq!(
        refusals(&object("Tier", "free", tier("free", Some(0)))),
        Vec::<String>::new()
    );
    assert_refused(
        object("Tier", "free-again", tier("free", Some(0))),
        "a Tier is named after its tier",
    );
}

fn with_upstream(upstream: Value) -> Value {
    let mut route = upstream_route();
    route["upstreams"] = json!([upstream]);
    object("ModelRoute", "r", route)
}

#[test]
fn an_azure_openai_upstream_needs_its_base_url_and_api_version() {
    let azure = json!({
        "name": "azure", "provider": "azure-openai", "model": "gpt-4o-prod",
        "baseUrl": "https://res.openai.azure.com", "apiVersion": "2024-10-21",
    });
    assert_eq!(
        refusals(&with_upstream(azure.clone())),
        Vec::<String>::new()
    );
    for field in ["baseUrl", "apiVersion"] {
        let mut missing = azure.clone();
        missing.as_object_mut().map(|o| o.remove(field));
        assert_refused(with_upstream(missing), &format!("{field} is required"));
    }
}

#[test]
fn an_api_version_is_refused_on_other_providers() {
    let openai = json!({
        "name": "oai", "provider": "openai", "model": "gpt-4o",
        "baseUrl": "https://api.openai.com/v1", "apiVersion": "2024-10-21",
    });
    assert_refused(with_upstream(openai), "only for it");
}

#[test]
fn a_bedrock_upstream_needs_its_region_and_no_base_url_api_key_or_api_version() {
    let bedrock = json!({
        "name": "bedrock", "provider": "bedrock",
        "model": "anthropic.claude-sonnet-4-20250514-v1:0", "region": "us-east-1",
        "awsCredentialsSecretRef": {"name": "aws"},
    });
    assert_eq!(
        refusals(&with_upstream(bedrock.clone())),
        Vec::<String>::new()
    );
    let mut without_region = bedrock.clone();
    without_region.as_object_mut().map(|o| o.remove("region"));
    assert_refused(with_upstream(without_region), "region is required");
    for (field, value, refusal) in [
        ("apiVersion", json!("2024-10-21"), "apiVersion is required"),
        (
            "apiKeySecretRef",
            json!({"name": "k", "key": "apiKey"}),
            "use awsCredentialsSecretRef",
        ),
    ] {
        let mut wrong = bedrock.clone();
        wrong[field] = value;
        assert_refused(with_upstream(wrong), refusal);
    }
}

#[test]
fn a_region_or_aws_credentials_are_refused_on_other_providers() {
    let anthropic = json!({
        "name": "a", "provider": "anthropic", "model": "claude",
        "baseUrl": "https://api.anthropic.com",
    });
    let mut with_region = anthropic.clone();
    with_region["region"] = json!("us-east-1");
    assert_refused(with_upstream(with_region), "only for them");
    let mut with_credentials = anthropic;
    with_credentials["awsCredentialsSecretRef"] = json!({"name": "aws"});
    assert_refused(
        with_upstream(with_credentials),
        "awsCredentialsSecretRef is only for the bedrock provider",
    );
}

#[test]
fn a_vertex_upstream_needs_its_project_and_region_and_no_api_key() {
    let vertex = json!({
        "name": "vertex", "provider": "vertex", "model": "claude-sonnet-4@20250514",
        "project": "acme-llm", "region": "us-east5",
        "googleCredentialsSecretRef": {"name": "sa", "key": "key.json"},
    });
    assert_eq!(
        refusals(&with_upstream(vertex.clone())),
        Vec::<String>::new()
    );
    let mut global = vertex.clone();
    global["region"] = json!("global");
    assert_eq!(refusals(&with_upstream(global)), Vec::<String>::new());
    for (field, refusal) in [
        ("project", "project is required"),
        ("region", "region is required"),
    ] {
        let mut without = vertex.clone();
        without.as_object_mut().map(|o| o.remove(field));
        assert_refused(with_upstream(without), refusal);
    }
    let mut aws_region = vertex.clone();
    aws_region["region"] = json!("us-east-1");
    assert_refused(with_upstream(aws_region), "must be a Google Cloud region");
    let mut with_key = vertex.clone();
    with_key["apiKeySecretRef"] = json!({"name": "k", "key": "apiKey"});
    assert_refused(with_upstream(with_key), "use googleCredentialsSecretRef");

    // A Google region on bedrock is not an AWS one.
    let bedrock = json!({
        "name": "bedrock", "provider": "bedrock",
        "model": "anthropic.claude-sonnet-4-20250514-v1:0", "region": "us-east5",
    });
    assert_refused(with_upstream(bedrock), "must be an AWS region");
}

#[test]
fn a_project_or_google_credentials_are_refused_on_other_providers() {
    let anthropic = json!({
        "name": "a", "provider": "anthropic", "model": "claude",
        "baseUrl": "https://api.anthropic.com",
    });
    let mut with_project = anthropic.clone();
    with_project["project"] = json!("acme-llm");
    assert_refused(
        with_upstream(with_project),
        "project is required for the vertex provider, and only for it",
    );
    let mut with_credentials = anthropic;
    with_credentials["googleCredentialsSecretRef"] = json!({"name": "sa", "key": "key.json"});
    assert_refused(
        with_upstream(with_credentials),
        "googleCredentialsSecretRef is only for the vertex provider",
    );
}

fn embeddings_route() -> Value {
    let mut route = upstream_route();
    route.as_object_mut().map(|o| o.remove("maxOutputTokens"));
    route["capabilities"] = json!({ "embeddings": true });
    route
}

#[test]
fn an_embeddings_route_is_admitted_without_max_output_tokens_and_a_chat_route_is_not() {
    assert_eq!(
        refusals(&object("ModelRoute", "r", embeddings_route())),
        Vec::<String>::new()
    );
    let mut chat = upstream_route();
    chat.as_object_mut().map(|o| o.remove("maxOutputTokens"));
    assert_refused(object("ModelRoute", "r", chat), "required with upstreams");
}

#[test]
fn an_embeddings_route_with_max_output_tokens_thinking_or_a_provider_without_embeddings_is_refused()
{
    let message = "an embeddings route has upstreams of the openai, azure-openai or simulated";
    let mut with_max = embeddings_route();
    with_max["maxOutputTokens"] = json!(100);
    assert_refused(object("ModelRoute", "r", with_max), message);
    let mut thinking = embeddings_route();
    thinking["capabilities"]["thinking"] = json!(true);
    assert_refused(object("ModelRoute", "r", thinking), message);
    let mut anthropic = embeddings_route();
    anthropic["upstreams"] = json!([{
        "name": "a", "provider": "anthropic", "model": "m", "baseUrl": "https://x.example"
    }]);
    assert_refused(object("ModelRoute", "r", anthropic), message);
    let mut openai = embeddings_route();
    openai["upstreams"] = json!([{
        "name": "o", "provider": "openai", "model": "m", "baseUrl": "https://x.example/v1"
    }]);
    assert_eq!(
        refusals(&object("ModelRoute", "r", openai)),
        Vec::<String>::new()
    );
}

#[test]
fn a_gemini_upstream_needs_its_api_key_and_no_base_url() {
    let gemini = json!({
        "name": "gemini", "provider": "gemini", "model": "gemini-2.5-flash",
        "apiKeySecretRef": {"name": "gemini-key", "key": "apiKey"},
    });
    assert_eq!(
        refusals(&with_upstream(gemini.clone())),
        Vec::<String>::new()
    );
    let mut without_key = gemini;
    without_key
        .as_object_mut()
        .map(|o| o.remove("apiKeySecretRef"));
    assert_refused(
        with_upstream(without_key),
        "apiKeySecretRef is required for the gemini provider",
    );
}
