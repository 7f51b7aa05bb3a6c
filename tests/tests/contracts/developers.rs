//! The `DeveloperStore` contract (the dashboard's users, sessions, sign-in failures and
//! checkouts), kept alike by the in-process store of standalone mode and the Postgres one of
//! cluster mode.

use e2e::contract::actor;
use std::sync::Arc;

use e2e::PostgresServer;
use store::accounts::{Accounts, KeyHash, MemoryAccounts, PostgresAccounts};
use store::audit::{Action, AuditLog, AuditQuery, MemoryAuditLog, PostgresAuditLog};
use store::developers::{
    owner_verified, Acceptance, Checkout, CheckoutStatus, DeveloperStore, DomainClaim, DomainProof,
    EmailVerification, Invitation, InvitationLimit, InvitationLimits, MemberChange,
    MemoryDeveloperStore, PostgresDeveloperStore, Proving, Recheck, Refusal, Role, Session,
    SignInMethod, User,
};
use store::ledger::MemoryLedger;
use time::{Duration, OffsetDateTime};

use super::{database, now, unique};

/// Invitation limits no rule but theirs reaches.
const UNLIMITED: InvitationLimits = InvitationLimits {
    per_organization: u32::MAX,
    per_address: u32::MAX,
    window: Duration::HOUR,
};

/// The client address bucket sign-in failures are counted under.
const CLIENT: &str = "203.0.113.1";
/// The idle lifetime of the session lookups that do not test it.
const IDLE: Duration = Duration::minutes(30);

pub struct Store {
    developers: Arc<dyn DeveloperStore>,
    /// Users and checkouts belong to accounts.
    accounts: Arc<dyn Accounts>,
    /// Where the store audits its changes.
    audit: Arc<dyn AuditLog>,
    _pg: Option<PostgresServer>,
}

async fn in_process() -> Store {
    let audit = Arc::new(MemoryAuditLog::default());
    Store {
        developers: Arc::new(MemoryDeveloperStore::new(audit.clone())),
        accounts: Arc::new(MemoryAccounts::new(Arc::new(MemoryLedger::default()))),
        audit,
        _pg: None,
    }
}

async fn postgres() -> Store {
    let (pg, db) = database().await;
    Store {
        developers: Arc::new(PostgresDeveloperStore::new(db.clone())),
        accounts: Arc::new(PostgresAccounts::new(db.clone())),
        audit: Arc::new(PostgresAuditLog::new(db)),
        _pg: Some(pg),
    }
}

impl Store {
    async fn user(&self) -> User {
        let account = self
            .accounts
            .create_account(&unique("dev"))
            .await
            .expect("account");
        let user = User {
            id: unique("user"),
            email: format!("{}@example.com", unique("dev")),
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".to_owned(),
            account_id: account.id,
            created_at: now(),
            email_verified_at: None,
            role: Role::Owner,
        };
        assert!(self
            .developers
            .insert_user(user.clone(), &actor())
            .await
            .expect("inserted"));
        user
    }

    // Lookups the rules expect to answer; `None` is "not found".
    async fn user_by_email(&self, email: &str) -> Option<User> {
        self.developers.user_by_email(email).await.expect("lookup")
    }

    async fn session_of(&self, token_hash: &KeyHash) -> Option<Session> {
        self.session_idle(token_hash, IDLE).await
    }

    async fn session_idle(&self, token_hash: &KeyHash, idle: Duration) -> Option<Session> {
        self.developers
            .session(token_hash, idle)
            .await
            .expect("lookup")
    }

    async fn sign_in_failures(&self, email: &str) -> Option<(u32, OffsetDateTime)> {
        self.failures_from(email, CLIENT).await
    }

    async fn failures_from(&self, email: &str, client: &str) -> Option<(u32, OffsetDateTime)> {
        self.developers
            .sign_in_failures(email, client)
            .await
            .expect("lookup")
    }

    /// A link for `user` setting `password_hash`, expiring at `expires_at`; its token.
    async fn link(&self, user: &User, password_hash: &str, expires_at: OffsetDateTime) -> String {
        let token = unique("link");
        self.developers
            .insert_email_verification(EmailVerification {
                token_hash: KeyHash::of(&token),
                user_id: user.id.clone(),
                password_hash: password_hash.to_owned(),
                expires_at,
            })
            .await
            .expect("stored");
        token
    }

    async fn verify(&self, token: &str) -> Option<User> {
        self.developers
            .verify_email(&KeyHash::of(token), None)
            .await
            .expect("answered")
    }

    fn session(user: &User, token: &str, expires_at: OffsetDateTime) -> Session {
        Session {
            token_hash: KeyHash::of(token),
            user_id: user.id.clone(),
            email: user.email.clone(),
            account_id: user.account_id.clone(),
            role: user.role,
            email_verified: false,
            csrf: unique("csrf"),
            expires_at,
            last_used_at: now(),
        }
    }

    /// Sends an invitation to `owner`'s organization for `email` under `limits`: its token,
    /// or the limit it would pass.
    async fn invite_within(
        &self,
        owner: &User,
        email: &str,
        limits: InvitationLimits,
    ) -> Result<String, InvitationLimit> {
        let token = unique("invitation");
        self.developers
            .invite(
                Invitation {
                    token_hash: KeyHash::of(&token),
                    account_id: owner.account_id.clone(),
                    email: email.to_owned(),
                    role: Role::Developer,
                    invited_by: owner.email.clone(),
                    created_at: now(),
                    expires_at: now() + Duration::days(7),
                },
                &actor(),
                limits,
            )
            .await
            .expect("answered")
            .map(|()| token)
    }

    /// An invitation to `owner`'s organization for `email` as `role`, expiring at
    /// `expires_at`; its token.
    async fn invitation(
        &self,
        owner: &User,
        email: &str,
        role: Role,
        expires_at: OffsetDateTime,
    ) -> String {
        let token = unique("invitation");
        self.developers
            .invite(
                Invitation {
                    token_hash: KeyHash::of(&token),
                    account_id: owner.account_id.clone(),
                    email: email.to_owned(),
                    role,
                    invited_by: owner.email.clone(),
                    created_at: now(),
                    expires_at,
                },
                &actor(),
                UNLIMITED,
            )
            .await
            .expect("answered")
            .expect("invited");
        token
    }

    async fn accept(&self, token: &str, user: &User) -> Acceptance {
        self.developers
            .accept_invitation(&KeyHash::of(token), &user.id, &actor())
            .await
            .expect("answered")
    }

    /// A new user who joined `owner`'s organization as `role` by invitation.
    async fn member(&self, owner: &User, role: Role) -> User {
        let user = self.user().await;
        let token = self
            .invitation(owner, &user.email, role, now() + Duration::days(7))
            .await;
        match self.accept(&token, &user).await {
            Acceptance::Accepted(member) => member,
            other => panic!("accepted: {other:?}"),
        }
    }

    /// The members of `owner`'s organization, by email.
    async fn members(&self, owner: &User) -> Vec<(String, Role)> {
        let mut members: Vec<(String, Role)> = self
            .developers
            .members(&owner.account_id)
            .await
            .expect("members")
            .into_iter()
            .map(|u| (u.email, u.role))
            .collect();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        members
    }

    fn sorted(mut members: Vec<(String, Role)>) -> Vec<(String, Role)> {
        members.sort_by(|a, b| a.0.cmp(&b.0));
        members
    }

    /// The actions audited on the account, oldest first.
    async fn audited(&self, account_id: &str) -> Vec<Action> {
        let mut rows = self
            .audit
            .list(&AuditQuery {
                account_id: Some(account_id.to_owned()),
                limit: 1000,
                ..AuditQuery::default()
            })
            .await
            .expect("rows");
        rows.reverse();
        rows.into_iter().map(|r| r.entry.action).collect()
    }

    async fn insert(&self, session: &Session) {
        self.developers
            .insert_session(session.clone(), SignInMethod::Password, &actor())
            .await
            .expect("inserted");
    }
}

async fn a_session_unused_for_its_idle_lifetime_is_refused_and_deleted(store: Store) {
    let user = store.user().await;
    let mut idle = Store::session(&user, &unique("token"), now() + Duration::hours(1));
    idle.last_used_at = now() - IDLE - Duration::seconds(1);
    store.insert(&idle).await;
    assert!(store.session_of(&idle.token_hash).await.is_none());
    assert!(
        store
            .session_idle(&idle.token_hash, Duration::hours(2))
            .await
            .is_none(),
        "the refused session was deleted, not only hidden"
    );
}

async fn a_session_past_its_absolute_end_is_refused_however_recently_used(store: Store) {
    let user = store.user().await;
    let old = Store::session(&user, &unique("token"), now() - Duration::seconds(1));
    store.insert(&old).await;
    assert!(store.session_of(&old.token_hash).await.is_none());
}

async fn a_use_is_written_only_once_the_stored_last_use_is_stale(store: Store) {
    let user = store.user().await;
    let mut fresh = Store::session(&user, &unique("token"), now() + Duration::hours(1));
    fresh.last_used_at = now() - Duration::seconds(10);
    let mut stale = Store::session(&user, &unique("token"), now() + Duration::hours(1));
    stale.last_used_at = now() - Duration::minutes(5);
    store.insert(&fresh).await;
    store.insert(&stale).await;

    let seen = store.session_of(&fresh.token_hash).await.expect("alive");
    assert!(
        (seen.last_used_at - fresh.last_used_at).abs() < Duration::milliseconds(1),
        "a last use ten seconds old is not written again"
    );
    let seen = store.session_of(&stale.token_hash).await.expect("alive");
    assert!(seen.last_used_at > now() - Duration::seconds(10));
    // Stored, not only answered: five minutes unused would be past a one-minute idle time.
    assert!(store
        .session_idle(&stale.token_hash, Duration::minutes(1))
        .await
        .is_some());
}

async fn two_sign_ins_of_one_user_are_two_sessions(store: Store) {
    let user = store.user().await;
    let first = Store::session(&user, &unique("token"), now() + Duration::hours(1));
    let second = Store::session(&user, &unique("token"), now() + Duration::hours(1));
    store.insert(&first).await;
    store.insert(&second).await;
    let (a, b) = (
        store.session_of(&first.token_hash).await.expect("first"),
        store.session_of(&second.token_hash).await.expect("second"),
    );
    assert_ne!(a.token_hash, b.token_hash);
    assert_ne!(a.csrf, b.csrf);
}

async fn signing_out_everywhere_ends_every_session_of_the_user_and_no_other(store: Store) {
    let (user, other) = (store.user().await, store.user().await);
    let mine: Vec<Session> = (0..3)
        .map(|_| Store::session(&user, &unique("token"), now() + Duration::hours(1)))
        .collect();
    let theirs = Store::session(&other, &unique("token"), now() + Duration::hours(1));
    for s in mine.iter().chain([&theirs]) {
        store.insert(s).await;
    }
    let ended = store
        .developers
        .end_all_sessions(&mine[0], &actor())
        .await
        .expect("ended");
    assert_eq!(ended, 3);
    for s in &mine {
        assert!(store.session_of(&s.token_hash).await.is_none());
    }
    assert!(store.session_of(&theirs.token_hash).await.is_some());
}

async fn a_user_is_found_by_email_and_a_taken_email_is_refused(store: Store) {
    let user = store.user().await;
    let found = store.user_by_email(&user.email).await.expect("found");
    assert_eq!(
        (
            &found.id,
            &found.password_hash,
            &found.account_id,
            found.created_at
        ),
        (
            &user.id,
            &user.password_hash,
            &user.account_id,
            user.created_at
        )
    );
    let mut again = user.clone();
    again.id = unique("user");
    assert!(
        !store
            .developers
            .insert_user(again, &actor())
            .await
            .expect("answered"),
        "the email is taken"
    );
    let still = store.user_by_email(&user.email).await.expect("found");
    assert_eq!(still.id, user.id);
    assert!(store.user_by_email("nobody@example.com").await.is_none());
}

async fn a_session_is_found_by_its_token_hash_until_it_expires_or_is_deleted(store: Store) {
    let user = store.user().await;
    let live = Store::session(&user, &unique("token"), now() + Duration::hours(1));
    let expired = Store::session(&user, &unique("token"), now() - Duration::seconds(1));
    for s in [&live, &expired] {
        store
            .developers
            .insert_session(s.clone(), SignInMethod::Password, &actor())
            .await
            .expect("inserted");
    }
    let found = store
        .session_of(&live.token_hash)
        .await
        .expect("a live session");
    assert_eq!(
        (
            &found.user_id,
            &found.email,
            &found.account_id,
            &found.csrf,
            found.expires_at
        ),
        (
            &live.user_id,
            &live.email,
            &live.account_id,
            &live.csrf,
            live.expires_at
        )
    );
    assert!(store.session_of(&expired.token_hash).await.is_none());
    store
        .developers
        .delete_session(&live.token_hash)
        .await
        .expect("deleted");
    assert!(store.session_of(&live.token_hash).await.is_none());
}

async fn sign_in_failures_count_within_their_window_until_cleared(store: Store) {
    let email = format!("{}@example.com", unique("dev"));
    assert!(store.sign_in_failures(&email).await.is_none());
    for n in 1..=3 {
        let counted = store
            .developers
            .record_sign_in_failure(&email, CLIENT, Duration::minutes(15))
            .await
            .expect("counted");
        assert_eq!(counted, n);
    }
    let (failures, ends) = store.sign_in_failures(&email).await.expect("failures");
    assert_eq!(failures, 3);
    assert!(ends > now() + Duration::minutes(14) && ends <= now() + Duration::minutes(16));
    store
        .developers
        .clear_sign_in_failures(&email, CLIENT)
        .await
        .expect("cleared");
    assert!(store.sign_in_failures(&email).await.is_none());
}

async fn a_sign_in_failure_after_its_window_ended_starts_a_new_count(store: Store) {
    let email = format!("{}@example.com", unique("dev"));
    for _ in 0..2 {
        store
            .developers
            .record_sign_in_failure(&email, CLIENT, Duration::milliseconds(20))
            .await
            .expect("counted");
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        store.sign_in_failures(&email).await.is_none(),
        "the window has ended"
    );
    let counted = store
        .developers
        .record_sign_in_failure(&email, CLIENT, Duration::minutes(15))
        .await
        .expect("counted");
    assert_eq!(counted, 1);
}

async fn an_accounts_checkouts_are_listed_newest_first_with_their_status(store: Store) {
    let user = store.user().await;
    let mut references = Vec::new();
    for (cents, minutes_ago) in [(500, 10), (1_000, 5), (2_000, 20)] {
        let checkout = Checkout {
            reference: unique("co"),
            account_id: user.account_id.clone(),
            usd_cents: cents,
            status: CheckoutStatus::Pending,
            created_at: now() - Duration::minutes(minutes_ago),
        };
        references.push((minutes_ago, checkout.reference.clone()));
        store
            .developers
            .insert_checkout(checkout)
            .await
            .expect("inserted");
    }
    store
        .developers
        .set_checkout_status(&references[0].1, CheckoutStatus::Failed)
        .await
        .expect("set");
    store
        .developers
        .set_checkout_status(&unique("co"), CheckoutStatus::Failed)
        .await
        .expect("an unknown checkout changes nothing");
    let failed = references[0].1.clone();
    references.sort();
    let listed: Vec<(String, CheckoutStatus)> = store
        .developers
        .checkouts(&user.account_id)
        .await
        .expect("checkouts")
        .into_iter()
        .map(|c| (c.reference, c.status))
        .collect();
    let expected: Vec<(String, CheckoutStatus)> = references
        .into_iter()
        .map(|(_, r)| {
            let status = if r == failed {
                CheckoutStatus::Failed
            } else {
                CheckoutStatus::Pending
            };
            (r, status)
        })
        .collect();
    assert_eq!(listed, expected);
    let other = store.user().await;
    assert!(store
        .developers
        .checkouts(&other.account_id)
        .await
        .expect("checkouts")
        .is_empty());
}

async fn sign_in_failures_from_one_client_never_count_for_another(store: Store) {
    let email = format!("{}@example.com", unique("dev"));
    for _ in 0..6 {
        store
            .developers
            .record_sign_in_failure(&email, "198.51.100.9", Duration::minutes(15))
            .await
            .expect("counted");
    }
    assert!(store.sign_in_failures(&email).await.is_none());
    let counted = store
        .developers
        .record_sign_in_failure(&email, CLIENT, Duration::minutes(15))
        .await
        .expect("counted");
    assert_eq!(counted, 1, "the owner's address starts its own count");
    store
        .developers
        .clear_sign_in_failures(&email, CLIENT)
        .await
        .expect("cleared");
    let (stranger, _) = store
        .failures_from(&email, "198.51.100.9")
        .await
        .expect("the stranger's count stays");
    assert_eq!(stranger, 6);
}

async fn a_link_verifies_once_sets_its_password_and_ends_the_users_sessions_and_other_links(
    store: Store,
) {
    let user = store.user().await;
    assert!(!owner_verified(store.developers.as_ref(), &user.account_id)
        .await
        .expect("answered"));
    let session = Store::session(&user, &unique("token"), now() + Duration::hours(1));
    store
        .developers
        .insert_session(session.clone(), SignInMethod::Password, &actor())
        .await
        .expect("inserted");
    assert!(
        !store
            .session_of(&session.token_hash)
            .await
            .expect("live")
            .email_verified
    );
    let other = store
        .link(&user, "other-hash", now() + Duration::hours(1))
        .await;
    let token = store
        .link(&user, "chosen-hash", now() + Duration::hours(1))
        .await;

    let verified = store.verify(&token).await.expect("verified");
    assert_eq!(verified.id, user.id);
    assert_eq!(verified.password_hash, "chosen-hash");
    assert!(verified.email_verified_at.is_some());
    let found = store.user_by_email(&user.email).await.expect("found");
    assert_eq!(found.password_hash, "chosen-hash");
    assert!(found.email_verified_at.is_some());
    let owner = store
        .developers
        .user_by_account(&user.account_id)
        .await
        .expect("answered")
        .expect("the account's user");
    assert_eq!(owner.id, user.id);
    assert!(owner_verified(store.developers.as_ref(), &user.account_id)
        .await
        .expect("answered"));

    assert!(store.verify(&token).await.is_none(), "used once");
    assert!(store.verify(&other).await.is_none(), "the other link ended");
    assert!(
        store.session_of(&session.token_hash).await.is_none(),
        "a session of before the proof ended"
    );
    // A link made for a user verified since changes nothing.
    let late = store
        .link(&user, "late-hash", now() + Duration::hours(1))
        .await;
    assert!(store.verify(&late).await.is_none());
    let found = store.user_by_email(&user.email).await.expect("found");
    assert_eq!(found.password_hash, "chosen-hash");
}

async fn an_expired_link_verifies_nothing(store: Store) {
    let user = store.user().await;
    let token = store
        .link(&user, "chosen-hash", now() - Duration::seconds(1))
        .await;
    assert!(store.verify(&token).await.is_none());
    assert!(store.verify("never-issued").await.is_none());
    let found = store.user_by_email(&user.email).await.expect("found");
    assert!(found.email_verified_at.is_none());
    assert_eq!(found.password_hash, user.password_hash);
}

async fn a_sign_up_is_its_accounts_owner_and_its_only_member(store: Store) {
    let user = store.user().await;
    let found = store.user_by_email(&user.email).await.expect("found");
    assert_eq!(found.role, Role::Owner);
    assert_eq!(store.members(&user).await, vec![(user.email, Role::Owner)]);
}

async fn an_invitation_is_accepted_once_only_by_its_email_and_only_before_it_expires(store: Store) {
    let owner = store.user().await;
    let (invitee, stranger) = (store.user().await, store.user().await);
    let token = store
        .invitation(
            &owner,
            &invitee.email,
            Role::Developer,
            now() + Duration::days(7),
        )
        .await;
    let pending = store
        .developers
        .invitations(&owner.account_id)
        .await
        .expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].email, invitee.email);

    // Another user holding the link cannot use it, and it stays for its invitee.
    assert!(matches!(
        store.accept(&token, &stranger).await,
        Acceptance::WrongEmail
    ));
    let session = Store::session(&invitee, &unique("token"), now() + Duration::hours(1));
    store.insert(&session).await;
    let Acceptance::Accepted(member) = store.accept(&token, &invitee).await else {
        panic!("the invitee accepts");
    };
    assert_eq!(member.account_id, owner.account_id);
    assert_eq!(member.role, Role::Developer);
    assert!(
        store.session_of(&session.token_hash).await.is_none(),
        "the invitee's sessions of before ended"
    );
    assert_eq!(
        store.members(&owner).await,
        Store::sorted(vec![
            (owner.email.clone(), Role::Owner),
            (invitee.email.clone(), Role::Developer)
        ])
    );
    assert!(store
        .developers
        .invitations(&owner.account_id)
        .await
        .expect("pending")
        .is_empty());
    // Single use.
    assert!(matches!(
        store.accept(&token, &invitee).await,
        Acceptance::Unknown
    ));
    // Past its expiry, nothing.
    let late = store.user().await;
    let expired = store
        .invitation(
            &owner,
            &late.email,
            Role::Admin,
            now() - Duration::seconds(1),
        )
        .await;
    assert!(matches!(
        store.accept(&expired, &late).await,
        Acceptance::Unknown
    ));
    assert!(matches!(
        store.accept("never-sent", &late).await,
        Acceptance::Unknown
    ));
    assert_eq!(store.members(&owner).await.len(), 2);
    assert_eq!(
        store.audited(&owner.account_id).await,
        [
            Action::SignedUp,
            Action::InvitationSent,
            Action::InvitationAccepted,
            Action::InvitationSent
        ]
    );
}

async fn an_admin_never_changes_or_removes_an_owner_and_an_organization_keeps_an_owner(
    store: Store,
) {
    let owner = store.user().await;
    let admin = store.member(&owner, Role::Admin).await;
    let change = |user: &User, role, acting| {
        let (developers, account, user) = (
            store.developers.clone(),
            owner.account_id.clone(),
            user.id.clone(),
        );
        async move {
            developers
                .change_role(&account, &user, role, acting, &actor())
                .await
                .expect("answered")
        }
    };
    let remove = |user: &User, acting| {
        let (developers, account, user) = (
            store.developers.clone(),
            owner.account_id.clone(),
            user.id.clone(),
        );
        async move {
            developers
                .remove_member(&account, &user, acting, &actor())
                .await
                .expect("answered")
        }
    };
    assert!(matches!(
        change(&owner, Role::Developer, Role::Admin).await,
        MemberChange::Refused(Refusal::NotAllowed)
    ));
    assert!(matches!(
        remove(&owner, Role::Admin).await,
        MemberChange::Refused(Refusal::NotAllowed)
    ));
    assert!(matches!(
        change(&admin, Role::Owner, Role::Admin).await,
        MemberChange::Refused(Refusal::NotAllowed)
    ));
    // The last owner neither leaves nor steps down.
    assert!(matches!(
        change(&owner, Role::Admin, Role::Owner).await,
        MemberChange::Refused(Refusal::LastOwner)
    ));
    assert!(matches!(
        remove(&owner, Role::Owner).await,
        MemberChange::Refused(Refusal::LastOwner)
    ));
    assert!(matches!(
        change(&admin, Role::Admin, Role::Owner).await,
        MemberChange::Refused(Refusal::Unchanged)
    ));
    // Nor does one of another organization's members count.
    let stranger = store.user().await;
    assert!(matches!(
        remove(&stranger, Role::Owner).await,
        MemberChange::Refused(Refusal::NoSuchMember)
    ));
    // With a second owner, the first may step down.
    assert!(matches!(
        change(&admin, Role::Owner, Role::Owner).await,
        MemberChange::Done(_)
    ));
    assert!(matches!(
        change(&owner, Role::Billing, Role::Owner).await,
        MemberChange::Done(_)
    ));
    assert_eq!(
        store.members(&owner).await,
        Store::sorted(vec![
            (owner.email.clone(), Role::Billing),
            (admin.email.clone(), Role::Owner)
        ])
    );
    let audited = store.audited(&owner.account_id).await;
    assert_eq!(
        audited
            .iter()
            .filter(|a| **a == Action::MemberRoleChanged)
            .count(),
        2,
        "only the changes made are audited: {audited:?}"
    );
}

async fn a_role_change_or_removal_ends_the_members_sessions_and_no_one_elses(store: Store) {
    let owner = store.user().await;
    let developer = store.member(&owner, Role::Developer).await;
    let (mine, theirs) = (
        Store::session(&owner, &unique("token"), now() + Duration::hours(1)),
        Store::session(&developer, &unique("token"), now() + Duration::hours(1)),
    );
    store.insert(&mine).await;
    store.insert(&theirs).await;
    let changed = store
        .developers
        .change_role(
            &owner.account_id,
            &developer.id,
            Role::Billing,
            Role::Owner,
            &actor(),
        )
        .await
        .expect("changed");
    assert!(matches!(changed, MemberChange::Done(ref before) if before.role == Role::Developer));
    assert!(store.session_of(&theirs.token_hash).await.is_none());
    assert!(store.session_of(&mine.token_hash).await.is_some());
    let developer = store.user_by_email(&developer.email).await.expect("member");
    assert_eq!(developer.role, Role::Billing);

    let again = Store::session(&developer, &unique("token"), now() + Duration::hours(1));
    store.insert(&again).await;
    assert_eq!(
        store.session_of(&again.token_hash).await.map(|s| s.role),
        Some(Role::Billing)
    );
    let removed = store
        .developers
        .remove_member(&owner.account_id, &developer.id, Role::Owner, &actor())
        .await
        .expect("removed");
    assert!(matches!(removed, MemberChange::Done(_)));
    assert!(store.session_of(&again.token_hash).await.is_none());
    assert!(store.session_of(&mine.token_hash).await.is_some());
    assert!(store.user_by_email(&developer.email).await.is_none());
    assert_eq!(store.members(&owner).await.len(), 1);
    let mut audited = store.audited(&owner.account_id).await;
    audited.retain(|a| matches!(a, Action::MemberRoleChanged | Action::MemberRemoved));
    assert_eq!(audited, [Action::MemberRoleChanged, Action::MemberRemoved]);
}

async fn the_last_owner_of_an_organization_with_members_cannot_leave_it_by_invitation(
    store: Store,
) {
    let owner = store.user().await;
    store.member(&owner, Role::Developer).await;
    let elsewhere = store.user().await;
    let token = store
        .invitation(
            &elsewhere,
            &owner.email,
            Role::Admin,
            now() + Duration::days(7),
        )
        .await;
    assert!(matches!(
        store.accept(&token, &owner).await,
        Acceptance::LastOwner
    ));
    assert_eq!(store.members(&owner).await.len(), 2);
}

/// A claim of `domain` by `account_id`, pending.
fn pending_claim(
    domain: &str,
    account_id: &str,
    require_sso: bool,
    at: OffsetDateTime,
) -> DomainClaim {
    DomainClaim {
        domain: domain.to_owned(),
        account_id: account_id.to_owned(),
        require_sso,
        claimed_at: at,
        txt_token: Some(format!("token-of-{account_id}")),
        proof: None,
        missing_since: None,
        mail_to: None,
    }
}

async fn a_domain_is_proven_by_one_organization_only_and_every_step_audited(store: Store) {
    let first = store.user().await;
    let second = store.user().await;
    let third = store.user().await;
    let domain = format!("{}.example", unique("corp"));
    let at = now();
    let claim = |account_id: &str, require_sso| pending_claim(&domain, account_id, require_sso, at);
    let developers = &store.developers;
    // Two organizations' pending claims of one domain: neither has any effect.
    for (account, require_sso) in [(&first, false), (&second, true)] {
        assert!(developers
            .claim_domain(claim(&account.account_id, require_sso), &actor())
            .await
            .expect("claimed"));
    }
    assert_eq!(developers.domain_claim(&domain).await.expect("claim"), None);
    // The first proof wins; the other organization's is refused, and so is a new claim.
    let proven = developers
        .prove_domain(&first.account_id, &domain, DomainProof::Txt, &actor())
        .await
        .expect("proven");
    let as_proven = |require_sso| DomainClaim {
        proof: Some(DomainProof::Txt),
        ..claim(&first.account_id, require_sso)
    };
    assert_eq!(proven, Proving::Proven(as_proven(false)));
    assert_eq!(
        developers
            .prove_domain(&second.account_id, &domain, DomainProof::Mail, &actor())
            .await
            .expect("refused"),
        Proving::Taken
    );
    assert!(!developers
        .claim_domain(claim(&third.account_id, true), &actor())
        .await
        .expect("refused"));
    assert_eq!(
        developers
            .prove_domain(&first.account_id, &domain, DomainProof::Txt, &actor())
            .await
            .expect("answered"),
        Proving::NoClaim,
        "proven already"
    );
    // Its own organization may change whether it requires single sign-on.
    assert!(developers
        .claim_domain(claim(&first.account_id, true), &actor())
        .await
        .expect("updated"));
    let held = developers.domain_claim(&domain).await.expect("claim");
    assert_eq!(held, Some(as_proven(true)));
    let claims_of = |account: &str| {
        let account = account.to_owned();
        async move { developers.domain_claims(&account).await.expect("claims") }
    };
    assert_eq!(claims_of(&first.account_id).await, vec![as_proven(true)]);
    assert_eq!(
        claims_of(&second.account_id).await,
        vec![claim(&second.account_id, true)]
    );
    assert!(claims_of(&third.account_id).await.is_empty());
    assert_eq!(
        store
            .audited(&first.account_id)
            .await
            .into_iter()
            .filter(|a| matches!(a, Action::DomainClaimed | Action::DomainProven))
            .collect::<Vec<_>>(),
        [
            Action::DomainClaimed,
            Action::DomainProven,
            Action::DomainClaimed
        ]
    );
    assert!(!store
        .audited(&third.account_id)
        .await
        .contains(&Action::DomainClaimed));
    // Released (audited), the domain may be proven by the other organization.
    assert!(developers
        .release_domain(&first.account_id, &domain, &actor())
        .await
        .expect("released"));
    assert!(store
        .audited(&first.account_id)
        .await
        .contains(&Action::DomainReleased));
    assert!(matches!(
        developers
            .prove_domain(&second.account_id, &domain, DomainProof::Mail, &actor())
            .await
            .expect("proven"),
        Proving::Proven(_)
    ));
}

async fn a_domain_proof_link_proves_once_and_only_before_it_expires(store: Store) {
    let owner = store.user().await;
    let domain = format!("{}.example", unique("corp"));
    let developers = &store.developers;
    developers
        .claim_domain(
            pending_claim(&domain, &owner.account_id, true, now()),
            &actor(),
        )
        .await
        .expect("claimed");
    let to = format!("it@{domain}");
    let (expired, older, link) = (
        KeyHash::of(&unique("expired")),
        KeyHash::of(&unique("older")),
        KeyHash::of(&unique("link")),
    );
    let mail = |hash, expires_at| {
        let (account, domain, to) = (owner.account_id.clone(), domain.clone(), to.clone());
        async move {
            developers
                .mail_domain_proof(&account, &domain, &to, &hash, expires_at)
                .await
                .expect("mailed")
        }
    };
    let follow = |hash| async move {
        developers
            .prove_domain_by_mail(&hash, now(), &actor())
            .await
            .expect("answered")
    };
    assert!(mail(expired, now() - Duration::seconds(1)).await);
    assert_eq!(follow(expired).await, Proving::NoClaim, "expired");
    assert!(mail(older, now() + Duration::hours(1)).await);
    assert!(mail(link, now() + Duration::hours(1)).await);
    assert_eq!(follow(older).await, Proving::NoClaim, "superseded");
    assert_eq!(developers.domain_claim(&domain).await.expect("claim"), None);
    let Proving::Proven(proven) = follow(link).await else {
        panic!("the link proves the claim");
    };
    assert_eq!(proven.proof, Some(DomainProof::Mail));
    assert_eq!(follow(link).await, Proving::NoClaim, "a link works once");
    assert!(
        !mail(KeyHash::of(&unique("late")), now() + Duration::hours(1)).await,
        "no pending claim"
    );
    assert_eq!(
        developers
            .domain_claim(&domain)
            .await
            .expect("claim")
            .map(|c| c.proof),
        Some(Some(DomainProof::Mail))
    );
}

async fn a_txt_proven_domain_missing_for_the_grace_period_lapses_to_pending_once(store: Store) {
    let owner = store.user().await;
    let domain = format!("{}.example", unique("corp"));
    let developers = &store.developers;
    developers
        .claim_domain(
            pending_claim(&domain, &owner.account_id, true, now()),
            &actor(),
        )
        .await
        .expect("claimed");
    developers
        .prove_domain(&owner.account_id, &domain, DomainProof::Txt, &actor())
        .await
        .expect("proven");
    assert!(developers
        .txt_proven_domains()
        .await
        .expect("listed")
        .iter()
        .any(|c| c.domain == domain));
    let grace = Duration::hours(72);
    let t0 = now();
    let recheck = |found, at| {
        let (account, domain) = (owner.account_id.clone(), domain.clone());
        async move {
            developers
                .recheck_domain(&account, &domain, found, at, grace, &actor())
                .await
                .expect("rechecked")
        }
    };
    assert_eq!(recheck(false, t0).await, Recheck::Missing);
    // Found again: the mark is cleared, and the grace period starts over at the next miss.
    assert_eq!(recheck(true, t0 + Duration::hours(24)).await, Recheck::Kept);
    assert_eq!(
        recheck(false, t0 + Duration::hours(48)).await,
        Recheck::Missing
    );
    assert_eq!(
        recheck(false, t0 + Duration::hours(96)).await,
        Recheck::Missing
    );
    let held = developers.domain_claim(&domain).await.expect("claim");
    assert_eq!(
        held.and_then(|c| c.missing_since),
        Some(t0 + Duration::hours(48))
    );
    assert_eq!(
        recheck(false, t0 + Duration::hours(120)).await,
        Recheck::Lapsed
    );
    assert_eq!(developers.domain_claim(&domain).await.expect("claim"), None);
    // A second pod's re-check of the same moment finds nothing to lapse (and audits nothing).
    assert_eq!(
        recheck(false, t0 + Duration::hours(120)).await,
        Recheck::Kept
    );
    let claims = developers
        .domain_claims(&owner.account_id)
        .await
        .expect("claims");
    assert_eq!(claims.len(), 1);
    assert_eq!(
        (claims[0].proof, claims[0].txt_token.clone()),
        (None, Some(format!("token-of-{}", owner.account_id)))
    );
    let lapses = store
        .audited(&owner.account_id)
        .await
        .into_iter()
        .filter(|a| *a == Action::DomainLapsed)
        .count();
    assert_eq!(lapses, 1);
    // Pending again, it is proven again the same way.
    assert!(matches!(
        developers
            .prove_domain(&owner.account_id, &domain, DomainProof::Txt, &actor())
            .await
            .expect("proven"),
        Proving::Proven(_)
    ));
}

async fn a_single_sign_on_start_is_taken_once_and_only_before_it_expires(store: Store) {
    let developers = &store.developers;
    let state = KeyHash::of(&unique("state"));
    developers
        .insert_sso_login(&state, now() + Duration::minutes(10))
        .await
        .expect("stored");
    assert!(developers.take_sso_login(&state).await.expect("taken"));
    assert!(!developers.take_sso_login(&state).await.expect("spent"));
    let expired = KeyHash::of(&unique("state"));
    developers
        .insert_sso_login(&expired, now() - Duration::seconds(1))
        .await
        .expect("stored");
    assert!(!developers.take_sso_login(&expired).await.expect("expired"));
    assert!(!developers
        .take_sso_login(&KeyHash::of("never started"))
        .await
        .expect("unknown"));
}

async fn a_pending_invitation_is_withdrawn_once_by_whom_may_invite_in_its_role(store: Store) {
    let owner = store.user().await;
    let admin = store.member(&owner, Role::Admin).await;
    let stranger = store.user().await;
    let email = format!("{}@example.com", unique("invitee"));
    let later = now() + Duration::days(7);
    let as_owner = store.invitation(&owner, &email, Role::Owner, later).await;
    let as_developer = store
        .invitation(&owner, &email, Role::Developer, later)
        .await;
    let developers = &store.developers;
    let withdraw = |token: &str, account: &str, acting| {
        let hash = KeyHash::of(token);
        let account = account.to_owned();
        async move {
            developers
                .withdraw_invitation(&account, &hash, acting, &actor())
                .await
                .expect("answered")
        }
    };
    // An admin never withdraws an invitation as owner; another account's member none.
    assert!(!withdraw(&as_owner, &owner.account_id, Role::Admin).await);
    assert!(!withdraw(&as_developer, &stranger.account_id, Role::Owner).await);
    assert!(withdraw(&as_developer, &admin.account_id, Role::Admin).await);
    assert!(
        !withdraw(&as_developer, &owner.account_id, Role::Owner).await,
        "once"
    );
    let invitee = store.user().await;
    assert!(matches!(
        store.accept(&as_developer, &invitee).await,
        Acceptance::Unknown
    ));
    let pending = developers
        .invitations(&owner.account_id)
        .await
        .expect("pending");
    assert_eq!(pending.len(), 1, "the owner's invitation stays");
    let withdrawn = store
        .audited(&owner.account_id)
        .await
        .into_iter()
        .filter(|a| *a == Action::InvitationWithdrawn)
        .count();
    assert_eq!(withdrawn, 1);
}

/// Invitations sent within the window count against their organization's limit and their
/// address's, withdrawn ones too; a refused one is not stored, audited nor counted, and other
/// organizations and addresses are not concerned.
async fn invitations_sent_within_the_window_are_limited_per_organization_and_address_withdrawn_or_not(
    store: Store,
) {
    let limits = InvitationLimits {
        per_organization: 3,
        per_address: 2,
        window: Duration::HOUR,
    };
    let owner = store.user().await;
    let other = store.user().await;
    let email = format!("{}@example.com", unique("invitee"));
    let first = store
        .invite_within(&owner, &email, limits)
        .await
        .expect("first");
    assert!(store
        .developers
        .withdraw_invitation(
            &owner.account_id,
            &KeyHash::of(&first),
            Role::Owner,
            &actor()
        )
        .await
        .expect("answered"));
    store
        .invite_within(&other, &email, limits)
        .await
        .expect("another organization's, the address's second");
    assert_eq!(
        store.invite_within(&owner, &email, limits).await,
        Err(InvitationLimit::Address),
        "the withdrawn one still counts"
    );
    for n in 0..2 {
        let someone = format!("{}@example.com", unique("someone"));
        store
            .invite_within(&owner, &someone, limits)
            .await
            .unwrap_or_else(|_| panic!("the organization's invitation {}", n + 2));
    }
    let fresh = format!("{}@example.com", unique("fresh"));
    assert_eq!(
        store.invite_within(&owner, &fresh, limits).await,
        Err(InvitationLimit::Organization)
    );
    store
        .invite_within(&other, &fresh, limits)
        .await
        .expect("another organization's");
    let sent = store
        .audited(&owner.account_id)
        .await
        .into_iter()
        .filter(|a| *a == Action::InvitationSent)
        .count();
    assert_eq!(sent, 3, "the refused ones are not audited");
}

e2e::contract! {
    fixtures { in_process, postgres }
    rules {
        a_user_is_found_by_email_and_a_taken_email_is_refused,
        a_session_is_found_by_its_token_hash_until_it_expires_or_is_deleted,
        sign_in_failures_count_within_their_window_until_cleared,
        a_sign_in_failure_after_its_window_ended_starts_a_new_count,
        an_accounts_checkouts_are_listed_newest_first_with_their_status,
        sign_in_failures_from_one_client_never_count_for_another,
        a_link_verifies_once_sets_its_password_and_ends_the_users_sessions_and_other_links,
        an_expired_link_verifies_nothing,
        a_session_unused_for_its_idle_lifetime_is_refused_and_deleted,
        a_session_past_its_absolute_end_is_refused_however_recently_used,
        a_use_is_written_only_once_the_stored_last_use_is_stale,
        two_sign_ins_of_one_user_are_two_sessions,
        signing_out_everywhere_ends_every_session_of_the_user_and_no_other,
        a_sign_up_is_its_accounts_owner_and_its_only_member,
        an_invitation_is_accepted_once_only_by_its_email_and_only_before_it_expires,
        an_admin_never_changes_or_removes_an_owner_and_an_organization_keeps_an_owner,
        a_role_change_or_removal_ends_the_members_sessions_and_no_one_elses,
        the_last_owner_of_an_organization_with_members_cannot_leave_it_by_invitation,
        a_domain_is_proven_by_one_organization_only_and_every_step_audited,
        a_domain_proof_link_proves_once_and_only_before_it_expires,
        a_txt_proven_domain_missing_for_the_grace_period_lapses_to_pending_once,
        a_single_sign_on_start_is_taken_once_and_only_before_it_expires,
        a_pending_invitation_is_withdrawn_once_by_whom_may_invite_in_its_role,
        invitations_sent_within_the_window_are_limited_per_organization_and_address_withdrawn_or_not,
    }
}
