//! Token buckets as GCRA: one theoretical arrival time, integer nanoseconds.
//!
//! A full bucket holds `capacity` tokens, a token comes back every `interval`
//! (continuously: no refill ticks) and an admitted request takes one. Instead
//! of a token count the state keeps `tat`, the instant the bucket is full
//! again; `tat - now` is the debt, in nanoseconds, of the tokens missing now.
//! A request is allowed iff one whole token exists, i.e. the debt is at most
//! `(capacity - 1) * interval`; admitting it adds `interval` to the debt.
//!
//! Bound (with `capacity >= 1`): if `n` requests are admitted at `t_1 <= … <= t_n`,
//! then `n <= capacity + floor((t_n - t_1) / interval)`, whatever the state was
//! before `t_1`. After the first of them `tat >= t_1 + interval`, each later one
//! adds `interval`, so before the `n`-th `tat >= t_1 + (n - 1) * interval`, and
//! admitting it needed `tat - t_n <= (capacity - 1) * interval`. A fresh bucket
//! meets the bound exactly: `capacity` at once, then one per `interval`.
//!
//! A reload that changes `capacity` keeps `tat` (the `Shape` keys on `interval`
//! only), so the debt carries over and the new capacity applies at once: a
//! raise hands out the extra tokens immediately, a lowering may deny until the
//! debt has drained to `(capacity - 1) * interval`. Nothing overflows: debts
//! and sums saturate.
//!
//! `count:` refunds give back exactly the part of their token still
//! unpaid, whatever order answers come back in (see `refunds.rs`). Only a
//! limiter with `count:` keeps that bookkeeping, boxed beside `tat`.
//!
//! Memory: 16 bytes per key (and, with `count:`, a box per debt).

mod refunds;

pub use refunds::{Refunds, MAX_HOLES};

use super::script::exact;
use super::{rate_words, Given, Hold, Kept, Measure, Nanos, Param, Quota, Rule, Ruling, Ticket};

#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    pub capacity: u64,
    /// Nanoseconds per token (1e9 / refill per second), > 0.
    pub interval: Nanos,
    /// `count:` is set: each debt keeps what refunds need ([`Refunds`]).
    pub refunds: bool,
}

/// `tat`: when the bucket is full again. `0` (or anything `<= now`) is a full bucket.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenBucketState {
    pub tat: Nanos,
    /// With `count:`, the current debt's refunds. A debt begun without it
    /// (a reload added `count:`) has none, and its refunds give nothing back.
    pub refunds: Option<Box<Refunds>>,
}

impl TokenBucket {
    /// The largest debt that still leaves one whole token.
    fn tolerance(&self) -> Nanos {
        self.capacity
            .saturating_sub(1)
            .saturating_mul(self.interval)
    }

    fn debt(state: &TokenBucketState, now: Nanos) -> Nanos {
        state.tat.saturating_sub(now)
    }
}

impl Rule for TokenBucket {
    type State = TokenBucketState;
    const NAME: &'static str = "token_bucket";
    const PARAMS: &'static [(&'static str, Measure)] = &[
        ("capacity", Measure::Count),
        ("refill_per_second", Measure::PerSecond),
    ];
    const COUNT_REFUSAL: Option<&'static str> = None;
    const COUNTS_REFUSED: bool = false;
    const HOLDS: Hold = Hold::Nothing;
    const SHAPE_TAG: u8 = 3;
    const SCRIPT_TAG: &'static str = "tb";
    const LEASE_REFUSAL: Option<&'static str> = None;
    const KEPT: Kept = Kept::Words;

    fn from_given(given: &mut dyn Given) -> Self {
        let capacity = given.number("capacity", 1);
        TokenBucket {
            capacity,
            interval: given.rate(
                "refill_per_second",
                capacity,
                "a full bucket's tokens must come back",
            ),
            refunds: false,
        }
    }

    fn keep_refunds(&mut self) {
        self.refunds = true;
    }

    fn check(&self, state: &TokenBucketState, now: Nanos) -> Ruling {
        if self.capacity == 0 {
            // No token ever exists; one interval is the policy's only time scale.
            return Ruling::Deny {
                retry_after: self.interval.max(1),
            };
        }
        let debt = Self::debt(state, now);
        if debt <= self.tolerance() {
            Ruling::Allow
        } else {
            Ruling::Deny {
                retry_after: debt - self.tolerance(),
            }
        }
    }

    /// A refused request takes no token, so only an admission moves `tat`.
    fn record(&self, state: &mut TokenBucketState, now: Nanos, admitted: bool) {
        if !admitted {
            return;
        }
        if state.tat <= now {
            // Full: every earlier token is paid off, a new debt starts.
            match (&mut state.refunds, self.refunds) {
                (Some(r), true) => **r = Refunds::starting(now),
                (r, true) => *r = Some(Box::new(Refunds::starting(now))),
                (r, false) => *r = None,
            }
        }
        state.tat = state.tat.max(now).saturating_add(self.interval);
    }

    fn quota(&self, state: &TokenBucketState, now: Nanos) -> Quota {
        let debt = Self::debt(state, now);
        Quota {
            limit: self.capacity,
            window: Some(self.capacity.saturating_mul(self.interval)),
            // A token partly refilled is not a token yet.
            remaining: self
                .capacity
                .saturating_sub(debt.div_ceil(self.interval.max(1))),
            reset_after: debt,
        }
    }

    /// `count:` — gives back the part of the ticket's token still unpaid at
    /// `now` (`refunds.rs`): nothing for a token taken before the bucket was
    /// last full, nothing once its place has passed. Giving back only that
    /// part never hands out a token the bucket would not have had without
    /// the request.
    fn refund(&self, state: &mut TokenBucketState, ticket: Ticket, now: Nanos) {
        let Some(r) = state.refunds.as_deref_mut() else {
            return;
        };
        if state.tat <= now || ticket.at < r.since {
            return;
        }
        r.fold(now);
        let newest = ticket.place >= state.tat.saturating_add(r.total);
        let place = ticket.place.saturating_sub(r.ahead_of(ticket.place));
        let unpaid = place.saturating_sub(now).min(self.interval);
        let tat = state.tat.saturating_sub(unpaid).max(now);
        r.add(ticket.place, state.tat - tat, newest);
        state.tat = tat;
    }

    /// From `tat` on the bucket is full and the state equals `TokenBucketState::default()`
    /// in every answer.
    fn expires_at(&self, state: &TokenBucketState) -> Nanos {
        state.tat
    }

    /// The theoretical arrival time right after this request (`at + debt`)
    /// plus what refunds had given back by then (`mark`): at the refund,
    /// less what they have given back by that time, it is the token's place.
    fn ticket(&self, at: Nanos, quota: &Quota, mark: Nanos) -> Ticket {
        Ticket {
            at,
            place: at.saturating_add(quota.reset_after).saturating_add(mark),
        }
    }

    fn mark(&self, state: &TokenBucketState) -> Nanos {
        state.refunds.as_ref().map_or(0, |r| r.total)
    }

    /// One interval less in debt.
    fn quota_without_one(&self, quota: Quota) -> Quota {
        let debt = quota.reset_after.saturating_sub(self.interval);
        Quota {
            remaining: self
                .capacity
                .saturating_sub(debt.div_ceil(self.interval.max(1))),
            reset_after: debt,
            ..quota
        }
    }

    fn shape_span(&self) -> Nanos {
        self.interval
    }

    fn describe(&self) -> String {
        format!(
            "{} requests burst, refilled at {}/s",
            self.capacity,
            rate_words(self.interval)
        )
    }

    /// The time it takes to refill completely.
    fn ban_window(&self) -> Option<Nanos> {
        Some(self.capacity.saturating_mul(self.interval).max(1))
    }

    fn set_limit(&mut self, limit: u64) {
        self.capacity = limit;
    }

    fn params(&self) -> Vec<(&'static str, Param)> {
        vec![
            ("capacity", Param::Count(self.capacity)),
            ("refill_per_second", Param::PerSecond(self.interval)),
        ]
    }

    /// `tat`, then with `count:` the refunds (`Refunds::words`).
    /// A lease lasts 1/100 of the time the bucket takes to refill
    /// completely, and is charged as if its tokens were taken at the end of
    /// its term. Unspent tokens are not given back: the bucket refills them
    /// (the default [`Rule::lease_unspent`]).
    fn lease_span(&self) -> Option<Nanos> {
        Some(self.capacity.saturating_mul(self.interval))
    }

    /// `capacity, interval`.
    fn script_params(&self) -> Result<[u64; 5], Nanos> {
        exact(self.capacity.saturating_mul(self.interval))?;
        Ok([self.capacity, self.interval, 0, 0, 0])
    }

    fn words(state: &TokenBucketState) -> Vec<u64> {
        let mut words = vec![state.tat];
        if let Some(r) = &state.refunds {
            r.words(&mut words);
        }
        words
    }

    fn from_words(words: &[u64]) -> Option<TokenBucketState> {
        let (tat, rest) = words.split_first()?;
        Some(TokenBucketState {
            tat: *tat,
            refunds: Refunds::from_words(rest).map(Box::new),
        })
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NANOS_PER_SEC as S;
    use proptest::prelude::*;

    const T0: Nanos = 1_767_225_620 * S;

    /// 5 tokens, 2 per second.
    fn five_at_two_per_second() -> TokenBucket {
        TokenBucket {
            capacity: 5,
            interval: S / 2,
            refunds: true,
        }
    }

    fn attempt(rule: &TokenBucket, state: &mut TokenBucketState, now: Nanos) -> Ruling {
        let ruling = rule.check(state, now);
        rule.record(state, now, !ruling.is_deny());
        ruling
    }

    /// The ticket a store hands out for an admission just recorded at `now`.
    fn ticket_of(rule: &TokenBucket, state: &TokenBucketState, now: Nanos) -> Ticket {
        rule.ticket(now, &rule.quota(state, now), rule.mark(state))
    }

    #[test]
    fn a_refund_right_away_leaves_the_bucket_as_if_nothing_happened() {
        let rule = five_at_two_per_second();
        let mut state = TokenBucketState::default();
        attempt(&rule, &mut state, T0);
        let before = state.clone();
        attempt(&rule, &mut state, T0);
        let ticket = ticket_of(&rule, &state, T0);
        rule.refund(&mut state, ticket, T0);
        assert_eq!(state, before);
        // Once refilled, a late refund gives nothing back.
        let mut full = TokenBucketState::default();
        attempt(&rule, &mut full, T0);
        let ticket = ticket_of(&rule, &full, T0);
        rule.refund(&mut full, ticket, T0 + S);
        assert_eq!(rule.quota(&full, T0 + S).remaining, 5);
    }

    proptest! {
        /// Requests answered late and in any order: after the refunds of those
        /// whose answer did not count, the debt is never below that of a
        /// bucket that saw only the admissions that counted. A refund never
        /// hands out a token the bucket would not have had.
        #[test]
        fn refunds_never_make_the_bucket_more_generous_than_counting_only_matches(
            reqs in proptest::collection::vec((0u64..2_000, any::<bool>(), 0u64..3_000), 1..40)
        ) {
            let rule = five_at_two_per_second();
            let ms = 1_000_000;
            // Events: (time, kind 1 = request / 0 = answer, index).
            let mut t = T0;
            let mut events = Vec::new();
            for (i, (gap, _, delay)) in reqs.iter().enumerate() {
                t += gap * ms;
                events.push((t, 1, i));
                events.push((t + delay * ms, 0, i));
            }
            events.sort();
            let mut ours = TokenBucketState::default();
            let mut tickets = vec![None; reqs.len()];
            let mut end = T0;
            for (now, kind, i) in events {
                end = now;
                if kind == 1 {
                    if attempt(&rule, &mut ours, now) == Ruling::Allow {
                        tickets[i] = Some((now, ticket_of(&rule, &ours, now)));
                    }
                } else if let Some((_, ticket)) = tickets[i] {
                    if !reqs[i].1 {
                        rule.refund(&mut ours, ticket, now);
                    }
                }
            }
            // The same admissions, only those that counted, in request order.
            let mut ideal = TokenBucketState::default();
            for (i, t) in tickets.iter().enumerate() {
                if let (Some((at, _)), true) = (t, reqs[i].1) {
                    rule.record(&mut ideal, *at, true);
                }
            }
            prop_assert!(
                TokenBucket::debt(&ours, end) >= TokenBucket::debt(&ideal, end),
                "ours {:?} ideal {:?} at {}", ours, ideal, end
            );
        }
    }

    /// Three tokens at once, the second and the first refunded early, a
    /// counted request at 594 ms, then the third (paid off by then: the two
    /// refunds moved its place forward to 593 ms) refunded at 700 ms. Read
    /// from its ticket alone, its place was 1.5 s and it gave back a whole
    /// interval (0.79 of a token more than it had).
    #[test]
    fn a_token_paid_off_after_earlier_refunds_gives_nothing_back() {
        let rule = five_at_two_per_second();
        let ms = 1_000_000;
        let mut ours = TokenBucketState::default();
        let mut tickets = Vec::new();
        for _ in 0..3 {
            attempt(&rule, &mut ours, T0);
            tickets.push(ticket_of(&rule, &ours, T0));
        }
        rule.refund(&mut ours, tickets[1], T0 + 18 * ms);
        rule.refund(&mut ours, tickets[0], T0 + 93 * ms);
        assert_eq!(attempt(&rule, &mut ours, T0 + 594 * ms), Ruling::Allow);
        rule.refund(&mut ours, tickets[2], T0 + 700 * ms);
        let mut ideal = TokenBucketState::default();
        rule.record(&mut ideal, T0 + 594 * ms, true);
        let end = T0 + 700 * ms;
        assert!(
            TokenBucket::debt(&ours, end) >= TokenBucket::debt(&ideal, end),
            "ours owes {} ns, counting only the match owes {} ns",
            TokenBucket::debt(&ours, end),
            TokenBucket::debt(&ideal, end)
        );
    }

    /// The other side of the bound: refunds that come right away give back
    /// the whole token however many came before, so a client whose answers
    /// never count is never limited, even one in debt all along.
    #[test]
    fn answers_that_never_count_never_limit_however_many_refunds_came_before() {
        let rule = five_at_two_per_second();
        let ms = 1_000_000;
        let mut state = TokenBucketState::default();
        // Four counted tokens keep the bucket in debt throughout.
        for _ in 0..4 {
            attempt(&rule, &mut state, T0);
        }
        for i in 0..1_000 {
            let now = T0 + i * ms;
            assert_eq!(
                attempt(&rule, &mut state, now),
                Ruling::Allow,
                "request {i}"
            );
            let ticket = ticket_of(&rule, &state, now);
            rule.refund(&mut state, ticket, now + ms / 2);
        }
        assert_eq!(state.refunds.unwrap().since, T0, "the debt never ended");
    }

    /// Refunds of the newest token move nobody, so answers returned newest
    /// first give every token back.
    #[test]
    fn refunds_newest_first_give_every_token_back() {
        let rule = five_at_two_per_second();
        let mut state = TokenBucketState::default();
        let mut tickets = Vec::new();
        for _ in 0..4 {
            attempt(&rule, &mut state, T0);
            tickets.push(ticket_of(&rule, &state, T0));
        }
        for t in tickets.iter().rev() {
            rule.refund(&mut state, *t, T0 + 1);
        }
        assert_eq!(rule.quota(&state, T0 + 1).remaining, 5);
    }

    /// A bucket of `capacity` tokens, `taken` of them at once, and the
    /// tickets they were given.
    fn taken_at_once(capacity: u64, taken: usize) -> (TokenBucket, TokenBucketState, Vec<Ticket>) {
        let rule = TokenBucket {
            capacity,
            interval: S / 2,
            refunds: true,
        };
        let mut state = TokenBucketState::default();
        let mut tickets = Vec::new();
        for _ in 0..taken {
            assert_eq!(attempt(&rule, &mut state, T0), Ruling::Allow);
            tickets.push(ticket_of(&rule, &state, T0));
        }
        (rule, state, tickets)
    }

    proptest! {
        /// Answers in any order: each refund gives back its whole token (all
        /// taken at once, refunded a nanosecond later), so the bucket ends
        /// exactly as if only the counted ones had been taken — while the
        /// holes fit in `MAX_HOLES`.
        #[test]
        fn refunds_in_any_order_give_back_exactly_their_tokens(
            order in Just((0..9usize).collect::<Vec<_>>()).prop_shuffle(),
            counted in proptest::collection::vec(any::<bool>(), 9),
        ) {
            let (rule, mut state, tickets) = taken_at_once(10, 9);
            for &i in &order {
                if !counted[i] {
                    rule.refund(&mut state, tickets[i], T0 + 1);
                }
            }
            let kept = counted.iter().filter(|&&c| c).count() as u64;
            prop_assert_eq!(rule.quota(&state, T0 + 1).remaining, 10 - kept);
        }
    }

    /// Past `MAX_HOLES` the hole furthest ahead is folded and counts for
    /// the tokens ahead of it too: they give back less, never more.
    #[test]
    fn past_the_holes_bound_an_older_token_gives_back_less_never_more() {
        let taken = MAX_HOLES + 3;
        let (rule, mut state, tickets) = taken_at_once(20, taken);
        // The tokens between the first and the last (which stays, so none of
        // them is the newest), youngest first: one hole more than fit, all
        // behind the first token.
        for i in (1..taken - 1).rev() {
            rule.refund(&mut state, tickets[i], T0 + 1);
        }
        let before = rule.quota(&state, T0 + 1).remaining;
        rule.refund(&mut state, tickets[0], T0 + 1);
        let after = rule.quota(&state, T0 + 1).remaining;
        assert!(
            after < before + 1,
            "the first token read its place as moved: {before} -> {after}"
        );
        assert_eq!(state.refunds.as_ref().unwrap().holes.len(), MAX_HOLES);
    }

    #[test]
    fn a_full_bucket_admits_capacity_at_once_then_rejects() {
        let rule = five_at_two_per_second();
        let mut state = TokenBucketState::default();
        for _ in 0..5 {
            assert_eq!(attempt(&rule, &mut state, T0), Ruling::Allow);
        }
        assert_eq!(
            attempt(&rule, &mut state, T0),
            Ruling::Deny { retry_after: S / 2 }
        );
    }

    #[test]
    fn a_token_is_back_exactly_one_interval_later() {
        let rule = five_at_two_per_second();
        let mut state = TokenBucketState::default();
        for _ in 0..5 {
            attempt(&rule, &mut state, T0);
        }
        let back = T0 + S / 2;
        assert_eq!(
            rule.check(&state, back - 1),
            Ruling::Deny { retry_after: 1 }
        );
        assert_eq!(attempt(&rule, &mut state, back), Ruling::Allow);
        assert_eq!(
            rule.check(&state, back),
            Ruling::Deny { retry_after: S / 2 }
        );
    }

    #[test]
    fn rejected_request_takes_no_token() {
        let rule = five_at_two_per_second();
        let mut state = TokenBucketState::default();
        for _ in 0..5 {
            attempt(&rule, &mut state, T0);
        }
        let before = state.clone();
        for _ in 0..100 {
            assert!(attempt(&rule, &mut state, T0 + S / 4).is_deny());
        }
        assert_eq!(state, before);
        assert_eq!(rule.check(&state, T0 + S / 2), Ruling::Allow);
    }

    #[test]
    fn a_request_denied_elsewhere_takes_no_token_here() {
        let rule = five_at_two_per_second();
        let mut state = TokenBucketState::default();
        assert_eq!(rule.check(&state, T0), Ruling::Allow);
        rule.record(&mut state, T0, false);
        assert_eq!(state, TokenBucketState::default());
    }

    #[test]
    fn quota_counts_whole_tokens_and_time_to_full() {
        let rule = five_at_two_per_second();
        let mut state = TokenBucketState::default();
        for _ in 0..3 {
            attempt(&rule, &mut state, T0);
        }
        let q = |now| rule.quota(&state, now);
        assert_eq!(
            q(T0),
            Quota {
                limit: 5,
                window: Some(5 * S / 2),
                remaining: 2,
                reset_after: 3 * S / 2,
            }
        );
        assert_eq!(
            q(T0 + S / 2 - 1).remaining,
            2,
            "a partial token is not counted"
        );
        assert_eq!(q(T0 + S / 2).remaining, 3);
        assert_eq!(q(T0 + 3 * S / 2).remaining, 5);
        assert_eq!(q(T0 + 3 * S / 2).reset_after, 0);
        assert_eq!(rule.expires_at(&state), T0 + 3 * S / 2);
    }

    #[test]
    fn refill_is_continuous_not_ticked() {
        let rule = TokenBucket {
            capacity: 1,
            interval: 3,
            refunds: true,
        };
        let mut state = TokenBucketState::default();
        for now in [10, 13, 16, 19] {
            assert_eq!(attempt(&rule, &mut state, now), Ruling::Allow);
        }
        assert_eq!(
            attempt(&rule, &mut state, 21),
            Ruling::Deny { retry_after: 1 }
        );
        assert_eq!(attempt(&rule, &mut state, 23), Ruling::Allow);
        assert_eq!(
            state.tat, 26,
            "the next token is due one interval after this admission"
        );
    }

    #[test]
    fn a_lowered_capacity_keeps_the_debt_and_denies_until_it_drains() {
        let mut state = TokenBucketState::default();
        for _ in 0..4 {
            attempt(&five_at_two_per_second(), &mut state, T0);
        }
        let lowered = TokenBucket {
            capacity: 2,
            ..five_at_two_per_second()
        };
        // Debt 2 s; one token under capacity 2 needs a debt of at most 0.5 s.
        assert_eq!(
            lowered.check(&state, T0),
            Ruling::Deny {
                retry_after: 3 * S / 2
            }
        );
        assert_eq!(lowered.quota(&state, T0).remaining, 0);
        let raised = TokenBucket {
            capacity: 10,
            ..five_at_two_per_second()
        };
        assert_eq!(raised.quota(&state, T0).remaining, 6);
    }

    #[test]
    fn a_zero_capacity_denies_everything_and_huge_values_saturate() {
        let zero = TokenBucket {
            capacity: 0,
            interval: S,
            refunds: true,
        };
        assert_eq!(
            zero.check(&TokenBucketState::default(), T0),
            Ruling::Deny { retry_after: S }
        );
        assert_eq!(zero.quota(&TokenBucketState::default(), T0).remaining, 0);
        let huge = TokenBucket {
            capacity: u64::MAX,
            interval: u64::MAX,
            refunds: true,
        };
        let mut state = TokenBucketState::default();
        assert_eq!(attempt(&huge, &mut state, T0), Ruling::Allow);
        assert_eq!(attempt(&huge, &mut state, T0), Ruling::Allow);
        assert_eq!(state.tat, u64::MAX);
        assert_eq!(huge.quota(&state, T0).window, Some(u64::MAX));
    }

    /// Sorted arrivals: `(gap, burst)` pairs, each a gap then `burst` requests
    /// at the same nanosecond.
    fn arrivals() -> impl Strategy<Value = Vec<Nanos>> {
        prop::collection::vec((0u64..40, 1usize..6), 1..60).prop_map(|steps| {
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
        fn admissions_in_any_span_stay_within_capacity_plus_refill(
            capacity in 1u64..6,
            interval in 1u64..20,
            times in arrivals(),
            refused_elsewhere in prop::collection::vec(any::<bool>(), 0..300),
        ) {
            let rule = TokenBucket { capacity, interval, refunds: true };
            let mut state = TokenBucketState::default();
            let mut admitted = Vec::new();
            for (i, &now) in times.iter().enumerate() {
                let mine = !rule.check(&state, now).is_deny();
                let admit = mine && !refused_elsewhere.get(i).copied().unwrap_or(false);
                rule.record(&mut state, now, admit);
                if admit {
                    admitted.push(now);
                }
            }
            for i in 0..admitted.len() {
                for j in i..admitted.len() {
                    let n = (j - i + 1) as u64;
                    let bound = capacity + (admitted[j] - admitted[i]) / interval;
                    prop_assert!(n <= bound, "{n} admitted in [{}, {}]", admitted[i], admitted[j]);
                }
            }
        }

        /// GCRA must answer exactly like a bucket that stores its level in
        /// token-nanoseconds (a token is `interval` of them).
        #[test]
        fn gcra_matches_a_counted_bucket_with_continuous_refill(
            capacity in 1u64..6,
            interval in 1u64..20,
            times in arrivals(),
        ) {
            let rule = TokenBucket { capacity, interval, refunds: true };
            let full = capacity * interval;
            let mut state = TokenBucketState::default();
            let (mut level, mut last) = (full, T0);
            for &now in &times {
                level = full.min(level + (now - last));
                last = now;
                let ruling = rule.check(&state, now);
                prop_assert_eq!(!ruling.is_deny(), level >= interval);
                prop_assert_eq!(rule.quota(&state, now).remaining, level / interval);
                prop_assert_eq!(rule.quota(&state, now).reset_after, full - level);
                if let Ruling::Deny { retry_after } = ruling {
                    prop_assert_eq!(retry_after, interval - level);
                    prop_assert!(rule.check(&state, now + retry_after - 1).is_deny());
                    prop_assert_eq!(rule.check(&state, now + retry_after), Ruling::Allow);
                } else {
                    level -= interval;
                }
                rule.record(&mut state, now, !ruling.is_deny());
                let expires = rule.expires_at(&state);
                prop_assert_eq!(rule.quota(&state, expires), rule.quota(&TokenBucketState::default(), expires));
            }
        }
    }
}
