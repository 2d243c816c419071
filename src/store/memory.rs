//! The in-process table of limiter state: exact counters, sharded, checked atomically per request.
//!
//! Every store keeps its live counters here: the memory backend alone, the
//! SQLite backend with a writer thread persisting what changed. All limiters
//! of one request are checked and recorded while holding the locks of the
//! shards their keys live in (taken in index order, so two requests never
//! deadlock), which is what makes "200 concurrent requests against a limit of
//! 50 admit exactly 50" hold. No lock is held across an `.await`.

use std::collections::hash_map::{DefaultHasher, Entry as MapEntry};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use parking_lot::{Mutex, MutexGuard};

use super::{Check, Outcome};
use crate::limiter::{Algorithm, Nanos, Quota, State, Verdict};

const SHARDS: usize = 64;

#[derive(Debug)]
pub struct Table {
    shards: Box<[Mutex<Shard>]>,
    /// Whether changed keys are remembered for a writer to persist.
    track_changes: bool,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Box<str>, Entry>,
    /// Keys changed or removed since the writer last looked.
    changed: Vec<Box<str>>,
}

#[derive(Debug, Clone)]
struct Entry {
    state: State,
    /// The fingerprint of the shape the state was built under; 0 = loaded
    /// without one (kept). A fingerprint, not the shape: at a million keys
    /// every byte of an entry is a megabyte.
    shape: u32,
    expires_at: Nanos,
    changed: bool,
}

/// One key's state as the writer persists it; `state: None` means deleted.
#[derive(Debug, Clone)]
pub struct Change {
    pub key: Box<str>,
    /// The state, its shape fingerprint and when it expires.
    pub state: Option<(State, u32, Nanos)>,
}

fn shard_of(key: &str) -> usize {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

impl Table {
    pub fn new(track_changes: bool) -> Table {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            track_changes,
        }
    }

    /// Checks every limiter of one request and records the result, atomically.
    pub fn check(&self, checks: &[Check<'_>], now: Nanos) -> Vec<Outcome> {
        if let [c] = checks {
            // The common route with one limiter: one lock, no bookkeeping.
            let mut shard = self.shards[shard_of(c.key)].lock();
            let verdict = match shard.map.get(c.key) {
                Some(e) if usable(e, c.algorithm) => c.algorithm.check(&e.state, now),
                _ => c.algorithm.check(&c.algorithm.fresh_state(), now),
            };
            let admitted = !verdict.is_deny() || c.shadow;
            let quota = shard.record(c.key, c.algorithm, now, admitted, self.track_changes);
            return vec![Outcome {
                verdict,
                quota,
                at: now,
            }];
        }
        let mut order: Vec<usize> = checks.iter().map(|c| shard_of(c.key)).collect();
        let shard_index = order.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).expect("locked above");

        let verdicts: Vec<Verdict> = checks
            .iter()
            .zip(&shard_index)
            .map(|(c, &s)| {
                let shard = &guards[guard_of(s)].1;
                match shard.map.get(c.key) {
                    Some(e) if usable(e, c.algorithm) => c.algorithm.check(&e.state, now),
                    _ => c.algorithm.check(&c.algorithm.fresh_state(), now),
                }
            })
            .collect();
        let admitted = !checks
            .iter()
            .zip(&verdicts)
            .any(|(c, v)| v.is_deny() && !c.shadow);

        let track = self.track_changes;
        checks
            .iter()
            .zip(&shard_index)
            .zip(verdicts)
            .map(|((c, &s), verdict)| {
                let shard = &mut *guards[guard_of(s)].1;
                let quota = shard.record(c.key, c.algorithm, now, admitted, track);
                Outcome {
                    verdict,
                    quota,
                    at: now,
                }
            })
            .collect()
    }

    /// The quota `key` has now, without counting anything.
    pub fn peek(&self, key: &str, algorithm: &Algorithm, now: Nanos) -> Quota {
        let shard = self.shards[shard_of(key)].lock();
        match shard.map.get(key) {
            Some(e) if usable(e, algorithm) => algorithm.quota(&e.state, now),
            _ => algorithm.quota(&algorithm.fresh_state(), now),
        }
    }

    /// An admitted request finished or left (see [`crate::limiter::Rule::release`]).
    pub fn release(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        let mut shard = self.shards[shard_of(key)].lock();
        let track = self.track_changes;
        let Shard { map, changed } = &mut *shard;
        if let Some(e) = map.get_mut(key) {
            if algorithm.fits(&e.state) {
                algorithm.release(&mut e.state, ticket, now);
                e.expires_at = algorithm.expires_at(&e.state);
                mark(e, key, changed, track);
            }
        }
    }

    /// `count:` — gives back the unit a request took (see [`Algorithm::refund`]).
    pub fn refund(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        let mut shard = self.shards[shard_of(key)].lock();
        let track = self.track_changes;
        let Shard { map, changed } = &mut *shard;
        if let Some(e) = map.get_mut(key) {
            if usable(e, algorithm) {
                algorithm.refund(&mut e.state, ticket, now);
                mark(e, key, changed, track);
            }
        }
    }

    /// Puts loaded state in place (start-up), without marking it changed.
    pub fn load(&self, key: &str, state: State, shape: u32, expires_at: Nanos) {
        let mut shard = self.shards[shard_of(key)].lock();
        shard.map.insert(
            key.into(),
            Entry {
                state,
                shape,
                expires_at,
                changed: false,
            },
        );
    }

    /// Forgets every key for which `doomed` says so; returns how many.
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
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let Shard { map, changed } = &mut *shard;
            map.retain(|k, e| {
                let gone = doomed(k, e.expires_at);
                if gone {
                    removed += 1;
                    if self.track_changes && persist {
                        changed.push(k.clone());
                    }
                }
                !gone
            });
            if map.capacity() > 64 && map.len() < map.capacity() / 4 {
                // Give memory back after a wave of one-off clients expired.
                map.shrink_to(map.len() * 2);
            }
        }
        removed
    }

    /// Takes what changed since the last call, for the writer to persist.
    pub fn take_changes(&self) -> Vec<Change> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let Shard { map, changed } = &mut *shard;
            for key in changed.drain(..) {
                let state = map.get_mut(&key).map(|e| {
                    e.changed = false;
                    (e.state.clone(), e.shape, e.expires_at)
                });
                out.push(Change { key, state });
            }
            if changed.capacity() > 1024 {
                changed.shrink_to(64);
            }
        }
        out
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live keys whose limiter is `limiter` (prefix `limiter:`), for tests and status.
    pub fn keys_of(&self, limiter: &str) -> HashSet<String> {
        let prefix = format!("{limiter}:");
        let mut out = HashSet::new();
        for shard in self.shards.iter() {
            for k in shard.lock().map.keys() {
                if k.starts_with(&prefix) {
                    out.insert(k.to_string());
                }
            }
        }
        out
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

impl Shard {
    fn record(
        &mut self,
        key: &str,
        algorithm: &Algorithm,
        now: Nanos,
        admitted: bool,
        track: bool,
    ) -> Quota {
        let Shard { map, changed } = self;
        let e = match map.get_mut(key) {
            Some(e) => e,
            None => match map.entry(key.into()) {
                MapEntry::Vacant(v) => v.insert(Entry {
                    state: algorithm.fresh_state(),
                    shape: algorithm.shape().fingerprint(),
                    expires_at: 0,
                    changed: false,
                }),
                MapEntry::Occupied(_) => unreachable!("looked up above under the same lock"),
            },
        };
        if !usable(e, algorithm) {
            e.state = algorithm.fresh_state();
        }
        e.shape = algorithm.shape().fingerprint();
        algorithm.record(&mut e.state, now, admitted);
        e.expires_at = algorithm.expires_at(&e.state);
        mark(e, key, changed, track);
        algorithm.quota(&e.state, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::fixed_window::FixedWindow;
    use crate::limiter::NANOS_PER_SEC as S;

    fn fixed(limit: u64) -> Algorithm {
        Algorithm::FixedWindow(FixedWindow {
            limit,
            window: 60 * S,
        })
    }

    #[test]
    fn a_denial_by_one_limiter_is_still_counted_by_a_fixed_window_beside_it() {
        let table = Table::new(false);
        let (strict, global) = (fixed(1), fixed(100));
        let now = 6_000 * S;
        let checks = |_: ()| {
            vec![
                Check {
                    key: "strict:ip:a",
                    algorithm: &strict,
                    shadow: false,
                },
                Check {
                    key: "global:ip:a",
                    algorithm: &global,
                    shadow: false,
                },
            ]
        };
        let first = table.check(&checks(()), now);
        assert!(first.iter().all(|o| o.verdict == Verdict::Allow));
        let second = table.check(&checks(()), now);
        assert!(second[0].verdict.is_deny());
        assert_eq!(
            second[1].quota.remaining, 98,
            "fixed windows count attempts"
        );
    }

    #[test]
    fn a_shadow_limiter_reports_a_denial_but_does_not_block() {
        let table = Table::new(false);
        let a = fixed(1);
        let now = 6_000 * S;
        let shadow = [Check {
            key: "s:ip:a",
            algorithm: &a,
            shadow: true,
        }];
        table.check(&shadow, now);
        let second = table.check(&shadow, now);
        assert!(second[0].verdict.is_deny());
        assert_eq!(second[0].quota.remaining, 0);
    }

    #[test]
    fn a_changed_window_starts_the_key_afresh_but_a_changed_limit_does_not() {
        let table = Table::new(false);
        let now = 6_000 * S;
        let five = fixed(5);
        for _ in 0..3 {
            table.check(
                &[Check {
                    key: "l:k",
                    algorithm: &five,
                    shadow: false,
                }],
                now,
            );
        }
        assert_eq!(table.peek("l:k", &fixed(2), now).remaining, 0);
        let longer = Algorithm::FixedWindow(FixedWindow {
            limit: 5,
            window: 120 * S,
        });
        assert_eq!(table.peek("l:k", &longer, now).remaining, 5);
    }

    #[test]
    fn changes_are_handed_to_the_writer_once() {
        let table = Table::new(true);
        let a = fixed(5);
        for _ in 0..3 {
            table.check(
                &[Check {
                    key: "l:k",
                    algorithm: &a,
                    shadow: false,
                }],
                60 * S,
            );
        }
        let changes = table.take_changes();
        assert_eq!(changes.len(), 1);
        assert!(table.take_changes().is_empty());
        table.remove_where(true, |_, _| true);
        let gone = table.take_changes();
        assert_eq!(gone.len(), 1);
        assert!(gone[0].state.is_none());
    }
}
