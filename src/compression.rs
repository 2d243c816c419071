//! The response filter phase: gzip or brotli for text answers (proxied, FastCGI, static, our own), by negotiation.
//!
//! Rules, in the order [`filter`] applies them:
//! - `server.compression: false` or the route's `compression: false` ends it
//!   (nothing is changed, not even `Vary`; the request carries [`Off`] so
//!   a static file's precompressed sibling is not sent either);
//! - only types that compress ([`compressible_type`]): text, JSON, JS, XML,
//!   SVG, fonts that are not already compressed; never images, video, audio
//!   or archives;
//! - never a response that already has a `Content-Encoding`, a
//!   `Content-Range` (a 206), `Cache-Control: no-transform`, or a status
//!   without a body (1xx, 204, 304);
//! - from here the answer depends on `Accept-Encoding`, so it gets
//!   `Vary: Accept-Encoding` whether or not it is compressed this time;
//! - the best coding the client accepts (q-values, `*`), brotli on a tie;
//! - not when the length known ahead (`Content-Length`, or the size of a
//!   body held whole, as our own answers are) is under [`MIN_LENGTH`] (the
//!   headers of a compressed answer would eat the gain), unless the client
//!   refused `identity`;
//! - then `Content-Length` goes (the length is not known ahead),
//!   `Accept-Ranges` goes (ranges of the compressed bytes are not offered),
//!   a strong `ETag` becomes weak (the bytes differ from the identity
//!   representation's), and the body is wrapped ([`stream::Encoded`]).

pub mod negotiate;
pub mod stream;

use std::sync::atomic::Ordering;

use http::header::{
    HeaderValue, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE,
    CONTENT_TYPE, ETAG, VARY,
};
use http::{HeaderMap, Response, StatusCode};

use crate::body::{Body, Forwarded};
use crate::header_value::lists;
use crate::metrics::{Counter, Metrics};
pub use negotiate::{Accepted, Coding};

/// Responses shorter than this (by [`known_length`]) go out as they are:
/// Caddy's default, and where gzip's 18-byte frame and the headers stop
/// mattering.
pub const MIN_LENGTH: u64 = 512;

/// The `Vary` elements that already say an answer depends on `Accept-Encoding`.
pub const VARIES_BY_CODING: &[&str] = &["*", "accept-encoding"];

/// Set on a request (as an extension) whose route has compression off:
/// its answer carries no `Content-Encoding` made by tollgate, so a static
/// file's precompressed sibling (`app.js.br`) is not sent either. One
/// switch for both, because the reasons to turn compression off (BREACH on
/// a page that mixes secrets with reflected input; a client or cache that
/// mishandles encodings; debugging) are about what goes on the wire, not
/// about where the compressed bytes came from.
#[derive(Debug, Clone, Copy)]
pub struct Off;

/// What the request says for the filter: its codings, and whether it is a HEAD.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    pub accepted: Accepted,
    pub head: bool,
}

impl Asked {
    pub fn of(req: &http::Request<impl Sized>) -> Asked {
        Asked {
            accepted: Accepted::from_headers(req.headers()),
            head: req.method() == http::Method::HEAD,
        }
    }
}

/// Whether answers on route `route` (None: no route matched) may be compressed.
pub fn enabled(config: &crate::config::Config, route: Option<usize>) -> bool {
    config.server.compression && route.is_none_or(|i| config.routes[i].compression)
}

/// Compresses `resp` if the rules above allow; `enabled` is the server's
/// switch and the route's together.
pub fn filter(
    enabled: bool,
    asked: Asked,
    metrics: &Metrics,
    mut resp: Response<Body>,
) -> Response<Body> {
    if !enabled {
        return resp;
    }
    if resp.status() == StatusCode::NOT_MODIFIED {
        if let Some(spared) = resp.extensions().get::<Spared>().copied() {
            as_its_200(asked, spared, resp.headers_mut());
        }
        return resp;
    }
    let Some(varied) = eligible(resp.status(), resp.headers()) else {
        return resp;
    };
    if !varied {
        resp.headers_mut()
            .append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    let Some(coding) = chosen(asked, || known_length(&resp)) else {
        return resp;
    };
    let headers = resp.headers_mut();
    headers.remove(CONTENT_LENGTH);
    headers.remove(ACCEPT_RANGES);
    headers.insert(CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    weaken_etag(headers);
    let counts = Counts::new(metrics, coding);
    crate::metrics::inc(&counts.responses);
    if asked.head {
        // The same headers a GET gets, and no body to encode.
        return resp;
    }
    resp.map(|body| {
        let encoded = stream::Encoded::new(body, coding, counts);
        Body::upstream(
            Forwarded::Streamed(http_body_util::combinators::BoxBody::new(encoded)),
            None,
        )
    })
}

/// The coding an answer of `length` (when known ahead) gets: the best the
/// client accepts, unless the answer is shorter than [`MIN_LENGTH`] and the
/// client did not refuse `identity`. The length is asked only once a coding
/// is accepted: a client that accepts none (an API client, a bot) costs no
/// `Content-Length` lookup.
fn chosen(asked: Asked, length: impl FnOnce() -> Option<u64>) -> Option<Coding> {
    let coding = asked.accepted.best()?;
    let short = length().is_some_and(|l| l < MIN_LENGTH);
    (!short || asked.accepted.identity_refused).then_some(coding)
}

/// Set on a `304` (as an extension) by whoever answered it, saying what its
/// `200` would have been: the identity representation's type and length.
/// A `304` carries the validators its `200` would (RFC 9110 §15.4.5), and
/// that `200` would have been compressed here, its strong `ETag` weakened:
/// a client revalidating with `W/"x"` must get `W/"x"` back, not `"x"`.
#[derive(Debug, Clone, Copy)]
pub struct Spared {
    pub content_type: &'static str,
    pub length: u64,
}

/// Gives a `304` the `Vary` and `ETag` the `200` it spares would have had.
fn as_its_200(asked: Asked, spared: Spared, headers: &mut HeaderMap) {
    if !compressible_type(spared.content_type) {
        return;
    }
    let no_transform = headers
        .get_all(CACHE_CONTROL)
        .iter()
        .any(|v| lists(v, &["no-transform"]));
    if no_transform {
        return;
    }
    let varied = headers
        .get_all(VARY)
        .iter()
        .any(|v| lists(v, VARIES_BY_CODING));
    if !varied {
        headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    if chosen(asked, || Some(spared.length)).is_some() {
        weaken_etag(headers);
    }
}

/// Everything but the client's codings: status, type, existing coding,
/// no-transform. `None` when the answer is not for compressing; else
/// whether its `Vary` already names `Accept-Encoding` (or is `*`).
///
/// One pass over the headers, not a lookup per name: an answer has a dozen
/// headers or fewer, and five hashed lookups (plus `Vary`'s) cost ~600
/// instructions on every answer, each 429 included (callgrind).
fn eligible(status: StatusCode, headers: &HeaderMap) -> Option<bool> {
    if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status == StatusCode::PARTIAL_CONTENT
    {
        return None;
    }
    let mut content_type = None;
    let mut varied = false;
    for (name, value) in headers {
        if name == CONTENT_ENCODING || name == CONTENT_RANGE {
            return None;
        }
        if name == CACHE_CONTROL && lists(value, &["no-transform"]) {
            return None;
        }
        if name == VARY {
            varied |= lists(value, VARIES_BY_CODING);
        }
        if name == CONTENT_TYPE && content_type.is_none() {
            content_type = Some(value);
        }
    }
    let compressible = content_type
        .and_then(|t| t.to_str().ok())
        .is_some_and(compressible_type);
    compressible.then_some(varied)
}

/// Whether a `Content-Type` is worth compressing: text and the text-like
/// application types; never images (but SVG), audio, video or archives,
/// which are compressed already. `text/event-stream` is left alone: each
/// event would be flushed on its own, and a stream open for hours would
/// hold an encoder for hours.
pub fn compressible_type(content_type: &str) -> bool {
    // Bytes, not `str` patterns: this runs on every answer, our 429s
    // included, and splitting and trimming the `str` cost ~580 instructions
    // for `application/problem+json` (callgrind). The types asked about
    // are header values or the MIME table's: ASCII, so ASCII trimming is
    // the whole of trimming.
    let ct = content_type.as_bytes();
    // tollgate's own answers (every 429 and page) carry one of these two,
    // spelled as written here: one comparison, not a parse (~330
    // instructions of a 429, callgrind).
    if ct == b"application/problem+json" || ct == b"text/html; charset=utf-8" {
        return true;
    }
    let essence = ct
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let Some(slash) = essence.iter().position(|&b| b == b'/') else {
        return false;
    };
    let (kind, sub) = (&essence[..slash], &essence[slash + 1..]);
    // Compared without case, as media types are, and without a lowercased copy.
    let is = |a: &[u8], b: &str| a.eq_ignore_ascii_case(b.as_bytes());
    let ends = |s: &[u8], suffix: &str| {
        s.len() >= suffix.len() && is(&s[s.len() - suffix.len()..], suffix)
    };
    if is(kind, "text") {
        !is(sub, "event-stream")
    } else if is(kind, "application") {
        const TEXT_LIKE: [&str; 12] = [
            "json",
            "javascript",
            "x-javascript",
            "ecmascript",
            "xml",
            "wasm",
            "x-httpd-php",
            "graphql-response+json",
            "vnd.ms-fontobject",
            "x-font-ttf",
            "x-font-otf",
            "manifest+json",
        ];
        ends(sub, "+json") || ends(sub, "+xml") || TEXT_LIKE.iter().any(|t| is(sub, t))
    } else if is(kind, "image") {
        is(sub, "svg+xml")
    } else if is(kind, "font") {
        is(sub, "ttf") || is(sub, "otf")
    } else {
        false
    }
}

/// The answer's length when it is known before its body is sent: its
/// `Content-Length`, or else the size of a body held whole. Our own answers
/// (a 429's problem+json, a page) carry no `Content-Length` header (hyper
/// writes it from the body), and were once compressed however short: every
/// refused browser paid for an encoder and got a chunked 429. A streamed
/// body's own size hint is not asked: an upstream's answer to HEAD has an
/// empty body and must get the headers its GET would.
fn known_length(resp: &Response<Body>) -> Option<u64> {
    let declared = resp
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    declared.or_else(|| resp.body().held_len())
}

/// `"x"` → `W/"x"`: the compressed bytes are not the identity bytes, so a
/// strong validator (which If-Range and byte ranges trust) must not claim them.
pub fn weaken_etag(headers: &mut HeaderMap) {
    let Some(tag) = headers.get(ETAG) else { return };
    if tag.as_bytes().starts_with(b"\"") {
        let mut weak = b"W/".to_vec();
        weak.extend_from_slice(tag.as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&weak) {
            headers.insert(ETAG, v);
        }
    }
}

/// Creates every compression series at 0, so the first scrape shows them.
pub fn register(metrics: &Metrics) {
    for coding in Coding::ALL {
        let _ = Counts::new(metrics, coding);
    }
}

/// `tollgate_compressed_responses_total{encoding}` and
/// `tollgate_compression_bytes_total{encoding,direction}` of one response.
pub struct Counts {
    responses: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
}

impl Counts {
    fn new(metrics: &Metrics, coding: Coding) -> Counts {
        let encoding = coding.token();
        let bytes = |direction| {
            metrics.counter(
                "tollgate_compression_bytes_total",
                &[("encoding", encoding), ("direction", direction)],
            )
        };
        Counts {
            responses: metrics.counter(
                "tollgate_compressed_responses_total",
                &[("encoding", encoding)],
            ),
            bytes_in: bytes("in"),
            bytes_out: bytes("out"),
        }
    }

    fn read(&self, n: usize) {
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn wrote(&self, n: usize) {
        self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_types_compress_and_media_never_does() {
        for t in [
            "text/html; charset=utf-8",
            "text/css",
            "text/javascript",
            "application/json",
            "application/problem+json",
            "application/javascript",
            "application/xml",
            "application/rss+xml",
            "image/svg+xml",
            "font/ttf",
            // Media types compare without case.
            "Text/HTML; charset=UTF-8",
            "APPLICATION/LD+JSON",
            "Image/SVG+XML",
            // Parameters and the spaces around them are not the type.
            " application/json ; charset=utf-8",
            "text/plain;charset=utf-8",
        ] {
            assert!(compressible_type(t), "{t}");
        }
        for t in [
            "image/png",
            "image/jpeg",
            "video/mp4",
            "video/webm",
            "audio/mpeg",
            "application/zip",
            "application/gzip",
            "application/octet-stream",
            "font/woff2",
            "text/event-stream",
            "Text/Event-Stream",
            "application/json-seq",
            "",
            "garbage",
        ] {
            assert!(!compressible_type(t), "{t}");
        }
    }

    #[test]
    fn vary_is_added_once_and_a_strong_etag_is_weakened() {
        let asked = Asked {
            accepted: Accepted::default(),
            head: false,
        };
        let metrics = Metrics::default();
        let mut resp = Response::new(Body::full("text"));
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert(VARY, HeaderValue::from_static("Cookie"));
        let resp = filter(true, asked, &metrics, resp);
        let mut resp = filter(true, asked, &metrics, resp);
        let vary: Vec<_> = resp.headers().get_all(VARY).iter().collect();
        assert_eq!(vary, ["Cookie", "Accept-Encoding"]);
        let h = resp.headers_mut();
        h.remove(VARY);
        h.insert(VARY, HeaderValue::from_static("Origin, *"));
        let resp = filter(true, asked, &metrics, resp);
        let vary: Vec<_> = resp.headers().get_all(VARY).iter().collect();
        assert_eq!(
            vary,
            ["Origin, *"],
            "`Vary: *` covers Accept-Encoding already"
        );
        let mut h = HeaderMap::new();
        h.insert(ETAG, HeaderValue::from_static("\"5f-1a\""));
        weaken_etag(&mut h);
        assert_eq!(h[ETAG], "W/\"5f-1a\"");
        weaken_etag(&mut h);
        assert_eq!(h[ETAG], "W/\"5f-1a\"", "a weak tag stays as it is");
    }
}
