//! Every answer tollgate writes itself: RFC 9457 problem+json bodies or HTML pages, and the rate-limit headers.
//!
//! One place maps each failure to its status, so a 429 and a 502 look alike
//! to a client, and no other module builds an error response by hand: the
//! admin API's refusals ([`admin_error`]) are written here too. Whether a
//! client reads problem+json or a page is negotiated (see [`crate::page`]);
//! the headers are the same either way.

use std::borrow::Cow;

use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER, VARY};
use http::{Response, StatusCode};
use serde_json::{json, Value};

use crate::body::Body;
use crate::config::{RejectBody, RejectShape};
use crate::limiter::{ceil_secs, Nanos, NANOS_PER_SEC};
use crate::page::{self, Fill, Negotiation};
pub use crate::reject::{set_rate_limit_headers, Denial, LimitHeaders, LimitView};

/// Why a request was refused outright: its key is banned (`ban:` on a limiter).
#[derive(Debug, Clone)]
pub struct BanDenial {
    /// The banning limiter: its index in `Snapshot::limiters` and its name.
    pub index: usize,
    pub limiter: std::sync::Arc<str>,
    /// The client key as shown to humans.
    pub key: String,
    /// When the ban ends (Unix ns).
    pub until: Nanos,
    pub retry_after: Nanos,
    /// 429 or 403, as the limiter's `ban.status` says.
    pub status: StatusCode,
    /// Who banned: a limiter's `ban:`, or a CrowdSec decision.
    pub source: BanSource,
}

/// Where a ban comes from, for the sentence its answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BanSource {
    /// Repeated rejections by the limiter `BanDenial::limiter` (`ban:`).
    Limiter,
    /// A decision of the CrowdSec Local API (`identity.crowdsec`).
    CrowdSec,
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
    /// A browser without a pass sent a method other than GET or HEAD to a
    /// route that challenges it: the request cannot be replayed after the
    /// check, so it is not forwarded, and the page says to reload.
    PassRequired {
        method: String,
    },
    /// A user-agent names a crawler its address's reverse DNS does not
    /// confirm, on a route with `unverified_crawlers: refuse`.
    UnverifiedCrawler,
    /// `access:` refused the client's address.
    Denied,
    /// `auth.basic:` found no valid user; the value is the `WWW-Authenticate` challenge.
    Unauthenticated(HeaderValue),
    /// `respond:` with an error status and no body of its own: the negotiated page or problem+json.
    Responded(StatusCode),
    /// A `redirect` or `rewrite` target built for this request is too long
    /// (a long path repeated by the template).
    TargetTooLong,
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
            Problem::PassRequired { .. } | Problem::UnverifiedCrawler => StatusCode::FORBIDDEN,
            Problem::Denied => StatusCode::FORBIDDEN,
            Problem::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Problem::Responded(status) => *status,
            Problem::TargetTooLong => StatusCode::URI_TOO_LONG,
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
            | Problem::BodyTimeout
            | Problem::PassRequired { .. }
            | Problem::UnverifiedCrawler
            | Problem::Denied
            | Problem::Unauthenticated(_)
            | Problem::TargetTooLong
            // The route answers so by design; the request is what it answers.
            | Problem::Responded(_) => Origin::Downstream,
            // The temp file a large body is set aside in is tollgate's own disk.
            Problem::BodyNotStored => Origin::Internal,
        }
    }

    /// The answer without its request (no request id, problem+json), for a
    /// part that does not see the request whole (a FastCGI upstream's 404).
    /// It carries the problem as [`Unanswered`], so the request's own
    /// phases write it again for the request (`app/upstream.rs`).
    pub fn into_response(self) -> Response<Body> {
        let again = Unanswered(self.clone());
        let mut resp = self.respond(&Answering::default());
        resp.extensions_mut().insert(again);
        resp
    }

    /// The answer: a refusal through the one writer of refusals
    /// (`RateRefusal::respond`), anything else through `Failure::respond`.
    pub fn respond(self, with: &Answering<'_>) -> Response<Body> {
        match self.sort() {
            Sorted::Refusal(r) => r.respond(with),
            Sorted::Failure(f) => f.respond(with),
        }
    }

    /// Which writer answers: a refusal as it is, a failure as its kind
    /// and text ([`Problem::described`]) with the headers or fields some
    /// carry ([`Problem::extras`]).
    fn sort(self) -> Sorted {
        let status = self.status();
        match self {
            Problem::RateLimited(d) => Sorted::Refusal(RateRefusal::Limited(d)),
            Problem::Banned(b) => Sorted::Refusal(RateRefusal::Banned(b)),
            Problem::TooManyUnknownKeys {
                ip_key,
                retry_after,
            } => Sorted::Refusal(RateRefusal::UnknownKeys {
                ip_key,
                retry_after,
            }),
            failure => {
                let mut extras = Failure::new(status, "", Cow::Borrowed(""));
                failure.extras(&mut extras);
                let (kind, detail) = failure.described();
                Sorted::Failure(Failure {
                    kind,
                    detail,
                    ..extras
                })
            }
        }
    }

    /// A failure's `Retry-After`, `Allow`, own field or challenge, for the
    /// few that have one.
    fn extras(&self, f: &mut Failure) {
        match self {
            Problem::BodyTooLarge { limit } => f.field = Some(("max_request_body", *limit)),
            Problem::StoreUnavailable => f.retry_after = Some(1),
            Problem::MethodNotAllowed { .. } => f.allow = Some(ALLOWED_METHODS),
            Problem::UpstreamBusy { retry_after, .. } => {
                f.retry_after = Some((*retry_after).max(1))
            }
            Problem::StaticMethodNotAllowed => f.allow = Some("GET, HEAD"),
            Problem::Unauthenticated(challenge) => f.challenge = Some(challenge.clone()),
            _ => {}
        }
    }

    /// A failure's kind (its `type` URI's last segment) and `detail`: a
    /// route's own answers here, the rest in [`Problem::described_upstream_or_store`]
    /// and [`Problem::described_request`], whose last arms name every variant
    /// answered before it, so a new one does not compile until it has its text.
    fn described(self) -> (&'static str, Cow<'static, str>) {
        match self {
            Problem::PassRequired { method } => (
                "pass-required",
                format!(
                    "This site checks browsers first, and this {method} request came without \
                     the check, so it was not sent on. Load the page again to pass the check, \
                     then send it again."
                )
                .into(),
            ),
            Problem::UnverifiedCrawler => (
                "unverified-crawler",
                "The user-agent names a crawler that this address does not belong to \
                 (neither its network nor its reverse DNS confirms it)."
                    .into(),
            ),
            Problem::Denied => (
                "access-denied",
                "This address may not reach this resource.".into(),
            ),
            Problem::Unauthenticated(_) => (
                "unauthenticated",
                "This resource needs a user name and password.".into(),
            ),
            Problem::Responded(status) => (
                "route-answer",
                status
                    .canonical_reason()
                    .map_or_else(
                        || format!("Status {}.", status.as_u16()),
                        |r| format!("{r}."),
                    )
                    .into(),
            ),
            rest => rest.described_upstream_or_store(),
        }
    }

    /// The kind and text of a failure on tollgate's side of the request
    /// (an upstream, the store, or the temp file a body is stored in); the
    /// rest in [`Problem::described_request`].
    fn described_upstream_or_store(self) -> (&'static str, Cow<'static, str>) {
        match self {
            Problem::UpstreamUnreachable { upstream } => (
                "upstream-unreachable",
                format!("The upstream '{upstream}' could not be reached.").into(),
            ),
            Problem::StoreUnavailable => (
                "store-unavailable",
                "The rate-limit store is unavailable and this proxy fails closed.".into(),
            ),
            Problem::UpstreamTimeout { upstream } => (
                "upstream-timeout",
                format!("The upstream '{upstream}' did not answer in time.").into(),
            ),
            Problem::UpstreamBusy { upstream, .. } => (
                "upstream-busy",
                format!("Every server of the upstream '{upstream}' is busy; try again later.")
                    .into(),
            ),
            Problem::BodyNotStored => (
                "body-not-stored",
                "The request body could not be stored for forwarding.".into(),
            ),
            rest => rest.described_request(),
        }
    }

    /// The kind and text of a failure of the request itself (its form, its
    /// body, or what it names); exhaustive, so every variant the two before
    /// it answer is named here as unreachable.
    fn described_request(self) -> (&'static str, Cow<'static, str>) {
        match self {
            Problem::BadRequest(detail) => ("bad-request", detail.into()),
            Problem::UnknownApiKey(short) => (
                "unknown-api-key",
                format!("The API key '{short}' is not known.").into(),
            ),
            Problem::NoRoute => ("no-route", "No route matches this request.".into()),
            Problem::BodyTooLarge { limit } => (
                "body-too-large",
                format!("The request body exceeds {limit} bytes.").into(),
            ),
            Problem::MethodNotAllowed { method } => (
                "method-not-allowed",
                format!("tollgate does not proxy {method} requests.").into(),
            ),
            Problem::NotImplemented(detail) => ("not-implemented", detail.into()),
            Problem::FileNotFound => ("not-found", "No file at this path.".into()),
            Problem::StaticMethodNotAllowed => (
                "method-not-allowed",
                "A static file answers GET and HEAD only.".into(),
            ),
            Problem::LengthRequired => (
                "length-required",
                "A request body for a PHP script needs a Content-Length.".into(),
            ),
            Problem::BodyTimeout => (
                "body-timeout",
                "The request body arrived too slowly.".into(),
            ),
            Problem::TargetTooLong => (
                "target-too-long",
                "The address this request is sent on to would be too long.".into(),
            ),
            Problem::RateLimited(_) | Problem::Banned(_) | Problem::TooManyUnknownKeys { .. } => {
                unreachable!("a refusal is sorted before it would be described")
            }
            Problem::PassRequired { .. }
            | Problem::UnverifiedCrawler
            | Problem::Denied
            | Problem::Unauthenticated(_)
            | Problem::Responded(_)
            | Problem::UpstreamUnreachable { .. }
            | Problem::StoreUnavailable
            | Problem::UpstreamTimeout { .. }
            | Problem::UpstreamBusy { .. }
            | Problem::BodyNotStored => unreachable!("described before described_request"),
        }
    }
}

/// A problem answered by [`Problem::into_response`], kept in its response's
/// extensions so the request's phases can answer it again with the request.
#[derive(Debug, Clone)]
pub struct Unanswered(pub Problem);

/// What an answer is written with besides the problem itself.
#[derive(Clone, Copy, Default)]
pub struct Answering<'a> {
    /// Named in every body (the app sends it as `X-Request-Id` too).
    pub request_id: Option<&'a str>,
    /// A limiter's or route's `reject`: a refusal's status and body.
    pub shape: Option<&'a RejectShape>,
    /// The route's limiters after this request: a refusal by them carries the rate-limit headers.
    pub limits: Option<LimitHeaders<'a>>,
    /// problem+json or a page, as the client's `Accept` and the config say.
    pub negotiation: Negotiation<'a>,
}

impl Answering<'_> {
    /// The body: the client's page (the operator's for `status`, else the
    /// built-in one saying `detail`), or problem+json from `json`.
    fn body(
        &self,
        fill: &Fill<'_>,
        detail: impl FnOnce() -> String,
        json: impl FnOnce() -> Vec<u8>,
    ) -> Response<Body> {
        let Negotiation::Page(pages) = self.negotiation else {
            return problem_json(fill.status, json());
        };
        let text = match pages.get(fill.status) {
            Some(template) => page::fill(template, fill),
            None => page::error(&detail(), fill),
        };
        html(fill.status, text)
    }

    /// `Vary: Accept` when the body followed the client's `Accept`.
    fn vary(&self, headers: &mut http::HeaderMap) {
        if self.negotiation.varies() {
            headers.insert(VARY, HeaderValue::from_static("accept"));
        }
    }
}

/// A problem sorted by the writer that answers it.
enum Sorted {
    Refusal(RateRefusal),
    Failure(Failure),
}

/// A request refused for its rate: a limiter's 429 (its window, bucket,
/// queue or concurrency slots are full), a ban, or an IP probing unknown
/// keys. All of them, and the 503 or 403 a `reject` or `ban` may choose
/// instead, are written by [`RateRefusal::respond`], body and headers, so a
/// header added there reaches every kind.
enum RateRefusal {
    Limited(Box<Denial>),
    Banned(Box<BanDenial>),
    UnknownKeys { ip_key: String, retry_after: Nanos },
}

impl RateRefusal {
    /// The one writer of refusals: the `reject` page, or the negotiated
    /// page or problem+json, then the headers every refusal carries.
    fn respond(self, with: &Answering<'_>) -> Response<Body> {
        let status = self.status(with.shape);
        let secs = ceil_secs(self.retry_after()).max(1);
        let request_id = with.request_id;
        let fill = Fill {
            status,
            retry_after: Some(secs),
            limiter: self.limiter(),
            request_id,
        };
        let mut resp = match shaped(with.shape, &fill) {
            Some(resp) => resp,
            None => {
                let mut resp = with.body(
                    &fill,
                    || self.detail(),
                    || self.body(status, secs, request_id),
                );
                with.vary(resp.headers_mut());
                resp
            }
        };
        let h = resp.headers_mut();
        // Sized once for everything that follows, the app's X-Request-Id included.
        h.reserve(crate::reject::LIMIT_HEADERS);
        h.insert(RETRY_AFTER, crate::header_value::number(secs));
        // A 429 must not be stored by a cache (RFC 6585 §4), nor may a ban's
        // 403 outlive the ban: said outright, for caches told to keep everything.
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(limits) = &with.limits {
            limits.write(h);
        }
        resp
    }

    /// A limiter's refusal takes the `reject` status; a ban has its own (429 or 403).
    fn status(&self, shape: Option<&RejectShape>) -> StatusCode {
        match self {
            RateRefusal::Limited(_) => shape.map_or(StatusCode::TOO_MANY_REQUESTS, |s| s.status),
            RateRefusal::Banned(b) => b.status,
            RateRefusal::UnknownKeys { .. } => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    fn retry_after(&self) -> Nanos {
        match self {
            RateRefusal::Limited(d) => d.retry_after,
            RateRefusal::Banned(b) => b.retry_after,
            RateRefusal::UnknownKeys { retry_after, .. } => *retry_after,
        }
    }

    /// The limiter a `reject` template names (none for unknown keys, which have no page).
    fn limiter(&self) -> &str {
        match self {
            RateRefusal::Limited(d) => &d.limiter,
            RateRefusal::Banned(b) => &b.limiter,
            RateRefusal::UnknownKeys { .. } => "",
        }
    }

    /// The sentence a problem+json body's `detail` holds (and a page shows).
    fn detail(&self) -> String {
        match self {
            RateRefusal::Limited(d) => {
                format!("Rate limit of {} exceeded for key '{}'.", d.policy, d.key)
            }
            RateRefusal::Banned(b) => match b.source {
                BanSource::Limiter => format!(
                    "Key '{}' is banned until {} after repeated rejections by '{}'.",
                    b.key,
                    crate::clock::iso8601(b.until.div_ceil(NANOS_PER_SEC)),
                    b.limiter
                ),
                BanSource::CrowdSec => format!(
                    "Address '{}' is banned until {} by a CrowdSec decision.",
                    b.key,
                    crate::clock::iso8601(b.until.div_ceil(NANOS_PER_SEC)),
                ),
            },
            RateRefusal::UnknownKeys { ip_key, .. } => {
                format!("Too many unknown API keys from '{ip_key}'; try again later.")
            }
        }
    }

    /// The problem+json body.
    fn body(&self, status: StatusCode, secs: u64, request_id: Option<&str>) -> Vec<u8> {
        let title = status.canonical_reason().unwrap_or("Error");
        let mut v = match self {
            // The hot reject path: written straight into one buffer (see `reject`), no serializer.
            RateRefusal::Limited(d) => {
                return crate::reject::problem_body(d, status, title, secs, request_id)
            }
            RateRefusal::Banned(b) => {
                let mut v = base("client-banned", title, status, &self.detail());
                v["limiter"] = json!(&*b.limiter);
                v["banned_until"] = json!(b.until.div_ceil(NANOS_PER_SEC));
                v["retry_after"] = json!(secs);
                v
            }
            RateRefusal::UnknownKeys { .. } => {
                base("unknown-api-keys-exceeded", title, status, &self.detail())
            }
        };
        if let Some(id) = request_id {
            v["request_id"] = json!(id);
        }
        v.to_string().into_bytes()
    }
}

/// Any other answer tollgate writes itself: a problem+json body of `kind`,
/// and the headers its status needs.
struct Failure {
    status: StatusCode,
    kind: &'static str,
    detail: Cow<'static, str>,
    retry_after: Option<u64>,
    /// The methods a 405 lists in `Allow`.
    allow: Option<&'static str>,
    /// A number of its own besides the standard fields (`max_request_body`).
    field: Option<(&'static str, u64)>,
    /// A 401's `WWW-Authenticate`.
    challenge: Option<HeaderValue>,
}

impl Failure {
    fn new(status: StatusCode, kind: &'static str, detail: Cow<'static, str>) -> Failure {
        Failure {
            status,
            kind,
            detail,
            retry_after: None,
            allow: None,
            field: None,
            challenge: None,
        }
    }

    fn respond(self, with: &Answering<'_>) -> Response<Body> {
        let status = self.status;
        let fill = Fill {
            status,
            retry_after: self.retry_after,
            limiter: "",
            request_id: with.request_id,
        };
        let json = || {
            let title = status.canonical_reason().unwrap_or("Error");
            let mut body = base(self.kind, title, status, &self.detail);
            if let Some((name, n)) = self.field {
                body[name] = json!(n);
            }
            if let Some(id) = with.request_id {
                body["request_id"] = json!(id);
            }
            body.to_string().into_bytes()
        };
        let mut resp = with.body(&fill, || self.detail.to_string(), json);
        let h = resp.headers_mut();
        with.vary(h);
        if let Some(secs) = self.retry_after {
            h.insert(RETRY_AFTER, crate::header_value::number(secs));
        }
        if let Some(methods) = self.allow {
            h.insert(http::header::ALLOW, HeaderValue::from_static(methods));
        }
        if let Some(challenge) = self.challenge {
            h.insert(http::header::WWW_AUTHENTICATE, challenge);
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of the body is still on its way: the connection cannot carry another request.
            h.insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// A rejection as the `reject` page or template asks, whatever the client
/// accepts (`None`: the negotiated page or problem+json).
fn shaped(shape: Option<&RejectShape>, fill: &Fill<'_>) -> Option<Response<Body>> {
    match &shape?.body {
        RejectBody::Html => Some(html(fill.status, page::attempts(fill))),
        RejectBody::Template { text, content_type } => {
            let mut resp = html(fill.status, page::fill(text, fill));
            if let Ok(v) = HeaderValue::from_str(content_type) {
                resp.headers_mut().insert(CONTENT_TYPE, v);
            }
            Some(resp)
        }
        RejectBody::Problem => None,
    }
}

/// Every page tollgate answers with is finished here: status and media type.
fn html(status: StatusCode, text: String) -> Response<Body> {
    own_answer(status, text.into_bytes(), page::CONTENT_TYPE)
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
        format!("{}\n", base("admin-error", title, status, detail)).into_bytes(),
    )
}

/// Every problem+json response is finished here: status and media type.
fn problem_json(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    own_answer(
        status,
        body,
        HeaderValue::from_static("application/problem+json"),
    )
}

/// Headers an answer of ours may carry: its type, `Vary` and what
/// [`RateRefusal::respond`] adds (the app's `X-Request-Id` included).
const OWN_HEADERS: usize = 2 + crate::reject::LIMIT_HEADERS;

/// An answer of ours: `body` handed to `Bytes` without a second allocation
/// (see [`crate::header_value::exact`]), and a header map sized once for
/// every header a refusal adds, so it is not grown and rehashed on the way.
fn own_answer(status: StatusCode, body: Vec<u8>, content_type: HeaderValue) -> Response<Body> {
    let mut resp = Response::new(Body::full(bytes::Bytes::from(body.into_boxed_slice())));
    *resp.status_mut() = status;
    let mut headers = http::HeaderMap::with_capacity(OWN_HEADERS);
    headers.insert(CONTENT_TYPE, content_type);
    *resp.headers_mut() = headers;
    resp
}

#[cfg(test)]
mod tests;
