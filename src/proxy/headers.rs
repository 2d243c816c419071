//! The forwarded-header rules: hop-by-hop headers removed, `X-Forwarded-*` and `X-Real-IP` set, edge-owned and underscore names kept from untrusted peers.

use std::net::IpAddr;
use std::sync::LazyLock;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::identity::{Client as ClientIdentity, X_FORWARDED_FOR};

/// Hop-by-hop headers (RFC 9110 §7.6.1) and their common non-standard kin.
/// A `static`, not a `const`: a const array of names is built (and dropped)
/// again wherever it is used, on every message.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Headers that frameworks, routers and plugins believe as "what the proxy
/// says" — the client address, the original URL, the external host or
/// scheme — and that only a trusted peer may send. From anyone else they are
/// removed (the `X-Forwarded-*` tollgate vouches for itself are then set anew).
pub static EDGE_OWNED: [HeaderName; 14] = [
    header::FORWARDED,
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("front-end-https"),
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("client-ip"),
    HeaderName::from_static("true-client-ip"),
    HeaderName::from_static("cf-connecting-ip"),
    HeaderName::from_static("x-cluster-client-ip"),
    HeaderName::from_static("x-client-ip"),
];

/// Where `name` stands in [`EDGE_OWNED`], if it is one: asked of each name
/// a request has, which costs less than a lookup for each of the fourteen.
pub fn edge_owned_position(name: &HeaderName) -> Option<usize> {
    EDGE_OWNED_SET.position(name.as_str(), false)
}

/// Headers tollgate sets itself on every forwarded request. Written with
/// `_` they are removed from every peer, whatever
/// `server.underscores_in_headers` says: a CGI gateway files `X_Real_IP`
/// under the same `HTTP_X_REAL_IP` as tollgate's own `X-Real-IP`.
static SET_BY_EDGE: [HeaderName; 4] = [
    X_FORWARDED_FOR,
    X_REAL_IP,
    X_FORWARDED_PROTO,
    HeaderName::from_static("x-request-id"),
];

/// A set of header names asked about for every name of every message:
/// the names as text, and a bit per length that one of them has, so a name
/// of no such length (most of them) is passed over at once. Comparing
/// each `HeaderName` of the set instead (`==`, or its `as_str`, for each
/// name of the message) cost ~500 instructions per forwarded request
/// (callgrind).
struct NameSet {
    names: Vec<&'static str>,
    lengths: u64,
}

impl NameSet {
    fn of(set: &'static [HeaderName]) -> NameSet {
        let names: Vec<&'static str> = set.iter().map(HeaderName::as_str).collect();
        let lengths = names.iter().fold(0, |bits, n| bits | length_bit(n));
        NameSet { names, lengths }
    }

    /// The index in the set of the name `name` is, where `folded` also
    /// reads a `_` in `name` as `-` (the way CGI gateways, php-fpm's
    /// parameters among them, name a header).
    fn position(&self, name: &str, folded: bool) -> Option<usize> {
        if self.lengths & length_bit(name) == 0 {
            return None;
        }
        let name = name.as_bytes();
        self.names.iter().position(|owned| {
            let owned = owned.as_bytes();
            owned.len() == name.len()
                && owned
                    .iter()
                    .zip(name)
                    .all(|(o, n)| o == n || (folded && *o == b'-' && *n == b'_'))
        })
    }

    /// Which names of the set `headers` has, in one pass over its names: bit
    /// `i` for the set's `i`th, and `other`'s bits for a name outside it.
    fn present(&self, headers: &HeaderMap, other: impl Fn(&HeaderName) -> u32) -> u32 {
        headers.keys().fold(0, |present, name| {
            match self.position(name.as_str(), false) {
                Some(i) => present | 1 << i,
                None => present | other(name),
            }
        })
    }
}

/// `name`'s bit in [`NameSet::lengths`] (names of 63 bytes or more share one).
fn length_bit(name: &str) -> u64 {
    1 << name.len().min(63)
}

static HOP_BY_HOP_SET: LazyLock<NameSet> = LazyLock::new(|| NameSet::of(&HOP_BY_HOP));
static EDGE_OWNED_SET: LazyLock<NameSet> = LazyLock::new(|| NameSet::of(&EDGE_OWNED));
static SET_BY_EDGE_SET: LazyLock<NameSet> = LazyLock::new(|| NameSet::of(&SET_BY_EDGE));

/// Whether a header name has a `_`: a byte loop, which on a name's few
/// bytes costs less than `str::contains`'s searcher.
fn has_underscore(name: &HeaderName) -> bool {
    name.as_str().bytes().any(|b| b == b'_')
}

/// Removes every header whose name has a `_` (nginx's default, without
/// `underscores_in_headers`): CGI turns `-` into `_`, so `Client_IP` would
/// reach PHP as the `HTTP_CLIENT_IP` an edge-owned `Client-IP` is removed
/// to keep out. Each is counted in `tollgate_headers_dropped_total{reason="underscore"}`.
pub fn drop_underscore_names(headers: &mut HeaderMap, metrics: &crate::metrics::Metrics) {
    // Empty, as for nearly every request, it never allocates.
    let named: Vec<HeaderName> = headers
        .keys()
        .filter(|n| has_underscore(n))
        .cloned()
        .collect();
    if named.is_empty() {
        return;
    }
    for name in &named {
        tracing::debug!(header = %name, "a header name with `_` was dropped");
        headers.remove(name);
    }
    let counter = metrics.counter(crate::metrics::HEADERS_DROPPED, &[("reason", "underscore")]);
    counter.fetch_add(named.len() as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Removes hop-by-hop headers, including every header the `Connection`
/// header names; whether `Connection` named any (it may name any field,
/// `Host` too, so a caller that must keep one knows when to look again).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) -> bool {
    // One pass over the names a message has: most carry none of these or
    // just `Connection: keep-alive`, and removing an absent name still costs
    // a hash, eight of them per message. The names found are bits, not a
    // vector: no allocation for the `Connection` nearly every message has.
    let present = hop_by_hop_present(headers);
    if present == 0 {
        return false;
    }
    let mut listed = false;
    // `Connection` is `HOP_BY_HOP[0]`: only then are there names it lists.
    if present & 1 != 0 {
        let named = connection_names(headers);
        listed = !named.is_empty();
        for name in &named {
            headers.remove(name);
        }
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    listed
}

/// The header names `Connection` lists. `close` and the hop-by-hop names
/// (`keep-alive`, as nearly every upstream sends) go anyway and are left
/// out, so the usual message's vector stays empty and never allocates. A
/// plain loop over bytes: the iterator chain it replaces (`flat_map` over
/// `str::split`) cost ~100 instructions more on an upstream's
/// `Connection: keep-alive` (callgrind). A value that is not text still
/// names the tokens it spells: removing them is the safe side.
fn connection_names(headers: &HeaderMap) -> Vec<HeaderName> {
    let mut named = Vec::new();
    for value in headers.get_all(header::CONNECTION) {
        for token in value.as_bytes().split(|&b| b == b',') {
            let token = token.trim_ascii();
            if goes_anyway(token) {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token) {
                named.push(name);
            }
        }
    }
    named
}

/// A `Connection` token that names nothing [`strip_hop_by_hop`] would keep.
fn goes_anyway(token: &[u8]) -> bool {
    token.eq_ignore_ascii_case(b"keep-alive")
        || token.eq_ignore_ascii_case(b"close")
        || HOP_BY_HOP
            .iter()
            .any(|n| n.as_str().as_bytes().eq_ignore_ascii_case(token))
}

/// Which of [`HOP_BY_HOP`] `headers` has: bit `i` for `HOP_BY_HOP[i]`.
fn hop_by_hop_present(headers: &HeaderMap) -> u32 {
    HOP_BY_HOP_SET.present(headers, |_| 0)
}

/// Which of [`EDGE_OWNED`] `headers` has: bit `i` for `EDGE_OWNED[i]`, and
/// `other`'s bits for a name that is not one. One pass over the names a
/// request has, not a lookup for each of the fourteen.
pub fn edge_owned_present(headers: &HeaderMap, other: impl Fn(&HeaderName) -> u32) -> u32 {
    EDGE_OWNED_SET.present(headers, other)
}

thread_local! {
    /// The IPv4 client address this worker last wrote: a kept-alive client
    /// (or a flood from one address) sends request after request from it.
    static LAST_V4: crate::header_value::Repeated<std::net::Ipv4Addr, Option<HeaderValue>> =
        const { crate::header_value::Repeated::new() };
    /// The IPv4 peer this worker last wrote (a trusted proxy's, behind one).
    static LAST_PEER_V4: crate::header_value::Repeated<std::net::Ipv4Addr, Option<HeaderValue>> =
        const { crate::header_value::Repeated::new() };
}

/// An address as a header value, without the formatter for the usual IPv4,
/// and rendered once per worker while it repeats.
fn ip_value(ip: IpAddr) -> Option<HeaderValue> {
    let IpAddr::V4(v4) = ip else {
        return HeaderValue::from_str(&ip.to_string()).ok();
    };
    LAST_V4.with(|last| last.rendered(v4, v4_value))
}

/// [`ip_value`] of the connection's peer, remembered apart from the client's:
/// behind a trusted proxy the two differ on every request, and one entry
/// for both would render each anew every time.
fn peer_ip_value(ip: IpAddr) -> Option<HeaderValue> {
    let IpAddr::V4(v4) = ip else {
        return ip_value(ip);
    };
    LAST_PEER_V4.with(|last| last.rendered(v4, v4_value))
}

fn v4_value(v4: std::net::Ipv4Addr) -> Option<HeaderValue> {
    let mut out = Vec::with_capacity(15);
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        crate::reject::push_u64(&mut out, u64::from(octet));
    }
    crate::header_value::exact(out)
}

/// What tollgate tells the upstream about the client and the edge.
///
/// `X-Forwarded-For` is extended for a trusted peer and replaced for anyone
/// else; `X-Real-IP` is the resolved client; `X-Forwarded-Proto` the scheme
/// the client used. From an untrusted peer, every header in [`EDGE_OWNED`]
/// (also spelled with `_` for `-`) is removed and `X-Forwarded-Host` (the
/// `Host` the client asked for) and `X-Forwarded-Port` (the port it
/// connected to) are set by tollgate, so a framework that trusts them from
/// tollgate trusts only what tollgate saw. A trusted peer's values pass;
/// where it sent none, tollgate's own are set.
pub fn set_forwarded_headers(
    headers: &mut HeaderMap,
    client: &ClientIdentity,
    peer: IpAddr,
    proto: &'static str,
    port: u16,
) {
    let peer = peer.to_canonical();
    let peer_value = peer_ip_value(peer);
    let chain = match &peer_value {
        Some(p) if client.peer_trusted => extended_chain(headers, p),
        _ => None,
    };
    let peer_only = chain.is_none();
    let xff = chain.or_else(|| peer_value.clone());
    let (forged, kept_host, kept_port) = forged_names(headers, client.peer_trusted);
    for name in forged {
        headers.remove(name);
    }
    // Sized once for the five headers below.
    headers.reserve(5);
    // A client that connected itself (the usual case) is both headers'
    // address: written once, shared (a clone is a reference count).
    let real_ip = match &xff {
        Some(v) if peer_only && client.ip == peer => Some(v.clone()),
        _ => ip_value(client.ip),
    };
    if let Some(v) = xff {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if let Some(v) = real_ip {
        headers.insert(X_REAL_IP, v);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    if !kept_host {
        if let Some(host) = headers.get(header::HOST).cloned() {
            headers.insert(X_FORWARDED_HOST, host);
        }
    }
    if !kept_port {
        headers.insert(X_FORWARDED_PORT, port_value(port));
    }
}

/// The names that go before tollgate sets its own: from an untrusted peer
/// every one of [`EDGE_OWNED`], and from anyone tollgate's own spelled with
/// `_`. Then whether a trusted peer sent its own `X-Forwarded-Host` and
/// `-Port`, which pass (found in the same pass over the names).
fn forged_names(headers: &HeaderMap, peer_trusted: bool) -> (Vec<HeaderName>, bool, bool) {
    // Compared with `_` read as `-`: with `server.underscores_in_headers`
    // on, `Client_IP` would still reach PHP as HTTP_CLIENT_IP.
    let (edge_owned, set_by_edge) = (&*EDGE_OWNED_SET, &*SET_BY_EDGE_SET);
    let mut forged: Vec<HeaderName> = Vec::new();
    let (mut kept_host, mut kept_port) = (false, false);
    for n in headers.keys() {
        let owned = !peer_trusted && edge_owned.position(n.as_str(), true).is_some();
        if owned || (has_underscore(n) && set_by_edge.position(n.as_str(), true).is_some()) {
            forged.push(n.clone());
        } else if peer_trusted {
            kept_host |= *n == X_FORWARDED_HOST;
            kept_port |= *n == X_FORWARDED_PORT;
        }
    }
    (forged, kept_host, kept_port)
}

/// A trusted peer's `X-Forwarded-For` list (its text values, in order)
/// extended by the peer, in one allocation of its exact length; `None` when
/// it sent none.
fn extended_chain(headers: &HeaderMap, peer: &HeaderValue) -> Option<HeaderValue> {
    let mut listed = headers
        .get_all(&X_FORWARDED_FOR)
        .into_iter()
        .filter(|v| v.to_str().is_ok());
    let first = listed.next()?;
    let Some(second) = listed.next() else {
        // One line, as a single proxy in front sends: no list of parts to build.
        return crate::header_value::joined(&[first.as_bytes(), b", ", peer.as_bytes()]);
    };
    let mut parts: Vec<&[u8]> = vec![first.as_bytes(), b", ", second.as_bytes(), b", "];
    for v in listed {
        parts.extend([v.as_bytes(), b", ".as_slice()]);
    }
    parts.push(peer.as_bytes());
    crate::header_value::joined(&parts)
}

thread_local! {
    /// The listener's port this worker last wrote: the same on every request
    /// of a listener.
    static LAST_PORT: crate::header_value::Repeated =
        const { crate::header_value::Repeated::new() };
}

/// `port` as a header value, rendered once while it repeats.
fn port_value(port: u16) -> HeaderValue {
    LAST_PORT.with(|last| last.value(port.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ip: &str, trusted: bool) -> ClientIdentity {
        ClientIdentity {
            ip: ip.parse().unwrap(),
            ip_key: format!("ip:{ip}").into(),
            api_key: None,
            key_verified: false,
            peer_trusted: trusted,
            exempt: false,
            pass: None,
            network: Default::default(),
        }
    }

    #[test]
    fn a_name_set_finds_its_names_reads_underscores_only_when_asked_and_passes_the_rest() {
        let set = &*EDGE_OWNED_SET;
        for (i, name) in EDGE_OWNED.iter().enumerate() {
            assert_eq!(set.position(name.as_str(), false), Some(i));
        }
        assert_eq!(set.position("client_ip", true), Some(9));
        assert_eq!(set.position("client_ip", false), None);
        assert_eq!(set.position("client-ipx", true), None, "a length none has");
        assert_eq!(set.position("x-client-iq", true), None, "a length one has");
        let long = "x".repeat(200);
        assert_eq!(set.position(&long, true), None);
        assert_eq!(HOP_BY_HOP_SET.position("te", false), Some(3));
    }

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::HOST, HeaderValue::from_static("example"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::HOST));
    }

    #[test]
    fn an_untrusted_peers_forwarded_for_is_replaced() {
        let mut h = HeaderMap::new();
        h.insert(X_FORWARDED_FOR, HeaderValue::from_static("6.6.6.6"));
        h.insert(header::FORWARDED, HeaderValue::from_static("for=6.6.6.6"));
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        h.insert(header::HOST, HeaderValue::from_static("shop.example"));
        for name in &EDGE_OWNED {
            h.insert(name, HeaderValue::from_static("evil.example"));
        }
        set_forwarded_headers(&mut h, &client("203.0.113.9", false), peer, "http", 8080);
        assert_eq!(h[&X_FORWARDED_FOR], "203.0.113.9");
        assert_eq!(
            h[&X_FORWARDED_HOST], "shop.example",
            "the Host the client used"
        );
        assert_eq!(h[&X_FORWARDED_PORT], "8080", "the port it connected to");
        for name in EDGE_OWNED
            .iter()
            .filter(|n| ![&X_FORWARDED_HOST, &X_FORWARDED_PORT].contains(n))
        {
            assert!(
                !h.contains_key(name),
                "{name} from an untrusted client reached the upstream"
            );
        }
        assert_eq!(h[&X_REAL_IP], "203.0.113.9");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
        assert!(!h.contains_key(header::FORWARDED));
    }

    #[test]
    fn edge_owned_names_are_removed_in_their_underscore_spellings_too() {
        let mut h = HeaderMap::new();
        for name in [
            "client_ip",
            "x_original_url",
            "true_client_ip",
            "x_real_ip",
            "x_custom",
        ] {
            h.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static("6.6.6.6"),
            );
        }
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        set_forwarded_headers(&mut h, &client("203.0.113.9", false), peer, "http", 80);
        for name in ["client_ip", "x_original_url", "true_client_ip", "x_real_ip"] {
            assert!(!h.contains_key(name), "{name} passed");
        }
        assert_eq!(h[&X_REAL_IP], "203.0.113.9");
        assert_eq!(
            h["x_custom"], "6.6.6.6",
            "not the edge's: left to the switch"
        );
    }

    #[test]
    fn every_name_with_an_underscore_is_dropped_and_counted() {
        let metrics = crate::metrics::Metrics::default();
        let mut h = HeaderMap::new();
        h.insert("x_custom", HeaderValue::from_static("1"));
        h.insert("client_ip", HeaderValue::from_static("1"));
        h.insert("x-custom", HeaderValue::from_static("1"));
        drop_underscore_names(&mut h, &metrics);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-custom"));
        let counted = metrics.counter(crate::metrics::HEADERS_DROPPED, &[("reason", "underscore")]);
        assert_eq!(counted.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    #[test]
    fn a_trusted_peer_is_appended_to_the_chain() {
        let mut h = HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.7"));
        // A value that is not text is no address: left out of the chain.
        h.append(
            X_FORWARDED_FOR,
            HeaderValue::from_bytes(b"caf\xe9").unwrap(),
        );
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.2"));
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        h.insert(X_FORWARDED_HOST, HeaderValue::from_static("public.example"));
        h.insert(header::HOST, HeaderValue::from_static("internal.example"));
        h.insert("x-original-url", HeaderValue::from_static("/admin"));
        set_forwarded_headers(&mut h, &client("198.51.100.7", true), peer, "https", 8443);
        assert_eq!(
            h[&X_FORWARDED_HOST], "public.example",
            "a trusted proxy's value passes"
        );
        assert_eq!(h["x-original-url"], "/admin");
        assert_eq!(
            h[&X_FORWARDED_PORT], "8443",
            "set where the proxy sent none"
        );
        assert_eq!(h[&X_FORWARDED_FOR], "198.51.100.7, 10.0.0.2, 10.0.0.1");
        assert_eq!(h[&X_REAL_IP], "198.51.100.7");
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
    }

    #[test]
    fn a_trusted_peers_single_line_is_extended_by_the_peer() {
        let mut h = HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.7"));
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        set_forwarded_headers(&mut h, &client("198.51.100.7", true), peer, "http", 80);
        assert_eq!(h[&X_FORWARDED_FOR], "198.51.100.7, 10.0.0.1");
        assert_eq!(h.get_all(X_FORWARDED_FOR).iter().count(), 1);
    }

    #[test]
    fn the_real_ip_is_the_resolved_client_even_when_the_peer_sent_no_chain() {
        // A trusted peer that named its client some other way (no
        // X-Forwarded-For): the chain is the peer, the real IP the client.
        let mut h = HeaderMap::new();
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        set_forwarded_headers(&mut h, &client("198.51.100.7", true), peer, "http", 80);
        assert_eq!(h[&X_FORWARDED_FOR], "10.0.0.1");
        assert_eq!(h[&X_REAL_IP], "198.51.100.7");
        // A client that connected itself: both are its address.
        let mut h = HeaderMap::new();
        let peer: IpAddr = "198.51.100.7".parse().unwrap();
        set_forwarded_headers(&mut h, &client("198.51.100.7", false), peer, "http", 80);
        assert_eq!(h[&X_FORWARDED_FOR], "198.51.100.7");
        assert_eq!(h[&X_REAL_IP], "198.51.100.7");
    }
}
