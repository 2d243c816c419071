//! The one builder of every `Location` header tollgate writes: a redirect can never send a client off the site by accident.
//!
//! Browsers read a `Location` that starts with `//` or `/\` as another host
//! (`//evil.example/x` is `http://evil.example/x`), and so do curl, Go and
//! Java clients that follow redirects. Every redirect tollgate makes itself —
//! the `redirect:` rules, the directory redirect of a FastCGI root, the
//! plain listener's redirect to `https://`, the challenge's way back — builds
//! its `Location` here, from a path tollgate resolved (never the raw request
//! line), so the rules hold in one place:
//!
//! - a local target starts with exactly one `/`: a run of leading `/` is
//!   one `/` (`//evil.example/x` is the path `/evil.example/x`), and a `\`
//!   is always written `%5C`, so `/\` cannot follow either;
//! - every byte that is not allowed in a URI (a space, a backslash, a
//!   control, a quote, anything not ASCII) is percent-encoded, so nothing a
//!   client put in a path can end the header or read as a separator;
//! - an absolute target (`https://…`) has its scheme and host from the
//!   config or from a validated `Host`, never from a capture.

use http::HeaderValue;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

/// What stays as written in a `Location`'s path or query: RFC 3986's
/// unreserved and reserved characters and `%` (the text is already
/// percent-encoded where it needs to be). Everything else is encoded.
const NOT_URI: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'<')
    .add(b'>')
    .add(b'\\')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// [`NOT_URI`] and what a decoded path must not keep as written: `%`
/// (it would start an escape), `?` and `#` (they would end the path).
const NOT_PATH: &AsciiSet = &NOT_URI.add(b'%').add(b'?').add(b'#');

/// The longest `Location` tollgate writes; a longer target is refused (the
/// request made it: a capture of a long path repeated in a template).
pub const MAX_LOCATION: usize = 16 * 1024;

/// A `Location` on this site: `path` (percent-encoded text, as a request
/// line or a rule's template gives it) made to start with one `/`, then
/// `?query` when there is one. `None` when the result would exceed
/// [`MAX_LOCATION`].
pub fn local(path: &str, query: Option<&str>) -> Option<HeaderValue> {
    build("", path, NOT_URI, query)
}

/// As [`local`], for a path already percent-decoded (a file path a FastCGI
/// root resolved): every byte that is not plain path text is encoded.
pub fn local_decoded(path: &str, query: Option<&str>) -> Option<HeaderValue> {
    build("", path, NOT_PATH, query)
}

/// A `Location` on another origin the config names: `origin` is a scheme
/// and authority an operator wrote or a validated host (`https://example.com`,
/// no trailing `/`); `path` as for [`local`].
pub fn absolute(origin: &str, path: &str, query: Option<&str>) -> Option<HeaderValue> {
    build(origin, path, NOT_URI, query)
}

/// `origin`, one `/`, `path` without its leading slashes and encoded by
/// `set`, then the query: the one shape every `Location` has.
fn build(
    origin: &str,
    path: &str,
    set: &'static AsciiSet,
    query: Option<&str>,
) -> Option<HeaderValue> {
    let rest = path.trim_start_matches('/');
    let mut out = String::with_capacity(origin.len() + rest.len() + 2 + query.map_or(0, str::len));
    out.push_str(origin);
    out.push('/');
    out.extend(utf8_percent_encode(rest, set));
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        out.push('?');
        out.extend(utf8_percent_encode(q, NOT_URI));
    }
    if out.len() > MAX_LOCATION {
        return None;
    }
    // Only printable ASCII is left after encoding: always a valid value.
    HeaderValue::from_str(&out).ok()
}

/// The same URL on `https://` at `host` (a request's `Host` as the router
/// normalised it) and `port` (443 is left out); `None` when the host is not
/// a valid authority (nothing but a name or an address may precede the path).
pub fn https(host: &str, port: u16, path: &str, query: Option<&str>) -> Option<HeaderValue> {
    let origin = if port == 443 {
        format!("https://{host}")
    } else {
        format!("https://{host}:{port}")
    };
    let authority = origin.strip_prefix("https://")?;
    let parsed = authority.parse::<http::uri::Authority>().ok()?;
    // `user@host` parses as an authority: it must be the host alone.
    if parsed.as_str() != authority || authority.contains('@') {
        return None;
    }
    absolute(&origin, path, query)
}

/// Whether `target` is a path on this site as a client would follow it:
/// one leading `/` (not `//` nor `/\`), printable ASCII without a backslash.
pub fn is_local(target: &str) -> bool {
    let b = target.as_bytes();
    b.first() == Some(&b'/')
        && !matches!(b.get(1), Some(b'/' | b'\\'))
        && b.iter().all(|c| (0x21..0x7f).contains(c) && *c != b'\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_location_never_starts_with_two_slashes_or_a_backslash() {
        for (path, expected) in [
            ("//evil.example/docs", "/evil.example/docs"),
            ("/\\evil.example/docs", "/%5Cevil.example/docs"),
            ("\\/evil.example", "/%5C/evil.example"),
            ("///a", "/a"),
            ("docs", "/docs"),
            ("", "/"),
            ("/a\\b c", "/a%5Cb%20c"),
            ("/caf\u{e9}", "/caf%C3%A9"),
            ("/a%2Fb", "/a%2Fb"),
        ] {
            let v = local(path, None).unwrap();
            assert_eq!(v, expected, "{path:?}");
            assert!(is_local(v.to_str().unwrap()), "{path:?}");
        }
        assert_eq!(local("/a", Some("x=1 2")).unwrap(), "/a?x=1%202");
        assert_eq!(local("/a", Some("")).unwrap(), "/a");
        assert_eq!(
            local_decoded("//evil.example/a%b?c#d/", None).unwrap(),
            "/evil.example/a%25b%3Fc%23d/"
        );
    }

    #[test]
    fn an_https_location_takes_a_host_and_nothing_else() {
        assert_eq!(
            https("shop.example", 8443, "//x", Some("a=1")).unwrap(),
            "https://shop.example:8443/x?a=1"
        );
        assert_eq!(
            https("shop.example", 443, "/", None).unwrap(),
            "https://shop.example/"
        );
        assert!(https("evil.example/x", 443, "/", None).is_none());
        assert!(https("user@evil.example", 443, "/", None).is_none());
    }

    #[test]
    fn a_location_over_the_bound_is_refused() {
        assert!(local(&"/a".repeat(MAX_LOCATION), None).is_none());
    }

    #[test]
    fn only_a_single_slash_path_is_local() {
        for t in ["/", "/a?b=1", "/a/b"] {
            assert!(is_local(t), "{t}");
        }
        for t in ["//a", "/\\a", "a", "", "https://x/", "/a b", "/a\\b"] {
            assert!(!is_local(t), "{t}");
        }
    }
}
