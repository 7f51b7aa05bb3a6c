//! The gateway's custom resources, their validation, and the compiled [`config::GatewayConfig`]
//! that the operator publishes and gateways consume.

pub mod compile;
pub mod config;
pub mod manifests;
pub mod resources;
