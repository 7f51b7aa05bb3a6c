//! The parts of Stripe's Event objects the gateway acts on. Unknown fields are ignored, as
//! Stripe adds fields without a new API version.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub data: EventData,
}

#[derive(Deserialize)]
pub struct EventData {
    pub object: Value,
}

/// `checkout.session.*`: a Checkout Session.
#[derive(Deserialize)]
pub struct Session {
    pub payment_status: String,
    pub amount_total: Option<u64>,
    pub currency: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    pub payment_intent: Option<String>,
}

/// `payment_intent.succeeded`: a checkout's payment (which may save its card) or an
/// auto-reload's off-session charge.
#[derive(Deserialize)]
pub struct PaymentIntent {
    pub id: String,
    pub amount_received: u64,
    pub currency: String,
    pub customer: Option<String>,
    pub payment_method: Option<String>,
    pub setup_future_usage: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

/// `charge.refunded`: a Charge; `amount_refunded` is its refunded total so far.
#[derive(Deserialize)]
pub struct Charge {
    pub payment_intent: Option<String>,
    pub amount_refunded: u64,
}

/// `charge.dispute.*`: a Dispute.
#[derive(Deserialize)]
pub struct Dispute {
    pub id: String,
    pub payment_intent: Option<String>,
    pub amount: u64,
    pub status: String,
}

/// An event's object as `T`, or the envelope's message naming what is wrong.
pub fn object<T: for<'de> Deserialize<'de>>(event: &Event) -> Result<T, String> {
    serde_json::from_value(event.data.object.clone())
        .map_err(|e| format!("data.object of a `{}` event: {e}", event.kind))
}
