//! Per-client-address brakes: requests to `/v1` without a valid key (a key-guessing brake)
//! and dashboard sign-in attempts, each so many per minute per address.
//!
//! A brake is a request counter of the same [`Limiter`] the keys use, under a name of its own
//! (`ip:203.0.113.9`, `signin:2001:db8::/64`), so it lives where the key limits live: in
//! process in standalone, in Redis shared by every pod in a cluster, under the same outage
//! policy. A refusal is also remembered in the pod until the window ends, so an address over
//! its limit is refused for the price of a map lookup, before anything else is looked at.
//!
//! For `/v1` a braked address is refused only a key that is not valid: the address may be a
//! proxy or a NAT that other clients share, whose valid keys must still be served. Its keys
//! are answered from the account store's cache where they can be; beyond that, the pod looks
//! up as many keys again for it in the window as the limit allows ([`AddressBrake::take_lookup`]),
//! so an address over its limit cannot send the database a stream of made-up keys.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::config::Limits;
use dashmap::DashMap;
use ipnet::{IpNet, Ipv6Net};

use super::{AdmissionRequest, Dimension, LimitError, Limiter, Snapshot};

/// What a per-address limit counts by: an IPv4 address, or the /64 network of an IPv6 one (a
/// single host usually holds a whole /64, so counting its addresses one by one would give it
/// 2^64 allowances).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressBucket(IpNet);

impl AddressBucket {
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self(IpNet::from(IpAddr::V4(v4))),
            IpAddr::V6(v6) => Self(IpNet::V6(
                Ipv6Net::new(v6, 64).map_or_else(|_| v6.into(), |net| net.trunc()),
            )),
        }
    }
}

impl fmt::Display for AddressBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpNet::V4(net) => write!(f, "{}", net.addr()),
            IpNet::V6(net) => write!(f, "{net}"),
        }
    }
}

/// Past this many remembered refusals the expired ones are swept out, so that a flood from
/// many addresses cannot grow the map for ever.
const SWEEP_ABOVE: usize = 4_096;

pub struct AddressBrake {
    /// Names this brake's counters apart from the keys' and the other brake's.
    scope: &'static str,
    dimension: Dimension,
    per_minute: u32,
    limiter: Arc<dyn Limiter>,
    /// Addresses over their limit, until the end of the window the store reported.
    refused: DashMap<AddressBucket, Braked>,
}

/// An address over its limit in this pod.
#[derive(Clone, Copy, Debug)]
struct Braked {
    until: Instant,
    /// Store lookups still allowed for its keys in this window ([`AddressBrake::take_lookup`]).
    lookups_left: u32,
}

/// An address's standing under a brake, for the X-RateLimit-* headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressLimit {
    /// The requests per minute enforced now (a pod failing open enforces its share).
    pub per_minute: u32,
    pub snapshot: Snapshot,
}

impl AddressBrake {
    /// A brake of `per_minute` attempts per address; `dimension` names it in refusals and
    /// metrics.
    pub fn new(
        scope: &'static str,
        dimension: Dimension,
        per_minute: u32,
        limiter: Arc<dyn Limiter>,
    ) -> Self {
        Self {
            scope,
            dimension,
            per_minute,
            limiter,
            refused: DashMap::new(),
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            requests_per_minute: self.per_minute,
            input_tokens_per_minute: 0,
            concurrent_streams: 0,
        }
    }

    fn counter(&self, bucket: AddressBucket) -> String {
        format!("{}:{bucket}", self.scope)
    }

    /// The limit as the headers report it.
    pub fn per_minute(&self) -> u32 {
        self.limiter.effective(&self.limits()).requests_per_minute
    }

    /// The refusal of an address already known to be over its limit in this window, without
    /// asking the store.
    pub fn refused(&self, bucket: AddressBucket) -> Option<LimitError> {
        let until = self.refused.get(&bucket)?.until;
        let now = Instant::now();
        if until <= now {
            self.refused.remove(&bucket);
            return None;
        }
        let reset_secs = (until - now).as_secs_f64().ceil() as u64;
        let per_minute = self.per_minute();
        Some(LimitError::Exceeded {
            dimension: self.dimension,
            limit: per_minute.into(),
            retry_after_secs: reset_secs.max(1),
            snapshot: Snapshot {
                requests: per_minute,
                reset_secs,
                ..Snapshot::default()
            },
        })
    }

    /// Takes one of the key lookups a braked address is still allowed in this window: as many
    /// as the limit, so a braked address costs the store at most its limit again, while a
    /// valid key sent from it (another client behind the same proxy, or the same client with
    /// its right key) is still looked up. False once they are used up, or when the address is
    /// not braked.
    pub fn take_lookup(&self, bucket: AddressBucket) -> bool {
        let Some(mut braked) = self.refused.get_mut(&bucket) else {
            return false;
        };
        if braked.lookups_left == 0 {
            return false;
        }
        braked.lookups_left -= 1;
        true
    }

    /// Counts one attempt of the address: its standing after it, or the refusal once it is
    /// over the limit (remembered until the window ends).
    pub async fn count(&self, bucket: AddressBucket) -> Result<AddressLimit, LimitError> {
        let admitted = self
            .limiter
            .admit(
                &self.counter(bucket),
                &self.limits(),
                AdmissionRequest::REQUEST_ONLY,
            )
            .await;
        match admitted {
            Ok(admission) => Ok(AddressLimit {
                per_minute: self.per_minute(),
                snapshot: admission.snapshot,
            }),
            Err(LimitError::Exceeded {
                limit,
                retry_after_secs,
                snapshot,
                ..
            }) => {
                self.remember(bucket, snapshot.reset_secs);
                Err(LimitError::Exceeded {
                    dimension: self.dimension,
                    limit,
                    retry_after_secs,
                    snapshot,
                })
            }
            Err(e) => Err(e),
        }
    }

    fn remember(&self, bucket: AddressBucket, reset_secs: u64) {
        let now = Instant::now();
        if self.refused.len() > SWEEP_ABOVE {
            self.refused.retain(|_, braked| braked.until > now);
        }
        let braked = Braked {
            until: now + Duration::from_secs(reset_secs),
            lookups_left: self.per_minute(),
        };
        self.refused.insert(bucket, braked);
    }
}

/// The standing a refusal reports: the limit used up, until the window's reset.
pub fn standing_of(error: &LimitError) -> Option<AddressLimit> {
    match error {
        LimitError::Exceeded {
            limit, snapshot, ..
        } => Some(AddressLimit {
            per_minute: u32::try_from(*limit).unwrap_or(u32::MAX),
            snapshot: *snapshot,
        }),
        LimitError::Unavailable(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MemoryLimiter;

    fn ip(s: &str) -> AddressBucket {
        AddressBucket::of(s.parse().expect("address"))
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64_network_and_ipv4_by_address() {
        assert_eq!(ip("2001:db8:1:2:aaaa::1"), ip("2001:db8:1:2:bbbb::2"));
        assert_ne!(ip("2001:db8:1:2::1"), ip("2001:db8:1:3::1"));
        assert_eq!(ip("2001:db8:1:2:aaaa::1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(ip("203.0.113.9").to_string(), "203.0.113.9");
    }

    #[tokio::test]
    async fn a_refused_address_is_refused_again_without_asking_the_store_and_others_are_not() {
        let brake = AddressBrake::new(
            "ip",
            Dimension::Unauthenticated,
            2,
            Arc::new(MemoryLimiter::default()),
        );
        let guesser = ip("203.0.113.9");
        assert!(brake.refused(guesser).is_none());
        brake.count(guesser).await.expect("first");
        brake.count(guesser).await.expect("second");
        let refusal = brake.count(guesser).await.expect_err("third");
        assert!(refusal.to_string().contains("client address"), "{refusal}");
        let again = brake.refused(guesser).expect("remembered");
        assert_eq!(standing_of(&again).map(|s| s.per_minute), Some(2));
        assert!(brake.refused(ip("203.0.113.10")).is_none());
        brake
            .count(ip("203.0.113.10"))
            .await
            .expect("another address");
    }

    #[tokio::test]
    async fn a_braked_address_gets_as_many_key_lookups_again_as_its_limit_and_no_more() {
        let brake = AddressBrake::new(
            "ip",
            Dimension::Unauthenticated,
            2,
            Arc::new(MemoryLimiter::default()),
        );
        let guesser = ip("203.0.113.9");
        assert!(!brake.take_lookup(guesser), "not braked: nothing to take");
        brake.count(guesser).await.expect("first");
        brake.count(guesser).await.expect("second");
        assert!(
            !brake.take_lookup(guesser),
            "within the limit: nothing to take"
        );
        brake.count(guesser).await.expect_err("third");
        assert!(brake.take_lookup(guesser));
        assert!(brake.take_lookup(guesser));
        assert!(!brake.take_lookup(guesser), "the allowance is used up");
        assert!(brake.refused(guesser).is_some(), "still braked");
        assert!(!brake.take_lookup(ip("203.0.113.10")), "another address");
    }
}
