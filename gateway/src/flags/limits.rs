//! Limits beyond a key's own: what cluster mode does while Redis is away, and the per-address
//! brakes on guessing keys and on the dashboard's sign-ins and sign-ups.

use clap::Args;

use gateway_core::limits::OutagePolicy;

/// `serve` only: standalone keeps its limits in process and has no outage.
#[derive(Debug, Args)]
pub struct OutageArgs {
    /// While Redis is unreachable: refuse with 503, or limit each pod locally.
    #[arg(
        long,
        env = "GATEWAY_REDIS_OUTAGE",
        value_enum,
        default_value = "fail-closed"
    )]
    pub redis_outage: OutagePolicy,
    /// Gateway pods sharing the limits; failing open, each pod takes this share of them.
    #[arg(long, env = "GATEWAY_PODS", default_value_t = 1)]
    pub pods: u32,
}

#[derive(Debug, Args)]
pub struct AddressBrakeArgs {
    /// `/v1` requests without a valid API key accepted per client address and minute (a
    /// key-guessing brake); past it, every `/v1` request from the address gets 429 until the
    /// minute ends.
    #[arg(long, env = "GATEWAY_UNAUTHENTICATED_PER_MINUTE", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub unauthenticated_per_minute: u32,
    /// Dashboard sign-in attempts accepted per client address and minute, whatever the email.
    #[arg(long, env = "GATEWAY_SIGN_INS_PER_MINUTE", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sign_ins_per_minute: u32,
    /// Dashboard sign-ups accepted per client address and minute: each one creates an account
    /// and grants it the sign-up credits, so a script must not mint them at will.
    #[arg(long, env = "GATEWAY_SIGN_UPS_PER_MINUTE", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub sign_ups_per_minute: u32,
}
