//! The gateway below its HTTP surfaces: one model turn and everything it calls (auth, limits,
//! routing, providers, the ledger through `store`), the conversation and the wire formats,
//! payments, the stored responses, telemetry. It knows no axum, hyper server, maud or
//! tower-http: the `gateway` crate holds the HTTP surfaces and the process, and maps this
//! crate's typed errors to the spec's envelope (docs/architecture.md).

pub mod auth;
pub mod conversation;
pub mod cpu;
pub mod ids;
pub mod ledger_export;
pub mod limits;
pub mod payments;
pub mod providers;
pub mod reaper;
pub mod responses_store;
pub mod routing;
pub mod seal;
pub mod shutdown;
pub mod telemetry;
pub mod tokens;
pub mod turn;
pub mod usage_report;
pub mod validate;
pub mod wire;
