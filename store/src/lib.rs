//! Where money and accounts are kept: the Postgres connection and its migrations, accounts and
//! their keys, the credit ledger, the dashboard's users, each a trait with an in-process and a
//! Postgres implementation. The gateway, the operator (its promotion sweep), the end-to-end
//! tests and the benchmarks all use this crate; it knows nothing of HTTP.

pub mod accounts;
pub mod audit;
pub mod batches;
pub mod db;
pub mod developers;
pub mod files;
pub mod ids;
pub mod ledger;
pub mod metrics;
pub mod usage;
