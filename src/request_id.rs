//! Request ids: `X-Request-Id` kept from a trusted peer when well formed, else generated.
//!
//! A generated id is a per-process random prefix and a counter, e.g.
//! `7f3a9c01e4b2-1a`: unique across restarts (the prefix) and across requests
//! (the counter), and costs one atomic add. A client that is not a trusted
//! proxy cannot choose the id an upstream and the logs will see, so it cannot
//! forge log lines or collide with another request's id.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longer ids from a peer are replaced: they end up in every log line and row.
pub const MAX_LEN: usize = 128;

/// One request's id, ready for a header and for a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// The peer's id when it is trusted and the id is well formed, else a fresh one.
    pub fn for_request(headers: &HeaderMap, peer_trusted: bool) -> RequestId {
        if peer_trusted {
            if let Some(v) = headers.get(X_REQUEST_ID) {
                if well_formed(v.as_bytes()) {
                    return RequestId(v.clone());
                }
            }
        }
        RequestId::generate()
    }

    pub fn generate() -> RequestId {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut digits = [0u8; 16];
        let hex = hex(&mut digits, n);
        let mut id = Generated {
            bytes: [0; GENERATED_LEN],
            len: 0,
        };
        for part in [prefix().as_bytes(), b"-", hex] {
            let at = usize::from(id.len);
            id.bytes[at..at + part.len()].copy_from_slice(part);
            id.len += part.len() as u8;
        }
        // One allocation, which holds the id and its count: every copy of
        // it (the request's header, the answer's, the log's record) is a
        // count, where a `Vec`'s bytes took a second allocation at their
        // first copy and the log a third for its own text.
        let value = HeaderValue::from_maybe_shared(Bytes::from_owner(id));
        RequestId(value.expect("hex digits and a dash"))
    }

    /// A fixed id, for a record written by hand (a test's, an example's).
    /// Panics unless it is [`well_formed`].
    pub fn from_static(id: &'static str) -> RequestId {
        assert!(well_formed(id.as_bytes()), "a malformed request id: {id:?}");
        RequestId(HeaderValue::from_static(id))
    }

    pub fn as_str(&self) -> &str {
        // Only visible ASCII gets in: `well_formed` or our own hex.
        self.0.to_str().unwrap_or("")
    }

    pub fn header(&self) -> &HeaderValue {
        &self.0
    }
}

/// A generated id's longest form: the 12 hex digits of the prefix, a dash,
/// and up to 16 of the counter.
const GENERATED_LEN: usize = 12 + 1 + 16;

/// A generated id's bytes, kept where [`Bytes::from_owner`] counts them.
struct Generated {
    bytes: [u8; GENERATED_LEN],
    len: u8,
}

impl AsRef<[u8]> for Generated {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// 1 to [`MAX_LEN`] characters of `A-Z a-z 0-9 - _ . : + / = @`: what UUIDs,
/// ULIDs, base64 and the ids of common proxies use, and nothing that could
/// break a log line, a JSON string or a header.
pub fn well_formed(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.:+/=@".contains(&b))
}

fn prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| {
        // std's hasher keys are random per process; mixing in the pid and the
        // time keeps prefixes apart even if two processes got equal keys.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
    })
}

/// `n` in lowercase hex without leading zeros, written at the end of `buf`.
fn hex(buf: &mut [u8; 16], mut n: u64) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = DIGITS[(n & 15) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_short_unique_and_share_the_process_prefix() {
        let a = RequestId::generate();
        let b = RequestId::generate();
        assert_ne!(a, b);
        assert!(a.as_str().len() <= 30, "{}", a.as_str());
        assert_eq!(a.as_str()[..13], b.as_str()[..13]);
        assert!(well_formed(a.as_str().as_bytes()));
    }

    #[test]
    fn the_counter_is_written_in_hex_as_format_writes_it() {
        for n in [0, 9, 10, 0x1f, 0xabc_def0, u64::MAX] {
            let mut buf = [0u8; 16];
            assert_eq!(hex(&mut buf, n), format!("{n:x}").as_bytes());
        }
        let id = RequestId::generate();
        let (prefix, counter) = id.as_str().split_once('-').expect("prefix-counter");
        assert_eq!(prefix, super::prefix());
        assert!(u64::from_str_radix(counter, 16).is_ok(), "{counter}");
    }

    #[test]
    fn a_trusted_peers_id_is_kept_and_an_untrusted_ones_replaced() {
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(RequestId::for_request(&h, true).as_str(), "abc-123");
        assert_ne!(RequestId::for_request(&h, false).as_str(), "abc-123");
    }

    #[test]
    fn a_malformed_or_oversized_id_is_replaced_even_from_a_trusted_peer() {
        for bad in [
            "".to_string(),
            "a b".into(),
            "x\"y".into(),
            "a".repeat(MAX_LEN + 1),
        ] {
            let mut h = HeaderMap::new();
            h.insert(X_REQUEST_ID, HeaderValue::from_str(&bad).unwrap());
            assert_ne!(RequestId::for_request(&h, true).as_str(), bad);
        }
        assert!(well_formed("a".repeat(MAX_LEN).as_bytes()));
    }
}
