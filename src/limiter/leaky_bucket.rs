//! Leaky buckets as a shaper: releases spaced by `interval`, a bounded queue waits.
//!
//! Requests are let through toward the upstream no faster than one per
//! `interval`. One that arrives while the previous release is less than an
//! interval ago is not refused but delayed (`Ruling::Delay`) to the next free
//! instant; at most `capacity` requests wait at any instant, the rest are
//! denied. `capacity = 0` is a pure policer: strict spacing, no queue.
//!
//! The state is the one instant `next_free` at which the next request may be
//! released. The requests waiting at `now` hold the instants
//! `next_free - k * interval > now`, `k = 1, 2, …`, so with
//! `d = next_free - now > 0` there are at most `ceil(d / interval) - 1` of them
//! (exactly that many unless a cancelled request left a gap). Admitting one more
//! makes that `ceil(d / interval)`, which is why a request is delayed only while
//! `ceil(d / interval) <= capacity`, i.e. `d <= capacity * interval`.
//!
//! Guarantees: release instants of the admitted requests that did not go away
//! are non-decreasing in admission order and at least `interval` apart; no
//! more than `capacity` of them are waiting at any instant.
//!
//! A lowered `capacity` (reload) keeps `next_free`: the queue already promised
//! stays, newcomers are denied until it has shrunk below the new capacity.
//!
//! Memory: 8 bytes per key.

use super::script::exact;
use super::{rate_words, Given, Hold, Kept, Measure, Nanos, Param, Quota, Rule, Ruling};

#[derive(Debug, Clone, PartialEq)]
pub struct LeakyBucket {
    /// How many requests may wait at once.
    pub capacity: u64,
    /// Nanoseconds between releases (1e9 / leak per second), > 0.
    pub interval: Nanos,
}

/// The earliest instant the next request may be released; `0` is an idle bucket.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeakyBucketState {
    pub next_free: Nanos,
}

impl LeakyBucket {
    fn interval(&self) -> Nanos {
        self.interval.max(1)
    }

    /// Requests holding a release instant after `now`. Counts a gap left by a
    /// cancellation as a waiter: over-counting only ever refuses, never floods.
    fn waiting(&self, state: &LeakyBucketState, now: Nanos) -> u64 {
        let d = state.next_free.saturating_sub(now);
        d.div_ceil(self.interval()).saturating_sub(1)
    }
}

impl Rule for LeakyBucket {
    type State = LeakyBucketState;
    const NAME: &'static str = "leaky_bucket";
    const PARAMS: &'static [(&'static str, Measure)] = &[
        ("capacity", Measure::Count),
        ("leak_per_second", Measure::PerSecond),
    ];
    const COUNT_REFUSAL: Option<&'static str> = Some("delays requests rather than counting them");
    const COUNTS_REFUSED: bool = false;
    const HOLDS: Hold = Hold::Place;
    /// No queue: a pure policer.
    const LEAST_LIMIT: u64 = 0;
    const SHAPE_TAG: u8 = 4;
    const SCRIPT_TAG: &'static str = "lb";
    const LEASE_REFUSAL: Option<&'static str> =
        Some("spaces requests out one by one; a unit reserved ahead would shape nothing");
    const KEPT: Kept = Kept::Words;

    /// `capacity: 0` is a pure policer: no queue.
    fn from_given(given: &mut dyn Given) -> Self {
        let capacity = given.number("capacity", 0);
        LeakyBucket {
            capacity,
            interval: given.rate("leak_per_second", capacity, "a full queue must drain"),
        }
    }

    fn check(&self, state: &LeakyBucketState, now: Nanos) -> Ruling {
        let d = state.next_free.saturating_sub(now);
        if d == 0 {
            return Ruling::Allow;
        }
        if self.waiting(state, now) < self.capacity {
            return Ruling::Delay(d);
        }
        // One waiter leaves each interval; once `d <= capacity * interval` this
        // request would be the `capacity`-th waiter, which is still allowed.
        // Here `d > capacity * interval`, so the product does not saturate
        // and the wait is at least 1 ns.
        Ruling::Deny {
            retry_after: d - self.capacity.saturating_mul(self.interval()),
        }
    }

    /// The admitted request takes the slot `max(now, next_free)`, which is
    /// exactly `now` plus the delay `check` announced.
    fn record(&self, state: &mut LeakyBucketState, now: Nanos, admitted: bool) {
        if admitted {
            state.next_free = state.next_free.max(now).saturating_add(self.interval());
        }
    }

    fn quota(&self, state: &LeakyBucketState, now: Nanos) -> Quota {
        Quota {
            limit: self.capacity,
            window: Some(self.capacity.saturating_mul(self.interval)),
            remaining: self.capacity.saturating_sub(self.waiting(state, now)),
            // Nobody waits once the last waiter is released at `next_free - interval`.
            reset_after: state
                .next_free
                .saturating_sub(now)
                .saturating_sub(self.interval()),
        }
    }

    /// From `next_free` on the bucket answers like a fresh one.
    fn expires_at(&self, state: &LeakyBucketState) -> Nanos {
        state.next_free
    }

    /// A waiting request went away before its slot. Only the last slot can be
    /// handed back: every other request keeps its instant, so freeing a middle
    /// slot would either break the spacing or need the whole queue, and a gap
    /// just costs a little throughput. The last slot is `next_free - interval`
    /// and every other live slot is at most `ticket - interval`, so `ticket`
    /// is a safe next instant. A request already released (`now >= ticket`)
    /// used its slot and gives nothing back.
    fn release(&self, state: &mut LeakyBucketState, ticket: Nanos, now: Nanos) {
        if now < ticket && ticket.checked_add(self.interval()) == Some(state.next_free) {
            state.next_free = ticket;
        }
    }

    fn shape_span(&self) -> Nanos {
        self.interval
    }

    fn describe(&self) -> String {
        format!(
            "{} queued requests, released at {}/s",
            self.capacity,
            rate_words(self.interval)
        )
    }

    /// The time a full queue takes to drain.
    fn ban_window(&self) -> Option<Nanos> {
        Some(self.capacity.max(1).saturating_mul(self.interval).max(1))
    }

    fn set_limit(&mut self, limit: u64) {
        self.capacity = limit;
    }

    fn params(&self) -> Vec<(&'static str, Param)> {
        vec![
            ("capacity", Param::Count(self.capacity)),
            ("leak_per_second", Param::PerSecond(self.interval)),
        ]
    }

    /// `capacity, interval`.
    fn script_params(&self) -> Result<[u64; 5], Nanos> {
        exact(self.capacity.saturating_add(1).saturating_mul(self.interval))?;
        Ok([self.capacity, self.interval, 0, 0, 0])
    }

    fn words(state: &LeakyBucketState) -> Vec<u64> {
        vec![state.next_free]
    }

    fn from_words(words: &[u64]) -> Option<LeakyBucketState> {
        Some(LeakyBucketState {
            next_free: *words.first()?,
        })
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NANOS_PER_SEC as S;
    use proptest::prelude::*;

    const T0: Nanos = 1_767_225_620 * S;

    /// One release per second, two may wait.
    fn two_waiting_at_one_per_second() -> LeakyBucket {
        LeakyBucket {
            capacity: 2,
            interval: S,
        }
    }

    /// check, then record with the limiter's own answer; the release instant
    /// when admitted.
    fn attempt(rule: &LeakyBucket, state: &mut LeakyBucketState, now: Nanos) -> (Ruling, Option<Nanos>) {
        let ruling = rule.check(state, now);
        rule.record(state, now, !ruling.is_deny());
        let ticket = match ruling {
            Ruling::Allow => Some(now),
            Ruling::Delay(d) => Some(now + d),
            Ruling::Deny { .. } => None,
        };
        (ruling, ticket)
    }

    #[test]
    fn an_idle_bucket_lets_one_through_then_queues_capacity_then_rejects() {
        let rule = two_waiting_at_one_per_second();
        let mut state = LeakyBucketState::default();
        assert_eq!(attempt(&rule, &mut state, T0).0, Ruling::Allow);
        assert_eq!(attempt(&rule, &mut state, T0).0, Ruling::Delay(S));
        assert_eq!(attempt(&rule, &mut state, T0).0, Ruling::Delay(2 * S));
        assert_eq!(
            attempt(&rule, &mut state, T0).0,
            Ruling::Deny { retry_after: S }
        );
        assert_eq!(state.next_free, T0 + 3 * S);
    }

    #[test]
    fn a_place_in_the_queue_frees_exactly_when_the_first_waiter_leaves() {
        let rule = two_waiting_at_one_per_second();
        let mut state = LeakyBucketState::default();
        for _ in 0..3 {
            attempt(&rule, &mut state, T0);
        }
        let leaves = T0 + S;
        assert_eq!(
            rule.check(&state, leaves - 1),
            Ruling::Deny { retry_after: 1 }
        );
        assert_eq!(attempt(&rule, &mut state, leaves).0, Ruling::Delay(2 * S));
    }

    #[test]
    fn rejected_request_takes_no_slot() {
        let rule = two_waiting_at_one_per_second();
        let mut state = LeakyBucketState::default();
        for _ in 0..3 {
            attempt(&rule, &mut state, T0);
        }
        let before = state.clone();
        assert!(attempt(&rule, &mut state, T0 + S / 2).0.is_deny());
        rule.record(&mut state, T0 + S / 2, false);
        assert_eq!(state, before);
    }

    #[test]
    fn a_zero_capacity_spaces_requests_without_a_queue() {
        let rule = LeakyBucket {
            capacity: 0,
            interval: S,
        };
        let mut state = LeakyBucketState::default();
        assert_eq!(attempt(&rule, &mut state, T0).0, Ruling::Allow);
        assert_eq!(
            attempt(&rule, &mut state, T0 + S / 4).0,
            Ruling::Deny {
                retry_after: 3 * S / 4
            }
        );
        assert_eq!(attempt(&rule, &mut state, T0 + S).0, Ruling::Allow);
    }

    #[test]
    fn quota_counts_free_places_in_the_queue() {
        let rule = two_waiting_at_one_per_second();
        let mut state = LeakyBucketState::default();
        for _ in 0..3 {
            attempt(&rule, &mut state, T0);
        }
        assert_eq!(
            rule.quota(&state, T0),
            Quota {
                limit: 2,
                window: Some(2 * S),
                remaining: 0,
                reset_after: 2 * S,
            }
        );
        assert_eq!(rule.quota(&state, T0 + S).remaining, 1);
        let empty = rule.quota(&state, T0 + 2 * S);
        assert_eq!((empty.remaining, empty.reset_after), (2, 0));
        assert_eq!(rule.expires_at(&state), T0 + 3 * S);
    }

    #[test]
    fn a_cancelled_last_waiter_hands_its_slot_back() {
        let rule = two_waiting_at_one_per_second();
        let mut state = LeakyBucketState::default();
        let tickets: Vec<_> = (0..3)
            .map(|_| attempt(&rule, &mut state, T0).1.unwrap())
            .collect();
        rule.release(&mut state, tickets[2], T0 + S / 2);
        assert_eq!(state.next_free, T0 + 2 * S);
        assert_eq!(
            attempt(&rule, &mut state, T0 + S / 2),
            (Ruling::Delay(3 * S / 2), Some(T0 + 2 * S))
        );
    }

    #[test]
    fn a_cancelled_middle_waiter_leaves_a_gap() {
        let rule = two_waiting_at_one_per_second();
        let mut state = LeakyBucketState::default();
        let tickets: Vec<_> = (0..3)
            .map(|_| attempt(&rule, &mut state, T0).1.unwrap())
            .collect();
        let before = state.clone();
        rule.release(&mut state, tickets[1], T0 + S / 2);
        assert_eq!(state, before);
    }

    #[test]
    fn a_request_that_was_already_released_gives_nothing_back() {
        let rule = two_waiting_at_one_per_second();
        let mut state = LeakyBucketState::default();
        let ticket = attempt(&rule, &mut state, T0).1.unwrap();
        let before = state.clone();
        rule.release(&mut state, ticket, T0);
        rule.release(&mut state, ticket, T0 + S / 2);
        assert_eq!(state, before, "finishing is not cancelling");
        assert_eq!(rule.check(&state, T0 + S / 2), Ruling::Delay(S / 2));
    }

    #[test]
    fn a_lowered_capacity_keeps_the_queue_and_denies_newcomers() {
        let mut state = LeakyBucketState::default();
        for _ in 0..3 {
            attempt(&two_waiting_at_one_per_second(), &mut state, T0);
        }
        let lowered = LeakyBucket {
            capacity: 1,
            ..two_waiting_at_one_per_second()
        };
        assert_eq!(
            lowered.check(&state, T0),
            Ruling::Deny { retry_after: 2 * S }
        );
        assert_eq!(lowered.quota(&state, T0).remaining, 0);
        assert_eq!(lowered.check(&state, T0 + 2 * S), Ruling::Delay(S));
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// `burst` arrivals after `gap`; the first `refused` of them are
        /// refused by another limiter.
        Arrive {
            gap: Nanos,
            burst: usize,
            refused: usize,
        },
        /// After `gap`, one waiting request (picked by `pick`) disconnects.
        Cancel { gap: Nanos, pick: usize },
        /// After `gap`, one released request (picked by `pick`) finishes.
        Finish { gap: Nanos, pick: usize },
    }

    fn ops(cancels: bool) -> impl Strategy<Value = Vec<Op>> {
        let arrive =
            (0u64..30, 1usize..5, 0usize..3).prop_map(|(gap, burst, refused)| Op::Arrive {
                gap,
                burst,
                refused,
            });
        let other = (0u64..30, any::<usize>(), any::<bool>()).prop_map(|(gap, pick, cancel)| {
            if cancel {
                Op::Cancel { gap, pick }
            } else {
                Op::Finish { gap, pick }
            }
        });
        let op = if cancels {
            prop_oneof![2 => arrive, 1 => other].boxed()
        } else {
            arrive.boxed()
        };
        prop::collection::vec(op, 1..80)
    }

    struct Waiter {
        ticket: Nanos,
        gone: bool,
        finished: bool,
    }

    proptest! {
        #[test]
        fn releases_are_spaced_and_the_queue_never_exceeds_capacity(
            capacity in 0u64..5,
            interval in 1u64..20,
            ops in ops(true),
        ) {
            let rule = LeakyBucket { capacity, interval };
            let mut state = LeakyBucketState::default();
            let mut now = T0;
            let mut log: Vec<Waiter> = Vec::new();
            for op in ops {
                match op {
                    Op::Arrive { gap, burst, refused } => {
                        now += gap;
                        for i in 0..burst {
                            let ruling = rule.check(&state, now);
                            let admit = !ruling.is_deny() && i >= refused;
                            rule.record(&mut state, now, admit);
                            if admit {
                                let delay = match ruling {
                                    Ruling::Delay(d) => d,
                                    _ => 0,
                                };
                                log.push(Waiter { ticket: now + delay, gone: false, finished: false });
                            }
                        }
                    }
                    Op::Cancel { gap, pick } => {
                        now += gap;
                        let waiting: Vec<_> = log.iter_mut().filter(|a| !a.gone && a.ticket > now).collect();
                        let n = waiting.len();
                        if let Some(a) = waiting.into_iter().nth(pick % n.max(1)) {
                            a.gone = true;
                            rule.release(&mut state, a.ticket, now);
                        }
                    }
                    Op::Finish { gap, pick } => {
                        now += gap;
                        let done: Vec<_> = log.iter_mut().filter(|a| !a.gone && !a.finished && a.ticket <= now).collect();
                        let n = done.len();
                        if let Some(a) = done.into_iter().nth(pick % n.max(1)) {
                            a.finished = true;
                            rule.release(&mut state, a.ticket, now);
                        }
                    }
                }
                // Waiters only join at op instants, so checking here covers every instant.
                let waiting = log.iter().filter(|a| !a.gone && a.ticket > now).count() as u64;
                prop_assert!(waiting <= capacity, "{waiting} waiting at {now}");
                prop_assert!(rule.quota(&state, now).remaining <= capacity - waiting);
            }
            let released: Vec<_> = log.iter().filter(|a| !a.gone).map(|a| a.ticket).collect();
            for pair in released.windows(2) {
                prop_assert!(pair[0] + interval <= pair[1], "releases {pair:?} too close");
            }
        }

        #[test]
        fn without_cancellations_the_count_is_exact_and_retry_after_too(
            capacity in 0u64..5,
            interval in 1u64..20,
            ops in ops(false),
        ) {
            let rule = LeakyBucket { capacity, interval };
            let mut state = LeakyBucketState::default();
            let mut now = T0;
            let mut tickets: Vec<Nanos> = Vec::new();
            for op in ops {
                let Op::Arrive { gap, burst, .. } = op else { unreachable!() };
                now += gap;
                for _ in 0..burst {
                    let waiting = tickets.iter().filter(|&&t| t > now).count() as u64;
                    prop_assert_eq!(rule.quota(&state, now).remaining, capacity - waiting);
                    let ruling = rule.check(&state, now);
                    let free = tickets.last().is_none_or(|&t| t + interval <= now);
                    prop_assert_eq!(ruling == Ruling::Allow, free);
                    prop_assert_eq!(ruling.is_deny(), !free && waiting >= capacity);
                    if let Ruling::Deny { retry_after } = ruling {
                        prop_assert!(retry_after >= 1);
                        prop_assert!(rule.check(&state, now + retry_after - 1).is_deny());
                        prop_assert!(!rule.check(&state, now + retry_after).is_deny());
                    }
                    let (_, ticket) = attempt(&rule, &mut state, now);
                    tickets.extend(ticket);
                    let q = rule.quota(&state, now);
                    prop_assert_eq!(q.remaining == capacity, q.reset_after == 0);
                    prop_assert_eq!(rule.quota(&state, now + q.reset_after).remaining, capacity);
                    prop_assert_eq!(rule.check(&state, rule.expires_at(&state)), Ruling::Allow);
                }
            }
        }
    }
}
