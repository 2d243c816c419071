//! What may be stored and for how long: a request that bypasses the cache, and an answer's freshness under RFC 9111 (through `http-cache-semantics`) and the route's `cache:`.

use std::time::{Duration, SystemTime};

use http::header::{
    HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CACHE_CONTROL, CONTENT_RANGE, COOKIE,
    EXPIRES, SET_COOKIE, VARY,
};
use http::{Method, StatusCode};
use http_cache_semantics::{CacheOptions, CachePolicy};

use crate::config::cache::RouteCacheConfig;
use crate::limiter::Nanos;

/// Why a request is not answered from the cache (RFC 9211's `fwd=` says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    /// Not GET or HEAD (`fwd=method`).
    Method,
    /// `Authorization`, a bypass cookie, or an upgrade (`fwd=bypass`).
    Request,
}

/// Whether a request on a caching route may be answered from (and stored
/// in) the cache.
pub fn bypass(method: &Method, headers: &HeaderMap, rc: &RouteCacheConfig) -> Option<Bypass> {
    if method != Method::GET && method != Method::HEAD {
        return Some(Bypass::Method);
    }
    if headers.contains_key(AUTHORIZATION) || headers.contains_key(http::header::UPGRADE) {
        return Some(Bypass::Request);
    }
    let bypass_cookie = headers.get_all(COOKIE).iter().any(|v| {
        String::from_utf8_lossy(v.as_bytes())
            .split(';')
            .any(|pair| {
                let name = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
                rc.bypass_cookies.iter().any(|g| g.matches(name))
            })
    });
    bypass_cookie.then_some(Bypass::Request)
}

/// How long a stored answer serves, counted from when it was received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Fresh for this long (already less the `Age` it arrived with).
    pub fresh_for: Nanos,
    /// After that, served while one background request refreshes it.
    pub stale_while_revalidate: Nanos,
    /// After that, served when the upstream fails (down, timeout, 5xx).
    pub stale_if_error: Nanos,
    /// The `Age` the answer arrived with, in seconds (an upstream cache's).
    pub initial_age: u64,
}

/// The `Vary` of an answer: the request headers its key must hold (without
/// `Accept-Encoding`, which the cache negotiates itself); `None` for `Vary: *`.
pub fn vary(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut names = Vec::new();
    for v in headers.get_all(VARY) {
        for name in String::from_utf8_lossy(v.as_bytes()).split(',') {
            let name = name.trim();
            if name == "*" {
                return None;
            }
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                continue;
            };
            if name != http::header::ACCEPT_ENCODING && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    Some(names)
}

/// Whether (and for how long) an answer to a GET of `uri` may be stored:
/// `None` for a status the route does not store, `Set-Cookie`, `Vary: *`,
/// a range, and whatever RFC 9111 forbids a shared cache (`no-store`,
/// `private`, `no-cache`), and for an answer without freshness of its own
/// (`max-age`, `s-maxage`, `Expires`) when the route has no `ttl`.
/// Heuristic freshness is off: `Last-Modified` alone stores nothing.
pub fn freshness(
    uri: &http::Uri,
    status: StatusCode,
    headers: &HeaderMap,
    rc: &RouteCacheConfig,
    now: Nanos,
) -> Option<Freshness> {
    if !rc.statuses.contains(&status.as_u16())
        || headers.contains_key(SET_COOKIE)
        || headers.contains_key(CONTENT_RANGE)
        || vary(headers).is_none()
        || directive(headers, "no-cache").is_some()
        || pragma_no_cache(headers)
    {
        return None;
    }
    let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(now);
    let request = http::Request::get(uri.clone()).body(()).ok()?;
    let mut response = http::Response::new(());
    *response.status_mut() = status;
    *response.headers_mut() = headers.clone();
    let options = CacheOptions {
        shared: true,
        cache_heuristic: 0.0,
        immutable_min_time_to_live: Duration::ZERO,
        ignore_cargo_cult: false,
    };
    let policy = CachePolicy::new_options(&request, &response, at, options);
    if !policy.is_storable() {
        return None;
    }
    let explicit = headers.contains_key(EXPIRES)
        || directive(headers, "max-age").is_some()
        || directive(headers, "s-maxage").is_some();
    let fresh_for = if explicit {
        policy.time_to_live(at)
    } else {
        rc.ttl?
    };
    if fresh_for.is_zero() {
        return None;
    }
    Some(lifetimes(headers, rc, fresh_for))
}

/// A storable answer's lifetimes: fresh for `fresh_for`, then stale for as
/// long as the answer grants (`stale-while-revalidate`, `stale-if-error`),
/// else the route, unless a directive forbids serving it stale.
fn lifetimes(headers: &HeaderMap, rc: &RouteCacheConfig, fresh_for: Duration) -> Freshness {
    let seconds = |name: &str| {
        directive(headers, name)
            .flatten()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs)
    };
    // `must-revalidate`, `proxy-revalidate` and (for a shared cache)
    // `s-maxage` forbid serving stale, unless the answer itself grants it.
    let no_stale = ["must-revalidate", "proxy-revalidate", "s-maxage"]
        .iter()
        .any(|d| directive(headers, d).is_some());
    let granted = |own: Option<Duration>, route: Duration| match own {
        Some(d) => d,
        None if no_stale => Duration::ZERO,
        None => route,
    };
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Freshness {
        fresh_for: nanos(fresh_for),
        stale_while_revalidate: nanos(granted(
            seconds("stale-while-revalidate"),
            rc.stale_while_revalidate,
        )),
        stale_if_error: nanos(granted(seconds("stale-if-error"), rc.stale_if_error)),
        initial_age: headers
            .get(http::header::AGE)
            .and_then(|v| v.to_str().ok()?.trim().parse().ok())
            .unwrap_or(0),
    }
}

/// `Pragma: no-cache` without a `Cache-Control` (RFC 9111 §5.4): as `no-cache`.
fn pragma_no_cache(headers: &HeaderMap) -> bool {
    !headers.contains_key(CACHE_CONTROL)
        && headers
            .get_all(http::header::PRAGMA)
            .iter()
            .any(|v| crate::header_value::lists(v, &["no-cache"]))
}

/// A `Cache-Control` directive of the answer: `Some(None)` when present
/// without a value, `Some(Some(v))` with one (quotes removed).
pub fn directive<'h>(headers: &'h HeaderMap, name: &str) -> Option<Option<&'h str>> {
    headers
        .get_all(CACHE_CONTROL)
        .iter()
        .filter_map(|v: &HeaderValue| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|d| {
            let d = d.trim();
            let (n, value) = match d.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
                None => (d, None),
            };
            n.eq_ignore_ascii_case(name).then_some(value)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::cache::Glob;

    const S: Nanos = 1_000_000_000;
    const NOW: Nanos = 1_767_225_600 * S;

    fn rc(ttl: Option<u64>) -> RouteCacheConfig {
        RouteCacheConfig {
            ttl: ttl.map(Duration::from_secs),
            stale_while_revalidate: Duration::from_secs(30),
            stale_if_error: Duration::from_secs(3600),
            bypass_cookies: vec![Glob::new("PHPSESSID"), Glob::new("wordpress_logged_in_*")],
            statuses: vec![200, 301, 404],
            query_sort: false,
            query_drop: vec![],
            hits_free: false,
        }
    }

    fn fresh(status: u16, headers: &[(&str, &str)], ttl: Option<u64>) -> Option<Freshness> {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let uri: http::Uri = "http://shop.example/".parse().unwrap();
        freshness(
            &uri,
            StatusCode::from_u16(status).unwrap(),
            &h,
            &rc(ttl),
            NOW,
        )
    }

    /// RFC 9111 as a shared cache with heuristics off, and the route's rules on top.
    #[test]
    fn what_is_stored_and_for_how_long() {
        let secs = |f: Option<Freshness>| f.map(|f| f.fresh_for / S);
        type Row = (
            u16,
            &'static [(&'static str, &'static str)],
            Option<u64>,
            Option<u64>,
        );
        let table: [Row; 17] = [
            (200, &[("cache-control", "max-age=60")], None, Some(60)),
            (
                200,
                &[("cache-control", "max-age=60, s-maxage=5")],
                None,
                Some(5),
            ),
            (
                200,
                &[("cache-control", "max-age=60"), ("age", "20")],
                None,
                Some(40),
            ),
            (
                200,
                &[
                    ("expires", "Thu, 01 Jan 2026 00:02:00 GMT"),
                    ("date", "Thu, 01 Jan 2026 00:00:00 GMT"),
                ],
                None,
                Some(120),
            ),
            (200, &[("expires", "0")], Some(10), None),
            (200, &[], Some(10), Some(10)),
            (200, &[], None, None),
            (
                200,
                &[("last-modified", "Thu, 01 Jan 2015 00:00:00 GMT")],
                None,
                None,
            ),
            (200, &[("cache-control", "max-age=60, private")], None, None),
            (200, &[("cache-control", "no-store")], Some(10), None),
            (200, &[("cache-control", "no-cache")], Some(10), None),
            (200, &[("pragma", "no-cache")], Some(10), None),
            (
                200,
                &[("cache-control", "max-age=60"), ("set-cookie", "a=1")],
                None,
                None,
            ),
            (200, &[("vary", "*")], Some(10), None),
            (302, &[("cache-control", "max-age=60")], None, None),
            (404, &[], Some(10), Some(10)),
            (200, &[("cache-control", "max-age=0")], Some(10), None),
        ];
        for (status, headers, ttl, want) in table {
            assert_eq!(
                secs(fresh(status, headers, ttl)),
                want,
                "{status} {headers:?} ttl {ttl:?}"
            );
        }
    }

    #[test]
    fn stale_serving_follows_the_route_unless_the_answer_forbids_or_grants_it() {
        let f = fresh(200, &[("cache-control", "max-age=60")], None).unwrap();
        assert_eq!(
            (f.stale_while_revalidate / S, f.stale_if_error / S),
            (30, 3600)
        );
        let f = fresh(
            200,
            &[("cache-control", "max-age=60, must-revalidate")],
            None,
        )
        .unwrap();
        assert_eq!((f.stale_while_revalidate, f.stale_if_error), (0, 0));
        let granted = "max-age=60, must-revalidate, stale-if-error=86400, stale-while-revalidate=5";
        let f = fresh(200, &[("cache-control", granted)], None).unwrap();
        assert_eq!(
            (f.stale_while_revalidate / S, f.stale_if_error / S),
            (5, 86400)
        );
    }

    #[test]
    fn authorization_bypass_cookies_and_other_methods_bypass() {
        let rc = rc(Some(10));
        let with = |name: &str, value: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
            bypass(&Method::GET, &h, &rc)
        };
        assert_eq!(bypass(&Method::GET, &HeaderMap::new(), &rc), None);
        assert_eq!(
            bypass(&Method::POST, &HeaderMap::new(), &rc),
            Some(Bypass::Method)
        );
        assert_eq!(with("authorization", "Basic eDp5"), Some(Bypass::Request));
        assert_eq!(
            with("cookie", "_ga=1; PHPSESSID=abc"),
            Some(Bypass::Request)
        );
        assert_eq!(
            with("cookie", "wordpress_logged_in_5f=admin"),
            Some(Bypass::Request)
        );
        assert_eq!(with("cookie", "_ga=1; theme=dark"), None);
    }

    #[test]
    fn vary_names_are_sorted_without_accept_encoding_and_star_stores_nothing() {
        let mut h = HeaderMap::new();
        h.append(VARY, "Accept-Encoding, User-Agent".parse().unwrap());
        h.append(VARY, "accept-language".parse().unwrap());
        let names = vary(&h).unwrap();
        assert_eq!(names, ["accept-language", "user-agent"]);
        h.append(VARY, "*".parse().unwrap());
        assert_eq!(vary(&h), None);
    }
}
