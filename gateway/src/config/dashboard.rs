//! The dashboard's settings.

use clap::Args;

use crate::dashboard::DashboardConfig;

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Mark dashboard cookies `Secure` on every request (behind TLS). Without it they are
    /// `Secure` only when `X-Forwarded-Proto: https` says the request came over TLS.
    #[arg(long, env = "GATEWAY_DASHBOARD_SECURE_COOKIES")]
    pub dashboard_secure_cookies: bool,
    /// apiCredits granted to each account signed up in the dashboard (a trial; not a top-up,
    /// so it does not count towards tiers).
    #[arg(long, env = "GATEWAY_SIGNUP_CREDITS", default_value_t = 0)]
    pub signup_credits: u64,
}

impl From<&DashboardArgs> for DashboardConfig {
    fn from(args: &DashboardArgs) -> Self {
        Self {
            secure_cookies: args.dashboard_secure_cookies,
            signup_credits: args.signup_credits,
        }
    }
}
