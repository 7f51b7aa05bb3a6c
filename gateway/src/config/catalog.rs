//! Where the models, tiers and keys come from in both modes: a folder of manifests (`serve`
//! may follow the operator's Secret instead, `--config-secret`).

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct CatalogArgs {
    /// Folder of Tier, ModelRoute, ApiKey and Secret manifests.
    #[arg(
        long,
        alias = "config",
        env = "GATEWAY_MANIFESTS",
        default_value = "deploy/standalone"
    )]
    pub manifests: PathBuf,
    /// Delay between streamed chunks of every simulated upstream, overriding the manifests.
    #[arg(long, env = "GATEWAY_SIMULATED_CHUNK_DELAY_MS")]
    pub simulated_chunk_delay_ms: Option<u64>,
}
