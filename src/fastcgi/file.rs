//! Static files as nginx serves them: ETag and Last-Modified, conditional requests (304, 412), one byte range (206, 416), Cache-Control by type, HEAD, precompressed siblings.

use std::io::SeekFrom;
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use tokio::io::AsyncSeekExt;

use super::path::StaticFile;
use crate::body::{BoxError, FileChunks, Streamed};
use crate::compression::Coding;
use crate::problem::Problem;

/// `Cache-Control` of a static file when the upstream sets none
/// (`cache_control:`): text (HTML, CSS, JS, JSON…) is revalidated on every
/// use, so a deploy shows at once (legacy sites rarely version their asset
/// URLs) and a revisit costs a 304; images, fonts and media are kept an
/// hour without asking.
pub fn default_cache_control(content_type: &str) -> &'static str {
    if crate::compression::compressible_type(content_type) {
        "no-cache"
    } else {
        "max-age=3600"
    }
}

/// What is sent: the file itself or its precompressed sibling.
pub struct Variant {
    pub file: StaticFile,
    /// The sibling's coding (`app.js.br`), None for the file itself.
    pub coding: Option<Coding>,
    /// Whether the type has siblings worth asking for (the answer varies by `Accept-Encoding`).
    pub negotiated: bool,
}

/// Answers a GET or HEAD for `variant` with the request's `headers`
/// (conditional and range headers); `cache_control` overrides the default by type.
pub async fn serve(
    method: &Method,
    headers: &HeaderMap,
    variant: Variant,
    cache_control: Option<&str>,
) -> Response<Streamed> {
    if method != Method::GET && method != Method::HEAD {
        return problem(Problem::StaticMethodNotAllowed);
    }
    let file = &variant.file;
    let validators = Validators::of(file);
    let mut head = caching_head(&variant, &validators, cache_control);
    match validators.preconditions(headers) {
        Precondition::Proceed => {}
        Precondition::NotModified => return not_modified(&variant, head),
        Precondition::Failed => return bare(StatusCode::PRECONDITION_FAILED, HeaderMap::new()),
    }
    content_head(&mut head, &variant);
    let (status, start, count) = match range_asked(method, headers, &validators, file.len) {
        ByteRange::Whole => (StatusCode::OK, 0, file.len),
        ByteRange::Part { first, last } => {
            let content_range = format!("bytes {first}-{last}/{}", file.len);
            head.insert(header::CONTENT_RANGE, digits(&content_range));
            (StatusCode::PARTIAL_CONTENT, first, last - first + 1)
        }
        ByteRange::Unsatisfiable => {
            let mut h = HeaderMap::new();
            h.insert(
                header::CONTENT_RANGE,
                digits(&format!("bytes */{}", file.len)),
            );
            return bare(StatusCode::RANGE_NOT_SATISFIABLE, h);
        }
    };
    head.insert(header::CONTENT_LENGTH, crate::header_value::number(count));
    let body = if method == Method::HEAD {
        empty()
    } else {
        match open_at(file, start, count).await {
            Some(body) => body,
            None => return problem(Problem::FileNotFound),
        }
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = head;
    resp
}

/// The validators and caching headers: what a `304` carries as well as its `200`.
fn caching_head(
    variant: &Variant,
    validators: &Validators,
    cache_control: Option<&str>,
) -> HeaderMap {
    let file = &variant.file;
    let mut head = HeaderMap::new();
    head.insert(header::ETAG, validators.etag.clone());
    head.insert(header::LAST_MODIFIED, validators.last_modified.clone());
    let cache_control = cache_control.unwrap_or_else(|| default_cache_control(file.content_type));
    if let Ok(v) = HeaderValue::from_str(cache_control) {
        head.insert(header::CACHE_CONTROL, v);
    }
    if variant.negotiated {
        head.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    head
}

/// The headers that describe the bytes sent, which a `304` does not carry:
/// type, `nosniff`, ranges accepted, and a sibling's coding.
fn content_head(head: &mut HeaderMap, variant: &Variant) {
    head.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(variant.file.content_type),
    );
    head.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    head.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some(coding) = variant.coding {
        head.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(coding.token()),
        );
    }
}

/// The range a GET asks for and may have (`If-Range` holds); the whole
/// file for a HEAD or without one.
fn range_asked(
    method: &Method,
    headers: &HeaderMap,
    validators: &Validators,
    len: u64,
) -> ByteRange {
    match headers.get(header::RANGE) {
        Some(r) if method == Method::GET && validators.if_range_holds(headers) => {
            ByteRange::parse(r.as_bytes(), len)
        }
        _ => ByteRange::Whole,
    }
}

/// A `304` with the validators and caching headers its `200` would carry.
fn not_modified(variant: &Variant, head: HeaderMap) -> Response<Streamed> {
    let mut resp = bare(StatusCode::NOT_MODIFIED, head);
    // The compression filter gives it the ETag its 200 would have had
    // (weak, when that 200 would be compressed on the fly); a precompressed
    // sibling's 200 is not, and its tag is its own.
    if variant.coding.is_none() {
        resp.extensions_mut().insert(crate::compression::Spared {
            content_type: variant.file.content_type,
            length: variant.file.len,
        });
    }
    resp
}

/// `count` bytes of the file from `start`; None if it went away meanwhile.
async fn open_at(file: &StaticFile, start: u64, count: u64) -> Option<Streamed> {
    let mut f = tokio::fs::File::open(&file.file).await.ok()?;
    if start > 0 {
        f.seek(SeekFrom::Start(start)).await.ok()?;
    }
    Some(Streamed::new(FileChunks::new(f, count)))
}

/// A header value made of ASCII text we formatted ourselves.
fn digits(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).expect("ASCII")
}

/// `301` to the directory's slash form, the query kept (`/admin?x=1` →
/// `/admin/?x=1`): `path` is the directory as the root resolved it (decoded,
/// dot segments walked), never the raw request path, so `//evil.example/../docs`
/// is sent to `/docs/` (see [`crate::location`]).
pub fn redirect_to_directory(path: &str, query: Option<&str>) -> Response<Streamed> {
    let mut h = HeaderMap::new();
    match crate::location::local_decoded(&format!("{path}/"), query) {
        Some(v) => h.insert(header::LOCATION, v),
        None => return problem(Problem::FileNotFound),
    };
    bare(StatusCode::MOVED_PERMANENTLY, h)
}

fn problem(p: Problem) -> Response<Streamed> {
    p.into_response().map(Streamed::new)
}

fn empty() -> Streamed {
    Streamed::new(Empty::<Bytes>::new().map_err(|never| -> BoxError { match never {} }))
}

/// A status with headers and no body.
fn bare(status: StatusCode, headers: HeaderMap) -> Response<Streamed> {
    let mut resp = Response::new(empty());
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    if status != StatusCode::NOT_MODIFIED {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(0));
    }
    resp
}

/// What a conditional request gets (RFC 9110 §13.2.2, in its order).
#[derive(Debug, PartialEq, Eq)]
enum Precondition {
    Proceed,
    NotModified,
    Failed,
}

/// A file's validators: a strong ETag (mtime in ns and size, as nginx's
/// mtime-size, finer) and Last-Modified (whole seconds).
struct Validators {
    etag: HeaderValue,
    last_modified: HeaderValue,
    /// Last-Modified in whole seconds since the epoch.
    modified_secs: u64,
}

impl Validators {
    fn of(file: &StaticFile) -> Validators {
        let since = file.modified.duration_since(UNIX_EPOCH).unwrap_or_default();
        let etag = format!(
            "\"{:x}{:08x}-{:x}\"",
            since.as_secs(),
            since.subsec_nanos(),
            file.len
        );
        let secs = UNIX_EPOCH + std::time::Duration::from_secs(since.as_secs());
        Validators {
            etag: HeaderValue::from_str(&etag).expect("hex digits"),
            last_modified: HeaderValue::from_str(&httpdate::fmt_http_date(secs))
                .expect("an HTTP date"),
            modified_secs: since.as_secs(),
        }
    }

    fn preconditions(&self, headers: &HeaderMap) -> Precondition {
        let tag = opaque(self.etag.as_bytes());
        if let Some(im) = headers.get(header::IF_MATCH) {
            // Strong comparison: a weak tag never matches.
            let ok = list_matches(im.as_bytes(), |t| !is_weak(t) && opaque(t) == tag);
            if !ok {
                return Precondition::Failed;
            }
        } else if let Some(since) = date(headers.get(header::IF_UNMODIFIED_SINCE)) {
            if self.modified_secs > since {
                return Precondition::Failed;
            }
        }
        if let Some(inm) = headers.get(header::IF_NONE_MATCH) {
            // Weak comparison: `W/"x"` (what a compressed answer carried) matches `"x"`.
            if list_matches(inm.as_bytes(), |t| opaque(t) == tag) {
                return Precondition::NotModified;
            }
        } else if let Some(since) = date(headers.get(header::IF_MODIFIED_SINCE)) {
            if self.modified_secs <= since {
                return Precondition::NotModified;
            }
        }
        Precondition::Proceed
    }

    /// `If-Range`: the range applies only if the client's copy is this one
    /// (a strong ETag, or exactly this Last-Modified); otherwise the whole file.
    fn if_range_holds(&self, headers: &HeaderMap) -> bool {
        let Some(v) = headers.get(header::IF_RANGE) else {
            return true;
        };
        let v = v.as_bytes();
        if v.starts_with(b"\"") || v.starts_with(b"W/") {
            !is_weak(v) && v == self.etag.as_bytes()
        } else {
            v == self.last_modified.as_bytes()
        }
    }
}

/// Whether `*` or one tag of a comma-separated list satisfies `matches`.
fn list_matches(list: &[u8], matches: impl Fn(&[u8]) -> bool) -> bool {
    list.split(|b| *b == b',')
        .map(trim)
        .any(|t| t == b"*" || matches(t))
}

fn trim(mut b: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = b {
        if !first.is_ascii_whitespace() {
            break;
        }
        b = rest;
    }
    while let [rest @ .., last] = b {
        if !last.is_ascii_whitespace() {
            break;
        }
        b = rest;
    }
    b
}

fn is_weak(tag: &[u8]) -> bool {
    tag.starts_with(b"W/")
}

/// A tag without its weakness marker.
fn opaque(tag: &[u8]) -> &[u8] {
    tag.strip_prefix(b"W/").unwrap_or(tag)
}

/// An HTTP date header in whole seconds since the epoch; None if absent or malformed (then ignored, as RFC 9110 says).
fn date(v: Option<&HeaderValue>) -> Option<u64> {
    let t = httpdate::parse_http_date(v?.to_str().ok()?).ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_secs())
}

/// What a `Range` header asks of a file `len` bytes long.
#[derive(Debug, PartialEq, Eq)]
enum ByteRange {
    /// No range, one we do not serve (several ranges, another unit) or a
    /// malformed one: the whole file, 200, as RFC 9110 allows.
    Whole,
    /// Bytes `first..=last`: 206.
    Part { first: u64, last: u64 },
    /// Starts past the end: 416.
    Unsatisfiable,
}

impl ByteRange {
    fn parse(v: &[u8], len: u64) -> ByteRange {
        let Some(spec) = std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().strip_prefix("bytes="))
        else {
            return ByteRange::Whole;
        };
        if spec.contains(',') {
            return ByteRange::Whole;
        }
        let Some((a, b)) = spec.trim().split_once('-') else {
            return ByteRange::Whole;
        };
        let num = |s: &str| -> Option<u64> {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        match (num(a), num(b), a.is_empty()) {
            // `-n`: the last n bytes.
            (None, Some(n), true) => {
                if n == 0 || len == 0 {
                    ByteRange::Unsatisfiable
                } else {
                    ByteRange::Part {
                        first: len - n.min(len),
                        last: len - 1,
                    }
                }
            }
            (Some(first), last, false) if b.is_empty() || last.is_some() => {
                if last.is_some_and(|l| l < first) {
                    return ByteRange::Whole;
                }
                if first >= len {
                    return ByteRange::Unsatisfiable;
                }
                let last = last.map_or(len - 1, |l| l.min(len - 1));
                ByteRange::Part { first, last }
            }
            _ => ByteRange::Whole,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// A file's modification time as the tests set it.
    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_secs(secs)
    }

    fn file(len: u64) -> StaticFile {
        StaticFile {
            file: "/x/app.js".into(),
            content_type: "text/javascript; charset=utf-8",
            len,
            modified: at(1_767_225_600),
        }
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn ranges_parse_as_rfc_9110_reads_them() {
        use ByteRange::*;
        let p = |s: &str| ByteRange::parse(s.as_bytes(), 100);
        assert_eq!(p("bytes=0-9"), Part { first: 0, last: 9 });
        assert_eq!(
            p("bytes=90-"),
            Part {
                first: 90,
                last: 99
            }
        );
        assert_eq!(
            p("bytes=90-500"),
            Part {
                first: 90,
                last: 99
            }
        );
        assert_eq!(
            p("bytes=-10"),
            Part {
                first: 90,
                last: 99
            }
        );
        assert_eq!(p("bytes=-500"), Part { first: 0, last: 99 });
        assert_eq!(p("bytes=100-"), Unsatisfiable);
        assert_eq!(p("bytes=-0"), Unsatisfiable);
        assert_eq!(p("bytes=0-1,5-6"), Whole, "several ranges: the whole file");
        assert_eq!(p("bytes=9-0"), Whole);
        assert_eq!(p("items=0-1"), Whole);
        assert_eq!(p("bytes=a-b"), Whole);
        assert_eq!(p("bytes=-"), Whole);
        assert_eq!(ByteRange::parse(b"bytes=0-", 0), Unsatisfiable);
    }

    #[test]
    fn conditional_headers_are_read_in_rfc_order() {
        let v = Validators::of(&file(10));
        let tag = v.etag.to_str().unwrap().to_string();
        let lm = v.last_modified.to_str().unwrap().to_string();
        let weak = format!("W/{tag}");
        use Precondition::*;
        let pre = |h: &[(header::HeaderName, &str)]| v.preconditions(&headers(h));
        assert_eq!(pre(&[]), Proceed);
        assert_eq!(pre(&[(header::IF_NONE_MATCH, &tag)]), NotModified);
        assert_eq!(pre(&[(header::IF_NONE_MATCH, &weak)]), NotModified);
        assert_eq!(pre(&[(header::IF_NONE_MATCH, "\"other\", *")]), NotModified);
        assert_eq!(pre(&[(header::IF_NONE_MATCH, "\"other\"")]), Proceed);
        assert_eq!(pre(&[(header::IF_MODIFIED_SINCE, &lm)]), NotModified);
        assert_eq!(
            pre(&[
                (header::IF_NONE_MATCH, "\"other\""),
                (header::IF_MODIFIED_SINCE, &lm)
            ]),
            Proceed,
            "If-None-Match wins over If-Modified-Since"
        );
        assert_eq!(
            pre(&[(header::IF_MODIFIED_SINCE, "Wed, 31 Dec 2025 23:59:59 GMT")]),
            Proceed
        );
        assert_eq!(pre(&[(header::IF_MODIFIED_SINCE, "yesterday")]), Proceed);
        assert_eq!(pre(&[(header::IF_MATCH, &weak)]), Failed);
        assert_eq!(pre(&[(header::IF_MATCH, &tag)]), Proceed);
        assert_eq!(
            pre(&[(header::IF_UNMODIFIED_SINCE, "Wed, 31 Dec 2025 23:59:59 GMT")]),
            Failed
        );
    }

    #[test]
    fn if_range_needs_the_strong_tag_or_the_exact_date() {
        let v = Validators::of(&file(10));
        let tag = v.etag.to_str().unwrap().to_string();
        let lm = v.last_modified.to_str().unwrap().to_string();
        let holds = |val: &str| v.if_range_holds(&headers(&[(header::IF_RANGE, val)]));
        assert!(holds(&tag));
        assert!(holds(&lm));
        assert!(!holds(&format!("W/{tag}")));
        assert!(!holds("\"stale\""));
        assert!(!holds("Wed, 31 Dec 2025 23:59:59 GMT"));
        assert!(v.if_range_holds(&HeaderMap::new()));
    }

    #[test]
    fn text_is_revalidated_and_media_cached_by_default() {
        assert_eq!(default_cache_control("text/css; charset=utf-8"), "no-cache");
        assert_eq!(default_cache_control("image/png"), "max-age=3600");
        assert_eq!(default_cache_control("video/webm"), "max-age=3600");
    }
}
