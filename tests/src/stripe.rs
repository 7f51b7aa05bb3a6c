//! A mock of Stripe on loopback, speaking its wire format for the calls the gateway makes and
//! the events it receives:
//! - `POST /v1/checkout/sessions`: a form body, the secret key as a bearer token, and
//!   `Idempotency-Key` honoured as Stripe does (the same key and parameters replay the first
//!   answer; the same key with other parameters is an `idempotency_error`); errors are Stripe
//!   error objects (`{"error": {"type", "code", "message"}}`), scripted with
//!   [`MockStripe::fail_next`];
//! - events as Stripe builds them (`{"id": "evt_...", "object": "event", "type", "data":
//!   {"object": ...}}`), signed as Stripe signs them (`Stripe-Signature: t=<unix>,v1=<hex
//!   HMAC-SHA256 of "t.body">`), which a test delivers whenever, however often and to
//!   whichever pod it likes ([`deliver`]).
//!
//! Its scripted error text ([`STRIPE_ERROR_TEXT`]) is what a test checks no user ever sees.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

/// The secret key the gateway is configured with.
pub const API_KEY: &str = "sk_test_mock_4eC39HqLyjWDarjtT1zdp7dc";
/// The webhook endpoint's signing secret.
pub const WEBHOOK_SECRET: &str = "whsec_mock_0123456789abcdef";
/// The text of the scripted failures: it must never reach a user.
pub const STRIPE_ERROR_TEXT: &str = "Stripe internal: rate limit on acct_1Mock";

/// A Checkout Session the gateway created, as the mock keeps it.
#[derive(Clone, Debug)]
pub struct MockSession {
    pub id: String,
    pub url: String,
    pub payment_intent: String,
    pub amount_total: u64,
    pub idempotency_key: String,
    /// The form fields, by their Stripe names (`metadata[account_id]`, ...).
    pub form: HashMap<String, String>,
}

impl MockSession {
    pub fn field(&self, name: &str) -> &str {
        self.form.get(name).map(String::as_str).unwrap_or_default()
    }

    pub fn account_id(&self) -> &str {
        self.field("metadata[account_id]")
    }

    pub fn reference(&self) -> &str {
        self.field("metadata[reference]")
    }
}

/// An off-session PaymentIntent the gateway created (an auto-reload), declined or not.
#[derive(Clone, Debug)]
pub struct MockIntent {
    pub id: String,
    pub amount: u64,
    pub declined: bool,
    pub idempotency_key: String,
    pub form: HashMap<String, String>,
}

impl MockIntent {
    pub fn field(&self, name: &str) -> &str {
        self.form.get(name).map(String::as_str).unwrap_or_default()
    }
}

/// The customer and card a checkout saves when asked to (`setup_future_usage`).
pub const CUSTOMER: &str = "cus_mock_1";
pub const PAYMENT_METHOD: &str = "pm_mock_card_visa";

/// One signed-able event.
#[derive(Clone, Debug)]
pub struct StripeEvent {
    pub id: String,
    pub body: Vec<u8>,
}

impl StripeEvent {
    /// The `Stripe-Signature` header Stripe sends for this event now.
    pub fn signature(&self) -> String {
        sign(WEBHOOK_SECRET, now(), &self.body)
    }
}

/// A call's form fields, in order.
type FormBody = Vec<(String, String)>;

#[derive(Default)]
struct Shared {
    sessions: Mutex<Vec<MockSession>>,
    /// First answer by idempotency key, with the form it answered.
    answered: Mutex<HashMap<String, (FormBody, u16, Value)>>,
    failures: Mutex<Vec<(u16, Value)>>,
    /// Sessions paid on the hosted payment page.
    paid: Mutex<Vec<String>>,
    intents: Mutex<Vec<MockIntent>>,
    /// Off-session charges still to decline.
    declines: AtomicUsize,
    calls: AtomicUsize,
    ids: AtomicUsize,
}

/// The running mock, stopped when dropped.
pub struct MockStripe {
    /// `http://127.0.0.1:PORT`, the gateway's `--stripe-api-base`.
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The `Stripe-Signature` value for `body` signed with `secret` at `t`.
pub fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// Stripe's own Python library (`stripe`, from the test venv), as a second reading of the
/// signature scheme: `sign` makes a header the way stripe-python's tests do
/// (`WebhookSignature._compute_signature` over "t.payload", `t=...,v1=...`); `verify` is
/// `stripe.Webhook.construct_event`, what a Stripe integration runs on a delivery.
const STRIPE_LIBRARY: &str = r#"
import sys
import stripe

what, secret = sys.argv[1], sys.argv[2]
payload = sys.stdin.buffer.read().decode("utf-8")
if what == "sign":
    t = int(sys.argv[3])
    signature = stripe.WebhookSignature._compute_signature("%d.%s" % (t, payload), secret)
    print("t=%d,%s=%s" % (t, stripe.WebhookSignature.EXPECTED_SCHEME, signature))
else:
    try:
        stripe.Webhook.construct_event(payload, sys.argv[3], secret)
    except stripe.SignatureVerificationError as e:
        print("refused: %s" % e)
        sys.exit(3)
    print("verified")
"#;

async fn stripe_library(args: &[&str], body: &[u8]) -> (Option<i32>, String) {
    use tokio::io::AsyncWriteExt;
    let python = crate::gateway::workspace_root().join(".cache/venv/bin/python");
    assert!(
        python.is_file(),
        "{} not found; scripts/test creates the venv with stripe",
        python.display()
    );
    let mut child = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(STRIPE_LIBRARY)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(body).await.expect("the payload");
    drop(stdin);
    let out = child.wait_with_output().await.expect("python ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "the stripe library: {stderr}");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// The `Stripe-Signature` value Stripe's library makes for `body` with `secret` at `t`.
pub async fn stripe_library_sign(secret: &str, t: i64, body: &[u8]) -> String {
    let (code, out) = stripe_library(&["sign", secret, &t.to_string()], body).await;
    assert_eq!(code, Some(0), "{out}");
    out
}

/// Whether Stripe's library (`construct_event`) accepts `signature` of `body` with `secret`:
/// `Err` with its reason when it refuses.
pub async fn stripe_library_verify(
    secret: &str,
    signature: &str,
    body: &[u8],
) -> Result<(), String> {
    match stripe_library(&["verify", secret, signature], body).await {
        (Some(0), out) if out == "verified" => Ok(()),
        (Some(3), out) => Err(out),
        (code, out) => panic!("the stripe library ended {code:?}: {out}"),
    }
}

/// Posts `event` to `POST {gateway}/webhooks/stripe` with `signature`; the status and body.
pub async fn deliver(gateway: &str, event: &StripeEvent, signature: &str) -> (u16, Value) {
    let response = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .post(format!("{gateway}/webhooks/stripe"))
        .header("content-type", "application/json; charset=utf-8")
        .header("stripe-signature", signature)
        .body(event.body.clone())
        .send()
        .await
        .expect("deliver the event");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    crate::leak::assert_no_provider_names(&body);
    (status, body)
}

impl MockStripe {
    pub async fn start() -> MockStripe {
        let shared = Arc::new(Shared::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the mock Stripe");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let app = Router::new()
            .route("/v1/checkout/sessions", post(create_session))
            .route("/v1/payment_intents", post(create_intent))
            .route("/c/pay/{id}", get(payment_page).post(pay))
            .with_state((shared.clone(), url.clone()));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockStripe { url, shared, task }
    }

    /// The next call is answered with `status` and a Stripe error object.
    pub fn fail_next(&self, status: u16, kind: &str) {
        let body = json!({"error": {
            "type": kind,
            "message": STRIPE_ERROR_TEXT,
            "request_log_url": "https://dashboard.stripe.com/test/logs/req_mock",
        }});
        lock(&self.shared.failures).push((status, body));
    }

    /// The next `n` off-session charges are declined (`card_declined`), as a card with
    /// insufficient funds is.
    pub fn decline_next(&self, n: usize) {
        self.shared.declines.store(n, Ordering::SeqCst);
    }

    /// Off-session charges created, declined ones included (replays are not new charges).
    pub fn intents(&self) -> Vec<MockIntent> {
        lock(&self.shared.intents).clone()
    }

    /// Calls received, failed ones and replays included.
    pub fn calls(&self) -> usize {
        self.shared.calls.load(Ordering::SeqCst)
    }

    pub fn sessions(&self) -> Vec<MockSession> {
        lock(&self.shared.sessions).clone()
    }

    /// Sessions paid on the hosted payment page, in order.
    pub fn paid_sessions(&self) -> Vec<MockSession> {
        let paid = lock(&self.shared.paid).clone();
        let sessions = self.sessions();
        paid.iter()
            .filter_map(|id| sessions.iter().find(|s| &s.id == id).cloned())
            .collect()
    }

    /// The session the browser was sent to at `url`.
    pub fn session_at(&self, url: &str) -> MockSession {
        self.sessions()
            .into_iter()
            .find(|s| s.url == url)
            .unwrap_or_else(|| panic!("no session at {url}"))
    }

    fn id(&self, prefix: &str) -> String {
        let n = self.shared.ids.fetch_add(1, Ordering::SeqCst);
        format!("{prefix}_mock_{n}_{}", now())
    }

    /// An event of `kind` about `object`, as Stripe builds it.
    pub fn event(&self, kind: &str, object: Value) -> StripeEvent {
        let id = self.id("evt");
        let body = json!({
            "id": id,
            "object": "event",
            "api_version": "2024-06-20",
            "created": now(),
            "livemode": false,
            "pending_webhooks": 1,
            "type": kind,
            "data": {"object": object},
        });
        StripeEvent {
            id,
            body: serde_json::to_vec(&body).expect("json"),
        }
    }

    /// `checkout.session.*` about `session`, whose payment is `payment_status`.
    pub fn session_event(
        &self,
        kind: &str,
        session: &MockSession,
        payment_status: &str,
    ) -> StripeEvent {
        let metadata: HashMap<&str, &str> = session
            .form
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("metadata[")
                    .and_then(|k| k.strip_suffix(']'))
                    .map(|k| (k, v.as_str()))
            })
            .collect();
        let status = if payment_status == "paid" {
            "complete"
        } else {
            "open"
        };
        self.event(
            kind,
            json!({
                "id": session.id,
                "object": "checkout.session",
                "mode": "payment",
                "status": status,
                "payment_status": payment_status,
                "amount_total": session.amount_total,
                "currency": "usd",
                "client_reference_id": session.field("client_reference_id"),
                "metadata": metadata,
                "payment_intent": session.payment_intent,
                "url": null,
            }),
        )
    }

    /// `checkout.session.completed` with the payment made.
    pub fn paid(&self, session: &MockSession) -> StripeEvent {
        self.session_event("checkout.session.completed", session, "paid")
    }

    /// `payment_intent.succeeded` of a checkout's PaymentIntent; the card is saved for
    /// off-session use when the session asked for it.
    pub fn checkout_intent_succeeded(&self, session: &MockSession) -> StripeEvent {
        let saving = session.field("payment_intent_data[setup_future_usage]");
        let (customer, saving) = if saving.is_empty() {
            (Value::Null, Value::Null)
        } else {
            (json!(CUSTOMER), json!(saving))
        };
        self.event(
            "payment_intent.succeeded",
            json!({
                "id": session.payment_intent,
                "object": "payment_intent",
                "amount": session.amount_total,
                "amount_received": session.amount_total,
                "currency": "usd",
                "status": "succeeded",
                "customer": customer,
                "payment_method": PAYMENT_METHOD,
                "setup_future_usage": saving,
                "metadata": {
                    "account_id": session.account_id(),
                    "reference": session.reference(),
                },
            }),
        )
    }

    /// `payment_intent.succeeded` of an off-session charge.
    pub fn intent_succeeded(&self, intent: &MockIntent) -> StripeEvent {
        self.event(
            "payment_intent.succeeded",
            json!({
                "id": intent.id,
                "object": "payment_intent",
                "amount": intent.amount,
                "amount_received": intent.amount,
                "currency": intent.field("currency"),
                "status": "succeeded",
                "customer": intent.field("customer"),
                "payment_method": intent.field("payment_method"),
                "setup_future_usage": null,
                "metadata": {
                    "account_id": intent.field("metadata[account_id]"),
                    "reference": intent.field("metadata[reference]"),
                },
            }),
        )
    }

    /// `charge.refunded` of the session's charge, refunded `amount_refunded` in total.
    pub fn refunded(&self, session: &MockSession, amount_refunded: u64) -> StripeEvent {
        self.event(
            "charge.refunded",
            json!({
                "id": format!("ch_{}", session.payment_intent),
                "object": "charge",
                "amount": session.amount_total,
                "amount_refunded": amount_refunded,
                "refunded": amount_refunded >= session.amount_total,
                "currency": "usd",
                "payment_intent": session.payment_intent,
                "metadata": {},
            }),
        )
    }

    /// `charge.dispute.created` / `.closed` (`status` `won`, `lost`, `needs_response`...).
    pub fn dispute(
        &self,
        kind: &str,
        dispute_id: &str,
        session: &MockSession,
        amount: u64,
        status: &str,
    ) -> StripeEvent {
        self.event(
            kind,
            json!({
                "id": dispute_id,
                "object": "dispute",
                "amount": amount,
                "currency": "usd",
                "charge": format!("ch_{}", session.payment_intent),
                "payment_intent": session.payment_intent,
                "reason": "fraudulent",
                "status": status,
            }),
        )
    }
}

impl Drop for MockStripe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn stripe_error(status: u16, kind: &str, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let body = json!({"error": {"type": kind, "message": message}});
    (status, Json(body)).into_response()
}

/// What every call checks first, as Stripe does: the secret key, an Idempotency-Key (a replay
/// with the same parameters gets the first answer; other parameters, an `idempotency_error`),
/// then a scripted failure. `Err` is the answer to send; `Ok` is the idempotency key.
fn admit(shared: &Shared, headers: &HeaderMap, form: &FormBody) -> Result<String, Box<Response>> {
    shared.calls.fetch_add(1, Ordering::SeqCst);
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(API_KEY) {
        return Err(Box::new(stripe_error(
            401,
            "invalid_request_error",
            "Invalid API Key provided: sk_test_****",
        )));
    }
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return Err(Box::new(stripe_error(
            400,
            "invalid_request_error",
            "the mock wants an Idempotency-Key",
        )));
    };
    if let Some((first_form, status, body)) = lock(&shared.answered).get(&key).cloned() {
        if &first_form != form {
            return Err(Box::new(stripe_error(
                400,
                "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters they were first used with.",
            )));
        }
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        return Err(Box::new(
            (status, [("idempotent-replayed", "true")], Json(body)).into_response(),
        ));
    }
    let failure = {
        let mut failures = lock(&shared.failures);
        (!failures.is_empty()).then(|| failures.remove(0))
    };
    if let Some((status, body)) = failure {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        return Err(Box::new((status, Json(body)).into_response()));
    }
    Ok(key)
}

async fn create_intent(
    State((shared, _)): State<(Arc<Shared>, String)>,
    headers: HeaderMap,
    Form(form): Form<FormBody>,
) -> Response {
    let key = match admit(&shared, &headers, &form) {
        Ok(key) => key,
        Err(answer) => return *answer,
    };
    let fields: HashMap<String, String> = form.iter().cloned().collect();
    let n = shared.ids.fetch_add(1, Ordering::SeqCst);
    let declined = shared
        .declines
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| d.checked_sub(1))
        .is_ok();
    let intent = MockIntent {
        id: format!("pi_mock_offsession_{n}"),
        amount: fields
            .get("amount")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        declined,
        idempotency_key: key.clone(),
        form: fields,
    };
    let (status, body) = if declined {
        (
            402,
            json!({"error": {
                "type": "card_error",
                "code": "card_declined",
                "decline_code": "insufficient_funds",
                "message": format!("Your card has insufficient funds. {STRIPE_ERROR_TEXT}"),
                "payment_intent": {"id": intent.id, "status": "requires_payment_method"},
            }}),
        )
    } else {
        (
            200,
            json!({
                "id": intent.id,
                "object": "payment_intent",
                "amount": intent.amount,
                "currency": "usd",
                "status": "succeeded",
            }),
        )
    };
    lock(&shared.intents).push(intent);
    lock(&shared.answered).insert(key, (form, status, body.clone()));
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    (status, Json(body)).into_response()
}

async fn create_session(
    State((shared, base)): State<(Arc<Shared>, String)>,
    headers: HeaderMap,
    Form(form): Form<FormBody>,
) -> Response {
    let key = match admit(&shared, &headers, &form) {
        Ok(key) => key,
        Err(answer) => return *answer,
    };
    let fields: HashMap<String, String> = form.iter().cloned().collect();
    let n = shared.ids.fetch_add(1, Ordering::SeqCst);
    let id = format!("cs_test_mock_{n}");
    let session = MockSession {
        url: format!("{base}/c/pay/{id}"),
        payment_intent: format!("pi_mock_{n}"),
        amount_total: fields
            .get("line_items[0][price_data][unit_amount]")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        idempotency_key: key.clone(),
        form: fields,
        id,
    };
    let body = json!({
        "id": session.id,
        "object": "checkout.session",
        "url": session.url,
        "amount_total": session.amount_total,
        "currency": "usd",
        "payment_status": "unpaid",
        "status": "open",
        "client_reference_id": session.field("client_reference_id"),
        "payment_intent": null,
    });
    lock(&shared.sessions).push(session);
    lock(&shared.answered).insert(key, (form, 200, body.clone()));
    Json(body).into_response()
}

/// Stripe's hosted payment page, reduced to its button.
async fn payment_page(Path(id): Path<String>) -> Html<String> {
    Html(format!(
        "<!doctype html><title>Pay</title><h1>Checkout {id}</h1>\
         <form method=post><button id=pay type=submit>Pay</button></form>"
    ))
}

/// Pays the session and sends the browser back to its `success_url`; the test then delivers
/// the events Stripe would send.
async fn pay(State((shared, _)): State<(Arc<Shared>, String)>, Path(id): Path<String>) -> Response {
    let success = lock(&shared.sessions)
        .iter()
        .find(|s| s.id == id)
        .map(|s| s.field("success_url").to_owned());
    let Some(success) = success else {
        return stripe_error(404, "invalid_request_error", "No such checkout session");
    };
    lock(&shared.paid).push(id);
    Redirect::to(&success).into_response()
}
