//! The limiter shared by all gateway pods, in Redis. Every decision is one Lua script call,
//! so two pods admitting the same key at once cannot both take the last slot.
//!
//! Per key id K: a hash `rl:{K}:w` with the current window (`win`, from Redis' own clock, so
//! pods with skewed clocks still agree), its request count `req` and input tokens `tok`; and a
//! sorted set `rl:{K}:s` of stream slots scored by expiry in ms. A stream renews its slot
//! while it runs; a slot whose pod died expires and frees itself. The `{K}` hash tag keeps
//! both keys in one slot, so the scripts work on Redis Cluster.
//!
//! One call per turn: the request count rides on the turn's admission, and a finished turn's
//! token correction (actual input tokens minus the estimate admitted) on the key's next
//! admission from this process, or on a flush within [`FLUSH_CORRECTIONS_EVERY`] when none
//! comes. Only a stream's end (its slot given back) is a call of its own.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use crds::config::Limits;
use dashmap::DashMap;
use fred::interfaces::LuaInterface;
use fred::prelude::{Builder, Client, ClientLike, Config, ReconnectPolicy};
use fred::types::scripts::Script;
use fred::types::FromValue;
use futures::StreamExt;

use super::known::OverLimit;
use super::tls::{self, RedisTlsFiles};
use super::{decide, Admission, AdmissionRequest, LimitError, Limiter, Snapshot, StreamSlot};
use crate::ids;
use store::metrics;

/// Reads the window and live stream slots; applies the token correction it carries (ARGV[10],
/// for the window ARGV[11]); admits when the rules of `limits::decide` allow. Returns the
/// counts before admission, 1 if it admitted (0 refused, 2 past its deadline: the caller
/// already gave up on it, so it must count nothing), the seconds left, and Redis' time.
const ADMIT: &str = r#"
local t = redis.call('TIME')
local secs = tonumber(t[1])
local now = secs * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[8])
if deadline > 0 and now > deadline then
  return {0, 0, 0, 0, 2, now}
end
local win = math.floor(secs / 60)
local w = redis.call('HMGET', KEYS[1], 'win', 'req', 'tok')
local req, tok = 0, 0
local current = tonumber(w[1]) == win
if current then
  req = tonumber(w[2]) or 0
  tok = tonumber(w[3]) or 0
end
local delta = tonumber(ARGV[10])
local corrected = delta ~= 0 and current and tonumber(ARGV[11]) == win
if corrected then
  tok = math.max(0, tok + delta)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local streams = redis.call('ZCARD', KEYS[2])
local rpm, tpm, slots = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local input, stream, ttl_ms = tonumber(ARGV[4]), ARGV[5] == '1', tonumber(ARGV[7])
local count = ARGV[9] == '1'
local admitted = (not count or req < rpm) and (tok + input <= tpm or tok < tpm)
  and (not stream or streams < slots)
if admitted then
  redis.call('HSET', KEYS[1], 'win', win, 'req', req + (count and 1 or 0), 'tok', tok + input)
  redis.call('EXPIRE', KEYS[1], 120)
  if stream then
    redis.call('ZADD', KEYS[2], now + ttl_ms, ARGV[6])
    redis.call('PEXPIRE', KEYS[2], ttl_ms * 2)
  end
elseif corrected then
  redis.call('HSET', KEYS[1], 'tok', tok)
end
return {req, tok, streams, 60 - secs % 60, admitted and 1 or 0, now}
"#;

const SNAPSHOT: &str = r#"
local t = redis.call('TIME')
local secs = tonumber(t[1])
local now = secs * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = redis.call('HMGET', KEYS[1], 'win', 'req', 'tok')
local req, tok = 0, 0
if tonumber(w[1]) == math.floor(secs / 60) then
  req = tonumber(w[2]) or 0
  tok = tonumber(w[3]) or 0
end
return {req, tok, redis.call('ZCOUNT', KEYS[2], now, '+inf'), 60 - secs % 60}
"#;

/// Frees the stream slot (if any) and moves the tokens of window ARGV[3] by ARGV[2] (actual -
/// estimate), if that window is still the current one.
const FINISH: &str = r#"
if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
local delta = tonumber(ARGV[2])
if delta ~= 0 then
  local secs = tonumber(redis.call('TIME')[1])
  local win = math.floor(secs / 60)
  local w = redis.call('HMGET', KEYS[1], 'win', 'tok')
  if tonumber(w[1]) == win and tonumber(ARGV[3]) == win then
    redis.call('HSET', KEYS[1], 'tok', math.max(0, (tonumber(w[2]) or 0) + delta))
  end
end
return 0
"#;

const RENEW: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 0
"#;

pub struct RedisLimiter {
    client: Client,
    timeout: Duration,
    /// Redis' clock minus ours (ms), learnt from each admission, so a call's deadline can be
    /// given in Redis' time; `None` until the first answer.
    clock_offset_ms: AtomicI64,
    admit: Script,
    snapshot: Script,
    finish: Script,
    renew: Script,
    slot_ttl: Duration,
    over_limit: OverLimit,
    corrections: Arc<Corrections>,
}

/// How long a finished turn's token correction may wait for its key's next admission.
pub const FLUSH_CORRECTIONS_EVERY: Duration = Duration::from_secs(1);

/// The token corrections of finished turns not yet sent, per key: the window they belong to
/// (a minute number in Redis' clock, as this process reckons it) and their sum.
#[derive(Default)]
struct Corrections(DashMap<String, (i64, i64)>);

impl Corrections {
    fn add(&self, key_id: &str, window: i64, delta: i64) {
        if delta == 0 {
            return;
        }
        let mut entry = self.0.entry(key_id.to_owned()).or_insert((window, 0));
        if entry.0 != window {
            // The estimate it corrects belongs to a window that has ended.
            *entry = (window, 0);
        }
        entry.1 += delta;
    }

    /// The key's correction (window, delta), taken to be sent; (0, 0) when none.
    fn take(&self, key_id: &str) -> (i64, i64) {
        self.0.remove(key_id).map_or((0, 0), |(_, c)| c)
    }

    /// The key's correction not yet sent for `window`: what this process' reading of the
    /// window adds to what Redis holds.
    fn pending(&self, key_id: &str, window: i64) -> i64 {
        self.0
            .get(key_id)
            .filter(|c| c.0 == window)
            .map_or(0, |c| c.1)
    }
}

/// Sends the corrections that found no admission to ride on, every
/// [`FLUSH_CORRECTIONS_EVERY`], until the limiter is gone.
async fn flush_corrections(corrections: Weak<Corrections>, client: Client, finish: Script) {
    loop {
        tokio::time::sleep(FLUSH_CORRECTIONS_EVERY).await;
        let Some(corrections) = corrections.upgrade() else {
            return;
        };
        let pending: Vec<String> = corrections.0.iter().map(|e| e.key().clone()).collect();
        let sends = pending.into_iter().filter_map(|key_id| {
            let (window, delta) = corrections.take(&key_id);
            (delta != 0).then(|| {
                let (client, finish) = (&client, &finish);
                async move {
                    let sent = timed(
                        "finish",
                        run_script::<i64>(
                            client,
                            finish,
                            keys(&key_id),
                            vec![String::new(), delta.to_string(), window.to_string()],
                        ),
                    )
                    .await;
                    if let Err(e) = sent {
                        tracing::debug!(error = %e, "a token correction was not sent");
                    }
                }
            })
        });
        futures::stream::iter(sends)
            .for_each_concurrent(16, |send| send)
            .await;
    }
}

/// Runs `script` by its hash. A node that does not hold it yet (the new master after a
/// failover, a restarted node) is sent its text once with `EVAL`, which runs on the key's own
/// node and caches it there. Fred's own reload (`evalsha_with_reload`) first loads the script
/// into every master of its slot map, so one master that is unreachable, or a slot map that
/// is behind, fails the call of a key on a healthy node.
async fn run_script<R: FromValue>(
    client: &Client,
    script: &Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<R, fred::error::Error> {
    match client
        .evalsha(script.sha1().clone(), keys.clone(), args.clone())
        .await
    {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            let lua = script.lua().cloned().unwrap_or_default();
            client.eval(lua, keys, args).await
        }
        result => result,
    }
}

fn unavailable(e: fred::error::Error) -> LimitError {
    LimitError::Unavailable(format!("redis: {e}"))
}

/// Runs one Redis call, recording its latency and outcome in the store metrics.
async fn timed<T>(
    op: &'static str,
    call: impl Future<Output = Result<T, fred::error::Error>>,
) -> Result<T, LimitError> {
    let started = Instant::now();
    let result = call.await;
    metrics::store_call("redis", op, started.elapsed(), result.is_ok());
    result.map_err(unavailable)
}

fn slots_key(key_id: &str) -> String {
    format!("rl:{{{key_id}}}:s")
}

/// The window hash and the stream-slot set of a key, in the scripts' KEYS order.
fn keys(key_id: &str) -> Vec<String> {
    vec![format!("rl:{{{key_id}}}:w"), slots_key(key_id)]
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Where the shared limits live and how long a call to them may take.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user:password@]host:port[/db]` or `redis-cluster://host:port`, over TLS
    /// `rediss://` and `rediss-cluster://`; may hold a password.
    pub url: String,
    /// The CA and client certificate of `rediss://`.
    pub tls: RedisTlsFiles,
    /// Bound on every call.
    pub timeout: Duration,
    /// How long a stream slot lives without renewal.
    pub slot_ttl: Duration,
}

const STARTUP_WAIT: Duration = Duration::from_secs(5);

/// No offset learnt yet.
const UNKNOWN_OFFSET: i64 = i64::MIN;

impl RedisLimiter {
    /// Connects to `redis://...` (or `redis-cluster://...`). Every command is bounded by
    /// `timeout`; a lost connection is re-established in the background, so an outage ends by
    /// itself when Redis returns. Start-up waits a few seconds for the first connection, then
    /// goes on without it: until Redis answers, calls fail with `Unavailable` and the outage
    /// policy decides.
    pub async fn connect(settings: &RedisSettings) -> Result<Self, LimitError> {
        let RedisSettings {
            url,
            tls: tls_files,
            timeout,
            slot_ttl,
        } = settings;
        let (timeout, slot_ttl) = (*timeout, *slot_ttl);
        // fred would make the TLS config of `rediss://` itself, from the system's store and
        // the process's provider; ours names ring and the CA given.
        let (url, over_tls) = tls::plain_scheme(url);
        let mut config = Config::from_url(&url).map_err(unavailable)?;
        if over_tls {
            let client_config = tls_files.client_config()?;
            // Refused here, the process does not start: a wrong CA or host does not end by
            // itself as an outage does.
            if let Some(server) = config.server.hosts().first() {
                tls::handshake(server, client_config.clone(), timeout.max(STARTUP_WAIT)).await?;
            }
            config.tls = Some(fred::types::config::TlsConnector::from(client_config).into());
        } else if tls_files.any() {
            return Err(LimitError::Unavailable(
                "redis: TLS: a CA or client certificate is given but the URL is plaintext; use rediss:// (or rediss-cluster://)".to_owned(),
            ));
        }
        // One write per command, so a script whose answer was lost is not run twice; on a
        // Redis Cluster a second, since fred counts following a MOVED or ASK redirection (the
        // first write ran nothing) as an attempt, and with one a failover's redirections would
        // all fail.
        let attempts = if config.server.is_clustered() { 2 } else { 1 };
        let client = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = timeout;
                c.internal_command_timeout = timeout;
                c.max_command_attempts = attempts;
            })
            .with_performance_config(|p| p.default_command_timeout = timeout)
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .build()
            .map_err(unavailable)?;
        client.connect();
        let startup_wait = (timeout * 4).max(STARTUP_WAIT);
        if tokio::time::timeout(startup_wait, client.wait_for_connect())
            .await
            .is_err()
        {
            tracing::warn!("redis not reachable at start-up; retrying in the background");
        }
        let corrections = Arc::new(Corrections::default());
        let finish = Script::from_lua(FINISH);
        tokio::spawn(flush_corrections(
            Arc::downgrade(&corrections),
            client.clone(),
            finish.clone(),
        ));
        Ok(Self {
            client,
            timeout,
            clock_offset_ms: AtomicI64::new(UNKNOWN_OFFSET),
            admit: Script::from_lua(ADMIT),
            snapshot: Script::from_lua(SNAPSHOT),
            finish,
            renew: Script::from_lua(RENEW),
            slot_ttl,
            over_limit: OverLimit::default(),
            corrections,
        })
    }

    /// Drops every connection and makes them again in the background, re-reading a cluster's
    /// slot map from its configured endpoint: the way out of a client state that keeps
    /// failing while Redis itself answers.
    pub fn reconnect(&self) {
        let client = self.client.clone();
        let bound = self.timeout.saturating_mul(4).max(STARTUP_WAIT);
        tokio::spawn(async move {
            match tokio::time::timeout(bound, client.force_reconnection()).await {
                Ok(Ok(())) => tracing::info!("redis connections made again"),
                Ok(Err(e)) => tracing::warn!(error = %e, "redis connections not made again"),
                Err(_) => tracing::warn!(?bound, "redis connections not made again in time"),
            }
        });
    }

    /// The current window's number in Redis' clock, as this process reckons it.
    fn window_now(&self) -> i64 {
        let offset = self.clock_offset_ms.load(Ordering::Relaxed);
        let offset = if offset == UNKNOWN_OFFSET { 0 } else { offset };
        (now_ms() + offset).div_euclid(1_000 * 60)
    }
}

#[async_trait]
impl Limiter for RedisLimiter {
    async fn admit(
        &self,
        key_id: &str,
        limits: &Limits,
        request: AdmissionRequest,
    ) -> Result<Admission, LimitError> {
        let slot_id = if request.stream {
            ids::stream_slot()
        } else {
            String::new()
        };
        // A call that times out here may still run in Redis later (a stalled server): its
        // deadline, in Redis' clock, makes it count nothing then. The clock offset is taken at
        // the middle of the last round trip, so it is exact to half a round trip.
        let sent = now_ms();
        let offset = self.clock_offset_ms.load(Ordering::Relaxed);
        let deadline = if offset == UNKNOWN_OFFSET {
            0
        } else {
            sent + offset + i64::try_from(millis(self.timeout)).unwrap_or(i64::MAX)
        };
        let (window, correction) = self.corrections.take(key_id);
        let (requests, input_tokens, streams, reset_secs, admitted, redis_now): (
            u32,
            u64,
            u32,
            u64,
            u8,
            i64,
        ) = timed(
            "admit",
            run_script(
                &self.client,
                &self.admit,
                keys(key_id),
                vec![
                    limits.requests_per_minute.to_string(),
                    limits.input_tokens_per_minute.to_string(),
                    limits.concurrent_streams.to_string(),
                    request.input_tokens.to_string(),
                    u8::from(request.stream).to_string(),
                    slot_id.clone(),
                    millis(self.slot_ttl).to_string(),
                    deadline.to_string(),
                    u8::from(request.count_request).to_string(),
                    correction.to_string(),
                    window.to_string(),
                ],
            ),
        )
        .await?;
        let midpoint = sent + (now_ms() - sent) / 2;
        self.clock_offset_ms
            .store(redis_now - midpoint, Ordering::Relaxed);
        if admitted == 2 {
            return Err(LimitError::Unavailable(
                "admission reached redis after its deadline".into(),
            ));
        }
        let before = Snapshot {
            requests,
            input_tokens,
            streams,
            reset_secs,
        };
        self.over_limit.record(key_id, limits, before);
        if admitted == 0 {
            // The script applies the rules of `decide` to these very counts, so `decide`
            // names the dimension that refused.
            return Err(decide(limits, &before, &request)
                .err()
                .unwrap_or(LimitError::Exceeded {
                    dimension: super::Dimension::Requests,
                    limit: limits.requests_per_minute.into(),
                    retry_after_secs: reset_secs,
                    snapshot: before,
                }));
        }
        let after = Snapshot {
            requests: requests + u32::from(request.count_request),
            input_tokens: input_tokens + request.input_tokens,
            streams: streams + u32::from(request.stream),
            reset_secs,
        };
        self.over_limit.record(key_id, limits, after);
        Ok(Admission {
            snapshot: after,
            stream_slot: request.stream.then_some(StreamSlot::Shared(slot_id)),
        })
    }

    async fn snapshot(&self, key_id: &str) -> Result<Snapshot, LimitError> {
        let (requests, input_tokens, streams, reset_secs): (u32, u64, u32, u64) = timed(
            "snapshot",
            run_script(&self.client, &self.snapshot, keys(key_id), Vec::new()),
        )
        .await?;
        // This process' own corrections count at once, as they do in-process; other pods see
        // them with the next admission or flush.
        let pending = self.corrections.pending(key_id, self.window_now());
        Ok(Snapshot {
            requests,
            input_tokens: input_tokens.saturating_add_signed(pending),
            streams,
            reset_secs,
        })
    }

    fn known_refusal(&self, key_id: &str, limits: &Limits) -> Option<LimitError> {
        self.over_limit.refusal(key_id, limits)
    }

    fn slot_renewal(&self) -> Option<Duration> {
        Some(self.slot_ttl / 3)
    }

    async fn renew(&self, key_id: &str, slot: &StreamSlot) -> Result<(), LimitError> {
        let StreamSlot::Shared(id) = slot else {
            return Ok(());
        };
        timed(
            "renew",
            run_script::<i64>(
                &self.client,
                &self.renew,
                vec![slots_key(key_id)],
                vec![id.clone(), millis(self.slot_ttl).to_string()],
            ),
        )
        .await?;
        Ok(())
    }

    async fn finish(
        &self,
        key_id: &str,
        slot: Option<StreamSlot>,
        estimated_tokens: u64,
        actual_tokens: u64,
    ) -> Result<(), LimitError> {
        let delta =
            i64::try_from(i128::from(actual_tokens) - i128::from(estimated_tokens)).unwrap_or(0);
        self.corrections.add(key_id, self.window_now(), delta);
        let Some(StreamSlot::Shared(slot_id)) = slot else {
            // Rides on the key's next admission, or the next flush.
            return Ok(());
        };
        // The slot goes back now (another pod may be waiting for it), with what is pending.
        let (window, delta) = self.corrections.take(key_id);
        timed(
            "finish",
            run_script::<i64>(
                &self.client,
                &self.finish,
                keys(key_id),
                vec![slot_id, delta.to_string(), window.to_string()],
            ),
        )
        .await?;
        Ok(())
    }

    async fn reachable(&self) -> Result<(), LimitError> {
        timed("ping", self.client.ping::<()>(None)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrections_of_one_window_add_up_and_one_of_a_new_window_drops_the_ended_ones() {
        let corrections = Corrections::default();
        corrections.add("k", 7, -300);
        corrections.add("k", 7, -200);
        corrections.add("other", 7, 40);
        assert_eq!(corrections.take("k"), (7, -500));
        assert_eq!(corrections.take("k"), (0, 0), "taken once");
        corrections.add("other", 8, -10);
        assert_eq!(corrections.take("other"), (8, -10));
    }

    #[test]
    fn a_correction_not_yet_sent_counts_in_its_own_window_only() {
        let corrections = Corrections::default();
        corrections.add("k", 7, -300);
        assert_eq!(corrections.pending("k", 7), -300);
        assert_eq!(corrections.pending("k", 8), 0);
        assert_eq!(corrections.pending("other", 7), 0);
    }

    #[test]
    fn a_turn_whose_estimate_was_exact_leaves_nothing_to_send() {
        let corrections = Corrections::default();
        corrections.add("k", 7, 0);
        assert!(corrections.0.is_empty());
    }
}
