//! The limit phase's one decision: the ban check, every limiter of the route in one store call, the store-error policy (`on_error`), strikes, refunds and the places given back.
//!
//! The app calls down twice per request and gets values back:
//! [`Gate::decide`] before dispatch returns a [`Verdict`] (pass, refused,
//! or the store failed closed), and [`Gate::settle`] once the answer is
//! known gives back the `count:` units that did not count and writes the
//! rate-limit headers. Inside `decide`, in this order:
//!
//! 1. an exempt client, or a route without limiters, passes unasked;
//! 2. the route's limiters that apply, each with its store key, built once
//!    for the ban check, the store call and what is given back later;
//! 3. a key banned by any of them is refused outright ([`ban`]);
//! 4. one store call for all of them; when it fails, `on_error` decides
//!    (deny: 503; allow: pass unlimited; local: this instance's own table);
//! 5. the outcomes add up to a denial (the enforcing limiter with the longest
//!    wait is the one shown), a shaping delay, queued places and concurrency
//!    slots to give back ([`Release`]), and `count:` units ([`refund`]);
//! 6. a refusal strikes each refusing limiter with `ban:` and gives every
//!    `count:` unit back (nothing reached the application).
//!
//! A denial is a value: the [`Refusal`] names its route and limiter, so the
//! answer (`problem`'s one writer of refusals, or a challenge) is chosen by
//! the caller, which never asks the store itself.

mod ban;
mod refund;
mod release;

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};

use crate::clock::SharedClock;
use crate::config::OnError;
use crate::identity::Client;
use crate::limiter::{Algorithm, Hold, Nanos};
use crate::metrics::{inc, Decision, Metrics};
use crate::problem::{BanDenial, Denial, LimitHeaders, LimitView};
use crate::snapshot::{Limiter, Route, Snapshot};
use crate::store::{Check, Outcome, Store, StoreError, StoreFailure};

use refund::Unit;
pub use release::Release;

/// The process's parts a decision works with. Borrowed per request; a
/// [`Release`] keeps its own handles, since it may outlive the request.
#[derive(Clone, Copy)]
pub struct Gate<'a> {
    pub store: &'a Arc<Store>,
    pub clock: &'a SharedClock,
    /// Where store failures are counted.
    pub metrics: &'a Metrics,
}

/// What the decision reads about one request.
#[derive(Clone, Copy)]
pub struct RequestFacts<'a> {
    /// Index into `Snapshot::routes`.
    pub route: usize,
    pub client: &'a Client,
    pub headers: &'a HeaderMap,
    /// The clock when the head was read (Unix ns): the limiters count from it.
    pub now: Nanos,
    /// The request failed `auth`: only the limiters whose key names the
    /// sender count it (its attempts feed their `count:` and `ban:`), so it
    /// never uses up a key it shares with others (`route`, `global`, a header).
    pub sender_only: bool,
}

/// Each limiter's name and quota after one request, for its rate-limit
/// headers: on the stack for a route's usual few limiters, since every
/// limited answer has them (an allocation there cost ~120 instructions).
pub type Views<'a> = smallvec::SmallVec<[LimitView<'a>; 4]>;

/// The limit phase's answer for one request.
pub enum Verdict {
    /// On to dispatch, holding what the limiters took.
    Pass(Clearance),
    /// Refused: by a ban or by the route's limiters.
    Refuse(Refusal),
    /// The store failed and `on_error: deny` fails closed (a 503).
    StoreUnavailable,
}

impl Verdict {
    /// How the request was decided: the access log's `decision` and the
    /// label `tollgate_requests_total` counts it under.
    pub fn decision(&self) -> Decision {
        match self {
            Verdict::Pass(p) => p.decision,
            Verdict::Refuse(r) => match r.reason {
                Reason::Banned(_) => Decision::Banned,
                Reason::Limited { .. } => Decision::Rejected,
            },
            Verdict::StoreUnavailable => Decision::StoreError,
        }
    }
}

/// A refused request: which route, which limiter, and why. Whatever the
/// refusal needed from the store (strikes, refunds) is done already.
pub struct Refusal {
    /// Index into `Snapshot::routes`.
    pub route: usize,
    /// The deciding limiter (index into `Snapshot::limiters`): the banning
    /// one, or of the refusing ones the one with the longest wait.
    pub limiter: usize,
    pub reason: Reason,
}

pub enum Reason {
    /// The key is banned (`ban:`): no limiter was asked, so no rate-limit headers.
    Banned(Box<BanDenial>),
    /// The route's limiters refused; `taken` is what each reported, for the headers.
    Limited { denial: Box<Denial>, taken: Taken },
}

/// A request let through, and what it holds until it is settled.
pub struct Clearance {
    /// Allowed, shadow-rejected or exempt.
    pub decision: Decision,
    route: usize,
    /// `None`: no limiter was asked (exempt, no limiters, or the store failed open).
    taken: Option<Taken>,
    /// The longest shaping delay among the limiters (ns from the request's start).
    delay: Nanos,
    /// Leaky-bucket places to give back if the client leaves while queued.
    queued: Release,
    /// Concurrency slots to free when the response is done.
    slots: Release,
    /// `count:` units to give back unless the answer counts.
    units: Vec<Unit>,
}

/// What the limiters reported: each one's quota after this request, and
/// the store's clock at the decision (Redis' for a fleet), which the
/// rate-limit headers count from.
pub struct Taken {
    applied: Vec<Applied>,
    /// Parallel to `applied`.
    outcomes: Vec<Outcome>,
    at: Nanos,
}

/// One limiter of the route that applies to this request, and the store key it counts on.
struct Applied {
    limiter: usize,
    store_key: String,
}

impl Gate<'_> {
    /// Whether a ban of the route's limiters holds the request's client,
    /// without counting anything: a cache hit that is free (`hits_free`)
    /// still goes to no banned client.
    pub async fn is_banned(&self, snap: &Arc<Snapshot>, facts: &RequestFacts<'_>) -> bool {
        let route = &snap.routes[facts.route];
        if facts.client.exempt || route.limiters.is_empty() {
            return false;
        }
        let applied = applied_limiters(snap, route, facts);
        ban::banned(self.store, snap, &applied, facts.now)
            .await
            .is_some()
    }

    /// The decision for one request (see the module doc for its steps).
    pub async fn decide(&self, snap: &Arc<Snapshot>, facts: &RequestFacts<'_>) -> Verdict {
        let route = &snap.routes[facts.route];
        if facts.client.exempt {
            tracing::debug!(client = %facts.client.ip, route = %route.name, "exempt client passed without limits");
            return Verdict::Pass(Clearance::unlimited(facts.route, Decision::Exempt));
        }
        if route.limiters.is_empty() {
            return Verdict::Pass(Clearance::unlimited(facts.route, Decision::Allowed));
        }
        let applied = applied_limiters(snap, route, facts);
        if applied.is_empty() && facts.sender_only {
            // Failed auth, and no limiter keys on the sender: nothing counts it.
            return Verdict::Pass(Clearance::unlimited(facts.route, Decision::Allowed));
        }
        if let Some(ban) = ban::banned(self.store, snap, &applied, facts.now).await {
            return Verdict::Refuse(Refusal {
                route: facts.route,
                limiter: ban.index,
                reason: Reason::Banned(Box::new(ban)),
            });
        }
        let checks: Vec<Check<'_>> = applied.iter().map(|a| a.check(snap)).collect();
        let (outcomes, shared) = match self.count(snap, &checks, facts.now).await {
            Counted::Outcomes(outcomes, shared) => (outcomes, shared),
            Counted::FailClosed => return Verdict::StoreUnavailable,
            Counted::FailOpen => {
                return Verdict::Pass(Clearance::unlimited(facts.route, Decision::Allowed));
            }
        };
        let mut tally = Tally::of(self, snap, facts, &applied, &checks, &outcomes, shared);
        let at = outcomes.first().map_or(facts.now, |o| o.at);
        let mut taken = Taken {
            applied,
            outcomes,
            at,
        };
        match tally.denial.take() {
            Some(mut denial) => {
                self.refused(snap, facts, &mut taken, &mut tally, &mut denial)
                    .await;
                Verdict::Refuse(Refusal {
                    route: facts.route,
                    limiter: denial.index,
                    reason: Reason::Limited {
                        denial: Box::new(denial),
                        taken,
                    },
                })
            }
            None => Verdict::Pass(Clearance {
                decision: tally.decision,
                route: facts.route,
                delay: tally.delay,
                queued: tally.queued,
                slots: tally.slots,
                units: tally.units,
                taken: Some(taken),
            }),
        }
    }

    /// The limiters refused: each refusing limiter with `ban:` counts a
    /// strike, and every `count:` unit goes back (nothing reached the application).
    ///
    /// Borrowed, not moved in: this future is part of every request's, and
    /// an `async fn` keeps what it takes by value twice (docs/PERFORMANCE.md, "The request's future").
    async fn refused(
        &self,
        snap: &Snapshot,
        facts: &RequestFacts<'_>,
        taken: &mut Taken,
        tally: &mut Tally,
        denial: &mut Denial,
    ) {
        if tally.shared {
            let banned = ban::strike(self.store, snap, &taken.applied, &tally.refused, facts.now);
            if let Some(remaining) = banned.await {
                // The answer that starts a ban says how long it lasts.
                denial.retry_after = denial.retry_after.max(remaining);
            }
        }
        let at = self.clock.now();
        refund::refund(self.store, snap, &mut tally.units, taken, None, at).await;
    }

    /// After the answer: `count:` units go back unless the answer counts,
    /// and the answer gets the route's rate-limit headers. The caller drops
    /// `pass` as it answers, which frees what it still holds (concurrency
    /// slots of an answer that carried none away in its body).
    pub async fn settle(
        &self,
        snap: &Snapshot,
        pass: &mut Clearance,
        status: StatusCode,
        headers: &mut HeaderMap,
    ) {
        let Some(taken) = pass.taken.as_mut() else {
            return;
        };
        if !pass.units.is_empty() {
            let at = self.clock.now();
            let answer = Some((status, &*headers));
            refund::refund(self.store, snap, &mut pass.units, taken, answer, at).await;
        }
        taken.write_headers(snap, pass.route, headers);
    }

    /// The store's outcomes for `checks`, or what `on_error` makes of its failure.
    async fn count(&self, snap: &Snapshot, checks: &[Check<'_>], now: Nanos) -> Counted {
        let e = match self.store.check(checks, now).await {
            Ok(outcomes) => return Counted::Outcomes(outcomes, true),
            Err(e) => e,
        };
        let policy = snap.config.store.on_error;
        self.store_failed(&e, policy);
        match policy {
            OnError::Deny => Counted::FailClosed,
            OnError::Allow => Counted::FailOpen,
            // Units taken in the local table stay there: a refund
            // would go to the shared store, which never counted them.
            OnError::Local => Counted::Outcomes(self.store.check_local(checks, now), false),
        }
    }

    /// Counts a failed store call and the `on_error` decision it leads to.
    fn store_failed(&self, e: &StoreError, policy: OnError) {
        let labels = [
            ("backend", self.store.backend()),
            ("policy", policy.as_str()),
        ];
        inc(&self.metrics.counter("tollgate_store_errors_total", &labels));
        inc(&self
            .metrics
            .counter("tollgate_store_fallback_total", &labels[1..]));
        if e.kind == StoreFailure::CircuitOpen {
            // The breaker logged when it opened; one line per request would flood.
            tracing::debug!(error = %e, ?policy, "store skipped; applying on_error");
        } else {
            tracing::warn!(error = %e, ?policy, "store failed; applying on_error");
        }
    }
}

/// What the store call came to.
enum Counted {
    /// Each check's outcome; `false`: the shared store failed and
    /// `on_error: local` counted them in this instance's table.
    Outcomes(Vec<Outcome>, bool),
    /// `on_error: deny`.
    FailClosed,
    /// `on_error: allow`.
    FailOpen,
}

/// What the outcomes of one request add up to.
struct Tally {
    decision: Decision,
    denial: Option<Denial>,
    /// Positions in `Taken::applied` of the enforcing limiters that refused.
    refused: Vec<usize>,
    delay: Nanos,
    queued: Release,
    slots: Release,
    units: Vec<Unit>,
    /// The shared store counted (not `on_error: local`'s table).
    shared: bool,
}

impl Tally {
    /// Reads each limiter's outcome: its metric, its part of the denial,
    /// and what an admitted request takes with it.
    fn of(
        gate: &Gate<'_>,
        snap: &Arc<Snapshot>,
        facts: &RequestFacts<'_>,
        applied: &[Applied],
        checks: &[Check<'_>],
        outcomes: &[Outcome],
        shared: bool,
    ) -> Tally {
        let admitted = !outcomes
            .iter()
            .zip(checks)
            .any(|(o, c)| o.ruling.is_deny() && !c.shadow);
        let mut t = Tally {
            decision: Decision::Allowed,
            denial: None,
            refused: Vec::new(),
            delay: 0,
            queued: Release::new(true),
            slots: Release::new(false),
            units: Vec::new(),
            shared,
        };
        let now = facts.now;
        for (position, ((a, o), c)) in applied.iter().zip(outcomes).zip(checks).enumerate() {
            let l = &snap.limiters[a.limiter];
            // What to give back later is where the store counted it.
            let counted_on = if o.overflowed { c.overflow } else { c.key };
            match o.ruling {
                crate::limiter::Ruling::Deny { retry_after } if l.shadow => {
                    inc(&l.metrics.would_reject);
                    t.decision = Decision::ShadowRejected;
                    tracing::info!(limiter = %l.name, key = %facts.client.display(), retry_after_ms = retry_after / 1_000_000, "shadow limiter would reject");
                }
                crate::limiter::Ruling::Deny { retry_after } => {
                    inc(&l.metrics.rejected);
                    t.refused.push(position);
                    record_denial(&mut t.denial, a.limiter, l, o, c, retry_after, facts.client);
                }
                crate::limiter::Ruling::Delay(wait) => {
                    inc(&l.metrics.delayed);
                    t.delay = t.delay.max(wait);
                    if admitted {
                        t.queued.push(gate, snap, a.limiter, counted_on, now + wait);
                    }
                }
                crate::limiter::Ruling::Allow => inc(&l.metrics.allowed),
            }
            if admitted && c.algorithm.holds() == Hold::Slot {
                t.slots.push(gate, snap, a.limiter, counted_on, now);
            }
            if l.count.is_some() && shared && (admitted || c.algorithm.counts_refused()) {
                let ticket = o.ticket(c.algorithm);
                t.units.push(Unit { position, ticket });
            }
        }
        t
    }
}

impl Clearance {
    /// A pass no limiter was asked about.
    fn unlimited(route: usize, decision: Decision) -> Clearance {
        Clearance {
            decision,
            route,
            taken: None,
            delay: 0,
            queued: Release::default(),
            slots: Release::default(),
            units: Vec::new(),
        }
    }

    /// Waits out the shaping delay, counted from `from` (the instant
    /// the decision's `now` was read), so the time spent checking does not
    /// shift the release: releases stay exactly spaced. Dropping this
    /// future (the client went away) drops the pass, which gives the place
    /// in the queue back; once waited, the place is the request's.
    /// `from` is tokio's clock when the head was read (not `std`'s, so a
    /// test on paused time controls the wait).
    pub async fn wait_turn(&mut self, from: tokio::time::Instant) {
        if self.delay > 0 {
            tokio::time::sleep_until(from + Duration::from_nanos(self.delay)).await;
            self.queued.disarm();
        }
    }

    /// The concurrency slots this request holds, for whatever lives as
    /// long as its answer (the response body, or a tunnel).
    pub fn take_slots(&mut self) -> Release {
        std::mem::take(&mut self.slots)
    }
}

impl Refusal {
    /// Each limiter's name and quota after this request (empty for a ban).
    pub fn views<'a>(&self, snap: &'a Snapshot) -> Views<'a> {
        match &self.reason {
            Reason::Banned(_) => Views::new(),
            Reason::Limited { taken, .. } => taken.views(snap),
        }
    }

    /// The rate-limit headers of this refusal, from its `views` (none for a ban).
    pub fn limit_headers<'a>(
        &self,
        snap: &'a Snapshot,
        views: &'a [LimitView<'a>],
    ) -> Option<LimitHeaders<'a>> {
        match &self.reason {
            Reason::Banned(_) => None,
            Reason::Limited { taken, .. } => Some(taken.headers(snap, self.route, views)),
        }
    }
}

impl Taken {
    /// Each limiter's name and quota after this request.
    fn views<'a>(&self, snap: &'a Snapshot) -> Views<'a> {
        self.applied
            .iter()
            .zip(&self.outcomes)
            .map(|(a, o)| LimitView {
                name: &snap.limiters[a.limiter].name,
                quota: o.quota,
            })
            .collect()
    }

    /// What route `route`'s rate-limit headers are written from.
    fn headers<'a>(
        &self,
        snap: &'a Snapshot,
        route: usize,
        views: &'a [LimitView<'a>],
    ) -> LimitHeaders<'a> {
        LimitHeaders {
            views,
            at: self.at,
            sets: snap.config.routes[route].rate_limit_headers,
            cache: &snap.routes[route].policy,
        }
    }

    fn write_headers(&self, snap: &Snapshot, route: usize, headers: &mut HeaderMap) {
        let views = self.views(snap);
        self.headers(snap, route, &views).write(headers);
    }
}

impl Applied {
    fn check<'a>(&'a self, snap: &'a Snapshot) -> Check<'a> {
        let l = &snap.limiters[self.limiter];
        Check {
            key: &self.store_key,
            overflow: l.overflow_key(),
            algorithm: l.algorithm_for(l.value_of(&self.store_key)),
            shadow: l.shadow,
        }
    }

    /// The policy this key is counted under (its override, or the limiter's own).
    fn algorithm<'a>(&self, snap: &'a Snapshot) -> &'a Algorithm {
        let l = &snap.limiters[self.limiter];
        l.algorithm_for(l.value_of(&self.store_key))
    }
}

/// The route's limiters that have a key for this request (a limiter keyed
/// on a header the request lacks does not apply).
fn applied_limiters(snap: &Snapshot, route: &Route, facts: &RequestFacts<'_>) -> Vec<Applied> {
    route
        .limiters
        .iter()
        .filter_map(|&i| {
            let l = &snap.limiters[i];
            if facts.sender_only && !l.names_sender {
                return None;
            }
            let store_key = l.request_key(facts.client, &route.name, facts.headers)?;
            Some(Applied {
                limiter: i,
                store_key,
            })
        })
        .collect()
}

/// Adds one enforcing limiter's rejection to the denial: every rejecting
/// limiter is listed, and the one with the longest wait is the one shown.
fn record_denial(
    denial: &mut Option<Denial>,
    index: usize,
    l: &Limiter,
    o: &Outcome,
    c: &Check<'_>,
    retry_after: Nanos,
    client: &Client,
) {
    let d = denial.get_or_insert_with(|| Denial {
        index,
        limiter: l.name.clone(),
        quota: o.quota,
        policy: l.describe(c.algorithm),
        retry_after,
        violated: Vec::new(),
        key: client.display().to_string(),
    });
    if retry_after > d.retry_after {
        d.index = index;
        d.limiter = l.name.clone();
        d.quota = o.quota;
        d.policy = l.describe(c.algorithm);
        d.retry_after = retry_after;
    }
    d.violated.push(l.name.clone());
}

#[cfg(test)]
mod tests;
