mod common;

use crds::config::{Limits, ProviderKind, Route};
use crds::manifests::load_dir;

use common::repo_path;

#[test]
fn standalone_folder_compiles_with_the_spec_tiers_and_models() {
    let config = load_dir(&repo_path("deploy/standalone")).unwrap();

    let limits = |id: &str| config.tiers[id].limits;
    assert_eq!(
        limits("free"),
        Limits {
            requests_per_minute: 5,
            input_tokens_per_minute: 20_000,
            concurrent_streams: 1
        }
    );
    assert_eq!(limits("pay_as_you_go").requests_per_minute, 60);
    assert_eq!(limits("high_volume").input_tokens_per_minute, 500_000);
    assert_eq!(limits("enterprise").concurrent_streams, 50);
    assert_eq!(
        config.tiers["high_volume"].promotion_at_lifetime_cents,
        Some(50_000)
    );
    assert_eq!(config.tiers["enterprise"].promotion_at_lifetime_cents, None);

    let ids: Vec<&str> = config.models.keys().map(String::as_str).collect();
    assert_eq!(
        ids,
        [
            "svc/auto",
            "svc/embed",
            "svc/haiku",
            "svc/kimi",
            "svc/opus",
            "svc/sonnet"
        ]
    );
    let opus = &config.models["svc/opus"];
    assert_eq!(opus.pricing.cache_write_micros_per_mtok, 18_750_000);
    assert!(opus.capabilities.thinking);
    let Route::Upstreams(upstreams) = &opus.route else {
        panic!("svc/opus is not an upstream route");
    };
    assert_eq!(upstreams[0].provider, ProviderKind::Simulated);
    assert_eq!(upstreams[0].chunk_delay_ms, 15);

    let grant = &config.keys["key_example_enterprise"];
    assert_eq!(grant.tier.as_deref(), Some("enterprise"));
    let seed = grant.seed.as_ref().unwrap();
    assert_eq!(seed.account, "example-corp");
    assert_eq!(
        seed.secret.expose(),
        "sk-svc-example-enterprise-0000000000000000"
    );
}

#[test]
fn auto_route_takes_the_largest_limits_and_any_capability_of_its_candidates() {
    let config = load_dir(&repo_path("deploy/standalone")).unwrap();
    let auto = &config.models["svc/auto"];
    assert_eq!(auto.context_window, 200_000);
    assert_eq!(auto.max_output_tokens, 64_000);
    assert!(auto.capabilities.vision && auto.capabilities.tools);
    assert!(
        !auto.capabilities.thinking,
        "thinking stays as declared on svc/auto"
    );
    assert_eq!(auto.pricing, Default::default());
}

#[test]
fn examples_folder_compiles_with_real_providers() {
    let config = load_dir(&repo_path("deploy/examples")).unwrap();
    for (id, model) in &config.models {
        let Route::Upstreams(upstreams) = &model.route else {
            continue;
        };
        for upstream in upstreams {
            assert_ne!(upstream.provider, ProviderKind::Simulated, "{id}");
            assert!(upstream.base_url.is_some(), "{id}");
            assert!(upstream.api_key.is_some(), "{id}");
        }
    }
}

#[test]
fn examples_offer_what_standalone_offers() {
    let standalone = load_dir(&repo_path("deploy/standalone")).unwrap();
    let examples = load_dir(&repo_path("deploy/examples")).unwrap();
    assert_eq!(standalone.tiers, examples.tiers);
    assert_eq!(
        standalone.models.keys().collect::<Vec<_>>(),
        examples.models.keys().collect::<Vec<_>>()
    );
    for (id, model) in &standalone.models {
        let example = &examples.models[id];
        assert_eq!(model.context_window, example.context_window, "{id}");
        assert_eq!(model.max_output_tokens, example.max_output_tokens, "{id}");
        assert_eq!(model.capabilities, example.capabilities, "{id}");
        assert_eq!(model.pricing, example.pricing, "{id}");
    }
}
