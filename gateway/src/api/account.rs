//! `GET /v1/account`: the key's account, its apiCredits balance, tier and limits.

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::AccountApi;
use gateway_core::auth::Principal;

pub async fn get(
    State(state): State<Arc<AccountApi>>,
    Extension(principal): Extension<Arc<Principal>>,
) -> Result<Json<Value>, ApiError> {
    let balance = state.ledger.balance(&principal.account.id).await?;
    let (account, key, limits) = (&principal.account, &principal.key, &principal.limits);
    Ok(Json(json!({
        "object": "account",
        "id": account.id,
        "name": account.name,
        "status": account.status,
        "tier": principal.tier,
        "limits": {
            "requests_per_minute": limits.requests_per_minute,
            "input_tokens_per_minute": limits.input_tokens_per_minute,
            "concurrent_streams": limits.concurrent_streams,
        },
        "credits": {
            "pool": "apiCredits",
            "balance": balance.balance,
            "reserved": balance.reserved,
            "available": balance.balance.saturating_sub(balance.reserved),
            "credits_per_usd": state.credits_per_usd,
        },
        "lifetime_top_up_cents": balance.lifetime_top_up_cents,
        "key": {
            "id": key.id,
            "name": key.name,
            "prefix": key.prefix,
            "kind": key.kind,
            "scopes": key.scopes,
        },
    })))
}
