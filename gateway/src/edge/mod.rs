//! The HTTP edge's layers: what every request of a surface goes through before and after its
//! handler (authentication, the early request count, the rate-limit headers, request
//! telemetry), the bounded body reader every surface's JSON goes through, and the payment
//! webhooks. Handlers live with their surface (`api`, `dashboard`,
//! `admin`).

pub mod auth;
pub mod body;
mod client_address;
pub mod pre_admission;
pub mod rate_limit_headers;
pub mod request_telemetry;
pub mod webhooks;
