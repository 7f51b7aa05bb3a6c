//! The dashboard's records in Postgres (cluster mode), so that every pod knows every user and
//! session: a sign-up on one pod signs in on all of them and survives restarts.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;
use time::{Duration, OffsetDateTime};

use super::organizations::{
    self, Acceptance, Invitation, InvitationLimit, InvitationLimits, MemberChange, Refusal, Role,
};
use super::sso::{self, lapses, DomainClaim, DomainProof, Proving, Recheck};
use super::{
    of_user, sign_in_refused, signed_in, signed_out, signed_out_everywhere, standing, verified_by,
    Checkout, CheckoutStatus, DeveloperStore, EmailVerification, Session, SignInMethod, Standing,
    User,
};
use crate::accounts::KeyHash;
use crate::accounts::StoreError;
use crate::audit::{append_in, Action, Actor};
use crate::db::{from_db, to_db, Database, DbError};

pub struct PostgresDeveloperStore {
    db: Database,
}

impl PostgresDeveloperStore {
    pub fn new(db: Database) -> Self {
        Self { db }
    }
}

fn user_of(row: &PgRow) -> Result<User, sqlx::Error> {
    Ok(User {
        id: row.try_get("id")?,
        email: row.try_get("email")?,
        password_hash: row.try_get("password_hash")?,
        account_id: row.try_get("account_id")?,
        created_at: row.try_get("created_at")?,
        email_verified_at: row.try_get("email_verified_at")?,
        role: role_of(row)?,
    })
}

fn role_of(row: &PgRow) -> Result<Role, sqlx::Error> {
    let role: String = row.try_get("role")?;
    Role::parse(&role).ok_or_else(|| sqlx::Error::Decode(format!("unknown role {role}").into()))
}

fn invitation_of(row: &PgRow) -> Result<Option<Invitation>, sqlx::Error> {
    let hash: Vec<u8> = row.try_get("token_hash")?;
    let Some(token_hash) = KeyHash::from_bytes(&hash) else {
        return Ok(None);
    };
    Ok(Some(Invitation {
        token_hash,
        account_id: row.try_get("account_id")?,
        email: row.try_get("email")?,
        role: role_of(row)?,
        invited_by: row.try_get("invited_by")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
    }))
}

type Tx = sqlx::Transaction<'static, sqlx::Postgres>;

/// The members of the account with their roles, locked until `tx` ends: every change of an
/// organization's members takes these locks first, so its checks and its change are one step.
async fn lock_members(tx: &mut Tx, account_id: &str) -> Result<Vec<User>, sqlx::Error> {
    let rows =
        sqlx::query("SELECT * FROM dashboard_users WHERE account_id = $1 ORDER BY id FOR UPDATE")
            .bind(account_id)
            .persistent(false)
            .fetch_all(&mut **tx)
            .await?;
    rows.iter().map(user_of).collect()
}

fn roles(members: &[User]) -> Vec<(String, Role)> {
    members.iter().map(|u| (u.id.clone(), u.role)).collect()
}

/// The member `user_id` among `members`, if `to` (`None`: removal) may be done to them by
/// `acting`; the refusal otherwise.
fn member_to_change(
    members: &[User],
    user_id: &str,
    to: Option<Role>,
    acting: Role,
) -> Result<User, Refusal> {
    let member = members
        .iter()
        .find(|u| u.id == user_id)
        .cloned()
        .ok_or(Refusal::NoSuchMember)?;
    match organizations::refusal(&roles(members), &member, to, acting) {
        Some(refused) => Err(refused),
        None => Ok(member),
    }
}

fn session_of(row: &PgRow) -> Result<Option<Session>, sqlx::Error> {
    let hash: Vec<u8> = row.try_get("token_hash")?;
    let Some(token_hash) = KeyHash::from_bytes(&hash) else {
        return Ok(None);
    };
    Ok(Some(Session {
        token_hash,
        user_id: row.try_get("user_id")?,
        email: row.try_get("email")?,
        account_id: row.try_get("account_id")?,
        role: role_of(row)?,
        email_verified: row.try_get("email_verified")?,
        csrf: row.try_get("csrf")?,
        expires_at: row.try_get("expires_at")?,
        last_used_at: row.try_get("last_used_at")?,
    }))
}

/// A claim of `dashboard_domains` (proven: it has `proof`) or `dashboard_pending_domains`.
fn claim_of(row: &PgRow) -> Result<DomainClaim, sqlx::Error> {
    let proof = match row.try_get::<String, _>("proof") {
        Ok(name) => Some(
            DomainProof::parse(&name).ok_or_else(|| sqlx::Error::ColumnDecode {
                index: "proof".into(),
                source: format!("unknown domain proof {name:?}").into(),
            })?,
        ),
        Err(sqlx::Error::ColumnNotFound(_)) => None,
        Err(e) => return Err(e),
    };
    let optional = |column: &str| match row.try_get(column) {
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        other => other,
    };
    Ok(DomainClaim {
        domain: row.try_get("domain")?,
        account_id: row.try_get("account_id")?,
        require_sso: row.try_get("require_sso")?,
        claimed_at: row.try_get("claimed_at")?,
        txt_token: row.try_get("txt_token")?,
        proof,
        missing_since: optional("missing_since")?,
        mail_to: match row.try_get("mail_to") {
            Err(sqlx::Error::ColumnNotFound(_)) => None,
            other => other?,
        },
    })
}

/// Moves the account's pending claim of `domain` to the proven ones in `tx`, audited:
/// `Taken` (nothing changed; the caller rolls back) when another organization's is proven.
async fn prove_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    account_id: &str,
    domain: &str,
    proof: DomainProof,
    by: &Actor,
) -> Result<Proving, sqlx::Error> {
    let Some(row) = sqlx::query(
        "DELETE FROM dashboard_pending_domains WHERE domain = $1 AND account_id = $2
         RETURNING *",
    )
    .bind(domain)
    .bind(account_id)
    .persistent(false)
    .fetch_optional(&mut **tx)
    .await?
    else {
        return Ok(Proving::NoClaim);
    };
    let mut claim = claim_of(&row)?;
    claim.proof = Some(proof);
    claim.mail_to = None;
    // The primary key keeps one proven claim per domain, whatever runs at the same time.
    let inserted = sqlx::query(
        "INSERT INTO dashboard_domains
             (domain, account_id, require_sso, claimed_at, proof, txt_token)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (domain) DO NOTHING",
    )
    .bind(&claim.domain)
    .bind(&claim.account_id)
    .bind(claim.require_sso)
    .bind(claim.claimed_at)
    .bind(proof.as_str())
    .bind(&claim.txt_token)
    .persistent(false)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(Proving::Taken);
    }
    append_in(tx, &sso::domain_proven(&claim, by)).await?;
    Ok(Proving::Proven(claim))
}

fn status_name(status: CheckoutStatus) -> &'static str {
    match status {
        CheckoutStatus::Pending => "pending",
        CheckoutStatus::Failed => "failed",
    }
}

fn checkout_of(row: &PgRow) -> Result<Checkout, sqlx::Error> {
    let status: String = row.try_get("status")?;
    Ok(Checkout {
        reference: row.try_get("reference")?,
        account_id: row.try_get("account_id")?,
        usd_cents: from_db(row.try_get("usd_cents")?),
        status: if status == "failed" {
            CheckoutStatus::Failed
        } else {
            CheckoutStatus::Pending
        },
        created_at: row.try_get("created_at")?,
    })
}

#[async_trait]
impl DeveloperStore for PostgresDeveloperStore {
    async fn insert_user(&self, user: User, by: &Actor) -> Result<bool, StoreError> {
        let inserted = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let inserted = sqlx::query(
                    "INSERT INTO dashboard_users
                         (id, email, password_hash, account_id, created_at, email_verified_at, role)
                     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (email) DO NOTHING",
                )
                .bind(&user.id)
                .bind(&user.email)
                .bind(&user.password_hash)
                .bind(&user.account_id)
                .bind(user.created_at)
                .bind(user.email_verified_at)
                .bind(user.role.as_str())
                .persistent(false)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                if inserted {
                    append_in(&mut tx, &of_user(&user, Action::SignedUp, by.clone())).await?;
                }
                tx.commit().await?;
                Ok(inserted)
            })
            .await?;
        Ok(inserted)
    }

    async fn user_by_email(&self, email: &str) -> Result<Option<User>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query("SELECT * FROM dashboard_users WHERE email = $1")
                    .bind(email)
                    .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(row
            .as_ref()
            .map(user_of)
            .transpose()
            .map_err(DbError::Sql)?)
    }

    async fn user_by_account(&self, account_id: &str) -> Result<Option<User>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query("SELECT * FROM dashboard_users WHERE account_id = $1 LIMIT 1")
                    .bind(account_id)
                    .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(row
            .as_ref()
            .map(user_of)
            .transpose()
            .map_err(DbError::Sql)?)
    }

    async fn insert_email_verification(
        &self,
        verification: EmailVerification,
    ) -> Result<(), StoreError> {
        // Expired links of anyone go with it, so the table does not grow without bound.
        self.db
            .bounded(
                sqlx::query(
                    "WITH expired AS (
                         DELETE FROM dashboard_email_verifications WHERE expires_at <= now()
                     )
                     INSERT INTO dashboard_email_verifications
                         (token_hash, user_id, password_hash, expires_at)
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(verification.token_hash.as_bytes())
                .bind(&verification.user_id)
                .bind(&verification.password_hash)
                .bind(verification.expires_at)
                .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    async fn verify_email(
        &self,
        token_hash: &KeyHash,
        client: Option<String>,
    ) -> Result<Option<User>, StoreError> {
        // One statement, so a link is followed once however many follow it at once: the
        // link's row is deleted and its user updated together, then the user's other links
        // and sessions go; the audit row in the same transaction.
        let verified = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let row = sqlx::query(
                    "WITH link AS (
                         DELETE FROM dashboard_email_verifications
                         WHERE token_hash = $1 AND expires_at > now()
                         RETURNING user_id, password_hash
                     ), verified AS (
                         UPDATE dashboard_users u
                         SET password_hash = link.password_hash, email_verified_at = now()
                         FROM link WHERE u.id = link.user_id AND u.email_verified_at IS NULL
                         RETURNING u.*
                     ), other_links AS (
                         DELETE FROM dashboard_email_verifications
                         WHERE user_id IN (SELECT id FROM verified) AND token_hash <> $1
                     ), sessions AS (
                         DELETE FROM dashboard_sessions
                         WHERE user_id IN (SELECT id FROM verified)
                     )
                     SELECT * FROM verified",
                )
                .bind(token_hash.as_bytes())
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                let verified = row.as_ref().map(user_of).transpose()?;
                if let Some(user) = &verified {
                    append_in(&mut tx, &verified_by(user, client)).await?;
                }
                tx.commit().await?;
                Ok(verified)
            })
            .await?;
        Ok(verified)
    }

    async fn insert_session(
        &self,
        session: Session,
        method: SignInMethod,
        by: &Actor,
    ) -> Result<(), StoreError> {
        self.db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                sqlx::query(
                    "INSERT INTO dashboard_sessions (token_hash, user_id, csrf, expires_at, last_used_at)
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(session.token_hash.as_bytes())
                .bind(&session.user_id)
                .bind(&session.csrf)
                .bind(session.expires_at)
                .bind(session.last_used_at)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &signed_in(&session, method, by)).await?;
                tx.commit().await
            })
            .await?;
        Ok(())
    }

    async fn session(
        &self,
        token_hash: &KeyHash,
        idle: Duration,
    ) -> Result<Option<Session>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT s.token_hash, s.user_id, s.csrf, s.expires_at, s.last_used_at,
                            u.email, u.account_id, u.role,
                            u.email_verified_at IS NOT NULL AS email_verified
                     FROM dashboard_sessions s JOIN dashboard_users u ON u.id = s.user_id
                     WHERE s.token_hash = $1",
                )
                .bind(token_hash.as_bytes())
                .fetch_optional(self.db.pool()),
            )
            .await?;
        let Some(mut session) = row
            .as_ref()
            .map(session_of)
            .transpose()
            .map_err(DbError::Sql)?
            .flatten()
        else {
            return Ok(None);
        };
        let now = OffsetDateTime::now_utc();
        match standing(&session, idle, now) {
            Standing::Ended => {
                self.delete_session(token_hash).await?;
                Ok(None)
            }
            Standing::Touch => {
                self.db
                    .bounded(
                        sqlx::query(
                            "UPDATE dashboard_sessions SET last_used_at = $2 WHERE token_hash = $1",
                        )
                        .bind(token_hash.as_bytes())
                        .bind(now)
                        .execute(self.db.pool()),
                    )
                    .await?;
                session.last_used_at = now;
                Ok(Some(session))
            }
            Standing::Alive => Ok(Some(session)),
        }
    }

    async fn delete_session(&self, token_hash: &KeyHash) -> Result<(), StoreError> {
        // Expired sessions of anyone go with it, so the table does not grow without bound.
        self.db
            .bounded(
                sqlx::query(
                    "DELETE FROM dashboard_sessions WHERE token_hash = $1 OR expires_at <= now()",
                )
                .bind(token_hash.as_bytes())
                .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    async fn sign_out(&self, session: &Session, by: &Actor) -> Result<(), StoreError> {
        self.db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let ended = sqlx::query("DELETE FROM dashboard_sessions WHERE token_hash = $1")
                    .bind(session.token_hash.as_bytes())
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if ended > 0 {
                    append_in(&mut tx, &signed_out(session, by)).await?;
                }
                tx.commit().await
            })
            .await?;
        Ok(())
    }

    async fn end_all_sessions(&self, session: &Session, by: &Actor) -> Result<u64, StoreError> {
        let ended = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let ended = sqlx::query("DELETE FROM dashboard_sessions WHERE user_id = $1")
                    .bind(&session.user_id)
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                append_in(&mut tx, &signed_out_everywhere(session, by)).await?;
                tx.commit().await.map(|()| ended)
            })
            .await?;
        Ok(ended)
    }

    async fn record_sign_in_failure(
        &self,
        email: &str,
        client: &str,
        window: Duration,
    ) -> Result<u32, StoreError> {
        // One statement: a failure after the window ended starts a new window.
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "INSERT INTO dashboard_sign_in_failures AS f (email, client, failures, window_ends)
                     VALUES ($1, $3, 1, now() + $2 * interval '1 second')
                     ON CONFLICT (email, client) DO UPDATE SET
                         failures = CASE WHEN f.window_ends <= now() THEN 1 ELSE f.failures + 1 END,
                         window_ends = CASE WHEN f.window_ends <= now() THEN EXCLUDED.window_ends
                                            ELSE f.window_ends END
                     RETURNING failures",
                )
                .bind(email)
                .bind(window.as_seconds_f64())
                .bind(client)
                .fetch_one(self.db.pool()),
            )
            .await?;
        let failures: i32 = row.try_get("failures").map_err(DbError::Sql)?;
        Ok(u32::try_from(failures).unwrap_or(0))
    }

    async fn sign_in_failures(
        &self,
        email: &str,
        client: &str,
    ) -> Result<Option<(u32, OffsetDateTime)>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT failures, window_ends FROM dashboard_sign_in_failures
                     WHERE email = $1 AND client = $2 AND window_ends > now()",
                )
                .bind(email)
                .bind(client)
                .fetch_optional(self.db.pool()),
            )
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let failures: i32 = row.try_get("failures").map_err(DbError::Sql)?;
        let ends: OffsetDateTime = row.try_get("window_ends").map_err(DbError::Sql)?;
        Ok(Some((u32::try_from(failures).unwrap_or(0), ends)))
    }

    async fn audit_refused_sign_in(&self, user: &User, by: &Actor) -> Result<(), StoreError> {
        self.db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                append_in(&mut tx, &sign_in_refused(user, by)).await?;
                tx.commit().await
            })
            .await?;
        Ok(())
    }

    async fn clear_sign_in_failures(&self, email: &str, client: &str) -> Result<(), StoreError> {
        self.db
            .bounded(
                sqlx::query(
                    "DELETE FROM dashboard_sign_in_failures WHERE email = $1 AND client = $2",
                )
                .bind(email)
                .bind(client)
                .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    async fn insert_checkout(&self, checkout: Checkout) -> Result<(), StoreError> {
        self.db
            .bounded(
                sqlx::query(
                    "INSERT INTO dashboard_checkouts (reference, account_id, usd_cents, status, created_at)
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&checkout.reference)
                .bind(&checkout.account_id)
                .bind(to_db(checkout.usd_cents))
                .bind(status_name(checkout.status))
                .bind(checkout.created_at)
                .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    async fn set_checkout_status(
        &self,
        reference: &str,
        status: CheckoutStatus,
    ) -> Result<(), StoreError> {
        self.db
            .bounded(
                sqlx::query("UPDATE dashboard_checkouts SET status = $2 WHERE reference = $1")
                    .bind(reference)
                    .bind(status_name(status))
                    .execute(self.db.pool()),
            )
            .await?;
        Ok(())
    }

    async fn checkouts(&self, account_id: &str) -> Result<Vec<Checkout>, StoreError> {
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT * FROM dashboard_checkouts WHERE account_id = $1
                     ORDER BY created_at DESC LIMIT 1000",
                )
                .bind(account_id)
                .fetch_all(self.db.pool()),
            )
            .await?;
        Ok(rows
            .iter()
            .map(checkout_of)
            .collect::<Result<_, _>>()
            .map_err(DbError::Sql)?)
    }

    async fn members(&self, account_id: &str) -> Result<Vec<User>, StoreError> {
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT * FROM dashboard_users WHERE account_id = $1
                     ORDER BY created_at, id LIMIT 1000",
                )
                .bind(account_id)
                .fetch_all(self.db.pool()),
            )
            .await?;
        Ok(rows
            .iter()
            .map(user_of)
            .collect::<Result<_, _>>()
            .map_err(DbError::Sql)?)
    }

    async fn invite(
        &self,
        invitation: Invitation,
        by: &Actor,
        limits: InvitationLimits,
    ) -> Result<Result<(), InvitationLimit>, StoreError> {
        Ok(self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                // One invitation of the organization, and one to the address, at a time, so
                // that concurrent ones cannot all pass the limits.
                sqlx::query(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 40)),
                            pg_advisory_xact_lock(hashtextextended($2, 41))",
                )
                .bind(&invitation.account_id)
                .bind(&invitation.email)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
                // The audit log's rows of sent invitations (migration 0028's partial
                // indexes): a withdrawn invitation stays counted.
                let sent = "action = 'invitation_sent' AND at > now() - make_interval(secs => $2)";
                let window = limits.window.as_seconds_f64();
                let by_organization: i64 = sqlx::query_scalar(&format!(
                    "SELECT count(*) FROM audit_log WHERE account_id = $1 AND {sent}"
                ))
                .bind(&invitation.account_id)
                .bind(window)
                .persistent(false)
                .fetch_one(&mut *tx)
                .await?;
                if by_organization >= i64::from(limits.per_organization) {
                    return Ok(Err(InvitationLimit::Organization));
                }
                let to_address: i64 = sqlx::query_scalar(&format!(
                    "SELECT count(*) FROM audit_log WHERE target = $1 AND {sent}"
                ))
                .bind(&invitation.email)
                .bind(window)
                .persistent(false)
                .fetch_one(&mut *tx)
                .await?;
                if to_address >= i64::from(limits.per_address) {
                    return Ok(Err(InvitationLimit::Address));
                }
                // Expired invitations of anyone go with it, so the table does not grow
                // without bound.
                sqlx::query(
                    "WITH expired AS (
                         DELETE FROM dashboard_invitations WHERE expires_at <= now()
                     )
                     INSERT INTO dashboard_invitations
                         (token_hash, account_id, email, role, invited_by, created_at, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(invitation.token_hash.as_bytes())
                .bind(&invitation.account_id)
                .bind(&invitation.email)
                .bind(invitation.role.as_str())
                .bind(&invitation.invited_by)
                .bind(invitation.created_at)
                .bind(invitation.expires_at)
                .persistent(false)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &organizations::invitation_sent(&invitation, by)).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(Ok(()))
            })
            .await?)
    }

    async fn invitations(&self, account_id: &str) -> Result<Vec<Invitation>, StoreError> {
        let rows = self
            .db
            .bounded(
                sqlx::query(
                    "SELECT * FROM dashboard_invitations
                     WHERE account_id = $1 AND expires_at > now()
                     ORDER BY created_at LIMIT 1000",
                )
                .bind(account_id)
                .fetch_all(self.db.pool()),
            )
            .await?;
        let pending: Vec<Option<Invitation>> = rows
            .iter()
            .map(invitation_of)
            .collect::<Result<_, _>>()
            .map_err(DbError::Sql)?;
        Ok(pending.into_iter().flatten().collect())
    }

    async fn accept_invitation(
        &self,
        token_hash: &KeyHash,
        user_id: &str,
        by: &Actor,
    ) -> Result<Acceptance, StoreError> {
        let accepted = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                // The invitation's row is locked first: of two acceptances at once, the
                // second finds it gone.
                let row = sqlx::query(
                    "SELECT * FROM dashboard_invitations
                     WHERE token_hash = $1 AND expires_at > now() FOR UPDATE",
                )
                .bind(token_hash.as_bytes())
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(invitation) = row.as_ref().map(invitation_of).transpose()?.flatten()
                else {
                    return Ok(Acceptance::Unknown);
                };
                let row = sqlx::query("SELECT account_id FROM dashboard_users WHERE id = $1")
                    .bind(user_id)
                    .persistent(false)
                    .fetch_optional(&mut *tx)
                    .await?;
                let Some(from) = row
                    .map(|r| r.try_get::<String, _>("account_id"))
                    .transpose()?
                else {
                    return Ok(Acceptance::Unknown);
                };
                let members = lock_members(&mut tx, &from).await?;
                let Some(before) = members.iter().find(|u| u.id == user_id) else {
                    return Ok(Acceptance::Unknown);
                };
                if before.email != invitation.email {
                    return Ok(Acceptance::WrongEmail);
                }
                if !organizations::may_leave(&roles(&members), before) {
                    return Ok(Acceptance::LastOwner);
                }
                let row = sqlx::query(
                    "WITH spent AS (
                         DELETE FROM dashboard_invitations WHERE token_hash = $1
                     ), sessions AS (
                         DELETE FROM dashboard_sessions WHERE user_id = $2
                     )
                     UPDATE dashboard_users SET account_id = $3, role = $4
                     WHERE id = $2 RETURNING *",
                )
                .bind(token_hash.as_bytes())
                .bind(user_id)
                .bind(&invitation.account_id)
                .bind(invitation.role.as_str())
                .persistent(false)
                .fetch_one(&mut *tx)
                .await?;
                let after = user_of(&row)?;
                append_in(
                    &mut tx,
                    &organizations::invitation_accepted(before, &after, by),
                )
                .await?;
                tx.commit().await?;
                Ok(Acceptance::Accepted(after))
            })
            .await?;
        Ok(accepted)
    }

    async fn change_role(
        &self,
        account_id: &str,
        user_id: &str,
        role: Role,
        acting: Role,
        by: &Actor,
    ) -> Result<MemberChange, StoreError> {
        let changed = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let members = lock_members(&mut tx, account_id).await?;
                let before = match member_to_change(&members, user_id, Some(role), acting) {
                    Ok(member) => member,
                    Err(refused) => return Ok(MemberChange::Refused(refused)),
                };
                sqlx::query(
                    "WITH sessions AS (DELETE FROM dashboard_sessions WHERE user_id = $1)
                     UPDATE dashboard_users SET role = $2 WHERE id = $1",
                )
                .bind(user_id)
                .bind(role.as_str())
                .persistent(false)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &organizations::role_changed(&before, role, by)).await?;
                tx.commit().await?;
                Ok(MemberChange::Done(before))
            })
            .await?;
        Ok(changed)
    }

    async fn remove_member(
        &self,
        account_id: &str,
        user_id: &str,
        acting: Role,
        by: &Actor,
    ) -> Result<MemberChange, StoreError> {
        let removed = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let members = lock_members(&mut tx, account_id).await?;
                let before = match member_to_change(&members, user_id, None, acting) {
                    Ok(member) => member,
                    Err(refused) => return Ok(MemberChange::Refused(refused)),
                };
                // Their sessions and links go with the user (ON DELETE CASCADE).
                sqlx::query("DELETE FROM dashboard_users WHERE id = $1")
                    .bind(user_id)
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?;
                append_in(&mut tx, &organizations::removed(&before, by)).await?;
                tx.commit().await?;
                Ok(MemberChange::Done(before))
            })
            .await?;
        Ok(removed)
    }

    async fn claim_domain(&self, claim: DomainClaim, by: &Actor) -> Result<bool, StoreError> {
        let claimed = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let proven =
                    sqlx::query("SELECT * FROM dashboard_domains WHERE domain = $1 FOR UPDATE")
                        .bind(&claim.domain)
                        .persistent(false)
                        .fetch_optional(&mut *tx)
                        .await?;
                let held = match proven {
                    // Another organization proved it: refused.
                    Some(row) if claim_of(&row)?.account_id != claim.account_id => {
                        return Ok(false)
                    }
                    Some(_) => {
                        sqlx::query(
                            "UPDATE dashboard_domains SET require_sso = $3
                             WHERE domain = $1 AND account_id = $2 RETURNING *",
                        )
                        .bind(&claim.domain)
                        .bind(&claim.account_id)
                        .bind(claim.require_sso)
                        .persistent(false)
                        .fetch_one(&mut *tx)
                        .await?
                    }
                    None => {
                        sqlx::query(
                            "INSERT INTO dashboard_pending_domains
                                 (domain, account_id, require_sso, claimed_at, txt_token)
                             VALUES ($1, $2, $3, $4, $5)
                             ON CONFLICT (domain, account_id)
                             DO UPDATE SET require_sso = EXCLUDED.require_sso
                             RETURNING *",
                        )
                        .bind(&claim.domain)
                        .bind(&claim.account_id)
                        .bind(claim.require_sso)
                        .bind(claim.claimed_at)
                        .bind(claim.txt_token.as_deref().unwrap_or_default())
                        .persistent(false)
                        .fetch_one(&mut *tx)
                        .await?
                    }
                };
                append_in(&mut tx, &sso::domain_claimed(&claim_of(&held)?, by)).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(true)
            })
            .await?;
        Ok(claimed)
    }

    async fn release_domain(
        &self,
        account_id: &str,
        domain: &str,
        by: &Actor,
    ) -> Result<bool, StoreError> {
        Ok(self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let mut released = None;
                for table in ["dashboard_domains", "dashboard_pending_domains"] {
                    released = sqlx::query(&format!(
                        "DELETE FROM {table} WHERE domain = $1 AND account_id = $2 RETURNING *"
                    ))
                    .bind(domain)
                    .bind(account_id)
                    .persistent(false)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if released.is_some() {
                        break;
                    }
                }
                let Some(row) = released else {
                    return Ok(false);
                };
                let claim = claim_of(&row)?;
                append_in(&mut tx, &sso::domain_released(&claim, by)).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(true)
            })
            .await?)
    }

    async fn domain_claim(&self, domain: &str) -> Result<Option<DomainClaim>, StoreError> {
        let row = self
            .db
            .bounded(
                sqlx::query("SELECT * FROM dashboard_domains WHERE domain = $1")
                    .bind(domain)
                    .fetch_optional(self.db.pool()),
            )
            .await?;
        Ok(row
            .as_ref()
            .map(claim_of)
            .transpose()
            .map_err(DbError::Sql)?)
    }

    async fn domain_claims(&self, account_id: &str) -> Result<Vec<DomainClaim>, StoreError> {
        let (proven, pending) = self
            .db
            .bounded(async {
                let proven = sqlx::query("SELECT * FROM dashboard_domains WHERE account_id = $1")
                    .bind(account_id)
                    .fetch_all(self.db.pool())
                    .await?;
                let pending =
                    sqlx::query("SELECT * FROM dashboard_pending_domains WHERE account_id = $1")
                        .bind(account_id)
                        .fetch_all(self.db.pool())
                        .await?;
                Ok::<_, sqlx::Error>((proven, pending))
            })
            .await?;
        let mut claims: Vec<DomainClaim> = proven
            .iter()
            .chain(&pending)
            .map(claim_of)
            .collect::<Result<_, _>>()
            .map_err(DbError::Sql)?;
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
        Ok(self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                let proving = prove_in(&mut tx, account_id, domain, proof, by).await?;
                if matches!(proving, Proving::Proven(_)) {
                    tx.commit().await?;
                }
                Ok::<_, sqlx::Error>(proving)
            })
            .await?)
    }

    async fn mail_domain_proof(
        &self,
        account_id: &str,
        domain: &str,
        to: &str,
        token_hash: &KeyHash,
        expires_at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let updated = self
            .db
            .bounded(
                sqlx::query(
                    "UPDATE dashboard_pending_domains
                     SET mail_to = $3, mail_token_hash = $4, mail_expires_at = $5
                     WHERE domain = $1 AND account_id = $2",
                )
                .bind(domain)
                .bind(account_id)
                .bind(to)
                .bind(token_hash.as_bytes())
                .bind(expires_at)
                .persistent(false)
                .execute(self.db.pool()),
            )
            .await?
            .rows_affected();
        Ok(updated == 1)
    }

    async fn prove_domain_by_mail(
        &self,
        token_hash: &KeyHash,
        now: OffsetDateTime,
        by: &Actor,
    ) -> Result<Proving, StoreError> {
        Ok(self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                // The link is spent as it is read (looked up by the SHA-256 of a 256-bit
                // random token, which nobody can approach byte by byte through timing).
                let spent = sqlx::query(
                    "UPDATE dashboard_pending_domains pending
                     SET mail_token_hash = NULL, mail_expires_at = NULL
                     FROM (SELECT domain, account_id, mail_expires_at
                           FROM dashboard_pending_domains
                           WHERE mail_token_hash = $1 FOR UPDATE) link
                     WHERE pending.domain = link.domain AND pending.account_id = link.account_id
                     RETURNING pending.*, link.mail_expires_at AS link_expires_at",
                )
                .bind(token_hash.as_bytes())
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = spent else {
                    return Ok(Proving::NoClaim);
                };
                let claim = claim_of(&row)?;
                let expires_at: Option<OffsetDateTime> = row.try_get("link_expires_at")?;
                if expires_at.is_none_or(|at| at <= now) {
                    tx.commit().await?;
                    return Ok(Proving::NoClaim);
                }
                let by = Actor {
                    id: claim.mail_to.clone().unwrap_or_default(),
                    ..by.clone()
                };
                let proving = prove_in(
                    &mut tx,
                    &claim.account_id,
                    &claim.domain,
                    DomainProof::Mail,
                    &by,
                )
                .await?;
                if matches!(proving, Proving::Proven(_)) {
                    tx.commit().await?;
                }
                Ok::<_, sqlx::Error>(proving)
            })
            .await?)
    }

    async fn txt_proven_domains(&self) -> Result<Vec<DomainClaim>, StoreError> {
        let rows = self
            .db
            .bounded(
                sqlx::query("SELECT * FROM dashboard_domains WHERE proof = 'txt'")
                    .fetch_all(self.db.pool()),
            )
            .await?;
        Ok(rows
            .iter()
            .map(claim_of)
            .collect::<Result<_, _>>()
            .map_err(DbError::Sql)?)
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
        Ok(self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                // The row's lock makes each pod's re-check of one claim a step of its own: a
                // second pod finds the claim lapsed already, and audits nothing.
                let marked = sqlx::query(
                    "UPDATE dashboard_domains
                     SET missing_since = CASE WHEN $3 THEN NULL
                                              ELSE COALESCE(missing_since, $4) END
                     WHERE domain = $1 AND account_id = $2 AND proof = 'txt'
                     RETURNING *",
                )
                .bind(domain)
                .bind(account_id)
                .bind(found)
                .bind(now)
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = marked else {
                    return Ok(Recheck::Kept);
                };
                let claim = claim_of(&row)?;
                let since = match claim.missing_since {
                    Some(since) if lapses(since, now, grace) => since,
                    Some(_) => {
                        tx.commit().await?;
                        return Ok(Recheck::Missing);
                    }
                    None => {
                        tx.commit().await?;
                        return Ok(Recheck::Kept);
                    }
                };
                sqlx::query("DELETE FROM dashboard_domains WHERE domain = $1 AND account_id = $2")
                    .bind(domain)
                    .bind(account_id)
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO dashboard_pending_domains
                         (domain, account_id, require_sso, claimed_at, txt_token)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (domain, account_id) DO NOTHING",
                )
                .bind(&claim.domain)
                .bind(&claim.account_id)
                .bind(claim.require_sso)
                .bind(claim.claimed_at)
                .bind(claim.txt_token.as_deref().unwrap_or_default())
                .persistent(false)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &sso::domain_lapsed(&claim, since, by)).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(Recheck::Lapsed)
            })
            .await?)
    }

    async fn audit_refused_sso(
        &self,
        user: &User,
        method: SignInMethod,
        reason: &str,
        by: &Actor,
    ) -> Result<(), StoreError> {
        let row = sso::sso_refused(user, method, reason, by);
        self.db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                append_in(&mut tx, &row).await?;
                tx.commit().await
            })
            .await?;
        Ok(())
    }

    async fn insert_sso_login(
        &self,
        state_hash: &KeyHash,
        expires_at: OffsetDateTime,
    ) -> Result<(), StoreError> {
        self.db
            .bounded(async {
                sqlx::query("DELETE FROM dashboard_sso_logins WHERE expires_at <= now()")
                    .execute(self.db.pool())
                    .await?;
                sqlx::query(
                    "INSERT INTO dashboard_sso_logins (state_hash, expires_at) VALUES ($1, $2)",
                )
                .bind(state_hash.as_bytes())
                .bind(expires_at)
                .execute(self.db.pool())
                .await
            })
            .await?;
        Ok(())
    }

    async fn take_sso_login(&self, state_hash: &KeyHash) -> Result<bool, StoreError> {
        let taken = self
            .db
            .bounded(
                sqlx::query(
                    "DELETE FROM dashboard_sso_logins WHERE state_hash = $1 AND expires_at > now()",
                )
                .bind(state_hash.as_bytes())
                .execute(self.db.pool()),
            )
            .await?;
        Ok(taken.rows_affected() == 1)
    }

    async fn withdraw_invitation(
        &self,
        account_id: &str,
        token_hash: &KeyHash,
        acting: Role,
        by: &Actor,
    ) -> Result<bool, StoreError> {
        let withdrawn = self
            .db
            .bounded(async {
                let mut tx = self.db.pool().begin().await?;
                // Locked, so that an acceptance at the same moment finds it gone or waits.
                let row = sqlx::query(
                    "SELECT * FROM dashboard_invitations
                     WHERE token_hash = $1 AND account_id = $2 AND expires_at > now()
                     FOR UPDATE",
                )
                .bind(token_hash.as_bytes())
                .bind(account_id)
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(invitation) = row.as_ref().map(invitation_of).transpose()?.flatten()
                else {
                    return Ok(false);
                };
                if !acting.may_manage(None, Some(invitation.role)) {
                    return Ok(false);
                }
                sqlx::query("DELETE FROM dashboard_invitations WHERE token_hash = $1")
                    .bind(token_hash.as_bytes())
                    .persistent(false)
                    .execute(&mut *tx)
                    .await?;
                append_in(
                    &mut tx,
                    &organizations::invitation_withdrawn(&invitation, by),
                )
                .await?;
                tx.commit().await?;
                Ok(true)
            })
            .await?;
        Ok(withdrawn)
    }
}
