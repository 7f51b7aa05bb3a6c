//! The key-guessing brake behind an ingress: a real nginx in front of the gateway, forwarding
//! as ingress-nginx does (`X-Forwarded-For` with the peer appended, `X-Real-IP`), and clients
//! on two loopback source addresses (127.0.0.2 and 127.0.0.3). One client sends 40 wrong keys
//! in a minute; every valid key, the other client's and its own, is served throughout, and
//! the guessing client is still braked (429). With the proxy trusted (the chart trusts the
//! ingress controller's networks) the brake counts each real client; without, every client
//! counts as the proxy, and still no valid key is refused.
//!
//! A braked address costs the store at most its limit again in key lookups: the last test
//! shows, on Postgres, that past that allowance a key the pod has not looked up recently is
//! refused without the store being asked, while a key it has is served from its cache.

use std::net::IpAddr;

use e2e::{Cluster, Gateway, KeySpec, Nginx, PostgresServer, Resp};
use reqwest::Method;

/// The README's default: requests without a valid key per client address and minute.
const PER_MINUTE: u64 = 30;
/// Wrong keys the guessing client sends in the minute.
const GUESSES: u64 = 40;

/// A client on its own loopback source address, speaking to the gateway through nginx.
struct Client<'a> {
    http: reqwest::Client,
    nginx: &'a Nginx,
    name: &'static str,
}

impl<'a> Client<'a> {
    fn on(address: &str, nginx: &'a Nginx, name: &'static str) -> Self {
        let address: IpAddr = address.parse().expect("loopback address");
        let http = reqwest::Client::builder()
            .no_proxy()
            .local_address(address)
            .build()
            .expect("http client");
        Self { http, nginx, name }
    }

    async fn models(&self, key: &str, forwarded_for: Option<&str>) -> Resp {
        let mut rb = self
            .http
            .request(Method::GET, self.nginx.url("/v1/models"))
            .bearer_auth(key);
        if let Some(claim) = forwarded_for {
            rb = rb.header("x-forwarded-for", claim);
        }
        let response = rb.send().await.unwrap_or_else(|e| {
            panic!(
                "{}: request through nginx failed: {e}\n{}",
                self.name,
                self.nginx.logs()
            )
        });
        Resp::read(response).await
    }
}

fn wrong_key(n: u64) -> String {
    format!("sk-svc-guess-{n:040}")
}

/// The gateway behind nginx, with `--trusted-proxies` when given, and a second valid key.
async fn behind_nginx(trusted: Option<&str>) -> (Gateway, Nginx, String) {
    let mut builder = Gateway::builder();
    if let Some(networks) = trusted {
        builder = builder.arg("--trusted-proxies").arg(networks);
    }
    let gw = builder.start().await;
    let upstream = gw.api.trim_start_matches("http://").to_owned();
    let nginx = Nginx::start(&upstream).await;
    let other_key = gw.new_key(1_000_000, &KeySpec::api()).await.secret;
    // Every request of the minute below lands in one window.
    gw.wait_for_roomy_window(&gw.key, 20).await;
    (gw, nginx, other_key)
}

/// 40 wrong keys from the guesser, each followed by a valid key from the other client and
/// one from the guesser itself: every valid key is served (200), the first 30 wrong keys get
/// 401, the rest 429.
async fn guess_while_others_are_served(
    guesser: &Client<'_>,
    guesser_key: &str,
    other: &Client<'_>,
    other_key: &str,
) {
    for n in 1..=GUESSES {
        let guessed = guesser.models(&wrong_key(n), None).await;
        if n <= PER_MINUTE {
            guessed.expect_error(401, "authentication_error");
        } else {
            guessed.expect_error(429, "rate_limit_error");
            assert_eq!(
                guessed.request_limit().tier,
                "unauthenticated",
                "guess {n}: {guessed}"
            );
        }
        for (client, key) in [(other, other_key), (guesser, guesser_key)] {
            let served = client.models(key, None).await;
            assert_eq!(
                served.status, 200,
                "after guess {n}, {}'s valid key: {served}",
                client.name
            );
            assert_ne!(served.rate_limit().tier, "unauthenticated", "{served}");
        }
    }
}

#[tokio::test]
async fn behind_a_trusted_ingress_the_brake_counts_the_real_client_and_serves_every_valid_key() {
    // Trusted as the chart trusts the ingress controller's networks: nginx's address.
    let (gw, nginx, other_key) = behind_nginx(Some("127.0.0.1")).await;
    let guesser = Client::on("127.0.0.2", &nginx, "the guesser");
    let other = Client::on("127.0.0.3", &nginx, "the other client");
    guess_while_others_are_served(&guesser, &gw.key, &other, &other_key).await;

    // The guesser is braked whatever it claims to be: its own X-Forwarded-For is left of the
    // address nginx saw.
    guesser
        .models(&wrong_key(1_000), Some("203.0.113.50"))
        .await
        .expect_error(429, "rate_limit_error");
    // The other client has its whole allowance: the brake counted the guesser, not nginx.
    let own = other.models(&wrong_key(2_000), None).await;
    own.expect_error(401, "authentication_error");
    let limit = own.request_limit();
    assert_eq!(
        (limit.limit, limit.remaining),
        (PER_MINUTE, PER_MINUTE - 1),
        "{own}"
    );
}

#[tokio::test]
async fn behind_an_untrusted_ingress_one_clients_wrong_keys_lock_no_valid_key_out() {
    // Every client counts as nginx: the guesser's wrong keys brake the shared address.
    let (gw, nginx, other_key) = behind_nginx(None).await;
    let guesser = Client::on("127.0.0.2", &nginx, "the guesser");
    let other = Client::on("127.0.0.3", &nginx, "the other client");
    guess_while_others_are_served(&guesser, &gw.key, &other, &other_key).await;
    // A wrong key from the other client is braked with the address it shares.
    other
        .models(&wrong_key(2_000), None)
        .await
        .expect_error(429, "rate_limit_error");
}

#[tokio::test]
async fn a_braked_address_gets_no_more_key_lookups_than_its_limit_again() {
    const LIMIT: u64 = 3;
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| {
        b.database(&pg.url())
            .arg("--unauthenticated-per-minute")
            .arg(&LIMIT.to_string())
    })
    .await;
    let gw = &cluster.pods[0];
    // Minted, never used: no pod has looked it up.
    let unseen = gw.new_key(1_000_000, &KeySpec::api()).await.secret;
    gw.wait_for_roomy_window(&gw.key, 20).await;
    // A key this pod looked up a moment ago is in its cache.
    let seen = &gw.key;
    assert_eq!(gw.get("/v1/models", seen).await.status, 200);

    for n in 1..=LIMIT {
        gw.get("/v1/models", &wrong_key(n))
            .await
            .expect_error(401, "authentication_error");
    }
    gw.get("/v1/models", &wrong_key(100))
        .await
        .expect_error(429, "rate_limit_error");
    // Braked: fresh wrong keys are looked up as many times again as the limit...
    for n in 1..=LIMIT {
        gw.get("/v1/models", &wrong_key(200 + n))
            .await
            .expect_error(429, "rate_limit_error");
    }
    // ...and then not at all: a valid key the pod has not seen is refused without a lookup
    // (had the store been asked, it would have been served), while the cached one is served.
    gw.get("/v1/models", &unseen)
        .await
        .expect_error(429, "rate_limit_error");
    let cached = gw.get("/v1/models", seen).await;
    assert_eq!(cached.status, 200, "{cached}");
}
