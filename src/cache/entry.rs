//! One stored answer: the upstream's status, headers and body (and its gzip and brotli forms), when it arrived and how long it serves; and the answer a client gets from it.

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::header::{
    HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH,
    CONTENT_TYPE, DATE, ETAG, EXPIRES, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED, VARY,
};
use http::{Response, StatusCode};

use super::policy::{directive, Freshness};
use crate::body::Body;
use crate::compression::{Accepted, Coding};
use crate::limiter::{Nanos, NANOS_PER_SEC};

/// What the cache's accounting adds to every entry beyond its bytes: the
/// entry and its `Arc`, the header map's table, the map's slot and index,
/// the ghost queue's hash. Checked against real allocation by
/// `cache_memory_stays_within_max_size` (tests/cache_memory.rs).
pub const ENTRY_OVERHEAD: u64 = 640;
/// What each header adds beyond its name's and value's bytes.
const HEADER_OVERHEAD: u64 = 64;

/// How an entry stands at a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Fresh,
    /// Stale, within `stale_while_revalidate`: served while one request refreshes it.
    Revalidate,
    /// Stale, within `stale_if_error`: served only when the upstream fails.
    IfError,
    /// Past every window: as good as absent.
    Dead,
}

/// One stored answer.
pub struct Entry {
    pub status: StatusCode,
    /// The upstream's headers as received (hop-by-hop already gone; never `Set-Cookie`).
    pub headers: HeaderMap,
    pub body: Bytes,
    /// `body` gzip'd and brotli'd, when the type compresses and the route allows it.
    pub gzip: Option<Bytes>,
    pub brotli: Option<Bytes>,
    /// When it arrived (Unix ns, the injected clock).
    pub received: Nanos,
    pub freshness: Freshness,
    /// The bytes the cache's accounting charges for it (its key's too).
    pub weight: u64,
    /// A background refresh is under way (one per entry).
    refreshing: AtomicBool,
}

impl Entry {
    /// An entry for `body`, with its compressed forms when `compress` and the answer is worth compressing.
    pub fn new(
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
        received: Nanos,
        freshness: Freshness,
        compress: bool,
        key_len: usize,
    ) -> Entry {
        let worth = compress && worth_compressing(&headers, &body);
        let encode = |c: Coding| worth.then(|| encode(c, &body)).flatten();
        let (gzip, brotli) = (encode(Coding::Gzip), encode(Coding::Brotli));
        let header_bytes: u64 = headers
            .iter()
            .map(|(n, v)| (n.as_str().len() + v.len()) as u64 + HEADER_OVERHEAD)
            .sum();
        let weight = ENTRY_OVERHEAD
            + key_len as u64
            + header_bytes
            + body.len() as u64
            + gzip.as_ref().map_or(0, |b| b.len() as u64)
            + brotli.as_ref().map_or(0, |b| b.len() as u64);
        Entry {
            status,
            headers,
            body,
            gzip,
            brotli,
            received,
            freshness,
            weight,
            refreshing: AtomicBool::new(false),
        }
    }

    pub fn standing(&self, now: Nanos) -> Standing {
        let age = now.saturating_sub(self.received);
        let f = &self.freshness;
        if age < f.fresh_for {
            Standing::Fresh
        } else if age < f.fresh_for.saturating_add(f.stale_while_revalidate) {
            Standing::Revalidate
        } else if age < f.fresh_for.saturating_add(f.stale_if_error) {
            Standing::IfError
        } else {
            Standing::Dead
        }
    }

    /// Whether it can still serve in some way at `now`, were the upstream down.
    pub fn usable_on_error(&self, now: Nanos) -> bool {
        matches!(
            self.standing(now),
            Standing::Fresh | Standing::Revalidate | Standing::IfError
        )
    }

    /// Seconds of freshness left (negative once stale): RFC 9211's `ttl`.
    pub fn ttl(&self, now: Nanos) -> i64 {
        let end = self.received.saturating_add(self.freshness.fresh_for) as i128;
        ((end - now as i128) / NANOS_PER_SEC as i128) as i64
    }

    /// The `Age` it has at `now`, in seconds.
    pub fn age(&self, now: Nanos) -> u64 {
        self.freshness.initial_age + now.saturating_sub(self.received) / NANOS_PER_SEC
    }

    /// Claims the one background refresh; false when one is under way.
    pub fn claim_refresh(&self) -> bool {
        !self.refreshing.swap(true, Ordering::AcqRel)
    }

    /// Gives the claim back (the refresh failed; a later request may try again).
    pub fn release_refresh(&self) {
        self.refreshing.store(false, Ordering::Release);
    }

    /// The answer for a request whose codings are `accepted`: the stored
    /// form it prefers, `Age`, `Cache-Status`, and a `304` when its
    /// validators match (`If-None-Match`, else `If-Modified-Since`).
    pub fn answer(
        &self,
        request: &HeaderMap,
        accepted: Accepted,
        head: bool,
        now: Nanos,
        status: HeaderValue,
    ) -> Response<Body> {
        let mut headers = self.headers.clone();
        let (coding, body) = self.form(accepted);
        let varied = headers
            .get_all(VARY)
            .iter()
            .any(|v| crate::header_value::lists(v, crate::compression::VARIES_BY_CODING));
        if (self.gzip.is_some() || self.brotli.is_some()) && !varied {
            headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        if let Some(c) = coding {
            headers.insert(CONTENT_ENCODING, HeaderValue::from_static(c.token()));
            crate::compression::weaken_etag(&mut headers);
        }
        headers.insert(
            http::header::AGE,
            crate::header_value::number(self.age(now)),
        );
        headers.insert(CACHE_STATUS, status);
        let mut resp = if self.status == StatusCode::OK && not_modified(request, &headers) {
            headers.retain_not_modified();
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            r
        } else {
            headers.insert(
                CONTENT_LENGTH,
                crate::header_value::number(body.len() as u64),
            );
            let mut r = Response::new(if head {
                Body::empty()
            } else {
                Body::full(body.clone())
            });
            *r.status_mut() = self.status;
            r
        };
        *resp.headers_mut() = headers;
        resp
    }

    /// The stored form `accepted` prefers: a compressed one, else the body as received.
    fn form(&self, accepted: Accepted) -> (Option<Coding>, &Bytes) {
        match accepted.best() {
            Some(Coding::Brotli) if self.brotli.is_some() => {
                (Some(Coding::Brotli), self.brotli.as_ref().expect("checked"))
            }
            Some(Coding::Gzip) if self.gzip.is_some() => {
                (Some(Coding::Gzip), self.gzip.as_ref().expect("checked"))
            }
            _ => (None, &self.body),
        }
    }
}

/// RFC 9211's header.
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// What a `304` keeps (RFC 9110 §15.4.5), with our `Age` and `Cache-Status`.
trait NotModified {
    fn retain_not_modified(&mut self);
}

impl NotModified for HeaderMap {
    fn retain_not_modified(&mut self) {
        let keep = [
            CACHE_CONTROL,
            DATE,
            ETAG,
            EXPIRES,
            VARY,
            LAST_MODIFIED,
            http::header::AGE,
            http::header::CONTENT_LOCATION,
            CACHE_STATUS,
        ];
        let names: Vec<HeaderName> = self.keys().filter(|n| !keep.contains(n)).cloned().collect();
        for n in names {
            self.remove(n);
        }
    }
}

/// Whether the request's validators match the answer's (`If-None-Match`
/// by weak comparison; without it, `If-Modified-Since` against `Last-Modified`).
fn not_modified(request: &HeaderMap, answer: &HeaderMap) -> bool {
    if let Some(inm) = request.get(IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let Some(etag) = answer.get(ETAG).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let opaque = |t: &str| t.trim().trim_start_matches("W/").to_string();
        return inm.trim() == "*" || inm.split(',').any(|t| opaque(t) == opaque(etag));
    }
    let since = request
        .get(IF_MODIFIED_SINCE)
        .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok());
    let modified = answer
        .get(LAST_MODIFIED)
        .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok());
    matches!((since, modified), (Some(s), Some(m)) if m <= s)
}

/// Text-like, not encoded already, not `no-transform`, and long enough to gain.
fn worth_compressing(headers: &HeaderMap, body: &Bytes) -> bool {
    body.len() as u64 >= crate::compression::MIN_LENGTH
        && !headers.contains_key(CONTENT_ENCODING)
        && directive(headers, "no-transform").is_none()
        && headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(crate::compression::compressible_type)
}

/// `body` encoded whole (at the levels the streaming filter uses).
fn encode(coding: Coding, body: &[u8]) -> Option<Bytes> {
    let mut e = crate::compression::stream::Encoder::new(coding);
    let mut out = e.write(body).ok()?.to_vec();
    out.extend_from_slice(&e.finish().ok()?);
    Some(Bytes::from(out))
}
