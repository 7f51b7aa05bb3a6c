//! Who is on the other end of a connection: the peer's address, or, behind a proxy the
//! operator trusts (`--trusted-proxies`), the client that proxy names in `X-Forwarded-For`.
//! The per-address brakes (requests without a valid key, dashboard sign-ins) count by it.
//!
//! `X-Forwarded-For` is anyone's to write: a client reaching the gateway directly could name
//! any address and so dodge every per-address limit. It is read only when the peer is a
//! trusted proxy, and then from the right: each trusted hop appended the address it saw, so
//! the first untrusted address from the right is the client; what lies to the left of it is
//! the client's own claim and is ignored.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use http::{Extensions, HeaderMap};
use ipnet::IpNet;

/// The peer of the connection a request came on, set by the listener on every request.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

/// The networks whose `X-Forwarded-For` is believed; empty: the header is ignored.
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(networks: Vec<IpNet>) -> Self {
        Self(networks)
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client's address: the peer, or when the peer is trusted, the nearest untrusted hop
    /// of `X-Forwarded-For` (the farthest hop when all are trusted). A hop that is not an
    /// address stops the walk at the trusted hop that passed it on.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.trusts(client) {
            return client;
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .collect();
        for hop in hops.iter().rev() {
            let Some(ip) = parse_hop(hop) else {
                return client;
            };
            client = ip;
            if !self.trusts(ip) {
                break;
            }
        }
        client
    }
}

/// One `X-Forwarded-For` entry: an address, possibly with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    let ip = hop
        .parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            hop.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .and_then(|h| h.parse().ok())
        })?;
    Some(ip.to_canonical())
}

/// A `--trusted-proxies` entry: a network (`10.0.0.0/8`, `fd00::/8`) or one address.
pub fn parse_network(value: &str) -> Result<IpNet, String> {
    let value = value.trim();
    value
        .parse::<IpNet>()
        .or_else(|_| value.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{value}` is neither an address nor a network like 10.0.0.0/8"))
}

/// The client's address of a request, as [`TrustedProxies::client`] tells it; `None` when the
/// request did not come through a listener (nothing to count by).
#[derive(Clone, Copy, Debug)]
pub struct ClientAddress(pub Option<IpAddr>);

impl ClientAddress {
    pub fn of(proxies: &TrustedProxies, extensions: &Extensions, headers: &HeaderMap) -> Self {
        Self(
            extensions
                .get::<Peer>()
                .map(|peer| proxies.client(peer.0.ip(), headers)),
        )
    }
}

/// The client address as an extractor, for the handlers that count by it (the dashboard's
/// sign-in and sign-up brakes).
impl<S> FromRequestParts<S> for ClientAddress
where
    S: Send + Sync,
    Arc<TrustedProxies>: FromRef<S>,
{
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self::of(
            &Arc::<TrustedProxies>::from_ref(state),
            &parts.extensions,
            &parts.headers,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn proxies(networks: &[&str]) -> TrustedProxies {
        TrustedProxies::new(
            networks
                .iter()
                .map(|n| parse_network(n).expect("network"))
                .collect(),
        )
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(
                "x-forwarded-for",
                HeaderValue::from_str(value).expect("header value"),
            );
        }
        headers
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn x_forwarded_for_from_an_untrusted_peer_is_ignored() {
        let none = TrustedProxies::default();
        let headers = forwarded(&["203.0.113.9"]);
        assert_eq!(
            none.client(ip("198.51.100.1"), &headers),
            ip("198.51.100.1")
        );
        let other = proxies(&["10.0.0.0/8"]);
        assert_eq!(
            other.client(ip("198.51.100.1"), &headers),
            ip("198.51.100.1")
        );
    }

    #[test]
    fn behind_trusted_proxies_the_client_is_the_nearest_untrusted_hop_from_the_right() {
        let trusted = proxies(&["10.0.0.0/8", "192.0.2.7"]);
        // The client claims 1.1.1.1; the edge proxy (192.0.2.7) saw 203.0.113.9.
        let headers = forwarded(&["1.1.1.1, 203.0.113.9", "192.0.2.7"]);
        assert_eq!(trusted.client(ip("10.1.2.3"), &headers), ip("203.0.113.9"));
        // Only trusted hops: the farthest one.
        let headers = forwarded(&["192.0.2.7, 10.9.9.9"]);
        assert_eq!(trusted.client(ip("10.1.2.3"), &headers), ip("192.0.2.7"));
        // No header: the proxy itself.
        assert_eq!(
            trusted.client(ip("10.1.2.3"), &HeaderMap::new()),
            ip("10.1.2.3")
        );
    }

    #[test]
    fn a_hop_that_is_not_an_address_stops_the_walk_at_the_proxy_that_passed_it() {
        let trusted = proxies(&["10.0.0.0/8"]);
        let headers = forwarded(&["203.0.113.9, unknown, 10.0.0.2"]);
        assert_eq!(trusted.client(ip("10.1.2.3"), &headers), ip("10.0.0.2"));
    }

    #[test]
    fn hops_may_carry_ports_and_ipv4_mapped_ipv6_counts_as_ipv4() {
        let trusted = proxies(&["127.0.0.1"]);
        let headers = forwarded(&["203.0.113.9:5555"]);
        assert_eq!(
            trusted.client(ip("::ffff:127.0.0.1"), &headers),
            ip("203.0.113.9")
        );
        let headers = forwarded(&["[2001:db8::1]:443"]);
        assert_eq!(trusted.client(ip("127.0.0.1"), &headers), ip("2001:db8::1"));
    }

    #[test]
    fn trusted_proxies_are_networks_or_single_addresses() {
        assert!(parse_network("10.0.0.0/8").is_ok());
        assert!(parse_network("fd00::/8").is_ok());
        assert!(parse_network("127.0.0.1").is_ok());
        assert!(parse_network("::1").is_ok());
        assert!(parse_network("localhost").is_err());
        assert!(parse_network("10.0.0.0/33").is_err());
    }
}
