//! Who is the client: a verified API key (stored only as a hash), or the real IP behind trusted proxies.
//!
//! The TCP peer is the only address we can verify. `X-Forwarded-For` and
//! `Forwarded` are anyone's to write, so they are read only when the peer is
//! a trusted proxy, and then from the right: each trusted hop vouches for the
//! address to its left, and the first address no trusted hop vouches past is
//! the client. Reading the left-most entry instead would let any client pick
//! its own identity and walk around every limit.
//!
//! The same holds for API keys: a key identifies a client only when it is
//! verified against `identity.api_keys` / `api_keys_file`. Without a key
//! source, the key header identifies nobody (`client` is the IP); the value
//! is still available to limiters keyed on `api_key`, as a value the client
//! chose, which is why `check` warns about routes that rely on such keys
//! alone. With a key source, an unknown key is a 401, and an IP that keeps
//! trying unknown keys gets 429s: keys cannot be probed at speed.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::config::{ApiKeyEntry, IdentityConfig};
use crate::limiter::Nanos;
use crate::metrics::{inc, Counter, Metrics};

/// The hops a request passed, as proxies list them (read here, written by the proxy).
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The identity rules of one config snapshot.
#[derive(Debug)]
pub struct Identity {
    api_key_header: HeaderName,
    /// Store ids of the configured keys.
    known_keys: HashSet<String>,
    /// Whether keys are verified at all (a key list or file is configured).
    verifies: bool,
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
    exempt: Vec<IpNet>,
    /// Unknown keys per IP; shared across reloads, so a reload is no reset.
    probes: Arc<Probes>,
    probe_limit: u64,
    probe_window: Nanos,
    refused: Counter,
    limited: Counter,
}

/// A client as resolved for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// The resolved client IP (the peer, or what trusted proxies vouch for).
    pub ip: IpAddr,
    /// `ip:203.0.113.9`, or `ip:2001:db8:1:2::/64` for IPv6 grouped by prefix;
    /// shared, so the access record's client is the same text, not a copy.
    pub ip_key: Arc<str>,
    /// The key the request carried: verified when `key_verified`, else a
    /// value the client chose (only limiters keyed on `api_key` see it).
    pub api_key: Option<ApiKey>,
    pub key_verified: bool,
    /// The peer is a trusted proxy (its `X-Forwarded-For` is extended, not replaced).
    pub peer_trusted: bool,
    pub exempt: bool,
    /// `pass:<id>`: the verified pass the request carried (set by the
    /// identify phase through `challenge::ChallengeGate`); `key: pass` counts on it.
    pub pass: Option<String>,
    /// The client's ASN and country (set by the identify phase when
    /// `identity.geoip` is configured; empty otherwise): `key: asn`, `match.country`.
    pub network: crate::geodb::Network,
}

impl Client {
    /// The `client` key: the verified API key when there is one, else the IP.
    pub fn key(&self) -> &str {
        match &self.api_key {
            Some(k) if self.key_verified => &k.id,
            _ => &self.ip_key,
        }
    }

    /// The `client` key as logs and problem bodies show it (API keys shortened).
    pub fn display(&self) -> &str {
        match &self.api_key {
            Some(k) if self.key_verified => &k.short,
            _ => &self.ip_key,
        }
    }

    /// [`Client::display`] as the access record keeps it: the IP key shared.
    pub fn shown(&self) -> Arc<str> {
        match &self.api_key {
            Some(k) if self.key_verified => k.short.as_str().into(),
            _ => self.ip_key.clone(),
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
        ApiKey::from_digest(&Sha256::digest(secret.as_bytes()).into())
    }

    /// A configured key, given as the secret or as its SHA-256.
    pub fn from_entry(entry: &ApiKeyEntry) -> ApiKey {
        match entry {
            ApiKeyEntry::Plain(secret) => ApiKey::from_secret(secret),
            ApiKeyEntry::Sha256(digest) => ApiKey::from_digest(digest),
        }
    }

    fn from_digest(digest: &[u8; 32]) -> ApiKey {
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
    #[error("too many unknown API keys from {ip_key}")]
    TooManyUnknownKeys { ip_key: String, retry_after: Nanos },
}

impl Identity {
    /// The rules of `config`; `previous` hands over the unknown-key counts.
    pub fn new(
        config: &IdentityConfig,
        previous: Option<&Identity>,
        metrics: &Metrics,
    ) -> Identity {
        let counter = |result: &str| {
            metrics.counter("tollgate_unknown_api_keys_total", &[("result", result)])
        };
        Identity {
            api_key_header: config.api_key_header.clone(),
            known_keys: config
                .api_keys
                .iter()
                .map(|k| ApiKey::from_entry(k).id)
                .collect(),
            verifies: config.has_key_source(),
            trusted: config.trusted_proxies.clone(),
            ipv6_prefix: config.ipv6_prefix,
            exempt: config.exempt.clone(),
            probes: previous.map_or_else(Arc::default, |p| p.probes.clone()),
            probe_limit: config.unknown_key_limit,
            probe_window: nanos(config.unknown_key_window),
            refused: counter("refused"),
            limited: counter("limited"),
        }
    }

    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(&ip))
    }

    pub fn resolve(
        &self,
        peer: SocketAddr,
        headers: &HeaderMap,
        now: Nanos,
    ) -> Result<Client, IdentityError> {
        let peer_ip = canonical(peer.ip());
        let peer_trusted = self.is_trusted(peer_ip);
        let ip = if peer_trusted {
            self.walk_forwarded(peer_ip, headers)
        } else {
            peer_ip
        };
        let ip_key = self.ip_key(ip);
        let api_key = match headers.get(&self.api_key_header).map(|v| v.as_bytes()) {
            Some(raw) if !raw.is_empty() => {
                let key = ApiKey::from_secret(&String::from_utf8_lossy(raw));
                if self.verifies && !self.known_keys.contains(&key.id) {
                    return Err(self.unknown_key(key, ip_key, now));
                }
                Some(key)
            }
            _ => None,
        };
        Ok(Client {
            ip,
            ip_key,
            key_verified: self.verifies && api_key.is_some(),
            api_key,
            peer_trusted,
            exempt: self.exempt.iter().any(|n| n.contains(&ip)),
            pass: None,
            network: Default::default(),
        })
    }

    /// A 401, or a 429 once this IP tried too many unknown keys in the window.
    fn unknown_key(&self, key: ApiKey, ip_key: Arc<str>, now: Nanos) -> IdentityError {
        match self
            .probes
            .hit(&ip_key, now, self.probe_limit, self.probe_window)
        {
            None => {
                inc(&self.refused);
                IdentityError::UnknownApiKey(key.short)
            }
            Some(retry_after) => {
                inc(&self.limited);
                IdentityError::TooManyUnknownKeys {
                    ip_key: ip_key.to_string(),
                    retry_after,
                }
            }
        }
    }
    /// The client IP from `X-Forwarded-For` (or, without it, `Forwarded`),
    /// walking from the right past trusted hops. The last field line and its
    /// last entry first, so the usual one-hop chain is read without
    /// collecting it (~1,900 instructions a request before, callgrind).
    fn walk_forwarded(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer;
        // One hop: `Break` at the first address no trusted hop vouches past.
        let mut step = |hop: Option<IpAddr>| match hop {
            // A trusted hop wrote garbage: it is the last address we can stand behind.
            None => ControlFlow::Break(()),
            Some(ip) => {
                client = canonical(ip);
                if self.is_trusted(client) {
                    ControlFlow::Continue(())
                } else {
                    ControlFlow::Break(())
                }
            }
        };
        let listed = headers.get_all(&X_FORWARDED_FOR);
        if listed.iter().next().is_some() {
            'lines: for value in listed.iter().rev() {
                let Ok(s) = value.to_str() else {
                    break;
                };
                for entry in s.rsplit(',') {
                    if step(parse_node(entry)).is_break() {
                        break 'lines;
                    }
                }
            }
        } else {
            let nodes = headers
                .get_all(http::header::FORWARDED)
                .iter()
                .flat_map(|value| match value.to_str() {
                    Ok(s) => forwarded_for(s),
                    Err(_) => vec![None],
                })
                .collect::<Vec<_>>();
            for hop in nodes.into_iter().rev() {
                if step(hop).is_break() {
                    break;
                }
            }
        }
        client
    }

    /// The `ip` key of an address: itself for IPv4, its prefix for IPv6.
    pub fn ip_key(&self, ip: IpAddr) -> Arc<str> {
        match ip {
            IpAddr::V4(v4) => LAST_V4_KEY.with(|last| last.rendered(v4, v4_key)),
            IpAddr::V6(v6) if self.ipv6_prefix >= 128 => format!("ip:{v6}").into(),
            IpAddr::V6(v6) => {
                let net = ipnet::Ipv6Net::new(v6, self.ipv6_prefix)
                    .map(|n| n.trunc())
                    .expect("prefix validated to 1..=128");
                format!("ip:{net}").into()
            }
        }
    }
}

thread_local! {
    /// The IPv4 key this worker last made: a kept-alive client (or a flood
    /// from one address) sends request after request from it, and the key,
    /// shared, is also the access record's client (~300 instructions a
    /// request for the two copies, callgrind).
    static LAST_V4_KEY: crate::header_value::Repeated<std::net::Ipv4Addr, Arc<str>> =
        const { crate::header_value::Repeated::new() };
}

/// `ip:203.0.113.9`, written by hand: the formatter was ~1,400 instructions a request.
fn v4_key(v4: std::net::Ipv4Addr) -> Arc<str> {
    let mut key = String::with_capacity(18);
    key.push_str("ip:");
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(itoa::Buffer::new().format(octet));
    }
    key.into()
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

/// Fixed-window counts of unknown keys per IP, bounded: when full, windows
/// that are over are dropped first; if none is, new IPs share one overflow
/// count (so a flood from many addresses is limited together, never unbounded).
#[derive(Debug, Default)]
struct Probes {
    windows: Mutex<ProbeWindows>,
}

#[derive(Debug, Default)]
struct ProbeWindows {
    counts: HashMap<String, (Nanos, u64)>,
    /// The window last swept for stale entries: at most one sweep per window,
    /// so a flood of new addresses costs no more than one pass each window.
    swept: Nanos,
}

/// At most this many IPs are tracked (~100 bytes each).
const MAX_PROBING_IPS: usize = 65_536;
const OVERFLOW: &str = "overflow";

impl Probes {
    /// Counts one unknown key from `ip_key`; `Some(retry_after)` once over `limit`.
    fn hit(&self, ip_key: &str, now: Nanos, limit: u64, window: Nanos) -> Option<Nanos> {
        let start = now - now % window;
        let mut guard = self.windows.lock();
        let ProbeWindows { counts, swept } = &mut *guard;
        let full = |counts: &HashMap<String, (Nanos, u64)>| {
            !counts.contains_key(ip_key) && counts.len() >= MAX_PROBING_IPS
        };
        if full(counts) && *swept != start {
            counts.retain(|_, (s, _)| *s == start);
            *swept = start;
        }
        let slot = if full(counts) { OVERFLOW } else { ip_key };
        let entry = counts.entry(slot.to_string()).or_insert((start, 0));
        if entry.0 != start {
            *entry = (start, 0);
        }
        entry.1 += 1;
        (entry.1 > limit).then(|| start + window - now)
    }
}

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    impl Identity {
        fn resolve_now(
            &self,
            peer: SocketAddr,
            headers: &HeaderMap,
        ) -> Result<Client, IdentityError> {
            self.resolve(peer, headers, NOW)
        }
    }

    fn config(trusted: &[&str], keys: &[&str]) -> IdentityConfig {
        IdentityConfig {
            api_key_header: HeaderName::from_static("x-client-key"),
            api_keys: keys
                .iter()
                .map(|k| ApiKeyEntry::parse(k).unwrap())
                .collect(),
            api_keys_file: None,
            pass: None,
            unknown_key_limit: 3,
            unknown_key_window: Duration::from_secs(60),
            trusted_proxies: trusted.iter().map(|s| s.parse().unwrap()).collect(),
            ipv6_prefix: 64,
            exempt: vec!["192.0.2.0/24".parse().unwrap()],
            geoip: None,
            crowdsec: None,
        }
    }

    fn identity(trusted: &[&str]) -> Identity {
        Identity::new(&config(trusted, &[]), None, &Metrics::default())
    }

    fn keyed(keys: &[&str]) -> Identity {
        Identity::new(&config(&[], keys), None, &Metrics::default())
    }

    const NOW: Nanos = 1_767_225_600_000_000_000;

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

    /// The key of the client behind the peer 10.0.0.1 that sent `h`.
    fn key_behind_10_0_0_1(id: &Identity, h: &HeaderMap) -> String {
        id.resolve_now(peer("10.0.0.1"), h)
            .unwrap()
            .ip_key
            .to_string()
    }

    #[test]
    fn an_ipv4_key_is_written_by_hand_as_the_formatter_would_write_it() {
        let id = identity(&[]);
        for ip in ["203.0.113.9", "0.0.0.0", "255.255.255.255", "10.0.10.100"] {
            assert_eq!(&*id.ip_key(ip.parse().unwrap()), format!("ip:{ip}"));
        }
    }

    #[test]
    fn a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
        let id = identity(&["10.0.0.0/8"]);
        let c = id
            .resolve_now(
                peer("203.0.113.9"),
                &headers(&[("x-forwarded-for", "1.1.1.1")]),
            )
            .unwrap();
        assert_eq!(c.ip_key.as_ref(), "ip:203.0.113.9");
        assert!(!c.peer_trusted);
    }

    #[test]
    fn a_trusted_chain_resolves_to_the_rightmost_untrusted_address() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 198.51.100.7, 10.0.0.2")]);
        let c = id.resolve_now(peer("10.0.0.1"), &h).unwrap();
        assert_eq!(
            c.ip_key.as_ref(),
            "ip:198.51.100.7",
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
        assert_eq!(key_behind_10_0_0_1(&id, &h), "ip:198.51.100.7");
        // Trusted hops at the end of one line lead on into the line before.
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6, 198.51.100.7"),
            ("x-forwarded-for", "10.0.0.3, 10.0.0.2"),
        ]);
        assert_eq!(key_behind_10_0_0_1(&id, &h), "ip:198.51.100.7");
        // A line that is not text stops the walk where it stands.
        let mut h = headers(&[("x-forwarded-for", "6.6.6.6")]);
        h.append(
            "x-forwarded-for",
            http::HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        h.append(
            "x-forwarded-for",
            http::HeaderValue::from_static("10.0.0.2"),
        );
        assert_eq!(key_behind_10_0_0_1(&id, &h), "ip:10.0.0.2");
    }

    #[test]
    fn garbage_in_a_trusted_chain_stops_at_the_hop_that_wrote_it() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "6.6.6.6, nonsense, 10.0.0.2")]);
        assert_eq!(key_behind_10_0_0_1(&id, &h), "ip:10.0.0.2");
    }

    #[test]
    fn the_forwarded_header_is_read_under_the_same_rule() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.2",
        )]);
        let c = id.resolve_now(peer("10.0.0.1"), &h).unwrap();
        assert_eq!(c.ip_key.as_ref(), "ip:2001:db8:cafe::/64");
        let untrusted = id.resolve_now(peer("203.0.113.1"), &h).unwrap();
        assert_eq!(untrusted.ip_key.as_ref(), "ip:203.0.113.1");
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix_and_mapped_ipv4_is_ipv4() {
        let id = identity(&[]);
        let a = id
            .resolve_now(peer("2001:db8:1:2::5"), &HeaderMap::new())
            .unwrap();
        let b = id
            .resolve_now(peer("2001:db8:1:2:ffff::9"), &HeaderMap::new())
            .unwrap();
        assert_eq!(a.ip_key.as_ref(), "ip:2001:db8:1:2::/64");
        assert_eq!(a.ip_key, b.ip_key);
        let m = id
            .resolve_now(peer("::ffff:203.0.113.9"), &HeaderMap::new())
            .unwrap();
        assert_eq!(m.ip_key.as_ref(), "ip:203.0.113.9");
    }

    #[test]
    fn api_keys_are_hashed_and_shown_shortened() {
        let id = keyed(&["s3cret-key"]);
        let c = id
            .resolve_now(
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
        let id = keyed(&["good"]);
        let ok = id.resolve_now(peer("203.0.113.9"), &headers(&[("x-client-key", "good")]));
        assert!(ok.unwrap().key_verified);
        let bad = id.resolve_now(peer("203.0.113.9"), &headers(&[("x-client-key", "bad")]));
        assert!(matches!(bad, Err(IdentityError::UnknownApiKey(_))));
    }

    #[test]
    fn without_a_key_source_an_invented_key_identifies_nobody() {
        let id = identity(&[]);
        let c = id
            .resolve_now(
                peer("203.0.113.9"),
                &headers(&[("x-client-key", "invented-1")]),
            )
            .unwrap();
        assert!(!c.key_verified);
        assert_eq!(c.key(), "ip:203.0.113.9", "client is the IP");
        assert_eq!(c.display(), "ip:203.0.113.9");
        assert!(
            c.api_key.is_some(),
            "api_key limiters still see the value, as chosen by the client"
        );
    }

    #[test]
    fn a_key_listed_by_its_sha256_is_verified_without_the_config_holding_the_secret() {
        let digest = "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"; // "password"
        let id = keyed(&[digest]);
        let c = id
            .resolve_now(
                peer("203.0.113.9"),
                &headers(&[("x-client-key", "password")]),
            )
            .unwrap();
        assert!(c.key_verified);
        assert_eq!(c.key(), ApiKey::from_secret("password").id);
        assert!(ApiKeyEntry::parse("sha256:abc").is_err());
        assert!(ApiKeyEntry::parse(
            "sha256:zz84898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
        )
        .is_err());
    }

    #[test]
    fn an_ip_that_keeps_trying_unknown_keys_is_limited_until_the_window_ends() {
        let id = keyed(&["good"]);
        let try_key = |ip: &str, key: &str, now: Nanos| {
            id.resolve(peer(ip), &headers(&[("x-client-key", key)]), now)
        };
        for n in 0..3 {
            assert!(matches!(
                try_key("203.0.113.9", &format!("k{n}"), NOW),
                Err(IdentityError::UnknownApiKey(_))
            ));
        }
        match try_key("203.0.113.9", "k4", NOW + 1) {
            Err(IdentityError::TooManyUnknownKeys { retry_after, .. }) => {
                assert_eq!(retry_after, 60 * 1_000_000_000 - 1)
            }
            other => panic!("expected a limit, got {other:?}"),
        }
        assert!(
            try_key("203.0.113.9", "good", NOW + 2).is_ok(),
            "a known key still works"
        );
        assert!(
            matches!(
                try_key("198.51.100.1", "k5", NOW + 2),
                Err(IdentityError::UnknownApiKey(_))
            ),
            "per IP"
        );
        assert!(
            matches!(
                try_key("203.0.113.9", "k6", NOW + 60 * 1_000_000_000),
                Err(IdentityError::UnknownApiKey(_))
            ),
            "next window"
        );
    }

    #[test]
    fn the_unknown_key_table_stays_bounded_under_a_flood_of_addresses() {
        let probes = Probes::default();
        for i in 0..(MAX_PROBING_IPS + 100) {
            probes.hit(&format!("ip:{i}"), NOW, 1_000, 60);
        }
        let windows = probes.windows.lock();
        assert_eq!(
            windows.counts.len(),
            MAX_PROBING_IPS + 1,
            "the rest share the overflow count"
        );
        assert_eq!(windows.counts[OVERFLOW].1, 100);
    }

    #[test]
    fn exempt_ranges_apply_to_the_resolved_client() {
        let id = identity(&["10.0.0.0/8"]);
        let h = headers(&[("x-forwarded-for", "192.0.2.10")]);
        assert!(id.resolve_now(peer("10.0.0.1"), &h).unwrap().exempt);
        assert!(!id.resolve_now(peer("203.0.113.1"), &h).unwrap().exempt);
    }
}
