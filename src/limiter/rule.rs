//! What one algorithm is: the [`Rule`] trait its file implements (its arithmetic and every fact the rest of tollgate asks about it), and the vocabulary of its answers.

use super::lease::Unspent;
use super::Nanos;

/// What one limiter rules about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ruling {
    /// Go ahead now.
    Allow,
    /// Go ahead after waiting this long (leaky-bucket shaping).
    Delay(Nanos),
    /// Refused; one more request could pass after `retry_after`.
    Deny { retry_after: Nanos },
}

impl Ruling {
    pub fn is_deny(self) -> bool {
        matches!(self, Ruling::Deny { .. })
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
/// about it (config spelling, policy words, stored form, leases, the Redis
/// script's arguments, …). Each algorithm's file implements it; the enums of
/// `limiter.rs` only forward, one exhaustive `match` per question, so a new
/// algorithm fails to compile until it answers all of them.
/// `State::default()` is a key never seen before.
pub trait Rule {
    type State: Clone + std::fmt::Debug + Default + PartialEq;

    /// The name `algorithm:` takes.
    const NAME: &'static str;
    /// The config keys it takes, all required, and how each is written
    /// (see [`Rule::params`]). The raw config reads a key by its measure, so a
    /// name means one measure in every algorithm that takes it.
    const PARAMS: &'static [(&'static str, Measure)];
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
    /// The first byte of its [`super::Shape::fingerprint`]. SQLite files
    /// keep fingerprints, so a tag is never changed nor given to another
    /// algorithm (a test holds the tags apart).
    const SHAPE_TAG: u8;
    /// Why `lease:` does not apply to it, or `None` if it does (see `lease.rs`).
    const LEASE_REFUSAL: Option<&'static str>;
    /// The name its part of the Redis store's script registers under (its
    /// `.lua` beside its `.rs`: `algorithms.<tag> = { … }`).
    const SCRIPT_TAG: &'static str;

    /// The parameters from the config, each within the bounds that let the
    /// limiter limit; `given` reports every problem with its path.
    fn from_given(given: &mut dyn Given) -> Self;

    /// Decide about one request at `now` without changing the state.
    fn check(&self, state: &Self::State, now: Nanos) -> Ruling;

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

    /// The span its state is measured in (a window, the time between two
    /// units), which must stay equal for stored state to keep its meaning
    /// across a reload; 0 where no span matters. See [`super::Shape`].
    fn shape_span(&self) -> Nanos;

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

    /// The span a lease's term is a fraction of (see `lease::term`): asked
    /// only where [`Rule::LEASE_REFUSAL`] is `None`.
    fn lease_span(&self) -> Option<Nanos> {
        None
    }

    /// How long after the store's instant `at` a lease with this `term` may
    /// be spent: the term itself, unless the algorithm ends it earlier.
    fn lease_ends_after(&self, _at: Nanos, term: Nanos) -> Nanos {
        term
    }

    /// What becomes of the units a lease granted at `at` for `term` did not
    /// spend. The safe side unless an algorithm says better: they stay counted.
    fn lease_unspent(&self, _at: Nanos, _term: Nanos) -> Unspent {
        Unspent::Lost
    }

    /// The parameters its part of the Redis store's script reads (`p1`…`p5`
    /// in its `.lua`), or the span too long for the script's exact
    /// arithmetic (see [`super::script::MAX_EXACT`]).
    fn script_params(&self) -> Result<[u64; 5], Nanos>;

    /// The place the script's `refund` names for the unit `ticket` took:
    /// the ticket's place (a fixed window: the start of its window).
    fn refund_place(&self, ticket: Ticket) -> Nanos {
        ticket.place
    }

    /// Whether the unit recorded for a request that another part of a
    /// Redis Cluster request refused is given back (see `store/redis/spread.rs`),
    /// given the quota reported with it. Yes, unless the algorithm would
    /// have counted the refused attempt anyway.
    fn undo_when_refused(&self, _quota: &Quota) -> bool {
        true
    }
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

/// What a parameter measures, which decides how it is written and read
/// (the raw config's `Written` holds one of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
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
