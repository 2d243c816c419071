//! Validation of the site rules: `match.path_regex` (compiled once, bounded), `redirect`, `rewrite`, `access`, `auth.basic` and `headers`, each problem at its YAML path.

use http::{HeaderName, HeaderValue, StatusCode};
use regex::{Regex, RegexBuilder};

use super::raw::{
    RawAccess, RawBasic, RawHeaderRules, RawHeaders, RawRedirect, RawRewrite, RawRoute,
};
use super::validate::position;
use super::{Action, RouteConfig, Validator};
use crate::site::{self, Access, BasicAuth, HeaderRules, Headers, Redirect, Rewrite, Template};

/// The longest `path_regex` a config may write.
pub const MAX_PATTERN: usize = 4096;
/// The most memory one compiled `path_regex` may take (its program), and
/// its lazy DFA's cache: a pattern like `a{1000}{1000}` is refused by
/// `check` instead of taking the memory.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
pub const REGEX_DFA_LIMIT: usize = 2 << 20;
/// How deeply groups and repetitions may nest.
const REGEX_NEST_LIMIT: u32 = 64;

/// Header names a rule may not set, add or remove: the message's framing
/// and the connection, which tollgate and hyper own.
const FRAMING: &[&str] = &[
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "host",
];

/// Compiles a `match.path_regex` under the size limits.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.len() > MAX_PATTERN {
        return Err(format!(
            "the pattern is {} bytes; at most {MAX_PATTERN}",
            pattern.len()
        ));
    }
    RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_LIMIT)
        .nest_limit(REGEX_NEST_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(limit) => format!(
                "the pattern compiles to more than {limit} bytes, the most a route may take; write it smaller (a bounded repetition like `{{1000}}` is expanded)"
            ),
            // The crate's message spans lines (the pattern, a caret, the error).
            e => e.to_string().split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(": "),
        })
}

impl Validator<'_> {
    /// `match.path_regex`, compiled once for the config's life.
    pub(super) fn path_regex(&mut self, at: &str, pattern: &str) -> Option<Regex> {
        match compile(pattern) {
            Ok(r) => Some(r),
            Err(e) => {
                self.err(at, format!("invalid regular expression: {e}"));
                None
            }
        }
    }

    pub(super) fn redirect(
        &mut self,
        at: &str,
        raw: &RawRedirect,
        regex: Option<&Regex>,
    ) -> Option<Redirect> {
        let status = raw.status.unwrap_or(301);
        if ![301, 302, 303, 307, 308].contains(&status) {
            self.err(
                format!("{at}.status"),
                format!("a redirect's status is 301, 302, 303, 307 or 308, not {status}"),
            );
            return None;
        }
        let to = self.template(&format!("{at}.to"), &raw.to, regex, raw.append_query)?;
        Some(Redirect {
            to,
            status: StatusCode::from_u16(status).expect("listed above"),
        })
    }

    pub(super) fn rewrite(
        &mut self,
        at: &str,
        raw: &RawRewrite,
        regex: Option<&Regex>,
        fastcgi: bool,
    ) -> Option<Rewrite> {
        let to = self.template(&format!("{at}.to"), &raw.to, regex, raw.append_query)?;
        if to.origin.is_some() {
            self.err(
                format!("{at}.to"),
                "a rewrite stays on this site (a path starting with `/`); to send the client elsewhere, use `redirect`",
            );
            return None;
        }
        let unless_exists = raw.unless_exists.unwrap_or(false);
        if unless_exists && !fastcgi {
            self.err(
                format!("{at}.unless_exists"),
                "`unless_exists` looks for files under a FastCGI upstream's `root`; this route's upstream has none",
            );
        }
        Some(Rewrite { to, unless_exists })
    }

    fn template(
        &mut self,
        at: &str,
        to: &str,
        regex: Option<&Regex>,
        append_query: Option<bool>,
    ) -> Option<Template> {
        match Template::parse(to, regex, append_query.unwrap_or(false)) {
            Ok(t) => Some(t),
            Err(e) => {
                self.err(at, e);
                None
            }
        }
    }

    /// `access`: every entry an address, a network, `asn:<n>`, `country:<code>` or `all`.
    pub(super) fn access(&mut self, at: &str, raw: &RawAccess) -> Access {
        let mut list = |field: &str, entries: &[super::raw::Text]| {
            let mut nets = Vec::new();
            for (j, e) in entries.iter().enumerate() {
                match site::access::parse_entry(&e.0) {
                    Ok(n) => nets.extend(n),
                    Err(m) => self.err(format!("{at}.{field}[{j}]"), m),
                }
            }
            nets
        };
        let access = Access {
            allow: list("allow", &raw.allow),
            deny: list("deny", &raw.deny),
        };
        if access.deny.is_empty() && !access.allow.is_empty() {
            self.warn(
                format!("{at}.allow"),
                "`allow` without `deny` lets everyone in (an address no entry holds is allowed); add `deny: [all]` to let only these in",
            );
        }
        access
    }

    /// `auth.basic`; the users file is read by the loader.
    pub(super) fn basic_auth(&mut self, at: &str, raw: &RawBasic) -> BasicAuth {
        let realm = raw
            .realm
            .as_ref()
            .map_or("Restricted", |t| t.0.as_str())
            .to_string();
        let challenge = if realm.contains(['"', '\\']) || realm.chars().any(char::is_control) {
            self.err(
                format!("{at}.realm"),
                "a realm may not hold `\"`, `\\` or control characters",
            );
            HeaderValue::from_static("Basic")
        } else {
            HeaderValue::from_str(&format!("Basic realm=\"{realm}\", charset=\"UTF-8\""))
                .unwrap_or(HeaderValue::from_static("Basic"))
        };
        if raw.users_file.0.is_empty() {
            self.err(
                format!("{at}.users_file"),
                "needs the path of an htpasswd file",
            );
        }
        BasicAuth {
            realm,
            users_file: raw.users_file.0.clone().into(),
            users: Default::default(),
            forward_authorization: raw.forward_authorization.unwrap_or(false),
            challenge,
        }
    }

    /// `headers: { request, response }`.
    pub(super) fn headers(&mut self, at: &str, raw: &RawHeaders) -> Headers {
        Headers {
            request: raw
                .request
                .as_ref()
                .map(|r| self.header_rules(&format!("{at}.request"), r)),
            response: raw
                .response
                .as_ref()
                .map(|r| self.header_rules(&format!("{at}.response"), r)),
        }
    }

    fn header_rules(&mut self, at: &str, raw: &RawHeaderRules) -> HeaderRules {
        let mut rules = HeaderRules::default();
        for (field, map) in [("set", &raw.set), ("add", &raw.add)] {
            for (name, value) in map {
                let path = format!("{at}.{field}.{name}");
                let Some(name) = self.rule_name(&path, name) else {
                    continue;
                };
                match HeaderValue::from_str(&value.0) {
                    Ok(v) if field == "set" => rules.set.push((name, v)),
                    Ok(v) => rules.add.push((name, v)),
                    Err(_) => self.err(path, "a header value is visible ASCII text on one line"),
                }
            }
        }
        for (j, name) in raw.remove.iter().enumerate() {
            if let Some(n) = self.rule_name(&format!("{at}.remove[{j}]"), &name.0) {
                rules.remove.push(n);
            }
        }
        rules
    }

    fn rule_name(&mut self, at: &str, name: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) if FRAMING.contains(&n.as_str()) => {
                self.err(
                    at,
                    format!(
                        "`{n}` frames the message or the connection; tollgate writes it itself"
                    ),
                );
                None
            }
            Ok(n) => Some(n),
            Err(_) => {
                self.err(at, format!("{name:?} is not a header name"));
                None
            }
        }
    }
}

/// Whether `earlier` takes every request `later` would, when either matches
/// by `path_regex`; only what can be decided is `true`: a regex before an
/// exact `path` it matches, or a catch-all before a regex route. Anything
/// else is `false` here, and [`Validator::warn_regex_shadows`] says when it
/// cannot decide.
pub(super) fn regex_covers(earlier: &RouteConfig, later: &RouteConfig) -> bool {
    match (&earlier.path_regex, &later.path_regex) {
        (Some(re), None) => later
            .path
            .as_deref()
            .is_some_and(|p| !p.ends_with(".php") && re.is_match(p)),
        (None, Some(_)) => {
            earlier.path.is_none()
                && earlier
                    .path_prefix
                    .as_deref()
                    .is_none_or(|p| p.trim_end_matches('/').is_empty())
        }
        _ => false,
    }
}

/// The one path `r` matches when it is a plain literal, or whether `path`
/// is matched by `r`'s path condition (exact, prefix, regex).
fn matches_path(r: &RouteConfig, path: &str) -> bool {
    let trimmed = |p: &str| p.trim_end_matches('/').to_string();
    if let Some(re) = &r.path_regex {
        return re.is_match(path);
    }
    if let Some(p) = &r.path {
        return trimmed(p) == trimmed(path);
    }
    match &r.path_prefix {
        Some(prefix) => {
            let (prefix, path) = (trimmed(prefix), trimmed(path));
            prefix.is_empty()
                || path == prefix
                || (path.starts_with(&prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
        }
        None => true,
    }
}

impl Validator<'_> {
    /// A regex route before a prefix route whose own prefix it matches: some
    /// of the later route's requests go to the earlier one, and whether all
    /// do is more than `check` can decide; it says so.
    pub(super) fn warn_regex_shadows(&mut self, raw: &[RawRoute], routes: &[RouteConfig]) {
        for (j, later) in routes.iter().enumerate() {
            let Some(prefix) = later.path_prefix.as_deref() else {
                continue;
            };
            let earlier = routes[..j].iter().find(|e| {
                e.path_regex.as_ref().is_some_and(|re| re.is_match(prefix))
                    && e.methods.is_none()
                    && e.host.is_none()
            });
            if let Some(earlier) = earlier {
                let at = position(raw, &later.name);
                self.warn(
                    format!("routes[{at}].name"),
                    format!(
                        "route {:?} may be partly shadowed: route {:?} comes first and its `path_regex` matches {prefix:?} itself; check cannot decide whether it takes every request of {:?}",
                        later.name, earlier.name, later.name
                    ),
                );
            }
        }
    }

    /// A redirect to a path its own route matches: a client that follows it
    /// comes back forever (each time counted by the route's limiters).
    pub(super) fn warn_redirect_loops(&mut self, raw: &[RawRoute], routes: &[RouteConfig]) {
        for r in routes {
            let Action::Redirect(redirect) = &r.action else {
                continue;
            };
            if redirect.to.origin.is_some() || redirect.to.uses_captures() {
                continue;
            }
            let target = redirect.to.expand("", None, None).path;
            if matches_path(r, &crate::normal_path::normalize(&target)) && r.query.is_empty() {
                let at = position(raw, &r.name);
                self.warn(
                    format!("routes[{at}].redirect.to"),
                    format!(
                        "route {:?} redirects to {target:?}, which it matches itself: a client that follows it loops",
                        r.name
                    ),
                );
            }
        }
    }
}
