//! The developer dashboard's own records: users (one per account), their sessions, failed
//! sign-ins for throttling, and checkouts started from the billing page. A trait so that the
//! Postgres store of cluster mode can take the in-process one's place; handlers never know
//! which. The pages are the gateway's `dashboard/`.

mod postgres;

pub use postgres::PostgresDeveloperStore;

use async_trait::async_trait;
use dashmap::DashMap;
use time::{Duration, OffsetDateTime};

use crate::accounts::KeyHash;
use crate::accounts::StoreError;

#[derive(Clone, Debug)]
pub struct User {
    pub id: String,
    /// Trimmed and lower-cased.
    pub email: String,
    /// Argon2id, PHC string format.
    pub password_hash: String,
    pub account_id: String,
    pub created_at: OffsetDateTime,
}

#[derive(Clone, Debug)]
pub struct Session {
    /// SHA-256 of the cookie's token; the token itself is never stored.
    pub token_hash: KeyHash,
    pub user_id: String,
    pub email: String,
    pub account_id: String,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    pub expires_at: OffsetDateTime,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckoutStatus {
    /// Sent to the payment provider; no confirmation yet.
    Pending,
    /// The provider refused or the checkout could not start.
    Failed,
}

/// A top-up started from the billing page; once confirmed it is the ledger's top-up of the
/// same reference.
#[derive(Clone, Debug)]
pub struct Checkout {
    pub reference: String,
    pub account_id: String,
    pub usd_cents: u64,
    pub status: CheckoutStatus,
    pub created_at: OffsetDateTime,
}

#[async_trait]
pub trait DeveloperStore: Send + Sync {
    /// Stores a new user; `false` when the email is taken.
    async fn insert_user(&self, user: User) -> Result<bool, StoreError>;
    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError>;
    async fn insert_session(&self, session: Session) -> Result<(), StoreError>;
    /// The session of this token hash, if it has not expired.
    async fn session(&self, token_hash: &KeyHash) -> Result<Option<Session>, StoreError>;
    async fn delete_session(&self, token_hash: &KeyHash) -> Result<(), StoreError>;
    /// Counts a failed sign-in for the email; returns the failures within `window`.
    async fn record_sign_in_failure(
        &self,
        email: &str,
        window: Duration,
    ) -> Result<u32, StoreError>;
    /// Failures within the window, and when the window ends.
    async fn sign_in_failures(
        &self,
        email: &str,
    ) -> Result<Option<(u32, OffsetDateTime)>, StoreError>;
    async fn clear_sign_in_failures(&self, email: &str) -> Result<(), StoreError>;
    async fn insert_checkout(&self, checkout: Checkout) -> Result<(), StoreError>;
    async fn set_checkout_status(
        &self,
        reference: &str,
        status: CheckoutStatus,
    ) -> Result<(), StoreError>;
    /// The account's checkouts, newest first.
    async fn checkouts(&self, account_id: &str) -> Result<Vec<Checkout>, StoreError>;
}

#[derive(Default)]
pub struct MemoryDeveloperStore {
    users: DashMap<String, User>,
    sessions: DashMap<KeyHash, Session>,
    failures: DashMap<String, (u32, OffsetDateTime)>,
    checkouts: DashMap<String, Checkout>,
}

#[async_trait]
impl DeveloperStore for MemoryDeveloperStore {
    async fn insert_user(&self, user: User) -> Result<bool, StoreError> {
        match self.users.entry(user.email.clone()) {
            dashmap::Entry::Occupied(_) => Ok(false),
            dashmap::Entry::Vacant(slot) => {
                slot.insert(user);
                Ok(true)
            }
        }
    }

    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        Ok(self.users.get(email).map(|u| u.clone()))
    }

    async fn insert_session(&self, session: Session) -> Result<(), StoreError> {
        self.sessions.insert(session.token_hash, session);
        Ok(())
    }

    async fn session(&self, token_hash: &KeyHash) -> Result<Option<Session>, StoreError> {
        let now = OffsetDateTime::now_utc();
        let session = self.sessions.get(token_hash).map(|s| s.clone());
        match session {
            Some(s) if s.expires_at > now => Ok(Some(s)),
            Some(_) => {
                self.sessions.remove(token_hash);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn delete_session(&self, token_hash: &KeyHash) -> Result<(), StoreError> {
        self.sessions.remove(token_hash);
        Ok(())
    }

    async fn record_sign_in_failure(
        &self,
        email: &str,
        window: Duration,
    ) -> Result<u32, StoreError> {
        let now = OffsetDateTime::now_utc();
        let mut entry = self
            .failures
            .entry(email.to_owned())
            .or_insert((0, now + window));
        if entry.1 <= now {
            *entry = (0, now + window);
        }
        entry.0 += 1;
        Ok(entry.0)
    }

    async fn sign_in_failures(
        &self,
        email: &str,
    ) -> Result<Option<(u32, OffsetDateTime)>, StoreError> {
        let now = OffsetDateTime::now_utc();
        Ok(self
            .failures
            .get(email)
            .map(|f| *f)
            .filter(|(_, ends)| *ends > now))
    }

    async fn clear_sign_in_failures(&self, email: &str) -> Result<(), StoreError> {
        self.failures.remove(email);
        Ok(())
    }

    async fn insert_checkout(&self, checkout: Checkout) -> Result<(), StoreError> {
        self.checkouts.insert(checkout.reference.clone(), checkout);
        Ok(())
    }

    async fn set_checkout_status(
        &self,
        reference: &str,
        status: CheckoutStatus,
    ) -> Result<(), StoreError> {
        if let Some(mut checkout) = self.checkouts.get_mut(reference) {
            checkout.status = status;
        }
        Ok(())
    }

    async fn checkouts(&self, account_id: &str) -> Result<Vec<Checkout>, StoreError> {
        let mut checkouts: Vec<Checkout> = self
            .checkouts
            .iter()
            .filter(|c| c.account_id == account_id)
            .map(|c| c.clone())
            .collect();
        checkouts.sort_by_key(|x| std::cmp::Reverse(x.created_at));
        Ok(checkouts)
    }
}
