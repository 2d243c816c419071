//! `ban:` on a limiter as pure arithmetic: strikes (rejections) within a span, and the ban they start.
//!
//! A key refused `after` times within the limiter's window is refused
//! outright for `duration` — what fail2ban does, without reading logs. The
//! span starts at the first strike and lasts one window
//! ([`super::Algorithm::ban_window`]); a strike after it starts a new span.
//! Times are Unix nanoseconds, like every stored instant, so a ban means the
//! same after a restart and to every proxy of a fleet.

use http::StatusCode;

use super::Nanos;

/// A validated `ban:` policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanRule {
    /// Rejections within one window that start a ban, >= 1.
    pub after: u64,
    /// How long a ban lasts, > 0.
    pub duration: Nanos,
    /// What a banned request gets: 429 (default) or 403.
    pub status: StatusCode,
}

/// One key's strikes and ban. `Default` is a key never refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BanState {
    /// When the current span of strikes began.
    pub first_strike: Nanos,
    pub strikes: u64,
    /// Banned while `now < until`; 0 = never banned.
    pub until: Nanos,
}

impl BanState {
    /// The ban's end if the key is banned at `now`.
    pub fn banned(&self, now: Nanos) -> Option<Nanos> {
        (now < self.until).then_some(self.until)
    }

    /// Counts one rejection at `now`; returns the ban's end when this strike starts a ban.
    pub fn strike(&mut self, rule: &BanRule, window: Nanos, now: Nanos) -> Option<Nanos> {
        if self.banned(now).is_some() {
            return None;
        }
        if self.strikes == 0 || now >= self.first_strike.saturating_add(window) {
            self.first_strike = now;
            self.strikes = 0;
        }
        self.strikes += 1;
        if self.strikes < rule.after {
            return None;
        }
        self.strikes = 0;
        self.until = now.saturating_add(rule.duration);
        Some(self.until)
    }

    /// When nothing of it matters any more: the ban is over and the span of strikes too.
    pub fn expires_at(&self, window: Nanos) -> Nanos {
        let span = if self.strikes > 0 {
            self.first_strike.saturating_add(window)
        } else {
            0
        };
        span.max(self.until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NANOS_PER_SEC as S;

    const T0: Nanos = 1_767_225_600 * S;

    fn three_for_an_hour() -> BanRule {
        BanRule {
            after: 3,
            duration: 3600 * S,
            status: StatusCode::TOO_MANY_REQUESTS,
        }
    }

    #[test]
    fn the_third_rejection_within_a_window_starts_a_ban_that_ends_on_time() {
        let rule = three_for_an_hour();
        let mut s = BanState::default();
        assert_eq!(s.strike(&rule, 60 * S, T0), None);
        assert_eq!(s.strike(&rule, 60 * S, T0 + S), None);
        assert_eq!(s.strike(&rule, 60 * S, T0 + 2 * S), Some(T0 + 3602 * S));
        assert_eq!(s.banned(T0 + 3602 * S - 1), Some(T0 + 3602 * S));
        assert_eq!(s.banned(T0 + 3602 * S), None);
        assert_eq!(s.expires_at(60 * S), T0 + 3602 * S);
    }

    #[test]
    fn rejections_spread_over_more_than_a_window_never_ban() {
        let rule = three_for_an_hour();
        let mut s = BanState::default();
        for i in 0..10 {
            assert_eq!(s.strike(&rule, 60 * S, T0 + i * 31 * S), None, "strike {i}");
        }
        assert_eq!(s.banned(T0 + 400 * S), None);
    }

    #[test]
    fn strikes_during_a_ban_do_not_extend_it() {
        let rule = three_for_an_hour();
        let mut s = BanState::default();
        for i in 0..3 {
            s.strike(&rule, 60 * S, T0 + i);
        }
        let until = s.until;
        assert_eq!(s.strike(&rule, 60 * S, T0 + 10 * S), None);
        assert_eq!(s.until, until);
    }
}
