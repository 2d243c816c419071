//! Sliding windows kept as an exact log of admitted requests: no boundary burst.
//!
//! An admission at `t` counts at every `now` with `now - window < t <= now`, so
//! it stops counting at `t + window` exactly. Because a request is allowed only
//! while fewer than `limit` admissions count, no interval of length `window`
//! (half-open, `[a, a + window)`) ever holds more than `limit` admissions.
//!
//! Memory: 8 bytes per admitted request still in the window, plus the
//! `VecDeque` header (32 bytes on 64-bit targets). The log never holds more than
//! `limit` entries: the newest `limit` admissions alone decide every ruling and
//! quota under this limit, so older ones are dropped on `record`.

use std::collections::VecDeque;

use super::lease::Unspent;
use super::script::exact;
use super::{span_words, Given, Hold, Kept, Measure, Nanos, Param, Quota, Rule, Ruling, Ticket};

/// The largest limit: the exact log costs 8 bytes per admitted request and
/// key, so a larger limit would let one key take megabytes.
pub const MAX_LIMIT: u64 = 100_000;

#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    pub limit: u64,
    /// Window length, > 0.
    pub window: Nanos,
}

/// Timestamps of admitted requests, oldest first. Boxed: the log is the
/// one variable-size state, and every other key of a table should not pay
/// for its header.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlidingWindowState {
    pub admitted: Box<VecDeque<Nanos>>,
}

impl SlidingWindow {
    /// Whether an admission at `t` still counts at `now`. Saturating, so that
    /// near `u64::MAX` an entry simply never leaves instead of wrapping.
    fn counts(&self, t: Nanos, now: Nanos) -> bool {
        t.saturating_add(self.window) > now
    }

    /// Index of the oldest entry that still counts at `now`; the log is sorted,
    /// so everything from here on counts.
    fn first_counting(&self, state: &SlidingWindowState, now: Nanos) -> usize {
        state.admitted.partition_point(|&t| !self.counts(t, now))
    }

    fn in_window(&self, state: &SlidingWindowState, now: Nanos) -> u64 {
        (state.admitted.len() - self.first_counting(state, now)) as u64
    }
}

impl Rule for SlidingWindow {
    type State = SlidingWindowState;
    const NAME: &'static str = "sliding_window";
    const PARAMS: &'static [(&'static str, Measure)] =
        &[("limit", Measure::Count), ("window", Measure::Span)];
    const COUNT_REFUSAL: Option<&'static str> = None;
    const COUNTS_REFUSED: bool = false;
    const HOLDS: Hold = Hold::Nothing;
    const SHAPE_TAG: u8 = 2;
    const SCRIPT_TAG: &'static str = "sw";
    const LEASE_REFUSAL: Option<&'static str> = None;
    const KEPT: Kept = Kept::Words;

    /// At most [`MAX_LIMIT`]: the log costs 8 bytes per admitted request and key.
    fn from_given(given: &mut dyn Given) -> Self {
        let limit = given.number("limit", 1);
        if limit > MAX_LIMIT {
            given.refuse(
                "limit",
                format!("sliding_window keeps an exact log of 8 bytes per request; at most {MAX_LIMIT} (use token_bucket or fixed_window for higher rates)"),
            );
        }
        SlidingWindow {
            limit,
            window: given.span("window"),
        }
    }

    fn check(&self, state: &SlidingWindowState, now: Nanos) -> Ruling {
        let first = self.first_counting(state, now);
        let count = (state.admitted.len() - first) as u64;
        if count < self.limit {
            return Ruling::Allow;
        }
        if self.limit == 0 {
            // Nothing ever frees a slot; a window is as honest a hint as any.
            return Ruling::Deny {
                retry_after: self.window.max(1),
            };
        }
        // One slot frees when all but `limit - 1` of the counting entries have
        // left: that is the entry `count - limit` places after the oldest one.
        // A lowered limit (count > limit) just makes us wait for a later entry.
        let must_leave = state.admitted[first + (count - self.limit) as usize];
        Ruling::Deny {
            retry_after: must_leave
                .saturating_add(self.window)
                .saturating_sub(now)
                .max(1),
        }
    }

    /// Only admissions are logged; a refused request leaves nothing behind.
    fn record(&self, state: &mut SlidingWindowState, now: Nanos, admitted: bool) {
        let stale = self.first_counting(state, now);
        state.admitted.drain(..stale);
        if admitted {
            // A clock that stepped back must not unsort the log: file the
            // entry where it belongs rather than at the end.
            let at = state.admitted.partition_point(|&t| t <= now);
            state.admitted.insert(at, now);
        }
        // Entries beyond the newest `limit` cannot change any answer under this
        // limit (see `check`); they appear only after a lowered limit or when
        // the request went through although this limiter refused it.
        let excess = state
            .admitted
            .len()
            .saturating_sub(usize::try_from(self.limit).unwrap_or(usize::MAX));
        state.admitted.drain(..excess);
        if state.admitted.capacity() > 16 && state.admitted.len() * 4 < state.admitted.capacity() {
            state.admitted.shrink_to_fit();
        }
    }

    fn quota(&self, state: &SlidingWindowState, now: Nanos) -> Quota {
        let reset_after = match state.admitted.back() {
            Some(&newest) if self.counts(newest, now) => newest.saturating_add(self.window) - now,
            _ => 0,
        };
        Quota {
            limit: self.limit,
            window: Some(self.window),
            remaining: self.limit.saturating_sub(self.in_window(state, now)),
            reset_after,
        }
    }

    /// `count:` — the ticket is the admission's instant: its log entry is
    /// removed (one entry, if several share the instant). An entry already
    /// dropped (out of the window, or beyond the newest `limit`) no longer
    /// weighs on any answer, so nothing is given back for it.
    fn refund(&self, state: &mut SlidingWindowState, ticket: Ticket, _now: Nanos) {
        if let Some(i) = state.admitted.iter().position(|&t| t == ticket.place) {
            state.admitted.remove(i);
        }
    }

    /// Once the newest entry has left the window the log says nothing.
    fn expires_at(&self, state: &SlidingWindowState) -> Nanos {
        state
            .admitted
            .back()
            .map_or(0, |&newest| newest.saturating_add(self.window))
    }

    fn shape_span(&self) -> Nanos {
        self.window
    }

    fn describe(&self) -> String {
        format!(
            "{} requests per sliding {}",
            self.limit,
            span_words(self.window)
        )
    }

    fn ban_window(&self) -> Option<Nanos> {
        Some(self.window)
    }

    fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    fn params(&self) -> Vec<(&'static str, Param)> {
        vec![
            ("limit", Param::Count(self.limit)),
            ("window", Param::Span(self.window)),
        ]
    }

    /// The log, oldest first.
    /// A lease lasts 1/100 of the window; its units are logged at the end
    /// of its term, so each counts a whole window after any instant it may
    /// be spent at.
    fn lease_span(&self) -> Option<Nanos> {
        Some(self.window)
    }

    /// Unspent units are taken out of the log again: the entries at the term's end.
    fn lease_unspent(&self, at: Nanos, term: Nanos) -> Unspent {
        Unspent::Returned { place: at + term }
    }

    /// `limit, window`.
    fn script_params(&self) -> Result<[u64; 5], Nanos> {
        Ok([self.limit, exact(self.window)?, 0, 0, 0])
    }

    fn words(state: &SlidingWindowState) -> Vec<u64> {
        state.admitted.iter().copied().collect()
    }

    fn from_words(words: &[u64]) -> Option<SlidingWindowState> {
        Some(SlidingWindowState {
            admitted: Box::new(words.iter().copied().collect()),
        })
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NANOS_PER_SEC as S;
    use proptest::prelude::*;

    const T0: Nanos = 1_767_225_620 * S;

    fn five_per_minute() -> SlidingWindow {
        SlidingWindow {
            limit: 5,
            window: 60 * S,
        }
    }

    #[test]
    fn a_refund_removes_the_admission_and_frees_its_slot() {
        let rule = five_per_minute();
        let mut state = SlidingWindowState::default();
        for i in 0..5 {
            attempt(&rule, &mut state, T0 + i * S);
        }
        assert!(rule.check(&state, T0 + 5 * S).is_deny());
        rule.refund(&mut state, Ticket::at(T0 + 2 * S), T0 + 5 * S);
        assert_eq!(rule.check(&state, T0 + 5 * S), Ruling::Allow);
        assert_eq!(state.admitted.len(), 4);
        // An unknown ticket changes nothing.
        rule.refund(&mut state, Ticket::at(T0 + 2 * S), T0 + 5 * S);
        assert_eq!(state.admitted.len(), 4);
    }

    /// check, then record with the limiter's own answer, as a lone limiter does.
    fn attempt(rule: &SlidingWindow, state: &mut SlidingWindowState, now: Nanos) -> Ruling {
        let ruling = rule.check(state, now);
        rule.record(state, now, !ruling.is_deny());
        ruling
    }

    #[test]
    fn accepts_up_to_the_limit_and_rejects_the_next() {
        let rule = five_per_minute();
        let mut state = SlidingWindowState::default();
        for i in 0..5 {
            assert_eq!(attempt(&rule, &mut state, T0 + i * S), Ruling::Allow);
        }
        assert_eq!(
            attempt(&rule, &mut state, T0 + 10 * S),
            Ruling::Deny {
                retry_after: 50 * S
            }
        );
    }

    #[test]
    fn a_slot_frees_exactly_one_window_after_the_oldest_admission() {
        let rule = five_per_minute();
        let mut state = SlidingWindowState::default();
        for i in 0..5 {
            attempt(&rule, &mut state, T0 + i * S);
        }
        let free_at = T0 + 60 * S;
        assert_eq!(
            rule.check(&state, free_at - 1),
            Ruling::Deny { retry_after: 1 }
        );
        assert_eq!(rule.check(&state, free_at), Ruling::Allow);
        assert_eq!(attempt(&rule, &mut state, free_at), Ruling::Allow);
        assert_eq!(
            rule.check(&state, free_at),
            Ruling::Deny { retry_after: S },
            "the next slot frees when the second admission leaves"
        );
    }

    #[test]
    fn no_burst_across_a_window_boundary() {
        let rule = five_per_minute();
        let mut state = SlidingWindowState::default();
        let end_of_minute = T0 + 40 * S - 1;
        for _ in 0..5 {
            assert_eq!(attempt(&rule, &mut state, end_of_minute), Ruling::Allow);
        }
        assert!(attempt(&rule, &mut state, end_of_minute + 1).is_deny());
        assert_eq!(
            rule.check(&state, end_of_minute + 60 * S - 1),
            Ruling::Deny { retry_after: 1 }
        );
        assert_eq!(rule.check(&state, end_of_minute + 60 * S), Ruling::Allow);
    }

    #[test]
    fn rejected_request_leaves_no_entry() {
        let rule = five_per_minute();
        let mut state = SlidingWindowState::default();
        for _ in 0..5 {
            attempt(&rule, &mut state, T0);
        }
        let before = state.clone();
        rule.record(&mut state, T0 + S, false);
        assert_eq!(state, before);
        rule.record(&mut state, T0 + 60 * S, false);
        assert!(state.admitted.is_empty(), "only pruning happened");
    }

    #[test]
    fn quota_counts_what_is_left_and_when_all_of_it_is_back() {
        let rule = five_per_minute();
        let mut state = SlidingWindowState::default();
        attempt(&rule, &mut state, T0);
        attempt(&rule, &mut state, T0 + 10 * S);
        assert_eq!(
            rule.quota(&state, T0 + 20 * S),
            Quota {
                limit: 5,
                window: Some(60 * S),
                remaining: 3,
                reset_after: 50 * S,
            }
        );
        assert_eq!(rule.quota(&state, T0 + 60 * S).remaining, 4);
        let idle = rule.quota(&state, T0 + 70 * S);
        assert_eq!((idle.remaining, idle.reset_after), (5, 0));
        assert_eq!(rule.expires_at(&state), T0 + 70 * S);
        assert_eq!(rule.expires_at(&SlidingWindowState::default()), 0);
    }

    #[test]
    fn a_lowered_limit_denies_until_enough_entries_leave() {
        let mut state = SlidingWindowState::default();
        for i in 0..5 {
            attempt(&five_per_minute(), &mut state, T0 + i * S);
        }
        let lowered = SlidingWindow {
            limit: 2,
            ..five_per_minute()
        };
        let now = T0 + 10 * S;
        assert_eq!(
            lowered.check(&state, now),
            Ruling::Deny {
                retry_after: 53 * S
            },
            "the fourth admission (T0 + 3 s) must leave for two to count"
        );
        assert_eq!(lowered.quota(&state, now).remaining, 0);
        lowered.record(&mut state, now, false);
        assert_eq!(
            *state.admitted,
            [T0 + 3 * S, T0 + 4 * S],
            "only the newest two can matter"
        );
        assert_eq!(
            lowered.check(&state, now),
            Ruling::Deny {
                retry_after: 53 * S
            },
            "trimming the log changes no answer"
        );
    }

    #[test]
    fn a_zero_limit_denies_everything() {
        let rule = SlidingWindow {
            limit: 0,
            window: 60 * S,
        };
        let mut state = SlidingWindowState::default();
        assert_eq!(
            attempt(&rule, &mut state, T0),
            Ruling::Deny {
                retry_after: 60 * S
            }
        );
        assert!(state.admitted.is_empty());
    }

    #[test]
    fn a_clock_stepping_back_keeps_the_log_sorted() {
        let rule = five_per_minute();
        let mut state = SlidingWindowState::default();
        attempt(&rule, &mut state, T0 + 5 * S);
        attempt(&rule, &mut state, T0);
        assert_eq!(*state.admitted, [T0, T0 + 5 * S]);
    }

    /// Sorted arrivals: `(gap, burst)` pairs, each a gap then `burst` requests
    /// at the same nanosecond.
    fn arrivals() -> impl Strategy<Value = Vec<Nanos>> {
        prop::collection::vec((0u64..40, 1usize..5), 1..60).prop_map(|steps| {
            let mut now = T0;
            let mut out = Vec::new();
            for (gap, burst) in steps {
                now += gap;
                out.extend(std::iter::repeat_n(now, burst));
            }
            out
        })
    }

    proptest! {
        #[test]
        fn no_interval_of_one_window_holds_more_than_limit_admissions(
            limit in 0u64..6,
            window in 1u64..60,
            times in arrivals(),
        ) {
            let rule = SlidingWindow { limit, window };
            let mut state = SlidingWindowState::default();
            let mut admitted = Vec::new();
            for &now in &times {
                if !attempt(&rule, &mut state, now).is_deny() {
                    admitted.push(now);
                }
            }
            // The busiest interval can always be slid to start at an admission.
            for &a in &admitted {
                let inside = admitted.iter().filter(|&&t| a <= t && t < a + window).count();
                prop_assert!(inside as u64 <= limit, "{inside} in [{a}, {})", a + window);
            }
        }

        #[test]
        fn verdicts_match_a_brute_force_count_and_retry_after_is_exact(
            limit in 1u64..6,
            window in 1u64..60,
            times in arrivals(),
        ) {
            let rule = SlidingWindow { limit, window };
            let mut state = SlidingWindowState::default();
            let mut admitted: Vec<Nanos> = Vec::new();
            for &now in &times {
                let counting = admitted.iter().filter(|&&t| now < t + window).count() as u64;
                let ruling = rule.check(&state, now);
                prop_assert_eq!(ruling.is_deny(), counting >= limit);
                prop_assert_eq!(rule.quota(&state, now).remaining, limit - counting.min(limit));
                if let Ruling::Deny { retry_after } = ruling {
                    prop_assert!(retry_after >= 1);
                    prop_assert!(rule.check(&state, now + retry_after - 1).is_deny());
                    prop_assert_eq!(rule.check(&state, now + retry_after), Ruling::Allow);
                } else {
                    admitted.push(now);
                }
                rule.record(&mut state, now, !ruling.is_deny());
                let q = rule.quota(&state, now);
                prop_assert_eq!(q.remaining == limit, q.reset_after == 0);
                prop_assert_eq!(rule.quota(&state, now + q.reset_after).remaining, limit);
                prop_assert!(rule.expires_at(&state) >= now + q.reset_after);
            }
        }
    }
}
