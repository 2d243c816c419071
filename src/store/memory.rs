//! The in-process table of limiter state: exact counters, sharded, bounded, checked atomically per request.
//!
//! Every store keeps its live counters here: the memory backend alone, the
//! SQLite backend with a writer thread persisting what changed. All limiters
//! of one request are checked and recorded while holding the locks of the
//! shards their keys live in (taken in index order, so two requests never
//! deadlock), which is what makes "200 concurrent requests against a limit of
//! 50 admit exactly 50" hold. No lock is held across an `.await`.
//!
//! The table holds at most `store.max_keys` keys. Each of the 64 shards owns
//! a fixed share of the bound, so a shard decides alone, under the lock it
//! already holds, whether a new key fits: no global lock, no global counter on
//! the request path. A full shard first forgets state that is back at rest
//! (see [`crate::limiter::Rule::rests_at`]): such state answers exactly like
//! a key never seen, so forgetting it changes no decision. A key that is
//! limited, or merely counting, is never forgotten to make room. When nothing
//! in the shard rests, the new key is counted on its limiter's one overflow
//! key (shared by every client that did not fit), which lives in a second set
//! of shards locked after the first, so the lock order stays total.

use std::collections::hash_map::{Entry as MapEntry, RandomState};
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::{Check, Outcome};
use crate::limiter::{Algorithm, Nanos, Quota, State, Verdict, NANOS_PER_SEC};

const SHARDS: usize = 64;

/// Slots held back from `max_keys` for overflow keys (one per limiter that
/// overflows), so an overflow key always has room even when every shard is
/// full of limited clients.
pub const OVERFLOW_SLOTS: usize = 64;

/// The smallest bound the layout works with: the overflow slots and one key per shard.
pub const MIN_KEYS: usize = OVERFLOW_SLOTS + SHARDS;
const _: () = assert!(crate::config::MIN_MAX_KEYS >= MIN_KEYS);

pub use crate::config::DEFAULT_MAX_KEYS;

/// A full shard whose sweep found nothing at rest waits this long before the
/// next sweep (a sweep walks the whole shard: ~15,000 entries at the default
/// bound). Meanwhile new keys overflow, which is what a flood should get.
const SWEEP_GAP: Nanos = NANOS_PER_SEC / 10;

#[derive(Debug)]
pub struct Table {
    shards: Box<[Mutex<Shard>]>,
    /// Overflow keys, by the same shard index; locked only after `shards`.
    overflow: Box<[Mutex<Shard>]>,
    /// Overflow keys held, at most [`OVERFLOW_SLOTS`].
    overflow_len: AtomicUsize,
    /// Seeded per process, so a client cannot aim its keys at one shard.
    hasher: RandomState,
    max_keys: usize,
    /// Each shard holds `per_shard` keys, the first `extra` shards one more:
    /// together exactly `max_keys - OVERFLOW_SLOTS`.
    per_shard: usize,
    extra: usize,
    /// Whether changed keys are remembered for a writer to persist.
    track_changes: bool,
    counters: KeyCounters,
}

/// What the bound did, for `/metrics`.
#[derive(Debug, Default)]
pub struct KeyCounters {
    /// Keys at rest forgotten to make room for a new one.
    pub evicted: AtomicU64,
    /// Checks counted on a limiter's overflow key because the key's shard was full.
    pub overflowed: AtomicU64,
    /// Checks refused because even the overflow slots were all busy.
    pub refused: AtomicU64,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Box<str>, Entry>,
    /// Keys changed or removed since the writer last looked.
    changed: Vec<Box<str>>,
    /// No entry rests before this (a lower bound: entries only move it down
    /// when recorded, a sweep sets it exactly), so a full shard skips sweeps
    /// that could not find anything.
    next_rest: Nanos,
    last_sweep: Option<Nanos>,
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    /// The fingerprint of the shape the state was built under; 0 = loaded
    /// without one (kept). A fingerprint, not the shape: at a million keys
    /// every byte of an entry is a megabyte.
    shape: u32,
    /// From when the state is at rest (and can be forgotten).
    rests_at: Nanos,
    changed: bool,
    /// Placed for a check that is not recorded yet: a sweep run for another
    /// limiter of the same request must not take it away.
    pinned: bool,
}

/// One key's state as the writer persists it; `state: None` means deleted.
#[derive(Debug, Clone)]
pub struct Change {
    pub key: Box<str>,
    /// The state, its shape fingerprint and when it rests (for every
    /// algorithm but fixed windows, which store their window instead, that
    /// is also when it expires).
    pub state: Option<(State, u32, Nanos)>,
}

/// Where one check of a request is counted.
#[derive(Clone, Copy)]
enum Target {
    /// Its own key, in the regular shard with this guard index.
    Own(usize),
    /// Its limiter's overflow key, in the overflow shard with this guard index.
    Overflow(usize),
    /// Nowhere: the shard and the overflow slots are full of live state.
    Refused,
}

impl Table {
    /// A table with the default bound.
    pub fn new(track_changes: bool) -> Table {
        Table::with_max_keys(track_changes, DEFAULT_MAX_KEYS)
    }

    /// A table that never holds more than `max_keys` keys (at least [`MIN_KEYS`]).
    pub fn with_max_keys(track_changes: bool, max_keys: usize) -> Table {
        let max_keys = max_keys.max(MIN_KEYS);
        let regular = max_keys - OVERFLOW_SLOTS;
        let shards = || (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Table {
            shards: shards(),
            overflow: shards(),
            overflow_len: AtomicUsize::new(0),
            hasher: RandomState::new(),
            max_keys,
            per_shard: regular / SHARDS,
            extra: regular % SHARDS,
            track_changes,
            counters: KeyCounters::default(),
        }
    }

    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    pub fn counters(&self) -> &KeyCounters {
        &self.counters
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    fn cap(&self, shard: usize) -> usize {
        self.per_shard + usize::from(shard < self.extra)
    }

    /// Checks every limiter of one request and records the result, atomically.
    pub fn check(&self, checks: &[Check<'_>], now: Nanos) -> Vec<Outcome> {
        if let [c] = checks {
            // The common route with one limiter: one lock, no bookkeeping.
            let s = self.shard_of(c.key);
            let track = self.track_changes;
            let mut shard = self.shards[s].lock();
            if let Some(out) = shard.decide_present(c, now, track) {
                return vec![out];
            }
            if self.make_room(&mut shard, s, now) {
                return vec![shard.decide_new(c, now, track)];
            }
            drop(shard);
            let o = self.shard_of(c.overflow);
            let mut over = self.overflow[o].lock();
            let on_overflow = Check {
                key: c.overflow,
                ..*c
            };
            // Placed just above; overflow keys are never persisted.
            let out = match self.place_overflow(&mut over, c, now) {
                true => over.decide_present(&on_overflow, now, false),
                false => None,
            };
            return vec![out.map_or_else(|| refused(c, now), Outcome::overflowed)];
        }
        let shard_index: Vec<usize> = checks.iter().map(|c| self.shard_of(c.key)).collect();
        let mut order = shard_index.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| self.shards[i].lock()).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).expect("locked above");

        let placed: Vec<bool> = checks
            .iter()
            .zip(&shard_index)
            .map(|(c, &s)| self.place(&mut guards[guard_of(s)], s, c.key, c.algorithm, now))
            .collect();
        // Overflow shards are locked after every regular one: one total order.
        let mut over_order: Vec<usize> = checks
            .iter()
            .zip(&placed)
            .filter(|(_, &p)| !p)
            .map(|(c, _)| self.shard_of(c.overflow))
            .collect();
        over_order.sort_unstable();
        over_order.dedup();
        let mut over_guards: Vec<MutexGuard<'_, Shard>> = over_order
            .iter()
            .map(|&i| self.overflow[i].lock())
            .collect();
        let targets: Vec<Target> = checks
            .iter()
            .zip(&shard_index)
            .zip(&placed)
            .map(|((c, &s), &p)| {
                if p {
                    return Target::Own(guard_of(s));
                }
                let g = over_order
                    .binary_search(&self.shard_of(c.overflow))
                    .expect("locked above");
                if self.place_overflow(&mut over_guards[g], c, now) {
                    Target::Overflow(g)
                } else {
                    Target::Refused
                }
            })
            .collect();

        let verdicts: Vec<Verdict> = checks
            .iter()
            .zip(&targets)
            .map(|(c, t)| match *t {
                Target::Own(g) => guards[g].verdict(c.key, c.algorithm, now),
                Target::Overflow(g) => over_guards[g].verdict(c.overflow, c.algorithm, now),
                Target::Refused => refused(c, now).verdict,
            })
            .collect();
        let admitted = !checks
            .iter()
            .zip(&verdicts)
            .any(|(c, v)| v.is_deny() && !c.shadow);

        let track = self.track_changes;
        checks
            .iter()
            .zip(targets)
            .zip(verdicts)
            .map(|((c, t), verdict)| {
                let (quota, overflowed) = match t {
                    Target::Own(g) => (
                        guards[g].record(c.key, c.algorithm, now, admitted, track),
                        false,
                    ),
                    Target::Overflow(g) => (
                        over_guards[g].record(c.overflow, c.algorithm, now, admitted, false),
                        true,
                    ),
                    Target::Refused => return refused(c, now),
                };
                Outcome {
                    verdict,
                    quota,
                    at: now,
                    overflowed,
                }
            })
            .collect()
    }

    /// Makes sure `key` has an entry in `shard`, pinned until recorded;
    /// false when the shard is full and nothing in it rests.
    fn place(
        &self,
        shard: &mut Shard,
        index: usize,
        key: &str,
        algorithm: &Algorithm,
        now: Nanos,
    ) -> bool {
        if let Some(e) = shard.map.get_mut(key) {
            e.pinned = true;
            return true;
        }
        if !self.make_room(shard, index, now) {
            return false;
        }
        shard.insert_pinned(key, algorithm);
        true
    }

    /// Whether `shard` has room for one more key, after forgetting what rests if it is full.
    fn make_room(&self, shard: &mut Shard, index: usize, now: Nanos) -> bool {
        if shard.map.len() < self.cap(index) {
            return true;
        }
        let evicted = shard.sweep(now, self.track_changes);
        self.counters
            .evicted
            .fetch_add(evicted as u64, Ordering::Relaxed);
        shard.map.len() < self.cap(index)
    }

    /// [`Table::place`] for the check's overflow key, within [`OVERFLOW_SLOTS`].
    fn place_overflow(&self, shard: &mut Shard, c: &Check<'_>, now: Nanos) -> bool {
        if let Some(e) = shard.map.get_mut(c.overflow) {
            e.pinned = true;
            self.counters.overflowed.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let mut room = self.take_overflow_slot();
        if !room {
            let evicted = shard.sweep(now, false);
            if evicted > 0 {
                self.overflow_len.fetch_sub(evicted, Ordering::Relaxed);
                self.counters
                    .evicted
                    .fetch_add(evicted as u64, Ordering::Relaxed);
                room = self.take_overflow_slot();
            }
        }
        if !room {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        shard.insert_pinned(c.overflow, c.algorithm);
        self.counters.overflowed.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn take_overflow_slot(&self) -> bool {
        self.overflow_len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < OVERFLOW_SLOTS).then_some(n + 1)
            })
            .is_ok()
    }

    /// The quota `key` has now, without counting anything.
    pub fn peek(&self, key: &str, algorithm: &Algorithm, now: Nanos) -> Quota {
        let shard = self.shards[self.shard_of(key)].lock();
        match shard.map.get(key) {
            Some(e) if usable(e, algorithm) => algorithm.quota(&e.state, now),
            _ => algorithm.quota(&algorithm.fresh_state(), now),
        }
    }

    /// An admitted request finished or left (see [`crate::limiter::Rule::release`]).
    /// `key` is the key the check was counted on: its own, or its limiter's
    /// overflow key when [`Outcome::overflowed`] said so.
    pub fn release(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        let s = self.shard_of(key);
        let track = self.track_changes;
        if self.shards[s]
            .lock()
            .release(key, algorithm, ticket, now, track)
        {
            return;
        }
        // Overflow keys are never persisted.
        self.overflow[s]
            .lock()
            .release(key, algorithm, ticket, now, false);
    }

    /// `count:` — gives back the unit a request took (see [`Algorithm::refund`]).
    /// A request counted on an overflow key (the table was full) is not
    /// refunded: the shared count stays the stricter one.
    pub fn refund(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        let mut shard = self.shards[self.shard_of(key)].lock();
        let track = self.track_changes;
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = &mut *shard;
        if let Some(e) = map.get_mut(key) {
            if usable(e, algorithm) {
                algorithm.refund(&mut e.state, ticket, now);
                e.rests_at = algorithm.rests_at(&e.state);
                *next_rest = (*next_rest).min(e.rests_at);
                mark(e, key, changed, track);
            }
        }
    }

    /// Puts loaded state in place (start-up), without marking it changed.
    /// State already at rest is not worth a slot, and state that does not
    /// fit is dropped: both are deleted from the file with the next write, so
    /// the file never holds a key the table does not. Returns whether it was kept.
    pub fn load(&self, key: &str, state: State, shape: u32, rests_at: Nanos, now: Nanos) -> bool {
        let s = self.shard_of(key);
        let mut shard = self.shards[s].lock();
        let fits = shard.map.contains_key(key) || shard.map.len() < self.cap(s);
        if rests_at <= now || !fits {
            if self.track_changes {
                shard.changed.push(key.into());
            }
            return false;
        }
        shard.next_rest = shard.next_rest.min(rests_at);
        shard.map.insert(
            key.into(),
            Entry {
                state,
                shape,
                rests_at,
                changed: false,
                pinned: false,
            },
        );
        true
    }

    /// Forgets every key for which `doomed` says so (given the instant its
    /// state rests); returns how many.
    /// With `persist`, the writer also deletes them from the file (a reset);
    /// without, only memory forgets (expiry: the writer prunes the file by
    /// time on its own, and a million one-off clients expiring at once must
    /// not turn into a million queued deletions).
    pub fn remove_where(
        &self,
        persist: bool,
        mut doomed: impl FnMut(&str, Nanos) -> bool,
    ) -> usize {
        let mut removed = 0;
        for (set, overflow) in [(&self.shards, false), (&self.overflow, true)] {
            for shard in set.iter() {
                let mut shard = shard.lock();
                let gone =
                    shard.remove_where(self.track_changes && persist && !overflow, &mut doomed);
                if overflow {
                    self.overflow_len.fetch_sub(gone, Ordering::Relaxed);
                }
                removed += gone;
            }
        }
        removed
    }

    /// Takes what changed since the last call, for the writer to persist.
    pub fn take_changes(&self) -> Vec<Change> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let Shard { map, changed, .. } = &mut *shard;
            for key in changed.drain(..) {
                let state = map.get_mut(&key).map(|e| {
                    e.changed = false;
                    (e.state.clone(), e.shape, e.rests_at)
                });
                out.push(Change { key, state });
            }
            if changed.capacity() > 1024 {
                changed.shrink_to(64);
            }
        }
        out
    }

    /// Hands back keys whose change the writer could not persist, so the next
    /// flush writes them again: at most `cap` of them (the rest are given up
    /// and stay exact in memory only). A key changed again meanwhile is
    /// already queued with its newer state and is left alone; a key gone from
    /// memory is queued as a deletion. Returns (queued again, given up).
    pub fn requeue(&self, keys: impl IntoIterator<Item = Box<str>>, cap: usize) -> (usize, usize) {
        let (mut queued, mut given_up) = (0, 0);
        for key in keys {
            if queued >= cap {
                given_up += 1;
                continue;
            }
            let mut shard = self.shards[self.shard_of(&key)].lock();
            let Shard { map, changed, .. } = &mut *shard;
            match map.get_mut(&*key) {
                Some(e) if e.changed => {}
                Some(e) => {
                    e.changed = true;
                    changed.push(key);
                }
                None => changed.push(key),
            }
            queued += 1;
        }
        (queued, given_up)
    }

    /// Marks every live key changed (the file was replaced: write it all again); returns how many.
    pub fn requeue_all(&self) -> usize {
        let mut marked = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let Shard { map, changed, .. } = &mut *shard;
            for (key, e) in map.iter_mut() {
                if !e.changed {
                    e.changed = true;
                    changed.push(key.clone());
                }
                marked += 1;
            }
        }
        marked
    }

    /// Keys held, overflow keys included; never more than `max_keys`.
    pub fn len(&self) -> usize {
        let regular: usize = self.shards.iter().map(|s| s.lock().map.len()).sum();
        regular + self.overflow_len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live keys of the limiter `limiter` (its overflow key included), for tests and status.
    pub fn keys_of(&self, limiter: &str) -> HashSet<String> {
        let mut out = HashSet::new();
        for shard in self.shards.iter().chain(self.overflow.iter()) {
            for k in shard.lock().map.keys() {
                if crate::key::limiter_of(k) == limiter {
                    out.insert(k.to_string());
                }
            }
        }
        out
    }
}

/// The answer when a check cannot be counted anywhere: refuse, never admit
/// uncounted (a fresh counter is exactly what a flood is after).
fn refused(c: &Check<'_>, now: Nanos) -> Outcome {
    let quota = c.algorithm.quota(&c.algorithm.fresh_state(), now);
    Outcome {
        verdict: Verdict::Deny {
            retry_after: NANOS_PER_SEC,
        },
        quota: Quota {
            remaining: 0,
            reset_after: NANOS_PER_SEC,
            ..quota
        },
        at: now,
        overflowed: true,
    }
}

impl Outcome {
    fn overflowed(self) -> Outcome {
        Outcome {
            overflowed: true,
            ..self
        }
    }
}

/// State built under another shape (a reload changed the window or the
/// algorithm) no longer means anything: the limiter starts afresh for the key.
fn usable(e: &Entry, algorithm: &Algorithm) -> bool {
    algorithm.fits(&e.state) && (e.shape == 0 || e.shape == algorithm.shape().fingerprint())
}

fn mark(e: &mut Entry, key: &str, changed: &mut Vec<Box<str>>, track: bool) {
    if track && !e.changed {
        e.changed = true;
        changed.push(key.into());
    }
}

fn fresh_entry(algorithm: &Algorithm) -> Entry {
    Entry {
        state: algorithm.fresh_state(),
        shape: algorithm.shape().fingerprint(),
        rests_at: 0,
        changed: false,
        pinned: false,
    }
}

fn decide_entry(
    e: &mut Entry,
    c: &Check<'_>,
    now: Nanos,
    changed: &mut Vec<Box<str>>,
    next_rest: &mut Nanos,
    track: bool,
) -> Outcome {
    let verdict = if usable(e, c.algorithm) {
        c.algorithm.check(&e.state, now)
    } else {
        c.algorithm.check(&c.algorithm.fresh_state(), now)
    };
    let admitted = !verdict.is_deny() || c.shadow;
    let quota = record_entry(
        e,
        c.key,
        c.algorithm,
        now,
        admitted,
        changed,
        next_rest,
        track,
    );
    Outcome {
        verdict,
        quota,
        at: now,
        overflowed: false,
    }
}

#[allow(clippy::too_many_arguments)] // the split borrows of one shard
fn record_entry(
    e: &mut Entry,
    key: &str,
    algorithm: &Algorithm,
    now: Nanos,
    admitted: bool,
    changed: &mut Vec<Box<str>>,
    next_rest: &mut Nanos,
    track: bool,
) -> Quota {
    if !usable(e, algorithm) {
        e.state = algorithm.fresh_state();
    }
    e.shape = algorithm.shape().fingerprint();
    algorithm.record(&mut e.state, now, admitted);
    e.rests_at = algorithm.rests_at(&e.state);
    e.pinned = false;
    *next_rest = (*next_rest).min(e.rests_at);
    mark(e, key, changed, track);
    algorithm.quota(&e.state, now)
}

impl Shard {
    fn insert_pinned(&mut self, key: &str, algorithm: &Algorithm) {
        self.map.insert(
            key.into(),
            Entry {
                state: algorithm.fresh_state(),
                shape: algorithm.shape().fingerprint(),
                rests_at: 0,
                changed: false,
                pinned: true,
            },
        );
    }

    fn verdict(&self, key: &str, algorithm: &Algorithm, now: Nanos) -> Verdict {
        match self.map.get(key) {
            Some(e) if usable(e, algorithm) => algorithm.check(&e.state, now),
            _ => algorithm.check(&algorithm.fresh_state(), now),
        }
    }

    fn record(
        &mut self,
        key: &str,
        algorithm: &Algorithm,
        now: Nanos,
        admitted: bool,
        track: bool,
    ) -> Quota {
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let e = match map.get_mut(key) {
            Some(e) => e,
            // Placed before; only a caller that skipped `place` gets here.
            None => match map.entry(key.into()) {
                MapEntry::Vacant(v) => v.insert(fresh_entry(algorithm)),
                MapEntry::Occupied(_) => unreachable!("looked up above under the same lock"),
            },
        };
        record_entry(e, key, algorithm, now, admitted, changed, next_rest, track)
    }

    /// One limiter alone on a key already here: one lookup, the common case.
    fn decide_present(&mut self, c: &Check<'_>, now: Nanos, track: bool) -> Option<Outcome> {
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let e = map.get_mut(c.key)?;
        Some(decide_entry(e, c, now, changed, next_rest, track))
    }

    /// One limiter alone on a key not here yet (room was made for it).
    fn decide_new(&mut self, c: &Check<'_>, now: Nanos, track: bool) -> Outcome {
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let e = map
            .entry(c.key.into())
            .or_insert_with(|| fresh_entry(c.algorithm));
        decide_entry(e, c, now, changed, next_rest, track)
    }

    /// Whether `key` was here (and released).
    fn release(
        &mut self,
        key: &str,
        algorithm: &Algorithm,
        ticket: Nanos,
        now: Nanos,
        track: bool,
    ) -> bool {
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let Some(e) = map.get_mut(key) else {
            return false;
        };
        if algorithm.fits(&e.state) {
            algorithm.release(&mut e.state, ticket, now);
            e.rests_at = algorithm.rests_at(&e.state);
            *next_rest = (*next_rest).min(e.rests_at);
            mark(e, key, changed, track);
        }
        true
    }

    /// Forgets every entry at rest at `now`; returns how many. Skipped when
    /// nothing can rest yet, or a sweep ran less than [`SWEEP_GAP`] ago.
    fn sweep(&mut self, now: Nanos, track: bool) -> usize {
        let recent = self
            .last_sweep
            .is_some_and(|t| now.saturating_sub(t) < SWEEP_GAP);
        if now < self.next_rest || recent {
            return 0;
        }
        self.last_sweep = Some(now);
        let mut next_rest = Nanos::MAX;
        let removed = self.remove_where(track, |_, rests_at| {
            if rests_at <= now {
                return true;
            }
            next_rest = next_rest.min(rests_at);
            false
        });
        self.next_rest = next_rest;
        removed
    }

    /// Forgets what `doomed` names; with `persist`, queues each for deletion from the file.
    fn remove_where(
        &mut self,
        persist: bool,
        mut doomed: impl FnMut(&str, Nanos) -> bool,
    ) -> usize {
        let Shard { map, changed, .. } = self;
        let before = map.len();
        map.retain(|k, e| {
            let gone = !e.pinned && doomed(k, e.rests_at);
            if gone && persist && !e.changed {
                // A key already queued is deleted when the writer finds it gone.
                changed.push(k.clone());
            }
            !gone
        });
        if map.capacity() > 64 && map.len() < map.capacity() / 4 {
            // Give memory back after a wave of one-off clients expired.
            map.shrink_to(map.len() * 2);
        }
        before - map.len()
    }
}

#[cfg(test)]
mod tests;
