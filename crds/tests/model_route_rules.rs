mod common;

use crds::config::{ProviderKind, Route};
use crds::resources::{AutoSpec, Provider};

use common::{assert_rejected, compiles, rejections, route, standalone};

#[test]
fn model_id_without_svc_prefix_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/kimi").spec.model = "kimi".into();
    assert_rejected(&m, "ModelRoute svc-kimi:", "must be svc/ followed by");
}

#[test]
fn model_id_declared_twice_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/kimi").spec.model = "svc/haiku".into();
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "model svc/haiku is already declared by ModelRoute svc-haiku",
    );
}

#[test]
fn max_output_tokens_above_context_window_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/haiku").spec.max_output_tokens = Some(300_000);
    assert_rejected(
        &m,
        "ModelRoute svc-haiku:",
        "contextWindow (200000) must be at least maxOutputTokens (300000)",
    );
}

#[test]
fn zero_max_output_tokens_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/haiku").spec.max_output_tokens = Some(0);
    assert_rejected(
        &m,
        "ModelRoute svc-haiku:",
        "maxOutputTokens must be at least 1",
    );
}

#[test]
fn upstream_route_without_limits_or_pricing_is_rejected() {
    let mut m = standalone();
    let spec = &mut route(&mut m, "svc/haiku").spec;
    spec.context_window = None;
    spec.max_output_tokens = None;
    spec.pricing = None;
    for field in ["contextWindow", "maxOutputTokens", "pricing"] {
        assert_rejected(&m, "ModelRoute svc-haiku:", &format!("{field} is required"));
    }
}

#[test]
fn price_with_more_than_six_decimals_is_rejected() {
    let mut m = standalone();
    let pricing = route(&mut m, "svc/opus").spec.pricing.as_mut().unwrap();
    pricing.cache_read_usd_per_m_tok = "1.5000001".into();
    assert_rejected(
        &m,
        "ModelRoute svc-opus:",
        "pricing.cacheReadUsdPerMTok \"1.5000001\" has more than 6 decimal places",
    );
}

#[test]
fn negative_or_malformed_price_is_rejected() {
    let mut m = standalone();
    let pricing = route(&mut m, "svc/opus").spec.pricing.as_mut().unwrap();
    pricing.input_usd_per_m_tok = "-15".into();
    pricing.output_usd_per_m_tok = "75 USD".into();
    for field in ["inputUsdPerMTok", "outputUsdPerMTok"] {
        assert_rejected(&m, "ModelRoute svc-opus:", &format!("pricing.{field}"));
    }
}

#[test]
fn route_with_both_upstreams_and_auto_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/kimi").spec.auto = Some(AutoSpec {
        candidates: vec!["svc/haiku".into()],
    });
    assert_rejected(&m, "ModelRoute svc-kimi:", "sets both upstreams and auto");
}

#[test]
fn route_with_neither_upstreams_nor_auto_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/kimi").spec.upstreams.clear();
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "sets neither upstreams nor auto",
    );
}

#[test]
fn auto_route_to_unknown_candidate_is_rejected() {
    let mut m = standalone();
    let auto = route(&mut m, "svc/auto").spec.auto.as_mut().unwrap();
    auto.candidates.push("svc/gpt".into());
    assert_rejected(
        &m,
        "ModelRoute svc-auto:",
        "auto candidate svc/gpt is not declared by any ModelRoute",
    );
}

#[test]
fn auto_route_to_auto_candidate_is_rejected() {
    let mut m = standalone();
    let auto = route(&mut m, "svc/auto").spec.auto.as_mut().unwrap();
    auto.candidates.push("svc/auto".into());
    assert_rejected(
        &m,
        "ModelRoute svc-auto:",
        "auto candidate svc/auto is itself an auto route",
    );
}

#[test]
fn auto_route_without_candidates_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/auto")
        .spec
        .auto
        .as_mut()
        .unwrap()
        .candidates
        .clear();
    assert_rejected(&m, "ModelRoute svc-auto:", "must name at least one model");
}

#[test]
fn auto_route_with_its_own_limits_capabilities_or_pricing_is_rejected() {
    let mut m = standalone();
    let opus_pricing = route(&mut m, "svc/opus").spec.pricing.clone();
    let spec = &mut route(&mut m, "svc/auto").spec;
    spec.context_window = Some(1000);
    spec.max_output_tokens = Some(100);
    spec.capabilities.vision = true;
    spec.pricing = opus_pricing;
    for field in [
        "contextWindow",
        "maxOutputTokens",
        "capabilities.vision",
        "pricing",
    ] {
        assert_rejected(
            &m,
            "ModelRoute svc-auto:",
            &format!("{field} is not allowed"),
        );
    }
}

#[test]
fn auto_route_with_thinking_needs_a_thinking_candidate() {
    let mut m = standalone();
    let spec = &mut route(&mut m, "svc/auto").spec;
    spec.capabilities.thinking = true;
    spec.auto.as_mut().unwrap().candidates = vec!["svc/haiku".into()];
    assert_rejected(
        &m,
        "ModelRoute svc-auto:",
        "needs at least one candidate with thinking",
    );

    route(&mut m, "svc/auto")
        .spec
        .auto
        .as_mut()
        .unwrap()
        .candidates = vec!["svc/haiku".into(), "svc/opus".into()];
    assert!(compiles(&m).models["svc/auto"].capabilities.thinking);
}

#[test]
fn remote_upstream_without_base_url_is_rejected() {
    for (provider, name) in [
        (Provider::Anthropic, "anthropic"),
        (Provider::Openai, "openai"),
    ] {
        let mut m = standalone();
        let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
        upstream.provider = provider;
        upstream.base_url = None;
        assert_rejected(
            &m,
            "ModelRoute svc-kimi:",
            &format!("upstreams[0] (simulated): baseUrl is required for the {name} provider"),
        );
    }
}

#[test]
fn cleartext_http2_is_for_http_upstreams_only() {
    let mut m = standalone();
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.provider = Provider::Openai;
    upstream.base_url = Some("http://kimi.models.svc:8000/v1".into());
    upstream.http2 = true;
    let config = compiles(&m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not routed to upstreams");
    };
    assert!(upstreams[0].http2);

    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.base_url = Some("https://api.example.com/v1".into());
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "upstreams[0] (simulated): http2 is for http:// upstreams (https:// ones negotiate it)",
    );
}

#[test]
fn upstream_names_used_twice_in_a_route_are_rejected() {
    let mut m = standalone();
    let upstreams = &mut route(&mut m, "svc/kimi").spec.upstreams;
    upstreams.push(upstreams[0].clone());
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "upstreams[1] (simulated): name is used twice",
    );
}

#[test]
fn zero_upstream_weight_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/kimi").spec.upstreams[0].weight = 0;
    assert_rejected(&m, "ModelRoute svc-kimi:", "weight must be at least 1");
}

#[test]
fn every_error_is_reported_not_only_the_first() {
    let mut m = standalone();
    route(&mut m, "svc/kimi").spec.model = "kimi".into();
    route(&mut m, "svc/opus").spec.max_output_tokens = Some(0);
    m.tiers.clear();
    let errors = rejections(&m);
    assert!(errors.iter().any(|e| e.starts_with("ModelRoute svc-kimi:")));
    assert!(errors.iter().any(|e| e.starts_with("ModelRoute svc-opus:")));
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.starts_with("no Tier declares"))
            .count(),
        4,
        "{errors:#?}"
    );
}

#[test]
fn batch_price_ratio_is_carried_in_millionths_and_absent_by_default() {
    let mut m = standalone();
    route(&mut m, "svc/haiku").spec.batch_price_ratio = Some(0.25);
    route(&mut m, "svc/sonnet").spec.batch_price_ratio = Some(1.0);
    let config = compiles(&m);
    let per_million = |model: &str| config.models[model].batch_price_per_million;
    assert_eq!(per_million("svc/haiku"), Some(250_000));
    assert_eq!(per_million("svc/sonnet"), Some(1_000_000));
    assert_eq!(per_million("svc/opus"), None, "the gateway's default");
}

#[test]
fn batch_price_ratio_outside_zero_to_one_is_rejected() {
    for ratio in [0.0, -0.5, 1.5, f64::NAN] {
        let mut m = standalone();
        route(&mut m, "svc/haiku").spec.batch_price_ratio = Some(ratio);
        assert_rejected(&m, "ModelRoute svc-haiku:", "batchPriceRatio");
    }
}

#[test]
fn batch_price_ratio_on_an_auto_route_is_rejected() {
    let mut m = standalone();
    route(&mut m, "svc/auto").spec.batch_price_ratio = Some(0.5);
    assert_rejected(
        &m,
        "ModelRoute svc-auto:",
        "batchPriceRatio is not allowed with auto",
    );
}

#[test]
fn an_azure_openai_upstream_compiles_with_its_api_version_and_needs_it() {
    let mut m = standalone();
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.provider = Provider::AzureOpenai;
    upstream.base_url = Some("https://res.openai.azure.com".into());
    upstream.api_version = Some("2024-10-21".into());
    let config = compiles(&m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not routed to upstreams");
    };
    assert_eq!(upstreams[0].provider, ProviderKind::AzureOpenai);
    assert_eq!(upstreams[0].api_version.as_deref(), Some("2024-10-21"));

    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.api_version = None;
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "upstreams[0] (simulated): apiVersion is required for the azure-openai provider",
    );
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.api_version = Some("latest".into());
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "apiVersion \"latest\" must be a date",
    );
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.api_version = Some("2024-10-21".into());
    upstream.base_url = None;
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "upstreams[0] (simulated): baseUrl is required for the azure-openai provider",
    );
}

#[test]
fn an_api_version_on_another_provider_is_rejected() {
    let mut m = standalone();
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.provider = Provider::Openai;
    upstream.base_url = Some("https://api.example.com/v1".into());
    upstream.api_version = Some("2024-10-21".into());
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "upstreams[0] (simulated): apiVersion is only for the azure-openai provider",
    );
}

fn kimi_on_bedrock(m: &mut crds::manifests::Manifests) {
    let upstream = &mut route(m, "svc/kimi").spec.upstreams[0];
    upstream.provider = Provider::Bedrock;
    upstream.model = "anthropic.claude-sonnet-4-20250514-v1:0".into();
    upstream.region = Some("eu-west-3".into());
    upstream.aws_credentials_secret_ref = Some(crds::resources::SecretRef { name: "aws".into() });
}

fn aws_secret(keys: &[(&str, &str)]) -> k8s_openapi::api::core::v1::Secret {
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("aws".into());
    secret.string_data = Some(
        keys.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    secret
}

#[test]
fn a_bedrock_upstream_compiles_with_its_region_and_the_secrets_keys_and_needs_no_base_url() {
    let mut m = standalone();
    kimi_on_bedrock(&mut m);
    m.secrets.push(aws_secret(&[
        ("accessKeyId", "AKIDEXAMPLE"),
        ("secretAccessKey", "s3cr3t"),
        ("sessionToken", "tok"),
    ]));
    let config = compiles(&m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not routed to upstreams");
    };
    let upstream = &upstreams[0];
    assert_eq!(upstream.provider, ProviderKind::Bedrock);
    assert_eq!(
        upstream.provider.as_str(),
        "bedrock",
        "as the ledger spells it"
    );
    assert_eq!(upstream.region.as_deref(), Some("eu-west-3"));
    assert_eq!(upstream.base_url, None);
    let keys = upstream
        .aws_credentials
        .as_ref()
        .expect("the Secret's keys");
    assert_eq!(keys.access_key_id.expose(), "AKIDEXAMPLE");
    assert_eq!(keys.secret_access_key.expose(), "s3cr3t");
    assert_eq!(keys.session_token.as_ref().map(|t| t.expose()), Some("tok"));

    // Long-term keys have no session token; a Secret without the secret key is refused.
    let replace = |m: &mut crds::manifests::Manifests, keys: &[(&str, &str)]| {
        m.secrets
            .retain(|s| s.metadata.name.as_deref() != Some("aws"));
        m.secrets.push(aws_secret(keys));
    };
    replace(
        &mut m,
        &[("accessKeyId", "AKIDEXAMPLE"), ("secretAccessKey", "s")],
    );
    let config = compiles(&m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not routed to upstreams");
    };
    assert!(upstreams[0]
        .aws_credentials
        .as_ref()
        .is_some_and(|k| k.session_token.is_none()));
    replace(&mut m, &[("accessKeyId", "AKIDEXAMPLE")]);
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "awsCredentialsSecretRef: Secret aws has no key secretAccessKey",
    );
}

#[test]
fn a_bedrock_upstream_without_a_region_or_with_an_api_key_is_rejected_and_a_region_elsewhere_too() {
    let mut m = standalone();
    kimi_on_bedrock(&mut m);
    m.secrets.push(aws_secret(&[
        ("accessKeyId", "A"),
        ("secretAccessKey", "S"),
    ]));
    route(&mut m, "svc/kimi").spec.upstreams[0].region = None;
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "region is required for the bedrock provider",
    );
    route(&mut m, "svc/kimi").spec.upstreams[0].region = Some("Europe".into());
    assert_rejected(&m, "ModelRoute svc-kimi:", "must be an AWS region");

    let mut m = standalone();
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.region = Some("us-east-1".into());
    upstream.aws_credentials_secret_ref = Some(crds::resources::SecretRef { name: "aws".into() });
    let messages = rejections(&m);
    for needle in [
        "region is only for the bedrock and vertex providers",
        "awsCredentialsSecretRef is only for the bedrock provider",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(needle)),
            "{needle}: {messages:#?}"
        );
    }
}

fn kimi_on_vertex(m: &mut crds::manifests::Manifests) {
    let upstream = &mut route(m, "svc/kimi").spec.upstreams[0];
    upstream.provider = Provider::Vertex;
    upstream.model = "claude-sonnet-4@20250514".into();
    upstream.region = Some("europe-west1".into());
    upstream.project = Some("acme-llm".into());
    upstream.api_key_secret_ref = None;
    upstream.base_url = None;
    upstream.google_credentials_secret_ref = Some(crds::resources::SecretKeyRef {
        name: "vertex-sa".into(),
        key: "key.json".into(),
    });
}

fn google_secret(key_file: &str) -> k8s_openapi::api::core::v1::Secret {
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("vertex-sa".into());
    secret.string_data = Some([("key.json".to_owned(), key_file.to_owned())].into());
    secret
}

const KEY_FILE: &str = r#"{"type": "service_account", "project_id": "acme-llm",
    "private_key": "-----BEGIN PRIVATE KEY-----\nnot a real key\n-----END PRIVATE KEY-----\n",
    "client_email": "gw@acme-llm.iam.gserviceaccount.com",
    "token_uri": "https://oauth2.googleapis.com/token"}"#;

#[test]
fn a_vertex_upstream_compiles_with_its_project_region_and_key_file_and_needs_no_base_url() {
    let mut m = standalone();
    kimi_on_vertex(&mut m);
    m.secrets.push(google_secret(KEY_FILE));
    let config = compiles(&m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not routed to upstreams");
    };
    let upstream = &upstreams[0];
    assert_eq!(upstream.provider, ProviderKind::Vertex);
    assert_eq!(
        upstream.provider.as_str(),
        "vertex",
        "as the ledger spells it"
    );
    assert_eq!(upstream.project.as_deref(), Some("acme-llm"));
    assert_eq!(upstream.region.as_deref(), Some("europe-west1"));
    assert_eq!(upstream.base_url, None);
    assert_eq!(
        upstream.google_credentials.as_ref().map(|k| k.expose()),
        Some(KEY_FILE)
    );

    // Without a key file: the metadata server's token.
    route(&mut m, "svc/kimi").spec.upstreams[0].google_credentials_secret_ref = None;
    let config = compiles(&m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not routed to upstreams");
    };
    assert!(upstreams[0].google_credentials.is_none());
}

#[test]
fn a_vertex_upstream_without_a_project_or_region_or_with_no_key_file_is_rejected() {
    let mut m = standalone();
    kimi_on_vertex(&mut m);
    m.secrets.push(google_secret(KEY_FILE));
    route(&mut m, "svc/kimi").spec.upstreams[0].project = None;
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "project is required for the vertex provider",
    );
    kimi_on_vertex(&mut m);
    route(&mut m, "svc/kimi").spec.upstreams[0].region = None;
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "region is required for the vertex provider",
    );
    route(&mut m, "svc/kimi").spec.upstreams[0].region = Some("eu-west-3".into());
    assert_rejected(&m, "ModelRoute svc-kimi:", "must be a Google Cloud region");

    let mut m = standalone();
    kimi_on_vertex(&mut m);
    m.secrets
        .push(google_secret(r#"{"type": "authorized_user"}"#));
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "is not a service account's JSON key file",
    );

    let mut m = standalone();
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.project = Some("acme-llm".into());
    upstream.google_credentials_secret_ref = Some(crds::resources::SecretKeyRef {
        name: "vertex-sa".into(),
        key: "key.json".into(),
    });
    let messages = rejections(&m);
    for needle in [
        "project is only for the vertex provider",
        "googleCredentialsSecretRef is only for the vertex provider",
    ] {
        assert!(
            messages.iter().any(|m| m.contains(needle)),
            "{needle}: {messages:#?}"
        );
    }
}

#[test]
fn the_standalone_embeddings_route_compiles_without_max_output_tokens_or_tools() {
    let config = compiles(&standalone());
    let embed = &config.models["svc/embed"];
    assert!(embed.capabilities.embeddings);
    assert!(
        !embed.capabilities.tools,
        "an embeddings route calls no tools"
    );
    assert_eq!((embed.context_window, embed.max_output_tokens), (8192, 0));
    assert!(!config.models["svc/haiku"].capabilities.embeddings);
}

#[test]
fn an_embeddings_route_with_max_output_tokens_or_thinking_is_rejected() {
    let mut m = standalone();
    let spec = &mut route(&mut m, "svc/embed").spec;
    spec.max_output_tokens = Some(16);
    spec.capabilities.thinking = true;
    assert_rejected(
        &m,
        "ModelRoute svc-embed:",
        "maxOutputTokens is not allowed on an embeddings route",
    );
    assert_rejected(&m, "ModelRoute svc-embed:", "capabilities.thinking");
}

#[test]
fn embeddings_on_a_provider_without_them_is_rejected() {
    for provider in [Provider::Anthropic, Provider::Bedrock] {
        let mut m = standalone();
        let upstream = &mut route(&mut m, "svc/embed").spec.upstreams[0];
        upstream.provider = provider;
        upstream.base_url = Some("https://upstream.example".into());
        if provider == Provider::Bedrock {
            upstream.region = Some("us-east-1".into());
        }
        assert_rejected(
            &m,
            "ModelRoute svc-embed:",
            "capabilities.embeddings is served by the openai, azure-openai and simulated providers only",
        );
    }
}

#[test]
fn an_embeddings_route_is_no_auto_candidate_and_no_auto_route() {
    let mut m = standalone();
    route(&mut m, "svc/auto")
        .spec
        .auto
        .as_mut()
        .unwrap()
        .candidates
        .push("svc/embed".into());
    assert_rejected(
        &m,
        "ModelRoute svc-auto:",
        "auto candidate svc/embed is an embeddings route",
    );
    let mut m = standalone();
    route(&mut m, "svc/auto").spec.capabilities.embeddings = true;
    assert_rejected(
        &m,
        "ModelRoute svc-auto:",
        "capabilities.embeddings is not allowed with auto",
    );
}

#[test]
fn a_gemini_upstream_compiles_without_a_base_url_and_is_rejected_without_an_api_key() {
    let mut m = standalone();
    let upstream = &mut route(&mut m, "svc/kimi").spec.upstreams[0];
    upstream.provider = Provider::Gemini;
    upstream.model = "gemini-2.5-flash".into();
    upstream.base_url = None;
    upstream.api_key_secret_ref = Some(crds::resources::SecretKeyRef {
        name: "gemini".into(),
        key: "apiKey".into(),
    });
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("gemini".into());
    secret.string_data = Some([("apiKey".to_owned(), "g-key".to_owned())].into());
    m.secrets.push(secret);
    let config = compiles(&m);
    let Route::Upstreams(upstreams) = &config.models["svc/kimi"].route else {
        panic!("svc/kimi is not routed to upstreams");
    };
    assert_eq!(upstreams[0].provider, ProviderKind::Gemini);
    assert_eq!(upstreams[0].provider.as_str(), "gemini");
    assert_eq!(upstreams[0].base_url, None);
    assert_eq!(
        upstreams[0].api_key.as_ref().map(|k| k.expose()),
        Some("g-key")
    );

    route(&mut m, "svc/kimi").spec.upstreams[0].api_key_secret_ref = None;
    assert_rejected(
        &m,
        "ModelRoute svc-kimi:",
        "apiKeySecretRef is required for the gemini provider",
    );
}
