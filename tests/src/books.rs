//! The books of an account after a burst of turns: what its clients were told they consumed
//! is exactly the balance decrease and the ledger's debits, with nothing left reserved; and
//! what a stream cut short costs, from what its client received.

use serde_json::Value;

use crate::gateway::{workspace_root, Gateway};
use crate::postgres::PostgresServer;
use crate::response::Resp;

/// Tallies answers to one account's turns: (accepted, credits the clients were told). Every
/// other answer is one of `refusals` (status, `error.type`) or a 503 `api_error` (a loaded
/// machine may still run a call past its bound: refused, billed nothing, and the books must
/// balance all the same).
pub fn tally<'a>(
    answers: impl IntoIterator<Item = &'a Resp>,
    refusals: &[(u16, &str)],
) -> (u64, u64) {
    let (mut accepted, mut consumed) = (0, 0);
    for resp in answers {
        if resp.status == 200 {
            accepted += 1;
            consumed += resp.json()["usage"]["credits_consumed"]
                .as_u64()
                .expect("credits_consumed");
            continue;
        }
        let error_type = refusals
            .iter()
            .chain(&[(503, "api_error")])
            .find(|(status, _)| *status == resp.status)
            .map(|(_, error_type)| *error_type)
            .unwrap_or_else(|| panic!("unexpected answer to a turn: {resp}"));
        resp.expect_error(resp.status, error_type);
    }
    (accepted, consumed)
}

/// The account `id` started at `start`, and its test expects at least `served_at_least` of
/// its turns served (so that books kept by refusing everything do not pass): at least that
/// many were; what its clients were told they consumed is the balance decrease and the
/// ledger's debits, one completed row per accepted turn, nothing held.
pub async fn assert_books_balance(
    pg: &PostgresServer,
    id: &str,
    start: u64,
    served_at_least: u64,
    (accepted, consumed): (u64, u64),
) {
    assert!(
        accepted >= served_at_least,
        "{id}: {accepted} turns served (200), and at least {served_at_least} were expected"
    );
    assert!(
        accepted == 0 || consumed > 0,
        "{id}: {accepted} turns served and told 0 credits in all"
    );
    let balance = settled(pg, id).await;
    let debits = pg
        .query_i64(&format!(
            "SELECT coalesce(sum(billed), 0) FROM messages WHERE account_id = '{id}'"
        ))
        .await;
    let billed_turns = pg
        .query_i64(&format!(
            "SELECT count(*) FROM messages WHERE account_id = '{id}' AND status = 'completed'"
        ))
        .await;
    assert!(balance >= 0, "{id}: the balance went negative: {balance}");
    assert_eq!(
        consumed as i64,
        start as i64 - balance,
        "{id}: clients' credits_consumed vs the balance decrease"
    );
    assert_eq!(
        consumed as i64, debits,
        "{id}: clients' credits_consumed vs the ledger's debits"
    );
    assert_eq!(
        accepted as i64, billed_turns,
        "{id}: accepted turns vs completed ledger rows"
    );
    assert_rollups_match_rows(pg, id).await;
}

/// The account's usage rollups (store/migrations/0015_usage_rollups.sql) are exactly its
/// final rows grouped by hour of creation, key and model; returns how many rows they sum.
pub async fn assert_rollups_match_rows(pg: &PostgresServer, id: &str) -> i64 {
    let differences = pg
        .query(&format!(
            "WITH grouped AS (
                 SELECT account_id, date_trunc('hour', created_at, 'UTC') AS hour, key_id, model,
                     count(*) FILTER (WHERE served) AS turns,
                     count(*) FILTER (WHERE NOT served) AS errors,
                     coalesce(sum(input_tokens) FILTER (WHERE served), 0) AS input_tokens,
                     coalesce(sum(output_tokens) FILTER (WHERE served), 0) AS output_tokens,
                     coalesce(sum(cache_creation_input_tokens) FILTER (WHERE served), 0) AS cw,
                     coalesce(sum(cache_read_input_tokens) FILTER (WHERE served), 0) AS cr,
                     sum(billed) AS credits,
                     count(*) FILTER (WHERE served AND batch_id IS NOT NULL) AS batch_turns,
                     coalesce(sum(billed) FILTER (WHERE batch_id IS NOT NULL), 0) AS batch_credits
                 FROM (SELECT *, status NOT IN ('failed', 'abandoned') AS served FROM message_rows
                       WHERE account_id = '{id}' AND status <> 'reserved') m
                 GROUP BY 1, 2, 3, 4
             ), rolled AS (
                 SELECT account_id, hour, key_id, model, turns, errors, input_tokens,
                     output_tokens, cache_creation_input_tokens AS cw,
                     cache_read_input_tokens AS cr, credits, batch_turns, batch_credits
                 FROM usage_rollups WHERE account_id = '{id}'
             )
             SELECT coalesce(string_agg(
                 format('%s %s %s: rows %s, rollup %s', hour, key_id, model,
                     row(g.turns, g.errors, g.input_tokens, g.output_tokens, g.cw, g.cr,
                         g.credits, g.batch_turns, g.batch_credits),
                     row(r.turns, r.errors, r.input_tokens, r.output_tokens, r.cw, r.cr,
                         r.credits, r.batch_turns, r.batch_credits)), E'\n'), '')
             FROM grouped g FULL JOIN rolled r USING (account_id, hour, key_id, model)
             WHERE (g.turns, g.errors, g.input_tokens, g.output_tokens, g.cw, g.cr, g.credits,
                    g.batch_turns, g.batch_credits)
                 IS DISTINCT FROM (r.turns, r.errors, r.input_tokens, r.output_tokens, r.cw,
                    r.cr, r.credits, r.batch_turns, r.batch_credits)"
        ))
        .await;
    assert!(
        differences.is_empty(),
        "{id}: the usage rollups differ from the rows grouped by hour, key and model \
         (turns, errors, input, output, cache write, cache read, credits, batch turns, batch \
         credits):\n{differences}"
    );
    pg.query_i64(&format!(
        "SELECT count(*) FROM messages WHERE account_id = '{id}' AND status <> 'reserved'"
    ))
    .await
}

/// `gw`'s turns holding credits, by its own gauge (`gateway_turns_in_flight`).
pub async fn turns_in_flight(gw: &Gateway) -> u64 {
    gw.metrics().await.value("gateway_turns_in_flight", &[]) as u64
}

/// Waits until `gw` has at least `n` turns holding credits, so that a fault injected next hits
/// turns in flight (observed, not assumed); returns how many it had.
pub async fn wait_for_turns_in_flight(gw: &Gateway, n: u64) -> u64 {
    crate::poll_until(
        &format!("{n} turns in flight"),
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(10),
        || async { Some(turns_in_flight(gw).await).filter(|&now| now >= n) },
    )
    .await
}

/// The account's balance once nothing of it is reserved (every turn settled), read from the
/// ledger as `GET /admin/accounts/{id}` reads it; says on time out (10 s) what still holds
/// its credits: the allotments by process, the turns still reserved, and the processes' leases.
async fn settled(pg: &PostgresServer, id: &str) -> i64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let account = loop {
        let account = pg
            .query(&format!(
                "SELECT balance, reserved FROM accounts WHERE id = '{id}'"
            ))
            .await;
        match account.split_once('|') {
            Some((balance, "0")) => return balance.parse().expect("an integer balance"),
            _ if std::time::Instant::now() > deadline => break account,
            _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    };
    let allotments = pg
        .query(&format!(
            "SELECT id, instance_id, credits FROM allotments WHERE account_id = '{id}'"
        ))
        .await;
    let reserved = pg
        .query(&format!(
            "SELECT id, instance_id, reserved, created_at FROM message_rows
             WHERE account_id = '{id}' AND status = 'reserved'"
        ))
        .await;
    let leases = pg
        .query("SELECT id, epoch, heartbeat_at, draining_until FROM gateway_instances")
        .await;
    panic!(
        "{id}: credits still reserved after 10 s (balance|reserved): {account}\n\
         allotments (id|process|credits):\n{allotments}\n\
         reserved turns (id|process|credits|created):\n{reserved}\n\
         leases (process|epoch|heartbeat|draining until):\n{leases}"
    );
}

/// The output tokens of `text` as the gateway counts a stream cut short: o200k_base, the
/// vocabulary of gateway-core/src/tokens.rs, over the deltas' text run together.
pub fn output_tokens(text: &str) -> u64 {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len() as u64
}

/// The output a client of a stream received, from its events' payloads, in order: the text,
/// thinking and tool-input deltas of a Messages stream, the content and tool-argument deltas of
/// a chat-completions stream, the text and argument deltas of a Responses stream.
pub fn received_text<'a>(payloads: impl IntoIterator<Item = &'a Value>) -> String {
    let mut text = String::new();
    for payload in payloads {
        let messages = &payload["delta"];
        let chat = &payload["choices"][0]["delta"];
        let pieces = [
            &messages["text"],
            &messages["thinking"],
            &messages["partial_json"],
            &chat["content"],
            &chat["tool_calls"][0]["function"]["arguments"],
        ];
        for piece in pieces {
            text.push_str(piece.as_str().unwrap_or_default());
        }
        let responses_delta = payload["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("response.") && t.ends_with(".delta"));
        if responses_delta {
            text.push_str(messages.as_str().unwrap_or_default());
        }
    }
    text
}

/// A virtual model's prices as its route in deploy/standalone/models.yaml states them, in
/// micro-USD per million tokens.
#[derive(Clone, Copy, Debug)]
pub struct RoutePrice {
    pub input: u64,
    pub output: u64,
}

impl RoutePrice {
    /// The prices of `model` (`svc/haiku`), read from the standalone manifests the harness
    /// runs (and [`crate::upstream::RoutedManifests`] copies).
    pub fn of(model: &str) -> RoutePrice {
        let path = workspace_root().join("deploy/standalone/models.yaml");
        let routes = std::fs::read_to_string(&path).expect("read the standalone models");
        let route = routes
            .split("\n---")
            .find(|route| route.lines().any(|l| l.trim() == format!("model: {model}")))
            .unwrap_or_else(|| panic!("no route for {model} in {}", path.display()));
        let usd = |field: &str| -> u64 {
            let value = route
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{field}:")))
                .unwrap_or_else(|| panic!("{model}: no {field}"))
                .trim()
                .trim_matches('"');
            let (whole, fraction) = value.split_once('.').unwrap_or((value, ""));
            let micros = format!("{fraction:0<6}");
            whole.parse::<u64>().expect("USD") * 1_000_000
                + micros[..6].parse::<u64>().expect("micro-USD")
        };
        RoutePrice {
            input: usd("inputUsdPerMTok"),
            output: usd("outputUsdPerMTok"),
        }
    }

    /// What `input` and `output` tokens cost at the default 100,000 credits per USD, rounded
    /// up as the gateway rounds.
    pub fn credits(&self, input: u64, output: u64) -> u64 {
        let micro_usd_times_mtok = input * self.input + output * self.output;
        (micro_usd_times_mtok * 100_000).div_ceil(1_000_000 * 1_000_000)
    }

    /// What a stream cut short costs: its input and the output tokens of the text its client
    /// `received`.
    pub fn cut_stream(&self, input: u64, received: &str) -> u64 {
        self.credits(input, output_tokens(received))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_prices_are_read_in_micro_usd() {
        let haiku = RoutePrice::of("svc/haiku");
        assert_eq!((haiku.input, haiku.output), (800_000, 4_000_000));
        // 1,000 input tokens at $0.80/MTok and 100 output at $4/MTok: $0.0012, 120 credits.
        assert_eq!(haiku.credits(1_000, 100), 120);
    }
}
