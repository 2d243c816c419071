//! Header values tollgate writes on every response (numbers, addresses, `RateLimit`), made with one allocation or none.
//!
//! `HeaderValue::from(u64)` and `HeaderValue::from_maybe_shared(Bytes::from(vec))`
//! each allocate twice: the digits' buffer, then the block `Bytes` shares it
//! through (its length differs from its capacity). Callgrind counted ~38
//! allocations per 429 (`bench/instructions.py`), each ~100 instructions
//! with its free; these values took six of them. Here a number under
//! [`SMALL`] is a slice of one static table (no allocation: `Retry-After`,
//! `X-RateLimit-Remaining`, a limit), and a value built from parts is
//! written once into a buffer of its exact length (one allocation).

use bytes::Bytes;
use http::HeaderValue;

/// Numbers below this are slices of [`DIGITS`].
pub const SMALL: u64 = 10_000;

/// Every number from 0 to `SMALL - 1`, written one after the other
/// ("0123…9101112…9999"): 38,890 bytes of the binary's read-only data.
static DIGITS: &str = match std::str::from_utf8(&TABLE) {
    Ok(s) => s,
    Err(_) => panic!("the digits are ASCII"),
};

const TABLE_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9_000 * 4;

static TABLE: [u8; TABLE_LEN] = {
    let mut out = [0u8; TABLE_LEN];
    let mut n = 0u64;
    let mut at = 0;
    while n < SMALL {
        let (_, len) = place(n);
        let mut i = len;
        let mut rest = n;
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += len;
        n += 1;
    }
    out
};

/// Where `n` (< [`SMALL`]) starts in [`DIGITS`], and its length.
const fn place(n: u64) -> (usize, usize) {
    let n = n as usize;
    match n {
        0..=9 => (n, 1),
        10..=99 => (10 + (n - 10) * 2, 2),
        100..=999 => (190 + (n - 100) * 3, 3),
        _ => (2_890 + (n - 1_000) * 4, 4),
    }
}

/// `n` in decimal: without an allocation below [`SMALL`], with one above.
pub fn number(n: u64) -> HeaderValue {
    if n < SMALL {
        let (start, len) = place(n);
        return HeaderValue::from_static(&DIGITS[start..start + len]);
    }
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n).as_bytes();
    joined(&[digits]).expect("digits are a valid header value")
}

/// `parts` one after the other as one value, in one allocation of exactly
/// their length; `None` if the bytes cannot be a header value.
pub fn joined(parts: &[&[u8]]) -> Option<HeaderValue> {
    let len = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(len);
    for p in parts {
        out.extend_from_slice(p);
    }
    exact(out)
}

/// `bytes` as a header value without a second allocation: `Bytes` takes a
/// buffer whose length is its capacity as it is (shrinking in place when a
/// caller's estimate was generous, which the allocator does without a copy
/// when it keeps at least half). `None` if the bytes cannot be a header value.
pub fn exact(bytes: Vec<u8>) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from(bytes.into_boxed_slice())).ok()
}

/// A value that repeats request after request (a listener's port, a fixed
/// window's reset time, a kept-alive client's address), rendered once while
/// it repeats: one entry, kept per worker thread in a `thread_local!`, so no
/// lock. `K` is what the value `V` is rendered from.
pub struct Repeated<K = u64, V = HeaderValue>(std::cell::RefCell<Option<(K, V)>>);

impl<K: Copy + PartialEq, V: Clone> Repeated<K, V> {
    pub const fn new() -> Repeated<K, V> {
        Repeated(std::cell::RefCell::new(None))
    }

    /// `key` rendered by `render`: the kept value while `key` repeats.
    pub fn rendered(&self, key: K, render: impl FnOnce(K) -> V) -> V {
        if let Some(v) = self.kept(key, |_| true) {
            return v;
        }
        let v = render(key);
        self.keep(key, &v);
        v
    }

    /// As [`Repeated::rendered`], for a value that `key` does not say all
    /// of: the kept value while `key` repeats and `fits` says it was made
    /// from the rest too. A value `render` cannot make is not kept.
    pub fn rendered_where(
        &self,
        key: K,
        fits: impl FnOnce(&V) -> bool,
        render: impl FnOnce() -> Option<V>,
    ) -> Option<V> {
        if let Some(v) = self.kept(key, fits) {
            return Some(v);
        }
        let v = render()?;
        self.keep(key, &v);
        Some(v)
    }

    fn kept(&self, key: K, fits: impl FnOnce(&V) -> bool) -> Option<V> {
        match &*self.0.borrow() {
            Some((kept, v)) if *kept == key && fits(v) => Some(v.clone()),
            _ => None,
        }
    }

    fn keep(&self, key: K, v: &V) {
        *self.0.borrow_mut() = Some((key, v.clone()));
    }
}

impl Repeated {
    /// `n` as a header value: the kept one while `n` repeats.
    pub fn value(&self, n: u64) -> HeaderValue {
        self.rendered(n, number)
    }
}

impl<K: Copy + PartialEq, V: Clone> Default for Repeated<K, V> {
    fn default() -> Repeated<K, V> {
        Repeated::new()
    }
}

/// Whether a comma-separated header value (`Connection`, `Vary`,
/// `Cache-Control`, …) lists one of `tokens` (ASCII, compared without
/// case), each element trimmed; a value that is not visible ASCII lists
/// nothing.
///
/// One pass over bytes, and none for a value shorter than every token: it
/// runs on every answer (the compression filter asks each answer's
/// `Cache-Control` and `Vary`, a 429's `no-store` included), and
/// `str::split` with the Unicode `trim` cost ~250 instructions a value
/// (callgrind).
pub fn lists(value: &HeaderValue, tokens: &[&str]) -> bool {
    let bytes = value.as_bytes();
    if tokens.iter().all(|t| t.len() > bytes.len()) {
        return false;
    }
    let is = |element: &[u8]| {
        let element = element.trim_ascii();
        tokens
            .iter()
            .any(|t| element.eq_ignore_ascii_case(t.as_bytes()))
    };
    let (mut start, mut found) = (0, false);
    for (i, &b) in bytes.iter().enumerate() {
        if b == b',' {
            found = found || is(&bytes[start..i]);
            start = i + 1;
        } else if b != b'\t' && !(0x20..0x7f).contains(&b) {
            // What `HeaderValue::to_str` refuses.
            return false;
        }
    }
    found || is(&bytes[start..])
}

/// Joins several `Cookie` fields into one, separated by `; `. An HTTP/2
/// client may send each cookie as a field of its own (RFC 9113 §8.2.3, for
/// compression); an HTTP/1.1 request carries one (RFC 6265 §5.4), and a
/// server reading the first `Cookie:` line, or joining lines with `, `,
/// would lose cookies. One lookup when there is one field or none.
pub fn join_cookies(headers: &mut http::HeaderMap) {
    let mut fields = headers.get_all(http::header::COOKIE).iter();
    let (Some(first), Some(_)) = (fields.next(), fields.next()) else {
        return;
    };
    let mut out = first.as_bytes().to_vec();
    for v in headers.get_all(http::header::COOKIE).iter().skip(1) {
        out.extend_from_slice(b"; ");
        out.extend_from_slice(v.as_bytes());
    }
    if let Some(one) = exact(out) {
        headers.insert(http::header::COOKIE, one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_reads_as_display_writes_it() {
        for n in (0..SMALL + 20).chain([65_535, 1_733_000_000, u64::MAX]) {
            assert_eq!(number(n).to_str().unwrap(), n.to_string(), "{n}");
        }
    }

    #[test]
    fn the_table_ends_with_the_last_small_number() {
        assert!(DIGITS.ends_with("99989999"));
        assert_eq!(DIGITS.len(), TABLE_LEN);
    }

    #[test]
    fn parts_are_joined_in_order_and_a_control_byte_is_refused() {
        let v = joined(&[b"\"api\"", b";r=", b"4"]).unwrap();
        assert_eq!(v, "\"api\";r=4");
        assert!(joined(&[b"a\nb"]).is_none());
        assert_eq!(exact(b"12.0.0.1".to_vec()).unwrap(), "12.0.0.1");
    }

    #[test]
    fn a_list_is_read_element_by_element_without_case_or_spaces() {
        let v = HeaderValue::from_static("public,  No-Transform ,max-age=60");
        assert!(lists(&v, &["no-transform"]));
        assert!(lists(&v, &["max-age=60", "private"]));
        assert!(!lists(&v, &["max-age"]));
        assert!(!lists(&v, &["a-token-longer-than-the-whole-value"]));
        let spaced = HeaderValue::from_static(" upgrade ");
        assert!(lists(&spaced, &["Upgrade"]));
        let opaque = HeaderValue::from_bytes(b"no-transform, \xff").unwrap();
        assert!(!lists(&opaque, &["no-transform"]), "not visible ASCII");
    }

    #[test]
    fn a_repeated_number_is_rendered_again_only_when_it_changes() {
        let r = Repeated::new();
        assert_eq!(r.value(19_180), "19180");
        assert_eq!(r.value(19_180), "19180");
        assert_eq!(r.value(443), "443");
        let renders = std::cell::Cell::new(0);
        let render = |n: u64| {
            renders.set(renders.get() + 1);
            number(n * 2)
        };
        let r = Repeated::new();
        assert_eq!(r.rendered(7, render), "14");
        assert_eq!(r.rendered(7, render), "14");
        assert_eq!(renders.get(), 1, "a repeat is not rendered again");
        assert_eq!(r.rendered(8, render), "16");
        assert_eq!(renders.get(), 2);
    }

    #[test]
    fn cookie_fields_are_joined_into_one_with_semicolons() {
        let mut h = http::HeaderMap::new();
        h.append("cookie", HeaderValue::from_static("a=1"));
        join_cookies(&mut h);
        assert_eq!(h.get_all("cookie").iter().count(), 1);
        h.append("cookie", HeaderValue::from_static("b=2"));
        h.append("cookie", HeaderValue::from_static("c=3"));
        join_cookies(&mut h);
        let all: Vec<_> = h.get_all("cookie").iter().collect();
        assert_eq!(all, ["a=1; b=2; c=3"]);
    }
}
