//! Where the models, tiers and keys come from in both modes: a folder of manifests (`serve`
//! may follow the operator's Secret instead, `--config-secret`).

use std::path::PathBuf;

use clap::Args;

use super::published::SecretRef;

#[derive(Debug, Args)]
pub struct CatalogArgs {
    /// Folder of Tier, ModelRoute, ApiKey and Secret manifests. Without it, standalone runs
    /// the example set built into the binary (`--print-manifests DIR` writes it out); `serve`
    /// needs it or `--config-secret`.
    #[arg(long, alias = "config", env = "GATEWAY_MANIFESTS")]
    pub manifests: Option<PathBuf>,
    /// Delay between streamed chunks of every simulated upstream, overriding the manifests.
    #[arg(long, env = "GATEWAY_SIMULATED_CHUNK_DELAY_MS")]
    pub simulated_chunk_delay_ms: Option<u64>,
}

/// `serve` only: where the operator publishes the config, followed instead of `--manifests`.
#[derive(Debug, Args)]
pub struct PublishedArgs {
    /// `NAMESPACE/NAME` of the Secret the operator publishes the config in, followed through
    /// the Kubernetes API (KUBECONFIG or the pod's service account) instead of `--manifests`.
    #[arg(long, env = "GATEWAY_CONFIG_SECRET")]
    pub config_secret: Option<SecretRef>,
}
