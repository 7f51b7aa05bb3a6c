//! `/developers/members` (owners and admins): the organization's members and pending
//! invitations; inviting by email with a role, changing a role, removing a member (and, if
//! asked, revoking the keys they created). `/developers/invitations/accept`: the page a mailed
//! invitation opens, accepted by a user signed in with the invited email.
//!
//! The member rules (an admin never touches an owner nor makes one, an organization keeps an
//! owner) are the store's, checked in the same step as the change; a change of a member's
//! role or membership ends their sessions there, so their next request is signed out.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{html, Markup};
use serde::Deserialize;
use time::OffsetDateTime;

use super::account::{link_token, normalize, plausible_email};
use super::domains;
use super::error::DashboardError;
use super::form::HtmlForm;
use super::layout::{bare, datetime, notice, page, with_status, Nav};
use super::mail::{self, Mail, INVITATION_PATH};
use super::public_domains::public_mail_domain;
use super::session::{self, needs, Allowed, NotSignedIn, SignedIn};
use crate::client_address::ClientAddress;
use crate::state::DashboardState;
use gateway_core::ids;
use store::accounts::KeyHash;
use store::developers::{
    domain_of, Acceptance, DomainClaim, DomainProof, Invitation, InvitationLimit, InvitationLimits,
    MemberChange, Proving, Refusal, Role, Session, SignInMethod, User, ROLES,
};

/// Why a claim or a proof of a domain another organization has proven is refused.
const PROVEN_ELSEWHERE: &str =
    "Another organization has proven this domain: it cannot be claimed until that organization releases it.";

/// Pending invitations an organization may have at once: each is a mail to any address, so a
/// member cannot make the gateway mail strangers without bound.
const MAX_PENDING_INVITATIONS: usize = 50;
/// Invitations sent within an hour, withdrawn ones included: by one organization, and to one
/// address from every organization (so withdrawing and inviting again mails no more).
const INVITATION_LIMITS: InvitationLimits = InvitationLimits {
    per_organization: 100,
    per_address: 5,
    window: time::Duration::HOUR,
};

#[derive(Deserialize)]
pub struct InviteForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    email: String,
    #[serde(default)]
    role: String,
}

#[derive(Deserialize)]
pub struct RoleForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    role: String,
}

#[derive(Deserialize)]
pub struct RemoveForm {
    #[serde(default)]
    csrf: String,
    /// Present (a checked box): revoke the keys the member created.
    #[serde(default)]
    revoke_keys: Option<String>,
}

#[derive(Deserialize)]
pub struct AcceptForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token: String,
}

#[derive(Deserialize)]
pub struct InvitationLink {
    #[serde(default)]
    token: String,
}

enum Flash<'a> {
    None,
    Done(&'a str),
    Error(&'a str),
}

fn role_label(role: Role) -> &'static str {
    match role {
        Role::Owner => "Owner: billing, members, everything",
        Role::Admin => "Admin: keys, caps, members other than owners",
        Role::Developer => "Developer: their own keys, usage",
        Role::Billing => "Billing: top-ups, invoices, usage; no keys",
    }
}

/// The roles `acting` may give a member now in role `from` (`None`: an invitee).
fn grantable(acting: Role, from: Option<Role>) -> impl Iterator<Item = Role> {
    ROLES
        .into_iter()
        .filter(move |to| acting.may_manage(from, Some(*to)))
}

#[derive(Deserialize)]
pub struct DomainForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    domain: String,
    /// Present (a checked box): password sign-in of the domain's emails is refused.
    #[serde(default)]
    require_sso: Option<String>,
}

/// A domain as an email's part after `@` can be: letters, digits, `-` and `.`, with a dot.
fn plausible_domain(domain: &str) -> bool {
    plausible_email(&format!("x@{domain}"))
        && domain.len() <= 253
        && domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

/// A claim's proof: how it was proven, or, pending, the TXT record to publish with its Verify
/// button and the form that mails a link to an address at the domain.
fn proof_cell(session: &Session, claim: &DomainClaim) -> Markup {
    html! {
        @match claim.proof {
            Some(proof) => {
                span.proven { (match proof {
                    DomainProof::Txt => "proven by its TXT record",
                    DomainProof::Mail => "proven by a mailed link",
                    DomainProof::SignUp => "proven by the owner's verified address",
                }) }
                @if let Some(since) = claim.missing_since {
                    " (the record was missing at re-checks since " (datetime(since)) ")"
                }
            }
            None => {
                p { strong { "Pending." } " Publish this TXT record, then press Verify:" }
                dl.record {
                    dt { "Name" } dd { code.record-name { (domains::record_name(&claim.domain)) } }
                    dt { "Value" } dd { code.record-value { (domains::record_value(claim.txt_token.as_deref().unwrap_or_default())) } }
                }
                form method="post" action="/developers/members/domains/verify" {
                    input type="hidden" name="csrf" value=(session.csrf);
                    input type="hidden" name="domain" value=(claim.domain);
                    button.primary type="submit" aria-label=(format!("Verify {}", claim.domain)) { "Verify" }
                }
                form.inline method="post" action="/developers/members/domains/mail" {
                    input type="hidden" name="csrf" value=(session.csrf);
                    input type="hidden" name="domain" value=(claim.domain);
                    label for=(format!("proof-mail-{}", claim.domain)) { "Or mail a link to" }
                    input id=(format!("proof-mail-{}", claim.domain)) type="email" name="email" required placeholder=(format!("someone@{}", claim.domain));
                    button type="submit" aria-label=(format!("Mail a link for {}", claim.domain)) { "Mail link" }
                }
                @if let Some(to) = &claim.mail_to {
                    p.hint { "A link was mailed to " (to) "." }
                }
            }
        }
    }
}

fn view(
    session: &Session,
    members: &[User],
    invitations: &[Invitation],
    domains: &[DomainClaim],
    flash: Flash<'_>,
) -> Markup {
    let acting = session.role;
    let content = html! {
        @match flash {
            Flash::Done(message) => (notice("success", message)),
            Flash::Error(message) => (notice("error", message)),
            Flash::None => {}
        }
        section.card {
            h2 { "Members" }
            div.table-wrap {
                table #members {
                    thead { tr {
                        th scope="col" { "Email" } th scope="col" { "Role" } th scope="col" { "Signed up" }
                        th scope="col" { span.sr-only { "Remove" } }
                    } }
                    tbody {
                        @for member in members {
                            tr data-member=(member.email) {
                                td { (member.email) @if member.id == session.user_id { " " span.hint { "(you)" } } }
                                td.role {
                                    @if acting.may_manage(Some(member.role), None) {
                                        form.member-action method="post" action=(format!("/developers/members/{}/role", member.id)) {
                                            input type="hidden" name="csrf" value=(session.csrf);
                                            select name="role" aria-label=(format!("Role of {}", member.email)) {
                                                @for role in grantable(acting, Some(member.role)) {
                                                    option value=(role.as_str()) selected[role == member.role] { (role.as_str()) }
                                                }
                                            }
                                            button type="submit" { "Change" }
                                        }
                                    } @else {
                                        span.badge.role { (member.role.as_str()) }
                                    }
                                }
                                td { (datetime(member.created_at)) }
                                td {
                                    @if acting.may_manage(Some(member.role), None) {
                                        form.member-action method="post" action=(format!("/developers/members/{}/remove", member.id)) {
                                            input type="hidden" name="csrf" value=(session.csrf);
                                            button.danger type="submit" aria-label=(format!("Remove {}", member.email)) { "Remove" }
                                            label.check { input type="checkbox" name="revoke_keys" value="on"; " and revoke their keys" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        section.card {
            h2 { "Pending invitations" }
            @if invitations.is_empty() {
                p.empty { "No pending invitations." }
            } @else {
                div.table-wrap {
                    table #invitations {
                        thead { tr {
                            th scope="col" { "Email" } th scope="col" { "Role" }
                            th scope="col" { "Invited by" } th scope="col" { "Expires" }
                            th scope="col" { span.sr-only { "Withdraw" } }
                        } }
                        tbody {
                            @for invitation in invitations {
                                tr data-invited=(invitation.email) {
                                    td { (invitation.email) }
                                    td { span.badge.role { (invitation.role.as_str()) } }
                                    td { (invitation.invited_by) }
                                    td { (datetime(invitation.expires_at)) }
                                    td {
                                        @if acting.may_manage(None, Some(invitation.role)) {
                                            form.member-action method="post" action=(format!("/developers/members/invitations/{}/withdraw", hex::encode(invitation.token_hash.as_bytes()))) {
                                                input type="hidden" name="csrf" value=(session.csrf);
                                                button.danger type="submit" aria-label=(format!("Withdraw the invitation of {}", invitation.email)) { "Withdraw" }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        section.card {
            h2 { "Invite someone" }
            form.grid-form method="post" action="/developers/members/invite" {
                input type="hidden" name="csrf" value=(session.csrf);
                div.field {
                    label for="invite-email" { "Email" }
                    input #invite-email type="email" name="email" required placeholder="colleague@example.com";
                }
                div.field {
                    label for="invite-role" { "Role" }
                    select #invite-role name="role" {
                        @for role in grantable(acting, None) {
                            option value=(role.as_str()) selected[role == Role::Developer] { (role_label(role)) }
                        }
                    }
                }
                div.field.actions { button.primary #invite type="submit" { "Send invitation" } }
            }
            p.hint { "The invitation is a link mailed to the address; it works once, only for a user signed in with that address, until it expires." }
        }
        @if acting == Role::Owner || acting == Role::Admin {
            section.card {
                h2 { "Single sign-on domains" }
                @if domains.is_empty() {
                    p.empty { "No domain claimed." }
                } @else {
                    div.table-wrap {
                        table #domains {
                            thead { tr { th scope="col" { "Domain" } th scope="col" { "Proof" } th scope="col" { "Password sign-in of members" } th scope="col" { span.sr-only { "Release" } } } }
                            tbody {
                                @for claim in domains {
                                    tr data-domain=(claim.domain) data-status=(if claim.proof.is_some() { "proven" } else { "pending" }) {
                                        td { (claim.domain) }
                                        td { (proof_cell(session, claim)) }
                                        td { @if claim.require_sso { "refused: SSO required" } @else { "allowed" } }
                                        td {
                                            @if acting == Role::Owner {
                                                form method="post" action="/developers/members/domains/release" {
                                                    input type="hidden" name="csrf" value=(session.csrf);
                                                    input type="hidden" name="domain" value=(claim.domain);
                                                    button.danger type="submit" aria-label=(format!("Release {}", claim.domain)) { "Release" }
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                @if acting == Role::Owner {
                    form.grid-form method="post" action="/developers/members/domains" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        div.field {
                            label for="claim-domain" { "Domain" }
                            input #claim-domain type="text" name="domain" required value=(domain_of(&session.email).unwrap_or_default());
                        }
                        div.field { label.check { input #require-sso type="checkbox" name="require_sso" value="on"; " Require single sign-on" } }
                        div.field.actions { button.primary #claim type="submit" { "Claim domain" } }
                    }
                }
                p.hint { "A claim is pending, with no effect, until the organization proves it controls the domain: publish the TXT record shown and press Verify, or mail a link to an address at the domain and follow it. A public mail provider's domain cannot be claimed. New users signing in through single sign-on with a verified email of a proven domain join this organization; requiring single sign-on refuses password sign-in to this organization's members of the domain only. A TXT record is looked up again daily: gone for longer than the grace period, the claim is pending again. A domain is proven by one organization at a time, until it releases it." }
            }
        }
    };
    page(session, Nav::Members, "Members", content)
}

async fn render(
    state: &DashboardState,
    session: &Session,
    status: StatusCode,
    flash: Flash<'_>,
) -> Result<Response, DashboardError> {
    let members = state.developers.members(&session.account_id).await?;
    let invitations = state.developers.invitations(&session.account_id).await?;
    let domains = state.developers.domain_claims(&session.account_id).await?;
    Ok(with_status(
        status,
        view(session, &members, &invitations, &domains, flash),
    ))
}

/// `POST /developers/members/invitations/{id}/withdraw`: withdraws a pending invitation (its
/// link stops working), if the member may invite in its role. `id` is the hex SHA-256 the store
/// keeps, never the mailed token.
pub async fn withdraw(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    Path(id): Path<String>,
    allowed: Allowed<needs::Members>,
    HtmlForm(form): HtmlForm<CsrfForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    let token_hash = hex::decode(&id)
        .ok()
        .and_then(|bytes| KeyHash::from_bytes(&bytes));
    let withdrawn = match token_hash {
        Some(token_hash) => {
            let by = session::actor(&session.email, client);
            state
                .developers
                .withdraw_invitation(&session.account_id, &token_hash, session.role, &by)
                .await?
        }
        None => false,
    };
    if withdrawn {
        render(
            &state,
            session,
            StatusCode::OK,
            Flash::Done("Invitation withdrawn."),
        )
        .await
    } else {
        render(
            &state,
            session,
            StatusCode::NOT_FOUND,
            Flash::Error("No such pending invitation, or not yours to withdraw."),
        )
        .await
    }
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

/// `POST /developers/members/domains` (owners): claims an email domain for single sign-on, or
/// changes whether it requires it.
pub async fn claim_domain(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    allowed: Allowed<needs::Members>,
    HtmlForm(form): HtmlForm<DomainForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    if session.role != Role::Owner {
        return Ok(NotSignedIn::Forbidden(session.clone()).into_response());
    }
    let domain = normalize(&form.domain);
    if !plausible_domain(&domain) {
        return render(
            &state,
            session,
            StatusCode::UNPROCESSABLE_ENTITY,
            Flash::Error("Enter a domain such as example.com."),
        )
        .await;
    }
    // A public mail provider's domain proves nothing about an organization: anyone has an
    // address there.
    if public_mail_domain(&domain) {
        return render(
            &state,
            session,
            StatusCode::FORBIDDEN,
            Flash::Error("A public mail provider's domain cannot be claimed."),
        )
        .await;
    }
    // Requiring single sign-on where there is none to use would only lock the members out.
    if form.require_sso.is_some() && state.settings.sso.is_none() {
        return render(
            &state,
            session,
            StatusCode::UNPROCESSABLE_ENTITY,
            Flash::Error("Single sign-on is not set up here: it cannot be required."),
        )
        .await;
    }
    // The claim is pending, with no effect, until proven (a TXT record or a mailed link), so
    // any domain may be claimed; the token names this claim's record.
    let claim = DomainClaim {
        domain,
        account_id: session.account_id.clone(),
        require_sso: form.require_sso.is_some(),
        claimed_at: OffsetDateTime::now_utc(),
        txt_token: Some(ids::session_token()),
        proof: None,
        missing_since: None,
        mail_to: None,
    };
    let by = session::actor(&session.email, client);
    if state.developers.claim_domain(claim, &by).await? {
        render(
            &state,
            session,
            StatusCode::OK,
            Flash::Done("Domain claimed. It has no effect until proven: publish its TXT record and press Verify, or mail a link to an address at the domain."),
        )
        .await
    } else {
        render(
            &state,
            session,
            StatusCode::CONFLICT,
            Flash::Error(PROVEN_ELSEWHERE),
        )
        .await
    }
}

/// `POST /developers/members/domains/release` (owners): releases a domain the organization
/// claimed, audited; its members sign in with their passwords again, and new single sign-on
/// users of the domain join no organization until one claims it.
pub async fn release_domain(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    allowed: Allowed<needs::Members>,
    HtmlForm(form): HtmlForm<DomainForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    if session.role != Role::Owner {
        return Ok(NotSignedIn::Forbidden(session.clone()).into_response());
    }
    let domain = normalize(&form.domain);
    let by = session::actor(&session.email, client);
    if state
        .developers
        .release_domain(&session.account_id, &domain, &by)
        .await?
    {
        render(
            &state,
            session,
            StatusCode::OK,
            Flash::Done("Domain released."),
        )
        .await
    } else {
        render(
            &state,
            session,
            StatusCode::NOT_FOUND,
            Flash::Error("This organization has not claimed that domain."),
        )
        .await
    }
}

#[derive(Deserialize)]
pub struct ProofMailForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    domain: String,
    #[serde(default)]
    email: String,
}

#[derive(Deserialize)]
pub struct ProofLink {
    #[serde(default)]
    token: String,
}

/// The account's pending claim of `domain`, if any.
async fn pending_claim(
    state: &DashboardState,
    account_id: &str,
    domain: &str,
) -> Result<Option<DomainClaim>, DashboardError> {
    Ok(state
        .developers
        .domain_claims(account_id)
        .await?
        .into_iter()
        .find(|c| c.domain == domain && c.proof.is_none()))
}

/// What proving a claim did, as the members page says it.
async fn proven(
    state: &DashboardState,
    session: &Session,
    proving: Proving,
) -> Result<Response, DashboardError> {
    match proving {
        Proving::Proven(_) => {
            render(
                state,
                session,
                StatusCode::OK,
                Flash::Done("Domain proven."),
            )
            .await
        }
        Proving::Taken => {
            render(
                state,
                session,
                StatusCode::CONFLICT,
                Flash::Error(PROVEN_ELSEWHERE),
            )
            .await
        }
        Proving::NoClaim => {
            render(
                state,
                session,
                StatusCode::NOT_FOUND,
                Flash::Error("This organization has no pending claim of that domain."),
            )
            .await
        }
    }
}

/// `POST /developers/members/domains/verify` (owners and admins): looks up the pending claim's
/// TXT record and proves the claim when it holds the claim's value. Braked per organization
/// (each press is a lookup made on its behalf).
pub async fn verify_domain(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    allowed: Allowed<needs::Members>,
    HtmlForm(form): HtmlForm<DomainForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    if !matches!(session.role, Role::Owner | Role::Admin) {
        return Ok(NotSignedIn::Forbidden(session.clone()).into_response());
    }
    let domain = normalize(&form.domain);
    let Some(claim) = pending_claim(&state, &session.account_id, &domain).await? else {
        return proven(&state, session, Proving::NoClaim).await;
    };
    let checks = &state.settings.domains;
    if !checks.take_verify(&session.account_id) {
        return render(
            &state,
            session,
            StatusCode::TOO_MANY_REQUESTS,
            Flash::Error(
                "Too many verifications for this organization: wait a minute and try again.",
            ),
        )
        .await;
    }
    let token = claim.txt_token.as_deref().unwrap_or_default();
    match checks.txt_found(&domain, token).await {
        Ok(true) => {
            let by = session::actor(&session.email, client);
            let proving = state
                .developers
                .prove_domain(&session.account_id, &domain, DomainProof::Txt, &by)
                .await?;
            proven(&state, session, proving).await
        }
        Ok(false) => {
            let message = format!(
                "No TXT record {} with the value {} was found. Publish it (DNS changes may take a while to show) and press Verify again.",
                domains::record_name(&domain),
                domains::record_value(token)
            );
            render(
                &state,
                session,
                StatusCode::UNPROCESSABLE_ENTITY,
                Flash::Error(&message),
            )
            .await
        }
        Err(e) => {
            tracing::info!(domain = %domain, error = %e, "domain verification lookup failed");
            render(
                &state,
                session,
                StatusCode::BAD_GATEWAY,
                Flash::Error("The DNS lookup failed. Try again later."),
            )
            .await
        }
    }
}

/// `POST /developers/members/domains/mail` (owners and admins): mails a proof link for the
/// pending claim to an address at the domain (a link mailed before stops working). Braked with
/// Verify, per organization.
pub async fn mail_domain_proof(
    State(state): State<Arc<DashboardState>>,
    allowed: Allowed<needs::Members>,
    HtmlForm(form): HtmlForm<ProofMailForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    if !matches!(session.role, Role::Owner | Role::Admin) {
        return Ok(NotSignedIn::Forbidden(session.clone()).into_response());
    }
    let domain = normalize(&form.domain);
    let email = normalize(&form.email);
    if !plausible_email(&email) || domain_of(&email).as_deref() != Some(domain.as_str()) {
        return render(
            &state,
            session,
            StatusCode::UNPROCESSABLE_ENTITY,
            Flash::Error("Enter an address at the claimed domain."),
        )
        .await;
    }
    if pending_claim(&state, &session.account_id, &domain)
        .await?
        .is_none()
    {
        return proven(&state, session, Proving::NoClaim).await;
    }
    if !state.settings.domains.take_verify(&session.account_id) {
        return render(
            &state,
            session,
            StatusCode::TOO_MANY_REQUESTS,
            Flash::Error(
                "Too many verifications for this organization: wait a minute and try again.",
            ),
        )
        .await;
    }
    let token = ids::session_token();
    let expires_at = OffsetDateTime::now_utc() + mail::DOMAIN_PROOF_LIFETIME;
    if !state
        .developers
        .mail_domain_proof(
            &session.account_id,
            &domain,
            &email,
            &KeyHash::of(&token),
            expires_at,
        )
        .await?
    {
        return proven(&state, session, Proving::NoClaim).await;
    }
    mail::send(
        state.settings.mailer.as_ref(),
        Mail::DomainProof {
            to: &email,
            domain: &domain,
            link: state
                .settings
                .public_url
                .to(&format!("{}?token={token}", mail::DOMAIN_PROOF_PATH)),
        },
    );
    let message =
        format!("A link was mailed to {email}: following it within an hour proves the claim.");
    render(&state, session, StatusCode::OK, Flash::Done(&message)).await
}

/// The page a domain proof link opens: a button that proves. Following the link changes
/// nothing by itself, so a mail scanner that fetches links does not spend it.
pub async fn domain_proof_form(Query(link): Query<ProofLink>) -> Result<Response, DashboardError> {
    let token = link_token(&link.token).ok_or(DashboardError::NotFound)?;
    Ok(with_status(
        StatusCode::OK,
        bare(
            "Confirm the domain",
            html! {
                p { "An organization asks you to confirm it controls your address's domain, for single sign-on. Confirm only if you know it." }
                form.stack method="post" action=(mail::DOMAIN_PROOF_PATH) {
                    input type="hidden" name="token" value=(token);
                    button.primary #confirm type="submit" { "Confirm the domain" }
                }
            },
        ),
    ))
}

/// `POST` of a domain proof link: proves the pending claim it was mailed for, once, within
/// its lifetime; audited as the address it was mailed to.
pub async fn prove_domain_by_mail(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    HtmlForm(link): HtmlForm<ProofLink>,
) -> Result<Response, DashboardError> {
    let proving = match link_token(&link.token) {
        Some(token) => {
            let by = session::actor("", client);
            state
                .developers
                .prove_domain_by_mail(&KeyHash::of(token), OffsetDateTime::now_utc(), &by)
                .await?
        }
        None => Proving::NoClaim,
    };
    let (status, title, message, kind) = match proving {
        Proving::Proven(claim) => (
            StatusCode::OK,
            "Domain confirmed",
            format!(
                "{} is confirmed for the organization that claimed it.",
                claim.domain
            ),
            "success",
        ),
        Proving::Taken => (
            StatusCode::CONFLICT,
            "Domain taken",
            "Another organization has proven this domain already.".to_owned(),
            "error",
        ),
        Proving::NoClaim => (
            StatusCode::GONE,
            "Link expired",
            "This link has expired or was already used. Ask the organization for a new one."
                .to_owned(),
            "error",
        ),
    };
    Ok(with_status(
        status,
        bare(title, html! { (notice(kind, &message)) }),
    ))
}

pub async fn show(
    State(state): State<Arc<DashboardState>>,
    Allowed { session, .. }: Allowed<needs::Members>,
) -> Result<Response, DashboardError> {
    render(&state, &session, StatusCode::OK, Flash::None).await
}

pub async fn invite(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    allowed: Allowed<needs::Members>,
    HtmlForm(form): HtmlForm<InviteForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    let refuse = |status, message| render(&state, session, status, Flash::Error(message));
    let email = normalize(&form.email);
    if !plausible_email(&email) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Enter a valid email address.",
        )
        .await;
    }
    let Some(role) = Role::parse(&form.role) else {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Choose a role from the list.",
        )
        .await;
    };
    if !session.role.may_manage(None, Some(role)) {
        return refuse(StatusCode::FORBIDDEN, "Only an owner can invite an owner.").await;
    }
    let members = state.developers.members(&session.account_id).await?;
    if members.iter().any(|m| m.email == email) {
        return refuse(StatusCode::CONFLICT, "That address is a member already.").await;
    }
    let pending = state.developers.invitations(&session.account_id).await?;
    if pending.len() >= MAX_PENDING_INVITATIONS {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            "This organization has 50 pending invitations; wait until some are accepted or expire.",
        )
        .await;
    }
    let token = ids::session_token();
    let now = OffsetDateTime::now_utc();
    let sent = state
        .developers
        .invite(
            Invitation {
                token_hash: KeyHash::of(&token),
                account_id: session.account_id.clone(),
                email: email.clone(),
                role,
                invited_by: session.email.clone(),
                created_at: now,
                expires_at: now + state.settings.invitation_lifetime,
            },
            &session::actor(&session.email, client),
            INVITATION_LIMITS,
        )
        .await?;
    let over = match sent {
        Ok(()) => None,
        Err(InvitationLimit::Organization) => Some(format!(
            "This organization sent {} invitations within the hour; wait before sending more.",
            INVITATION_LIMITS.per_organization
        )),
        Err(InvitationLimit::Address) => Some(format!(
            "That address was sent {} invitations within the hour; wait before inviting it again.",
            INVITATION_LIMITS.per_address
        )),
    };
    if let Some(message) = over {
        let mut page = refuse(StatusCode::TOO_MANY_REQUESTS, &message).await?;
        // The window slides: within the hour one of the counted invitations leaves it.
        page.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from(INVITATION_LIMITS.window.whole_seconds()),
        );
        return Ok(page);
    }
    mail::send(
        state.settings.mailer.as_ref(),
        Mail::Invitation {
            to: &email,
            by: &session.email,
            role: &role.as_str(),
            link: state
                .settings
                .public_url
                .to(&format!("{INVITATION_PATH}?token={token}")),
        },
    );
    let message = format!("Invitation sent to {email} as {}.", role.as_str());
    render(&state, session, StatusCode::OK, Flash::Done(&message)).await
}

/// The page after a refused or done change of a member, or, when the acting member changed
/// themselves (their sessions ended with it), the way to sign in again.
async fn after_change(
    state: &DashboardState,
    session: &Session,
    change: MemberChange,
    done: impl FnOnce(&User) -> String,
) -> Result<Response, DashboardError> {
    let (status, message) = match change {
        MemberChange::Done(member) if member.id == session.user_id => {
            return Ok(Redirect::to("/developers/sign-in").into_response());
        }
        MemberChange::Done(member) => {
            let message = done(&member);
            return render(state, session, StatusCode::OK, Flash::Done(&message)).await;
        }
        MemberChange::Refused(Refusal::Unchanged) => {
            (StatusCode::OK, "Nothing changed: the member has that role.")
        }
        MemberChange::Refused(Refusal::NoSuchMember) => (
            StatusCode::NOT_FOUND,
            "No such member (perhaps removed in another tab).",
        ),
        MemberChange::Refused(Refusal::NotAllowed) => (
            StatusCode::FORBIDDEN,
            "Only an owner can change an owner or make one.",
        ),
        MemberChange::Refused(Refusal::LastOwner) => (
            StatusCode::CONFLICT,
            "The organization needs an owner: make someone else an owner first.",
        ),
    };
    render(state, session, status, Flash::Error(message)).await
}

pub async fn change_role(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    allowed: Allowed<needs::Members>,
    Path(user_id): Path<String>,
    HtmlForm(form): HtmlForm<RoleForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    let Some(role) = Role::parse(&form.role) else {
        return render(
            &state,
            session,
            StatusCode::UNPROCESSABLE_ENTITY,
            Flash::Error("Choose a role from the list."),
        )
        .await;
    };
    let change = state
        .developers
        .change_role(
            &session.account_id,
            &user_id,
            role,
            session.role,
            &session::actor(&session.email, client),
        )
        .await?;
    after_change(&state, session, change, |member| {
        format!(
            "{} is {} now; their sessions ended, so they sign in again.",
            member.email,
            role.as_str()
        )
    })
    .await
}

pub async fn remove(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    allowed: Allowed<needs::Members>,
    Path(user_id): Path<String>,
    HtmlForm(form): HtmlForm<RemoveForm>,
) -> Result<Response, DashboardError> {
    allowed.check_csrf(&form.csrf)?;
    let session = &allowed.session;
    let by = session::actor(&session.email, client);
    let change = state
        .developers
        .remove_member(&session.account_id, &user_id, session.role, &by)
        .await?;
    let mut revoked = 0;
    if matches!(change, MemberChange::Done(_)) && form.revoke_keys.is_some() {
        for key in state.accounts.keys_of(&session.account_id).await? {
            if !key.revoked && key.created_by.as_deref() == Some(user_id.as_str()) {
                state.accounts.revoke_key(&key.id, &by).await?;
                revoked += 1;
            }
        }
    }
    after_change(&state, session, change, |member| {
        format!(
            "{} was removed and signed out; {revoked} of their keys revoked.",
            member.email
        )
    })
    .await
}

fn gone() -> Response {
    with_status(
        StatusCode::GONE,
        bare(
            "Invitation expired",
            html! {
                (notice("error", "This invitation has expired or was already used. Ask for a new one."))
                p.alt { a href="/developers" { "Go to the dashboard" } }
            },
        ),
    )
}

/// The page an invitation link opens: for a signed-in user, a button that accepts (opening the
/// link changes nothing, so a mail scanner does not spend it); otherwise how to sign in first.
pub async fn accept_form(
    signed_in: Result<SignedIn, NotSignedIn>,
    Query(link): Query<InvitationLink>,
) -> Result<Response, DashboardError> {
    let Some(token) = link_token(&link.token) else {
        return Ok(gone());
    };
    let content = match signed_in {
        Ok(SignedIn(session)) => html! {
            p { "You are signed in as " strong { (session.email) } ". Accepting moves you into the organization that invited you, in the role it chose, and signs you in again." }
            form.stack method="post" action=(INVITATION_PATH) {
                input type="hidden" name="csrf" value=(session.csrf);
                input type="hidden" name="token" value=(token);
                button.primary #accept type="submit" { "Accept the invitation" }
            }
        },
        Err(NotSignedIn::Failed(e)) => return Err(e),
        Err(NotSignedIn::Unverified(..) | NotSignedIn::Redirect | NotSignedIn::Forbidden(_)) => {
            html! {
                p { "Sign in with the address the invitation was sent to (or create an account with it and confirm the address), then open this link again." }
                p.alt { a href="/developers/sign-in" { "Sign in" } " · " a href="/developers/sign-up" { "Create an account" } }
            }
        }
    };
    Ok(with_status(
        StatusCode::OK,
        bare("Join an organization", content),
    ))
}

pub async fn accept(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    headers: HeaderMap,
    signed_in: SignedIn,
    HtmlForm(form): HtmlForm<AcceptForm>,
) -> Result<Response, DashboardError> {
    signed_in.check_csrf(&form.csrf)?;
    let session = &signed_in.0;
    let Some(token) = link_token(&form.token) else {
        return Ok(gone());
    };
    let acceptance = state
        .developers
        .accept_invitation(
            &KeyHash::of(token),
            &session.user_id,
            &session::actor(&session.email, client),
        )
        .await?;
    let refused = |status, title, message: &str| {
        with_status(
            status,
            bare(
                title,
                html! {
                    (notice("error", message))
                    p.alt { a href="/developers" { "Go to the dashboard" } }
                },
            ),
        )
    };
    match acceptance {
        // Every session of the user ended with the move: a new one, in the new role.
        Acceptance::Accepted(user) => {
            let cookie = session::start(&state, &headers, &user, SignInMethod::Password, client).await?;
            Ok(([cookie], Redirect::to("/developers")).into_response())
        }
        Acceptance::Unknown => Ok(gone()),
        Acceptance::WrongEmail => Ok(refused(
            StatusCode::FORBIDDEN,
            "Not your invitation",
            "This invitation was sent to another address. Sign in with that address to accept it.",
        )),
        Acceptance::LastOwner => Ok(refused(
            StatusCode::CONFLICT,
            "You own an organization",
            "You are the last owner of your organization, which has other members: make one of them an owner first.",
        )),
    }
}
