//! What standalone says loudly at start when it is set up in a way only fit for trying it
//! out: the example key everyone can read in this repository works on it, or the test payment
//! provider (which confirms any top-up at once) answers on an address other machines reach.

use std::net::SocketAddr;

use crds::config::GatewayConfig;

use crate::manifests::BUILT_IN;

/// Ids of the keys `config` seeds with a secret printed in the example manifests.
pub fn public_example_keys(config: &GatewayConfig) -> Vec<&str> {
    config
        .keys
        .iter()
        .filter_map(|(id, grant)| {
            let seed = grant.seed.as_ref()?;
            let secret = seed.secret.expose();
            let printed = BUILT_IN.iter().any(|(_, text)| text.contains(secret));
            (secret.len() >= 16 && printed).then_some(id.as_str())
        })
        .collect()
}

/// Logs a warning for each risky choice of a standalone process (`stripe`: Stripe takes the
/// test payment provider's place).
pub fn standalone(config: &GatewayConfig, listen: SocketAddr, stripe: bool) {
    for id in public_example_keys(config) {
        tracing::warn!(
            key_id = id,
            "WARNING: seeding the public example key `{id}` (its secret is printed in \
             the built-in example set and deploy/standalone/apikeys.yaml): anyone can use \
             it; use your own manifests (--manifests) outside a trial"
        );
    }
    if !stripe && !listen.ip().is_loopback() {
        tracing::warn!(
            %listen,
            "WARNING: standalone's test payment provider confirms every checkout at once, and \
             it is reachable on {listen}, not only on loopback: anyone who can reach it can \
             top up any account for free; run `gateway serve` for real payments"
        );
    }
}
