//! Config for what operators see: the `log` section and how rejections are shaped (`reject`, `rate_limit_headers`).
//!
//! Kept apart from `config.rs` so the schema of logging and rejection pages
//! reads in one place; the raw types are deserialized with the rest of the
//! file and validated here into plain values.

use http::StatusCode;
use serde::Deserialize;

use super::{Text, Validator};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub format: Option<Text>,
    pub access: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReject {
    pub status: Option<u16>,
    pub body: Option<Text>,
    pub template: Option<Text>,
    pub content_type: Option<Text>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `log:`: the format of every log record and whether requests are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    pub format: LogFormat,
    pub access: bool,
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            format: LogFormat::Text,
            access: true,
        }
    }
}

/// The body of a rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectBody {
    /// RFC 9457 problem+json (the default).
    Problem,
    /// A small built-in HTML page, for browser routes.
    Html,
    /// The operator's text; `{{status}}`, `{{retry_after}}`, `{{limiter}}`
    /// and `{{request_id}}` are replaced (HTML-escaped).
    Template { text: String, content_type: String },
}

/// How a limiter's (or a route's) rejections look to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectShape {
    pub status: StatusCode,
    pub body: RejectBody,
}

impl Default for RejectShape {
    fn default() -> RejectShape {
        RejectShape {
            status: StatusCode::TOO_MANY_REQUESTS,
            body: RejectBody::Problem,
        }
    }
}

/// Which rate-limit header sets a route's responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderSets {
    /// `X-RateLimit-*` and the IETF draft's `RateLimit-Policy` / `RateLimit`.
    #[default]
    Both,
    XRateLimit,
    Draft,
    None,
}

impl HeaderSets {
    pub fn x_ratelimit(self) -> bool {
        matches!(self, HeaderSets::Both | HeaderSets::XRateLimit)
    }

    pub fn draft(self) -> bool {
        matches!(self, HeaderSets::Both | HeaderSets::Draft)
    }
}

impl Validator<'_> {
    pub(super) fn log(&mut self, raw: &RawLog) -> LogConfig {
        let format = match raw.format.as_ref().map(|t| t.0.as_str()) {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                self.err(
                    "log.format",
                    format!("unknown format {other:?} (text or json)"),
                );
                LogFormat::Text
            }
        };
        LogConfig {
            format,
            access: raw.access.unwrap_or(true),
        }
    }

    /// `at` is the YAML path of the `reject` map, e.g. `limiters.login.reject`.
    pub(super) fn reject(&mut self, at: &str, raw: &RawReject) -> RejectShape {
        let status = match raw.status {
            None | Some(429) => StatusCode::TOO_MANY_REQUESTS,
            Some(503) => StatusCode::SERVICE_UNAVAILABLE,
            Some(other) => {
                self.err(
                    format!("{at}.status"),
                    format!("a rejection is answered with 429 or 503, not {other}"),
                );
                StatusCode::TOO_MANY_REQUESTS
            }
        };
        let body = match (raw.body.as_ref().map(|t| t.0.as_str()), &raw.template) {
            (None | Some("problem"), None) => RejectBody::Problem,
            (Some("html"), None) => RejectBody::Html,
            (None | Some("template"), Some(t)) => RejectBody::Template {
                text: t.0.clone(),
                content_type: raw
                    .content_type
                    .as_ref()
                    .map_or_else(|| "text/html; charset=utf-8".into(), |c| c.0.clone()),
            },
            (Some("template"), None) => {
                self.err(
                    format!("{at}.template"),
                    "`body: template` needs a `template` text",
                );
                RejectBody::Problem
            }
            (Some(b @ ("problem" | "html")), Some(_)) => {
                self.err(
                    format!("{at}.template"),
                    format!("`template` is only used with `body: template`, not `body: {b}`"),
                );
                RejectBody::Problem
            }
            (Some(other), _) => {
                self.err(
                    format!("{at}.body"),
                    format!("unknown body {other:?} (problem, html or template)"),
                );
                RejectBody::Problem
            }
        };
        if raw.content_type.is_some() && !matches!(body, RejectBody::Template { .. }) {
            self.err(
                format!("{at}.content_type"),
                "`content_type` is only used with a `template`",
            );
        }
        if let Some(ct) = &raw.content_type {
            if http::HeaderValue::from_str(&ct.0).is_err() {
                self.err(
                    format!("{at}.content_type"),
                    format!("{:?} is not a valid header value", ct.0),
                );
            }
        }
        RejectShape { status, body }
    }

    pub(super) fn header_sets(&mut self, at: &str, raw: Option<&Text>) -> HeaderSets {
        match raw.map(|t| t.0.as_str()) {
            None | Some("both") => HeaderSets::Both,
            Some("x-ratelimit") => HeaderSets::XRateLimit,
            Some("draft") => HeaderSets::Draft,
            Some("none") => HeaderSets::None,
            Some(other) => {
                self.err(
                    at,
                    format!("unknown header set {other:?} (both, x-ratelimit, draft or none)"),
                );
                HeaderSets::Both
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    fn errors(yaml: &str) -> Vec<String> {
        match parse(yaml) {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.path.clone()).collect(),
        }
    }

    #[test]
    fn log_defaults_to_text_with_access_records() {
        let c = parse("").unwrap();
        assert_eq!(c.log, super::LogConfig::default());
        assert!(c.log.access);
    }

    #[test]
    fn an_unknown_log_format_and_a_bad_reject_are_reported_with_their_paths() {
        let yaml = r#"
log: { format: xml }
limiters:
  l: { algorithm: fixed_window, limit: 1, window: 1s, reject: { status: 418, body: page } }
routes:
  - name: r
    match: { path: /x }
    respond: { status: 200 }
    limiters: [l]
    rate_limit_headers: some
    reject: { body: template }
"#;
        let e = errors(yaml);
        for want in [
            "log.format",
            "limiters.l.reject.status",
            "limiters.l.reject.body",
            "routes[0].rate_limit_headers",
            "routes[0].reject.template",
        ] {
            assert!(e.iter().any(|p| p == want), "{want} missing in {e:?}");
        }
    }

    #[test]
    fn a_template_needs_body_template_or_none() {
        let yaml = r#"
limiters:
  l:
    algorithm: fixed_window
    limit: 1
    window: 1s
    reject: { status: 503, template: "<p>wait {{retry_after}}s</p>" }
"#;
        let c = parse(yaml).unwrap();
        let r = c.limiters[0].reject.as_ref().unwrap();
        assert_eq!(r.status, 503);
        assert!(matches!(r.body, super::RejectBody::Template { .. }));
    }
}
