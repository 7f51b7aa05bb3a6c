//! `/developers/keys`: mint a key (its secret shown once, only its prefix afterwards), and
//! revoke one after a confirmation. Keys are looked up by hash on every request with no cache,
//! so a revoked key stops on every pod sharing the account store at once.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;
use time::OffsetDateTime;

use super::error::DashboardError;
use super::form::HtmlForm;
use super::layout::{datetime, notice, page, thousands, with_status, Nav};
use super::session::{self, needs, Allowed};
use crate::client_address::ClientAddress;
use crate::state::DashboardState;
use crds::config::SCOPES;
use gateway_core::auth::{self, KeySpec};
use store::accounts::promotion::standing;
use store::accounts::{KeyKind, KeyRecord};
use store::developers::{Permission, Session};
use store::ledger::KeySpend;

const MAX_NAME_CHARS: usize = 64;

/// The mint form; scopes arrive as repeated `scope` fields.
#[derive(Deserialize)]
pub struct MintForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    kind: String,
    #[serde(default, rename = "scope")]
    scopes: Vec<String>,
    /// Days until the key expires; empty: never.
    #[serde(default)]
    expires_in_days: String,
    /// Credits per UTC month; empty: no cap.
    #[serde(default)]
    spend_cap: String,
}

/// The expiries the form offers, in days.
const EXPIRY_DAYS: [u32; 4] = [7, 30, 90, 365];

/// A key as the keys page lists it: with its monthly cap (its grant's, else its own) and
/// what it spent and holds this month.
pub struct Listed {
    pub key: KeyRecord,
    pub cap: Option<u64>,
    pub spend: KeySpend,
}

/// The keys of the session's account it may see (a developer's own, else all), with their
/// caps and this month's spend.
pub async fn listed(
    state: &DashboardState,
    session: &Session,
) -> Result<Vec<Listed>, DashboardError> {
    let keys = visible_keys(state, session).await?;
    let catalog = state.catalog();
    let mut listed = Vec::with_capacity(keys.len());
    for key in keys {
        let spend = state.ledger.key_spend(&key.id).await?;
        let cap = auth::spend_cap(&catalog, &key);
        listed.push(Listed { key, cap, spend });
    }
    Ok(listed)
}

/// "spent of cap" for a capped key, "spent" otherwise.
pub fn spend_against_cap(listed: &Listed) -> Markup {
    html! {
        (thousands(listed.spend.spent))
        @if let Some(cap) = listed.cap { " of " (thousands(cap)) }
    }
}

#[derive(Deserialize)]
pub struct RevokeForm {
    #[serde(default)]
    csrf: String,
}

enum Flash<'a> {
    None,
    Minted { key: &'a KeyRecord, secret: &'a str },
    Done(&'a str),
    Error(&'a str),
}

fn kind_label(kind: KeyKind) -> &'static str {
    match kind {
        KeyKind::Api => "API",
        KeyKind::Cli => "CLI",
    }
}

fn view(session: &Session, keys: &[Listed], flash: Flash<'_>) -> Markup {
    let now = OffsetDateTime::now_utc();
    let content = html! {
        @match flash {
            Flash::Minted { key, secret } => {
                div.card.secret role="status" {
                    h2 { "Your new key “" (key.name) "”" }
                    p { "Copy it now: this is the only time the whole secret is shown. Afterwards only its prefix is." }
                    label for="new-secret" { "Secret key" }
                    input #new-secret.mono type="text" readonly value=(secret) onfocus="this.select()";
                }
            }
            Flash::Done(message) => (notice("success", message)),
            Flash::Error(message) => (notice("error", message)),
            Flash::None => {}
        }
        section.card {
            h2 { "Create a key" }
            form.grid-form method="post" action="/developers/keys" {
                input type="hidden" name="csrf" value=(session.csrf);
                div.field {
                    label for="key-name" { "Name" }
                    input #key-name type="text" name="name" required maxlength=(MAX_NAME_CHARS) placeholder="e.g. production backend";
                }
                div.field {
                    label for="key-kind" { "Kind" }
                    select #key-kind name="kind" {
                        option value="api" selected { "API key (for /v1)" }
                        option value="cli" { "CLI key (command-line tool)" }
                    }
                }
                div.field {
                    label for="key-expiry" { "Expires" }
                    select #key-expiry name="expires_in_days" {
                        option value="" selected { "Never" }
                        @for days in EXPIRY_DAYS {
                            option value=(days) { "In " (days) " days" }
                        }
                    }
                }
                div.field {
                    label for="key-cap" { "Monthly spend cap " span.hint { "(credits; empty: none)" } }
                    input #key-cap type="number" name="spend_cap" min="1" step="1" inputmode="numeric" placeholder="e.g. 5000000";
                }
                fieldset.field.scopes {
                    legend { "Scopes " span.hint { "(none checked: every surface)" } }
                    @for scope in SCOPES {
                        label.check { input type="checkbox" name="scope" value=(scope); " " (scope) }
                    }
                }
                div.field.actions { button.primary #mint type="submit" { "Create key" } }
            }
        }
        section.card {
            h2 { "Your keys" }
            @if keys.is_empty() {
                p.empty { "No keys yet." }
            } @else {
                div.table-wrap {
                    table #keys {
                        thead { tr {
                            th scope="col" { "Name" } th scope="col" { "Key" } th scope="col" { "Kind" }
                            th scope="col" { "Scopes" } th scope="col" { "Tier" } th scope="col" { "Created" }
                            th scope="col" { "Expires" } th scope="col" { "Spent this month" }
                            th scope="col" { "Status" } th scope="col" { span.sr-only { "Actions" } }
                        } }
                        tbody {
                            @for listed in keys {
                                @let key = &listed.key;
                                tr data-key-id=(key.id) {
                                    td { (key.name) }
                                    td { code { (key.prefix) "…" } }
                                    td { (kind_label(key.kind)) }
                                    td { @if key.scopes.is_empty() { "all" } @else { (key.scopes.join(", ")) } }
                                    td { (key.tier) }
                                    td { (datetime(key.created_at)) }
                                    td.expires { @match key.expires_at { Some(at) => (datetime(at)), None => "never" } }
                                    td.spend { (spend_against_cap(listed)) }
                                    td {
                                        @if key.revoked { span.badge.failed { "revoked" } }
                                        @else if key.expired(now) { span.badge.failed { "expired" } }
                                        @else { span.badge.completed { "active" } }
                                    }
                                    td { @if !key.revoked {
                                        a.danger-link href=(format!("/developers/keys/{}/revoke", key.id)) aria-label=(format!("Revoke key {}", key.name)) { "Revoke" }
                                    } }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    page(session, Nav::Keys, "API keys", content)
}

async fn render(
    state: &DashboardState,
    session: &Session,
    status: StatusCode,
    flash: Flash<'_>,
) -> Result<Response, DashboardError> {
    let keys = listed(state, session).await?;
    Ok(with_status(status, view(session, &keys, flash)))
}

pub async fn show(
    State(state): State<Arc<DashboardState>>,
    Allowed { session, .. }: Allowed<needs::Keys>,
) -> Result<Response, DashboardError> {
    render(&state, &session, StatusCode::OK, Flash::None).await
}

pub async fn mint(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    signed_in: Allowed<needs::Keys>,
    HtmlForm(form): HtmlForm<MintForm>,
) -> Result<Response, DashboardError> {
    signed_in.check_csrf(&form.csrf)?;
    let session = &signed_in.session;
    let refuse = |message| {
        render(
            &state,
            session,
            StatusCode::UNPROCESSABLE_ENTITY,
            Flash::Error(message),
        )
    };
    let name = form.name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return refuse("Give the key a name of 1 to 64 characters.").await;
    }
    let kind = match form.kind.as_str() {
        "api" | "" => KeyKind::Api,
        "cli" => KeyKind::Cli,
        _ => return refuse("Choose API or CLI as the key's kind.").await,
    };
    if let Some(unknown) = form.scopes.iter().find(|s| !SCOPES.contains(&s.as_str())) {
        let message = format!("Unknown scope “{unknown}”.");
        return render(
            &state,
            session,
            StatusCode::UNPROCESSABLE_ENTITY,
            Flash::Error(&message),
        )
        .await;
    }
    let expires_at = match form.expires_in_days.trim() {
        "" => None,
        days => match days.parse::<u32>() {
            Ok(days) if EXPIRY_DAYS.contains(&days) => {
                Some(OffsetDateTime::now_utc() + time::Duration::days(days.into()))
            }
            _ => return refuse("Choose when the key expires from the list.").await,
        },
    };
    let spend_cap = match form.spend_cap.trim() {
        "" => None,
        cap => match cap.parse::<u64>() {
            Ok(cap) if cap > 0 => Some(cap),
            _ => {
                return refuse("A monthly spend cap is a whole number of credits, at least 1.")
                    .await
            }
        },
    };
    let lifetime = state
        .ledger
        .balance(&session.account_id)
        .await?
        .lifetime_top_up_cents;
    let minted = auth::mint(KeySpec {
        id: None,
        account_id: session.account_id.clone(),
        name: name.to_owned(),
        kind,
        scopes: form.scopes,
        tier: standing(state.catalog().tiers(), lifetime).tier,
        secret: None,
        expires_at,
        spend_cap,
    });
    let by = session::actor(&session.email, client);
    let record = KeyRecord {
        created_by: Some(session.user_id.clone()),
        ..minted.record
    };
    state.accounts.insert_key(record.clone(), &by).await?;
    render(
        &state,
        session,
        StatusCode::OK,
        Flash::Minted {
            key: &record,
            secret: &minted.secret,
        },
    )
    .await
}

/// The account's keys the session's member may see and revoke: every key for owners and
/// admins, the ones they created for a developer.
async fn visible_keys(
    state: &DashboardState,
    session: &Session,
) -> Result<Vec<KeyRecord>, DashboardError> {
    let mut keys = state.accounts.keys_of(&session.account_id).await?;
    if !session.role.may(Permission::AllKeys) {
        keys.retain(|k| k.created_by.as_deref() == Some(session.user_id.as_str()));
    }
    Ok(keys)
}

/// A key the member may revoke; another's is "no such page" (404), as if it did not exist.
async fn own_key(
    state: &DashboardState,
    session: &Session,
    id: &str,
) -> Result<KeyRecord, DashboardError> {
    visible_keys(state, session)
        .await?
        .into_iter()
        .find(|k| k.id == id)
        .ok_or(DashboardError::NotFound)
}

pub async fn confirm_revoke(
    State(state): State<Arc<DashboardState>>,
    Allowed { session, .. }: Allowed<needs::Keys>,
    Path(id): Path<String>,
) -> Result<Response, DashboardError> {
    let key = own_key(&state, &session, &id).await?;
    if key.revoked {
        return render(
            &state,
            &session,
            StatusCode::OK,
            Flash::Done(&already_revoked(&key)),
        )
        .await;
    }
    let content = html! {
        section.card.confirm {
            h2 { "Revoke “" (key.name) "”?" }
            p { "Requests with " code { (key.prefix) "…" } " will be refused with 401 on every gateway within seconds. This cannot be undone." }
            form.inline method="post" action=(format!("/developers/keys/{}/revoke", key.id)) {
                input type="hidden" name="csrf" value=(session.csrf);
                button.danger #confirm-revoke type="submit" { "Revoke key" }
                " "
                a.button href="/developers/keys" { "Cancel" }
            }
        }
    };
    Ok(with_status(
        StatusCode::OK,
        page(&session, Nav::Keys, "Revoke key", content),
    ))
}

fn already_revoked(key: &KeyRecord) -> String {
    format!(
        "The key “{}” was already revoked (perhaps in another tab); nothing changed.",
        key.name
    )
}

pub async fn revoke(
    State(state): State<Arc<DashboardState>>,
    client: ClientAddress,
    signed_in: Allowed<needs::Keys>,
    Path(id): Path<String>,
    HtmlForm(form): HtmlForm<RevokeForm>,
) -> Result<Response, DashboardError> {
    signed_in.check_csrf(&form.csrf)?;
    let session = &signed_in.session;
    let key = own_key(&state, session, &id).await?;
    if key.revoked {
        return render(
            &state,
            session,
            StatusCode::CONFLICT,
            Flash::Error(&already_revoked(&key)),
        )
        .await;
    }
    let by = session::actor(&session.email, client);
    state.accounts.revoke_key(&key.id, &by).await?;
    let message = format!(
        "The key “{}” is revoked; requests with it now answer 401.",
        key.name
    );
    render(&state, session, StatusCode::OK, Flash::Done(&message)).await
}
