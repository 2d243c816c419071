//! What a route's challenge never asks of (`challenge.exempt_public`): the files machines fetch by name — robots.txt, `/.well-known/`, favicon.ico — and feeds, by path or by `Accept`.
//!
//! A feed reader, a search engine reading robots.txt, an ACME or security.txt
//! client, a browser fetching its tab icon: none of them can run a page's
//! script or follow a refresh, and all of them fetch a few fixed paths.
//! Letting them through costs only what the route's limiters allow.

use http::HeaderMap;

/// Path endings that name a feed (after one trailing `/`: WordPress's `/feed/`).
const FEED_ENDINGS: [&str; 7] = [
    "/feed",
    "/rss",
    ".rss",
    ".atom",
    "/atom.xml",
    "feed.xml",
    "rss.xml",
];
/// `Accept` media types that ask for a feed.
const FEED_TYPES: [&str; 2] = ["application/rss+xml", "application/atom+xml"];

/// Whether a request for `path` with `headers` is never challenged.
pub fn is_public(path: &str, headers: &HeaderMap) -> bool {
    path == "/robots.txt"
        || path == "/favicon.ico"
        || path.starts_with("/.well-known/")
        || is_feed_path(path)
        || asks_for_feed(headers)
}

fn is_feed_path(path: &str) -> bool {
    let path = path.strip_suffix('/').unwrap_or(path);
    let ends = |end: &str| {
        path.len() >= end.len()
            && path.as_bytes()[path.len() - end.len()..].eq_ignore_ascii_case(end.as_bytes())
    };
    FEED_ENDINGS.iter().any(|e| ends(e))
}

/// `Accept` names a feed type with a non-zero weight.
fn asks_for_feed(headers: &HeaderMap) -> bool {
    crate::page::accepts(headers, &FEED_TYPES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::ACCEPT, v.parse().unwrap());
        h
    }

    #[test]
    fn fixed_files_and_feeds_by_path_or_accept_are_public() {
        let none = HeaderMap::new();
        for p in [
            "/robots.txt",
            "/favicon.ico",
            "/.well-known/security.txt",
            "/feed/",
            "/comments/feed",
            "/blog/index.rss",
            "/news.atom",
            "/atom.xml",
            "/blog/feed.xml",
            "/RSS",
        ] {
            assert!(is_public(p, &none), "{p}");
        }
        for p in [
            "/",
            "/feedback",
            "/robots.txt.bak",
            "/wiki/Feed_forward",
            "/.well-known",
        ] {
            assert!(!is_public(p, &none), "{p}");
        }
        assert!(is_public(
            "/blog",
            &accept("application/atom+xml, text/html;q=0.9")
        ));
        assert!(is_public(
            "/blog",
            &accept("text/html, application/RSS+xml;q=0.5")
        ));
        assert!(!is_public(
            "/blog",
            &accept("text/html, application/rss+xml;q=0")
        ));
    }
}
