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
    /// fallbacks. The affinity key is only worked out when the route needs it.
    pub fn plan(&self, affinity_key: impl FnOnce() -> AffinityKey) -> Vec<Upstream> {
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
    /// fits, the cheapest that fits otherwise serves the turn without it.
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
        cheapest(needs).or_else(|| {
            let without_thinking = Needs {
                thinking: false,
                ..*needs
            };
            needs
                .thinking
                .then(|| cheapest(&without_thinking))
                .flatten()
        })
    }
}

fn fits(model: &ModelConfig, needs: &Needs) -> bool {
    let caps = model.capabilities;
    (caps.vision || !needs.vision)
        && (caps.tools || !needs.tools)
        && (caps.thinking || !needs.thinking)
        && needs.max_tokens <= model.max_output_tokens
        && u64::from(needs.input_tokens) + u64::from(needs.max_tokens)
            <= u64::from(model.context_window)
}
