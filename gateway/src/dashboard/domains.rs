//! Proof that an organization controls a domain it claims for single sign-on: a DNS TXT record
//! (`_svc-gateway-challenge.<domain>` TXT `svc-gateway-verification=<token>`, the token random
//! per claim) looked up when the owner presses **Verify**, or a link mailed to an address at the
//! domain. A TXT-proven claim is looked up again every `--domain-recheck-hours`; a record
//! missing at every re-check for `--domain-grace-hours` lapses the claim back to pending.
//!
//! Lookups go through `hickory-resolver`, to the system's resolver or `--dns-resolver`, each
//! bounded: one attempt of at most [`LOOKUP_TIMEOUT`], classic 512-byte UDP answers (no EDNS),
//! nothing cached (a removed record is seen at the next look), at most [`MAX_RECORDS`] records
//! of at most [`MAX_RECORD_BYTES`] read. Verify presses are braked per organization.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use store::audit::{Actor, ActorKind};
use store::developers::{DeveloperStore, Recheck};

/// The label under the domain that holds the proof.
pub const RECORD_LABEL: &str = "_svc-gateway-challenge";
/// What the TXT record's value starts with; the claim's token follows.
pub const VALUE_PREFIX: &str = "svc-gateway-verification=";
/// One lookup, whatever the resolver does.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// TXT records of the name read at most (a proof needs one).
pub const MAX_RECORDS: usize = 16;
/// Bytes of one TXT record read at most.
pub const MAX_RECORD_BYTES: usize = 512;
/// Verify presses accepted per organization within [`VERIFY_WINDOW`]: each is a lookup the
/// gateway makes on the organization's behalf.
pub const VERIFIES_PER_WINDOW: u32 = 10;
pub const VERIFY_WINDOW: Duration = Duration::from_secs(60);
/// The actor of the re-check's audit rows.
pub const RECHECK: &str = "domain-recheck";

/// The name to publish the record at.
pub fn record_name(domain: &str) -> String {
    format!("{RECORD_LABEL}.{domain}")
}

/// The value to publish.
pub fn record_value(token: &str) -> String {
    format!("{VALUE_PREFIX}{token}")
}

/// Why a lookup said nothing either way.
#[derive(Debug, thiserror::Error)]
pub enum LookupFailed {
    #[error("the DNS lookup took longer than {0:?}")]
    Timeout(Duration),
    #[error("the DNS lookup failed: {0}")]
    Resolver(String),
}

/// The resolver, the Verify brake and the re-check's rule.
pub struct DomainChecks {
    resolver: TokioResolver,
    /// Per organization: when its window started, presses in it.
    verifies: DashMap<String, (Instant, u32)>,
    pub recheck_every: Duration,
    pub grace: time::Duration,
}

impl std::fmt::Debug for DomainChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainChecks")
            .field("recheck_every", &self.recheck_every)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl DomainChecks {
    /// Looks up through `server`, or the system's resolver (`/etc/resolv.conf`) without one.
    pub fn new(server: Option<SocketAddr>, recheck_every: Duration, grace: time::Duration) -> Self {
        let provider = TokioConnectionProvider::default();
        let mut builder = match server {
            Some(server) => TokioResolver::builder_with_config(
                ResolverConfig::from_parts(
                    None,
                    vec![],
                    NameServerConfigGroup::from_ips_clear(&[server.ip()], server.port(), true),
                ),
                provider,
            ),
            None => TokioResolver::builder_tokio().unwrap_or_else(|e| {
                // Without a resolver a Verify says the lookup failed; the rest of the gateway
                // does not need one.
                tracing::warn!(error = %e, "no system DNS resolver: domain proofs by TXT record will fail; set --dns-resolver");
                TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, vec![], NameServerConfigGroup::new()),
                    TokioConnectionProvider::default(),
                )
            }),
        };
        let options: &mut ResolverOpts = builder.options_mut();
        options.timeout = LOOKUP_TIMEOUT;
        options.attempts = 1;
        options.edns0 = false;
        options.positive_max_ttl = Some(Duration::ZERO);
        options.negative_max_ttl = Some(Duration::ZERO);
        Self {
            resolver: builder.build(),
            verifies: DashMap::new(),
            recheck_every,
            grace,
        }
    }

    /// Whether the organization may press Verify now (counts the press).
    pub fn take_verify(&self, account_id: &str) -> bool {
        let now = Instant::now();
        let mut entry = self
            .verifies
            .entry(account_id.to_owned())
            .or_insert((now, 0));
        let (started, presses) = &mut *entry;
        if now.duration_since(*started) >= VERIFY_WINDOW {
            *started = now;
            *presses = 0;
        }
        *presses += 1;
        let allowed = *presses <= VERIFIES_PER_WINDOW;
        drop(entry);
        // Old windows go, so the map holds only organizations pressing now.
        if self.verifies.len() > 1_024 {
            self.verifies
                .retain(|_, (started, _)| now.duration_since(*started) < VERIFY_WINDOW);
        }
        allowed
    }

    /// Whether the domain publishes the record proving `token`: `Ok(false)` when the name has
    /// no TXT record of that value (or does not exist).
    pub async fn txt_found(&self, domain: &str, token: &str) -> Result<bool, LookupFailed> {
        // The absolute name: no search domain of resolv.conf is tried.
        let name = format!("{}.", record_name(domain));
        let expected = record_value(token);
        let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, self.resolver.txt_lookup(name)).await;
        let records = match lookup {
            Err(_) => return Err(LookupFailed::Timeout(LOOKUP_TIMEOUT)),
            Ok(Err(e)) if e.is_no_records_found() || e.is_nx_domain() => return Ok(false),
            Ok(Err(e)) => return Err(LookupFailed::Resolver(e.to_string())),
            Ok(Ok(records)) => records,
        };
        Ok(records.iter().take(MAX_RECORDS).any(|txt| {
            // A record's strings joined make its value (RFC 7208 3.3's rule, which DNS
            // providers follow for long values).
            let mut value = Vec::new();
            for part in txt.txt_data() {
                if value.len() + part.len() > MAX_RECORD_BYTES {
                    return false;
                }
                value.extend_from_slice(part);
            }
            value == expected.as_bytes()
        }))
    }
}

/// Re-checks every TXT-proven claim every `checks.recheck_every` until `stop`: found clears a
/// missing mark, missing (or a failed lookup: a lapse needs the record missing for the whole
/// grace period, longer than an outage) marks it, and a claim missing for the grace period
/// lapses to pending (audited by the store). Each pod runs it; the store makes one pod's
/// lapse the only one.
pub async fn recheck_every(
    developers: Arc<dyn DeveloperStore>,
    checks: Arc<DomainChecks>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(checks.recheck_every.max(Duration::from_secs(1)));
    // The first tick is at once; a claim was looked up when proven.
    ticks.tick().await;
    let by = Actor::new(ActorKind::Sweep, RECHECK, None);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let claims = match developers.txt_proven_domains().await {
            Ok(claims) => claims,
            Err(e) => {
                tracing::warn!(error = %e, "domain re-check failed; retrying at the next tick");
                continue;
            }
        };
        for claim in claims {
            let Some(token) = claim.txt_token.as_deref() else {
                continue;
            };
            let found = match checks.txt_found(&claim.domain, token).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::info!(domain = %claim.domain, error = %e, "domain re-check: lookup failed, counted as missing");
                    false
                }
            };
            let now = OffsetDateTime::now_utc();
            match developers
                .recheck_domain(
                    &claim.account_id,
                    &claim.domain,
                    found,
                    now,
                    checks.grace,
                    &by,
                )
                .await
            {
                Ok(Recheck::Lapsed) => tracing::info!(domain = %claim.domain,
                    account_id = %claim.account_id, "domain claim lapsed: its TXT record is gone"),
                Ok(Recheck::Missing) => tracing::info!(domain = %claim.domain,
                    account_id = %claim.account_id, "domain claim's TXT record missing"),
                Ok(Recheck::Kept) => {}
                Err(e) => {
                    tracing::warn!(domain = %claim.domain, error = %e, "domain re-check failed")
                }
            }
        }
    }
}
