//! The HTTP edge's layers: what every request of a surface goes through before and after its
//! handler (authentication, the early request count, the rate-limit headers, request
//! telemetry), and the payment webhooks. Handlers live with their surface (`api`, `dashboard`,
//! `admin`).

pub mod auth;
mod client_address;
pub mod pre_admission;
pub mod rate_limit_headers;
pub mod request_telemetry;
pub mod webhooks;
