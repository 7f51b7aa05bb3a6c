//! The HTTP edge's layers: what every request of a surface goes through before and after its
//! handler (authentication, the early request count, the rate-limit headers, request
//! telemetry), the bounded body reader every surface's bodies go through and the memory
//! budget it draws on, the JSON and path extractors, and the payment webhooks. Handlers live
//! with their surface (`api`, `dashboard`, `admin`).

pub mod authenticate;
pub mod body;
pub mod body_reader;
pub mod budget;
pub mod path;
pub mod pre_admission;
pub mod rate_limit_headers;
pub mod request_telemetry;
pub mod webhooks;
