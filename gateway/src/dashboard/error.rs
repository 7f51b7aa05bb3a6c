//! Why a dashboard page could not be served; `error/mod.rs` renders each one for the page
//! (the dashboard's own files name it, the edge's error module maps it).

use thiserror::Error;

use crate::edge::body_reader::BodyError;
use gateway_core::limits::LimitError;
use gateway_core::usage_report::UsageError;
use store::accounts::StoreError;
use store::ledger::LedgerError;

#[derive(Debug, Error)]
pub enum DashboardError {
    #[error(
        "this form has expired or did not come from this dashboard; reload the page and try again"
    )]
    Csrf,
    #[error("the form could not be read; reload the page and try again")]
    BadForm,
    /// Postgres keeps no U+0000 in text: refused before any store is asked (it read as an
    /// outage, a 503, when the store refused it).
    #[error("a field holds U+0000 (NUL), which cannot be kept; remove it and try again")]
    NulInForm,
    /// Too large, too slow, or past the memory budget.
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error("no such page")]
    NotFound,
    #[error("password hashing failed")]
    PasswordHash,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A usage range the `/v1` API would refuse the same way.
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// The client address brake could not count the attempt.
    #[error(transparent)]
    Limit(#[from] LimitError),
}
