//! Which route a request takes: first match on normalized path, method, host and query.
//!
//! Routes match on the *normalized* path, so that a strict limit on `/login`
//! cannot be walked around by spelling it `//login`, `/./login`, `/%6Cogin`,
//! `/x/../login` or `/login/`. The request is still forwarded as the client
//! wrote it: the upstream resolves it to the same resource.
//!
//! PHP adds spellings of its own, folded here too: Apache and PHP-FPM run
//! `/wp-login.php` for `/wp-login.php/anything` (PATH_INFO), so `path:` on a
//! `.php` file matches those as well; hosts compare lowercase, without a
//! trailing dot or a port; `match.query` compares names and values the way
//! PHP decodes them. Case in paths is *not* folded: Linux filesystems and
//! PHP's handlers tell `/Login.php` from `/login.php`.
//!
//! A separator the router would not see is decided before routing
//! ([`request_path`]): nginx, `php -S` and tollgate's FastCGI all decode
//! `%2F` and then walk the path, so `/wp-login.php%2Fx` and
//! `/x/..%2Fwp-login.php` run `/wp-login.php`. Such a path is refused, or,
//! with `server.encoded_separators: decode`, routed decoded.

use std::borrow::Cow;

use http::Method;

use crate::config::{EncodedSeparators, RouteConfig};
use crate::geodb::{Country, Network};
pub use crate::normal_path::{normalize, segments};

#[derive(Debug)]
pub struct Router {
    routes: Vec<Matcher>,
    /// Whether any route matches on `host`.
    uses_host: bool,
}

/// `match.asn` and `match.country`: the client's network must be listed.
#[derive(Debug, Default)]
struct NetworkMatch {
    asn: Option<Vec<u32>>,
    country: Option<Vec<Country>>,
}

impl NetworkMatch {
    fn matches(&self, network: &Network) -> bool {
        listed(&self.asn, network.asn) && listed(&self.country, network.country)
    }
}

/// No list: any value; a list: a value in it (an address without an entry matches none).
fn listed<T: PartialEq>(list: &Option<Vec<T>>, value: Option<T>) -> bool {
    match list {
        None => true,
        Some(list) => value.is_some_and(|v| list.contains(&v)),
    }
}

#[derive(Debug)]
struct Matcher {
    /// `match.path_regex`, tried after every other condition matched.
    regex: Option<regex::Regex>,
    /// The route's action names captures: the one search also records them.
    captures: bool,
    /// `match.query_regex`, on the query as sent (empty when there is none).
    query_regex: Option<regex::Regex>,
    path: Option<String>,
    /// `path` names a `.php` script: its PATH_INFO forms (`path/…`) match too.
    php_script: bool,
    prefix: Option<String>,
    methods: Option<Vec<Method>>,
    host: Option<String>,
    query: Vec<(String, String)>,
    /// `None` when the route names no network (most routes).
    network: Option<NetworkMatch>,
}

impl Router {
    pub fn new(routes: &[RouteConfig]) -> Router {
        Router {
            uses_host: routes.iter().any(|r| r.host.is_some()),
            routes: routes
                .iter()
                .map(|r| {
                    let path = r.path.as_deref().map(|p| normalize(p).into_owned());
                    Matcher {
                        regex: r.path_regex.clone(),
                        captures: uses_captures(r),
                        query_regex: r.query_regex.clone(),
                        php_script: path.as_deref().is_some_and(|p| p.ends_with(".php")),
                        path,
                        prefix: r.path_prefix.as_deref().map(|p| normalize(p).into_owned()),
                        methods: r.methods.clone(),
                        host: r.host.as_deref().map(normalize_host),
                        query: r.query.clone(),
                        network: (r.asn.is_some() || r.country.is_some()).then(|| NetworkMatch {
                            asn: r.asn.clone(),
                            country: r.country.clone(),
                        }),
                    }
                })
                .collect(),
        }
    }

    /// Whether any route matches on the host (else it need not be looked up).
    pub fn uses_host(&self) -> bool {
        self.uses_host
    }

    /// The index of the first route that matches, if any, with the captures
    /// of its `path_regex` when its action names them.
    /// `path` must already be normalized; `host` as [`request_host`] gives it.
    pub fn find(
        &self,
        method: &Method,
        host: Option<&str>,
        path: &str,
        query: Option<&str>,
    ) -> Option<(usize, Option<regex::CaptureLocations>)> {
        self.find_for(method, host, path, query, &Network::default())
    }

    /// [`find`](Self::find) for a client of `network` (`match.asn`, `match.country`).
    pub fn find_for(
        &self,
        method: &Method,
        host: Option<&str>,
        path: &str,
        query: Option<&str>,
        network: &Network,
    ) -> Option<(usize, Option<regex::CaptureLocations>)> {
        for (i, m) in self.routes.iter().enumerate() {
            if !m.matches(method, host, path, query)
                || !m.network.as_ref().is_none_or(|n| n.matches(network))
            {
                continue;
            }
            let Some(regex) = &m.regex else {
                return Some((i, None));
            };
            // One search per regex route: with captures when they are used.
            if m.captures {
                let mut locs = regex.capture_locations();
                if regex.captures_read(&mut locs, path).is_some() {
                    return Some((i, Some(locs)));
                }
            } else if regex.is_match(path) {
                return Some((i, None));
            }
        }
        None
    }
}

/// Whether a route's `redirect.to` or `rewrite.to` names a capture.
fn uses_captures(r: &RouteConfig) -> bool {
    let redirect = match &r.action {
        crate::config::Action::Redirect(redirect) => Some(&redirect.to),
        _ => None,
    };
    let rewrite = r.site.rewrite.as_ref().map(|rw| &rw.to);
    redirect
        .into_iter()
        .chain(rewrite)
        .any(|t| t.uses_captures())
}

impl Matcher {
    fn matches(
        &self,
        method: &Method,
        host: Option<&str>,
        path: &str,
        query: Option<&str>,
    ) -> bool {
        if let Some(p) = &self.path {
            let path_info = self.php_script
                && path.starts_with(p.as_str())
                && path.as_bytes().get(p.len()) == Some(&b'/');
            if p != path && !path_info {
                return false;
            }
        }
        if let Some(prefix) = &self.prefix {
            let segment_aligned = prefix == "/"
                || (path.starts_with(prefix.as_str())
                    && matches!(path.as_bytes().get(prefix.len()), None | Some(b'/')));
            if !segment_aligned {
                return false;
            }
        }
        if let Some(methods) = &self.methods {
            if !methods.contains(method) {
                return false;
            }
        }
        if let Some(h) = &self.host {
            if host != Some(h.as_str()) {
                return false;
            }
        }
        if let Some(re) = &self.query_regex {
            if !re.is_match(query.unwrap_or("")) {
                return false;
            }
        }
        self.query
            .iter()
            .all(|(name, value)| query.is_some_and(|q| query_has(q, name, value)))
    }
}

/// Whether PHP would see `name` = `value` in this query string.
///
/// Names and values are percent-decoded (`+` is a space) and names mangled
/// as PHP registers them (leading spaces dropped, ` ` and `.` become `_`;
/// `name[...]` is an array, never equal to a string). PHP keeps the *last*
/// occurrence of a repeated name; this matches if *any* occurrence has the
/// value, which is what PHP sees or more: a later duplicate, or one pushed
/// past PHP's `max_input_vars`, cannot hide the parameter from the route.
pub fn query_has(query: &str, name: &str, value: &str) -> bool {
    query.split('&').any(|pair| {
        let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
        php_name(&form_decode(n)).is_some_and(|n| n == name) && form_decode(v) == value
    })
}

/// `application/x-www-form-urlencoded` decoding, as PHP's `urldecode`:
/// invalid escapes stay as written, bytes that are not UTF-8 are replaced.
fn form_decode(s: &str) -> String {
    if !s.contains(['%', '+']) {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The key PHP files a decoded parameter name under in `$_GET`; `None` for
/// an array (`a[]`, `a[x]`), whose value is never a plain string.
fn php_name(decoded: &str) -> Option<Cow<'_, str>> {
    let name = decoded.trim_start_matches(' ');
    if name.contains('[') {
        return None;
    }
    Some(if name.contains([' ', '.']) {
        name.replace([' ', '.'], "_").into()
    } else {
        name.into()
    })
}

/// A host as routes compare it: lowercase, without port, without the one
/// trailing dot every resolver accepts (`Admin.Example.:80` is `admin.example`).
/// Internationalized names compare as sent (the punycode a client sent).
pub fn normalize_host(raw: &str) -> String {
    let without_port = if raw.starts_with('[') {
        raw.find(']').map(|i| &raw[..=i]).unwrap_or(raw)
    } else {
        raw.rsplit_once(':').map(|(h, _)| h).unwrap_or(raw)
    };
    let host = without_port.strip_suffix('.').unwrap_or(without_port);
    host.to_ascii_lowercase()
}

/// The host a request names (its `Host`, else the URI's authority, as the
/// upstream will see it), normalized by [`normalize_host`].
pub fn request_host<B>(req: &http::Request<B>) -> Option<String> {
    let raw = req
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))?;
    Some(normalize_host(raw))
}

/// Why a request path is refused before any route is tried (a `400`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    #[error("The path spells a separator as %2F or %5C, or holds a backslash; this server does not accept them (write the path with plain slashes).")]
    EncodedSeparator,
    #[error("The path holds an encoded NUL byte (%00), which names no file.")]
    Nul,
}

/// The path routes are matched on: `path` as the upstream will resolve it,
/// [`normalize`]d. `%2F`, `%5C` (any case) and a raw `\` are refused under
/// [`EncodedSeparators::Reject`]; under `Decode`, `%2F` is a `/` before `.`
/// and `..` are resolved (as nginx and PHP do), and `%5C` and `\` stay
/// plain characters. `%00` is refused either way (nginx and `php -S` answer
/// `400` too). Exactly one decoding: `%252F` is the text `%2F`, as every
/// upstream that decodes once sees it.
pub fn request_path(path: &str, rule: EncodedSeparators) -> Result<Cow<'_, str>, PathRefused> {
    let b = path.as_bytes();
    if !b.iter().any(|&c| c == b'%' || c == b'\\') {
        return Ok(normalize(path));
    }
    let reject = rule == EncodedSeparators::Reject;
    let mut slashes = false;
    for (i, &c) in b.iter().enumerate() {
        match (c, escape_at(b, i)) {
            (_, Some(0)) => return Err(PathRefused::Nul),
            (b'\\', _) | (_, Some(b'/' | b'\\')) if reject => {
                return Err(PathRefused::EncodedSeparator)
            }
            (_, Some(b'/')) => slashes = true,
            _ => {}
        }
    }
    if !slashes {
        return Ok(normalize(path));
    }
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if escape_at(b, i) == Some(b'/') {
            decoded.push(b'/');
            i += 3;
        } else {
            decoded.push(b[i]);
            i += 1;
        }
    }
    // Only ASCII escapes were replaced by ASCII: still the UTF-8 it was.
    let decoded = String::from_utf8_lossy(&decoded);
    Ok(normalize(&decoded).into_owned().into())
}

/// The byte a `%XX` escape at `i` stands for, if one starts there.
fn escape_at(b: &[u8], i: usize) -> Option<u8> {
    if b.get(i) != Some(&b'%') {
        return None;
    }
    let hex = |c: &u8| (*c as char).to_digit(16);
    let (h, l) = (hex(b.get(i + 1)?)?, hex(b.get(i + 2)?)?);
    Some((h * 16 + l) as u8)
}

/// The prefix a plain listener with `redirect_plain` still routes, for HTTP-01 challenges.
pub const ACME_CHALLENGE: &str = "/.well-known/acme-challenge/";

/// `308 Permanent Redirect` to the same URL on `https://` at `port` (443 is left out).
pub fn https_redirect<B>(
    req: &http::Request<B>,
    port: u16,
) -> Option<http::Response<crate::body::Body>> {
    let host = request_host(req)?;
    // The host is the request's own, checked to be a host alone; the path
    // goes through the same builder as every other Location.
    let location = crate::location::https(&host, port, req.uri().path(), req.uri().query())?;
    let mut resp = http::Response::new(crate::body::Body::empty());
    *resp.status_mut() = http::StatusCode::PERMANENT_REDIRECT;
    resp.headers_mut().insert(http::header::LOCATION, location);
    Some(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Action, RouteConfig};

    #[test]
    fn every_spelling_of_login_normalizes_to_login() {
        for p in [
            "/login",
            "//login",
            "/./login",
            "/%6Cogin",
            "/%6cogin",
            "/login/",
            "/x/../login",
            "/%2E/login",
            "///login//",
        ] {
            assert_eq!(normalize(p), "/login", "{p}");
        }
    }

    #[test]
    fn normal_paths_are_borrowed_not_copied() {
        assert!(matches!(
            normalize("/api/v1/users"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(matches!(normalize("/"), std::borrow::Cow::Borrowed(_)));
        assert!(matches!(normalize("/a/./b"), std::borrow::Cow::Owned(_)));
        assert_eq!(normalize("/a.b/..c/c.."), "/a.b/..c/c..");
    }

    #[test]
    fn reserved_escapes_stay_encoded_and_dotdot_cannot_escape_the_root() {
        assert_eq!(normalize("/a%2fb"), "/a%2Fb");
        assert_eq!(normalize("/../../etc"), "/etc");
        assert_eq!(normalize(""), "/");
        assert_eq!(normalize("/%"), "/%");
        assert_eq!(normalize("/%zz"), "/%zz");
    }

    #[test]
    fn an_encoded_separator_is_refused_by_default_and_nul_always() {
        let reject = |p| request_path(p, EncodedSeparators::Reject);
        for p in [
            "/wp-login.php%2fx",
            "/x/..%2Fwp-login.php",
            "/a%5cb",
            "/a%5Cb",
            "/a\\b",
        ] {
            assert_eq!(reject(p), Err(PathRefused::EncodedSeparator), "{p}");
        }
        for rule in [EncodedSeparators::Reject, EncodedSeparators::Decode] {
            assert_eq!(request_path("/a.php%00.jpg", rule), Err(PathRefused::Nul));
        }
        assert_eq!(reject("/a%252Fb").unwrap(), "/a%252Fb", "one decoding only");
        assert_eq!(reject("/x/%2e%2E/login").unwrap(), "/login");
        assert_eq!(reject("/%").unwrap(), "/%");
        assert!(matches!(reject("/api/v1"), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn a_decoded_slash_is_walked_like_any_other() {
        let decode = |p| request_path(p, EncodedSeparators::Decode).unwrap();
        assert_eq!(decode("/wp-login.php%2fx"), "/wp-login.php/x");
        assert_eq!(decode("/x/..%2Fwp-login.php"), "/wp-login.php");
        assert_eq!(decode("/x%2f%2e%2e%2fwp-login.php"), "/wp-login.php");
        assert_eq!(decode("/a%252Fb"), "/a%252Fb");
        assert_eq!(
            decode("/a%5Cb"),
            "/a%5Cb",
            "a backslash is a plain character"
        );
        assert_eq!(decode("/x\\..\\login"), "/x\\..\\login");
    }

    fn route(
        path: Option<&str>,
        prefix: Option<&str>,
        methods: Option<Vec<Method>>,
    ) -> RouteConfig {
        RouteConfig {
            name: "r".into(),
            path: path.map(Into::into),
            path_prefix: prefix.map(Into::into),
            methods,
            host: None,
            query: vec![],
            action: Action::Upstream(0),
            limiters: vec![],
            reject: None,
            rate_limit_headers: Default::default(),
            allow_unlimited: false,
            errors: Default::default(),
            compression: true,
            challenge: None,
            path_regex: None,
            query_regex: None,
            site: Default::default(),
            cache: None,
            asn: None,
            country: None,
        }
    }

    impl Router {
        /// The index alone, for tests that do not capture.
        fn index(
            &self,
            method: &Method,
            host: Option<&str>,
            path: &str,
            query: Option<&str>,
        ) -> Option<usize> {
            self.find(method, host, path, query).map(|(i, _)| i)
        }
    }

    #[test]
    fn path_prefix_matches_whole_segments_only() {
        let r = Router::new(&[route(None, Some("/login"), None)]);
        assert_eq!(r.index(&Method::GET, None, "/login", None), Some(0));
        assert_eq!(r.index(&Method::GET, None, "/login/x", None), Some(0));
        assert_eq!(r.index(&Method::GET, None, "/loginx", None), None);
    }

    #[test]
    fn first_match_wins_and_methods_filter() {
        let r = Router::new(&[
            route(None, Some("/login"), Some(vec![Method::POST])),
            route(None, Some("/"), None),
        ]);
        assert_eq!(r.index(&Method::POST, None, "/login", None), Some(0));
        assert_eq!(r.index(&Method::GET, None, "/login", None), Some(1));
    }

    #[test]
    fn host_is_matched_without_port_and_case() {
        let mut rc = route(None, Some("/"), None);
        rc.host = Some("api.example".into());
        let r = Router::new(&[rc]);
        let req = http::Request::get("/")
            .header("host", "API.example:8443")
            .body(())
            .unwrap();
        let host = request_host(&req);
        assert_eq!(host.as_deref(), Some("api.example"));
        assert_eq!(r.index(&Method::GET, host.as_deref(), "/", None), Some(0));
        assert_eq!(r.index(&Method::GET, Some("other"), "/", None), None);
    }

    #[test]
    fn a_php_script_route_also_matches_its_path_info_spellings() {
        let r = Router::new(&[
            route(Some("/wp-login.php"), None, None),
            route(None, Some("/"), None),
        ]);
        for p in [
            "/wp-login.php",
            "/wp-login.php/x",
            "//wp-login.php/a/b",
            "/wp-login.php/",
            "/./wp-login.php/%78",
        ] {
            assert_eq!(
                r.index(&Method::POST, None, &normalize(p), None),
                Some(0),
                "{p}"
            );
        }
        for p in [
            "/wp-login.phpx",
            "/wp-login.ph",
            "/x/wp-login.php",
            "/WP-LOGIN.PHP",
        ] {
            assert_eq!(
                r.index(&Method::POST, None, &normalize(p), None),
                Some(1),
                "{p}"
            );
        }
        let plain = Router::new(&[route(Some("/login"), None, None)]);
        assert_eq!(
            plain.index(&Method::GET, None, "/login/x", None),
            None,
            "only .php scripts take PATH_INFO"
        );
    }

    #[test]
    fn hosts_compare_without_case_port_or_a_trailing_dot() {
        let mut rc = route(None, Some("/"), None);
        rc.host = Some("Admin.Example.".into());
        let r = Router::new(&[rc]);
        for h in [
            "admin.example",
            "admin.example.",
            "ADMIN.example:80",
            "admin.example.:8080",
        ] {
            assert_eq!(
                r.index(&Method::GET, Some(&normalize_host(h)), "/", None),
                Some(0),
                "{h}"
            );
        }
        assert_eq!(
            r.index(
                &Method::GET,
                Some(&normalize_host("admin.example..")),
                "/",
                None
            ),
            None
        );
        assert_eq!(normalize_host("[2001:DB8::1]:443"), "[2001:db8::1]");
    }

    #[test]
    fn a_query_route_matches_what_php_decodes() {
        let mut rc = route(Some("/index.php"), None, None);
        rc.query = vec![("action".into(), "login".into())];
        let r = Router::new(&[rc]);
        let find = |q: Option<&str>| r.index(&Method::POST, None, "/index.php", q);
        for q in [
            "action=login",
            "a=1&action=login",
            "action=%6Cogin",
            "%61ction=login",
            "+action=login",
            "action=login&action=view",
            "action=view&action=login",
        ] {
            assert_eq!(find(Some(q)), Some(0), "{q}");
        }
        for q in [
            "action=Login",
            "action=login2",
            "action[]=login",
            "xaction=login",
            "action",
            "",
        ] {
            assert_eq!(find(Some(q)), None, "{q}");
        }
        assert_eq!(find(None), None);
        assert!(query_has("a.b=1", "a_b", "1"), "PHP files a.b under a_b");
        assert!(query_has("q=a+b%20c", "q", "a b c"));
        assert!(
            query_has("q=100%", "q", "100%"),
            "an invalid escape stays as written"
        );
    }

    #[test]
    fn a_plain_request_is_redirected_to_the_same_url_on_https() {
        let req = http::Request::get("/login?next=/a")
            .header("host", "Shop.Example:8080")
            .body(())
            .unwrap();
        let resp = https_redirect(&req, 8443).unwrap();
        assert_eq!(resp.status(), 308);
        assert_eq!(
            resp.headers()["location"],
            "https://shop.example:8443/login?next=/a"
        );
        let resp = https_redirect(&req, 443).unwrap();
        assert_eq!(
            resp.headers()["location"],
            "https://shop.example/login?next=/a"
        );
    }
}
