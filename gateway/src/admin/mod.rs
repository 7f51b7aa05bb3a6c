//! The internal admin API, on its own listener (loopback in standalone) behind a bearer
//! admin token: accounts, keys, top-up confirmation, suspension, message lookup, and the
//! audit log (`audit`).

mod audit;

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use crds::config::SCOPES;
use serde::Deserialize;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use crate::api::{method_not_allowed, not_found};
use crate::client_address::{ClientAddress, TrustedProxies};
use crate::edge::body::JsonBody;
use crate::edge::body_reader::BodyCap;
use crate::edge::budget;
use crate::edge::path::Path;
use crate::error::ApiError;
use crate::state::{AdminState, AppState};
use gateway_core::auth::{self, KeySpec};
use gateway_core::payments;
use gateway_core::telemetry;
use store::accounts::promotion::{self, ENTERPRISE};
use store::accounts::{Account, AccountStatus, KeyKind, StoreError};
use store::audit::{Actor, ActorKind};
use store::developers::owner_verified;

#[derive(Clone)]
struct Admin {
    state: Arc<AdminState>,
    token: Arc<str>,
}

pub fn router(state: AppState, token: &str) -> Router {
    let admin = Admin {
        state: Arc::from_ref(&state),
        token: token.into(),
    };
    Router::new()
        .route("/admin/accounts", post(create_account))
        .route("/admin/accounts/{id}", get(account))
        .route("/admin/accounts/{id}/suspend", post(suspend))
        .route("/admin/accounts/{id}/resume", post(resume))
        .route("/admin/accounts/{id}/topups", post(top_up))
        .route("/admin/keys", post(create_key))
        .route("/admin/keys/{id}", delete(revoke_key))
        .route("/admin/messages/{id}", get(message))
        .route("/admin/audit", get(audit::list))
        .route_layer(from_fn_with_state(admin.clone(), require_token))
        .layer(Extension(BodyCap::ADMIN))
        // The admin port is the operator's, never exposed outside: its bodies count as one
        // owner's, not in the small share of anonymous clients' bodies a webhook flood fills.
        .layer(Extension(budget::BudgetOwner::admin()))
        .layer(axum::middleware::from_fn(budget::hold))
        // Probes and the scrape need no token: the admin port is never exposed outside.
        .merge(scrape_and_probes())
        .with_state(admin)
}

/// The scrape and the probes alone, for the `--metrics-listen` listener.
pub fn metrics_router(state: AppState) -> Router {
    scrape_and_probes().with_state(Admin {
        state: Arc::from_ref(&state),
        token: Arc::from(""),
    })
}

fn scrape_and_probes() -> Router<Admin> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(live))
        .route("/readyz", get(ready))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn metrics() -> Response {
    (
        [(http::header::CONTENT_TYPE, telemetry::metrics::CONTENT_TYPE)],
        telemetry::metrics::render(),
    )
        .into_response()
}

async fn live() -> StatusCode {
    StatusCode::OK
}

/// Ready when the config is loaded (it is, once this listener runs) and the process is not
/// draining: what another pod could do better. The shared stores are reported, not required:
/// every pod shares them, so an outage would take every pod out of the Service at once and
/// turn our 503 with `Retry-After` (failing closed) or our limited service (failing open) into
/// a load balancer's bare 502. The trade-off: a pod cut off from a store that its peers still
/// reach keeps its share of requests and refuses them with 503 (`GatewayStoreErrors` alerts,
/// docs/observability.md), where removing it would have sent them to the peers.
async fn ready(State(admin): State<Admin>) -> Response {
    let draining = admin.state.shutdown.stopping.is_cancelled();
    let (limits, ledger) = tokio::join!(
        admin.state.limiter.reachable(),
        admin.state.ledger.reachable()
    );
    if let Err(e) = &limits {
        tracing::debug!(error = %e, "readiness: limits store unreachable");
    }
    if let Err(e) = &ledger {
        tracing::debug!(error = %e, "readiness: ledger store unreachable");
    }
    let fail_open = admin.state.limiter.serves_through_outage();
    let ok = !draining;
    let answer = |up: bool| if up { "ok" } else { "unreachable" };
    let body = json!({
        "status": if ok { "ready" } else { "not_ready" },
        "config_version": admin.state.catalog().version,
        "draining": draining,
        "limits_store": answer(limits.is_ok()),
        "ledger_store": answer(ledger.is_ok()),
        "store_outage": if fail_open { "fail-open" } else { "fail-closed" },
    });
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The probes while the pod waits for its first config, before [`router`] can be built: alive
/// from the start (a startup probe must not restart a pod in a loop while the custom
/// resources are invalid), not ready until the config is there. `config_secret`
/// (`NAMESPACE/NAME`) is the Secret the config is awaited in, when the operator publishes it:
/// the readiness answer names it, and where to look for why nothing is there yet.
pub fn waiting_router(config_secret: Option<String>) -> Router {
    let mut body =
        json!({ "status": "not_ready", "config_version": null, "waiting_for": "config" });
    if let Some(secret) = config_secret {
        let name = secret
            .split_once('/')
            .map_or(secret.as_str(), |(_, name)| name);
        body["config_secret"] = json!(secret);
        body["detail"] = json!(format!(
            "no gateway configuration published in Secret {secret} yet: the operator publishes \
             one once the namespace's Tiers, ModelRoutes and ApiKeys compile; see the operator's \
             log, the events of the gateway Deployment (`kubectl describe deployment`) and of \
             the Secret (`kubectl get events --field-selector involvedObject.name={name}`) and the \
             Ready condition of each resource (`kubectl get svc-gateway`)"
        ));
    }
    let body = Arc::new(body);
    Router::new()
        .route("/livez", get(live))
        .route(
            "/readyz",
            get(move || {
                let body = body.clone();
                async move { (StatusCode::SERVICE_UNAVAILABLE, Json(body.as_ref().clone())) }
            }),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn require_token(State(admin): State<Admin>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // An empty token never matches, whatever reached the router (start-up refuses one too).
    if !admin.token.is_empty() && bool::from(presented.as_bytes().ct_eq(admin.token.as_bytes())) {
        next.run(req).await
    } else {
        ApiError::from(auth::AuthError::Invalid).into_response()
    }
}

/// The admin token's holder, as the audit log names them: `admin`, from the peer's address
/// (the admin listener is reached directly, never through the public proxies).
struct ByAdmin(Actor);

/// The actor id of the admin API's audit rows: the token is one, so is its holder.
const ADMIN: &str = "admin";

impl<S: Send + Sync> FromRequestParts<S> for ByAdmin {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let client = ClientAddress::of(
            &TrustedProxies::default(),
            &parts.extensions,
            &parts.headers,
        );
        Ok(Self(Actor::new(
            ActorKind::AdminToken,
            ADMIN,
            client.0.map(|ip| ip.to_string()),
        )))
    }
}

async fn account_json(state: &AdminState, account: &Account) -> Result<Value, ApiError> {
    let balance = state.ledger.balance(&account.id).await?;
    Ok(json!({
        "id": account.id,
        "name": account.name,
        "status": account.status,
        "created_at": account.created_at.unix_timestamp(),
        "balance": balance.balance,
        "reserved": balance.reserved,
        "lifetime_top_up_cents": balance.lifetime_top_up_cents,
        "owed_credits": balance.owed,
    }))
}

async fn existing_account(state: &AdminState, id: &str) -> Result<Account, ApiError> {
    state
        .accounts
        .account(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("account `{id}` does not exist")))
}

/// The account `id`, when it may take keys and credits from the operator: not a dashboard
/// account whose email is unverified (anyone can sign up with anyone's email).
async fn creditable_account(state: &AdminState, id: &str) -> Result<Account, ApiError> {
    let account = existing_account(state, id).await?;
    if !owner_verified(state.developers.as_ref(), &account.id).await? {
        return Err(StoreError::Conflict(format!(
            "account `{id}` belongs to a dashboard user whose email is not verified yet; it \
             takes no keys or credits until its owner follows the link sent to it"
        ))
        .into());
    }
    Ok(account)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewAccount {
    name: String,
    #[serde(default)]
    credits: u64,
}

async fn create_account(
    State(admin): State<Admin>,
    ByAdmin(by): ByAdmin,
    JsonBody(body): JsonBody<NewAccount>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let state = &admin.state;
    if body.name.trim().is_empty() {
        return Err(ApiError::invalid("name: must not be empty"));
    }
    let account = state.accounts.create_account(&body.name).await?;
    state
        .ledger
        .add_credits(&account.id, body.credits, &by)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(account_json(state, &account).await?),
    ))
}

async fn account(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let account = existing_account(&admin.state, &id).await?;
    Ok(Json(account_json(&admin.state, &account).await?))
}

async fn set_status(
    admin: &Admin,
    id: &str,
    status: AccountStatus,
    by: &Actor,
) -> Result<Json<Value>, ApiError> {
    let account = admin
        .state
        .accounts
        .set_status(id, status, by)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("account `{id}` does not exist")))?;
    Ok(Json(account_json(&admin.state, &account).await?))
}

async fn suspend(
    State(admin): State<Admin>,
    ByAdmin(by): ByAdmin,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_status(&admin, &id, AccountStatus::Suspended, &by).await
}

async fn resume(
    State(admin): State<Admin>,
    ByAdmin(by): ByAdmin,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_status(&admin, &id, AccountStatus::Active, &by).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTopUp {
    usd_cents: u64,
    reference: String,
}

async fn top_up(
    State(admin): State<Admin>,
    ByAdmin(by): ByAdmin,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<NewTopUp>,
) -> Result<Json<Value>, ApiError> {
    let state = &admin.state;
    let account = creditable_account(state, &id).await?;
    let request = payments::TopUpRequest {
        account_id: &account.id,
        reference: &body.reference,
        usd_cents: body.usd_cents,
        payment_id: None,
        by: &by,
    };
    let top_up = payments::confirm(
        state.accounts.as_ref(),
        state.ledger.as_ref(),
        state.credits_per_usd,
        request,
    )
    .await?
    .top_up;
    Ok(Json(json!({
        "reference": top_up.reference,
        "usd_cents": top_up.usd_cents,
        "credits": top_up.credits,
        "status": top_up.status,
        "account": account_json(state, &account).await?,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewKey {
    account_id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default = "api_kind")]
    kind: KeyKind,
    #[serde(default)]
    scopes: Vec<String>,
    /// Only `enterprise`, the tier granted by hand; without it the key starts at the tier its
    /// account's confirmed lifetime top-up gives, and only the promotion sweep moves it.
    #[serde(default)]
    tier: Option<String>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    expires_at: Option<time::OffsetDateTime>,
    #[serde(default)]
    spend_cap_credits: Option<u64>,
}

fn api_kind() -> KeyKind {
    KeyKind::Api
}

async fn create_key(
    State(admin): State<Admin>,
    ByAdmin(by): ByAdmin,
    JsonBody(body): JsonBody<NewKey>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let state = &admin.state;
    let account = creditable_account(state, &body.account_id).await?;
    if let Some(bad) = body.scopes.iter().find(|s| !SCOPES.contains(&s.as_str())) {
        return Err(ApiError::invalid(format!(
            "scopes: unknown scope `{bad}`; known: {}",
            SCOPES.join(", ")
        )));
    }
    auth::check_expiry(body.expires_at, time::OffsetDateTime::now_utc())
        .map_err(|e| ApiError::invalid(format!("expires_at: {e}")))?;
    let tier = match body.tier.as_deref() {
        None => {
            let lifetime = state
                .ledger
                .balance(&account.id)
                .await?
                .lifetime_top_up_cents;
            promotion::standing(state.catalog().tiers(), lifetime).tier
        }
        Some(ENTERPRISE) => ENTERPRISE.to_owned(),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "tier: `{other}` cannot be granted by hand; only `{ENTERPRISE}` can. Other \
                 tiers follow the account's confirmed lifetime top-up (the promotion sweep)"
            )))
        }
    };
    let minted = auth::mint(KeySpec {
        id: None,
        account_id: account.id,
        name: body.name.unwrap_or_else(|| "key".to_owned()),
        kind: body.kind,
        scopes: body.scopes,
        tier,
        secret: None,
        expires_at: body.expires_at,
        spend_cap: body.spend_cap_credits,
    });
    state
        .accounts
        .insert_key(minted.record.clone(), &by)
        .await?;
    let mut json = json!(minted.record);
    json["key"] = json!(minted.secret);
    Ok((StatusCode::CREATED, Json(json)))
}

async fn revoke_key(
    State(admin): State<Admin>,
    ByAdmin(by): ByAdmin,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admin
        .state
        .accounts
        .revoke_key(&id, &by)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("key `{id}` does not exist")))?;
    Ok(Json(json!({ "id": id, "revoked": true })))
}

async fn message(
    State(admin): State<Admin>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let record = admin
        .state
        .ledger
        .message(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("message `{id}` is not in the ledger")))?;
    Ok(Json(json!(record)))
}
