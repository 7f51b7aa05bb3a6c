//! The billing page in a real headless chromium against two `serve` pods on Postgres and the
//! mock Stripe: a developer buys a pack and a custom amount through Stripe's redirect, sees
//! the credits once Stripe's webhook (delivered to the other pod) confirms them, sees a refund
//! take credits back, and sets up auto-reload, which fires once when turns on both pods drain
//! the balance below the threshold.

use std::time::Duration;

use e2e::browser::Browser;
use e2e::stripe::{deliver, MockSession, MockStripe, API_KEY, WEBHOOK_SECRET};
use e2e::visitor::{new_email, thousands, PASSWORD};
use e2e::{message, poll_until, Cluster, KeySpec, PostgresServer};

/// Pays on Stripe's page the session the browser was sent to; back on the billing page.
async fn pay(b: &Browser, stripe: &MockStripe, paid_before: usize) -> MockSession {
    b.click_and_load("#pay").await;
    b.wait_for_path("/developers/billing").await;
    let paid = stripe.paid_sessions();
    assert_eq!(paid.len(), paid_before + 1);
    paid[paid_before].clone()
}

async fn balance_shown(b: &Browser, billing: &str, expected: u64) {
    let expected = thousands(expected);
    poll_until(
        &format!("the billing page to show {expected} credits"),
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            b.goto(billing).await;
            (b.text("#balance").await == expected).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_developer_buys_credits_through_stripe_sees_a_refund_and_an_auto_reload_fire_once() {
    let stripe = MockStripe::start().await;
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(2, |b| {
        b.database(&pg.url())
            .env("GATEWAY_STRIPE_API_KEY", API_KEY)
            .env("GATEWAY_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("GATEWAY_STRIPE_API_BASE", &stripe.url)
            .env("GATEWAY_AUTO_RELOAD_INTERVAL_MS", "100")
    })
    .await;
    let (first, second) = (&cluster.pods[0], &cluster.pods[1]);
    let send = |pod: &e2e::Gateway, event: e2e::stripe::StripeEvent| {
        let api = pod.api.clone();
        async move {
            let (status, body) = deliver(&api, &event, &event.signature()).await;
            assert_eq!(status, 200, "{body}");
        }
    };
    let b = Browser::start().await;
    let billing = format!("{}/developers/billing", first.api);

    let email = new_email();
    b.goto(&format!("{}/developers/sign-up", first.api)).await;
    b.fill("#email", &email).await;
    b.fill("#password", PASSWORD).await;
    b.click_and_load("button[type=submit]").await;
    b.verify_and_sign_in(first, &email, PASSWORD).await;

    // A $25 pack: to Stripe and back; pending until the webhook, which reaches the other pod.
    b.goto(&billing).await;
    b.click_and_load("#pack-25").await;
    let pack = pay(&b, &stripe, 0).await;
    assert!(b.text("#top-ups").await.contains("pending"));
    send(second, stripe.paid(&pack)).await;
    send(first, stripe.checkout_intent_succeeded(&pack)).await;
    balance_shown(&b, &billing, 2_500_000).await;

    // A custom $75.
    b.fill("#amount", "75").await;
    b.click_and_load("#custom-checkout").await;
    let custom = pay(&b, &stripe, 1).await;
    send(first, stripe.paid(&custom)).await;
    send(second, stripe.paid(&custom)).await;
    balance_shown(&b, &billing, 10_000_000).await;

    // The pack refunded: its credits go, the history says so.
    send(second, stripe.refunded(&pack, 2_500)).await;
    balance_shown(&b, &billing, 7_500_000).await;
    assert!(b.text("#top-ups").await.contains("refunded"));

    // Auto-reload: below 7,499,999 credits, add $50; turns on both pods cross it once.
    b.fill("#threshold", "7499999").await;
    b.fill("#reload-amount", "50").await;
    b.click("#auto-reload-enabled").await;
    b.click_and_load("#save-auto-reload").await;
    let status = b.text("#auto-reload-status").await;
    assert!(
        status.contains("On: when the balance falls below 7,499,999 credits, $50"),
        "{status}"
    );
    let key = first.mint_key(pack.account_id(), &KeySpec::api()).await;
    for i in 0..4 {
        let turn = cluster
            .pod(i)
            .post_messages(&key.secret, &message("svc/haiku", "drain", 16))
            .await;
        assert_eq!(turn.status, 200);
    }
    let intents = poll_until(
        "the auto-reload charge",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let intents = stripe.intents();
            (!intents.is_empty()).then_some(intents)
        },
    )
    .await;
    assert_eq!(intents.len(), 1, "{intents:?}");
    assert_eq!(intents[0].amount, 5_000);
    b.goto(&billing).await;
    let before: u64 = b
        .text("#balance")
        .await
        .replace(',', "")
        .parse()
        .expect("balance");
    send(second, stripe.intent_succeeded(&intents[0])).await;
    balance_shown(&b, &billing, before + 5_000_000).await;
    assert_eq!(stripe.intents().len(), 1, "one crossing, one charge");
    b.quit().await;
}
