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
//! a key never seen, so forgetting it changes no decision. When nothing
//! rests, it forgets its lightest live key among those with strictly less
//! than half their quota used at their last request ([`shard`]'s weight):
//! that client's next request starts on a fresh quota, so it regains at most
//! what its key had counted, under half its limit, and only when its shard
//! held no lighter key. A key at or over half its quota (a limited one above
//! all) is never forgotten while live. A flood of made-up identities thus
//! makes room by forgetting itself (its keys are the lightest), and a new
//! well-behaved client gets a key of its own. Finding the lightest is
//! amortised O(1): one walk of the shard keeps its lightest sixteenth as
//! the next candidates. Only a shard full of keys at or over half their
//! quota counts a new key on its limiter's one overflow key (shared by every
//! client that did not fit), which lives in a second set of shards locked
//! after the first, so the lock order stays total: to get there, an attacker
//! must hold a whole shard's share of `max_keys` at half a quota each.
//!
//! A request one limiter refuses creates no key in the others (see
//! [`Table::check`]): a client at 429 sending a new header value per attempt
//! adds nothing to the table.
//!
//! Keys are filed under a keyed 128-bit hash, not their text ([`key_hash`]):
//! at a million keys the strings cost as much as the table. Where the text
//! is needed it comes from elsewhere: the request gives it to the writer's
//! queue of changed keys, and the SQLite writer reads the rows of keys a
//! sweep forgot ([`Forgotten`]) from the file.
//!
//! A shard never holds more than [`DENSE_SHARD`] keys: the shard count grows
//! with `max_keys` instead, so every shard's table stays in 16,384 buckets
//! rather than doubling to 32,768 for the last few keys (see
//! docs/PERFORMANCE.md, "The default `store.max_keys`").

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::{Check, Outcome};
use crate::limiter::{Algorithm, Nanos, Quota, Ruling, State, Ticket, NANOS_PER_SEC};
use key_hash::{KeyHash, KeyHasher};
use shard::Shard;

mod key_hash;
mod shard;

/// The fewest shards: enough that requests rarely wait on one another's lock.
const SHARDS: usize = 64;

/// The most keys one shard holds: hashbrown keeps 7/8 of 16,384 buckets, and
/// one key more doubles the table to 32,768 (at half load: ~60 bytes a key
/// for nothing). `max_keys` beyond 64 shards of this gets more shards.
pub const DENSE_SHARD: usize = 14_336;

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
    /// Seeded per process, so a client can neither aim its keys at one shard
    /// nor make two keys collide.
    hasher: KeyHasher,
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
    /// Keys forgotten to make room for a new one: at rest, or live and light.
    pub evicted: AtomicU64,
    /// Of those, live keys (under half their quota used): their clients start afresh.
    pub evicted_live: AtomicU64,
    /// Checks counted on a limiter's overflow key because the key's shard
    /// was full of keys at or over half their quota.
    pub overflowed: AtomicU64,
    /// Checks refused because even the overflow slots were all busy.
    pub refused: AtomicU64,
}

/// One key's state read back from a file at start, for [`Table::load_all`].
#[derive(Debug, Clone)]
pub struct Loaded<'a> {
    pub key: String,
    pub algorithm: &'a Algorithm,
    pub state: State,
    /// The fingerprint of the shape it was built under; 0: none kept (a
    /// window row, which names its window instead).
    pub shape: u32,
    /// When it rests (see [`crate::limiter::Rule::rests_at`]).
    pub rests_at: Nanos,
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

/// Rows of a limiter's keys that a full shard forgot at rest (to make room),
/// whose text the table no longer has: the writer reads the keys of these
/// rows from the file and deletes those memory does not hold, so the file
/// never holds a key the table does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    pub limiter: Box<str>,
    pub rows: Rows,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// `rate_limit_windows` rows of the window starting at this instant (Unix ns).
    Window(Nanos),
    /// `limiter_state` rows expired by this instant (Unix ns).
    ExpiredBy(Nanos),
}

/// Where one check of a request is counted.
#[derive(Clone, Copy)]
enum Placement {
    /// Its own key, already held, in the regular shard with this guard index.
    Held(usize),
    /// No key yet in that shard, and none is made: the request is refused.
    Absent(usize),
    /// Its own key, placed for this request in that shard.
    Placed(usize),
    /// Its limiter's overflow key (hashed so), in the overflow shard with this guard index.
    Overflow(usize, KeyHash),
    /// Nowhere: no room in its shard (then the overflow key is tried), or
    /// the overflow slots are full too.
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
        let count = SHARDS.max(regular.div_ceil(DENSE_SHARD));
        let shards = || (0..count).map(|_| Mutex::new(Shard::default())).collect();
        Table {
            shards: shards(),
            overflow: shards(),
            overflow_len: AtomicUsize::new(0),
            hasher: KeyHasher::default(),
            max_keys,
            per_shard: regular / count,
            extra: regular % count,
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

    /// The key's hash and the index of its shard (regular and overflow alike).
    fn locate(&self, key: &str) -> (KeyHash, usize) {
        let h = self.hasher.hash(key);
        (h, h.shard(self.shards.len()))
    }

    #[cfg(test)]
    fn shard_of(&self, key: &str) -> usize {
        self.locate(key).1
    }

    fn cap(&self, shard: usize) -> usize {
        self.per_shard + usize::from(shard < self.extra)
    }

    /// Checks every limiter of one request and records the result, atomically.
    ///
    /// A refused request records on the keys it already has (a fixed window
    /// counts every attempt) but creates none: a new key is placed only when
    /// every limiter admits the request, each on its state or, without one,
    /// on a fresh state. So a client refused by one limiter cannot fill the
    /// table through another (a new header value per attempt).
    pub fn check(&self, checks: &[Check<'_>], now: Nanos) -> Vec<Outcome> {
        if let [c] = checks {
            return vec![self.check_one(c, now)];
        }
        let located: Vec<(KeyHash, usize)> = checks.iter().map(|c| self.locate(c.key)).collect();
        let (order, mut guards) = lock_all(&self.shards, located.iter().map(|&(_, s)| s));
        let (mut targets, mut rulings) =
            self.placements(checks, &located, &order, &mut guards, now);
        let mut over_guards = self.overflow_for(checks, &mut targets, &mut rulings, now);
        let admitted = admits(checks, &rulings);
        let track = self.track_changes;
        let mut outcomes = Vec::with_capacity(checks.len());
        for (((c, t), ruling), &(h, _)) in checks.iter().zip(targets).zip(rulings).zip(&located) {
            let ((quota, mark), overflowed) = match t {
                Placement::Held(g) => (
                    guards[g].record(h, c.key, c.algorithm, now, admitted, track),
                    false,
                ),
                Placement::Placed(g) if admitted => (
                    guards[g].record(h, c.key, c.algorithm, now, admitted, track),
                    false,
                ),
                Placement::Placed(g) => {
                    // Placed, then refused on another limiter's overflow key: taken back.
                    guards[g].discard(h);
                    outcomes.push(untracked(c, ruling, now));
                    continue;
                }
                Placement::Absent(_) => {
                    outcomes.push(untracked(c, ruling, now));
                    continue;
                }
                Placement::Overflow(g, oh) => (
                    over_guards[g].record(oh, c.overflow, c.algorithm, now, admitted, false),
                    true,
                ),
                Placement::Refused => {
                    outcomes.push(refused(c, now));
                    continue;
                }
            };
            outcomes.push(Outcome {
                ruling,
                quota,
                at: now,
                mark,
                overflowed,
            });
        }
        outcomes
    }

    /// Each check's key and ruling under the locks `order` lists: a new key
    /// is placed only when every limiter admits, else left absent.
    fn placements(
        &self,
        checks: &[Check<'_>],
        located: &[(KeyHash, usize)],
        order: &[usize],
        guards: &mut [MutexGuard<'_, Shard>],
        now: Nanos,
    ) -> (Vec<Placement>, Vec<Ruling>) {
        let guard_of = |shard: usize| order.binary_search(&shard).expect("locked above");
        // Held keys are pinned, so making room for another check keeps them.
        let mut targets: Vec<Placement> = located
            .iter()
            .map(|&(h, s)| match guards[guard_of(s)].pin(h) {
                true => Placement::Held(guard_of(s)),
                false => Placement::Absent(guard_of(s)),
            })
            .collect();
        let rulings: Vec<Ruling> = checks
            .iter()
            .zip(located)
            .map(|(c, &(h, s))| guards[guard_of(s)].ruling(h, c.algorithm, now))
            .collect();
        if admits(checks, &rulings) {
            for ((c, &(h, s)), t) in checks.iter().zip(located).zip(&mut targets) {
                if let Placement::Absent(g) = *t {
                    *t = match self.make_room(&mut guards[g], s, now) {
                        true => {
                            guards[g].insert_pinned(h, c.key, c.algorithm);
                            Placement::Placed(g)
                        }
                        false => Placement::Refused,
                    };
                }
            }
        }
        (targets, rulings)
    }

    /// Counts each check that found no room ([`Placement::Refused`]) on its
    /// limiter's overflow key, with that key's ruling, or leaves it refused
    /// when the overflow slots are full too. Overflow shards are locked after
    /// every regular one: one total order. Returns their guards.
    fn overflow_for(
        &self,
        checks: &[Check<'_>],
        targets: &mut [Placement],
        rulings: &mut [Ruling],
        now: Nanos,
    ) -> Vec<MutexGuard<'_, Shard>> {
        let located: Vec<(KeyHash, usize)> = checks
            .iter()
            .zip(targets.iter())
            .filter(|(_, t)| matches!(t, Placement::Refused))
            .map(|(c, _)| self.locate(c.overflow))
            .collect();
        if located.is_empty() {
            return Vec::new();
        }
        let (order, mut guards) = lock_all(&self.overflow, located.iter().map(|&(_, o)| o));
        let mut located = located.into_iter();
        for ((c, t), v) in checks.iter().zip(targets).zip(rulings) {
            if !matches!(t, Placement::Refused) {
                continue;
            }
            let (oh, o) = located.next().expect("one per check without room");
            let g = order.binary_search(&o).expect("locked above");
            *v = match self.place_overflow(&mut guards[g], c, oh, now) {
                true => {
                    *t = Placement::Overflow(g, oh);
                    guards[g].ruling(oh, c.algorithm, now)
                }
                false => refused(c, now).ruling,
            };
        }
        guards
    }

    /// [`Table::check`] for a route with one limiter: one lock, no bookkeeping.
    fn check_one(&self, c: &Check<'_>, now: Nanos) -> Outcome {
        let (h, s) = self.locate(c.key);
        let track = self.track_changes;
        let mut shard = self.shards[s].lock();
        if let Some(out) = shard.decide_present(c, h, now, track) {
            return out;
        }
        if self.make_room(&mut shard, s, now) {
            return shard.decide_new(c, h, now, track);
        }
        drop(shard);
        let (oh, o) = self.locate(c.overflow);
        let mut over = self.overflow[o].lock();
        let on_overflow = Check {
            key: c.overflow,
            ..*c
        };
        // Placed just above; overflow keys are never persisted.
        let out = match self.place_overflow(&mut over, c, oh, now) {
            true => over.decide_present(&on_overflow, oh, now, false),
            false => None,
        };
        out.map_or_else(|| refused(c, now), Outcome::overflowed)
    }

    /// Whether `shard` has room for one more key. A full shard first forgets
    /// what rests; if nothing does, its lightest live key under half its
    /// quota (see the module doc for what that costs whom).
    fn make_room(&self, shard: &mut Shard, index: usize, now: Nanos) -> bool {
        if shard.map.len() < self.cap(index) {
            return true;
        }
        let rested = shard.sweep(now, SWEEP_GAP, self.track_changes);
        self.counters
            .evicted
            .fetch_add(rested as u64, Ordering::Relaxed);
        if shard.map.len() < self.cap(index) {
            return true;
        }
        if !shard.evict_lightest(now, SWEEP_GAP, self.track_changes) {
            return false;
        }
        self.counters.evicted.fetch_add(1, Ordering::Relaxed);
        self.counters.evicted_live.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// [`Table::place`] for the check's overflow key (hashed `oh`), within [`OVERFLOW_SLOTS`].
    fn place_overflow(&self, shard: &mut Shard, c: &Check<'_>, oh: KeyHash, now: Nanos) -> bool {
        if shard.pin(oh) {
            self.counters.overflowed.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let mut room = self.take_overflow_slot();
        if !room {
            let evicted = shard.sweep(now, SWEEP_GAP, false);
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
        shard.insert_pinned(oh, c.overflow, c.algorithm);
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
        let (h, s) = self.locate(key);
        self.shards[s].lock().quota(h, algorithm, now)
    }

    /// An admitted request finished or left (see [`crate::limiter::Rule::release`]).
    /// `key` is the key the check was counted on: its own, or its limiter's
    /// overflow key when [`Outcome::overflowed`] said so.
    pub fn release(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        let (h, s) = self.locate(key);
        let track = self.track_changes;
        if self.shards[s]
            .lock()
            .release(h, key, algorithm, ticket, now, track)
        {
            return;
        }
        // Overflow keys are never persisted.
        self.overflow[s]
            .lock()
            .release(h, key, algorithm, ticket, now, false);
    }

    /// `count:` — gives back the unit a request took (see [`Algorithm::refund`]).
    /// A request counted on an overflow key (the table was full) is not
    /// refunded: the shared count stays the stricter one.
    pub fn refund(&self, key: &str, algorithm: &Algorithm, ticket: Ticket, now: Nanos) {
        let (h, s) = self.locate(key);
        let track = self.track_changes;
        self.shards[s]
            .lock()
            .refund(h, key, algorithm, ticket, now, track);
    }

    /// Puts the state read back at start-up in place, without marking it
    /// changed, the heaviest first (see [`shard::weight`]): when the file
    /// holds more keys than `store.max_keys` (the bound was lowered), each
    /// shard keeps its most limited keys, as eviction would have. State
    /// already at rest is not worth a slot, and state that does not fit is
    /// dropped: both are deleted from the file with the next write, so the
    /// file never holds a key the table does not. Returns how many were kept.
    pub fn load_all(&self, rows: Vec<Loaded<'_>>, now: Nanos) -> usize {
        let mut weighed: Vec<(u8, Loaded<'_>)> = rows
            .into_iter()
            .map(|row| (shard::weight(&row.algorithm.quota(&row.state, now)), row))
            .collect();
        weighed.sort_by_key(|(weight, _)| std::cmp::Reverse(*weight));
        let kept = weighed
            .into_iter()
            .map(|(weight, row)| self.load(row, weight, now));
        kept.filter(|&kept| kept).count()
    }

    /// One key of [`Table::load_all`]; whether it was kept.
    fn load(&self, row: Loaded<'_>, weight: u8, now: Nanos) -> bool {
        let Loaded {
            key,
            state,
            shape,
            rests_at,
            ..
        } = row;
        let (h, s) = self.locate(&key);
        let mut shard = self.shards[s].lock();
        let fits = shard.map.contains_key(&h) || shard.map.len() < self.cap(s);
        if rests_at <= now || !fits {
            if self.track_changes {
                shard.changed.push(key.into());
            }
            return false;
        }
        shard.load(h, &key, (state, shape, rests_at), weight);
        true
    }

    /// Forgets every key for which `doomed` says so (given its limiter's name
    /// and the instant its state rests); returns how many. Memory only: the
    /// writer prunes the file by time and by limiter on its own, and a
    /// million one-off clients expiring at once must not turn into a million
    /// queued deletions.
    pub fn remove_where(&self, mut doomed: impl FnMut(&str, Nanos) -> bool) -> usize {
        let mut removed = 0;
        for (set, overflow) in [(&self.shards, false), (&self.overflow, true)] {
            for shard in set.iter() {
                let gone = shard.lock().remove_where(&mut doomed);
                if overflow {
                    self.overflow_len.fetch_sub(gone, Ordering::Relaxed);
                }
                removed += gone;
            }
        }
        removed
    }

    /// Forgets these keys (admin reset), and the writer deletes them from the
    /// file; returns how many were held.
    pub fn remove_keys(&self, keys: &[String]) -> usize {
        let mut removed = 0;
        for key in keys {
            let (h, s) = self.locate(key);
            if self.shards[s].lock().remove(h, key, self.track_changes) {
                removed += 1;
            } else if self.overflow[s].lock().remove(h, key, false) {
                self.overflow_len.fetch_sub(1, Ordering::Relaxed);
                removed += 1;
            }
        }
        removed
    }

    /// Whether memory holds state for `key` (overflow keys aside: never persisted).
    pub fn holds(&self, key: &str) -> bool {
        let (h, s) = self.locate(key);
        self.shards[s].lock().map.contains_key(&h)
    }

    /// Takes what changed since the last call, for the writer to persist.
    pub fn take_changes(&self) -> Vec<Change> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let changed = std::mem::take(&mut shard.changed);
            for key in changed {
                let state = shard.map.get_mut(&self.hasher.hash(&key)).map(|e| {
                    e.changed = false;
                    (e.state.clone(), e.shape, e.rests_at)
                });
                out.push(Change { key, state });
            }
        }
        out
    }

    /// Takes the rows forgotten at rest since the last call (see [`Forgotten`]).
    pub fn take_forgotten(&self) -> Vec<Forgotten> {
        let mut out: Vec<Forgotten> = Vec::new();
        for shard in self.shards.iter() {
            for f in shard.lock().forgotten.drain(..) {
                note_rows(&mut out, &f.limiter, f.rows);
            }
        }
        out
    }

    /// Hands back forgotten rows the writer could not delete, for the next flush.
    pub fn restore_forgotten(&self, forgotten: Vec<Forgotten>) {
        let mut shard = self.shards[0].lock();
        for f in forgotten {
            note_rows(&mut shard.forgotten, &f.limiter, f.rows);
        }
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
            let (h, s) = self.locate(&key);
            self.shards[s].lock().requeue(h, key, true);
            queued += 1;
        }
        (queued, given_up)
    }

    /// Marks these keys changed where memory still holds them (the file was
    /// replaced: the writer names the keys the old one held, and this writes
    /// them all again); returns how many are held.
    pub fn requeue_held(&self, keys: impl IntoIterator<Item = Box<str>>) -> usize {
        let mut held = 0;
        for key in keys {
            let (h, s) = self.locate(&key);
            held += usize::from(self.shards[s].lock().requeue(h, key, false));
        }
        held
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
    pub fn count_of(&self, limiter: &str) -> usize {
        self.shards
            .iter()
            .chain(self.overflow.iter())
            .map(|s| s.lock().count_of(limiter))
            .sum()
    }
}

/// Adds `rows` of `limiter` to `list`, merged with what is there (a sweep
/// forgets many keys of few windows).
fn note_rows(list: &mut Vec<Forgotten>, limiter: &str, rows: Rows) {
    for have in list.iter_mut().filter(|h| &*h.limiter == limiter) {
        match (&mut have.rows, rows) {
            (Rows::Window(a), Rows::Window(b)) if *a == b => return,
            (Rows::ExpiredBy(a), Rows::ExpiredBy(b)) => {
                *a = (*a).max(b);
                return;
            }
            _ => {}
        }
    }
    list.push(Forgotten {
        limiter: limiter.into(),
        rows,
    });
}

/// Locks the shards of `set` at these indices, each once, in index order
/// (so two requests never deadlock); returns the indices in that order and
/// their guards.
fn lock_all(
    set: &[Mutex<Shard>],
    indices: impl Iterator<Item = usize>,
) -> (Vec<usize>, Vec<MutexGuard<'_, Shard>>) {
    let mut order: Vec<usize> = indices.collect();
    order.sort_unstable();
    order.dedup();
    let guards = order.iter().map(|&i| set[i].lock()).collect();
    (order, guards)
}

/// Whether no enforcing limiter refuses (a shadow limiter's denial blocks nothing).
fn admits(checks: &[Check<'_>], rulings: &[Ruling]) -> bool {
    !checks
        .iter()
        .zip(rulings)
        .any(|(c, v)| v.is_deny() && !c.shadow)
}

/// The answer for a check with no key of its own in a refused request:
/// its ruling on a fresh state, and nothing recorded.
fn untracked(c: &Check<'_>, ruling: Ruling, now: Nanos) -> Outcome {
    Outcome {
        ruling,
        quota: c.algorithm.quota(&c.algorithm.fresh_state(), now),
        at: now,
        mark: 0,
        overflowed: false,
    }
}

/// The answer when a check cannot be counted anywhere: refuse, never admit
/// uncounted (a fresh counter is exactly what a flood is after).
fn refused(c: &Check<'_>, now: Nanos) -> Outcome {
    let quota = c.algorithm.quota(&c.algorithm.fresh_state(), now);
    Outcome {
        ruling: Ruling::Deny {
            retry_after: NANOS_PER_SEC,
        },
        quota: Quota {
            remaining: 0,
            reset_after: NANOS_PER_SEC,
            ..quota
        },
        at: now,
        mark: 0,
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

#[cfg(test)]
mod tests;
