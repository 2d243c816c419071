//! Bans and strikes per limiter key in every store: the in-process table, its SQLite table, its Redis keys.
//!
//! The arithmetic is [`crate::limiter::ban`]; this module keeps the state.
//! - Local stores (memory, SQLite) keep it in [`Bans`], a sharded table of
//!   its own beside the counters. SQLite persists bans (not strikes: a
//!   restart forgives a half-finished span of strikes, never a ban) in the
//!   `limiter_bans` table, written by the store's one writer thread in the
//!   same transaction as the counters, and loaded at start.
//! - Redis keeps one hash per banned or striking key, `<prefix>{<tag>}!ban:<store key>`
//!   (`!` never appears in a limiter name, so it cannot meet a counter key),
//!   fields `f` first strike, `n` strikes, `u` banned until (Redis ms), with a
//!   TTL of what still matters; `ban.lua` ([`super::redis::ban`]) strikes and reads atomically on the
//!   Redis clock, so the whole fleet shares a ban the moment it starts.
//!
//! Bound: strikes exist only for keys a limiter refused, and the table holds
//! at most [`MAX_ENTRIES`]; when full, expired entries are swept (at most
//! once a second), and if it is still full a new key's strike is not kept
//! (counted in `tollgate_ban_strikes_dropped_total`): existing bans and
//! strikes stay in force, and the limiter itself still refuses the key.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rusqlite::{params, Connection, Transaction};

use crate::clock::iso8601;
use crate::config::LimiterConfig;
use crate::limiter::ban::{BanRule, BanState};
use crate::limiter::{Nanos, NANOS_PER_SEC};

/// Keys with strikes or bans held at most, per process.
pub const MAX_ENTRIES: usize = 1_000_000;
const SHARDS: usize = 16;

/// A key is banned until `until` (Unix ns, on the store's clock); `remaining` from the store's now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Banned {
    pub until: Nanos,
    pub remaining: Nanos,
}

/// A ban in force, as `GET /bans` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveBan {
    /// The store key, `<limiter>:<key value>`.
    pub key: String,
    pub ban: Banned,
}

#[derive(Debug, Clone, Copy)]
struct BanEntry {
    state: BanState,
    /// The limiter's ban window, to know when the strikes expire.
    window: Nanos,
}

#[derive(Debug, Default)]
struct BanShard {
    map: HashMap<Box<str>, BanEntry>,
    /// Keys whose ban started or was lifted since the writer last looked.
    changed: Vec<Box<str>>,
}

/// One key's ban as the writer persists it; `None` = lifted.
pub type BanChange = (Box<str>, Option<Nanos>);

#[derive(Debug)]
pub struct Bans {
    shards: Box<[Mutex<BanShard>]>,
    track_changes: bool,
    /// Keys held at most ([`MAX_ENTRIES`] outside tests).
    max: usize,
    len: AtomicU64,
    dropped: AtomicU64,
    /// When a full table was last swept (Unix ns): at most once a second,
    /// so a flood of new keys against a full table costs no sweep each.
    last_full_sweep: AtomicU64,
}

fn shard_of(key: &str) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

impl Bans {
    pub fn new(track_changes: bool) -> Bans {
        Bans::with_max(track_changes, MAX_ENTRIES)
    }

    pub fn with_max(track_changes: bool, max: usize) -> Bans {
        Bans {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(BanShard::default()))
                .collect(),
            track_changes,
            max,
            len: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            last_full_sweep: AtomicU64::new(0),
        }
    }

    /// The ban on `key` at `now`, if any.
    pub fn banned(&self, key: &str, now: Nanos) -> Option<Banned> {
        let shard = self.shards[shard_of(key)].lock();
        let until = shard.map.get(key)?.state.banned(now)?;
        Some(Banned {
            until,
            remaining: until - now,
        })
    }

    /// Counts one rejection of `key`; returns the ban when this strike starts one.
    pub fn strike(&self, key: &str, rule: &BanRule, window: Nanos, now: Nanos) -> Option<Banned> {
        if self.len.load(Ordering::Relaxed) as usize >= self.max {
            let last = self.last_full_sweep.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= NANOS_PER_SEC
                && self
                    .last_full_sweep
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.sweep(now);
            }
        }
        let mut shard = self.shards[shard_of(key)].lock();
        let BanShard { map, changed } = &mut *shard;
        if !map.contains_key(key) {
            if self.len.load(Ordering::Relaxed) as usize >= self.max {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        let entry = map.entry(key.into()).or_insert(BanEntry {
            state: BanState::default(),
            window,
        });
        entry.window = window;
        let until = entry.state.strike(rule, window, now)?;
        if self.track_changes {
            changed.push(key.into());
        }
        Some(Banned {
            until,
            remaining: until - now,
        })
    }

    /// Puts a persisted ban in place (start-up), without marking it changed.
    pub fn load(&self, key: &str, until: Nanos) {
        let mut shard = self.shards[shard_of(key)].lock();
        let state = BanState {
            until,
            ..BanState::default()
        };
        if shard
            .map
            .insert(key.into(), BanEntry { state, window: 0 })
            .is_none()
        {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A ban seen elsewhere (Redis), remembered only for the active-bans gauge.
    pub fn note(&self, key: &str, until: Nanos) {
        if self.len.load(Ordering::Relaxed) as usize >= self.max {
            return;
        }
        self.load(key, until);
    }

    /// Lifts bans and forgets strikes of these keys (admin reset); returns how many it held.
    pub fn lift(&self, keys: &[String]) -> usize {
        let mut lifted = 0;
        for key in keys {
            let mut shard = self.shards[shard_of(key)].lock();
            let BanShard { map, changed } = &mut *shard;
            if let Some(e) = map.remove(key.as_str()) {
                self.len.fetch_sub(1, Ordering::Relaxed);
                lifted += 1;
                if self.track_changes && e.state.until > 0 {
                    changed.push(key.as_str().into());
                }
            }
        }
        lifted
    }

    /// Forgets what no longer matters: bans that ended and spans of strikes that passed.
    pub fn sweep(&self, now: Nanos) {
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let before = shard.map.len();
            shard.map.retain(|_, e| e.state.expires_at(e.window) > now);
            let gone = before - shard.map.len();
            self.len.fetch_sub(gone as u64, Ordering::Relaxed);
        }
    }

    /// Keys banned at `now`, for the active-bans gauge.
    pub fn active(&self, now: Nanos) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .map
                    .values()
                    .filter(|e| e.state.banned(now).is_some())
                    .count()
            })
            .sum()
    }

    /// Every key banned at `now`, in no order.
    pub fn list(&self, now: Nanos) -> Vec<ActiveBan> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            out.extend(shard.map.iter().filter_map(|(key, e)| {
                let until = e.state.banned(now)?;
                Some(ActiveBan {
                    key: key.to_string(),
                    ban: Banned {
                        until,
                        remaining: until - now,
                    },
                })
            }));
        }
        out
    }

    /// New keys whose strikes were not kept because the table was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Bans started or lifted since the last call, for the writer.
    pub fn take_changes(&self) -> Vec<BanChange> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            let BanShard { map, changed } = &mut *shard;
            for key in changed.drain(..) {
                let until = map.get(&key).map(|e| e.state.until).filter(|&u| u > 0);
                out.push((key, until));
            }
        }
        out
    }

    /// A write failed: these changes are handed to the next one again.
    pub fn restore(&self, changes: Vec<BanChange>) {
        for (key, _) in changes {
            self.shards[shard_of(&key)].lock().changed.push(key);
        }
    }
}

/// The SQLite table of bans; created beside the counter tables.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS limiter_bans (
    key       TEXT    NOT NULL PRIMARY KEY, -- <limiter>:<key value>, as the counters
    until     INTEGER NOT NULL,             -- Unix ns
    until_utc TEXT    NOT NULL              -- the same, ISO 8601 UTC, for people
);
";

/// Loads every ban still in force whose limiter still exists.
pub fn load(
    conn: &Connection,
    bans: &Bans,
    limiters: &[LimiterConfig],
    now: Nanos,
) -> rusqlite::Result<usize> {
    let mut stmt = conn.prepare("SELECT key, until FROM limiter_bans WHERE until > ?1")?;
    let mut rows = stmt.query([now as i64])?;
    let mut loaded = 0;
    while let Some(row) = rows.next()? {
        let key: String = row.get(0)?;
        let until: i64 = row.get(1)?;
        let limiter = crate::key::limiter_of(&key);
        if limiters.iter().any(|l| l.name == limiter) {
            bans.load(&key, until as Nanos);
            loaded += 1;
        }
    }
    Ok(loaded)
}

/// Writes started and lifted bans inside the writer's transaction.
pub fn write(tx: &Transaction<'_>, changes: &[BanChange]) -> rusqlite::Result<()> {
    let mut upsert = tx.prepare_cached(
        "INSERT INTO limiter_bans (key, until, until_utc) VALUES (?1, ?2, ?3)
         ON CONFLICT (key) DO UPDATE SET until = excluded.until, until_utc = excluded.until_utc",
    )?;
    let mut delete = tx.prepare_cached("DELETE FROM limiter_bans WHERE key = ?1")?;
    for (key, until) in changes {
        let key: &str = key;
        match until {
            Some(until) => {
                upsert.execute(params![
                    key,
                    *until as i64,
                    iso8601(until.div_ceil(NANOS_PER_SEC))
                ])?;
            }
            None => {
                delete.execute([key])?;
            }
        }
    }
    Ok(())
}

/// Deletes bans that ended.
pub fn prune(tx: &Transaction<'_>, now: Nanos) -> rusqlite::Result<()> {
    tx.execute("DELETE FROM limiter_bans WHERE until <= ?1", [now as i64])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    const T0: Nanos = 1_767_225_600 * NANOS_PER_SEC;

    fn once() -> BanRule {
        BanRule {
            after: 1,
            duration: 60 * NANOS_PER_SEC,
            status: StatusCode::TOO_MANY_REQUESTS,
        }
    }

    #[test]
    fn a_full_table_keeps_its_bans_drops_new_strikes_and_counts_them() {
        let bans = Bans::with_max(false, 3);
        let w = 10 * NANOS_PER_SEC;
        for k in ["l:a", "l:b", "l:c"] {
            assert!(bans.strike(k, &once(), w, T0).is_some());
        }
        assert!(bans.strike("l:d", &once(), w, T0).is_none());
        assert_eq!(bans.dropped(), 1);
        assert!(bans.banned("l:a", T0 + 1).is_some(), "existing bans stay");
        assert!(bans.banned("l:d", T0 + 1).is_none());
        // Once the bans have ended, a sweep makes room again.
        let later = T0 + 61 * NANOS_PER_SEC;
        assert!(bans.strike("l:d", &once(), w, later).is_some());
        assert_eq!(bans.active(later), 1);
    }

    #[test]
    fn a_started_ban_and_a_lift_are_handed_to_the_writer_and_a_failed_write_retries() {
        let bans = Bans::new(true);
        let w = 10 * NANOS_PER_SEC;
        bans.strike("l:a", &once(), w, T0);
        let changes = bans.take_changes();
        assert_eq!(changes, vec![("l:a".into(), Some(T0 + 60 * NANOS_PER_SEC))]);
        bans.restore(changes);
        assert_eq!(bans.take_changes().len(), 1, "handed over again");
        assert_eq!(bans.lift(&["l:a".to_string()]), 1);
        assert_eq!(bans.take_changes(), vec![("l:a".into(), None)]);
    }

    #[test]
    fn the_list_holds_bans_in_force_and_neither_strikes_nor_ended_bans() {
        let bans = Bans::new(false);
        let w = 10 * NANOS_PER_SEC;
        let twice = BanRule { after: 2, ..once() };
        bans.strike("l:banned", &once(), w, T0);
        bans.strike("l:struck", &twice, w, T0);
        let listed = bans.list(T0 + NANOS_PER_SEC);
        assert_eq!(
            listed,
            vec![ActiveBan {
                key: "l:banned".into(),
                ban: Banned {
                    until: T0 + 60 * NANOS_PER_SEC,
                    remaining: 59 * NANOS_PER_SEC,
                },
            }]
        );
        assert!(bans.list(T0 + 60 * NANOS_PER_SEC).is_empty());
    }
}
