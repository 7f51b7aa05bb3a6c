//! The gateway: the `/v1` API, auth, rate limits, credits, providers. The `gateway` binary
//! (`main.rs`) only parses the command line; benchmarks use the modules directly.

pub mod admin;
pub mod api;
pub mod auth;
pub mod cli;
pub mod client_address;
pub mod config;
pub mod conversation;
pub mod cpu;
pub mod dashboard;
pub mod edge;
pub mod error;
pub mod ids;
pub mod limits;
pub mod payments;
pub mod providers;
pub mod reaper;
pub mod responses_store;
pub mod routing;
pub mod seal;
pub mod serve;
pub mod shutdown;
pub mod startup;
pub mod state;
pub mod telemetry;
pub mod tokens;
pub mod turn;
pub mod usage_report;
pub mod validate;
pub mod version;
pub mod wire;
