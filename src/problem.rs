//! Every answer tollgate writes itself: RFC 9457 problem+json bodies and the rate-limit headers.
//!
//! One place maps each failure to its status, so a 429 and a 502 look alike
//! to a client, and no other module builds an error response by hand: the
//! admin API's refusals ([`admin_error`]) are written here too.

use std::fmt::Write as _;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde_json::{json, Value};

use crate::body::Body;
use crate::config::{RejectBody, RejectShape};
use crate::limiter::{ceil_secs, Nanos, NANOS_PER_SEC};
pub use crate::reject::{set_rate_limit_headers, Denial, LimitView};

/// Why a request was refused outright: its key is banned (`ban:` on a limiter).
#[derive(Debug, Clone)]
pub struct BanDenial {
    pub limiter: String,
    /// The client key as shown to humans.
    pub key: String,
    /// When the ban ends (Unix ns).
    pub until: Nanos,
    pub retry_after: Nanos,
    /// 429 or 403, as the limiter's `ban.status` says.
    pub status: StatusCode,
}

/// Where a failure came from: the client's request (downstream), the
/// upstream, the limiter store, or tollgate itself. The access log carries
/// it, so a 503 from a failing store reads apart from one of a busy upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Downstream,
    Upstream,
    Store,
    Internal,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Downstream => "downstream",
            Origin::Upstream => "upstream",
            Origin::Store => "store",
            Origin::Internal => "internal",
        }
    }
}

/// Everything tollgate answers on its own.
#[derive(Debug, Clone)]
pub enum Problem {
    BadRequest(String),
    UnknownApiKey(String),
    /// An IP presented too many unknown API keys in a window (key probing).
    TooManyUnknownKeys {
        ip_key: String,
        retry_after: Nanos,
    },
    NoRoute,
    BodyTooLarge {
        limit: u64,
    },
    RateLimited(Box<Denial>),
    Banned(Box<BanDenial>),
    UpstreamUnreachable {
        upstream: String,
    },
    StoreUnavailable,
    UpstreamTimeout {
        upstream: String,
    },
    /// A method tollgate never proxies (CONNECT, TRACE).
    MethodNotAllowed {
        method: String,
    },
    /// A request form tollgate does not serve (`OPTIONS *`).
    NotImplemented(String),
    /// Every server of the upstream is at `max_conns` and the wait queue is
    /// full or timed out; the client may retry after `retry_after` seconds.
    UpstreamBusy {
        upstream: String,
        retry_after: u64,
    },
    /// A FastCGI upstream's request names no script or static file under its root.
    FileNotFound,
    /// A static file asked for with a method other than GET or HEAD.
    StaticMethodNotAllowed,
    /// A body without Content-Length for a FastCGI script (PHP reads exactly that many bytes).
    LengthRequired,
    /// The request body stalled or trickled below the minimum rate; the connection closes.
    BodyTimeout,
    /// The request body could not be set aside in a temp file (disk full, for instance).
    BodyNotStored,
}

/// What a 405 lists in `Allow`: the methods any route can forward.
const ALLOWED_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

impl Problem {
    pub fn status(&self) -> StatusCode {
        match self {
            Problem::BadRequest(_) => StatusCode::BAD_REQUEST,
            Problem::UnknownApiKey(_) => StatusCode::UNAUTHORIZED,
            Problem::TooManyUnknownKeys { .. } => StatusCode::TOO_MANY_REQUESTS,
            Problem::NoRoute => StatusCode::NOT_FOUND,
            Problem::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Problem::Banned(b) => b.status,
            Problem::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Problem::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Problem::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Problem::UpstreamBusy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Problem::FileNotFound => StatusCode::NOT_FOUND,
            Problem::StaticMethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Problem::LengthRequired => StatusCode::LENGTH_REQUIRED,
            Problem::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Problem::BodyNotStored => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Where the failure came from (see [`Origin`]).
    pub fn origin(&self) -> Origin {
        match self {
            Problem::UpstreamUnreachable { .. }
            | Problem::UpstreamTimeout { .. }
            | Problem::UpstreamBusy { .. } => Origin::Upstream,
            Problem::StoreUnavailable => Origin::Store,
            Problem::BadRequest(_)
            | Problem::UnknownApiKey(_)
            | Problem::TooManyUnknownKeys { .. }
            | Problem::NoRoute
            | Problem::BodyTooLarge { .. }
            | Problem::RateLimited(_)
            | Problem::Banned(_)
            | Problem::MethodNotAllowed { .. }
            | Problem::NotImplemented(_)
            | Problem::FileNotFound
            | Problem::StaticMethodNotAllowed
            | Problem::LengthRequired
            | Problem::BodyTimeout => Origin::Downstream,
            // The temp file a large body is set aside in is tollgate's own disk.
            Problem::BodyNotStored => Origin::Internal,
        }
    }

    /// The answer without a request id, shaped the default way.
    pub fn into_response(self) -> Response<Body> {
        self.respond(None, None)
    }

    /// The answer; `request_id` goes into every body, `shape` (a limiter's or
    /// route's `reject`) decides a rejection's status and body.
    pub fn respond(self, request_id: Option<&str>, shape: Option<&RejectShape>) -> Response<Body> {
        let mut status = self.status();
        let mut retry_after = None;
        let mut allow = None;
        if let (Problem::RateLimited(_), Some(shape)) = (&self, shape) {
            status = shape.status;
        }
        let title = status.canonical_reason().unwrap_or("Error");
        let mut body = match self {
            Problem::BadRequest(detail) => base("bad-request", title, status, &detail),
            Problem::UnknownApiKey(short) => base(
                "unknown-api-key",
                title,
                status,
                &format!("The API key '{short}' is not known."),
            ),
            Problem::TooManyUnknownKeys {
                ip_key,
                retry_after: wait,
            } => {
                retry_after = Some(ceil_secs(wait).max(1));
                base(
                    "unknown-api-keys-exceeded",
                    title,
                    status,
                    &format!("Too many unknown API keys from '{ip_key}'; try again later."),
                )
            }
            Problem::NoRoute => base("no-route", title, status, "No route matches this request."),
            Problem::BodyTooLarge { limit } => {
                let mut v = base(
                    "body-too-large",
                    title,
                    status,
                    &format!("The request body exceeds {limit} bytes."),
                );
                v["max_request_body"] = json!(limit);
                v
            }
            Problem::RateLimited(d) => {
                // The hot reject path: the body written straight into one
                // buffer (see `reject`), no serializer.
                let secs = ceil_secs(d.retry_after).max(1);
                if let Some(resp) = shaped(shape, status, secs, &d.limiter, request_id) {
                    return resp;
                }
                let body = crate::reject::problem_body(&d, status, title, secs, request_id);
                let mut resp = problem_json(status, body);
                let h = resp.headers_mut();
                // Sized once for the rate-limit headers and the request id that follow.
                h.reserve(2 + crate::reject::LIMIT_HEADERS);
                h.insert(RETRY_AFTER, HeaderValue::from(secs));
                return resp;
            }
            Problem::Banned(b) => {
                let secs = ceil_secs(b.retry_after).max(1);
                // The page of the limiter's (or route's) `reject`, with the ban's own status.
                if let Some(resp) = shaped(shape, status, secs, &b.limiter, request_id) {
                    return resp;
                }
                retry_after = Some(secs);
                let until = b.until.div_ceil(NANOS_PER_SEC);
                let mut v = base(
                    "client-banned",
                    title,
                    status,
                    &format!(
                        "Key '{}' is banned until {} after repeated rejections by '{}'.",
                        b.key,
                        crate::clock::iso8601(until),
                        b.limiter
                    ),
                );
                v["limiter"] = json!(b.limiter);
                v["banned_until"] = json!(until);
                v["retry_after"] = json!(secs);
                v
            }
            Problem::UpstreamUnreachable { upstream } => base(
                "upstream-unreachable",
                title,
                status,
                &format!("The upstream '{upstream}' could not be reached."),
            ),
            Problem::StoreUnavailable => {
                retry_after = Some(1);
                base(
                    "store-unavailable",
                    title,
                    status,
                    "The rate-limit store is unavailable and this proxy fails closed.",
                )
            }
            Problem::UpstreamTimeout { upstream } => base(
                "upstream-timeout",
                title,
                status,
                &format!("The upstream '{upstream}' did not answer in time."),
            ),
            Problem::MethodNotAllowed { method } => {
                allow = Some(ALLOWED_METHODS);
                base(
                    "method-not-allowed",
                    title,
                    status,
                    &format!("tollgate does not proxy {method} requests."),
                )
            }
            Problem::NotImplemented(detail) => base("not-implemented", title, status, &detail),
            Problem::UpstreamBusy {
                upstream,
                retry_after: secs,
            } => {
                retry_after = Some(secs.max(1));
                base(
                    "upstream-busy",
                    title,
                    status,
                    &format!("Every server of the upstream '{upstream}' is busy; try again later."),
                )
            }
            Problem::FileNotFound => base("not-found", title, status, "No file at this path."),
            Problem::StaticMethodNotAllowed => {
                allow = Some("GET, HEAD");
                base(
                    "method-not-allowed",
                    title,
                    status,
                    "A static file answers GET and HEAD only.",
                )
            }
            Problem::LengthRequired => base(
                "length-required",
                title,
                status,
                "A request body for a PHP script needs a Content-Length.",
            ),
            Problem::BodyTimeout => base(
                "body-timeout",
                title,
                status,
                "The request body arrived too slowly.",
            ),
            Problem::BodyNotStored => base(
                "body-not-stored",
                title,
                status,
                "The request body could not be stored for forwarding.",
            ),
        };
        if let Some(id) = request_id {
            body["request_id"] = json!(id);
        }
        let mut resp = problem_json(status, body.to_string());
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(methods) = allow {
            resp.headers_mut()
                .insert(http::header::ALLOW, HeaderValue::from_static(methods));
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body is still on its way: the connection cannot carry another request.
            resp.headers_mut()
                .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// The built-in page of `reject: { body: html }`: plain, readable on a
/// phone, and free of anything a browser would fetch.
const HTML_PAGE: &str = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>Too many attempts</title></head>\n<body style=\"font-family: system-ui, sans-serif; max-width: 36em; margin: 4em auto; padding: 0 1em\"><h1>Too many attempts</h1>\n<p>Please wait {{retry_after}} seconds, then try again.</p>\n<p style=\"color: #666\"><small>Status {{status}} · request {{request_id}}</small></p></body></html>\n";

/// A rejection as the `reject` page or template asks (`None`: problem+json).
fn shaped(
    shape: Option<&RejectShape>,
    status: StatusCode,
    secs: u64,
    limiter: &str,
    request_id: Option<&str>,
) -> Option<Response<Body>> {
    let (text, content_type) = match &shape?.body {
        RejectBody::Html => (
            render_template(HTML_PAGE, status, secs, limiter, request_id),
            HeaderValue::from_static("text/html; charset=utf-8"),
        ),
        RejectBody::Template { text, content_type } => (
            render_template(text, status, secs, limiter, request_id),
            HeaderValue::from_str(content_type)
                .unwrap_or(HeaderValue::from_static("text/html; charset=utf-8")),
        ),
        RejectBody::Problem => return None,
    };
    let mut resp = Response::new(Body::full(text));
    *resp.status_mut() = status;
    resp.headers_mut().insert(CONTENT_TYPE, content_type);
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    Some(resp)
}

/// Replaces `{{status}}`, `{{retry_after}}`, `{{limiter}}` and `{{request_id}}`, HTML-escaped.
fn render_template(
    text: &str,
    status: StatusCode,
    retry_after: u64,
    limiter: &str,
    request_id: Option<&str>,
) -> String {
    let mut out = String::with_capacity(text.len() + 32);
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        match after[..end].trim() {
            "status" => {
                let _ = write!(out, "{}", status.as_u16());
            }
            "retry_after" => {
                let _ = write!(out, "{retry_after}");
            }
            "limiter" => html_escape(&mut out, limiter),
            "request_id" => html_escape(&mut out, request_id.unwrap_or("")),
            _ => out.push_str(&rest[start..start + 2 + end + 2]),
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

fn html_escape(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

fn base(kind: &str, title: &str, status: StatusCode, detail: &str) -> Value {
    json!({ "type": kind, "title": title, "status": status.as_u16(), "detail": detail })
}

/// The admin API's answer to a call it refuses or cannot serve (bad path,
/// method, token, or a store that does not answer): problem+json of type
/// `admin-error`, kept apart from [`Problem`] because it is never a
/// proxied request's answer and carries no request id.
pub fn admin_error(status: StatusCode, detail: &str) -> Response<Body> {
    let title = status.canonical_reason().unwrap_or("Error");
    problem_json(
        status,
        format!("{}\n", base("admin-error", title, status, detail)),
    )
}

/// Every problem+json response is finished here: status and media type.
fn problem_json(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<Body> {
    let mut resp = Response::new(Body::full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HeaderSets;
    use crate::limiter::Quota;
    use http::HeaderMap;
    use http_body_util::BodyExt;

    const S: Nanos = NANOS_PER_SEC;

    fn quota(limit: u64, remaining: u64, reset: u64) -> Quota {
        Quota {
            limit,
            window: Some(60 * S),
            remaining,
            reset_after: reset * S,
        }
    }

    #[test]
    fn headers_follow_the_limiter_with_the_fewest_remaining() {
        let mut h = HeaderMap::new();
        let now = 1_767_225_620 * S;
        set_rate_limit_headers(
            &mut h,
            &[
                LimitView {
                    name: "strict",
                    quota: quota(5, 2, 40),
                },
                LimitView {
                    name: "global",
                    quota: quota(100, 97, 40),
                },
            ],
            now,
            HeaderSets::Both,
            &crate::reject::PolicyCache::default(),
        );
        assert_eq!(h["x-ratelimit-limit"], "5");
        assert_eq!(h["x-ratelimit-remaining"], "2");
        assert_eq!(h["x-ratelimit-reset"], "1767225660");
        assert_eq!(
            h["ratelimit-policy"],
            "\"strict\";q=5;w=60, \"global\";q=100;w=60"
        );
        assert_eq!(h["ratelimit"], "\"strict\";r=2;t=40");
    }

    #[tokio::test]
    async fn a_rate_limited_answer_is_problem_json_with_retry_after() {
        let resp = Problem::RateLimited(Box::new(Denial {
            limiter: "strict".into(),
            quota: quota(5, 0, 40),
            policy: "5 requests per 60s".into(),
            retry_after: 39 * S + 1,
            violated: vec!["strict".into()],
            key: "ip:203.0.113.9".into(),
        }))
        .into_response();
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()[RETRY_AFTER], "40");
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/problem+json");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "rate-limit-exceeded");
        assert_eq!(
            v["detail"],
            "Rate limit of 5 requests per 60s exceeded for key 'ip:203.0.113.9'."
        );
        assert_eq!(v["window_seconds"], 60);
        assert_eq!(v["retry_after"], 40);
        assert_eq!(v["violated-policies"], json!(["strict"]));
    }

    #[tokio::test]
    async fn every_problem_body_names_the_request_and_a_template_is_escaped() {
        let resp = Problem::NoRoute.respond(Some("abc-1"), None);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["request_id"], "abc-1");

        let shape = RejectShape {
            status: StatusCode::SERVICE_UNAVAILABLE,
            body: RejectBody::Template {
                text: "<p>{{limiter}} {{retry_after}} {{status}} {{request_id}} {{other}}</p>"
                    .into(),
                content_type: "text/html".into(),
            },
        };
        let denial = Denial {
            limiter: "a<b".into(),
            quota: quota(1, 0, 5),
            policy: "".into(),
            retry_after: 5 * S,
            violated: vec![],
            key: String::new(),
        };
        let resp = Problem::RateLimited(Box::new(denial)).respond(Some("x-1"), Some(&shape));
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()[RETRY_AFTER], "5");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"<p>a&lt;b 5 503 x-1 {{other}}</p>");
    }

    #[tokio::test]
    async fn a_banned_answer_names_the_ban_and_its_end_with_the_chosen_status() {
        let resp = Problem::Banned(Box::new(BanDenial {
            limiter: "failed_logins".into(),
            key: "ip:203.0.113.9".into(),
            until: 1_767_229_200 * S,
            retry_after: 3599 * S + 1,
            status: StatusCode::FORBIDDEN,
        }))
        .into_response();
        assert_eq!(resp.status(), 403);
        assert_eq!(resp.headers()[RETRY_AFTER], "3600");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["type"], "client-banned");
        assert_eq!(v["banned_until"], 1_767_229_200u64);
        assert_eq!(
            v["detail"],
            "Key 'ip:203.0.113.9' is banned until 2026-01-01T01:00:00Z after repeated rejections by 'failed_logins'."
        );
    }

    #[tokio::test]
    async fn an_admin_error_is_problem_json_of_its_own_type() {
        let resp = admin_error(StatusCode::NOT_FOUND, "Admin paths: /status.");
        assert_eq!(resp.status(), 404);
        assert_eq!(resp.headers()[CONTENT_TYPE], "application/problem+json");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"type": "admin-error", "title": "Not Found", "status": 404, "detail": "Admin paths: /status."})
        );
    }

    #[test]
    fn retry_after_is_never_zero() {
        let resp = Problem::RateLimited(Box::new(Denial {
            limiter: "l".into(),
            quota: quota(1, 0, 0),
            policy: "".into(),
            retry_after: 1,
            violated: vec![],
            key: String::new(),
        }))
        .into_response();
        assert_eq!(resp.headers()[RETRY_AFTER], "1");
    }
}
