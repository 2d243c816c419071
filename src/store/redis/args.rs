//! What `redis.lua` takes for each algorithm: one exhaustive `match` per call (check, refund, release).
//!
//! The script is the one Lua copy of `src/limiter/*.rs`; the contract suite
//! (`tests/store_contract.rs`) holds it to the same answers. A new algorithm
//! fails to compile here until each call says what the script gets for it.

use ::redis::ScriptInvocation;

use super::{CONCURRENCY_LEASE, MAX_EXACT};
use crate::limiter::{Algorithm, Nanos, Ticket, NANOS_PER_SEC};
use crate::store::StoreError;

/// Appends one limiter's 7 arguments to a `check` or `peek` call:
/// the tag, shadow, then five numbers (or the concurrency member).
pub(super) fn push_check(
    call: &mut ScriptInvocation<'_>,
    algorithm: &Algorithm,
    shadow: bool,
    member: &str,
) -> Result<(), StoreError> {
    let exact = |ns: Nanos| {
        if ns < MAX_EXACT / 2 {
            Ok(ns)
        } else {
            Err(StoreError::TooLong(ns))
        }
    };
    let shadow = if shadow { "1" } else { "0" };
    match algorithm {
        Algorithm::FixedWindow(f) => {
            let window = exact(f.window.max(1))?;
            let g = gcd(NANOS_PER_SEC, window);
            let (w1, a) = (window / g, NANOS_PER_SEC / g);
            if w1.saturating_mul(a) >= MAX_EXACT {
                return Err(StoreError::TooLong(window));
            }
            call.arg("fw")
                .arg(shadow)
                .arg(f.limit)
                .arg(window)
                .arg(g)
                .arg(w1)
                .arg(a);
        }
        Algorithm::SlidingWindow(s) => {
            call.arg("sw")
                .arg(shadow)
                .arg(s.limit)
                .arg(exact(s.window)?)
                .arg(0)
                .arg(0)
                .arg(0);
        }
        Algorithm::TokenBucket(t) => {
            exact(t.capacity.saturating_mul(t.interval))?;
            call.arg("tb")
                .arg(shadow)
                .arg(t.capacity)
                .arg(t.interval)
                .arg(0)
                .arg(0)
                .arg(0);
        }
        Algorithm::LeakyBucket(l) => {
            exact(l.capacity.saturating_add(1).saturating_mul(l.interval))?;
            call.arg("lb")
                .arg(shadow)
                .arg(l.capacity)
                .arg(l.interval)
                .arg(0)
                .arg(0)
                .arg(0);
        }
        Algorithm::Concurrency(c) => {
            call.arg("cc")
                .arg(shadow)
                .arg(c.max_in_flight)
                .arg(CONCURRENCY_LEASE.as_millis() as u64)
                .arg(member)
                .arg(0)
                .arg(0);
        }
    }
    Ok(())
}

/// The 5 arguments of a `refund` call for the unit `ticket` (Redis' clock)
/// took: kind, window or interval, place, units (1), decision instant;
/// `None` where `count:` does not apply (validation refuses it there).
pub(super) fn refund(algorithm: &Algorithm, ticket: Ticket) -> Option<[String; 5]> {
    let (kind, span, place) = match algorithm {
        Algorithm::FixedWindow(f) => {
            let start = ticket.place - ticket.place % f.window.max(1);
            ("fw", f.window, start)
        }
        Algorithm::SlidingWindow(s) => ("sw", s.window, ticket.place),
        Algorithm::TokenBucket(t) => ("tb", t.interval, ticket.place),
        Algorithm::LeakyBucket(_) | Algorithm::Concurrency(_) => return None,
    };
    Some([
        kind.into(),
        span.to_string(),
        place.to_string(),
        "1".into(),
        ticket.at.to_string(),
    ])
}

/// What an admitted request held in Redis, to give back.
pub(super) enum Held {
    /// A concurrency slot: the sorted-set member.
    Slot(String),
    /// A leaky-bucket place: the ticket in Redis' clock.
    Place(Nanos),
}

/// The 3 arguments of a `release` call; `None` when what is held does not
/// belong to this algorithm (a reload changed it): a slot then frees itself
/// with its lease, a place with its turn.
pub(super) fn release(algorithm: &Algorithm, held: Held) -> Option<[String; 3]> {
    match (algorithm, held) {
        (Algorithm::Concurrency(_), Held::Slot(member)) => {
            Some(["cc".into(), member, String::new()])
        }
        (Algorithm::LeakyBucket(l), Held::Place(at)) => {
            Some(["lb".into(), l.interval.to_string(), at.to_string()])
        }
        (Algorithm::Concurrency(_), Held::Place(_))
        | (Algorithm::LeakyBucket(_), Held::Slot(_))
        | (
            Algorithm::FixedWindow(_) | Algorithm::SlidingWindow(_) | Algorithm::TokenBucket(_),
            Held::Slot(_) | Held::Place(_),
        ) => None,
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_parameters_keep_lua_arithmetic_exact() {
        assert_eq!(gcd(NANOS_PER_SEC, 60 * NANOS_PER_SEC), NANOS_PER_SEC);
        assert_eq!(gcd(NANOS_PER_SEC, 1_500_000_000), 500_000_000);
        assert_eq!(gcd(NANOS_PER_SEC, 7), 1);
    }
}
