//! The gateway's HTTP surfaces and process: the `/v1` API, the dashboard, the admin API, the
//! layers every request passes, the error envelope, the flags, start-up and shutdown. What a
//! turn does below them is `gateway_core`'s. The `gateway` binary (`main.rs`) only parses the
//! command line.

pub mod admin;
pub mod api;
pub mod cli;
pub mod client_address;
pub mod dashboard;
pub mod edge;
pub mod error;
pub mod flags;
pub mod manifests;
pub mod serve;
pub mod startup;
pub mod state;
pub mod version;
