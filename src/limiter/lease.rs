//! Leased quotas as pure arithmetic: how many units a tollgate may reserve from a shared key, for how long, and what becomes of those it did not spend.
//!
//! A lease is taken in the same atomic store call that decides a request
//! (`src/store/redis/lease.lua`): the units are counted in the shared state
//! at once, so other tollgates see them as used, and the tollgate that holds
//! them admits that many requests without asking the store. Whatever the
//! timing, the shared state never counts fewer units than were admitted:
//! **no over-admission**. What a lease costs is under-admission: units
//! reserved and not spent yet, which no other tollgate can use meanwhile.
//!
//! - **Size.** [`grant`]: at most `max`, and at most 1/[`SHARE`] of what the
//!   key has left after the request: a lease shrinks as the key nears its
//!   limit, and the last [`SHARE`] units are never leased (one store call per
//!   request, exactly as without leases).
//! - **Term.** [`term`]: 1/[`TERM_PER`] (1 %) of the algorithm's span (the
//!   window, or the time a token bucket takes to refill completely), and a
//!   fixed window's lease also ends with its window.
//! - **Recorded as if spent at the end of the term**, where the timing
//!   matters: a sliding window logs the leased units at `now + term` (so each
//!   counts for a whole window after any instant it may be spent at), a token
//!   bucket is charged as if they were taken at `now + term`. A fixed window
//!   counts them in the window they belong to, and they can only be spent in it.
//! - **Unspent units** ([`Unspent`]): a fixed window's and a sliding
//!   window's go back to the shared state when the lease ends; a token
//!   bucket's were taken now and are not given back (the bucket refills them).

use super::{Algorithm, Nanos};

/// `lease: { max: N }` on a limiter: reserve up to `max` units at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub max: u64,
}

/// A lease takes at most 1/`SHARE` of what the key has left after the
/// request that asks for it; below `SHARE` units left it takes none.
pub const SHARE: u64 = 8;
/// A lease lasts 1/`TERM_PER` of the algorithm's span.
pub const TERM_PER: u64 = 100;
/// The shortest term: below it a lease would end before it could be spent.
pub const LEAST_TERM: Nanos = 1_000_000;
/// The largest `max`: the store's script writes a sliding window's leased
/// units as that many list entries in one command.
pub const MAX_UNITS: u64 = 1_000;

/// What becomes of the units a lease did not spend by its end (each
/// algorithm's [`super::Rule::lease_unspent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unspent {
    /// They are taken out of the shared state again, at `place`: the
    /// window they were counted in, or the log entry they were written as.
    Returned { place: Nanos },
    /// They stay counted (a token bucket refills them at its rate).
    Lost,
}

/// How many units a lease of at most `max` takes when `remaining` units are
/// left after the request itself: 0 in the last [`SHARE`] units.
pub fn grant(max: u64, remaining: u64) -> u64 {
    max.min(remaining / SHARE)
}

/// How long a lease on `algorithm` lasts, from the instant the store
/// granted it; `None` where leases do not apply. An algorithm may end a
/// lease earlier ([`ends_after`]).
pub fn term(algorithm: &Algorithm) -> Option<Nanos> {
    let span = algorithm.lease_span()?;
    Some((span / TERM_PER).max(LEAST_TERM))
}

/// How long after the store's instant `at` a lease granted then may be
/// spent: its term, and for a fixed window no later than the window's end.
pub fn ends_after(algorithm: &Algorithm, at: Nanos) -> Nanos {
    algorithm.lease_ends_after(at, term(algorithm).unwrap_or(0))
}

/// What becomes of the units a lease on `algorithm`, granted at `at`, did not spend.
pub fn unspent(algorithm: &Algorithm, at: Nanos) -> Unspent {
    algorithm.lease_unspent(at, term(algorithm).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::fixed_window::FixedWindow;
    use crate::limiter::token_bucket::TokenBucket;
    use crate::limiter::AlgorithmKind;
    use crate::limiter::NANOS_PER_SEC as S;

    #[test]
    fn a_key_far_from_its_limit_gets_the_whole_lease() {
        assert_eq!(grant(10, 999), 10);
        assert_eq!(grant(10, 500), 10);
        assert_eq!(grant(50, 1000), 50);
    }

    #[test]
    fn the_lease_shrinks_as_the_key_nears_its_limit() {
        let sizes: Vec<u64> = [400, 80, 79, 40, 24, 16].map(|r| grant(50, r)).to_vec();
        assert_eq!(sizes, [50, 10, 9, 5, 3, 2]);
        // Never more than an eighth of what is left, so never all of it.
        for remaining in 0..10_000 {
            assert!(grant(u64::MAX, remaining) * SHARE <= remaining);
        }
    }

    #[test]
    fn the_last_units_are_never_leased() {
        for remaining in 0..SHARE {
            assert_eq!(grant(10, remaining), 0, "{remaining} left");
        }
        assert_eq!(grant(10, SHARE), 1);
    }

    #[test]
    fn a_lease_lasts_one_hundredth_of_the_span() {
        let window = Algorithm::FixedWindow(FixedWindow {
            limit: 100,
            window: 60 * S,
        });
        assert_eq!(term(&window), Some(600_000_000));
        // 1000 tokens at 100/s refill in 10 s: the lease lasts 100 ms.
        let bucket = Algorithm::TokenBucket(TokenBucket {
            capacity: 1000,
            interval: 10_000_000,
            refunds: false,
        });
        assert_eq!(term(&bucket), Some(100_000_000));
        let tiny = Algorithm::FixedWindow(FixedWindow {
            limit: 1,
            window: 10_000,
        });
        assert_eq!(term(&tiny), Some(LEAST_TERM));
    }

    #[test]
    fn a_fixed_window_lease_ends_with_its_window() {
        let window = Algorithm::FixedWindow(FixedWindow {
            limit: 100,
            window: 60 * S,
        });
        assert_eq!(ends_after(&window, 120 * S), 600_000_000);
        assert_eq!(ends_after(&window, 179_900_000_000), 100_000_000);
    }

    #[test]
    fn only_a_token_bucket_keeps_the_units_it_did_not_spend() {
        let bucket = Algorithm::TokenBucket(TokenBucket {
            capacity: 10,
            interval: S,
            refunds: false,
        });
        assert_eq!(unspent(&bucket, 5 * S), Unspent::Lost);
        let window = Algorithm::FixedWindow(FixedWindow {
            limit: 10,
            window: 2 * S,
        });
        assert_eq!(
            unspent(&window, 5 * S),
            Unspent::Returned { place: 4 * S },
            "back to the window they were counted in"
        );
    }

    #[test]
    fn an_algorithm_takes_leases_exactly_when_it_says_so() {
        for kind in AlgorithmKind::ALL {
            let algorithm = kind.build(&mut crate::limiter::tests::Reads::default());
            assert_eq!(
                kind.lease_refusal().is_none(),
                term(&algorithm).is_some(),
                "{}",
                kind.name()
            );
        }
        assert!(AlgorithmKind::Concurrency.lease_refusal().is_some());
        assert!(AlgorithmKind::LeakyBucket.lease_refusal().is_some());
        let leasing: Vec<&str> = AlgorithmKind::ALL
            .into_iter()
            .filter(|k| k.lease_refusal().is_none())
            .map(AlgorithmKind::name)
            .collect();
        let (last, rest) = leasing.split_last().expect("some algorithm leases");
        assert_eq!(
            AlgorithmKind::leasing(),
            format!("{} and {last}", rest.join(", "))
        );
    }
}
