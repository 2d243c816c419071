//! The cache key, built in one place: scheme, normalised host, path, query (as sent, or sorted and without dropped parameters), the edge headers a trusted proxy vouches for, then the `Vary`'d request headers.
//!
//! Nothing else a client sends reaches the key, and on a cacheable request
//! nothing else it sends that could change the page reaches the upstream
//! either ([`UNKEYED`] is removed): a header outside the key can never
//! make a stored body differ from what the key promises (no unkeyed-header
//! poisoning).

use http::header::{HeaderMap, HeaderName};

use crate::config::cache::RouteCacheConfig;

/// Headers that change what many apps render (the host or URL they think
/// they serve, the method they run) but are not part of the key: removed
/// from a request that may be stored. A trusted proxy's `X-Forwarded-*`
/// are kept and keyed instead (see [`Key::base`]).
pub static UNKEYED: [HeaderName; 4] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
    HeaderName::from_static("x-host"),
];

/// Between the URL and the edge headers, and before the `Vary`'d values:
/// bytes no URL or header value holds.
const EDGE_MARK: char = '\u{1}';
const VARY_MARK: char = '\u{2}';

/// Whether a key's byte is one of the two marks.
fn is_mark(b: u8) -> bool {
    b == EDGE_MARK as u8 || b == VARY_MARK as u8
}

/// What the key is made of, read off one request.
pub struct KeyParts<'a> {
    pub scheme: &'a str,
    /// The `Host` header (or the URI's authority) as sent.
    pub host: &'a str,
    pub path: &'a str,
    /// The request's headers: the edge headers are read from them when the peer is trusted.
    pub headers: &'a HeaderMap,
    pub peer_trusted: bool,
}

/// The query the key holds, and the upstream gets on a cacheable request:
/// as sent, or without the dropped parameters, sorted by name if asked.
pub fn query(raw: Option<&str>, rc: &RouteCacheConfig) -> Option<String> {
    let raw = raw?;
    if rc.query_drop.is_empty() && !rc.query_sort {
        return (!raw.is_empty()).then(|| raw.to_string());
    }
    let mut pairs: Vec<&str> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let name = p.split_once('=').map_or(*p, |(n, _)| n);
            let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            !rc.query_drop.iter().any(|g| g.matches(&name))
        })
        .collect();
    if rc.query_sort {
        // Stable: `a=1&a=2` keeps its order, which PHP's last-one-wins reads.
        pairs.sort_by_key(|p| p.split_once('=').map_or(*p, |(n, _)| n));
    }
    (!pairs.is_empty()).then(|| pairs.join("&"))
}

/// `Host` lowered, without a trailing dot or the scheme's default port.
pub fn host(scheme: &str, raw: &str) -> String {
    let mut out = String::new();
    push_host(&mut out, scheme, raw);
    out
}

/// [`host`] written at the end of `out`, piece by piece: `format!` and a
/// string of its own cost ~1,000 instructions on every cached request
/// (callgrind).
fn push_host(out: &mut String, scheme: &str, raw: &str) {
    let raw = raw.trim();
    let (name, port) = match raw.rsplit_once(':') {
        Some((n, p)) if !p.contains(']') && p.bytes().all(|b| b.is_ascii_digit()) => (n, Some(p)),
        _ => (raw, None),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    let default = matches!(
        (scheme, port),
        ("http", Some("80")) | ("https", Some("443"))
    );
    let from = out.len();
    out.push_str(name);
    out[from..].make_ascii_lowercase();
    if let Some(p) = port.filter(|_| !default) {
        out.push(':');
        out.push_str(p);
    }
}

/// A key: `scheme://host/path?query`, then the edge headers, then the
/// `Vary`'d values. Its URL part is what a purge by prefix or host reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key(pub Box<str>);

impl Key {
    /// The key before `Vary`: the URL the request names (with its query as
    /// [`query`] makes it), and, from a trusted proxy, the edge headers
    /// it set (they name the host and scheme the app renders for).
    pub fn base(parts: &KeyParts<'_>, query: Option<&str>) -> Key {
        // Room for all but the edge headers (the host can only shrink).
        let mut k = String::with_capacity(
            parts.scheme.len()
                + 3
                + parts.host.len()
                + parts.path.len()
                + query.map_or(0, |q| q.len() + 1),
        );
        k.push_str(parts.scheme);
        k.push_str("://");
        push_host(&mut k, parts.scheme, parts.host);
        k.push_str(parts.path);
        if let Some(q) = query {
            k.push('?');
            k.push_str(q);
        }
        if parts.peer_trusted {
            let present = keyed_edge_present(parts.headers);
            let edge = crate::proxy::EDGE_OWNED.iter().chain([&X_FORWARDED_PROTO]);
            // In the set's order, whatever order the proxy sent them in.
            for (_, name) in edge.enumerate().filter(|(i, _)| present & 1 << i != 0) {
                for v in parts.headers.get_all(name) {
                    k.push(EDGE_MARK);
                    k.push_str(name.as_str());
                    k.push(':');
                    k.push_str(&String::from_utf8_lossy(v.as_bytes()));
                }
            }
        }
        Key(k.into_boxed_str())
    }

    /// This key with the values of the `Vary`'d headers `names` in `headers`.
    pub fn varied(&self, names: &[HeaderName], headers: &HeaderMap) -> Key {
        let mut k = String::from(&*self.0);
        for name in names {
            k.push(VARY_MARK);
            let mut first = true;
            for v in headers.get_all(name) {
                if !first {
                    k.push(',');
                }
                first = false;
                k.push_str(String::from_utf8_lossy(v.as_bytes()).trim());
            }
        }
        Key(k.into_boxed_str())
    }

    /// The host part of the URL (`example.com:8080`).
    pub fn host(&self) -> &str {
        let rest = self.after_scheme();
        let end = rest
            .bytes()
            .position(|b| b == b'/' || is_mark(b))
            .unwrap_or(rest.len());
        &rest[..end]
    }

    /// The path and query part of the URL (`/blog/a?x=1`).
    pub fn path(&self) -> &str {
        let rest = self.after_scheme();
        let start = rest.bytes().position(|b| b == b'/').unwrap_or(rest.len());
        let rest = &rest[start..];
        let end = rest.bytes().position(is_mark).unwrap_or(rest.len());
        &rest[..end]
    }

    /// The key after `scheme://`. Bytes, not `char` patterns: the marks
    /// are ASCII, and this is read on every cached request.
    fn after_scheme(&self) -> &str {
        self.0.split_once("://").map_or(&*self.0, |(_, r)| r)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Which keyed edge headers `headers` has: bit `i` for `EDGE_OWNED[i]`, and
/// the one after them for `X-Forwarded-Proto`. One pass over the names a
/// request has, not a lookup for each of the fifteen (~2,200 instructions
/// a cached request, callgrind).
fn keyed_edge_present(headers: &HeaderMap) -> u32 {
    let after = crate::proxy::EDGE_OWNED.len();
    let proto = |name: &HeaderName| u32::from(*name == X_FORWARDED_PROTO) << after;
    crate::proxy::edge_owned_present(headers, proto)
}

impl std::borrow::Borrow<str> for Key {
    fn borrow(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::cache::Glob;

    fn rc(sort: bool, drop: &[&str]) -> RouteCacheConfig {
        RouteCacheConfig {
            ttl: None,
            stale_while_revalidate: Default::default(),
            stale_if_error: Default::default(),
            bypass_cookies: vec![],
            statuses: vec![200],
            query_sort: sort,
            query_drop: drop.iter().map(|g| Glob::new(g)).collect(),
            hits_free: false,
        }
    }

    fn key(
        host_header: &str,
        path: &str,
        q: Option<&str>,
        headers: &HeaderMap,
        trusted: bool,
    ) -> Key {
        let parts = KeyParts {
            scheme: "http",
            host: host_header,
            path,
            headers,
            peer_trusted: trusted,
        };
        Key::base(&parts, q)
    }

    #[test]
    fn the_host_is_lowered_and_loses_its_default_port_and_trailing_dot() {
        assert_eq!(host("http", "Shop.Example.:80"), "shop.example");
        assert_eq!(host("https", "shop.example:443"), "shop.example");
        assert_eq!(host("http", "shop.example:8080"), "shop.example:8080");
        assert_eq!(host("https", "[::1]:443"), "[::1]");
        assert_eq!(host("http", "[::1]"), "[::1]");
    }

    #[test]
    fn a_query_is_kept_as_sent_unless_told_to_sort_or_drop() {
        assert_eq!(
            query(Some("b=1&a=2"), &rc(false, &[])).as_deref(),
            Some("b=1&a=2")
        );
        assert_eq!(
            query(Some("b=1&a=2"), &rc(true, &[])).as_deref(),
            Some("a=2&b=1")
        );
        let drop = rc(false, &["utm_*", "fbclid"]);
        assert_eq!(
            query(Some("p=3&utm_source=x&fbclid=y&utm%5Fmedium=z"), &drop).as_deref(),
            Some("p=3")
        );
        assert_eq!(query(Some("utm_source=x"), &drop), None);
        assert_eq!(query(Some(""), &rc(false, &[])), None);
    }

    #[test]
    fn edge_headers_are_keyed_only_from_a_trusted_peer() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-host", "evil.example".parse().unwrap());
        let untrusted = key("shop.example", "/", None, &h, false);
        assert_eq!(
            untrusted,
            key("shop.example", "/", None, &HeaderMap::new(), false)
        );
        let trusted = key("shop.example", "/", None, &h, true);
        assert_ne!(trusted, untrusted);
        assert_eq!(trusted.host(), "shop.example");
        assert_eq!(trusted.path(), "/");
        // Each edge header is keyed, in one order whatever order they came in.
        let mut sent = Vec::new();
        for order in [
            ["x-forwarded-proto", "forwarded", "x-forwarded-host"],
            ["x-forwarded-host", "forwarded", "x-forwarded-proto"],
        ] {
            let mut h = HeaderMap::new();
            for name in order {
                h.append(name, format!("{name}-1").parse().unwrap());
                h.append(name, format!("{name}-2").parse().unwrap());
            }
            sent.push(key("shop.example", "/", None, &h, true));
        }
        assert_eq!(sent[0], sent[1]);
        for name in ["x-forwarded-proto", "forwarded", "x-forwarded-host"] {
            for n in [1, 2] {
                assert!(
                    sent[0].0.contains(&format!("{name}:{name}-{n}")),
                    "{name}-{n}: {:?}",
                    sent[0]
                );
            }
        }
    }

    #[test]
    fn the_url_parts_read_back_from_a_varied_key() {
        let h = HeaderMap::new();
        let k = key("Shop.example:8080", "/blog/a", Some("x=1"), &h, false);
        let mut req = HeaderMap::new();
        req.insert("accept-language", "de".parse().unwrap());
        let v = k.varied(&[HeaderName::from_static("accept-language")], &req);
        assert_ne!(v, k);
        assert_eq!(v.host(), "shop.example:8080");
        assert_eq!(v.path(), "/blog/a?x=1");
    }
}
