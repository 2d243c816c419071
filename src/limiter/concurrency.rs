//! Concurrency limits: at most `max_in_flight` admitted requests not yet released.
//!
//! Time plays no part: a slot is taken on admission and freed by `release`
//! when the request finishes or goes away. The store must call `release`
//! exactly once per admitted request; a missed one leaks a slot until the
//! state is dropped, an extra one is absorbed (the count saturates at 0).
//!
//! Memory: 8 bytes per key.

use std::time::Duration;

use super::{Given, Hold, Kept, Measure, Nanos, Param, Quota, Rule, Ruling, NANOS_PER_SEC};

/// In a shared store a slot whose release never arrives (a proxy crashed,
/// Redis was down when it finished) frees itself after this long.
pub const SLOT_LEASE: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, PartialEq)]
pub struct Concurrency {
    pub max_in_flight: u64,
}

/// Admitted requests not released yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConcurrencyState {
    pub in_flight: u64,
}

impl Rule for Concurrency {
    type State = ConcurrencyState;
    const NAME: &'static str = "concurrency";
    const PARAMS: &'static [(&'static str, Measure)] = &[("max_in_flight", Measure::Count)];
    const COUNT_REFUSAL: Option<&'static str> =
        Some("frees its slot when any response ends, whatever it is");
    const COUNTS_REFUSED: bool = false;
    const HOLDS: Hold = Hold::Slot;
    const SHAPE_TAG: u8 = 5;
    const SCRIPT_TAG: &'static str = "cc";
    const LEASE_REFUSAL: Option<&'static str> =
        Some("counts requests in flight, which end one by one; a slot cannot be reserved ahead");
    const KEPT: Kept = Kept::Never;

    fn from_given(given: &mut dyn Given) -> Self {
        Concurrency {
            max_in_flight: given.number("max_in_flight", 1),
        }
    }

    /// When a slot frees depends on the upstream, not on anything we know, so
    /// Retry-After is a fixed 1 s hint rather than a promise.
    fn check(&self, state: &ConcurrencyState, _now: Nanos) -> Ruling {
        if state.in_flight < self.max_in_flight {
            Ruling::Allow
        } else {
            Ruling::Deny {
                retry_after: NANOS_PER_SEC,
            }
        }
    }

    fn record(&self, state: &mut ConcurrencyState, _now: Nanos, admitted: bool) {
        if admitted {
            state.in_flight = state.in_flight.saturating_add(1);
        }
    }

    fn quota(&self, state: &ConcurrencyState, _now: Nanos) -> Quota {
        Quota {
            limit: self.max_in_flight,
            window: None,
            remaining: self.max_in_flight.saturating_sub(state.in_flight),
            reset_after: 0,
        }
    }

    /// A key with requests in flight must never be pruned: its releases are
    /// still to come and would otherwise free slots nobody took.
    fn expires_at(&self, state: &ConcurrencyState) -> Nanos {
        if state.in_flight == 0 {
            0
        } else {
            u64::MAX
        }
    }

    fn release(&self, state: &mut ConcurrencyState, _ticket: Nanos, _now: Nanos) {
        state.in_flight = state.in_flight.saturating_sub(1);
    }

    /// Slots have no span: any limit keeps them.
    fn shape_span(&self) -> Nanos {
        0
    }

    fn describe(&self) -> String {
        format!("{} requests in flight", self.max_in_flight)
    }

    /// A slot has no window to count rejections in.
    fn ban_window(&self) -> Option<Nanos> {
        None
    }

    fn set_limit(&mut self, limit: u64) {
        self.max_in_flight = limit;
    }

    fn params(&self) -> Vec<(&'static str, Param)> {
        vec![("max_in_flight", Param::Count(self.max_in_flight))]
    }

    /// `max_in_flight`, then how long a slot lives in ms ([`SLOT_LEASE`]).
    fn script_params(&self) -> Result<[u64; 5], Nanos> {
        Ok([self.max_in_flight, SLOT_LEASE.as_millis() as u64, 0, 0, 0])
    }

    fn words(state: &ConcurrencyState) -> Vec<u64> {
        vec![state.in_flight]
    }

    /// Nothing is in flight after a restart.
    fn from_words(_words: &[u64]) -> Option<ConcurrencyState> {
        None
    }

}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NANOS_PER_SEC as S;
    use proptest::prelude::*;

    const T0: Nanos = 1_767_225_620 * S;

    fn two_at_once() -> Concurrency {
        Concurrency { max_in_flight: 2 }
    }

    fn attempt(rule: &Concurrency, state: &mut ConcurrencyState, now: Nanos) -> Ruling {
        let ruling = rule.check(state, now);
        rule.record(state, now, !ruling.is_deny());
        ruling
    }

    #[test]
    fn accepts_up_to_the_maximum_and_rejects_the_next() {
        let rule = two_at_once();
        let mut state = ConcurrencyState::default();
        assert_eq!(attempt(&rule, &mut state, T0), Ruling::Allow);
        assert_eq!(attempt(&rule, &mut state, T0), Ruling::Allow);
        assert_eq!(
            attempt(&rule, &mut state, T0),
            Ruling::Deny { retry_after: S }
        );
        assert_eq!(state.in_flight, 2);
    }

    #[test]
    fn a_release_frees_a_slot_at_once() {
        let rule = two_at_once();
        let mut state = ConcurrencyState { in_flight: 2 };
        rule.release(&mut state, T0, T0 + 5);
        assert_eq!(attempt(&rule, &mut state, T0 + 5), Ruling::Allow);
        assert!(rule.check(&state, T0 + 5).is_deny());
    }

    #[test]
    fn rejected_request_takes_no_slot() {
        let rule = two_at_once();
        let mut state = ConcurrencyState::default();
        rule.record(&mut state, T0, false);
        assert_eq!(state, ConcurrencyState::default());
    }

    #[test]
    fn an_extra_release_cannot_go_below_zero() {
        let rule = two_at_once();
        let mut state = ConcurrencyState::default();
        rule.release(&mut state, T0, T0);
        assert_eq!(state.in_flight, 0);
    }

    #[test]
    fn quota_shows_free_slots_and_no_window() {
        let rule = two_at_once();
        let state = ConcurrencyState { in_flight: 1 };
        assert_eq!(
            rule.quota(&state, T0),
            Quota {
                limit: 2,
                window: None,
                remaining: 1,
                reset_after: 0,
            }
        );
        let lowered = Concurrency { max_in_flight: 0 };
        assert_eq!(lowered.quota(&state, T0).remaining, 0);
        assert!(lowered.check(&state, T0).is_deny());
    }

    #[test]
    fn only_an_idle_key_can_be_pruned() {
        let rule = two_at_once();
        assert_eq!(rule.expires_at(&ConcurrencyState::default()), 0);
        assert_eq!(rule.expires_at(&ConcurrencyState { in_flight: 1 }), u64::MAX);
    }

    proptest! {
        /// `true`: a request arrives (refused elsewhere when `refused`);
        /// `false`: a request in flight, picked by `pick`, finishes or is cancelled.
        #[test]
        fn never_more_than_the_maximum_in_flight(
            max_in_flight in 0u64..5,
            ops in prop::collection::vec((any::<bool>(), any::<bool>(), any::<usize>()), 1..200),
        ) {
            let rule = Concurrency { max_in_flight };
            let mut state = ConcurrencyState::default();
            let mut in_flight: Vec<usize> = Vec::new();
            for (i, (arrive, refused, pick)) in ops.into_iter().enumerate() {
                let now = T0 + i as Nanos;
                if arrive {
                    let ruling = rule.check(&state, now);
                    prop_assert_eq!(ruling.is_deny(), in_flight.len() as u64 >= max_in_flight);
                    let admit = !ruling.is_deny() && !refused;
                    rule.record(&mut state, now, admit);
                    if admit {
                        in_flight.push(i);
                    }
                } else if !in_flight.is_empty() {
                    in_flight.swap_remove(pick % in_flight.len());
                    rule.release(&mut state, now, now);
                }
                prop_assert!(in_flight.len() as u64 <= max_in_flight);
                prop_assert_eq!(state.in_flight, in_flight.len() as u64);
                prop_assert_eq!(
                    rule.quota(&state, now).remaining,
                    max_in_flight - in_flight.len() as u64
                );
            }
        }
    }
}
