//! Who is the client: API key (stored only as a hash), or the real IP behind trusted proxies.
//!
//! The TCP peer is the only address we can verify. `X-Forwarded-For` and
//! `Forwarded` are anyone's to write, so they are read only when the peer is
//! a trusted proxy, and then from the right: each trusted hop vouches for the
//! address to its left, and the first address no trusted hop vouches past is
//! the client. Reading the left-most entry instead would let any client pick
//! its own identity and walk around every limit.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::config::IdentityConfig;

/// The identity rules of one config snapshot.
#[derive(Debug)]
pub struct Identity {
    api_key_header: HeaderName,
    /// Hashes of the configured keys; empty means any key is accepted.
    known_keys: HashSet<String>,
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
    exempt: Vec<IpNet>,
}

/// A client as resolved for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// The resolved client IP (the peer, or what trusted proxies vouch for).
    pub ip: IpAddr,
    /// `ip:203.0.113.9`, or `ip:2001:db8:1:2::/64` for IPv6 grouped by prefix.
    pub ip_key: String,
    pub api_key: Option<ApiKey>,
    /// The peer is a trusted proxy (its `X-Forwarded-For` is extended, not replaced).
    pub peer_trusted: bool,
    pub exempt: bool,
}

impl Client {
    /// The `client` key: the API key when there is one, else the IP.
    pub fn key(&self) -> &str {
        match &self.api_key {
            Some(k) => &k.id,
            None => &self.ip_key,
        }
    }

    /// The `client` key as logs and problem bodies show it (API keys shortened).
    pub fn display(&self) -> &str {
        match &self.api_key {
            Some(k) => &k.short,
            None => &self.ip_key,
        }
    }
}

/// An API key, known only by its hash from here on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// `key:` + 128 bits of SHA-256 in hex: what the store keeps.
    pub id: String,
    /// `key:` + the first 8 hex digits + `…`: what humans see.
    pub short: String,
}

impl ApiKey {
    pub fn from_secret(secret: &str) -> ApiKey {
        let digest = Sha256::digest(secret.as_bytes());
        let mut id = String::with_capacity(4 + 32);
        id.push_str("key:");
        for b in &digest[..16] {
            let _ = write!(id, "{b:02x}");
        }
        let short = format!("{}…", &id[..12]);
        ApiKey { id, short }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("unknown API key {0}")]
    UnknownApiKey(String),
}

impl Identity {
    pub fn new(config: &IdentityConfig) -> Identity {
        Identity {
            api_key_header: config.api_key_header.clone(),
            known_keys: config
                .api_keys
                .iter()
                .map(|k| ApiKey::from_secret(k).id)
                .collect(),
            trusted: config.trusted_proxies.clone(),
            ipv6_prefix: config.ipv6_prefix,
            exempt: config.exempt.clone(),
        }
    }

    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    pub fn resolve(&self, peer: SocketAddr, headers: &HeaderMap) -> Result<Client, IdentityError> {
        let peer_ip = canonical(peer.ip());
        let peer_trusted = self.is_trusted(peer_ip);
        let ip = if peer_trusted {
            self.walk_forwarded(peer_ip, headers)
        } else {
            peer_ip
        };
        let api_key = match headers.get(&self.api_key_header).map(|v| v.as_bytes()) {
            Some(raw) if !raw.is_empty() => {
                let key = ApiKey::from_secret(&String::from_utf8_lossy(raw));
                if !self.known_keys.is_empty() && !self.known_keys.contains(&key.id) {
                    return Err(IdentityError::UnknownApiKey(key.short));
                }
                Some(key)
            }
            _ => None,
        };
        Ok(Client {
            ip,
            ip_key: self.ip_key(ip),
            api_key,
            peer_trusted,
            exempt: self.exempt.iter().any(|n| n.contains(&ip)),
        })
    }

    /// The client IP from `X-Forwarded-For` (or, without it, `Forwarded`),
    /// walking from the right past trusted hops.
    fn walk_forwarded(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut hops: Vec<Option<IpAddr>> = Vec::new();
        if headers.contains_key("x-forwarded-for") {
            for value in headers.get_all("x-forwarded-for") {
                let Ok(s) = value.to_str() else {
                    hops.push(None);
                    continue;
                };
                hops.extend(s.split(',').map(|e| parse_node(e.trim())));
            }
        } else {
            for value in headers.get_all("forwarded") {
                let Ok(s) = value.to_str() else {
                    hops.push(None);
                    continue;
                };
                hops.extend(forwarded_for(s));
            }
        }
        let mut client = peer;
        for hop in hops.iter().rev() {
            match hop {
                // A trusted hop wrote garbage: it is the last address we can stand behind.
                None => return client,
                Some(ip) => {
                    client = canonical(*ip);
                    if !self.is_trusted(client) {
                        return client;
                    }
                }
            }
        }
        client
    }

    /// The `ip` key of an address: itself for IPv4, its prefix for IPv6.
    pub fn ip_key(&self, ip: IpAddr) -> String {
        match ip {
            IpAddr::V4(v4) => format!("ip:{v4}"),
            IpAddr::V6(v6) if self.ipv6_prefix >= 128 => format!("ip:{v6}"),
            IpAddr::V6(v6) => {
                let net = ipnet::Ipv6Net::new(v6, self.ipv6_prefix)
                    .map(|n| n.trunc())
                    .expect("prefix validated to 1..=128");
                format!("ip:{net}")
            }
        }
    }
}

/// IPv4-mapped IPv6 peers (`::ffff:1.2.3.4` on dual-stack sockets) are IPv4 clients.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// One `X-Forwarded-For` entry or `Forwarded` node: `1.2.3.4`, `1.2.3.4:80`,
/// `2001:db8::1`, `[2001:db8::1]:80`, optionally quoted.
fn parse_node(s: &str) -> Option<IpAddr> {
    let s = s.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    let inner = s.strip_prefix('[')?;
    inner[..inner.find(']')?].parse().ok()
}

/// The `for=` nodes of a `Forwarded` header value (RFC 7239), in order.
fn forwarded_for(value: &str) -> Vec<Option<IpAddr>> {
    value
        .split(',')
        .map(|element| {
            element
                .split(';')
                .find_map(|pair| {
                    let (k, v) = pair.split_once('=')?;
                    k.trim().eq_ignore_ascii_case("for").then(|| parse_node(v))
                })
                // An element without `for=` says nothing we can trust.
                .flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn identity(trusted: &[&str]) -> Identity {
        Identity::new(&IdentityConfig {
            api_key_header: HeaderName::from_static("x-client-key"),
            api_keys: vec![],
            trusted_proxies: trusted.iter().map(|s| s.parse().unwrap()).collect(),
            ipv6_prefix: 64,
            exempt: vec!["192.0.2.0/24".parse().unwrap()],
        })
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn peer(s: &str) -> SocketAddr {
        SocketAddr::new(s.parse().unwrap(), 40000)
    }

    #[test]
    fn a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
        let id = identity(&["10.0.0.0/8"]);
        let c = id
            .resolve(
                peer("203.0.113.9"),
                &headers(&[("x-forwarded-for", "1.1.1.1")]),
            )
            .unwrap();
        assert_eq!(c.ip_key, "ip:203.0.113.9");
        assert!(!c.peer_trusted);
    }

    #[test]
    fn a_trusted_chain_resolves_to_the_rightmost_untrusted_address() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2")]);
        let c = id.resolve(peer("10.0.0.1"), &h).unwrap();
        assert_eq!(
            c.ip_key, "ip:198.51.100.7",
            "the client cannot choose 6.6.6.6"
        );
    }

    #[test]
    fn several_forwarded_for_headers_read_as_one_list() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "198.51.100.7:5555"),
        ]);
        assert_eq!(
            id.resolve(peer("10.0.0.1"), &h).unwrap().ip_key,
            "ip:198.51.100.7"
        );
    }

    #[test]
    fn garbage_in_a_trusted_chain_stops_at_the_hop_that_wrote_it() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, nonsense, 10.0.0.2")]);
        assert_eq!(
            id.resolve(peer("10.0.0.1"), &h).unwrap().ip_key,
            "ip:10.0.0.2"
        );
    }

    #[test]
    fn the_forwarded_header_is_read_under_the_same_rule() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.2",
        )]);
        let c = id.resolve(peer("10.0.0.1"), &h).unwrap();
        assert_eq!(c.ip_key, "ip:2001:db8:cafe::/64");
        let untrusted = id.resolve(peer("203.0.113.1"), &h).unwrap();
        assert_eq!(untrusted.ip_key, "ip:203.0.113.1");
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix_and_mapped_ipv4_is_ipv4() {
        let id = identity(&[]);
        let a = id
            .resolve(peer("2001:db8:1:2::5"), &HeaderMap::new())
            .unwrap();
        let b = id
            .resolve(peer("2001:db8:1:2:ffff::9"), &HeaderMap::new())
            .unwrap();
        assert_eq!(a.ip_key, "ip:2001:db8:1:2::/64");
        assert_eq!(a.ip_key, b.ip_key);
        let m = id
            .resolve(peer("::ffff:203.0.113.9"), &HeaderMap::new())
            .unwrap();
        assert_eq!(m.ip_key, "ip:203.0.113.9");
    }

    #[test]
    fn api_keys_are_hashed_and_shown_shortened() {
        let id = identity(&[]);
        let c = id
            .resolve(
                peer("203.0.113.9"),
                &headers(&[("x-client-key", "s3cret-key")]),
            )
            .unwrap();
        let key = c.api_key.clone().unwrap();
        assert!(!key.id.contains("s3cret"));
        assert_eq!(key.id.len(), 4 + 32);
        assert!(key.short.starts_with(&key.id[..12]) && key.short.ends_with('…'));
        assert_eq!(c.key(), key.id);
        assert_eq!(c.display(), key.short);
    }

    #[test]
    fn an_unlisted_key_is_refused_when_keys_are_configured() {
        let id = Identity::new(&IdentityConfig {
            api_key_header: HeaderName::from_static("x-client-key"),
            api_keys: vec!["good".into()],
            trusted_proxies: vec![],
            ipv6_prefix: 64,
            exempt: vec![],
        });
        let ok = id.resolve(peer("203.0.113.9"), &headers(&[("x-client-key", "good")]));
        assert!(ok.is_ok());
        let bad = id.resolve(peer("203.0.113.9"), &headers(&[("x-client-key", "bad")]));
        assert!(matches!(bad, Err(IdentityError::UnknownApiKey(_))));
    }

    #[test]
    fn exempt_ranges_apply_to_the_resolved_client() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "192.0.2.10")]);
        assert!(id.resolve(peer("10.0.0.1"), &h).unwrap().exempt);
        assert!(!id.resolve(peer("203.0.113.1"), &h).unwrap().exempt);
    }
}
