//! The 429 path's bytes: the rate-limited problem+json body and the rate-limit headers, written without a formatter.
//!
//! Every refused request gets the body, and every limited response the
//! headers, so they are on the hot path of both the reject and the allow
//! path. Measured with callgrind (`bench/instructions.py`), serializing the
//! body with serde_json and the headers with `format!` cost ~11,000
//! instructions of a 45,000-instruction 429; written here piece by piece into
//! one buffer each, with the header map sized once, they cost a fraction of
//! that. The fixed parts are constants; only names, numbers and the client
//! key are written per request.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::config::HeaderSets;
use crate::header_value;
use crate::limiter::{ceil_secs, Nanos, Quota, NANOS_PER_SEC};

/// One limiter's view for the headers: its name and its quota after this request.
#[derive(Debug, Clone, Copy)]
pub struct LimitView<'a> {
    pub name: &'a str,
    pub quota: Quota,
}

/// Why a request was refused by its limiters.
#[derive(Debug, Clone)]
pub struct Denial {
    /// The rejecting limiter with the longest wait: its index in
    /// `Snapshot::limiters` (its `reject` page and its episode log are
    /// found by it) and its name.
    pub index: usize,
    pub limiter: std::sync::Arc<str>,
    pub quota: Quota,
    /// A human description of the policy, e.g. `5 requests per 60s`.
    pub policy: std::sync::Arc<str>,
    pub retry_after: Nanos,
    /// Every limiter that rejected.
    pub violated: Vec<std::sync::Arc<str>>,
    /// The client key as shown to humans (API keys shortened).
    pub key: String,
}

/// Headers a refused response may carry besides its content type:
/// Retry-After, Cache-Control, the three `X-RateLimit-*`,
/// `RateLimit-Policy`, `RateLimit`, `X-Request-Id`.
pub const LIMIT_HEADERS: usize = 8;

/// The problem+json body of a rate-limited request (RFC 9457), fields in
/// the documented order: `type`, `title`, `status`, `detail`, `limiter`,
/// `limit`, `window_seconds`, `retry_after`, `violated-policies`, `request_id`.
pub fn problem_body(
    denial: &Denial,
    status: StatusCode,
    title: &str,
    retry_after: u64,
    request_id: Option<&str>,
) -> Vec<u8> {
    let strings = denial.policy.len()
        + denial.key.len()
        + denial.limiter.len()
        + denial.violated.iter().map(|v| v.len() + 3).sum::<usize>()
        + request_id.map_or(0, str::len);
    let mut out = Vec::with_capacity(256 + strings + strings / 8);
    out.extend_from_slice(b"{\"type\":\"rate-limit-exceeded\",\"title\":");
    json_string(&mut out, title);
    out.extend_from_slice(b",\"status\":");
    push_u64(&mut out, u64::from(status.as_u16()));
    out.extend_from_slice(b",\"detail\":\"Rate limit of ");
    json_escaped(&mut out, &denial.policy);
    out.extend_from_slice(b" exceeded for key '");
    json_escaped(&mut out, &denial.key);
    out.extend_from_slice(b"'.\",\"limiter\":");
    json_string(&mut out, &denial.limiter);
    out.extend_from_slice(b",\"limit\":");
    push_u64(&mut out, denial.quota.limit);
    out.extend_from_slice(b",\"window_seconds\":");
    match denial.quota.window {
        Some(w) => push_u64(&mut out, ceil_secs(w)),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"retry_after\":");
    push_u64(&mut out, retry_after);
    out.extend_from_slice(b",\"violated-policies\":[");
    for (i, name) in denial.violated.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json_string(&mut out, name);
    }
    out.push(b']');
    if let Some(id) = request_id {
        out.extend_from_slice(b",\"request_id\":");
        json_string(&mut out, id);
    }
    out.push(b'}');
    out
}

/// What the rate-limit headers of one response are written from: the
/// route's limiters after this request, the store's clock at the decision,
/// the route's `rate_limit_headers` and its kept `RateLimit-Policy`.
#[derive(Clone, Copy)]
pub struct LimitHeaders<'a> {
    pub views: &'a [LimitView<'a>],
    pub at: Nanos,
    pub sets: HeaderSets,
    pub cache: &'a PolicyCache,
}

impl LimitHeaders<'_> {
    pub fn write(&self, headers: &mut HeaderMap) {
        set_rate_limit_headers(headers, self.views, self.at, self.sets, self.cache);
    }
}

// Named once: a `&str` key would be parsed into a header name on every response.
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Sets `X-RateLimit-*` from the limiter with the fewest remaining, and the
/// IETF `RateLimit-Policy` / `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers-10).
/// `sets` (a route's `rate_limit_headers`) chooses which of the two are sent.
pub fn set_rate_limit_headers(
    headers: &mut HeaderMap,
    views: &[LimitView<'_>],
    now: Nanos,
    sets: HeaderSets,
    cache: &PolicyCache,
) {
    let Some(tightest) = views.iter().min_by(|a, b| {
        a.quota
            .remaining
            .cmp(&b.quota.remaining)
            .then(b.quota.reset_after.cmp(&a.quota.reset_after))
    }) else {
        return;
    };
    // One growth of the map at most, not one per insert.
    headers.reserve(LIMIT_HEADERS);
    let q = tightest.quota;
    let prepared = cache.prepared(views);
    if sets.x_ratelimit() {
        let reset_at = (now + q.reset_after).div_ceil(NANOS_PER_SEC);
        headers.insert(X_RATELIMIT_LIMIT, prepared.limit_value(q.limit));
        headers.insert(X_RATELIMIT_REMAINING, header_value::number(q.remaining));
        headers.insert(X_RATELIMIT_RESET, reset_value(reset_at));
    }
    if !sets.draft() {
        return;
    }
    if let Some(v) = &prepared.policy {
        headers.insert(RATELIMIT_POLICY, v.clone());
    }
    if let Some(v) = current_value(tightest.name, q.remaining, ceil_secs(q.reset_after)) {
        headers.insert(RATELIMIT, v);
    }
}

thread_local! {
    /// The last spent `RateLimit` value (`r=0`) this worker wrote, and its
    /// `t`: a flood's refusals from one client within a second all say the
    /// same, so it is written once, not once a refusal. An allowed
    /// request's `r` moves with every request: it is written afresh, and
    /// not kept (keeping costs a shared copy of the value).
    static LAST_SPENT: header_value::Repeated = const { header_value::Repeated::new() };
}

/// `RateLimit`'s value, `"name";r=R;t=T`.
fn current_value(name: &str, remaining: u64, reset: u64) -> Option<HeaderValue> {
    let render = || {
        let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
        header_value::joined(&[
            b"\"",
            name.as_bytes(),
            b"\";r=",
            r.format(remaining).as_bytes(),
            b";t=",
            t.format(reset).as_bytes(),
        ])
    };
    if remaining != 0 {
        return render();
    }
    // The same `t`, and the same name between the quotes (a name has no `"`).
    let named = |v: &HeaderValue| {
        let between = v.as_bytes().get(1..name.len() + 2);
        between.is_some_and(|n| n.starts_with(name.as_bytes()) && n.ends_with(b"\""))
    };
    LAST_SPENT.with(|last| last.rendered_where(reset, named, render))
}

thread_local! {
    /// The last `X-RateLimit-Reset` value this worker wrote: a fixed window's
    /// requests all reset at its end, so it changes once a window (or once a
    /// second), not once a request.
    static LAST_RESET: header_value::Repeated = const { header_value::Repeated::new() };
}

/// `reset_at` (Unix seconds) as a header value, rendered once while it repeats.
fn reset_value(reset_at: u64) -> HeaderValue {
    LAST_RESET.with(|last| last.value(reset_at))
}

/// A route's rate-limit header values that depend only on its limiters'
/// quotas, prepared from its first limited response and reused while the
/// same limiters report the same quotas: `RateLimit-Policy` and each
/// limiter's `X-RateLimit-Limit`. They change only with the config (a reload
/// builds a new route, so a new cache) or with a per-key override (whose
/// quotas differ: they are then written afresh, and the kept ones stay the
/// first one's). Only the numbers that move per request are written per request.
#[derive(Debug, Default)]
pub struct PolicyCache(std::sync::OnceLock<Prepared>);

#[derive(Debug, Clone)]
struct Prepared {
    items: Vec<PolicyItem>,
    /// `None` for a name a header cannot carry (names are the config's,
    /// validated, so this does not happen in practice): the field is left out.
    policy: Option<HeaderValue>,
}

#[derive(Debug, Clone)]
struct PolicyItem {
    name: Box<str>,
    limit: u64,
    window: Option<Nanos>,
    /// `limit` as an `X-RateLimit-Limit` value.
    limit_value: HeaderValue,
}

impl Prepared {
    fn of(views: &[LimitView<'_>]) -> Prepared {
        let items = views
            .iter()
            .map(|v| PolicyItem {
                name: v.name.into(),
                limit: v.quota.limit,
                window: v.quota.window,
                limit_value: header_value::number(v.quota.limit),
            })
            .collect();
        Prepared {
            items,
            policy: policy_value(views),
        }
    }

    fn same(&self, views: &[LimitView<'_>]) -> bool {
        self.items.len() == views.len()
            && self.items.iter().zip(views).all(|(i, v)| {
                i.limit == v.quota.limit && i.window == v.quota.window && *i.name == *v.name
            })
    }

    /// The prepared value of a limiter with this limit (the tightest one's).
    fn limit_value(&self, limit: u64) -> HeaderValue {
        match self.items.iter().find(|i| i.limit == limit) {
            Some(i) => i.limit_value.clone(),
            None => header_value::number(limit),
        }
    }
}

impl PolicyCache {
    /// The kept values if `views` are the ones they were prepared for;
    /// prepared (and kept, the first time) otherwise.
    fn prepared(&self, views: &[LimitView<'_>]) -> std::borrow::Cow<'_, Prepared> {
        use std::borrow::Cow;
        if let Some(kept) = self.0.get() {
            if kept.same(views) {
                return Cow::Borrowed(kept);
            }
            return Cow::Owned(Prepared::of(views));
        }
        let fresh = Prepared::of(views);
        match self.0.set(fresh.clone()) {
            Ok(()) => Cow::Owned(fresh),
            // Another worker kept its own first: ours is still right for us.
            Err(fresh) => Cow::Owned(fresh),
        }
    }
}

/// `"name";q=limit;w=window` for each limiter, comma separated.
fn policy_value(views: &[LimitView<'_>]) -> Option<HeaderValue> {
    let names: usize = views.iter().map(|v| v.name.len() + 32).sum();
    let mut policy = Vec::with_capacity(names);
    for (i, v) in views.iter().enumerate() {
        if i > 0 {
            policy.extend_from_slice(b", ");
        }
        quoted(&mut policy, v.name);
        policy.extend_from_slice(b";q=");
        push_u64(&mut policy, v.quota.limit);
        if let Some(w) = v.quota.window {
            policy.extend_from_slice(b";w=");
            push_u64(&mut policy, ceil_secs(w).max(1));
        }
    }
    // A name a header cannot carry leaves the field out (as before: names are
    // the config's, validated, so this does not happen in practice).
    header_value::exact(policy)
}

fn quoted(out: &mut Vec<u8>, name: &str) {
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.push(b'"');
}

/// Decimal digits of `n`, as `Display` writes them.
pub fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `s` as a JSON string, quotes included.
fn json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    json_escaped(out, s);
    out.push(b'"');
}

/// `s` escaped for the inside of a JSON string, as serde_json escapes it:
/// `"` and `\`, the short forms of \b \f \n \r \t, other control bytes as
/// `\u00XX`; everything else (UTF-8 included) as is.
fn json_escaped(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    // Names, policies and keys almost never need escaping: a test of eight
    // bytes at a time decides, then one copy.
    if !needs_escaping(bytes) {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x00..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if short == 0 {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 15)]);
        } else {
            out.push(b'\\');
            out.push(short);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Whether any byte of `bytes` is a control byte, `"` or `\\`. Eight bytes
/// are tested at once (a byte-wise loop did not vectorize, and cost ~5
/// instructions a byte on each 429's six strings): for a word `w`,
/// `(w - 0x0101…·k) & !w & 0x8080…` has a byte's high bit set exactly when
/// some byte of `w` is below `k` (`k` ≤ 0x80), and `"` and `\\` are the
/// zero bytes of `w` xor their repetition.
fn needs_escaping(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let below = |w: u64, k: u8| w.wrapping_sub(ONES * u64::from(k)) & !w & HIGH != 0;
    let any = |w: [u8; 8]| {
        let w = u64::from_ne_bytes(w);
        below(w, 0x20)
            | below(w ^ (ONES * u64::from(b'"')), 1)
            | below(w ^ (ONES * u64::from(b'\\')), 1)
    };
    let Some(last) = bytes.last_chunk::<8>() else {
        // Shorter than a word: padded with spaces, which need nothing.
        let mut padded = [b' '; 8];
        padded[..bytes.len()].copy_from_slice(bytes);
        return any(padded);
    };
    // The whole words, then the last eight bytes (overlapping the last
    // whole word when the length is not a multiple of eight).
    let (words, _) = bytes.as_chunks::<8>();
    words.iter().fold(any(*last), |hit, &w| hit | any(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Quota;
    use serde_json::{json, Value};

    const S: Nanos = NANOS_PER_SEC;

    fn denial(limiter: &str, key: &str, policy: &str, window: Option<Nanos>) -> Denial {
        Denial {
            index: 0,
            limiter: limiter.into(),
            quota: Quota {
                limit: 5,
                window,
                remaining: 0,
                reset_after: 40 * S,
            },
            policy: policy.into(),
            retry_after: 40 * S,
            violated: vec![limiter.into(), "global".into()],
            key: key.into(),
        }
    }

    #[test]
    fn the_body_is_the_json_serde_would_write_even_for_awkward_strings() {
        for (limiter, key, policy, window) in [
            (
                "strict",
                "ip:203.0.113.9",
                "5 requests per 60s",
                Some(60 * S),
            ),
            (
                "quote\"back\\slash",
                "key:\u{1}\u{8}\u{c}\n\r\t\u{1f}é漢",
                "5 requests burst, refilled at 0.5/s",
                None,
            ),
            ("", "", "", Some(1)),
        ] {
            let d = denial(limiter, key, policy, window);
            let body = problem_body(
                &d,
                StatusCode::TOO_MANY_REQUESTS,
                "Too Many Requests",
                40,
                Some("r-1"),
            );
            let ours: Value = serde_json::from_slice(&body).expect("valid JSON");
            let expected = json!({
                "type": "rate-limit-exceeded",
                "title": "Too Many Requests",
                "status": 429,
                "detail": format!("Rate limit of {policy} exceeded for key '{key}'."),
                "limiter": limiter,
                "limit": 5,
                "window_seconds": window.map(ceil_secs),
                "retry_after": 40,
                "violated-policies": [limiter, "global"],
                "request_id": "r-1",
            });
            assert_eq!(ours, expected);
            // serde_json's own escaping of the same strings, byte for byte.
            let escaped = serde_json::to_string(key).unwrap();
            let inner = &escaped[1..escaped.len() - 1];
            assert!(
                std::str::from_utf8(&body).unwrap().contains(inner),
                "{key:?} escaped as {inner}"
            );
        }
    }

    #[test]
    fn every_byte_in_every_place_of_a_word_is_escaped_as_serde_json_escapes_it() {
        // 19 bytes: two words and a remainder of three, so each byte value
        // is tried in each lane of a word and in the tail.
        for b in 0u8..0x80 {
            for at in 0..19 {
                let mut s = vec![b'a'; 19];
                s[at] = b;
                let s = String::from_utf8(s).unwrap();
                let mut ours = Vec::new();
                json_escaped(&mut ours, &s);
                let theirs = serde_json::to_string(&s).unwrap();
                assert_eq!(
                    std::str::from_utf8(&ours).unwrap(),
                    &theirs[1..theirs.len() - 1],
                    "byte {b:#04x} at {at}"
                );
            }
        }
        // Bytes of multi-byte UTF-8 (all ≥ 0x80) are never escaped.
        let mut ours = Vec::new();
        json_escaped(&mut ours, "clé-ÿ\u{10ffff}-ключ");
        assert_eq!(ours, "clé-ÿ\u{10ffff}-ключ".as_bytes());
    }

    #[test]
    fn the_body_leaves_out_a_missing_request_id_and_keeps_the_field_order() {
        let d = denial("strict", "ip:1.2.3.4", "1 requests per 1s", Some(S));
        let body = problem_body(
            &d,
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable",
            1,
            None,
        );
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "{\"type\":\"rate-limit-exceeded\",\"title\":\"Service Unavailable\",\"status\":503,\
             \"detail\":\"Rate limit of 1 requests per 1s exceeded for key 'ip:1.2.3.4'.\",\
             \"limiter\":\"strict\",\"limit\":5,\"window_seconds\":1,\"retry_after\":1,\
             \"violated-policies\":[\"strict\",\"global\"]}"
        );
    }

    #[test]
    fn numbers_are_written_as_display_writes_them() {
        for n in [0, 7, 10, 99, 1_000_000_000, u64::MAX] {
            let mut out = Vec::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }

    fn view(name: &str, limit: u64, window: Option<Nanos>) -> LimitView<'_> {
        LimitView {
            name,
            quota: Quota {
                limit,
                window,
                remaining: 1,
                reset_after: 3 * S,
            },
        }
    }

    fn policy(views: &[LimitView<'_>], cache: &PolicyCache) -> HeaderValue {
        let mut h = HeaderMap::new();
        set_rate_limit_headers(&mut h, views, 0, HeaderSets::Both, cache);
        h["ratelimit-policy"].clone()
    }

    #[test]
    fn a_kept_policy_is_reused_only_for_the_same_limiters_and_quotas() {
        let cache = PolicyCache::default();
        let route = [view("a", 5, Some(60 * S)), view("b", 100, None)];
        assert_eq!(policy(&route, &cache), "\"a\";q=5;w=60, \"b\";q=100");
        assert_eq!(policy(&route, &cache), "\"a\";q=5;w=60, \"b\";q=100");
        // A per-key override changes a quota; one limiter skipped changes the list.
        let overridden = [view("a", 50, Some(60 * S)), view("b", 100, None)];
        assert_eq!(policy(&overridden, &cache), "\"a\";q=50;w=60, \"b\";q=100");
        assert_eq!(policy(&route[1..], &cache), "\"b\";q=100");
        let renamed = [view("c", 5, Some(60 * S)), view("b", 100, None)];
        assert_eq!(policy(&renamed, &cache), "\"c\";q=5;w=60, \"b\";q=100");
        assert_eq!(policy(&route, &cache), "\"a\";q=5;w=60, \"b\";q=100");
    }

    fn x_headers(views: &[LimitView<'_>], now: Nanos, cache: &PolicyCache) -> [String; 3] {
        let mut h = HeaderMap::new();
        set_rate_limit_headers(&mut h, views, now, HeaderSets::Both, cache);
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .map(|n| h[n].to_str().unwrap().to_string())
    }

    #[test]
    fn a_kept_spent_value_is_reused_only_for_the_same_name_and_reset() {
        let cases = [
            ("api", 0, 5, "\"api\";r=0;t=5"),
            ("api", 0, 5, "\"api\";r=0;t=5"),
            ("ap", 0, 5, "\"ap\";r=0;t=5"),
            ("api", 0, 5, "\"api\";r=0;t=5"),
            ("apis", 0, 5, "\"apis\";r=0;t=5"),
            ("apis", 0, 6, "\"apis\";r=0;t=6"),
            ("apis", 3, 6, "\"apis\";r=3;t=6"),
            ("apis", 0, 6, "\"apis\";r=0;t=6"),
        ];
        for (name, remaining, reset, expected) in cases {
            let v = current_value(name, remaining, reset).unwrap();
            assert_eq!(v, expected, "{name} r={remaining} t={reset}");
        }
    }

    #[test]
    fn prepared_limit_and_reset_values_follow_the_tightest_limiter_and_the_clock() {
        let cache = PolicyCache::default();
        let mut tight = view("a", 5, Some(60 * S));
        tight.quota.remaining = 0;
        let route = [tight, view("b", 100, None)];
        assert_eq!(x_headers(&route, 10 * S, &cache), ["5", "0", "13"]);
        // The same second again, then the next: the reset moves with the clock.
        assert_eq!(x_headers(&route, 10 * S, &cache), ["5", "0", "13"]);
        assert_eq!(x_headers(&route, 11 * S, &cache), ["5", "0", "14"]);
        // An override's limit is written afresh, not taken from the kept route.
        let mut overridden = [view("a", 50, Some(60 * S)), view("b", 100, None)];
        overridden[0].quota.remaining = 0;
        assert_eq!(x_headers(&overridden, 11 * S, &cache), ["50", "0", "14"]);
        // The other limiter the tightest: its own prepared limit.
        let mut loose = [view("a", 5, Some(60 * S)), view("b", 100, None)];
        loose[0].quota.remaining = 4;
        loose[1].quota.remaining = 0;
        assert_eq!(x_headers(&loose, 11 * S, &cache), ["100", "0", "14"]);
    }
}
