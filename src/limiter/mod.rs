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
pub mod lease;
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

/// What identifies the unit a `count:` request took, for [`Rule::refund`]:
/// the store's decision instant and the algorithm's place for the unit
/// (see [`Rule::ticket`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The instant (the store's clock) the request was decided at.
    pub at: Nanos,
    /// For windows `at` itself (it names the window, or the log entry); for
    /// token buckets the unit's place in the bucket's debt (token_bucket.rs).
    pub place: Nanos,
}

impl Ticket {
    /// A window's ticket: the decision instant names the unit.
    pub fn at(at: Nanos) -> Ticket {
        Ticket { at, place: at }
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

/// One algorithm: its arithmetic, and every fact the rest of tollgate asks
/// about it (config spelling, policy words, stored form, …). Each algorithm's
/// file implements it; the enums below only forward, one exhaustive `match`
/// per question, so a new algorithm fails to compile until it answers all of
/// them. `State::default()` is a key never seen before.
pub trait Rule {
    type State: Clone + std::fmt::Debug + Default + PartialEq;

    /// The name `algorithm:` takes.
    const NAME: &'static str;
    /// The config keys it takes, all required, and how each is written
    /// (see [`Rule::params`]). The raw config reads a key by its unit, so a
    /// name means one unit in every algorithm that takes it.
    const PARAMS: &'static [(&'static str, Unit)];
    /// Why `count:` makes no sense for it, or `None` if it records each
    /// request as a unit that can be handed back (see `count.rs`).
    const COUNT_REFUSAL: Option<&'static str>;
    /// Whether `record` takes a unit also for a refused request (a fixed
    /// window counts every attempt); the others take one only on
    /// admission, and a refund must match what was taken.
    const COUNTS_REFUSED: bool;
    /// What an admitted request holds until it is released.
    const HOLDS: Hold;
    /// The smallest quota [`Rule::set_limit`] may set (a per-key override).
    const LEAST_LIMIT: u64 = 1;
    /// How its state outlives a restart.
    const KEPT: Kept;

    /// The parameters from the config, each within the bounds that let the
    /// limiter limit; `given` reports every problem with its path.
    fn from_given(given: &mut dyn Given) -> Self;

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

    /// `count:` — the request recorded with `ticket` (see [`Rule::ticket`])
    /// got a response that does not count: give back what it took, as far as
    /// it still weighs on the state. Never gives back more than the request
    /// took (see `count.rs`). Only algorithms that accept `count:` override it.
    fn refund(&self, _state: &mut Self::State, _ticket: Ticket, _now: Nanos) {}

    /// What identifies the unit a request took, for [`Rule::refund`], from
    /// the store's decision instant `at`, the quota after recording and the
    /// state's [`Rule::mark`] then: for windows the instant itself (it names
    /// the window, or the log entry).
    fn ticket(&self, at: Nanos, _quota: &Quota, _mark: Nanos) -> Ticket {
        Ticket::at(at)
    }

    /// What a later [`Rule::ticket`] needs from the state right after a
    /// decision that the quota does not tell; stores report it with each
    /// outcome. Token buckets: what refunds have given back so far.
    fn mark(&self, _state: &Self::State) -> Nanos {
        0
    }

    /// The quota an admitted request reported, as it would read without
    /// that request's unit (the rate-limit headers of an answer that did not
    /// count): in a window, one more left.
    fn quota_without_one(&self, quota: Quota) -> Quota {
        Quota {
            remaining: quota.remaining.saturating_add(1).min(quota.limit),
            ..quota
        }
    }

    /// `q` and `w` of the headers, which no state changes.
    fn frame(&self) -> (u64, Option<Nanos>) {
        let q = self.quota(&Self::State::default(), 0);
        (q.limit, q.window)
    }

    /// What must stay equal for stored state to keep its meaning.
    fn shape(&self) -> Shape;

    /// The policy in words, for problem bodies: `5 requests per 60s`.
    fn describe(&self) -> String;

    /// The span a `ban:` counts rejections in; `None` if it has none.
    fn ban_window(&self) -> Option<Nanos>;

    /// Sets the quota a per-key override changes (limit, capacity, …).
    fn set_limit(&mut self, limit: u64);

    /// The limiter has `count:`: keep in the state what [`Rule::refund`]
    /// needs. Most algorithms need nothing more.
    fn keep_refunds(&mut self) {}

    /// Its parameters as `GET /config` shows them, named as in [`Rule::PARAMS`].
    fn params(&self) -> Vec<(&'static str, Param)>;

    /// The state as a stored row's words: for [`Kept::Windows`] the window
    /// start and the count, else little-endian `u64`s in a blob.
    fn words(state: &Self::State) -> Vec<u64>;

    /// The state back from [`Rule::words`]; `None` if they do not fit.
    fn from_words(words: &[u64]) -> Option<Self::State>;

    /// The state as the enum holds it.
    fn wrap(state: Self::State) -> State;
}

/// What an algorithm's parameters are read from: the config validator
/// answers, and reports each problem with the parameter's YAML path. Each
/// answer is usable even after a problem was reported.
pub trait Given {
    /// The whole number `name`, at least `least`.
    fn number(&mut self, name: &'static str, least: u64) -> u64;
    /// The duration `name`, greater than zero.
    fn span(&mut self, name: &'static str) -> Nanos;
    /// The rate per second `name` as the nanoseconds between two units;
    /// `units` of them must pass within the longest time tollgate counts
    /// (`within` says what must happen, for the message).
    fn rate(&mut self, name: &'static str, units: u64, within: &str) -> Nanos;
    /// Reports a problem with `name`.
    fn refuse(&mut self, name: &'static str, why: String);
}

/// How a parameter is written in the config, which decides how it is read
/// (the raw config's `Written` holds one of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A whole number: `limit: 100` ([`Given::number`]).
    Count,
    /// A duration: `window: 60s` ([`Given::span`]).
    Span,
    /// A number per second, a fraction allowed: `refill_per_second: 0.5` ([`Given::rate`]).
    PerSecond,
}

/// What an admitted request holds until `release`, which a shared store
/// must track to give it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Nothing: releasing changes nothing.
    Nothing,
    /// A slot, for as long as it is in flight (concurrency).
    Slot,
    /// A place in a queue, when it was delayed (leaky bucket).
    Place,
}

/// How an algorithm's state outlives a restart (the SQLite store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Not at all: nothing is in flight after a restart.
    Never,
    /// One row per window, `(window start, count)`; a row lingers one
    /// window after it ends, so a restart still sees the last one.
    Windows,
    /// A blob of [`Rule::words`] under the shape's fingerprint.
    Words,
}

/// One parameter's value as `GET /config` shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param {
    /// A plain number (limit, capacity, …).
    Count(u64),
    /// A duration.
    Span(Nanos),
    /// A rate, stored as the nanoseconds between two events.
    PerSecond(Nanos),
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

/// Declares [`Kind`] and [`Kind::ALL`] from one list: no variant can be
/// missing from `ALL` (which validation looks names up in).
macro_rules! kinds {
    ($($variant:ident),+ $(,)?) => {
        /// Which algorithm, without its parameters: the one place the config
        /// spellings (`algorithm: token_bucket`) are looked up, for validation,
        /// error messages, metrics and the admin API alike.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kind {
            $($variant),+
        }

        impl Kind {
            /// Every algorithm, in the order a message lists them.
            pub const ALL: [Kind; 0 $(+ { stringify!($variant); 1 })+] = [$(Kind::$variant),+];
        }
    };
}

kinds!(
    FixedWindow,
    SlidingWindow,
    TokenBucket,
    LeakyBucket,
    Concurrency,
);

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

/// `$body` with `$P` naming the algorithm's type: the one exhaustive match over [`Kind`].
macro_rules! on_kind {
    ($kind:expr, $P:ident => $body:expr) => {
        match $kind {
            Kind::FixedWindow => {
                type $P = fixed_window::FixedWindow;
                $body
            }
            Kind::SlidingWindow => {
                type $P = sliding_window::SlidingWindow;
                $body
            }
            Kind::TokenBucket => {
                type $P = token_bucket::TokenBucket;
                $body
            }
            Kind::LeakyBucket => {
                type $P = leaky_bucket::LeakyBucket;
                $body
            }
            Kind::Concurrency => {
                type $P = concurrency::Concurrency;
                $body
            }
        }
    };
}

/// `$body` with `$rule` the algorithm's parameters: the one exhaustive match over [`Algorithm`].
macro_rules! on_algorithm {
    ($algorithm:expr, $rule:ident => $body:expr) => {
        match $algorithm {
            Algorithm::FixedWindow($rule) => $body,
            Algorithm::SlidingWindow($rule) => $body,
            Algorithm::TokenBucket($rule) => $body,
            Algorithm::LeakyBucket($rule) => $body,
            Algorithm::Concurrency($rule) => $body,
        }
    };
}

/// `$body` with `$rule` and its own state `$st`, or `$mismatch` when the
/// state belongs to another algorithm (a reload may change it). Exhaustive
/// over [`Algorithm`]: the state side is an `if let`, not a wildcard arm.
macro_rules! dispatch {
    ($self:ident, $state:ident, $rule:ident, $st:ident => $body:expr, $mismatch:expr) => {
        match $self {
            Algorithm::FixedWindow($rule) => {
                if let State::FixedWindow($st) = $state {
                    $body
                } else {
                    $mismatch
                }
            }
            Algorithm::SlidingWindow($rule) => {
                if let State::SlidingWindow($st) = $state {
                    $body
                } else {
                    $mismatch
                }
            }
            Algorithm::TokenBucket($rule) => {
                if let State::TokenBucket($st) = $state {
                    $body
                } else {
                    $mismatch
                }
            }
            Algorithm::LeakyBucket($rule) => {
                if let State::LeakyBucket($st) = $state {
                    $body
                } else {
                    $mismatch
                }
            }
            Algorithm::Concurrency($rule) => {
                if let State::Concurrency($st) = $state {
                    $body
                } else {
                    $mismatch
                }
            }
        }
    };
}

impl Kind {
    /// The name `algorithm:` takes.
    pub fn name(self) -> &'static str {
        on_kind!(self, P => P::NAME)
    }

    /// The config keys this algorithm takes, all required, with how each is written.
    pub fn params(self) -> &'static [(&'static str, Unit)] {
        on_kind!(self, P => P::PARAMS)
    }

    /// Whether `name` is one of this algorithm's config keys.
    pub fn takes(self, name: &str) -> bool {
        self.params().iter().any(|(p, _)| *p == name)
    }

    /// The parameter `name` of whichever algorithm takes it, with how it is
    /// written (one unit per name, see [`Rule::PARAMS`]); `None` if none does.
    pub fn param(name: &str) -> Option<(&'static str, Unit)> {
        Kind::ALL
            .into_iter()
            .flat_map(|k| k.params())
            .find(|(p, _)| *p == name)
            .copied()
    }

    /// The smallest quota a per-key override may set.
    pub fn least_limit(self) -> u64 {
        on_kind!(self, P => P::LEAST_LIMIT)
    }

    /// How its state outlives a restart.
    pub fn kept(self) -> Kept {
        on_kind!(self, P => P::KEPT)
    }

    /// Why `count:` makes no sense for it, or `None`.
    pub fn count_refusal(self) -> Option<&'static str> {
        on_kind!(self, P => P::COUNT_REFUSAL)
    }

    /// The algorithm with its parameters read from `given`.
    pub fn build(self, given: &mut dyn Given) -> Algorithm {
        match self {
            Kind::FixedWindow => Algorithm::FixedWindow(Rule::from_given(given)),
            Kind::SlidingWindow => Algorithm::SlidingWindow(Rule::from_given(given)),
            Kind::TokenBucket => Algorithm::TokenBucket(Rule::from_given(given)),
            Kind::LeakyBucket => Algorithm::LeakyBucket(Rule::from_given(given)),
            Kind::Concurrency => Algorithm::Concurrency(Rule::from_given(given)),
        }
    }

    /// The algorithm `algorithm:` names, if any.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Every name, as a message offers them: `a, b, c or d`.
    pub fn choices() -> String {
        Kind::list(Kind::ALL.into_iter())
    }

    /// The names of the algorithms that accept `count:`, as a message lists them.
    pub fn counting() -> String {
        Kind::list(
            Kind::ALL
                .into_iter()
                .filter(|k| k.count_refusal().is_none()),
        )
    }

    fn list(kinds: impl Iterator<Item = Kind>) -> String {
        let names: Vec<&str> = kinds.map(Kind::name).collect();
        let (last, rest) = names.split_last().expect("at least one algorithm");
        if rest.is_empty() {
            return last.to_string();
        }
        format!("{} or {last}", rest.join(", "))
    }
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

    /// The state as a stored row's words (see [`Rule::words`]).
    pub fn words(&self) -> Vec<u64> {
        match self {
            State::FixedWindow(s) => fixed_window::FixedWindow::words(s),
            State::SlidingWindow(s) => sliding_window::SlidingWindow::words(s),
            State::TokenBucket(s) => token_bucket::TokenBucket::words(s),
            State::LeakyBucket(s) => leaky_bucket::LeakyBucket::words(s),
            State::Concurrency(s) => concurrency::Concurrency::words(s),
        }
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

/// Type inference helpers: the associated items of `$rule`'s type.
fn fresh<R: Rule>(_: &R) -> State {
    R::wrap(R::State::default())
}

fn restored<R: Rule>(_: &R, words: &[u64]) -> Option<State> {
    R::from_words(words).map(R::wrap)
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
        on_algorithm!(self, r => r.shape())
    }

    /// The policy in words (see [`Rule::describe`]).
    pub fn describe(&self) -> String {
        on_algorithm!(self, r => r.describe())
    }

    /// Its parameters as `GET /config` shows them.
    pub fn params(&self) -> Vec<(&'static str, Param)> {
        on_algorithm!(self, r => r.params())
    }

    /// `q` and `w` of the headers (see [`Rule::frame`]).
    pub fn frame(&self) -> (u64, Option<Nanos>) {
        on_algorithm!(self, r => r.frame())
    }

    /// The state of a key never seen before.
    pub fn fresh_state(&self) -> State {
        on_algorithm!(self, r => fresh(r))
    }

    /// A stored row's words back as this algorithm's state (see [`Rule::from_words`]).
    pub fn restore(&self, words: &[u64]) -> Option<State> {
        on_algorithm!(self, r => restored(r, words))
    }

    /// How long a stored window row lingers after its window ended (see [`Kept::Windows`]).
    pub fn linger(&self) -> Nanos {
        match self.kind().kept() {
            Kept::Windows => self.frame().1.unwrap_or(0),
            Kept::Never | Kept::Words => 0,
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
    pub fn refund(&self, state: &mut State, ticket: Ticket, now: Nanos) {
        dispatch!(self, state, r, s => r.refund(s, ticket, now), ())
    }

    /// Whether `count:` makes sense here (see [`Rule::COUNT_REFUSAL`]).
    pub fn accepts_count(&self) -> bool {
        self.kind().count_refusal().is_none()
    }

    /// See [`Rule::COUNTS_REFUSED`].
    pub fn counts_refused(&self) -> bool {
        on_kind!(self.kind(), P => P::COUNTS_REFUSED)
    }

    /// What an admitted request holds until it is released.
    pub fn holds(&self) -> Hold {
        on_kind!(self.kind(), P => P::HOLDS)
    }

    /// See [`Rule::ticket`].
    pub fn ticket(&self, at: Nanos, quota: &Quota, mark: Nanos) -> Ticket {
        on_algorithm!(self, r => r.ticket(at, quota, mark))
    }

    /// See [`Rule::mark`]; a state of another algorithm has none.
    pub fn mark(&self, state: &State) -> Nanos {
        dispatch!(self, state, r, s => r.mark(s), 0)
    }

    /// See [`Rule::quota_without_one`].
    pub fn quota_without_one(&self, quota: Quota) -> Quota {
        on_algorithm!(self, r => r.quota_without_one(quota))
    }

    /// The span a `ban:` counts rejections in (see [`Rule::ban_window`]).
    pub fn ban_window(&self) -> Option<Nanos> {
        on_algorithm!(self, r => r.ban_window())
    }

    /// The same policy with another quota (per-key `overrides`).
    pub fn with_limit(&self, limit: u64) -> Algorithm {
        let mut a = self.clone();
        on_algorithm!(&mut a, r => r.set_limit(limit));
        a
    }

    /// See [`Rule::keep_refunds`].
    pub fn keep_refunds(&mut self) {
        on_algorithm!(self, r => r.keep_refunds())
    }
}

/// A duration in policy words: `60s`, or `1500ms` when not whole seconds.
pub fn span_words(ns: Nanos) -> String {
    if ns.is_multiple_of(NANOS_PER_SEC) {
        format!("{}s", ns / NANOS_PER_SEC)
    } else {
        format!("{}ms", ns / 1_000_000)
    }
}

/// A rate per second in policy words, from the nanoseconds between two events: `0.5`.
pub fn rate_words(interval: Nanos) -> String {
    let r = NANOS_PER_SEC as f64 / interval.max(1) as f64;
    let s = format!("{r:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Whole seconds, rounded up: headers never promise a reset earlier than true.
pub fn ceil_secs(ns: Nanos) -> u64 {
    ns.div_ceil(NANOS_PER_SEC)
}

#[cfg(test)]
mod tests;
