//! One shard of the table: its entries by key hash, what changed for the writer, and what it forgets to make room (state at rest, then the lightest live keys).

use std::collections::HashMap;

use super::key_hash::{BuildPassThrough, KeyHash};
use super::{note_rows, Forgotten, Rows};
use crate::limiter::{Algorithm, Kept, Nanos, Quota, Ruling, State, Ticket};
use crate::store::{Check, Outcome};

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) map: HashMap<KeyHash, ShardEntry, BuildPassThrough>,
    /// The names of the limiters with keys here; an entry holds its limiter's
    /// index (prune finds a removed limiter's keys by name, and a key's text
    /// is not kept).
    limiters: Vec<Box<str>>,
    /// Keys changed or removed since the writer last looked.
    pub(super) changed: Vec<Box<str>>,
    /// Rows of keys a sweep forgot at rest, for the writer to delete.
    pub(super) forgotten: Vec<Forgotten>,
    /// No entry rests before this (a lower bound: entries only move it down
    /// when recorded, a sweep sets it exactly), so a full shard skips sweeps
    /// that could not find anything.
    next_rest: Nanos,
    last_sweep: Option<Nanos>,
    /// Candidates for eviction while live, the lightest last (see
    /// [`Shard::evict_lightest`]); each is checked again when its turn comes.
    light: Vec<KeyHash>,
    /// When the shard was last searched for light keys, and whether that
    /// search filled a whole batch (then the next one may follow at once).
    light_search: Option<(Nanos, bool)>,
}

/// [`ShardEntry::standing`]'s bit for an entry pinned by a request in progress.
const PINNED: u8 = 0x80;
/// The weight of a key with nothing left (limited): never evicted while live.
const LIMITED: u8 = 127;
/// Weights count the quota used at the last record in 126ths: a live key
/// is evicted only below this, i.e. with strictly less than half its quota used.
pub(super) const EVICTABLE_BELOW: u8 = 63;
/// A search for light keys keeps at most one in this many of the shard's
/// keys: a full-shard walk pays for that many evictions.
const LIGHT_BATCH: usize = 16;

#[derive(Debug, Clone)]
pub(super) struct ShardEntry {
    pub(super) state: State,
    /// The fingerprint of the shape the state was built under; 0 = loaded
    /// without one (kept). A fingerprint, not the shape: at a million keys
    /// every byte of an entry is a megabyte.
    pub(super) shape: u32,
    /// From when the state is at rest (and can be forgotten).
    pub(super) rests_at: Nanos,
    /// Its limiter, an index into [`Shard::limiters`]. Fits beside the
    /// flags: the entry stays 40 bytes.
    limiter: u16,
    pub(super) changed: bool,
    /// Two facts in one byte, so the entry stays 40 bytes: its weight (low 7
    /// bits, see [`weight`]) and [`PINNED`], set while it is placed for a
    /// check not recorded yet (a room-making run for another limiter of the
    /// same request must not take it away).
    standing: u8,
}

impl ShardEntry {
    fn pinned(&self) -> bool {
        self.standing & PINNED != 0
    }

    /// Whether forgetting it while live is allowed: not pinned, under half its quota used.
    fn light(&self) -> bool {
        self.standing < EVICTABLE_BELOW
    }
}

/// How much of its quota a key had used at its last record, in 126ths
/// rounded down (so below [`EVICTABLE_BELOW`] exactly when strictly less
/// than half is used); [`LIMITED`] when nothing is left. Time only gives
/// quota back, so the weight recorded is never less than the key's weight now.
pub(super) fn weight(q: &Quota) -> u8 {
    if q.remaining == 0 || q.limit == 0 {
        return LIMITED;
    }
    let used = u128::from(q.limit.saturating_sub(q.remaining));
    (used * 126 / u128::from(q.limit)).min(126) as u8
}

/// State built under another shape (a reload changed the window or the
/// algorithm) no longer means anything: the limiter starts afresh for the key.
fn usable(e: &ShardEntry, algorithm: &Algorithm) -> bool {
    algorithm.fits(&e.state) && (e.shape == 0 || e.shape == algorithm.shape().fingerprint())
}

fn mark(e: &mut ShardEntry, key: &str, changed: &mut Vec<Box<str>>, track: bool) {
    if track && !e.changed {
        e.changed = true;
        changed.push(key.into());
    }
}

fn decide_entry(
    e: &mut ShardEntry,
    c: &Check<'_>,
    now: Nanos,
    changed: &mut Vec<Box<str>>,
    next_rest: &mut Nanos,
    track: bool,
) -> Outcome {
    let ruling = if usable(e, c.algorithm) {
        c.algorithm.check(&e.state, now)
    } else {
        c.algorithm.check(&c.algorithm.fresh_state(), now)
    };
    let admitted = !ruling.is_deny() || c.shadow;
    let (quota, mark) = record_entry(
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
        ruling,
        quota,
        at: now,
        mark,
        overflowed: false,
    }
}

#[allow(clippy::too_many_arguments)] // the split borrows of one shard
fn record_entry(
    e: &mut ShardEntry,
    key: &str,
    algorithm: &Algorithm,
    now: Nanos,
    admitted: bool,
    changed: &mut Vec<Box<str>>,
    next_rest: &mut Nanos,
    track: bool,
) -> (Quota, Nanos) {
    if !usable(e, algorithm) {
        e.state = algorithm.fresh_state();
    }
    e.shape = algorithm.shape().fingerprint();
    algorithm.record(&mut e.state, now, admitted);
    e.rests_at = algorithm.rests_at(&e.state);
    *next_rest = (*next_rest).min(e.rests_at);
    mark(e, key, changed, track);
    let quota = algorithm.quota(&e.state, now);
    e.standing = weight(&quota); // unpinned
    (quota, algorithm.mark(&e.state))
}

/// Notes what the writer may delete for an entry forgotten at rest.
fn note_forgotten(list: &mut Vec<Forgotten>, limiter: &str, e: &ShardEntry) {
    let rows = match e.state.kind().kept() {
        Kept::Never => return,
        // A window row is named by its start, the first word.
        Kept::Windows => Rows::Window(e.state.words()[0]),
        Kept::Words => Rows::ExpiredBy(e.rests_at),
    };
    note_rows(list, limiter, rows);
}

impl Shard {
    /// The index of `key`'s limiter in this shard, added if new.
    fn limiter_id(&mut self, key: &str) -> u16 {
        let name = crate::key::limiter_of(key);
        if let Some(i) = self.limiters.iter().position(|n| &**n == name) {
            return i as u16;
        }
        if self.limiters.len() > usize::from(u16::MAX) {
            // Only reloads that keep adding limiter names get here.
            self.forget_unused_limiters();
        }
        self.limiters.push(name.into());
        (self.limiters.len() - 1) as u16
    }

    fn forget_unused_limiters(&mut self) {
        let mut used = vec![false; self.limiters.len()];
        for e in self.map.values() {
            used[usize::from(e.limiter)] = true;
        }
        let mut new_id = vec![0u16; self.limiters.len()];
        let mut kept = Vec::new();
        for (i, name) in std::mem::take(&mut self.limiters).into_iter().enumerate() {
            if used[i] {
                new_id[i] = kept.len() as u16;
                kept.push(name);
            }
        }
        for e in self.map.values_mut() {
            e.limiter = new_id[usize::from(e.limiter)];
        }
        self.limiters = kept;
    }

    fn new_entry(&mut self, key: &str, algorithm: &Algorithm, pinned: bool) -> ShardEntry {
        ShardEntry {
            state: algorithm.fresh_state(),
            shape: algorithm.shape().fingerprint(),
            rests_at: 0,
            limiter: self.limiter_id(key),
            changed: false,
            standing: if pinned { PINNED } else { 0 },
        }
    }

    pub(super) fn pin(&mut self, h: KeyHash) -> bool {
        match self.map.get_mut(&h) {
            Some(e) => {
                e.standing |= PINNED;
                true
            }
            None => false,
        }
    }

    pub(super) fn insert_pinned(&mut self, h: KeyHash, key: &str, algorithm: &Algorithm) {
        let e = self.new_entry(key, algorithm, true);
        self.map.insert(h, e);
    }

    /// Takes back an entry placed for a request that ended up refused before
    /// anything was recorded on it: a refused request creates no key.
    pub(super) fn discard(&mut self, h: KeyHash) {
        self.map.remove(&h);
    }

    /// State read from the file at start, with its [`weight`].
    pub(super) fn load(
        &mut self,
        h: KeyHash,
        key: &str,
        (state, shape, rests_at): (State, u32, Nanos),
        weight: u8,
    ) {
        self.next_rest = self.next_rest.min(rests_at);
        let limiter = self.limiter_id(key);
        self.map.insert(
            h,
            ShardEntry {
                state,
                shape,
                rests_at,
                limiter,
                changed: false,
                standing: weight & !PINNED,
            },
        );
    }

    pub(super) fn quota(&self, h: KeyHash, algorithm: &Algorithm, now: Nanos) -> Quota {
        match self.map.get(&h) {
            Some(e) if usable(e, algorithm) => algorithm.quota(&e.state, now),
            _ => algorithm.quota(&algorithm.fresh_state(), now),
        }
    }

    pub(super) fn ruling(&self, h: KeyHash, algorithm: &Algorithm, now: Nanos) -> Ruling {
        match self.map.get(&h) {
            Some(e) if usable(e, algorithm) => algorithm.check(&e.state, now),
            _ => algorithm.check(&algorithm.fresh_state(), now),
        }
    }

    pub(super) fn record(
        &mut self,
        h: KeyHash,
        key: &str,
        algorithm: &Algorithm,
        now: Nanos,
        admitted: bool,
        track: bool,
    ) -> (Quota, Nanos) {
        if !self.map.contains_key(&h) {
            // Placed before; only a caller that skipped `place` gets here.
            let e = self.new_entry(key, algorithm, false);
            self.map.insert(h, e);
        }
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let e = map.get_mut(&h).expect("inserted above under the same lock");
        record_entry(e, key, algorithm, now, admitted, changed, next_rest, track)
    }

    /// One limiter alone on a key already here: one lookup, the common case.
    pub(super) fn decide_present(
        &mut self,
        c: &Check<'_>,
        h: KeyHash,
        now: Nanos,
        track: bool,
    ) -> Option<Outcome> {
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let e = map.get_mut(&h)?;
        Some(decide_entry(e, c, now, changed, next_rest, track))
    }

    /// One limiter alone on a key not here yet (room was made for it).
    pub(super) fn decide_new(
        &mut self,
        c: &Check<'_>,
        h: KeyHash,
        now: Nanos,
        track: bool,
    ) -> Outcome {
        let e = self.new_entry(c.key, c.algorithm, false);
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let e = map.entry(h).or_insert(e);
        decide_entry(e, c, now, changed, next_rest, track)
    }

    /// Whether `key` was here (and released). A slot is released under any
    /// shape the state fits, so a reload that changed the limit still frees it.
    pub(super) fn release(
        &mut self,
        h: KeyHash,
        key: &str,
        algorithm: &Algorithm,
        ticket: Nanos,
        now: Nanos,
        track: bool,
    ) -> bool {
        self.update(
            (h, key),
            algorithm,
            track,
            |e, a| a.fits(&e.state),
            |state| algorithm.release(state, ticket, now),
        )
    }

    /// A refund applies only to state built under the same shape.
    pub(super) fn refund(
        &mut self,
        h: KeyHash,
        key: &str,
        algorithm: &Algorithm,
        ticket: Ticket,
        now: Nanos,
        track: bool,
    ) {
        self.update((h, key), algorithm, track, usable, |state| {
            algorithm.refund(state, ticket, now)
        });
    }

    /// Applies `give` to the key's state when `accepts` it, and marks the key
    /// changed; returns whether the key was here.
    fn update(
        &mut self,
        (h, key): (KeyHash, &str),
        algorithm: &Algorithm,
        track: bool,
        accepts: impl FnOnce(&ShardEntry, &Algorithm) -> bool,
        give: impl FnOnce(&mut State),
    ) -> bool {
        let Shard {
            map,
            changed,
            next_rest,
            ..
        } = self;
        let Some(e) = map.get_mut(&h) else {
            return false;
        };
        if accepts(e, algorithm) {
            give(&mut e.state);
            e.rests_at = algorithm.rests_at(&e.state);
            *next_rest = (*next_rest).min(e.rests_at);
            mark(e, key, changed, track);
        }
        true
    }

    /// Marks `key` changed again (the writer could not save it, or the file
    /// needs it again); a key gone is queued as a deletion only with `gone_too`.
    /// Returns whether memory holds it.
    pub(super) fn requeue(&mut self, h: KeyHash, key: Box<str>, gone_too: bool) -> bool {
        let Shard { map, changed, .. } = self;
        match map.get_mut(&h) {
            Some(e) if e.changed => true,
            Some(e) => {
                e.changed = true;
                changed.push(key);
                true
            }
            None => {
                if gone_too {
                    changed.push(key);
                }
                false
            }
        }
    }

    /// Forgets `key` (admin reset); with `persist`, queues it for deletion from the file.
    pub(super) fn remove(&mut self, h: KeyHash, key: &str, persist: bool) -> bool {
        match self.map.get(&h) {
            Some(e) if !e.pinned() => {
                if persist && !e.changed {
                    // A key already queued is deleted when the writer finds it gone.
                    self.changed.push(key.into());
                }
                self.map.remove(&h);
                true
            }
            _ => false,
        }
    }

    /// Keys of the limiter `limiter` here.
    pub(super) fn count_of(&self, limiter: &str) -> usize {
        match self.limiters.iter().position(|n| &**n == limiter) {
            Some(id) => self
                .map
                .values()
                .filter(|e| usize::from(e.limiter) == id)
                .count(),
            None => 0,
        }
    }

    /// Forgets every entry at rest at `now`; returns how many. Skipped when
    /// nothing can rest yet, or a sweep ran less than `gap` ago. With
    /// `track`, notes the rows the writer may delete.
    pub(super) fn sweep(&mut self, now: Nanos, gap: Nanos, track: bool) -> usize {
        let recent = self.last_sweep.is_some_and(|t| now.saturating_sub(t) < gap);
        if now < self.next_rest || recent {
            return 0;
        }
        self.last_sweep = Some(now);
        let mut next_rest = Nanos::MAX;
        let Shard {
            map,
            limiters,
            forgotten,
            ..
        } = self;
        let before = map.len();
        map.retain(|_, e| {
            if e.pinned() {
                return true;
            }
            if e.rests_at > now {
                next_rest = next_rest.min(e.rests_at);
                return true;
            }
            if track && !e.changed {
                // A key already queued is deleted when the writer finds it gone.
                note_forgotten(forgotten, &limiters[usize::from(e.limiter)], e);
            }
            false
        });
        self.next_rest = next_rest;
        let removed = before - self.map.len();
        self.give_back();
        removed
    }

    /// Forgets the lightest live entry under half its quota (see [`weight`]),
    /// to make room for a new key when nothing rests; false when there is
    /// none. Candidates come from a search that keeps the lightest
    /// 1/[`LIGHT_BATCH`] of the shard, so a walk of the shard pays for that
    /// many evictions; a search that found less than a batch is not repeated
    /// within `gap`. Each candidate is checked again when its turn comes (a
    /// key that got heavier, or was pinned, stays). With `track`, notes the
    /// rows the writer must delete.
    pub(super) fn evict_lightest(&mut self, now: Nanos, gap: Nanos, track: bool) -> bool {
        loop {
            while let Some(h) = self.light.pop() {
                if !self.map.get(&h).is_some_and(ShardEntry::light) {
                    continue;
                }
                let e = self.map.remove(&h).expect("found just above");
                if track && !e.changed {
                    // A key already queued is deleted when the writer finds it gone.
                    note_forgotten(
                        &mut self.forgotten,
                        &self.limiters[usize::from(e.limiter)],
                        &e,
                    );
                }
                return true;
            }
            if !self.search_light(now, gap) {
                return false;
            }
        }
    }

    /// Fills [`Shard::light`] with the lightest evictable entries, the
    /// lightest last; false when it found none or searched too recently.
    fn search_light(&mut self, now: Nanos, gap: Nanos) -> bool {
        let wait = self
            .light_search
            .is_some_and(|(at, full)| !full && now.saturating_sub(at) < gap);
        if wait {
            return false;
        }
        let batch = (self.map.len() / LIGHT_BATCH).max(1);
        // Two walks, no sorting of the shard: count the evictable entries of
        // each weight, then take the lightest `batch` by those counts.
        let mut left = [0usize; EVICTABLE_BELOW as usize];
        for e in self.map.values().filter(|e| e.light()) {
            left[usize::from(e.standing)] += 1;
        }
        let mut wanted = batch;
        for n in left.iter_mut() {
            *n = (*n).min(wanted);
            wanted -= *n;
        }
        self.light_search = Some((now, wanted == 0));
        let mut found: Vec<(u8, KeyHash)> = Vec::with_capacity(batch - wanted);
        for (h, e) in self.map.iter().filter(|(_, e)| e.light()) {
            let n = &mut left[usize::from(e.standing)];
            if *n > 0 {
                *n -= 1;
                found.push((e.standing, *h));
            }
        }
        // Heaviest first: `pop` takes the lightest from the end.
        found.sort_unstable_by_key(|&(w, _)| std::cmp::Reverse(w));
        self.light.clear();
        self.light.extend(found.into_iter().map(|(_, h)| h));
        !self.light.is_empty()
    }

    /// Forgets what `doomed` names (given its limiter and when it rests), in
    /// memory only: expiry and removed limiters, which the writer prunes from
    /// the file on its own.
    pub(super) fn remove_where(&mut self, mut doomed: impl FnMut(&str, Nanos) -> bool) -> usize {
        let Shard { map, limiters, .. } = self;
        let before = map.len();
        map.retain(|_, e| e.pinned() || !doomed(&limiters[usize::from(e.limiter)], e.rests_at));
        let removed = before - self.map.len();
        self.give_back();
        removed
    }

    /// Gives memory back after a wave of one-off clients left.
    fn give_back(&mut self) {
        if self.map.capacity() > 64 && self.map.len() < self.map.capacity() / 4 {
            self.map.shrink_to(self.map.len() * 2);
        }
    }
}
