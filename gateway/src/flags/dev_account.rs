//! The development account a gateway seeds at start: its key, credits and tier.

use clap::Args;

use super::secrets::DEV_KEY;

#[derive(Debug, Args)]
pub struct DevAccountArgs {
    /// The development API key to create (`sk-svc-` and at least 20 characters); without it,
    /// `standalone` makes a random one and shows it once on the ready line, and `serve` creates
    /// no dev account.
    #[arg(long, env = "GATEWAY_DEV_KEY", hide_env_values = true, value_parser = DEV_KEY)]
    pub dev_key: Option<String>,
    /// A confirmed top-up of the development account, in US dollars (0: none), as if it had
    /// paid: its key starts at the tier that top-up gives (the default, $10, gives
    /// pay_as_you_go). Confirmed once, however often the gateway starts.
    #[arg(long, env = "GATEWAY_DEV_TOP_UP_USD", default_value = "10")]
    pub dev_top_up_usd: String,
    /// Grants the development key the enterprise tier instead.
    #[arg(long, env = "GATEWAY_DEV_ENTERPRISE")]
    pub dev_enterprise: bool,
    /// apiCredits of the development account.
    #[arg(long, env = "GATEWAY_DEV_CREDITS", default_value_t = 10_000_000)]
    pub dev_credits: u64,
}
