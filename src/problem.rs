//! Every answer tollgate writes itself: RFC 9457 problem+json bodies and the rate-limit headers.
//!
//! One place maps each failure to its status, so a 429 and a 502 look alike
//! to a client, and no other module builds an error response by hand.

use std::fmt::Write as _;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};

use crate::body::Body;
use crate::limiter::{ceil_secs, Nanos, Quota, NANOS_PER_SEC};

/// One limiter's view for the headers: its name and its quota after this request.
#[derive(Debug, Clone, Copy)]
pub struct LimitView<'a> {
    pub name: &'a str,
    pub quota: Quota,
}

/// Why a request was refused by its limiters (SPEC §5).
#[derive(Debug, Clone)]
pub struct Denial {
    /// The rejecting limiter with the longest wait.
    pub limiter: String,
    pub quota: Quota,
    /// A human description of the policy, e.g. `5 requests per 60s`.
    pub policy: std::sync::Arc<str>,
    pub retry_after: Nanos,
    /// Every limiter that rejected.
    pub violated: Vec<String>,
    /// The client key as shown to humans (API keys shortened).
    pub key: String,
}

/// Everything tollgate answers on its own.
#[derive(Debug, Clone)]
pub enum Problem {
    BadRequest(String),
    UnknownApiKey(String),
    NoRoute,
    BodyTooLarge {
        limit: u64,
    },
    RateLimited(Box<Denial>),
    UpstreamUnreachable {
        upstream: String,
    },
    StoreUnavailable,
    UpstreamTimeout {
        upstream: String,
    },
    /// A FastCGI upstream's request names no script or static file under its root.
    FileNotFound,
    /// A static file asked for with a method other than GET or HEAD.
    MethodNotAllowed,
    /// A body without Content-Length for a FastCGI script (PHP reads exactly that many bytes).
    LengthRequired,
}

impl Problem {
    pub fn status(&self) -> StatusCode {
        match self {
            Problem::BadRequest(_) => StatusCode::BAD_REQUEST,
            Problem::UnknownApiKey(_) => StatusCode::UNAUTHORIZED,
            Problem::NoRoute => StatusCode::NOT_FOUND,
            Problem::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Problem::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Problem::FileNotFound => StatusCode::NOT_FOUND,
            Problem::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Problem::LengthRequired => StatusCode::LENGTH_REQUIRED,
        }
    }

    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        let title = status.canonical_reason().unwrap_or("Error");
        let mut retry_after = None;
        let body = match self {
            Problem::BadRequest(detail) => base("bad-request", title, status, &detail),
            Problem::UnknownApiKey(short) => base(
                "unknown-api-key",
                title,
                status,
                &format!("The API key '{short}' is not known."),
            ),
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
                // The hot reject path: one struct serialized straight into
                // the body buffer, no intermediate JSON tree.
                let secs = ceil_secs(d.retry_after).max(1);
                let body = RateLimitedBody {
                    kind: "rate-limit-exceeded",
                    title,
                    status: status.as_u16(),
                    detail: format!("Rate limit of {} exceeded for key '{}'.", d.policy, d.key),
                    limiter: &d.limiter,
                    limit: d.quota.limit,
                    window_seconds: d.quota.window.map(ceil_secs),
                    retry_after: secs,
                    violated: &d.violated,
                };
                let mut resp =
                    Response::new(Body::full(serde_json::to_vec(&body).unwrap_or_default()));
                *resp.status_mut() = status;
                let h = resp.headers_mut();
                h.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/problem+json"),
                );
                h.insert(RETRY_AFTER, HeaderValue::from(secs));
                return resp;
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
            Problem::FileNotFound => base("not-found", title, status, "No file at this path."),
            Problem::MethodNotAllowed => base(
                "method-not-allowed",
                title,
                status,
                "A static file answers GET and HEAD only.",
            ),
            Problem::LengthRequired => base(
                "length-required",
                title,
                status,
                "A request body for a PHP script needs a Content-Length.",
            ),
        };
        let mut resp = Response::new(Body::full(body.to_string()));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

#[derive(serde::Serialize)]
struct RateLimitedBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'a str,
    status: u16,
    detail: String,
    limiter: &'a str,
    limit: u64,
    window_seconds: Option<u64>,
    retry_after: u64,
    #[serde(rename = "violated-policies")]
    violated: &'a [String],
}

fn base(kind: &str, title: &str, status: StatusCode, detail: &str) -> Value {
    json!({ "type": kind, "title": title, "status": status.as_u16(), "detail": detail })
}

// Named once: a `&str` key would be parsed into a header name on every response.
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Sets `X-RateLimit-*` from the limiter with the fewest remaining, and the
/// IETF `RateLimit-Policy` / `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers-10).
pub fn set_rate_limit_headers(headers: &mut HeaderMap, views: &[LimitView<'_>], now: Nanos) {
    let Some(tightest) = views.iter().min_by(|a, b| {
        a.quota
            .remaining
            .cmp(&b.quota.remaining)
            .then(b.quota.reset_after.cmp(&a.quota.reset_after))
    }) else {
        return;
    };
    let q = tightest.quota;
    let reset_at = (now + q.reset_after).div_ceil(NANOS_PER_SEC);
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(q.limit));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(q.remaining));
    headers.insert(X_RATELIMIT_RESET, HeaderValue::from(reset_at));

    let mut policy = String::with_capacity(32 * views.len());
    for (i, v) in views.iter().enumerate() {
        if i > 0 {
            policy.push_str(", ");
        }
        let _ = write!(policy, "\"{}\";q={}", v.name, v.quota.limit);
        if let Some(w) = v.quota.window {
            let _ = write!(policy, ";w={}", ceil_secs(w).max(1));
        }
    }
    if let Ok(v) = HeaderValue::from_str(&policy) {
        headers.insert(RATELIMIT_POLICY, v);
    }
    let current = format!(
        "\"{}\";r={};t={}",
        tightest.name,
        q.remaining,
        ceil_secs(q.reset_after)
    );
    if let Ok(v) = HeaderValue::from_str(&current) {
        headers.insert(RATELIMIT, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
