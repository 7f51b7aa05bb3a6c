//! Top-ups through Stripe, against the mock Stripe (`e2e::stripe`), on both stores: two
//! `serve` pods on Postgres, and one standalone gateway in process. A checkout sends the
//! browser to a Checkout Session created with an Idempotency-Key; only Stripe's signed webhook
//! credits the account, once per session whatever Stripe delivers (duplicates, reordering, two
//! pods at once); forged, expired or tampered deliveries change nothing; refunds and disputes
//! take credits back and show in the billing history; Stripe's own error text never reaches
//! the user.

use std::time::Duration;

use e2e::stripe::{
    deliver, now, sign, stripe_library_sign, stripe_library_verify, MockSession, MockStripe,
    StripeEvent, API_KEY, CUSTOMER, PAYMENT_METHOD, STRIPE_ERROR_TEXT, WEBHOOK_SECRET,
};
use e2e::visitor::{hidden_csrf, new_email, Visitor};
use e2e::{message, poll_until, Cluster, Gateway, GatewayBuilder, KeySpec, PostgresServer};
use serde_json::Value;

fn with_stripe(builder: GatewayBuilder, stripe: &MockStripe) -> GatewayBuilder {
    builder
        .env("GATEWAY_STRIPE_API_KEY", API_KEY)
        .env("GATEWAY_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET)
        .env("GATEWAY_STRIPE_API_BASE", &stripe.url)
        .env("GATEWAY_AUTO_RELOAD_INTERVAL_MS", "100")
}

/// The gateways of one store, all on the same mock Stripe.
struct Shop {
    stripe: MockStripe,
    pods: Vec<Gateway>,
    _cluster: Option<(Cluster, PostgresServer)>,
}

impl Shop {
    async fn postgres() -> Shop {
        let stripe = MockStripe::start().await;
        let pg = PostgresServer::start().await;
        let mut cluster = Cluster::start(2, |b| with_stripe(b.database(&pg.url()), &stripe)).await;
        let pods = std::mem::take(&mut cluster.pods);
        Shop {
            stripe,
            pods,
            _cluster: Some((cluster, pg)),
        }
    }

    async fn in_process() -> Shop {
        let stripe = MockStripe::start().await;
        let gw = with_stripe(Gateway::builder(), &stripe).start().await;
        Shop {
            stripe,
            pods: vec![gw],
            _cluster: None,
        }
    }

    fn pod(&self, i: usize) -> &Gateway {
        &self.pods[i % self.pods.len()]
    }

    /// Delivers `event`, freshly signed, to pod `i`.
    async fn deliver(&self, i: usize, event: &StripeEvent) -> (u16, Value) {
        deliver(&self.pod(i).api, event, &event.signature()).await
    }

    async fn outcome(&self, i: usize, event: &StripeEvent) -> String {
        let (status, body) = self.deliver(i, event).await;
        assert_eq!(status, 200, "{body}");
        body["outcome"].as_str().unwrap_or_default().to_owned()
    }

    /// (balance, lifetime top-up in cents, credits owed) of the account.
    async fn money(&self, account_id: &str) -> (u64, u64, u64) {
        let account = self.pod(0).admin_account(account_id).await;
        let get = |k: &str| account[k].as_u64().unwrap_or(u64::MAX);
        (
            get("balance"),
            get("lifetime_top_up_cents"),
            get("owed_credits"),
        )
    }
}

/// A signed-up visitor starts a checkout of `amount`; the session the browser was sent to.
async fn checkout(shop: &Shop, visitor: &mut Visitor<'_>, amount: &str) -> MockSession {
    let (status, body, location) = visitor.checkout(amount).await;
    assert_eq!(status, 303, "the checkout redirects to Stripe: {body}");
    shop.stripe
        .session_at(location.as_deref().expect("a Location"))
}

async fn a_checkout_sends_the_browser_to_a_session_for_the_amount_and_credits_only_on_the_webhook(
    shop: Shop,
) {
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    let session = checkout(&shop, &mut visitor, "25").await;

    assert_eq!(session.field("mode"), "payment");
    assert_eq!(session.field("line_items[0][price_data][currency]"), "usd");
    assert_eq!(session.amount_total, 2_500);
    assert_eq!(session.idempotency_key, session.reference());
    assert_eq!(session.field("client_reference_id"), session.reference());
    assert!(
        session
            .field("success_url")
            .ends_with(&format!("/developers/billing?paid={}", session.reference())),
        "{session:?}"
    );
    assert!(session.account_id().starts_with("acct_"), "{session:?}");
    let (_, page) = visitor.get("/developers/billing").await;
    assert!(page.contains(session.reference()) && page.contains("pending"));
    assert_eq!(shop.money(session.account_id()).await, (0, 0, 0));

    assert_eq!(
        shop.outcome(0, &shop.stripe.paid(&session)).await,
        "credited"
    );
    assert_eq!(
        shop.money(session.account_id()).await,
        (2_500_000, 2_500, 0)
    );
    let (_, back) = visitor
        .get(&format!("/developers/billing?paid={}", session.reference()))
        .await;
    assert!(back.contains("2,500,000 credits added"), "{back}");
}

async fn a_paid_session_credits_once_whatever_order_and_however_often_its_events_arrive(
    shop: Shop,
) {
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    let session = checkout(&shop, &mut visitor, "$40").await;
    let stripe = &shop.stripe;
    let completed_unpaid = stripe.session_event("checkout.session.completed", &session, "unpaid");
    let succeeded =
        stripe.session_event("checkout.session.async_payment_succeeded", &session, "paid");
    let completed_paid = stripe.paid(&session);

    assert_eq!(shop.outcome(0, &completed_unpaid).await, "awaiting_payment");
    assert_eq!(shop.money(session.account_id()).await.0, 0);
    assert_eq!(shop.outcome(1, &succeeded).await, "credited");
    for (i, event) in [&completed_paid, &succeeded, &completed_unpaid, &succeeded]
        .into_iter()
        .enumerate()
    {
        let outcome = shop.outcome(i, event).await;
        assert!(
            outcome == "already_applied" || outcome == "awaiting_payment",
            "{outcome}"
        );
    }
    assert_eq!(
        shop.money(session.account_id()).await,
        (4_000_000, 4_000, 0)
    );
}

async fn the_same_event_delivered_to_every_pod_at_once_credits_once(shop: Shop) {
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    let session = checkout(&shop, &mut visitor, "100").await;
    let event = shop.stripe.paid(&session);
    let outcomes = futures::future::join_all((0..16).map(|i| shop.outcome(i, &event))).await;
    let credited = outcomes.iter().filter(|o| *o == "credited").count();
    assert_eq!(credited, 1, "{outcomes:?}");
    assert!(outcomes
        .iter()
        .all(|o| o == "credited" || o == "already_applied"));
    assert_eq!(
        shop.money(session.account_id()).await,
        (10_000_000, 10_000, 0)
    );
}

async fn forged_expired_tampered_and_unsigned_deliveries_are_refused_and_change_nothing(
    shop: Shop,
) {
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    let session = checkout(&shop, &mut visitor, "25").await;
    let event = shop.stripe.paid(&session);
    let gw = &shop.pod(0).api;

    let forged = sign("whsec_not_the_endpoints_secret", now(), &event.body);
    let expired = sign(WEBHOOK_SECRET, now() - 301, &event.body);
    let mut tampered = event.clone();
    tampered.body = String::from_utf8(event.body.clone())
        .expect("utf-8")
        .replace("2500", "250000")
        .into_bytes();
    for (what, event, signature) in [
        ("forged", &event, forged),
        ("expired", &event, expired),
        ("tampered", &tampered, event.signature()),
        ("unsigned", &event, String::new()),
        ("garbage", &event, "t=x,v1=zz".to_owned()),
    ] {
        let (status, body) = deliver(gw, event, &signature).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(body["error"]["type"], "authentication_error", "{what}");
    }
    assert_eq!(shop.money(session.account_id()).await, (0, 0, 0));

    // While the endpoint's secret is rolled, Stripe signs with both; either may match.
    let t = now();
    let rolled = format!(
        "{},{}",
        sign(WEBHOOK_SECRET, t, &event.body),
        sign("whsec_the_old_secret", t, &event.body)
            .split(',')
            .nth(1)
            .unwrap_or_default()
    );
    let (status, body) = deliver(gw, &event, &rolled).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("credited")));

    let not_json = StripeEvent {
        id: "evt_bad".to_owned(),
        body: b"{\"id\": 1".to_vec(),
    };
    let (status, body) = shop.deliver(0, &not_json).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        shop.money(session.account_id()).await,
        (2_500_000, 2_500, 0)
    );
}

async fn stripe_errors_show_a_plain_message_never_stripes_text_and_nothing_is_charged(shop: Shop) {
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    shop.stripe.fail_next(500, "api_error");
    let (status, body, location) = visitor.checkout("25").await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(location, None);
    assert!(body.contains("nothing was charged"), "{body}");
    assert!(!body.contains(STRIPE_ERROR_TEXT) && !body.contains("acct_1Mock"));
    assert!(!body.contains(&shop.stripe.url), "{body}");
    let (_, page) = visitor.get("/developers/billing").await;
    assert!(page.contains("failed"), "{page}");
    assert!(shop.stripe.sessions().is_empty());
}

async fn refunds_and_disputes_take_credits_back_once_and_show_in_the_billing_history(shop: Shop) {
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    let session = checkout(&shop, &mut visitor, "50").await;
    let account = session.account_id().to_owned();
    let stripe = &shop.stripe;

    // A refund arriving before its payment is refused, so Stripe delivers it again later.
    let first_refund = stripe.refunded(&session, 1_000);
    let (status, body) = shop.deliver(0, &first_refund).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(shop.outcome(1, &stripe.paid(&session)).await, "credited");

    // Refunds of $10, then $15 more (charges report their refunded total), delivered late,
    // twice and out of order.
    let second_refund = stripe.refunded(&session, 2_500);
    assert_eq!(shop.outcome(0, &second_refund).await, "refunded");
    assert_eq!(shop.outcome(1, &first_refund).await, "already_applied");
    assert_eq!(shop.outcome(0, &second_refund).await, "already_applied");
    assert_eq!(shop.money(&account).await, (2_500_000, 2_500, 0));

    // A dispute of the remaining $25 takes it back while open, and returns it when won;
    // its close arriving twice, or its opening again afterwards, moves nothing.
    let opened = stripe.dispute(
        "charge.dispute.created",
        "dp_1",
        &session,
        2_500,
        "needs_response",
    );
    let won = stripe.dispute("charge.dispute.closed", "dp_1", &session, 2_500, "won");
    assert_eq!(shop.outcome(1, &opened).await, "disputed");
    assert_eq!(shop.money(&account).await, (0, 0, 0));
    assert_eq!(shop.outcome(0, &won).await, "disputed");
    for event in [&won, &opened] {
        assert_eq!(shop.outcome(1, event).await, "already_applied");
    }
    assert_eq!(shop.money(&account).await, (2_500_000, 2_500, 0));

    let (_, page) = visitor.get("/developers/billing").await;
    for shown in ["refunded", "disputed", "dispute won", "−2,500,000"] {
        assert!(page.contains(shown), "{shown}: {page}");
    }
}

/// Saves the auto-reload rule "below `threshold` credits, add `amount` dollars", turned on.
async fn save_rule(visitor: &mut Visitor<'_>, threshold: &str, amount: &str) -> (u16, String) {
    let (_, page) = visitor.get("/developers/billing").await;
    let csrf = hidden_csrf(&page);
    let form = [
        ("csrf", csrf.as_str()),
        ("enabled", "on"),
        ("threshold", threshold),
        ("amount", amount),
    ];
    let (status, body, _) = visitor
        .post("/developers/billing/auto-reload", &form, &[])
        .await;
    (status, body)
}

async fn auto_reload_saves_the_first_checkouts_card_fires_once_per_crossing_and_stops_after_three_declines(
    shop: Shop,
) {
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    let (status, page) = save_rule(&mut visitor, "1000", "25").await;
    assert_eq!(status, 409, "no card saved yet: {page}");

    let first = checkout(&shop, &mut visitor, "10").await;
    assert_eq!(
        first.field("payment_intent_data[setup_future_usage]"),
        "off_session"
    );
    let account = first.account_id().to_owned();
    assert_eq!(shop.outcome(0, &shop.stripe.paid(&first)).await, "credited");
    let saved = shop.stripe.checkout_intent_succeeded(&first);
    assert_eq!(shop.outcome(1, &saved).await, "already_applied");
    let second = checkout(&shop, &mut visitor, "10").await;
    assert_eq!(second.field("payment_intent_data[setup_future_usage]"), "");

    // Below 999,999 credits, add $25: the first turns cross it, on every pod at once.
    let (status, page) = save_rule(&mut visitor, "999,999", "25").await;
    assert_eq!(status, 200, "{page}");
    let key = shop.pod(0).mint_key(&account, &KeySpec::api()).await;
    let drain = message("svc/haiku", "drain", 16);
    let turns =
        futures::future::join_all((0..6).map(|i| shop.pod(i).post_messages(&key.secret, &drain)))
            .await;
    assert!(turns.iter().all(|t| t.status == 200));
    let intents = poll_until(
        "the reload's off-session charge",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let intents = shop.stripe.intents();
            (!intents.is_empty()).then_some(intents)
        },
    )
    .await;
    let reload = &intents[0];
    assert_eq!(reload.amount, 2_500);
    assert_eq!(
        (reload.field("customer"), reload.field("payment_method")),
        (CUSTOMER, PAYMENT_METHOD)
    );
    assert_eq!(reload.field("off_session"), "true");
    assert_eq!(reload.idempotency_key, reload.field("metadata[reference]"));
    // More turns below the threshold, while the reload is on its way: no second charge.
    for i in 0..6 {
        let turn = shop
            .pod(i)
            .post_messages(&key.secret, &message("svc/haiku", "more", 16))
            .await;
        assert_eq!(turn.status, 200);
    }
    assert_eq!(shop.stripe.intents().len(), 1, "one crossing, one charge");
    let before = shop.money(&account).await.0;
    assert_eq!(
        shop.outcome(0, &shop.stripe.intent_succeeded(reload)).await,
        "credited"
    );
    assert_eq!(shop.money(&account).await.0, before + 2_500_000);

    // A rule above the balance fires at once; three declines in a row turn it off.
    shop.stripe.decline_next(3);
    let (status, _) = save_rule(&mut visitor, "100,000,000", "25").await;
    assert_eq!(status, 200);
    // Read on the other pod, with the visitor's session.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let billing = format!("{}/developers/billing", shop.pod(1).api);
    let cookie = visitor.cookie_header();
    let page = poll_until(
        "auto-reload turned off after three declines",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            let response = http.get(&billing).header("cookie", &cookie).send().await;
            let page = response.ok()?.text().await.ok()?;
            page.contains("3 of 3").then_some(page)
        },
    )
    .await;
    assert!(page.contains("Off."), "{page}");
    assert!(page.contains("declined (card_declined)"), "{page}");
    assert!(!page.contains(STRIPE_ERROR_TEXT) && !page.contains("insufficient funds"));
    let intents = shop.stripe.intents();
    assert_eq!(intents.len(), 4, "{intents:?}");
    assert!(intents[1..].iter().all(|i| i.declined));
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Shop::postgres().await).await;
                }
            )*
        }
        mod in_process {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Shop::in_process().await).await;
                }
            )*
        }
    };
}

on_both_stores!(
    a_checkout_sends_the_browser_to_a_session_for_the_amount_and_credits_only_on_the_webhook,
    a_paid_session_credits_once_whatever_order_and_however_often_its_events_arrive,
    the_same_event_delivered_to_every_pod_at_once_credits_once,
    forged_expired_tampered_and_unsigned_deliveries_are_refused_and_change_nothing,
    stripe_errors_show_a_plain_message_never_stripes_text_and_nothing_is_charged,
    refunds_and_disputes_take_credits_back_once_and_show_in_the_billing_history,
    auto_reload_saves_the_first_checkouts_card_fires_once_per_crossing_and_stops_after_three_declines,
);

/// Stripe's own library (PyPI `stripe`) as a second reader of the signature scheme, both
/// ways: a delivery it signs is accepted and credits once, the same delivery altered after it
/// was signed (or signed with another secret) is refused and changes nothing; and the mock's
/// signatures, which every other test delivers, verify with its `construct_event` (and not
/// for another body or secret).
#[tokio::test]
async fn stripes_own_library_signs_deliveries_the_gateway_accepts_and_verifies_the_mocks() {
    let shop = Shop::in_process().await;
    let mut visitor = Visitor::new(shop.pod(0));
    visitor.sign_up(&new_email(), &[]).await;
    let session = checkout(&shop, &mut visitor, "25").await;
    let event = shop.stripe.paid(&session);
    let gw = &shop.pod(0).api;

    let mock = event.signature();
    stripe_library_verify(WEBHOOK_SECRET, &mock, &event.body)
        .await
        .unwrap_or_else(|e| panic!("Stripe's library refuses the mock's signature: {e}"));
    let mut altered = event.body.clone();
    altered.extend_from_slice(b" ");
    assert!(stripe_library_verify(WEBHOOK_SECRET, &mock, &altered)
        .await
        .is_err());
    assert!(stripe_library_verify("whsec_another", &mock, &event.body)
        .await
        .is_err());

    let signed = stripe_library_sign(WEBHOOK_SECRET, now(), &event.body).await;
    let mut tampered = event.clone();
    tampered.body = String::from_utf8(event.body.clone())
        .expect("utf-8")
        .replace("2500", "250000")
        .into_bytes();
    assert_ne!(tampered.body, event.body);
    let another = stripe_library_sign("whsec_another", now(), &event.body).await;
    for (what, event, signature) in [
        ("altered after signing", &tampered, &signed),
        ("signed with another secret", &event, &another),
    ] {
        let (status, body) = deliver(gw, event, signature).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(body["error"]["type"], "authentication_error", "{what}");
    }
    assert_eq!(shop.money(session.account_id()).await, (0, 0, 0));

    let (status, body) = deliver(gw, &event, &signed).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("credited")),
        "signed by Stripe's library: {body}"
    );
    assert_eq!(
        shop.money(session.account_id()).await,
        (2_500_000, 2_500, 0)
    );
}

#[tokio::test]
async fn a_gateway_given_only_half_of_the_stripe_configuration_refuses_to_start() {
    for (name, value) in [
        ("GATEWAY_STRIPE_API_KEY", API_KEY),
        ("GATEWAY_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET),
    ] {
        let out = tokio::process::Command::new(e2e::gateway::gateway_bin())
            .arg("standalone")
            .env(name, value)
            .output()
            .await
            .expect("run the gateway");
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("half-configured"), "{stderr}");
        assert!(
            !stderr.contains(value),
            "the secret is never printed: {stderr}"
        );
    }
}

#[tokio::test]
async fn stripe_sends_the_browser_back_to_the_public_url_never_to_the_requests_host() {
    let stripe = MockStripe::start().await;
    let configured = with_stripe(Gateway::builder(), &stripe)
        .arg("--public-url")
        .arg("https://gateway.example.com/")
        .start()
        .await;
    let unconfigured = with_stripe(Gateway::builder(), &stripe).start().await;
    for (gw, base) in [
        (&configured, "https://gateway.example.com".to_owned()),
        // Without one, the listener's own address.
        (&unconfigured, unconfigured.api.clone()),
    ] {
        let mut visitor = Visitor::new(gw);
        visitor.sign_up(&new_email(), &[]).await;
        let (_, page) = visitor.get("/developers/billing").await;
        let csrf = hidden_csrf(&page);
        visitor.location = None;
        let (status, body, _) = visitor
            .post(
                "/developers/billing/checkout",
                &[("csrf", &csrf), ("amount", "25")],
                &[("host", "attacker.example"), ("x-forwarded-proto", "https")],
            )
            .await;
        assert_eq!(status, 303, "{body}");
        let session = stripe.session_at(visitor.location.as_deref().expect("a Location"));
        for field in ["success_url", "cancel_url"] {
            let url = session.field(field);
            assert!(
                url.starts_with(&format!("{base}/developers/billing?")),
                "{field}: {url}"
            );
        }
    }
}
