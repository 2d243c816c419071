//! `cache` (the one shared response cache) and `routes[].cache` (what a route stores and for how long): raw YAML → [`CacheConfig`], [`RouteCacheConfig`]; pure.

use std::time::Duration;

use serde::Deserialize;

use super::{Dur, Size, Text, Validator};

/// `cache.max_size` when the section is absent but a route caches.
pub const DEFAULT_MAX_SIZE: u64 = 256 << 20;
/// `cache.max_entry_size` by default: a page larger than this streams
/// through unstored (a quarter of `max_size` at most, so one answer can
/// never push the hot set out).
pub const DEFAULT_MAX_ENTRY_SIZE: u64 = 8 << 20;
/// `cache.lock_timeout` by default: how long concurrent misses for one key
/// wait for the first one's answer before asking the upstream themselves
/// (nginx's `fastcgi_cache_lock_timeout`).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// The statuses stored without `statuses:` (nginx's `fastcgi_cache_valid`
/// without a code list: 200, 301, 302; a 302 is often a login redirect, so
/// 404 instead, which scrapers ask for again and again).
pub const DEFAULT_STATUSES: [u16; 3] = [200, 301, 404];
/// Cookies that make a request bypass the cache without `bypass_cookies:`:
/// PHP's session cookie and the names legacy PHP apps log people in with
/// (Drupal's `SESS…`/`SSESS…`, WordPress's logged-in, password-post and
/// comment-author cookies). Matched without case.
pub const DEFAULT_BYPASS_COOKIES: [&str; 8] = [
    "PHPSESSID",
    "*session*",
    "SESS*",
    "SSESS*",
    "wordpress_logged_in_*",
    "wordpress_sec_*",
    "wp-postpass_*",
    "comment_author_*",
];

/// `cache: { max_size, max_entry_size, lock_timeout }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    pub max_size: Option<Size>,
    pub max_entry_size: Option<Size>,
    pub lock_timeout: Option<Dur>,
}

/// `routes[].cache`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouteCache {
    pub ttl: Option<Dur>,
    pub stale_while_revalidate: Option<Dur>,
    pub stale_if_error: Option<Dur>,
    pub bypass_cookies: Option<Vec<Text>>,
    pub statuses: Option<Vec<u16>>,
    pub query: Option<RawCacheQuery>,
    pub hits_free: Option<bool>,
}

/// `routes[].cache.query: { sort, drop }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCacheQuery {
    pub sort: Option<bool>,
    #[serde(default)]
    pub drop: Vec<Text>,
}

/// The shared cache's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes the cache's accounting holds at most (bodies, headers, keys and a per-entry overhead).
    pub max_size: u64,
    /// A single answer larger than this is not stored.
    pub max_entry_size: u64,
    pub lock_timeout: Duration,
}

/// A name pattern with `*` for any run of characters, compared without case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob(String);

impl Glob {
    pub fn new(pattern: &str) -> Glob {
        Glob(pattern.to_ascii_lowercase())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches: `*` is any run (also empty), everything
    /// else itself, ASCII case ignored.
    pub fn matches(&self, name: &str) -> bool {
        let name = name.as_bytes();
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or_default().as_bytes();
        if name.len() < first.len() || !name[..first.len()].eq_ignore_ascii_case(first) {
            return false;
        }
        let mut rest = &name[first.len()..];
        let mut parts: Vec<&[u8]> = parts.map(str::as_bytes).collect();
        let Some(last) = parts.pop() else {
            return rest.is_empty();
        };
        for part in parts {
            match find_ignore_case(rest, part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest[rest.len() - last.len()..].eq_ignore_ascii_case(last)
    }
}

fn find_ignore_case(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle))
}

/// What one route stores, for how long, and who bypasses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCacheConfig {
    /// Freshness for an answer whose upstream gave none (no `max-age`,
    /// `s-maxage` or `Expires`); `None`: such answers are not stored.
    pub ttl: Option<Duration>,
    pub stale_while_revalidate: Duration,
    pub stale_if_error: Duration,
    /// A request carrying a cookie of one of these names is never answered from, nor stored in, the cache.
    pub bypass_cookies: Vec<Glob>,
    pub statuses: Vec<u16>,
    /// Query parameters sorted by name in the key (`?b=1&a=2` and `?a=2&b=1` share an entry).
    pub query_sort: bool,
    /// Query parameters left out of the key (and of the request the upstream gets on a miss).
    pub query_drop: Vec<Glob>,
    /// A hit is answered before the route's limiters count it.
    pub hits_free: bool,
}

impl Validator<'_> {
    /// `cache`: present when the config has the section or a route caches.
    pub(in crate::config) fn cache(
        &mut self,
        raw: Option<&RawCache>,
        any_route_caches: bool,
    ) -> Option<CacheConfig> {
        if raw.is_none() && !any_route_caches {
            return None;
        }
        let raw = raw.cloned().unwrap_or_default();
        let max_size = raw.max_size.map_or(DEFAULT_MAX_SIZE, |s| s.0);
        if max_size < 1 << 20 {
            self.err("cache.max_size", "the cache needs at least 1MiB");
        }
        let max_entry_size = raw
            .max_entry_size
            .map_or(DEFAULT_MAX_ENTRY_SIZE.min(max_size / 4), |s| s.0);
        if max_entry_size > max_size / 4 {
            self.err(
                "cache.max_entry_size",
                "at most a quarter of cache.max_size: one answer must not push out the pages people ask for",
            );
        }
        Some(CacheConfig {
            max_size,
            max_entry_size,
            lock_timeout: super::dur(raw.lock_timeout, DEFAULT_LOCK_TIMEOUT),
        })
    }

    /// `routes[i].cache`.
    pub(in crate::config) fn route_cache(
        &mut self,
        at: &str,
        raw: &RawRouteCache,
    ) -> RouteCacheConfig {
        let bypass_cookies = match &raw.bypass_cookies {
            Some(names) => names.iter().map(|t| Glob::new(&t.0)).collect(),
            None => DEFAULT_BYPASS_COOKIES
                .iter()
                .map(|n| Glob::new(n))
                .collect(),
        };
        let statuses = raw
            .statuses
            .clone()
            .unwrap_or_else(|| DEFAULT_STATUSES.to_vec());
        for (j, s) in statuses.iter().enumerate() {
            if !(200..600).contains(s) || *s == 206 || *s == 304 {
                self.err(
                    format!("{at}.statuses[{j}]"),
                    format!("{s} cannot be stored (a final status 200-599, not 206 or 304)"),
                );
            }
        }
        if raw.ttl.is_some_and(|t| t.0.is_zero()) {
            self.err(
                format!("{at}.ttl"),
                "a ttl of 0 stores nothing; leave it out",
            );
        }
        let query = raw.query.clone().unwrap_or_default();
        RouteCacheConfig {
            ttl: raw.ttl.map(|t| t.0),
            stale_while_revalidate: super::dur(raw.stale_while_revalidate, Duration::ZERO),
            stale_if_error: super::dur(raw.stale_if_error, Duration::ZERO),
            bypass_cookies,
            statuses,
            query_sort: query.sort.unwrap_or(false),
            query_drop: query.drop.iter().map(|t| Glob::new(&t.0)).collect(),
            hits_free: raw.hits_free.unwrap_or(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names_without_case() {
        let g = Glob::new("wordpress_logged_in_*");
        assert!(g.matches("wordpress_logged_in_0a1b"));
        assert!(g.matches("WordPress_Logged_In_"));
        assert!(!g.matches("xwordpress_logged_in_1"));
        let exact = Glob::new("PHPSESSID");
        assert!(exact.matches("phpsessid"));
        assert!(!exact.matches("PHPSESSID2"));
        let middle = Glob::new("*sess*");
        assert!(middle.matches("my_session"));
        assert!(!middle.matches("token"));
        let utm = Glob::new("utm_*");
        assert!(utm.matches("utm_source") && !utm.matches("xutm_source"));
        assert!(Glob::new("a*b*c").matches("aXXbYYc") && !Glob::new("a*b*c").matches("acb"));
    }
}
