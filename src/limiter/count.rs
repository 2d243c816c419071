//! `count:` on a limiter: which responses count, and why a unit is taken before the request and refunded after.
//!
//! A login limiter should count failed logins, not visits: `count: { status:
//! [401, 403] }` or `count: { header: X-Login-Failed }`. The request is
//! still checked before it is forwarded (a key over the limit gets a 429
//! without reaching the upstream); only the answer decides whether it counts.
//!
//! Two ways to get there:
//! - *peek before, record after*: check without counting, forward, and count
//!   when a matching answer comes back. N wrong-password requests sent in
//!   parallel all peek at the same count (say 0 of 5) before any answer is
//!   back, so all N reach the application: the limit holds only for clients
//!   polite enough to wait for each answer — exactly not the attacker.
//! - *record before, refund after* (what tollgate does): every request takes
//!   its unit in the same atomic store call that checks it, exactly as
//!   without `count:`, and gives it back ([`super::Algorithm::refund`]) when
//!   its answer does not match. At any instant the units taken are at least
//!   the matching answers, so however many requests race, no more than
//!   `limit` of them are ever let through unsettled, and a key never gets
//!   more than `limit` matching answers per window — as correct as a
//!   database, because admission is one atomic check-and-take per request.
//!   The price is on the safe side: while `limit` attempts are still in
//!   flight, a further request of that key is refused even if some of those
//!   attempts then succeed and are refunded.
//!
//! What counts, precisely:
//! - a response tollgate forwards (or a route's fixed `respond:`) counts when
//!   its status is in `status`, or when it carries the `header` with a value
//!   that is not empty, `0`, `false`, `no` or `off` (case-insensitive), so an
//!   app may send `X-Login-Failed: 0` on success. Either rule suffices.
//! - a request tollgate refuses itself (429 of this or another limiter, a
//!   ban) never reached the application: it is refunded wherever it took a
//!   unit (a fixed window counts refused attempts), so another limiter's 429
//!   never eats into the failed-login budget.
//! - an upstream failure (502, 504) counts only if its status is listed.
//! - a client that goes away before the answer leaves its unit taken: the
//!   safe side again (an attacker cannot dodge counting by hanging up).
//!
//! A unit is given back only while it still weighs on the state (same fixed
//! window, log entry still there, token not yet refilled), so a refund never
//! leaves a key with more room than it would have had without the request.
//! (A token bucket tracks how far refunds moved each token, up to a bound;
//! past it, it gives back less, never more: see `token_bucket/refunds.rs`.)

use http::{HeaderMap, HeaderName, StatusCode};

/// Which responses a `count:` limiter counts. Validated: at least one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountRule {
    /// Statuses that count (sorted, deduplicated).
    pub status: Vec<u16>,
    /// A response header that, when set to a true-ish value, counts.
    pub header: Option<HeaderName>,
}

impl CountRule {
    /// Whether a response with this status and these headers counts.
    pub fn matches(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        if self.status.binary_search(&status.as_u16()).is_ok() {
            return true;
        }
        let Some(name) = &self.header else {
            return false;
        };
        headers.get_all(name).iter().any(|v| {
            let v = v.as_bytes().trim_ascii();
            !(v.is_empty()
                || v == b"0"
                || v.eq_ignore_ascii_case(b"false")
                || v.eq_ignore_ascii_case(b"no")
                || v.eq_ignore_ascii_case(b"off"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn rule(status: &[u16], header: Option<&str>) -> CountRule {
        CountRule {
            status: status.to_vec(),
            header: header.map(|h| HeaderName::from_bytes(h.as_bytes()).unwrap()),
        }
    }

    #[test]
    fn a_listed_status_counts_and_another_does_not() {
        let r = rule(&[401, 403], None);
        assert!(r.matches(StatusCode::UNAUTHORIZED, &HeaderMap::new()));
        assert!(r.matches(StatusCode::FORBIDDEN, &HeaderMap::new()));
        assert!(!r.matches(StatusCode::OK, &HeaderMap::new()));
        assert!(!r.matches(StatusCode::FOUND, &HeaderMap::new()));
    }

    #[test]
    fn a_header_counts_unless_its_value_says_no() {
        let r = rule(&[], Some("x-login-failed"));
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-login-failed", HeaderValue::from_static(v));
            h
        };
        assert!(r.matches(StatusCode::OK, &with("1")));
        assert!(r.matches(StatusCode::OK, &with("yes")));
        for no in ["0", "false", "FALSE", " no ", "off", ""] {
            assert!(!r.matches(StatusCode::OK, &with(no)), "{no:?}");
        }
        assert!(!r.matches(StatusCode::OK, &HeaderMap::new()));
    }
}
