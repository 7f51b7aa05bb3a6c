//! The dashboard's start-up settings, apart from its handlers so the shared state can hold
//! them without depending on the pages.

/// Start-up settings of the dashboard.
#[derive(Clone, Copy, Debug, Default)]
pub struct DashboardConfig {
    /// Mark cookies `Secure` on every request, not only those a proxy says came over https.
    pub secure_cookies: bool,
    /// apiCredits a new account starts with.
    pub signup_credits: u64,
}
