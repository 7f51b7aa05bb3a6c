//! The developer dashboard's own records: users (one per account), the links that verify
//! their emails, their sessions (each start audited as a sign-in), failed sign-ins for throttling, and checkouts started from the billing page. A trait so that the
//! Postgres store of cluster mode can take the in-process one's place; handlers never know
//! which. The pages are the gateway's `dashboard/`.

mod organizations;
mod postgres;
mod sso;

pub use organizations::{
    Acceptance, Invitation, InvitationLimit, InvitationLimits, MemberChange, Permission, Refusal,
    Role, ROLES,
};
pub use postgres::PostgresDeveloperStore;
pub use sso::{domain_of, lapses, DomainClaim, DomainProof, Proving, Recheck};

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dashmap::DashMap;
use serde_json::Value;
use subtle::ConstantTimeEq;
use time::{Duration, OffsetDateTime};

use crate::accounts::KeyHash;
use crate::accounts::StoreError;
use crate::audit::{Action, Actor, ActorKind, AuditEntry, MemoryAuditLog};

#[derive(Clone, Debug)]
pub struct User {
    pub id: String,
    /// Trimmed and lower-cased.
    pub email: String,
    /// Argon2id, PHC string format.
    pub password_hash: String,
    pub account_id: String,
    pub created_at: OffsetDateTime,
    /// When a link sent to the email was followed; until then the account takes no keys and
    /// no credits from anyone.
    pub email_verified_at: Option<OffsetDateTime>,
    /// In the organization that owns `account_id`: a sign-up makes its account's owner.
    pub role: Role,
}

/// A link sent to a user's email: following it verifies the email and sets the password of
/// the sign-up that asked for it.
#[derive(Clone, Debug)]
pub struct EmailVerification {
    /// SHA-256 of the link's token; the token itself is never stored.
    pub token_hash: KeyHash,
    pub user_id: String,
    /// Argon2id of the password chosen with this sign-up.
    pub password_hash: String,
    pub expires_at: OffsetDateTime,
}

/// How a user signed in, as the audit rows of sign-ins name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignInMethod {
    Password,
    /// Through the OpenID Connect provider.
    Sso,
}

#[derive(Clone, Debug)]
pub struct Session {
    /// SHA-256 of the cookie's token; the token itself is never stored.
    pub token_hash: KeyHash,
    pub user_id: String,
    pub email: String,
    pub account_id: String,
    /// The user's role; a change of it ends the user's sessions, so it holds for the session.
    pub role: Role,
    /// Whether the user's email was verified when the session started (verifying ends every
    /// session of the user, so it cannot change during one).
    pub email_verified: bool,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    /// The absolute end: the session's start plus its longest lifetime, however busy.
    pub expires_at: OffsetDateTime,
    /// When a request last used it, to within [`touch_after`] of its idle lifetime.
    pub last_used_at: OffsetDateTime,
}

/// What a looked-up session is at `now`, given its idle lifetime.
#[derive(Debug, PartialEq, Eq)]
enum Standing {
    /// Past its absolute end or unused for its idle lifetime: refused and deleted.
    Ended,
    /// Alive, and its stored last use old enough to be written again.
    Touch,
    Alive,
}

/// How stale the stored last use may grow before a request writes it again: a minute, or a
/// quarter of the idle lifetime when that is shorter, so a page view does not cost a write
/// each time and a busy session never looks idle.
pub fn touch_after(idle: Duration) -> Duration {
    (idle / 4_i32).min(Duration::minutes(1))
}

fn standing(session: &Session, idle: Duration, now: OffsetDateTime) -> Standing {
    if session.expires_at <= now || session.last_used_at + idle <= now {
        Standing::Ended
    } else if session.last_used_at + touch_after(idle) <= now {
        Standing::Touch
    } else {
        Standing::Alive
    }
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

/// Whether the account may take keys or credits from the operator: not while it belongs to a
/// dashboard user whose email is unverified, since anyone can sign up with anyone's email.
pub async fn owner_verified(
    developers: &dyn DeveloperStore,
    account_id: &str,
) -> Result<bool, StoreError> {
    Ok(developers
        .user_by_account(account_id)
        .await?
        .is_none_or(|user| user.email_verified_at.is_some()))
}

#[async_trait]
pub trait DeveloperStore: Send + Sync {
    /// Stores a new user, audited as a sign-up by `by`; `false` (and no row) when the email
    /// is taken.
    async fn insert_user(&self, user: User, by: &Actor) -> Result<bool, StoreError>;
    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError>;
    /// The user who owns the account, if it was signed up in the dashboard.
    async fn user_by_account(&self, account_id: &str) -> Result<Option<User>, StoreError>;
    /// Stores a link sent to the user's email (and drops expired ones of anyone).
    async fn insert_email_verification(
        &self,
        verification: EmailVerification,
    ) -> Result<(), StoreError>;
    /// Follows a link, once and before it expires, of a user not verified yet: the user's
    /// email is verified, its password
    /// becomes the link's, and every other link and every session of the user ends (a session
    /// started with another password before must not outlive the proof). The user after, or
    /// `None` for an unknown, used or expired link. Audited as the user's, from `client`
    /// (who followed the link is known only once it is followed).
    async fn verify_email(
        &self,
        token_hash: &KeyHash,
        client: Option<String>,
    ) -> Result<Option<User>, StoreError>;
    /// Starts a session, audited as a sign-in by `method` of `by` (its user, from its client
    /// address).
    async fn insert_session(
        &self,
        session: Session,
        method: SignInMethod,
        by: &Actor,
    ) -> Result<(), StoreError>;
    /// The session of this token hash, if it is before its absolute end and was used within
    /// `idle`; a session past either is deleted. Counts as a use: the stored last use is
    /// written when it is older than [`touch_after`] `idle`.
    async fn session(
        &self,
        token_hash: &KeyHash,
        idle: Duration,
    ) -> Result<Option<Session>, StoreError>;
    /// Deletes a session (and expired ones of anyone, so the table does not grow without
    /// bound) unaudited: the one a browser brought to a new sign-in.
    async fn delete_session(&self, token_hash: &KeyHash) -> Result<(), StoreError>;
    /// Ends `session` at its user's request, audited as signing out by `by`.
    async fn sign_out(&self, session: &Session, by: &Actor) -> Result<(), StoreError>;
    /// Ends every session of `session`'s user, this one included, in one step, audited as
    /// signing out everywhere by `by`. Returns how many ended.
    async fn end_all_sessions(&self, session: &Session, by: &Actor) -> Result<u64, StoreError>;
    /// Counts a failed sign-in for the email from `client` (an address bucket); returns the
    /// failures within `window`. Counted per client, so that nobody else's failures lock the
    /// owner out.
    async fn record_sign_in_failure(
        &self,
        email: &str,
        client: &str,
        window: Duration,
    ) -> Result<u32, StoreError>;
    /// Failures for the email from `client` within the window, and when the window ends.
    async fn sign_in_failures(
        &self,
        email: &str,
        client: &str,
    ) -> Result<Option<(u32, OffsetDateTime)>, StoreError>;
    async fn clear_sign_in_failures(&self, email: &str, client: &str) -> Result<(), StoreError>;
    /// Audits a sign-in to `user`'s account refused for its password, as `by`'s (the email
    /// typed, from its client address). Only an append: every attempt was counted as a
    /// failure before its password was checked. (An unknown email has no account to audit.)
    async fn audit_refused_sign_in(&self, user: &User, by: &Actor) -> Result<(), StoreError>;
    async fn insert_checkout(&self, checkout: Checkout) -> Result<(), StoreError>;
    async fn set_checkout_status(
        &self,
        reference: &str,
        status: CheckoutStatus,
    ) -> Result<(), StoreError>;
    /// The account's checkouts, newest first.
    async fn checkouts(&self, account_id: &str) -> Result<Vec<Checkout>, StoreError>;
    /// The members of the organization that owns the account, oldest first.
    async fn members(&self, account_id: &str) -> Result<Vec<User>, StoreError>;
    /// Stores an invitation (and drops expired ones of anyone), audited as sent by `by`,
    /// unless its organization or its address had `limits` of them sent within the window
    /// already (which one), checked and written at once.
    async fn invite(
        &self,
        invitation: Invitation,
        by: &Actor,
        limits: InvitationLimits,
    ) -> Result<Result<(), InvitationLimit>, StoreError>;
    /// The account's invitations not accepted nor expired, oldest first.
    async fn invitations(&self, account_id: &str) -> Result<Vec<Invitation>, StoreError>;
    /// Accepts an invitation for `user` (as stored now, looked up by id): once, before it
    /// expires, and only for the email it was sent to. The user moves to the invitation's
    /// account in its role, every session of theirs ends, the invitation is spent; audited
    /// as `by`'s.
    async fn accept_invitation(
        &self,
        token_hash: &KeyHash,
        user_id: &str,
        by: &Actor,
    ) -> Result<Acceptance, StoreError>;
    /// Gives the member `user_id` of the account the role `role`, if a member in role
    /// `acting` may and an owner remains; their sessions end. Audited as `by`'s.
    async fn change_role(
        &self,
        account_id: &str,
        user_id: &str,
        role: Role,
        acting: Role,
        by: &Actor,
    ) -> Result<MemberChange, StoreError>;
    /// Removes the member `user_id` from the account's organization (their user and every
    /// session of theirs end), if a member in role `acting` may and an owner remains.
    /// Audited as `by`'s.
    async fn remove_member(
        &self,
        account_id: &str,
        user_id: &str,
        acting: Role,
        by: &Actor,
    ) -> Result<MemberChange, StoreError>;
    /// Withdraws the account's pending invitation of this token hash, if a member in role
    /// `acting` may invite in its role; audited as `by`'s. `false` when there is no such
    /// invitation (spent, expired, another account's) or `acting` may not.
    async fn withdraw_invitation(
        &self,
        account_id: &str,
        token_hash: &KeyHash,
        acting: Role,
        by: &Actor,
    ) -> Result<bool, StoreError>;
    /// Claims (or updates the `require_sso` of) a domain for the claim's organization, audited
    /// as `by`'s: a new claim is pending until proven. `false` (and nothing changed) when
    /// another organization holds a proven claim of the domain.
    async fn claim_domain(&self, claim: DomainClaim, by: &Actor) -> Result<bool, StoreError>;
    /// Releases the account's claim of `domain` (pending or proven), audited as `by`'s:
    /// `false` when the account holds no such claim (another organization's stays).
    async fn release_domain(
        &self,
        account_id: &str,
        domain: &str,
        by: &Actor,
    ) -> Result<bool, StoreError>;
    /// The organization whose claim of the domain is proven, if any: pending claims have no
    /// effect.
    async fn domain_claim(&self, domain: &str) -> Result<Option<DomainClaim>, StoreError>;
    /// The domains the account's organization claimed, pending and proven, by name.
    async fn domain_claims(&self, account_id: &str) -> Result<Vec<DomainClaim>, StoreError>;
    /// Proves the account's pending claim of `domain` by `proof`, audited as `by`'s.
    async fn prove_domain(
        &self,
        account_id: &str,
        domain: &str,
        proof: DomainProof,
        by: &Actor,
    ) -> Result<Proving, StoreError>;
    /// Keeps the hash of a proof link mailed to `to` for the account's pending claim of
    /// `domain` until `expires_at` (a link mailed before stops working): `false` when there is
    /// no such pending claim.
    async fn mail_domain_proof(
        &self,
        account_id: &str,
        domain: &str,
        to: &str,
        token_hash: &KeyHash,
        expires_at: OffsetDateTime,
    ) -> Result<bool, StoreError>;
    /// Proves the pending claim whose link has `token_hash`, once, before its expiry (the
    /// link is spent either way), audited as `by`'s.
    async fn prove_domain_by_mail(
        &self,
        token_hash: &KeyHash,
        now: OffsetDateTime,
        by: &Actor,
    ) -> Result<Proving, StoreError>;
    /// Every claim proven by a TXT record, for the re-check.
    async fn txt_proven_domains(&self) -> Result<Vec<DomainClaim>, StoreError>;
    /// Records a re-check of the account's TXT-proven claim of `domain`: `found` clears a
    /// missing mark; a miss marks it missing since `now`, or lapses it back to pending (audited
    /// as `by`'s) once missing for `grace`.
    async fn recheck_domain(
        &self,
        account_id: &str,
        domain: &str,
        found: bool,
        now: OffsetDateTime,
        grace: Duration,
        by: &Actor,
    ) -> Result<Recheck, StoreError>;
    /// Audits a sign-in to `user`'s account by `method` refused by single sign-on's rules
    /// (`reason` a short name).
    async fn audit_refused_sso(
        &self,
        user: &User,
        method: SignInMethod,
        reason: &str,
        by: &Actor,
    ) -> Result<(), StoreError>;
    /// Remembers a sign-in started at the provider until `expires_at` (and drops expired ones).
    async fn insert_sso_login(
        &self,
        state_hash: &KeyHash,
        expires_at: OffsetDateTime,
    ) -> Result<(), StoreError>;
    /// Ends a sign-in started at the provider: `true` once, before it expires; `false` for an
    /// unknown, spent or expired one.
    async fn take_sso_login(&self, state_hash: &KeyHash) -> Result<bool, StoreError>;
}

// The audit rows of sign-ins, the same from both stores.

/// A session's row.
fn of_session(session: &Session, action: Action, by: &Actor) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: session.account_id.clone(),
        action,
        target: session.email.clone(),
        before: Value::Null,
        after: Value::Null,
    }
}

/// `after` names the method when it is not the password (the rows of password sign-ins
/// predate single sign-on, and keep their shape).
fn signed_in(session: &Session, method: SignInMethod, by: &Actor) -> AuditEntry {
    let entry = of_session(session, Action::SignIn, by);
    match method {
        SignInMethod::Password => entry,
        SignInMethod::Sso => AuditEntry {
            after: serde_json::json!({ "method": method }),
            ..entry
        },
    }
}

fn signed_out(session: &Session, by: &Actor) -> AuditEntry {
    of_session(session, Action::SignedOut, by)
}

/// The rows of a user's sign-up and verification: the user's own, on its account.
fn of_user(user: &User, action: Action, by: Actor) -> AuditEntry {
    AuditEntry {
        actor: by,
        account_id: user.account_id.clone(),
        action,
        target: user.email.clone(),
        before: Value::Null,
        after: Value::Null,
    }
}

fn verified_by(user: &User, client: Option<String>) -> AuditEntry {
    let by = Actor::new(ActorKind::DashboardUser, &user.email, client);
    of_user(user, Action::EmailVerified, by)
}

fn signed_out_everywhere(session: &Session, by: &Actor) -> AuditEntry {
    of_session(session, Action::SignedOutEverywhere, by)
}

fn sign_in_refused(user: &User, by: &Actor) -> AuditEntry {
    AuditEntry {
        actor: by.clone(),
        account_id: user.account_id.clone(),
        action: Action::SignInFailed,
        target: user.email.clone(),
        before: Value::Null,
        after: Value::Null,
    }
}

/// A claim the in-process store holds, with its mailed proof link's hash and expiry.
type HeldClaim = (DomainClaim, Option<(KeyHash, OffsetDateTime)>);

pub struct MemoryDeveloperStore {
    users: DashMap<String, User>,
    verifications: DashMap<KeyHash, EmailVerification>,
    sessions: DashMap<KeyHash, Session>,
    failures: DashMap<(String, String), (u32, OffsetDateTime)>,
    checkouts: DashMap<String, Checkout>,
    invitations: DashMap<KeyHash, Invitation>,
    /// Pending and proven claims with their mailed link's hash and expiry: few, so a list
    /// under one lock (a proof's uniqueness check and its change are one step).
    domains: Mutex<Vec<HeldClaim>>,
    sso_logins: DashMap<KeyHash, OffsetDateTime>,
    /// Held by every change of an organization's members, so that its checks (an owner
    /// remains) and its change are one step.
    organizations: Mutex<()>,
    audit: Arc<MemoryAuditLog>,
}

impl MemoryDeveloperStore {
    /// Audits its sign-ins in `audit` (the in-process ledger's log).
    pub fn new(audit: Arc<MemoryAuditLog>) -> Self {
        Self {
            users: DashMap::new(),
            verifications: DashMap::new(),
            sessions: DashMap::new(),
            failures: DashMap::new(),
            checkouts: DashMap::new(),
            invitations: DashMap::new(),
            domains: Mutex::new(Vec::new()),
            sso_logins: DashMap::new(),
            organizations: Mutex::new(()),
            audit,
        }
    }

    fn roles_of(&self, account_id: &str) -> Vec<(String, Role)> {
        self.users
            .iter()
            .filter(|u| u.account_id == account_id)
            .map(|u| (u.id.clone(), u.role))
            .collect()
    }

    fn user_by_id(&self, user_id: &str) -> Option<User> {
        self.users
            .iter()
            .find(|u| u.id == user_id)
            .map(|u| u.clone())
    }

    /// The member `user_id` of the account, if `to` (`None`: removal) may be done to them by
    /// `acting`; the refusal otherwise.
    fn member_to_change(
        &self,
        account_id: &str,
        user_id: &str,
        to: Option<Role>,
        acting: Role,
    ) -> Result<User, Refusal> {
        let member = self
            .user_by_id(user_id)
            .filter(|u| u.account_id == account_id)
            .ok_or(Refusal::NoSuchMember)?;
        match organizations::refusal(&self.roles_of(account_id), &member, to, acting) {
            Some(refused) => Err(refused),
            None => Ok(member),
        }
    }
}

/// Proves the pending claim of `domain` by `account_id` in `domains` unless another
/// organization's claim of it is proven (both stores keep this rule in one step).
fn prove_held(
    domains: &mut [HeldClaim],
    account_id: &str,
    domain: &str,
    proof: DomainProof,
    audit: &MemoryAuditLog,
    by: &Actor,
) -> Proving {
    if domains
        .iter()
        .any(|(c, _)| c.domain == domain && c.account_id != account_id && c.proof.is_some())
    {
        return Proving::Taken;
    }
    let Some((claim, mail)) = domains
        .iter_mut()
        .find(|(c, _)| c.domain == domain && c.account_id == account_id && c.proof.is_none())
    else {
        return Proving::NoClaim;
    };
    claim.proof = Some(proof);
    claim.missing_since = None;
    claim.mail_to = None;
    *mail = None;
    audit.append(sso::domain_proven(claim, by));
    Proving::Proven(claim.clone())
}

fn lock(mutex: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl DeveloperStore for MemoryDeveloperStore {
    async fn insert_user(&self, user: User, by: &Actor) -> Result<bool, StoreError> {
        match self.users.entry(user.email.clone()) {
            dashmap::Entry::Occupied(_) => Ok(false),
            dashmap::Entry::Vacant(slot) => {
                // The email's entry is held while its row is appended.
                self.audit
                    .append(of_user(&user, Action::SignedUp, by.clone()));
                slot.insert(user);
                Ok(true)
            }
        }
    }

    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        Ok(self.users.get(email).map(|u| u.clone()))
    }

    async fn user_by_account(&self, account_id: &str) -> Result<Option<User>, StoreError> {
        Ok(self
            .users
            .iter()
            .find(|u| u.account_id == account_id)
            .map(|u| u.clone()))
    }

    async fn insert_email_verification(
        &self,
        verification: EmailVerification,
    ) -> Result<(), StoreError> {
        let now = OffsetDateTime::now_utc();
        self.verifications.retain(|_, v| v.expires_at > now);
        self.verifications
            .insert(verification.token_hash, verification);
        Ok(())
    }

    async fn verify_email(
        &self,
        token_hash: &KeyHash,
        client: Option<String>,
    ) -> Result<Option<User>, StoreError> {
        let now = OffsetDateTime::now_utc();
        let Some((_, link)) = self
            .verifications
            .remove_if(token_hash, |_, v| v.expires_at > now)
        else {
            return Ok(None);
        };
        let Some(mut user) = self
            .users
            .iter_mut()
            .find(|u| u.id == link.user_id && u.email_verified_at.is_none())
        else {
            return Ok(None);
        };
        user.password_hash = link.password_hash;
        user.email_verified_at = Some(now);
        let verified = user.clone();
        self.audit.append(verified_by(&verified, client));
        drop(user);
        self.verifications.retain(|_, v| v.user_id != verified.id);
        self.sessions.retain(|_, s| s.user_id != verified.id);
        Ok(Some(verified))
    }

    async fn insert_session(
        &self,
        session: Session,
        method: SignInMethod,
        by: &Actor,
    ) -> Result<(), StoreError> {
        // The session's entry is held while its row is appended.
        let slot = self.sessions.entry(session.token_hash);
        self.audit.append(signed_in(&session, method, by));
        slot.insert(session);
        Ok(())
    }

    async fn session(
        &self,
        token_hash: &KeyHash,
        idle: Duration,
    ) -> Result<Option<Session>, StoreError> {
        let now = OffsetDateTime::now_utc();
        let Some(mut entry) = self.sessions.get_mut(token_hash) else {
            return Ok(None);
        };
        match standing(&entry, idle, now) {
            Standing::Ended => {
                drop(entry);
                self.sessions.remove(token_hash);
                Ok(None)
            }
            Standing::Touch => {
                entry.last_used_at = now;
                Ok(Some(entry.clone()))
            }
            Standing::Alive => Ok(Some(entry.clone())),
        }
    }

    async fn delete_session(&self, token_hash: &KeyHash) -> Result<(), StoreError> {
        self.sessions.remove(token_hash);
        Ok(())
    }

    async fn sign_out(&self, session: &Session, by: &Actor) -> Result<(), StoreError> {
        if self.sessions.remove(&session.token_hash).is_some() {
            self.audit.append(signed_out(session, by));
        }
        Ok(())
    }

    async fn end_all_sessions(&self, session: &Session, by: &Actor) -> Result<u64, StoreError> {
        let mut ended = 0;
        self.sessions.retain(|_, s| {
            let keep = s.user_id != session.user_id;
            ended += u64::from(!keep);
            keep
        });
        self.audit.append(signed_out_everywhere(session, by));
        Ok(ended)
    }

    async fn record_sign_in_failure(
        &self,
        email: &str,
        client: &str,
        window: Duration,
    ) -> Result<u32, StoreError> {
        let now = OffsetDateTime::now_utc();
        let mut entry = self
            .failures
            .entry((email.to_owned(), client.to_owned()))
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
        client: &str,
    ) -> Result<Option<(u32, OffsetDateTime)>, StoreError> {
        let now = OffsetDateTime::now_utc();
        Ok(self
            .failures
            .get(&(email.to_owned(), client.to_owned()))
            .map(|f| *f)
            .filter(|(_, ends)| *ends > now))
    }

    async fn clear_sign_in_failures(&self, email: &str, client: &str) -> Result<(), StoreError> {
        self.failures.remove(&(email.to_owned(), client.to_owned()));
        Ok(())
    }

    async fn audit_refused_sign_in(&self, user: &User, by: &Actor) -> Result<(), StoreError> {
        self.audit.append(sign_in_refused(user, by));
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

    async fn members(&self, account_id: &str) -> Result<Vec<User>, StoreError> {
        let mut members: Vec<User> = self
            .users
            .iter()
            .filter(|u| u.account_id == account_id)
            .map(|u| u.clone())
            .collect();
        members.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(members)
    }

    async fn invite(
        &self,
        invitation: Invitation,
        by: &Actor,
        limits: InvitationLimits,
    ) -> Result<Result<(), InvitationLimit>, StoreError> {
        let _one_at_a_time = self.organizations.lock().unwrap_or_else(|e| e.into_inner());
        let now = OffsetDateTime::now_utc();
        let (organization, address) = self.audit.count_since(now - limits.window, |e| {
            let sent = e.action == Action::InvitationSent;
            (
                sent && e.account_id == invitation.account_id,
                sent && e.target == invitation.email,
            )
        });
        if organization >= limits.per_organization as usize {
            return Ok(Err(InvitationLimit::Organization));
        }
        if address >= limits.per_address as usize {
            return Ok(Err(InvitationLimit::Address));
        }
        self.invitations.retain(|_, i| i.expires_at > now);
        let slot = self.invitations.entry(invitation.token_hash);
        self.audit
            .append(organizations::invitation_sent(&invitation, by));
        slot.insert(invitation);
        Ok(Ok(()))
    }

    async fn invitations(&self, account_id: &str) -> Result<Vec<Invitation>, StoreError> {
        let now = OffsetDateTime::now_utc();
        let mut pending: Vec<Invitation> = self
            .invitations
            .iter()
            .filter(|i| i.account_id == account_id && i.expires_at > now)
            .map(|i| i.clone())
            .collect();
        pending.sort_by_key(|i| i.created_at);
        Ok(pending)
    }

    async fn accept_invitation(
        &self,
        token_hash: &KeyHash,
        user_id: &str,
        by: &Actor,
    ) -> Result<Acceptance, StoreError> {
        let _organizations = lock(&self.organizations);
        let now = OffsetDateTime::now_utc();
        let Some(invitation) = self
            .invitations
            .get(token_hash)
            .filter(|i| i.expires_at > now)
            .map(|i| i.clone())
        else {
            return Ok(Acceptance::Unknown);
        };
        let Some(before) = self.user_by_id(user_id) else {
            return Ok(Acceptance::Unknown);
        };
        if before.email != invitation.email {
            return Ok(Acceptance::WrongEmail);
        }
        if !organizations::may_leave(&self.roles_of(&before.account_id), &before) {
            return Ok(Acceptance::LastOwner);
        }
        self.invitations.remove(token_hash);
        let Some(mut user) = self.users.get_mut(&before.email) else {
            return Ok(Acceptance::Unknown);
        };
        user.account_id = invitation.account_id;
        user.role = invitation.role;
        let after = user.clone();
        self.audit
            .append(organizations::invitation_accepted(&before, &after, by));
        drop(user);
        self.sessions.retain(|_, s| s.user_id != after.id);
        Ok(Acceptance::Accepted(after))
    }

    async fn change_role(
        &self,
        account_id: &str,
        user_id: &str,
        role: Role,
        acting: Role,
        by: &Actor,
    ) -> Result<MemberChange, StoreError> {
        let _organizations = lock(&self.organizations);
        let before = match self.member_to_change(account_id, user_id, Some(role), acting) {
            Ok(member) => member,
            Err(refused) => return Ok(MemberChange::Refused(refused)),
        };
        if let Some(mut user) = self.users.get_mut(&before.email) {
            user.role = role;
            self.audit
                .append(organizations::role_changed(&before, role, by));
        }
        self.sessions.retain(|_, s| s.user_id != before.id);
        Ok(MemberChange::Done(before))
    }

    async fn remove_member(
        &self,
        account_id: &str,
        user_id: &str,
        acting: Role,
        by: &Actor,
    ) -> Result<MemberChange, StoreError> {
        let _organizations = lock(&self.organizations);
        let before = match self.member_to_change(account_id, user_id, None, acting) {
            Ok(member) => member,
            Err(refused) => return Ok(MemberChange::Refused(refused)),
        };
        if self.users.remove(&before.email).is_some() {
            self.audit.append(organizations::removed(&before, by));
        }
        self.sessions.retain(|_, s| s.user_id != before.id);
        self.verifications.retain(|_, v| v.user_id != before.id);
        Ok(MemberChange::Done(before))
    }

    async fn claim_domain(&self, claim: DomainClaim, by: &Actor) -> Result<bool, StoreError> {
        let mut domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        if domains.iter().any(|(held, _)| {
            held.domain == claim.domain
                && held.account_id != claim.account_id
                && held.proof.is_some()
        }) {
            return Ok(false);
        }
        match domains
            .iter_mut()
            .find(|(held, _)| held.domain == claim.domain && held.account_id == claim.account_id)
        {
            Some((held, _)) => {
                held.require_sso = claim.require_sso;
                self.audit.append(sso::domain_claimed(held, by));
            }
            None => {
                self.audit.append(sso::domain_claimed(&claim, by));
                domains.push((claim, None));
            }
        }
        Ok(true)
    }

    async fn release_domain(
        &self,
        account_id: &str,
        domain: &str,
        by: &Actor,
    ) -> Result<bool, StoreError> {
        let mut domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = domains
            .iter()
            .position(|(c, _)| c.domain == domain && c.account_id == account_id)
        else {
            return Ok(false);
        };
        let (claim, _) = domains.remove(at);
        self.audit.append(sso::domain_released(&claim, by));
        Ok(true)
    }

    async fn domain_claim(&self, domain: &str) -> Result<Option<DomainClaim>, StoreError> {
        let domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        Ok(domains
            .iter()
            .find(|(c, _)| c.domain == domain && c.proof.is_some())
            .map(|(c, _)| c.clone()))
    }

    async fn domain_claims(&self, account_id: &str) -> Result<Vec<DomainClaim>, StoreError> {
        let domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        let mut claims: Vec<DomainClaim> = domains
            .iter()
            .filter(|(c, _)| c.account_id == account_id)
            .map(|(c, _)| c.clone())
            .collect();
        claims.sort_by(|a, b| a.domain.cmp(&b.domain));
        Ok(claims)
    }

    async fn prove_domain(
        &self,
        account_id: &str,
        domain: &str,
        proof: DomainProof,
        by: &Actor,
    ) -> Result<Proving, StoreError> {
        let mut domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        Ok(prove_held(
            &mut domains,
            account_id,
            domain,
            proof,
            &self.audit,
            by,
        ))
    }

    async fn mail_domain_proof(
        &self,
        account_id: &str,
        domain: &str,
        to: &str,
        token_hash: &KeyHash,
        expires_at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let mut domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        match domains
            .iter_mut()
            .find(|(c, _)| c.domain == domain && c.account_id == account_id && c.proof.is_none())
        {
            Some((claim, mail)) => {
                claim.mail_to = Some(to.to_owned());
                *mail = Some((*token_hash, expires_at));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn prove_domain_by_mail(
        &self,
        token_hash: &KeyHash,
        now: OffsetDateTime,
        by: &Actor,
    ) -> Result<Proving, StoreError> {
        let mut domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        let Some((claim, mail)) = domains
            .iter_mut()
            .find(|(_, mail)| mail.is_some_and(|(hash, _)| bool::from(hash.ct_eq(token_hash))))
        else {
            return Ok(Proving::NoClaim);
        };
        // Spent whatever follows: a link works once.
        let expires_at = mail.take().map(|(_, at)| at);
        if expires_at.is_none_or(|at| at <= now) || claim.proof.is_some() {
            return Ok(Proving::NoClaim);
        }
        let (account_id, domain) = (claim.account_id.clone(), claim.domain.clone());
        let by = Actor {
            id: claim.mail_to.clone().unwrap_or_default(),
            ..by.clone()
        };
        Ok(prove_held(
            &mut domains,
            &account_id,
            &domain,
            DomainProof::Mail,
            &self.audit,
            &by,
        ))
    }

    async fn txt_proven_domains(&self) -> Result<Vec<DomainClaim>, StoreError> {
        let domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        Ok(domains
            .iter()
            .filter(|(c, _)| c.proof == Some(DomainProof::Txt))
            .map(|(c, _)| c.clone())
            .collect())
    }

    async fn recheck_domain(
        &self,
        account_id: &str,
        domain: &str,
        found: bool,
        now: OffsetDateTime,
        grace: Duration,
        by: &Actor,
    ) -> Result<Recheck, StoreError> {
        let mut domains = self.domains.lock().unwrap_or_else(|e| e.into_inner());
        let Some((claim, _)) = domains.iter_mut().find(|(c, _)| {
            c.domain == domain && c.account_id == account_id && c.proof == Some(DomainProof::Txt)
        }) else {
            return Ok(Recheck::Kept);
        };
        if found {
            claim.missing_since = None;
            return Ok(Recheck::Kept);
        }
        let since = *claim.missing_since.get_or_insert(now);
        if !lapses(since, now, grace) {
            return Ok(Recheck::Missing);
        }
        self.audit.append(sso::domain_lapsed(claim, since, by));
        claim.proof = None;
        claim.missing_since = None;
        Ok(Recheck::Lapsed)
    }

    async fn audit_refused_sso(
        &self,
        user: &User,
        method: SignInMethod,
        reason: &str,
        by: &Actor,
    ) -> Result<(), StoreError> {
        self.audit
            .append(sso::sso_refused(user, method, reason, by));
        Ok(())
    }

    async fn insert_sso_login(
        &self,
        state_hash: &KeyHash,
        expires_at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        let now = OffsetDateTime::now_utc();
        self.sso_logins.retain(|_, expires| *expires > now);
        self.sso_logins.insert(*state_hash, expires_at);
        Ok(())
    }

    async fn take_sso_login(&self, state_hash: &KeyHash) -> Result<bool, StoreError> {
        let now = OffsetDateTime::now_utc();
        Ok(self
            .sso_logins
            .remove_if(state_hash, |_, expires| *expires > now)
            .is_some())
    }

    async fn withdraw_invitation(
        &self,
        account_id: &str,
        token_hash: &KeyHash,
        acting: Role,
        by: &Actor,
    ) -> Result<bool, StoreError> {
        let now = OffsetDateTime::now_utc();
        let withdrawn = self.invitations.remove_if(token_hash, |_, i| {
            i.account_id == account_id
                && i.expires_at > now
                && acting.may_manage(None, Some(i.role))
        });
        if let Some((_, invitation)) = &withdrawn {
            self.audit
                .append(organizations::invitation_withdrawn(invitation, by));
        }
        Ok(withdrawn.is_some())
    }
}
