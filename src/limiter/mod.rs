//! Limiting algorithms as pure arithmetic: `(policy, state, now) → verdict`, then `record`.
//!
//! Nothing here locks, allocates a key, or reads a clock: a store owns the state
//! and calls these functions under its own atomicity, and tests drive them with
//! any `now` they like. All times are nanoseconds: timestamps since the Unix
//! epoch, durations as plain differences.
//!
//! A request passes through every limiter of its route in two steps:
//! 1. `check` on each limiter decides without changing anything;
//! 2. `record` on each limiter with `admitted` = whether the request as a whole
//!    was admitted (every enforcing limiter allowed it).
//!
//! That split is what lets us state exactly what one limiter's rejection does
//! to the others: a fixed window counts the attempt anyway, every
//! other algorithm only pays for requests that were actually admitted.

pub mod ban;
pub mod concurrency;
pub mod count;
pub mod fixed_window;
pub mod leaky_bucket;
pub mod sliding_window;
pub mod token_bucket;

/// Time is the clock's: the algorithms take it as plain nanoseconds.
pub use crate::clock::{Nanos, NANOS_PER_SEC};

/// What one limiter says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead now.
    Allow,
    /// Go ahead after waiting this long (leaky-bucket shaping).
    Delay(Nanos),
    /// Refused; one more request could pass after `retry_after`.
    Deny { retry_after: Nanos },
}

impl Verdict {
    pub fn is_deny(self) -> bool {
        matches!(self, Verdict::Deny { .. })
    }
}

/// The quota a limiter reports in the rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// `q`: the quota (limit, capacity or max in flight).
    pub limit: u64,
    /// `w`: the window the quota applies to; `None` for concurrency.
    pub window: Option<Nanos>,
    /// `r`: what is left right now.
    pub remaining: u64,
    /// `t`: how long until the whole quota is available again.
    pub reset_after: Nanos,
}

/// One algorithm's arithmetic. `State::default()` is a key never seen before.
pub trait Rule {
    type State: Clone + std::fmt::Debug + Default + PartialEq;

    /// Decide about one request at `now` without changing the state.
    fn check(&self, state: &Self::State, now: Nanos) -> Verdict;

    /// Account for the request after every limiter of the route was checked.
    /// `admitted` is false when this or another limiter refused it.
    fn record(&self, state: &mut Self::State, now: Nanos, admitted: bool);

    /// The quota as the headers show it, after `record`.
    fn quota(&self, state: &Self::State, now: Nanos) -> Quota;

    /// When the state no longer matters and can be pruned (`u64::MAX`: never on its own).
    fn expires_at(&self, state: &Self::State) -> Nanos;

    /// From when the state answers exactly like `State::default()` (it is
    /// "at rest"): forgetting it then changes no decision, which is what lets
    /// a full key table evict it. Never later than [`Rule::expires_at`].
    fn rests_at(&self, state: &Self::State) -> Nanos {
        self.expires_at(state)
    }

    /// An admitted request is finished or went away early. `ticket` is the
    /// instant it was let through (`now` at `record` plus any `Delay`), and
    /// `now` when it went away. Concurrency frees its slot; a shaped request
    /// that leaves before its ticket gives its place back where it can.
    /// Most algorithms ignore it.
    fn release(&self, _state: &mut Self::State, _ticket: Nanos, _now: Nanos) {}

    /// `count:` — the request recorded with `ticket` (see [`Algorithm::ticket`])
    /// got a response that does not count: give back what it took, as far as
    /// it still weighs on the state. Never gives back more than the request
    /// took (see `count.rs`). Only algorithms that accept `count:` override it.
    fn refund(&self, _state: &mut Self::State, _ticket: Nanos, _now: Nanos) {}
}

/// A validated limiter policy: which algorithm and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Algorithm {
    FixedWindow(fixed_window::FixedWindow),
    SlidingWindow(sliding_window::SlidingWindow),
    TokenBucket(token_bucket::TokenBucket),
    LeakyBucket(leaky_bucket::LeakyBucket),
    Concurrency(concurrency::Concurrency),
}

/// Which algorithm, without its parameters: the one place the config
/// spellings (`algorithm: token_bucket`) live, for validation, error
/// messages, metrics and the admin API alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Concurrency,
}

impl Kind {
    /// Every algorithm, in the order a message lists them.
    pub const ALL: [Kind; 5] = [
        Kind::FixedWindow,
        Kind::SlidingWindow,
        Kind::TokenBucket,
        Kind::LeakyBucket,
        Kind::Concurrency,
    ];

    /// The name `algorithm:` takes.
    pub fn name(self) -> &'static str {
        match self {
            Kind::FixedWindow => "fixed_window",
            Kind::SlidingWindow => "sliding_window",
            Kind::TokenBucket => "token_bucket",
            Kind::LeakyBucket => "leaky_bucket",
            Kind::Concurrency => "concurrency",
        }
    }

    /// The algorithm `algorithm:` names, if any.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Every name, as a message offers them: `a, b, c or d`.
    pub fn choices() -> String {
        let names = Kind::ALL.map(Kind::name);
        let (last, rest) = names.split_last().expect("at least one algorithm");
        format!("{} or {last}", rest.join(", "))
    }
}

/// The state of one key under one algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    FixedWindow(fixed_window::State),
    /// Boxed: its log is the one variable-size state, and every other key
    /// of a table should not pay for its header.
    SlidingWindow(Box<sliding_window::State>),
    TokenBucket(token_bucket::State),
    LeakyBucket(leaky_bucket::State),
    Concurrency(concurrency::State),
}

/// What must stay equal for stored state to keep its meaning across a reload.
/// A changed limit keeps the state; a changed window, rate or algorithm does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shape {
    FixedWindow { window: Nanos },
    SlidingWindow { window: Nanos },
    TokenBucket { interval: Nanos },
    LeakyBucket { interval: Nanos },
    Concurrency,
}

macro_rules! dispatch {
    ($self:ident, $state:ident, $rule:ident, $st:ident => $body:expr, $mismatch:expr) => {
        match ($self, $state) {
            (Algorithm::FixedWindow($rule), State::FixedWindow($st)) => $body,
            (Algorithm::SlidingWindow($rule), State::SlidingWindow($st)) => $body,
            (Algorithm::TokenBucket($rule), State::TokenBucket($st)) => $body,
            (Algorithm::LeakyBucket($rule), State::LeakyBucket($st)) => $body,
            (Algorithm::Concurrency($rule), State::Concurrency($st)) => $body,
            _ => $mismatch,
        }
    };
}

impl State {
    /// The algorithm this state belongs to.
    pub fn kind(&self) -> Kind {
        match self {
            State::FixedWindow(_) => Kind::FixedWindow,
            State::SlidingWindow(_) => Kind::SlidingWindow,
            State::TokenBucket(_) => Kind::TokenBucket,
            State::LeakyBucket(_) => Kind::LeakyBucket,
            State::Concurrency(_) => Kind::Concurrency,
        }
    }

    /// The algorithm this state belongs to, as [`Kind::name`] spells it.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

impl Shape {
    /// A small stable digest of the shape (FNV-1a), never 0: what the
    /// in-memory table and the SQLite file keep instead of the whole shape.
    pub fn fingerprint(self) -> u32 {
        let (tag, value): (u8, u64) = match self {
            Shape::FixedWindow { window } => (1, window),
            Shape::SlidingWindow { window } => (2, window),
            Shape::TokenBucket { interval } => (3, interval),
            Shape::LeakyBucket { interval } => (4, interval),
            Shape::Concurrency => (5, 0),
        };
        let mut h: u32 = 0x811c_9dc5;
        for b in std::iter::once(tag).chain(value.to_le_bytes()) {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        h.max(1)
    }
}

impl Algorithm {
    pub fn kind(&self) -> Kind {
        match self {
            Algorithm::FixedWindow(_) => Kind::FixedWindow,
            Algorithm::SlidingWindow(_) => Kind::SlidingWindow,
            Algorithm::TokenBucket(_) => Kind::TokenBucket,
            Algorithm::LeakyBucket(_) => Kind::LeakyBucket,
            Algorithm::Concurrency(_) => Kind::Concurrency,
        }
    }

    /// The config spelling, see [`Kind::name`].
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    pub fn shape(&self) -> Shape {
        match self {
            Algorithm::FixedWindow(p) => Shape::FixedWindow { window: p.window },
            Algorithm::SlidingWindow(p) => Shape::SlidingWindow { window: p.window },
            Algorithm::TokenBucket(p) => Shape::TokenBucket {
                interval: p.interval,
            },
            Algorithm::LeakyBucket(p) => Shape::LeakyBucket {
                interval: p.interval,
            },
            Algorithm::Concurrency(_) => Shape::Concurrency,
        }
    }

    /// The state of a key never seen before.
    pub fn fresh_state(&self) -> State {
        match self {
            Algorithm::FixedWindow(_) => State::FixedWindow(Default::default()),
            Algorithm::SlidingWindow(_) => State::SlidingWindow(Default::default()),
            Algorithm::TokenBucket(_) => State::TokenBucket(Default::default()),
            Algorithm::LeakyBucket(_) => State::LeakyBucket(Default::default()),
            Algorithm::Concurrency(_) => State::Concurrency(Default::default()),
        }
    }

    /// Whether `state` belongs to this algorithm (a reload may change it).
    pub fn fits(&self, state: &State) -> bool {
        dispatch!(self, state, _r, _s => true, false)
    }

    pub fn check(&self, state: &State, now: Nanos) -> Verdict {
        dispatch!(self, state, r, s => r.check(s, now), self.check(&self.fresh_state(), now))
    }

    /// Callers make sure `state` fits (see [`Algorithm::fits`]); a mismatch is reset.
    pub fn record(&self, state: &mut State, now: Nanos, admitted: bool) {
        if !self.fits(state) {
            *state = self.fresh_state();
        }
        dispatch!(self, state, r, s => r.record(s, now, admitted), ())
    }

    pub fn quota(&self, state: &State, now: Nanos) -> Quota {
        dispatch!(self, state, r, s => r.quota(s, now), self.quota(&self.fresh_state(), now))
    }

    pub fn expires_at(&self, state: &State) -> Nanos {
        dispatch!(self, state, r, s => r.expires_at(s), 0)
    }

    pub fn rests_at(&self, state: &State) -> Nanos {
        dispatch!(self, state, r, s => r.rests_at(s), 0)
    }

    pub fn release(&self, state: &mut State, ticket: Nanos, now: Nanos) {
        dispatch!(self, state, r, s => r.release(s, ticket, now), ())
    }

    /// `count:` — see [`Rule::refund`]; a state of another algorithm is left alone.
    pub fn refund(&self, state: &mut State, ticket: Nanos, now: Nanos) {
        dispatch!(self, state, r, s => r.refund(s, ticket, now), ())
    }

    /// Whether `count:` makes sense here: the algorithm records each request
    /// as a unit that can be handed back. A leaky bucket delays rather than
    /// counts, and a concurrency slot is given back by every response anyway.
    pub fn accepts_count(&self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow(_) | Algorithm::SlidingWindow(_) | Algorithm::TokenBucket(_)
        )
    }

    /// Whether `record` takes a unit also for a refused request (a fixed
    /// window counts every attempt); the others take one only on
    /// admission, and a refund must match what was taken.
    pub fn counts_refused(&self) -> bool {
        matches!(self, Algorithm::FixedWindow(_))
    }

    /// What identifies the unit a request took, for [`Algorithm::refund`],
    /// from the store's decision instant `at` and the quota after recording:
    /// the instant itself for windows (it names the window, or the log
    /// entry), and for a token bucket the theoretical arrival time right
    /// after this request (`at + debt`), which tells how much of its token
    /// is still unpaid when the refund comes.
    pub fn ticket(&self, at: Nanos, quota: &Quota) -> Nanos {
        match self {
            Algorithm::TokenBucket(_) => at.saturating_add(quota.reset_after),
            _ => at,
        }
    }

    /// The quota an admitted request reported, as it would read without
    /// that request's unit (the rate-limit headers of an answer that did not
    /// count): one more left in a window; a token bucket one interval less in debt.
    pub fn quota_without_one(&self, quota: Quota) -> Quota {
        match self {
            Algorithm::TokenBucket(p) => {
                let debt = quota.reset_after.saturating_sub(p.interval);
                Quota {
                    remaining: p.capacity.saturating_sub(debt.div_ceil(p.interval.max(1))),
                    reset_after: debt,
                    ..quota
                }
            }
            _ => Quota {
                remaining: quota.remaining.saturating_add(1).min(quota.limit),
                ..quota
            },
        }
    }

    /// The span a `ban:` counts rejections in: the window, or for a bucket
    /// the time it takes to refill completely. `None` for concurrency.
    pub fn ban_window(&self) -> Option<Nanos> {
        match self {
            Algorithm::FixedWindow(p) => Some(p.window),
            Algorithm::SlidingWindow(p) => Some(p.window),
            Algorithm::TokenBucket(p) => Some(p.capacity.saturating_mul(p.interval).max(1)),
            Algorithm::LeakyBucket(p) => Some(p.capacity.max(1).saturating_mul(p.interval).max(1)),
            Algorithm::Concurrency(_) => None,
        }
    }

    /// The same policy with another quota (per-key `overrides`).
    pub fn with_limit(&self, limit: u64) -> Algorithm {
        let mut a = self.clone();
        match &mut a {
            Algorithm::FixedWindow(p) => p.limit = limit,
            Algorithm::SlidingWindow(p) => p.limit = limit,
            Algorithm::TokenBucket(p) => p.capacity = limit,
            Algorithm::LeakyBucket(p) => p.capacity = limit,
            Algorithm::Concurrency(p) => p.max_in_flight = limit,
        }
        a
    }
}

/// Whole seconds, rounded up: headers never promise a reset earlier than true.
pub fn ceil_secs(ns: Nanos) -> u64 {
    ns.div_ceil(NANOS_PER_SEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_without_one_request_matches_the_state_without_it() {
        let bucket = Algorithm::TokenBucket(token_bucket::TokenBucket {
            capacity: 5,
            interval: NANOS_PER_SEC,
        });
        let window = Algorithm::FixedWindow(fixed_window::FixedWindow {
            limit: 5,
            window: 60 * NANOS_PER_SEC,
        });
        let now = 6_000 * NANOS_PER_SEC;
        for a in [bucket, window] {
            let (mut with, mut without) = (a.fresh_state(), a.fresh_state());
            for _ in 0..2 {
                a.record(&mut with, now, true);
                a.record(&mut without, now, true);
            }
            a.record(&mut with, now, true);
            assert_eq!(
                a.quota_without_one(a.quota(&with, now)).remaining,
                a.quota(&without, now).remaining,
                "{}",
                a.name()
            );
        }
    }

    #[test]
    fn every_algorithm_name_reads_back_as_its_kind() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(Kind::from_name("gcra"), None);
        assert_eq!(
            Kind::choices(),
            "fixed_window, sliding_window, token_bucket, leaky_bucket or concurrency"
        );
    }

    #[test]
    fn shape_fingerprints_are_stable_and_tell_shapes_apart() {
        let a = Shape::FixedWindow {
            window: 60 * NANOS_PER_SEC,
        };
        assert_eq!(a.fingerprint(), a.fingerprint());
        assert_ne!(
            a.fingerprint(),
            Shape::FixedWindow {
                window: 120 * NANOS_PER_SEC
            }
            .fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            Shape::SlidingWindow {
                window: 60 * NANOS_PER_SEC
            }
            .fingerprint()
        );
        assert_ne!(Shape::Concurrency.fingerprint(), 0, "0 means unknown");
        // Stored in SQLite files: the digest must not change between builds
        // (FNV-1a of the tag byte and the little-endian parameter).
        assert_eq!(a.fingerprint(), 0x8e4e_208e);
        assert_eq!(Shape::Concurrency.fingerprint(), 0x2279_bd40);
    }
}
