//! Fixed windows aligned to Unix-epoch multiples of `window`; every attempt counts.

use super::lease::Unspent;
use super::script::{exact, gcd, MAX_EXACT};
use super::{
    span_words, Given, Hold, Kept, Measure, Nanos, Param, Quota, Rule, Ruling, Ticket,
    NANOS_PER_SEC,
};

#[derive(Debug, Clone, PartialEq)]
pub struct FixedWindow {
    pub limit: u64,
    /// Window length, > 0.
    pub window: Nanos,
}

/// The count of attempts in the window that starts at `window_start`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FixedWindowState {
    pub window_start: Nanos,
    pub count: u64,
}

impl FixedWindow {
    pub fn window_start(&self, now: Nanos) -> Nanos {
        now - now % self.window
    }

    /// Attempts already counted in the window containing `now`.
    fn count_now(&self, state: &FixedWindowState, now: Nanos) -> u64 {
        if state.window_start == self.window_start(now) {
            state.count
        } else {
            0
        }
    }
}

impl Rule for FixedWindow {
    type State = FixedWindowState;
    const NAME: &'static str = "fixed_window";
    const PARAMS: &'static [(&'static str, Measure)] =
        &[("limit", Measure::Count), ("window", Measure::Span)];
    const COUNT_REFUSAL: Option<&'static str> = None;
    const COUNTS_REFUSED: bool = true;
    const HOLDS: Hold = Hold::Nothing;
    const SHAPE_TAG: u8 = 1;
    const SCRIPT_TAG: &'static str = "fw";
    const LEASE_REFUSAL: Option<&'static str> = None;
    const KEPT: Kept = Kept::Windows;

    fn from_given(given: &mut dyn Given) -> Self {
        FixedWindow {
            limit: given.number("limit", 1),
            window: given.span("window"),
        }
    }

    fn check(&self, state: &FixedWindowState, now: Nanos) -> Ruling {
        if self.count_now(state, now) < self.limit {
            Ruling::Allow
        } else {
            Ruling::Deny {
                retry_after: self.window_start(now) + self.window - now,
            }
        }
    }

    /// A rejected attempt is counted too, so after `limit + 1`
    /// attempts the stored count is `limit + 1`.
    fn record(&self, state: &mut FixedWindowState, now: Nanos, _admitted: bool) {
        let start = self.window_start(now);
        if state.window_start != start {
            *state = FixedWindowState {
                window_start: start,
                count: 0,
            };
        }
        state.count = state.count.saturating_add(1);
    }

    fn quota(&self, state: &FixedWindowState, now: Nanos) -> Quota {
        Quota {
            limit: self.limit,
            window: Some(self.window),
            remaining: self.limit.saturating_sub(self.count_now(state, now)),
            reset_after: self.window_start(now) + self.window - now,
        }
    }

    /// `count:` — the ticket is the instant the attempt was recorded; it
    /// is given back only while its window is still the current one (a
    /// finished window's count no longer matters).
    fn refund(&self, state: &mut FixedWindowState, ticket: Ticket, _now: Nanos) {
        if state.window_start == self.refund_place(ticket) {
            state.count = state.count.saturating_sub(1);
        }
    }

    /// Kept for two windows so a restart or `/status` can still see the last one.
    fn expires_at(&self, state: &FixedWindowState) -> Nanos {
        state.window_start.saturating_add(2 * self.window)
    }

    /// Once its window is over the count no longer applies to anything.
    fn rests_at(&self, state: &FixedWindowState) -> Nanos {
        state.window_start.saturating_add(self.window)
    }

    fn shape_span(&self) -> Nanos {
        self.window
    }

    fn describe(&self) -> String {
        format!("{} requests per {}", self.limit, span_words(self.window))
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

    /// One row per window: its start and the count.
    /// A lease lasts 1/100 of the window, and never past the window's end
    /// (its units were counted in this window and can only be spent in it).
    fn lease_span(&self) -> Option<Nanos> {
        Some(self.window)
    }

    fn lease_ends_after(&self, at: Nanos, term: Nanos) -> Nanos {
        let window = self.window.max(1);
        term.min(window - at % window)
    }

    /// Unspent units go back to the window they were counted in.
    fn lease_unspent(&self, at: Nanos, _term: Nanos) -> Unspent {
        Unspent::Returned {
            place: at - at % self.window.max(1),
        }
    }

    /// `limit, window, g, w1, a` with `g = gcd(1e9, window)`, `w1 = window / g`,
    /// `a = 1e9 / g`: the script finds the window's start from Redis' `TIME`
    /// (seconds, microseconds) without a product beyond 2^53.
    fn script_params(&self) -> Result<[u64; 5], Nanos> {
        let window = exact(self.window.max(1))?;
        let g = gcd(NANOS_PER_SEC, window);
        let (w1, a) = (window / g, NANOS_PER_SEC / g);
        if w1.saturating_mul(a) >= MAX_EXACT {
            return Err(window);
        }
        Ok([self.limit, window, g, w1, a])
    }

    /// The window the ticket's attempt was counted in, named by its start.
    fn refund_place(&self, ticket: Ticket) -> Nanos {
        ticket.place - ticket.place % self.window.max(1)
    }

    /// Only the unit that opened its key's window: a refused attempt in a
    /// window the key already counted in counts anyway.
    fn undo_when_refused(&self, quota: &Quota) -> bool {
        quota.remaining.saturating_add(1) == self.limit
    }

    fn words(state: &FixedWindowState) -> Vec<u64> {
        vec![state.window_start, state.count]
    }

    fn from_words(words: &[u64]) -> Option<FixedWindowState> {
        match *words {
            [window_start, count] => Some(FixedWindowState {
                window_start,
                count,
            }),
            _ => None,
        }
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NANOS_PER_SEC as S;

    fn strict() -> FixedWindow {
        FixedWindow {
            limit: 5,
            window: 60 * S,
        }
    }

    #[test]
    fn sixth_attempt_in_a_window_is_denied_until_the_window_ends() {
        let rule = strict();
        let mut state = FixedWindowState::default();
        let now = 1_767_225_620 * S; // 20 s into a minute
        for _ in 0..5 {
            assert_eq!(rule.check(&state, now), Ruling::Allow);
            rule.record(&mut state, now, true);
        }
        assert_eq!(
            rule.check(&state, now),
            Ruling::Deny {
                retry_after: 40 * S
            }
        );
        rule.record(&mut state, now, false);
        assert_eq!(state.count, 6, "rejected attempts are counted too");
        assert_eq!(rule.quota(&state, now).remaining, 0);
    }

    #[test]
    fn windows_align_to_epoch_multiples_and_a_new_window_starts_empty() {
        let rule = strict();
        let mut state = FixedWindowState::default();
        let end_of_window = 1_767_225_659 * S + S - 1;
        for _ in 0..6 {
            rule.record(&mut state, end_of_window, true);
        }
        assert!(rule.check(&state, end_of_window).is_deny());
        let next = end_of_window + 1;
        assert_eq!(rule.check(&state, next), Ruling::Allow);
        assert_eq!(rule.quota(&state, next).remaining, 5);
        assert_eq!(rule.quota(&state, next).reset_after, 60 * S);
    }

    #[test]
    fn a_refund_gives_back_one_attempt_of_its_own_window_only() {
        let rule = strict();
        let mut state = FixedWindowState::default();
        let now = 1_767_225_620 * S;
        for _ in 0..5 {
            rule.record(&mut state, now, true);
        }
        rule.refund(&mut state, Ticket::at(now), now + S);
        assert_eq!(state.count, 4);
        assert_eq!(rule.check(&state, now + S), Ruling::Allow);
        // A ticket from the previous window gives back nothing now.
        rule.refund(&mut state, Ticket::at(now - 60 * S), now + S);
        assert_eq!(state.count, 4);
    }

    #[test]
    fn a_lowered_limit_applies_to_the_current_count() {
        let mut state = FixedWindowState::default();
        let now = 1_000 * 60 * S;
        for _ in 0..3 {
            strict().record(&mut state, now, true);
        }
        let lowered = FixedWindow {
            limit: 2,
            ..strict()
        };
        assert!(lowered.check(&state, now).is_deny());
    }
}
