//! Validation of the site rules: `match.path_regex` (compiled once, bounded), `redirect`, `rewrite`, `access`, `auth.basic` and `headers`, each problem at its YAML path.

use http::{HeaderName, HeaderValue, StatusCode};
use regex::{Regex, RegexBuilder};

use super::raw::{RawAccess, RawBasic, RawHeaderRules, RawHeaders, RawRedirect, RawRewrite};
use super::Validator;
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

    /// `access`: every entry an address, a network or `all`.
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
