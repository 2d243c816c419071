//! Config for what operators and clients see: the `log` section, how rejections are shaped (`reject`, `rate_limit_headers`) and how errors are written (`error_pages`, `error_format`).
//!
//! Kept apart from `config.rs` so the schema of logging and rejection pages
//! reads in one place; the raw types are deserialized with the rest of the
//! file and validated here into plain values.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use http::StatusCode;
use serde::Deserialize;

use super::{Text, Validator};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub format: Option<Text>,
    pub access: Option<bool>,
    /// A file the access log is appended to instead of stdout (reopened on SIGUSR1).
    pub access_file: Option<Text>,
    /// `each` or `first`: how the access log writes refusals.
    pub refusals: Option<Text>,
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

/// `log:`: the format of every log record and whether requests are logged, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub format: LogFormat,
    pub access: bool,
    /// `log.access_file`: the access log's file (`None`: stdout).
    pub access_file: Option<PathBuf>,
    pub refusals: RefusalLog,
}

/// `log.refusals`: how refusals go into the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefusalLog {
    /// One access record per refusal, like any request.
    #[default]
    Each,
    /// A client's first refusal per window, then one summary line.
    First,
}

impl RefusalLog {
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalLog::Each => "each",
            RefusalLog::First => "first",
        }
    }
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            format: LogFormat::Text,
            access: true,
            access_file: None,
            refusals: RefusalLog::Each,
        }
    }
}

/// `error_format`: whether tollgate's own errors may be HTML pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorFormat {
    /// A page when the client's `Accept` prefers `text/html`, problem+json otherwise.
    #[default]
    Negotiate,
    /// problem+json whatever the client accepts (an API).
    Json,
}

/// One `error_pages` entry: the page for a status, read from its file by the loader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPage {
    pub status: StatusCode,
    pub file: PathBuf,
    /// The file's text (empty straight out of `validate`).
    pub text: Arc<str>,
}

/// How tollgate's own errors are written, for the server or one route.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorAnswers {
    /// `None`: a route inherits the server's; the server's default is `negotiate`.
    pub format: Option<ErrorFormat>,
    /// By status; a route's page wins over the server's for its status.
    pub pages: Vec<ErrorPage>,
}

/// The statuses tollgate answers itself, and so the ones a page may be given
/// for. (Not 431: hyper answers a head too large itself, with no body,
/// before there is a request to negotiate with.)
pub const OWN_ERROR_STATUSES: [u16; 14] = [
    400, 401, 403, 404, 405, 408, 411, 413, 429, 500, 501, 502, 503, 504,
];

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
        let refusals = match raw.refusals.as_ref().map(|t| t.0.as_str()) {
            None | Some("each") => RefusalLog::Each,
            Some("first") => RefusalLog::First,
            Some(other) => {
                self.err(
                    "log.refusals",
                    format!("unknown value {other:?} (each or first)"),
                );
                RefusalLog::Each
            }
        };
        LogConfig {
            format,
            access: raw.access.unwrap_or(true),
            access_file: raw.access_file.as_ref().map(|t| PathBuf::from(&t.0)),
            refusals,
        }
    }

    /// `error_format` and `error_pages` at `at` (`server` or `routes[i]`);
    /// the pages' files are read by the loader.
    pub(super) fn error_answers(
        &mut self,
        at: &str,
        format: Option<&Text>,
        pages: Option<&BTreeMap<u16, Text>>,
    ) -> ErrorAnswers {
        let format = match format.map(|t| t.0.as_str()) {
            None => None,
            Some("negotiate") => Some(ErrorFormat::Negotiate),
            Some("json") => Some(ErrorFormat::Json),
            Some(other) => {
                self.err(
                    format!("{at}.error_format"),
                    format!("unknown error format {other:?} (negotiate or json)"),
                );
                None
            }
        };
        let mut out = Vec::new();
        for (code, file) in pages.into_iter().flatten() {
            let status = StatusCode::from_u16(*code)
                .ok()
                .filter(|_| OWN_ERROR_STATUSES.contains(code));
            let Some(status) = status else {
                let why = if *code == 431 {
                    "hyper answers 431 itself, before tollgate reads the request".to_string()
                } else {
                    format!(
                        "tollgate answers only {} itself",
                        OWN_ERROR_STATUSES.map(|c| c.to_string()).join(", ")
                    )
                };
                self.err(
                    format!("{at}.error_pages.{code}"),
                    format!("no page for {code}: {why}"),
                );
                continue;
            };
            if file.0.trim().is_empty() {
                self.err(format!("{at}.error_pages.{code}"), "names no file");
                continue;
            }
            out.push(ErrorPage {
                status,
                file: PathBuf::from(&file.0),
                text: Arc::from(""),
            });
        }
        ErrorAnswers { format, pages: out }
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
    fn error_pages_are_read_at_load_and_bad_ones_are_named_by_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("404.html");
        std::fs::write(&page, "<h1>{{status}}</h1>").unwrap();
        let yaml = format!(
            r#"
server: {{ error_pages: {{ 404: "{}" }}, error_format: negotiate }}
routes:
  - {{ name: api, match: {{ path: /api }}, respond: {{ status: 200 }}, error_format: json }}
"#,
            page.display()
        );
        let c = parse(&yaml).unwrap();
        assert_eq!(&*c.server.errors.pages[0].text, "<h1>{{status}}</h1>");
        assert_eq!(c.server.errors.pages[0].status, 404);
        assert_eq!(c.routes[0].errors.format, Some(super::ErrorFormat::Json));

        let missing = dir.path().join("none.html").display().to_string();
        let bad = format!(
            r#"
server: {{ error_pages: {{ 418: a.html, 431: b.html }}, error_format: xml }}
routes:
  - {{ name: r, match: {{ path: /x }}, respond: {{ status: 200 }}, error_pages: {{ 502: "{missing}" }} }}
"#
        );
        // Validation first: the shape of every entry.
        let e = errors(&bad);
        for want in [
            "server.error_pages.418",
            "server.error_pages.431",
            "server.error_format",
        ] {
            assert!(e.iter().any(|p| p == want), "{want} missing in {e:?}");
        }
        // Then the files, once the rest is valid.
        let unreadable = bad
            .replace("418: a.html, 431: b.html", "")
            .replace("xml", "json");
        assert_eq!(errors(&unreadable), ["routes[0].error_pages.502"]);
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
