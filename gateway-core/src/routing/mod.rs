//! The virtual models and where their turns go: the compiled config's ModelRoutes, svc/auto's
//! choice among its candidates, and the choice among a model's upstreams.

pub mod affinity;
pub mod breaker;
pub mod fallback;
pub mod pricing;

use std::collections::BTreeMap;
use std::sync::Arc;

use crds::config::{
    Affinity, GatewayConfig, KeyGrant, Limits, ModelConfig, Route, TierConfig, Upstream,
};
use rand::Rng;

use crate::conversation::CacheWrites;
pub use affinity::AffinityKey;
pub use pricing::Price;

pub struct Model {
    pub id: String,
    pub config: ModelConfig,
    pub price: Price,
}

impl Model {
    fn upstreams(&self) -> &[Upstream] {
        match &self.config.route {
            Route::Upstreams(upstreams) => upstreams,
            Route::Auto { .. } => &[],
        }
    }

    /// The upstreams one turn tries, in order. With conversation affinity, the
    /// conversation's own order (its home upstream first, see [`affinity`]); otherwise the
    /// first drawn by weight, then the others in the route's order of preference, as
    /// fallbacks. The affinity key is only worked out when the route needs it: not for a
    /// route of one upstream, whose plan is that upstream whatever the conversation (two
    /// SHA-256 digests and a draw saved on every turn of the most common route).
    pub fn plan(&self, affinity_key: impl FnOnce() -> AffinityKey) -> Vec<Upstream> {
        if self.upstreams().len() <= 1 {
            return self.upstreams().to_vec();
        }
        if self.config.affinity == Affinity::Conversation {
            return affinity_key().order(self.upstreams());
        }
        let upstreams = self.upstreams();
        let total: u64 = upstreams.iter().map(|u| u64::from(u.weight)).sum();
        let first = if total == 0 {
            0
        } else {
            let mut draw = rand::rng().random_range(0..total);
            upstreams
                .iter()
                .position(|u| {
                    let w = u64::from(u.weight);
                    if draw < w {
                        true
                    } else {
                        draw -= w;
                        false
                    }
                })
                .unwrap_or(0)
        };
        let mut plan = upstreams.to_vec();
        if first < plan.len() {
            let chosen = plan.remove(first);
            plan.insert(0, chosen);
        }
        plan
    }
}

/// What a request asks of the model that serves it.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    pub input_tokens: u32,
    pub max_tokens: u32,
    /// The window must hold max_tokens beside the input; else the input alone, the turn's
    /// generation then being capped to the rest of the window.
    pub whole_output: bool,
    pub vision: bool,
    pub tools: bool,
    pub thinking: bool,
}

pub struct Catalog {
    pub version: String,
    models: BTreeMap<String, Arc<Model>>,
    tiers: BTreeMap<String, TierConfig>,
    grants: BTreeMap<String, KeyGrant>,
}

impl Catalog {
    pub fn new(config: GatewayConfig, credits_per_usd: u64) -> Self {
        let models = config
            .models
            .into_iter()
            .map(|(id, config)| {
                let price = Price::new(config.pricing, credits_per_usd);
                (id.clone(), Arc::new(Model { id, config, price }))
            })
            .collect();
        Self {
            version: config.version,
            models,
            tiers: config.tiers,
            grants: config.keys,
        }
    }

    pub fn model(&self, id: &str) -> Option<&Arc<Model>> {
        self.models.get(id)
    }

    pub fn models(&self) -> impl Iterator<Item = &Arc<Model>> {
        self.models.values()
    }

    pub fn tier_limits(&self, tier: &str) -> Option<Limits> {
        self.tiers.get(tier).map(|t| t.limits)
    }

    pub fn tiers(&self) -> impl Iterator<Item = (&String, &TierConfig)> {
        self.tiers.iter()
    }

    pub fn grant(&self, key_id: &str) -> Option<&KeyGrant> {
        self.grants.get(key_id)
    }

    pub fn grants(&self) -> impl Iterator<Item = (&String, &KeyGrant)> {
        self.grants.iter()
    }

    /// The model that serves a turn: the requested one, or for an auto route the cheapest
    /// candidate (by this turn's ceiling) that has the capabilities and room it needs.
    /// Thinking is a preference, never a reason to refuse: when no candidate with thinking
    /// fits, the cheapest that fits otherwise serves the turn without it. Room for the whole
    /// max_tokens beside the input is a preference too: when no candidate has it, the cheapest
    /// whose window holds the input serves the turn, its generation capped to the rest.
    pub fn serving_model(&self, requested: &Arc<Model>, needs: &Needs) -> Option<Arc<Model>> {
        let Route::Auto { candidates } = &requested.config.route else {
            return Some(requested.clone());
        };
        let cheapest = |needs: &Needs| {
            candidates
                .iter()
                .filter_map(|id| self.models.get(id))
                .filter(|m| fits(&m.config, needs))
                .min_by_key(|m| {
                    m.price
                        .ceiling(needs.input_tokens, needs.max_tokens, CacheWrites::None)
                })
                .cloned()
        };
        let without_thinking = |needs: Needs| Needs {
            thinking: false,
            ..needs
        };
        let capped = |needs: Needs| Needs {
            whole_output: false,
            ..needs
        };
        [
            *needs,
            without_thinking(*needs),
            capped(*needs),
            capped(without_thinking(*needs)),
        ]
        .iter()
        .find_map(cheapest)
    }
}

fn fits(model: &ModelConfig, needs: &Needs) -> bool {
    let caps = model.capabilities;
    (caps.vision || !needs.vision)
        && (caps.tools || !needs.tools)
        && (caps.thinking || !needs.thinking)
        && needs.max_tokens <= model.max_output_tokens
        && if needs.whole_output {
            u64::from(needs.input_tokens) + u64::from(needs.max_tokens)
                <= u64::from(model.context_window)
        } else {
            needs.input_tokens < model.context_window
        }
}

#[cfg(test)]
mod tests {
    use crds::config::{Capabilities, Pricing, ProviderKind, Timeouts};

    use super::*;

    fn upstream(name: &str, weight: u32) -> Upstream {
        Upstream {
            name: name.into(),
            provider: ProviderKind::Simulated,
            model: name.into(),
            base_url: None,
            api_version: None,
            region: None,
            aws_credentials: None,
            project: None,
            google_credentials: None,
            api_key: None,
            weight,
            timeouts: Timeouts::default(),
            http2: false,
            chunk_delay_ms: 0,
        }
    }

    fn model(capabilities: Capabilities, input_micros: u64, route: Route) -> ModelConfig {
        ModelConfig {
            display_name: "Test".into(),
            context_window: 10_000,
            max_output_tokens: 4_000,
            capabilities,
            pricing: Pricing {
                input_micros_per_mtok: input_micros,
                output_micros_per_mtok: input_micros * 5,
                ..Pricing::default()
            },
            route,
            affinity: Affinity::None,
            batch_price_per_million: None,
        }
    }

    const PLAIN: Capabilities = Capabilities {
        thinking: false,
        vision: false,
        tools: true,
        embeddings: false,
    };
    const THINKING: Capabilities = Capabilities {
        thinking: true,
        vision: true,
        tools: true,
        embeddings: false,
    };

    /// `svc/auto` over a cheap plain model and a dearer one with thinking and vision.
    fn catalog() -> Catalog {
        catalog_with_deep_output(4_000)
    }

    fn catalog_with_deep_output(max_output_tokens: u32) -> Catalog {
        let direct = || Route::Upstreams(vec![upstream("u", 1)]);
        let deep = ModelConfig {
            max_output_tokens,
            ..model(THINKING, 15_000_000, direct())
        };
        let auto = Route::Auto {
            candidates: vec!["cheap".into(), "deep".into()],
        };
        let config = GatewayConfig {
            models: [
                ("cheap".to_owned(), model(PLAIN, 1_000_000, direct())),
                ("deep".to_owned(), deep),
                ("svc/auto".to_owned(), model(THINKING, 0, auto)),
            ]
            .into(),
            ..GatewayConfig::default()
        };
        Catalog::new(config, 1_000)
    }

    fn needs() -> Needs {
        Needs {
            input_tokens: 100,
            max_tokens: 100,
            whole_output: true,
            vision: false,
            tools: false,
            thinking: false,
        }
    }

    fn served(catalog: &Catalog, needs: Needs) -> Option<String> {
        let auto = catalog.model("svc/auto").expect("svc/auto");
        catalog.serving_model(auto, &needs).map(|m| m.id.clone())
    }

    #[test]
    fn a_route_of_one_upstream_plans_it_without_working_out_the_conversation() {
        let one = ModelConfig {
            affinity: Affinity::Conversation,
            batch_price_per_million: None,
            ..model(PLAIN, 1_000_000, Route::Upstreams(vec![upstream("u", 1)]))
        };
        let config = GatewayConfig {
            models: [("one".to_owned(), one)].into(),
            ..GatewayConfig::default()
        };
        let catalog = Catalog::new(config, 1_000);
        let one = catalog.model("one").expect("one");
        let plan = one.plan(|| panic!("the affinity key was worked out"));
        assert_eq!(plan, vec![upstream("u", 1)]);
    }

    #[test]
    fn a_direct_model_serves_its_own_turns() {
        let catalog = catalog();
        let cheap = catalog.model("cheap").expect("cheap");
        let served = catalog.serving_model(cheap, &needs()).expect("served");
        assert_eq!(served.id, "cheap");
    }

    #[test]
    fn auto_picks_the_cheapest_candidate_that_has_what_the_turn_needs() {
        let catalog = catalog();
        assert_eq!(served(&catalog, needs()).as_deref(), Some("cheap"));
        let images = Needs {
            vision: true,
            ..needs()
        };
        assert_eq!(served(&catalog, images).as_deref(), Some("deep"));
    }

    #[test]
    fn thinking_is_a_preference_never_a_reason_to_refuse() {
        let catalog = catalog();
        let thinking = Needs {
            thinking: true,
            ..needs()
        };
        assert_eq!(served(&catalog, thinking).as_deref(), Some("deep"));
        // Thinking and more output than the thinking model allows: the plain model serves it.
        let plain_only = catalog_with_deep_output(50);
        assert_eq!(served(&plain_only, thinking).as_deref(), Some("cheap"));
    }

    #[test]
    fn auto_refuses_an_input_no_candidates_window_holds() {
        let catalog = catalog();
        let too_long = Needs {
            input_tokens: 10_000,
            ..needs()
        };
        assert_eq!(served(&catalog, too_long), None);
    }

    #[test]
    fn auto_serves_an_input_its_windows_hold_without_room_for_max_tokens_capped() {
        let catalog = catalog();
        let no_room = Needs {
            input_tokens: 9_950,
            ..needs()
        };
        assert_eq!(served(&catalog, no_room).as_deref(), Some("cheap"));
    }

    #[test]
    fn auto_prefers_a_candidate_with_room_for_the_whole_max_tokens() {
        let direct = || Route::Upstreams(vec![upstream("u", 1)]);
        let small = ModelConfig {
            context_window: 1_000,
            max_output_tokens: 1_000,
            ..model(PLAIN, 1_000_000, direct())
        };
        let auto = Route::Auto {
            candidates: vec!["cheap".into(), "deep".into()],
        };
        let config = GatewayConfig {
            models: [
                ("cheap".to_owned(), small),
                ("deep".to_owned(), model(THINKING, 15_000_000, direct())),
                ("svc/auto".to_owned(), model(THINKING, 0, auto)),
            ]
            .into(),
            ..GatewayConfig::default()
        };
        let catalog = Catalog::new(config, 1_000);
        let long = Needs {
            input_tokens: 950,
            ..needs()
        };
        assert_eq!(served(&catalog, long).as_deref(), Some("deep"));
        let longer = Needs {
            input_tokens: 9_950,
            ..needs()
        };
        assert_eq!(served(&catalog, longer).as_deref(), Some("deep"));
    }

    #[test]
    fn without_affinity_the_first_upstream_is_drawn_by_weight_and_the_rest_follow_as_fallbacks() {
        let route = Route::Upstreams(vec![
            upstream("never", 0),
            upstream("always", 5),
            upstream("last", 0),
        ]);
        let model = Model {
            id: "m".into(),
            price: Price::new(Pricing::default(), 1_000),
            config: model(PLAIN, 0, route),
        };
        for _ in 0..20 {
            let plan = model.plan(|| unreachable!("no affinity key without affinity"));
            let names: Vec<&str> = plan.iter().map(|u| u.name.as_str()).collect();
            assert_eq!(names, ["always", "never", "last"]);
        }
    }
}
