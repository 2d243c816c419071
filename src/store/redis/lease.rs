//! The leases this tollgate holds on Redis keys: spent without a call, asked for with the request that needs one, given back when they end.
//!
//! The arithmetic (size, term, what happens to unspent units) is
//! `limiter/lease.rs`'s; the script side is `lease.lua`. Here: the bounded
//! local table and its rules.
//!
//! - A request is decided here, without Redis, only when **every** limiter
//!   it meets holds an open lease with a unit left on its key; each of them
//!   then spends one. Otherwise the request goes to Redis as usual, and each
//!   leased limiter without an open lease asks for one in the same call.
//! - One ask per key at a time (no two leases of one key in one tollgate).
//!   While a request asks for a key's lease, up to [`MAX_WAITERS`] other
//!   requests on that key wait for it, each at most `store.timeout`
//!   ([`Leases::wait_for_ask`]), then spend from it; a waiter the lease
//!   cannot serve (no grant, too few units, timed out, call failed) goes to
//!   Redis as usual. The file is past 700 lines for this: the wait shares
//!   the table's private slots.
//! - The table holds at most [`MAX_LEASES`] keys. When it is full, a key
//!   without a lease is checked per request, as without leases, and
//!   `tollgate_lease_table_full_total` counts it.
//! - A lease ends at its term (or a fixed window's end), by the proxy's
//!   clock and by the monotonic clock both, when it has not been spent for
//!   [`IDLE`] (traffic on the key moved to another tollgate, or stopped), or
//!   when a reload changes its limiter; its unspent units then go back
//!   ([`GiveBack`]: fixed and sliding window) or are lost (token bucket), at
//!   the next [`idle_loop`] round (every [`IDLE_ROUND`]), prune round or ask
//!   of the key, whichever comes first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use ::redis::ScriptInvocation;
use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::config::LimiterConfig;
use crate::limiter::lease::{self, Lease, Unspent};
use crate::limiter::{Algorithm, Nanos, Quota, Ruling};
use crate::metrics::{Counter, Metrics};
use crate::store::{Check, Outcome, StoreError};

/// The most keys this tollgate holds leases on (or is asking for).
pub const MAX_LEASES: usize = 65_536;
/// The most requests that wait for one key's lease being fetched; the
/// others go to Redis as usual.
pub const MAX_WAITERS: usize = 1_024;
/// A lease not spent for this long is ended and its units given back: the
/// key's traffic went elsewhere, and another tollgate may need them.
pub const IDLE: std::time::Duration = std::time::Duration::from_secs(1);
/// How often [`idle_loop`] ends idle and ended leases.
pub const IDLE_ROUND: std::time::Duration = std::time::Duration::from_millis(250);

pub(super) struct Leases {
    /// `lease:` of each limiter that has one, by limiter name, with the
    /// algorithm it was configured with (a reload that changes either drops
    /// the limiter's leases).
    rules: ArcSwap<HashMap<String, (Lease, Algorithm)>>,
    table: Mutex<HashMap<Box<str>, LeaseSlot>>,
    /// Unspent units of ended leases, to give back by the next sweep.
    ended: Mutex<Vec<GiveBack>>,
    next_ask: AtomicU64,
    metrics: OnceLock<LeaseCounters>,
}

enum LeaseSlot {
    /// A request is asking Redis for this key's lease.
    Asking(Ask),
    Open(OpenLease),
}

/// A lease being fetched: the asking request's number, and what the
/// requests waiting for it wait on.
struct Ask {
    id: u64,
    signal: std::sync::Arc<AskSignal>,
    waiters: usize,
}

/// Woken when a fetch ends (settled, failed, or dropped); `granted` says
/// whether it opened a lease (worth waiting for the key's next fetch).
#[derive(Default)]
struct AskSignal {
    done: tokio::sync::Notify,
    granted: std::sync::atomic::AtomicBool,
}

impl LeaseSlot {
    fn asking(id: u64) -> LeaseSlot {
        LeaseSlot::Asking(Ask {
            id,
            signal: Default::default(),
            waiters: 0,
        })
    }

    fn is_ask(&self, id: u64) -> bool {
        matches!(self, LeaseSlot::Asking(a) if a.id == id)
    }

    /// Wakes the requests waiting on this slot's fetch, if it is one.
    fn wake(self, granted: bool) -> Option<OpenLease> {
        match self {
            LeaseSlot::Asking(a) => {
                a.signal.granted.store(granted, Ordering::Relaxed);
                a.signal.done.notify_waiters();
                None
            }
            LeaseSlot::Open(held) => Some(held),
        }
    }
}

/// What a request that waited for a key's lease fetch saw.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Waited {
    /// The fetch opened a lease: spend from it (or wait for the next one).
    Granted,
    /// Nothing to wait for, no room, no grant, or the time is up: ask Redis.
    No,
}

/// An open lease.
struct OpenLease {
    /// The policy it was granted under: a key whose policy changed (a reload,
    /// an override) no longer spends it.
    algorithm: Algorithm,
    units: u64,
    spent: u64,
    /// The proxy's clock when the request that took it was decided.
    granted: Nanos,
    /// The proxy's clock when it can no longer be spent.
    ends: Nanos,
    /// The monotonic clock when it was taken: a wall clock stepped back
    /// by less than the lease's age must not stretch it (see [`OpenLease::live`]).
    taken: std::time::Instant,
    /// The monotonic clock when a unit was last spent (or it was taken).
    used: std::time::Instant,
    /// The quota and Redis' instant reported with the grant.
    quota: Quota,
    at: Nanos,
}

/// Unspent units to take out of the shared state again, as a `refund` of
/// `units` (see `redis/modes.lua`).
pub(super) struct GiveBack {
    pub store_key: Box<str>,
    pub units: u64,
    pub args: [String; 4],
}

struct LeaseCounters {
    saved: Counter,
    taken: Counter,
    granted: Counter,
    spent: Counter,
    returned: Counter,
    lost: Counter,
    full: Counter,
    waited: Counter,
}

impl LeaseCounters {
    /// The lease counters of `metrics`, created at zero.
    fn of(metrics: &Metrics) -> LeaseCounters {
        let units =
            |outcome| metrics.counter("tollgate_lease_units_total", &[("outcome", outcome)]);
        LeaseCounters {
            saved: metrics.counter("tollgate_lease_calls_saved_total", &[]),
            taken: metrics.counter("tollgate_leases_taken_total", &[]),
            granted: units("granted"),
            spent: units("spent"),
            returned: units("returned"),
            lost: units("lost"),
            full: metrics.counter("tollgate_lease_table_full_total", &[]),
            waited: metrics.counter("tollgate_lease_waits_total", &[]),
        }
    }
}

/// Creates the lease families at zero, whatever the store (only Redis leases).
pub fn metrics_at_zero(metrics: &Metrics) {
    LeaseCounters::of(metrics);
}

impl Leases {
    pub(super) fn new() -> Leases {
        Leases {
            rules: ArcSwap::from_pointee(HashMap::new()),
            table: Mutex::new(HashMap::new()),
            ended: Mutex::new(Vec::new()),
            next_ask: AtomicU64::new(1),
            metrics: OnceLock::new(),
        }
    }

    /// Counts into the lease counters of `metrics`.
    pub(super) fn bind_metrics(&self, metrics: &Metrics) {
        let _ = self.metrics.set(LeaseCounters::of(metrics));
    }

    fn count(&self, pick: impl Fn(&LeaseCounters) -> &Counter, n: u64) {
        if let Some(c) = self.metrics.get() {
            pick(c).fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Takes the limiters' `lease:` rules; the leases of a limiter whose
    /// rule or algorithm changed, or that is gone, end now.
    pub(super) fn configure(&self, limiters: &[LimiterConfig]) {
        let rules: HashMap<String, (Lease, Algorithm)> = limiters
            .iter()
            .filter_map(|l| Some((l.name.clone(), (l.lease?, l.algorithm.clone()))))
            .collect();
        let was = self.rules.swap(std::sync::Arc::new(rules));
        let now = self.rules.load();
        let changed: Vec<&String> = was
            .iter()
            .filter(|(name, rule)| now.get(*name) != Some(*rule))
            .map(|(name, _)| name)
            .collect();
        if changed.is_empty() {
            return;
        }
        let mut table = self.table.lock();
        let gone: Vec<Box<str>> = table
            .keys()
            .filter(|k| changed.iter().any(|n| limiter_of(k) == n.as_str()))
            .cloned()
            .collect();
        for key in gone {
            if let Some(held) = table.remove(&key).and_then(|s| s.wake(false)) {
                self.end(key, held);
            }
        }
    }

    /// Whether a request on `checks` could wait for a lease being fetched
    /// (see [`Leases::wait_for_ask`]).
    pub(super) fn fetching(&self, checks: &[Check<'_>]) -> bool {
        let rules = self.rules.load();
        if checks.is_empty() || !checks.iter().all(|c| Self::rule(&rules, c.key).is_some()) {
            return false;
        }
        let table = self.table.lock();
        checks.iter().any(|c| {
            matches!(table.get(c.key), Some(LeaseSlot::Asking(a)) if a.waiters < MAX_WAITERS)
        })
    }

    /// Waits, until `deadline` at most, for the lease being fetched on one
    /// of `checks`' keys, when every check leases (else no lease can decide
    /// the request) and the fetch has room for one more waiter.
    pub(super) async fn wait_for_ask(
        &self,
        checks: &[Check<'_>],
        deadline: tokio::time::Instant,
    ) -> Waited {
        let rules = self.rules.load();
        if checks.is_empty() || !checks.iter().all(|c| Self::rule(&rules, c.key).is_some()) {
            return Waited::No;
        }
        let signal = {
            let mut table = self.table.lock();
            let key = checks.iter().find(|c| {
                matches!(table.get(c.key), Some(LeaseSlot::Asking(a)) if a.waiters < MAX_WAITERS)
            });
            let Some(Some(LeaseSlot::Asking(ask))) = key.map(|c| table.get_mut(c.key)) else {
                return Waited::No;
            };
            ask.waiters += 1;
            ask.signal.clone()
        };
        // Registered before the lock is taken again: a fetch that ends from
        // here on wakes it (`notify_waiters` wakes every future created).
        let woken = signal.done.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        // The fetch may have ended between the lock and the registration.
        let ended = !self.table.lock().values().any(|s| match s {
            LeaseSlot::Asking(a) => std::sync::Arc::ptr_eq(&a.signal, &signal),
            LeaseSlot::Open(_) => false,
        });
        if !ended && tokio::time::timeout_at(deadline, woken).await.is_err() {
            return Waited::No;
        }
        if signal.granted.load(Ordering::Relaxed) {
            self.count(|c| &c.waited, 1);
            Waited::Granted
        } else {
            Waited::No
        }
    }

    /// Whether `store_key`'s limiter leases, and how many units at most.
    fn rule(rules: &HashMap<String, (Lease, Algorithm)>, store_key: &str) -> Option<Lease> {
        rules.get(limiter_of(store_key)).map(|(l, _)| *l)
    }

    /// Decides the request from leases alone, if every check holds an open
    /// lease with a unit left; each spends one. `None`: ask Redis.
    pub(super) fn spend(&self, checks: &[Check<'_>], now: Nanos) -> Option<Vec<Outcome>> {
        let rules = self.rules.load();
        if checks.is_empty() || !checks.iter().all(|c| Self::rule(&rules, c.key).is_some()) {
            return None;
        }
        let mut table = self.table.lock();
        let usable = checks.iter().all(|c| match table.get(c.key) {
            Some(LeaseSlot::Open(h)) => h.units > 0 && h.spendable(c.algorithm, now),
            _ => false,
        });
        if !usable {
            return None;
        }
        let outcomes = checks
            .iter()
            .map(|c| match table.get_mut(c.key) {
                Some(LeaseSlot::Open(h)) => h.spend(now),
                _ => unreachable!("checked above under the same lock"),
            })
            .collect();
        drop(table);
        self.count(|c| &c.saved, 1);
        self.count(|c| &c.spent, checks.len() as u64);
        Some(outcomes)
    }

    /// What each check asks for in the call this request is about to make:
    /// a lease for every leased key without a usable one (ended leases are
    /// taken out here, their units given back).
    pub(super) fn ask<'a>(&'a self, checks: &[Check<'_>], now: Nanos) -> Asking<'a> {
        let rules = self.rules.load();
        let mut asking = Asking {
            leases: self,
            ask: 0,
            started: std::time::Instant::now(),
            wants: vec![None; checks.len()],
        };
        if !checks.iter().any(|c| Self::rule(&rules, c.key).is_some()) {
            return asking;
        }
        asking.ask = self.next_ask.fetch_add(1, Ordering::Relaxed);
        let mut table = self.table.lock();
        for (want, c) in asking.wants.iter_mut().zip(checks) {
            let Some(rule) = Self::rule(&rules, c.key) else {
                continue;
            };
            let Some(term) = lease::term(c.algorithm) else {
                continue;
            };
            match table.get(c.key) {
                Some(LeaseSlot::Asking(_)) => continue,
                Some(LeaseSlot::Open(h)) if h.units > 0 && h.spendable(c.algorithm, now) => {
                    continue
                }
                Some(LeaseSlot::Open(_)) => {
                    if let Some(LeaseSlot::Open(held)) = table.remove(c.key) {
                        self.end(c.key.into(), held);
                    }
                }
                None if table.len() >= MAX_LEASES => {
                    self.count(|c| &c.full, 1);
                    continue;
                }
                None => {}
            }
            table.insert(c.key.into(), LeaseSlot::asking(asking.ask));
            *want = Some(Want {
                key: c.key.into(),
                max: rule.max,
                term,
            });
        }
        asking
    }

    /// Ends every lease idle for [`IDLE`] at `at` (the monotonic clock),
    /// and, given the proxy's clock `now` (a prune round), every lease past
    /// its end; returns the units to give back.
    pub(super) fn sweep(&self, now: Option<Nanos>, at: std::time::Instant) -> Vec<GiveBack> {
        let mut table = self.table.lock();
        if table.is_empty() {
            return Vec::new();
        }
        let ended: Vec<Box<str>> = table
            .iter()
            .filter(|(_, e)| matches!(e, LeaseSlot::Open(h) if h.idle(at) || now.is_some_and(|now| !h.live(now))))
            .map(|(k, _)| k.clone())
            .collect();
        for key in ended {
            if let Some(LeaseSlot::Open(held)) = table.remove(&key) {
                self.end(key, held);
            }
        }
        drop(table);
        self.take_ended()
    }

    /// The units of leases that ended since the last call, to give back.
    pub(super) fn take_ended(&self) -> Vec<GiveBack> {
        std::mem::take(&mut *self.ended.lock())
    }

    /// Counts the give-backs that took their units out of the shared state
    /// (`Ok(true)`), and those that failed or found nothing to take them from.
    pub(super) fn gave_back(&self, units: u64, result: &Result<bool, StoreError>) {
        match result {
            Ok(true) => self.count(|c| &c.returned, units),
            Ok(false) | Err(_) => self.count(|c| &c.lost, units),
        }
    }

    /// A lease ended with `held.units` unspent: given back or lost, as its algorithm says.
    fn end(&self, store_key: Box<str>, held: OpenLease) {
        if held.units == 0 {
            return;
        }
        match give_back_args(&held) {
            Some(args) => self.ended.lock().push(GiveBack {
                store_key,
                units: held.units,
                args,
            }),
            None => self.count(|c| &c.lost, held.units),
        }
    }
}

/// The refund arguments that take `held`'s unspent units out again, where
/// its algorithm returns them (see [`crate::limiter::Rule::lease_unspent`]).
fn give_back_args(held: &OpenLease) -> Option<[String; 4]> {
    match lease::unspent(&held.algorithm, held.at) {
        Unspent::Returned { place } => Some([
            held.algorithm.kind().script_tag().into(),
            held.algorithm.shape().span.to_string(),
            place.to_string(),
            held.units.to_string(),
        ]),
        Unspent::Lost => None,
    }
}

/// The store key's limiter: what comes before the first `:`.
fn limiter_of(store_key: &str) -> &str {
    store_key.split_once(':').map_or(store_key, |(l, _)| l)
}

impl OpenLease {
    /// Live by both clocks. The injected clock says when the lease ends;
    /// the monotonic one keeps a wall clock that stepped back from
    /// stretching it (a fixed window's lease into the next window).
    ///
    /// A `now` before the grant does not end it: that is most often a
    /// request that read the clock before the asking request did and
    /// reached the table after it (under load, by milliseconds). Ending the
    /// lease then lost a token bucket's unspent units (they are never given
    /// back): 108 instead of at most 60 in a loaded run of
    /// `tests/lease.rs`. Spending is safe whatever `now` says, since the
    /// units are counted in the store already and the monotonic clock
    /// bounds how long after the call they can be spent.
    fn live(&self, now: Nanos) -> bool {
        let term = std::time::Duration::from_nanos(self.ends - self.granted);
        now < self.ends && self.taken.elapsed() < term
    }

    /// Not spent for [`IDLE`]; a lease past its term is also idle by then,
    /// since nothing spends it.
    fn idle(&self, at: std::time::Instant) -> bool {
        at.saturating_duration_since(self.used) >= IDLE
    }

    fn spendable(&self, algorithm: &Algorithm, now: Nanos) -> bool {
        self.live(now) && &self.algorithm == algorithm
    }

    /// Spends one unit: the request is admitted, with the quota this
    /// tollgate knows (what the grant reported, less what it spent since).
    fn spend(&mut self, now: Nanos) -> Outcome {
        self.units -= 1;
        self.spent += 1;
        self.used = std::time::Instant::now();
        let elapsed = now.saturating_sub(self.granted);
        Outcome {
            ruling: Ruling::Allow,
            quota: Quota {
                remaining: self.quota.remaining.saturating_sub(self.spent),
                reset_after: self.quota.reset_after.saturating_sub(elapsed),
                ..self.quota
            },
            at: self.at + elapsed,
            mark: 0,
            overflowed: false,
        }
    }
}

/// A lease one check asks for.
#[derive(Debug, Clone)]
struct Want {
    key: Box<str>,
    max: u64,
    term: Nanos,
}

/// The leases one request asks for; dropping it (the call failed, or the
/// request went away mid-call) frees the keys for the next ask.
pub(super) struct Asking<'a> {
    leases: &'a Leases,
    ask: u64,
    /// The monotonic clock before the call was sent.
    started: std::time::Instant,
    /// Parallel to the checks.
    wants: Vec<Option<Want>>,
}

impl Asking<'_> {
    /// Whether the call asks for any lease (mode `lease` rather than `check`).
    pub(super) fn any(&self) -> bool {
        self.wants.iter().any(Option::is_some)
    }

    /// Appends the 3 lease arguments per check (see `lease.lua`).
    pub(super) fn push_args(&self, call: &mut ScriptInvocation<'_>) {
        for want in &self.wants {
            let (max, term) = want.as_ref().map_or((0, 0), |w| (w.max, w.term));
            call.arg(max).arg(lease::SHARE).arg(term);
        }
    }

    /// The units each check was granted (the reply's tail): opens the
    /// leases. `sent` is the proxy's clock when the call was sent: a lease
    /// ends no later, on this clock, than Redis said counting from its `at`.
    pub(super) fn settle(
        self,
        checks: &[Check<'_>],
        grants: &[i64],
        outcomes: &[Outcome],
        sent: Nanos,
    ) {
        let leases = self.leases;
        let mut table = leases.table.lock();
        for (((want, c), o), &g) in self.wants.iter().zip(checks).zip(outcomes).zip(grants) {
            if want.is_none() {
                continue;
            }
            let units = g.max(0) as u64;
            let mine = table.get(c.key).is_some_and(|s| s.is_ask(self.ask));
            if units == 0 {
                if mine {
                    table.remove(c.key).map(|s| s.wake(false));
                }
                continue;
            }
            leases.count(|c| &c.taken, 1);
            leases.count(|c| &c.granted, units);
            let held = OpenLease {
                algorithm: c.algorithm.clone(),
                units,
                spent: 0,
                granted: sent,
                ends: sent.saturating_add(lease::ends_after(c.algorithm, o.at)),
                taken: self.started,
                used: std::time::Instant::now(),
                quota: o.quota,
                at: o.at,
            };
            if mine {
                table
                    .insert(c.key.into(), LeaseSlot::Open(held))
                    .map(|s| s.wake(true));
            } else {
                // A reload dropped this limiter's leases during the call.
                leases.end(c.key.into(), held);
            }
        }
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if !self.any() {
            return;
        }
        let mut table = self.leases.table.lock();
        for want in self.wants.iter().flatten() {
            if table.get(&want.key).is_some_and(|s| s.is_ask(self.ask)) {
                table.remove(&want.key).map(|s| s.wake(false));
            }
        }
    }
}

/// Splits a `lease` reply into `check`'s part and the units per check.
pub(super) fn split_reply(reply: &[i64], checks: usize) -> Result<(&[i64], &[i64]), StoreError> {
    let head = 2 + super::PER_CHECK * checks;
    if reply.len() != head + checks {
        return Err(super::bad_reply(reply.len()));
    }
    Ok(reply.split_at(head))
}

impl super::Redis {
    /// `lease:` rules from the config; a reload that changes a limiter ends its leases.
    pub fn configure_leases(&self, limiters: &[LimiterConfig]) {
        self.inner.leases.configure(limiters);
        self.give_back(self.inner.leases.take_ended());
    }

    pub fn bind_lease_metrics(&self, metrics: &Metrics) {
        self.inner.leases.bind_metrics(metrics);
    }

    /// Ends the leases past their end or idle (a prune round) and gives their units back.
    pub fn sweep_leases(&self, now: Nanos) {
        self.give_back(self.inner.leases.sweep(Some(now), std::time::Instant::now()));
    }

    /// Sends each give-back from a spawned task: the caller never waits. A
    /// give-back that fails leaves the units counted (the safe side) and
    /// counts them as lost; so does one the script finds nothing to give
    /// back in (the window it was counted in is over, or the key is gone).
    pub(super) fn give_back(&self, ended: Vec<GiveBack>) {
        for g in ended {
            let redis = super::Redis {
                inner: self.inner.clone(),
            };
            self.inner.runtime.spawn(async move {
                let mut call = redis.inner.script.prepare_invoke();
                let key = redis.key(&g.store_key);
                call.arg("refund").key(&key).arg(&g.args[..]);
                let call = &call;
                let result = redis
                    .call_at(&key, |mut con| async move {
                        call.invoke_async::<i64>(&mut con).await
                    })
                    .await
                    // The script answers 1 when it took the units out, 0 when
                    // there was nothing to take them from.
                    .map(|taken| taken == 1);
                if let Err(e) = &result {
                    tracing::debug!(error = %e, "giving back unspent leased units failed; they stay counted");
                }
                redis.inner.leases.gave_back(g.units, &result);
            });
        }
    }
}

/// Every [`IDLE_ROUND`], ends the leases idle for [`IDLE`] (one past its
/// term is idle a second after its last spend) and gives their units back, so a key whose
/// traffic moved to another tollgate is not left short by what this one
/// holds until a prune round (a minute by default). Ends with the store.
pub(super) async fn idle_loop(inner: std::sync::Weak<super::Inner>) {
    loop {
        tokio::time::sleep(IDLE_ROUND).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let ended = inner.leases.sweep(None, std::time::Instant::now());
        if !ended.is_empty() {
            super::Redis { inner }.give_back(ended);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyPart;
    use crate::limiter::fixed_window::FixedWindow;
    use crate::limiter::token_bucket::TokenBucket;
    use crate::limiter::NANOS_PER_SEC as S;

    const T0: Nanos = 1_000 * 3_600 * S;

    fn window(limit: u64) -> Algorithm {
        Algorithm::FixedWindow(FixedWindow {
            limit,
            window: 60 * S,
        })
    }

    fn limiter(name: &str, algorithm: Algorithm, lease: Option<u64>) -> LimiterConfig {
        LimiterConfig {
            name: name.into(),
            algorithm,
            key: vec![KeyPart::Global],
            shadow: false,
            overrides: vec![],
            reject: None,
            count: None,
            ban: None,
            lease: lease.map(|max| Lease { max }),
        }
    }

    fn check<'a>(key: &'a str, algorithm: &'a Algorithm) -> Check<'a> {
        Check {
            key,
            overflow: "overflow",
            algorithm,
            shadow: false,
        }
    }

    fn outcome(algorithm: &Algorithm, remaining: u64) -> Outcome {
        let (limit, window) = algorithm.frame();
        Outcome {
            ruling: Ruling::Allow,
            quota: Quota {
                limit,
                window,
                remaining,
                reset_after: 10 * S,
            },
            at: T0,
            mark: 0,
            overflowed: false,
        }
    }

    /// Asks for `checks` at `now` and settles with `grants` as Redis' reply.
    fn take(leases: &Leases, checks: &[Check<'_>], grants: &[i64], now: Nanos) {
        let asking = leases.ask(checks, now);
        let outcomes: Vec<Outcome> = checks.iter().map(|c| outcome(c.algorithm, 90)).collect();
        asking.settle(checks, grants, &outcomes, now);
    }

    #[test]
    fn a_request_is_decided_here_only_when_every_limiter_holds_a_unit() {
        let (a, b) = (window(100), window(100));
        let leases = Leases::new();
        leases.configure(&[
            limiter("a", a.clone(), Some(5)),
            limiter("b", b.clone(), Some(5)),
        ]);
        let both = [check("a:global", &a), check("b:global", &b)];
        take(&leases, &both, &[2, 0], T0);
        assert!(leases.spend(&both, T0 + 1).is_none(), "b holds no lease");
        assert!(leases.spend(&both[..1], T0 + 1).is_some());
        let last = leases.spend(&both[..1], T0 + 2).expect("the second unit");
        assert_eq!(last[0].ruling, Ruling::Allow);
        assert_eq!(last[0].quota.remaining, 88, "90 when leased, less 2 spent");
        assert!(leases.spend(&both[..1], T0 + 3).is_none(), "spent out");
    }

    #[test]
    fn a_key_is_asked_for_by_one_request_at_a_time() {
        let a = window(100);
        let leases = Leases::new();
        leases.configure(&[limiter("a", a.clone(), Some(5))]);
        let one = [check("a:global", &a)];
        let first = leases.ask(&one, T0);
        assert!(first.any());
        assert!(!leases.ask(&one, T0).any(), "the first is still asking");
        drop(first);
        assert!(leases.ask(&one, T0).any(), "a failed ask frees the key");
    }

    #[test]
    fn a_limiter_without_lease_never_asks() {
        let a = window(100);
        let leases = Leases::new();
        leases.configure(&[limiter("a", a.clone(), None)]);
        let one = [check("a:global", &a)];
        assert!(!leases.ask(&one, T0).any());
        assert!(leases.spend(&one, T0).is_none());
    }

    /// `a` leased with `max: 5` on `a:global`: a lease of 5 taken at `T0`, one unit spent.
    fn five_taken_one_spent(a: &Algorithm) -> Leases {
        let leases = Leases::new();
        leases.configure(&[limiter("a", a.clone(), Some(5))]);
        let one = [check("a:global", a)];
        take(&leases, &one, &[5], T0);
        leases.spend(&one, T0 + 1).expect("a unit");
        leases
    }

    #[test]
    fn a_reload_that_changes_the_limiter_ends_its_leases_and_gives_their_units_back() {
        let a = window(100);
        let leases = five_taken_one_spent(&a);
        let one = [check("a:global", &a)];
        leases.configure(&[limiter("a", window(200), Some(5))]);
        let back = leases.take_ended();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].units, 4);
        let start = T0 - T0 % (60 * S);
        assert_eq!(
            back[0].args,
            [
                "fw".to_string(),
                (60 * S).to_string(),
                start.to_string(),
                "4".into()
            ]
        );
        assert!(leases.spend(&one, T0 + 2).is_none(), "the lease ended");
    }

    #[test]
    fn a_lease_ends_at_its_term_and_a_token_buckets_units_stay_taken() {
        let bucket = Algorithm::TokenBucket(TokenBucket {
            capacity: 1000,
            interval: 10_000_000,
            refunds: false,
        });
        let a = window(100);
        let leases = Leases::new();
        // Before the grants: by this instant, no lease is idle.
        let at = std::time::Instant::now();
        leases.configure(&[
            limiter("a", a.clone(), Some(5)),
            limiter("t", bucket.clone(), Some(5)),
        ]);
        take(&leases, &[check("a:global", &a)], &[5], T0);
        take(&leases, &[check("t:global", &bucket)], &[5], T0);
        // Terms: 600 ms for the window, 100 ms for the bucket.
        assert!(leases.sweep(Some(T0 + 99_000_000), at).is_empty());
        assert!(
            leases.sweep(Some(T0 + 100_000_000), at).is_empty(),
            "the bucket's units are lost"
        );
        assert!(leases
            .spend(&[check("t:global", &bucket)], T0 + 100_000_000)
            .is_none());
        let back = leases.sweep(Some(T0 + 600_000_000), at);
        assert_eq!(back.len(), 1, "the window's units go back");
        assert_eq!(back[0].units, 5);
    }

    #[test]
    fn a_lease_not_spent_for_a_second_is_ended_and_its_units_go_back_within_its_term() {
        let a = window(100);
        let leases = five_taken_one_spent(&a);
        let one = [check("a:global", &a)];
        let spent = std::time::Instant::now();
        // Within the term (600 ms) by the proxy's clock, whatever the idle round sees.
        assert!(leases.sweep(None, spent).is_empty(), "just spent");
        let back = leases.sweep(None, spent + IDLE);
        assert_eq!(back.len(), 1, "idle for IDLE: the lease ends");
        assert_eq!(back[0].units, 4);
        assert!(leases.spend(&one, T0 + 2).is_none(), "and is not spent again");
    }

    #[test]
    fn a_request_that_read_the_clock_before_the_grant_spends_the_lease() {
        let a = window(100);
        let leases = Leases::new();
        leases.configure(&[limiter("a", a.clone(), Some(5))]);
        let one = [check("a:global", &a)];
        take(&leases, &one, &[5], T0);
        let early = leases.spend(&one, T0 - 1).expect("the lease is not ended");
        assert_eq!(early[0].at, T0, "reported at the grant, never before it");
        assert!(leases.ask(&one, T0 - 1).wants.iter().all(Option::is_none));
        assert!(leases.take_ended().is_empty(), "nothing given back");
    }

    #[test]
    fn a_clock_that_steps_back_does_not_stretch_the_lease_past_its_term() {
        // A 100 ms window: a term of 1 ms.
        let short = Algorithm::FixedWindow(FixedWindow {
            limit: 100,
            window: 100_000_000,
        });
        let leases = Leases::new();
        leases.configure(&[limiter("a", short.clone(), Some(5))]);
        let one = [check("a:global", &short)];
        take(&leases, &one, &[5], T0);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(
            leases.spend(&one, T0 - 60 * S).is_none(),
            "1 ms have passed on the monotonic clock"
        );
    }

    #[test]
    fn a_full_table_asks_for_no_new_lease() {
        let a = window(100);
        let leases = Leases::new();
        leases.configure(&[limiter("a", a.clone(), Some(5))]);
        let keys: Vec<String> = (0..=MAX_LEASES).map(|i| format!("a:{i}")).collect();
        let held: Vec<Asking<'_>> = keys[..MAX_LEASES]
            .iter()
            .map(|k| leases.ask(&[check(k, &a)], T0))
            .collect();
        assert!(held.iter().all(Asking::any));
        assert!(!leases.ask(&[check(&keys[MAX_LEASES], &a)], T0).any());
        drop(held);
        assert!(leases.ask(&[check(&keys[MAX_LEASES], &a)], T0).any());
    }
}
