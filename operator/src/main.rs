//! The operator binary. For now it only compiles a manifest folder, so a configuration can be
//! checked (in CI, or before `kubectl apply`) with exactly the validation the gateway uses.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use crds::config::{GatewayConfig, Route, Secret};

#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a folder of Tier, ModelRoute, ApiKey and Secret manifests and print the
    /// resulting GatewayConfig as YAML.
    Compile {
        /// Folder of *.yaml / *.yml manifests (not recursive).
        #[arg(long, value_name = "DIR")]
        manifests: PathBuf,
        /// Print secret values instead of `<redacted>`.
        #[arg(long)]
        show_secrets: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Compile {
            manifests,
            show_secrets,
        } => {
            let mut config = crds::manifests::load_dir(&manifests)?;
            if !show_secrets {
                redact(&mut config);
            }
            let yaml = serde_yaml::to_string(&config).context("cannot print the configuration")?;
            print!("{yaml}");
        }
    }
    Ok(())
}

/// Output of this command ends up in terminals, CI logs and bug reports, where upstream API
/// keys and seeded key secrets must not. The version is left as is: it identifies the real
/// configuration.
fn redact(config: &mut GatewayConfig) {
    let redacted = || Secret("<redacted>".to_owned());
    for model in config.models.values_mut() {
        if let Route::Upstreams(upstreams) = &mut model.route {
            for upstream in upstreams {
                if let Some(key) = &mut upstream.api_key {
                    *key = redacted();
                }
            }
        }
    }
    for grant in config.keys.values_mut() {
        if let Some(seed) = &mut grant.seed {
            seed.secret = redacted();
        }
    }
}
