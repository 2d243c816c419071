//! Which route a request takes: first match on normalized path, method and host.
//!
//! Routes match on the *normalized* path, so that a strict limit on `/login`
//! cannot be walked around by spelling it `//login`, `/./login`, `/%6Cogin`,
//! `/x/../login` or `/login/`. The request is still forwarded as the client
//! wrote it: the upstream resolves it to the same resource.

use http::Method;

use crate::config::RouteConfig;

#[derive(Debug)]
pub struct Router {
    routes: Vec<Matcher>,
    /// Whether any route matches on `host`.
    uses_host: bool,
}

#[derive(Debug)]
struct Matcher {
    path: Option<String>,
    prefix: Option<String>,
    methods: Option<Vec<Method>>,
    host: Option<String>,
}

impl Router {
    pub fn new(routes: &[RouteConfig]) -> Router {
        Router {
            uses_host: routes.iter().any(|r| r.host.is_some()),
            routes: routes
                .iter()
                .map(|r| Matcher {
                    path: r.path.as_deref().map(|p| normalize(p).into_owned()),
                    prefix: r.path_prefix.as_deref().map(|p| normalize(p).into_owned()),
                    methods: r.methods.clone(),
                    host: r.host.clone(),
                })
                .collect(),
        }
    }

    /// Whether any route matches on the host (else it need not be looked up).
    pub fn uses_host(&self) -> bool {
        self.uses_host
    }

    /// The index of the first route that matches, if any.
    /// `path` must already be normalized; `host` is lowercase without port.
    pub fn find(&self, method: &Method, host: Option<&str>, path: &str) -> Option<usize> {
        self.routes
            .iter()
            .position(|m| m.matches(method, host, path))
    }
}

impl Matcher {
    fn matches(&self, method: &Method, host: Option<&str>, path: &str) -> bool {
        if let Some(p) = &self.path {
            if p != path {
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
        true
    }
}

/// The host a request names, lowercase and without port.
pub fn request_host<B>(req: &http::Request<B>) -> Option<String> {
    let raw = req
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))?;
    let without_port = if raw.starts_with('[') {
        raw.find(']').map(|i| &raw[..=i]).unwrap_or(raw)
    } else {
        raw.rsplit_once(':').map(|(h, _)| h).unwrap_or(raw)
    };
    Some(without_port.to_ascii_lowercase())
}

/// Decodes percent-escapes of unreserved characters, collapses repeated
/// slashes, resolves `.` and `..`, and drops a trailing slash.
/// Reserved escapes such as `%2F` stay encoded: they name another resource.
/// Most paths are already normal and come back borrowed, without a copy.
pub fn normalize(path: &str) -> std::borrow::Cow<'_, str> {
    if is_normal(path) {
        return path.into();
    }
    let decoded = decode_unreserved(path);
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len().max(1));
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() {
        out.push('/');
    }
    out.into()
}

/// Starts with `/`, has no escape, no empty, `.` or `..` segment, no trailing `/`.
fn is_normal(path: &str) -> bool {
    let b = path.as_bytes();
    if b == b"/" {
        return true;
    }
    if b.first() != Some(&b'/') || b.last() == Some(&b'/') || b.contains(&b'%') {
        return false;
    }
    path[1..]
        .split('/')
        .all(|seg| !matches!(seg, "" | "." | ".."))
}

fn decode_unreserved(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains('%') {
        return path.into();
    }
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                let c = (h * 16 + l) as u8;
                if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
                    out.push(c as char);
                } else {
                    // Keep the escape, in one canonical (upper-case) spelling.
                    out.push('%');
                    out.push(b[i + 1].to_ascii_uppercase() as char);
                    out.push(b[i + 2].to_ascii_uppercase() as char);
                }
                i += 3;
                continue;
            }
        }
        // Request paths reaching here are ASCII (hyper rejects others), but be safe.
        let ch = path[i..].chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out.into()
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
            action: Action::Upstream(0),
            limiters: vec![],
            reject: None,
            rate_limit_headers: Default::default(),
        }
    }

    #[test]
    fn path_prefix_matches_whole_segments_only() {
        let r = Router::new(&[route(None, Some("/login"), None)]);
        assert_eq!(r.find(&Method::GET, None, "/login"), Some(0));
        assert_eq!(r.find(&Method::GET, None, "/login/x"), Some(0));
        assert_eq!(r.find(&Method::GET, None, "/loginx"), None);
    }

    #[test]
    fn first_match_wins_and_methods_filter() {
        let r = Router::new(&[
            route(None, Some("/login"), Some(vec![Method::POST])),
            route(None, Some("/"), None),
        ]);
        assert_eq!(r.find(&Method::POST, None, "/login"), Some(0));
        assert_eq!(r.find(&Method::GET, None, "/login"), Some(1));
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
        assert_eq!(r.find(&Method::GET, host.as_deref(), "/"), Some(0));
        assert_eq!(r.find(&Method::GET, Some("other"), "/"), None);
    }
}
