//! Where limiter state lives: the atomic check-and-update of every limiter of one request.
//!
//! Every local backend keeps exact live counters in the in-process [`memory::Table`];
//! the SQLite backend adds a writer thread that persists what changed in
//! batches, so the request path never waits on the disk. A clean shutdown
//! persists every count the disk will take (and says which it could not);
//! a `kill -9` loses at most one `flush_interval`; a failed write is retried
//! ([`durability`]); one process per file ([`lock`]).
//! The [`redis`] backend shares counters across a fleet; its table only
//! serves `on_error: local` while Redis is unreachable.

pub mod ban;
pub mod breaker;
pub mod durability;
pub mod lock;
pub mod memory;
pub mod redis;
pub mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{Backend, LimiterConfig, StoreConfig};
use crate::limiter::ban::BanRule;
use crate::limiter::{Algorithm, Nanos, Quota, Verdict};

pub use ban::Banned;

pub use sqlite::AuditRow;

/// One limiter of one request, as the store sees it.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// `<limiter name>:<key value>`, e.g. `strict:ip:203.0.113.9` (see [`crate::key`]).
    pub key: &'a str,
    /// The limiter's overflow key: where the check is counted when the key's
    /// share of `store.max_keys` is full of keys at or over half their quota
    /// (see [`memory`]).
    pub overflow: &'a str,
    pub algorithm: &'a Algorithm,
    /// Counts and reports, never blocks the request.
    pub shadow: bool,
}

/// What one limiter decided, and its quota after recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    pub quota: Quota,
    /// The instant (Unix ns) the store decided at, on its own clock: the
    /// proxy's for local stores, the Redis server's for Redis. Headers count
    /// from it, so every proxy of a fleet announces the same reset time.
    pub at: Nanos,
    /// Counted on [`Check::overflow`], not on its own key (the table was
    /// full): a release must name the overflow key.
    pub overflowed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the SQLite store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the SQLite store {path} is corrupt or not a tollgate database ({source}); \
         tollgate does not overwrite it: move it aside (e.g. `mv {path} {path}.bad`) \
         to start with empty counters, or restore a backup"
    )]
    Corrupt {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "another process is already using the SQLite store {path} (the file {file}, under this \
         or any other name: it holds the file's lock); one tollgate per file: give each instance \
         its own store.path, or share counters with backend: redis"
    )]
    InUse { path: PathBuf, file: PathBuf },
    #[error("cannot lock the SQLite store {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the last save to the SQLite store {path} failed: {keys} limiter key(s) and \
         {audit_rows} audit row(s) were not saved"
    )]
    NotSaved {
        path: PathBuf,
        keys: usize,
        audit_rows: usize,
    },
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    #[error("Redis failed: {0}")]
    Redis(#[source] ::redis::RedisError),
    #[error("Redis did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("Redis is skipped for a moment after repeated failures (circuit breaker open)")]
    CircuitOpen,
    #[error("a window or rate of {0} ns is too long for the Redis store (at most ~52 days)")]
    TooLong(Nanos),
    #[error("Redis answered with {0} values, not what the script returns")]
    BadReply(usize),
    #[error("the Redis store must be opened inside the async runtime")]
    NoRuntime,
}

pub struct Store {
    table: Arc<memory::Table>,
    sqlite: Option<sqlite::Sqlite>,
    redis: Option<self::redis::Redis>,
    /// Strikes and bans of local stores; for Redis only the bans this proxy saw (for the gauge).
    bans: Arc<ban::Bans>,
    backend: &'static str,
}

impl Store {
    /// Counters in memory only: lost on restart.
    pub fn memory() -> Store {
        Store::memory_bounded(memory::DEFAULT_MAX_KEYS)
    }

    fn memory_bounded(max_keys: usize) -> Store {
        Store {
            table: Arc::new(memory::Table::with_max_keys(false, max_keys)),
            sqlite: None,
            redis: None,
            bans: Arc::new(ban::Bans::new(false)),
            backend: "memory",
        }
    }

    /// Opens the configured backend and loads the live state it persisted.
    pub fn open(
        config: &StoreConfig,
        limiters: &[LimiterConfig],
        now: Nanos,
    ) -> Result<Store, StoreError> {
        match &config.backend {
            Backend::Memory => Ok(Store::memory_bounded(config.max_keys)),
            Backend::Sqlite { path } => {
                let table = Arc::new(memory::Table::with_max_keys(true, config.max_keys));
                let bans = Arc::new(ban::Bans::new(true));
                let sqlite = sqlite::Sqlite::open(
                    path,
                    table.clone(),
                    bans.clone(),
                    config.flush_interval,
                    limiters,
                    now,
                )?;
                Ok(Store {
                    table,
                    sqlite: Some(sqlite),
                    redis: None,
                    bans,
                    backend: "sqlite",
                })
            }
            Backend::Redis {
                url,
                prefix,
                timeout,
            } => Ok(Store {
                // Only `on_error: local` counts here; the fleet's counters
                // live in Redis, which expires them by TTL.
                table: Arc::new(memory::Table::with_max_keys(false, config.max_keys)),
                sqlite: None,
                redis: Some(self::redis::Redis::open(url, prefix, *timeout)?),
                bans: Arc::new(ban::Bans::new(false)),
                backend: "redis",
            }),
        }
    }

    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Checks and records every limiter of one request atomically.
    pub async fn check(
        &self,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<Vec<Outcome>, StoreError> {
        match &self.redis {
            Some(r) => r.check(checks, now).await,
            None => Ok(self.table.check(checks, now)),
        }
    }

    /// `on_error: local`: checks against this instance's own table while the
    /// shared store is unreachable, so limits still hold approximately.
    pub fn check_local(&self, checks: &[Check<'_>], now: Nanos) -> Vec<Outcome> {
        let outcomes = self.table.check(checks, now);
        if let Some(r) = &self.redis {
            r.note_local(checks, &outcomes, now);
        }
        outcomes
    }

    /// The quota of one key now, without counting.
    pub async fn peek(
        &self,
        key: &str,
        algorithm: &Algorithm,
        now: Nanos,
    ) -> Result<Quota, StoreError> {
        match &self.redis {
            Some(r) => r.peek(key, algorithm).await,
            None => Ok(self.table.peek(key, algorithm, now)),
        }
    }

    /// An admitted request finished, or left while it was still queued.
    /// Never waits: the Redis backend sends it from a spawned task.
    pub fn release(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        match &self.redis {
            Some(r) => r.release(&self.table, key, algorithm, ticket, now),
            None => self.table.release(key, algorithm, ticket, now),
        }
    }

    /// `count:` — the request recorded with `ticket` got an answer that does
    /// not count: gives its unit back (see `limiter/count.rs`).
    pub async fn refund(
        &self,
        key: &str,
        algorithm: &Algorithm,
        ticket: Nanos,
        now: Nanos,
    ) -> Result<(), StoreError> {
        match &self.redis {
            Some(r) => r.refund(key, algorithm, ticket).await,
            None => {
                self.table.refund(key, algorithm, ticket, now);
                Ok(())
            }
        }
    }

    /// The ban on each of these store keys at `now`, if any.
    pub async fn banned(
        &self,
        keys: &[&str],
        now: Nanos,
    ) -> Result<Vec<Option<Banned>>, StoreError> {
        match &self.redis {
            Some(r) => {
                let found = r.banned(keys).await?;
                for (k, b) in keys.iter().zip(&found) {
                    if let Some(b) = b {
                        self.bans.note(k, now + b.remaining);
                    }
                }
                Ok(found)
            }
            None => Ok(keys.iter().map(|k| self.bans.banned(k, now)).collect()),
        }
    }

    /// Counts one rejection of `key` by a limiter with `ban:`; returns the
    /// ban when this strike starts one. `window` is the span strikes count in.
    pub async fn strike(
        &self,
        key: &str,
        rule: &BanRule,
        window: Nanos,
        now: Nanos,
    ) -> Result<Option<Banned>, StoreError> {
        match &self.redis {
            Some(r) => {
                let started = r.strike(key, rule, window).await?;
                if let Some(b) = started {
                    self.bans.note(key, now + b.remaining);
                }
                Ok(started)
            }
            None => Ok(self.bans.strike(key, rule, window, now)),
        }
    }

    /// Keys banned now: exact for local stores; for Redis, the bans this proxy has seen.
    pub fn active_bans(&self, now: Nanos) -> usize {
        self.bans.active(now)
    }

    /// New keys whose strikes were not kept because the ban table was full.
    pub fn ban_strikes_dropped(&self) -> u64 {
        self.bans.dropped()
    }

    /// Forgets these keys everywhere, bans included (admin `DELETE /status`);
    /// returns how many counters and bans existed.
    pub async fn reset(&self, keys: &[String]) -> Result<usize, StoreError> {
        let local = self.table.remove_keys(keys);
        let lifted = self.bans.lift(keys);
        match &self.redis {
            Some(r) => {
                let mut all: Vec<String> = keys.to_vec();
                all.extend(keys.iter().map(|k| ban::redis_key(k)));
                r.reset(&all).await
            }
            None => Ok(local + lifted),
        }
    }

    /// Drops expired state and the state of limiters that no longer exist.
    pub fn prune(
        &self,
        now: Nanos,
        limiters: &[LimiterConfig],
        audit_retention: Option<std::time::Duration>,
    ) -> usize {
        // A fixed window at rest lingers one more window, as the file keeps
        // it: memory forgets it when the writer's prune deletes its row, so
        // the file never holds a key the table forgot without deleting it.
        let live: std::collections::HashMap<&str, Nanos> = limiters
            .iter()
            .map(|l| match &l.algorithm {
                Algorithm::FixedWindow(f) => (l.name.as_str(), f.window),
                _ => (l.name.as_str(), 0),
            })
            .collect();
        let removed = self.table.remove_where(|limiter, rests_at| {
            live.get(limiter)
                .is_none_or(|linger| rests_at.saturating_add(*linger) <= now)
        });
        self.bans.sweep(now);
        if let Some(s) = &self.sqlite {
            s.prune(now, limiters, audit_retention);
        }
        if let Some(r) = &self.redis {
            r.sweep(now);
        }
        removed
    }

    /// Records one forwarded request in the audit table (dropped, and counted, if the writer lags).
    pub fn audit(&self, row: AuditRow) {
        if let Some(s) = &self.sqlite {
            s.audit(row);
        }
    }

    pub fn audit_dropped(&self) -> u64 {
        self.sqlite.as_ref().map_or(0, |s| s.audit_dropped())
    }

    /// Whether the store answers: for SQLite, whether the last write
    /// succeeded; for Redis, whether its circuit breaker is closed.
    pub fn healthy(&self) -> bool {
        self.sqlite.as_ref().is_none_or(|s| s.healthy())
            && self.redis.as_ref().is_none_or(|r| r.healthy())
    }

    /// Waits until everything counted so far is on disk.
    pub fn flush(&self) -> Result<(), StoreError> {
        match &self.sqlite {
            Some(s) => s.flush(),
            None => Ok(()),
        }
    }

    /// Persists what the disk will take and stops the writer; later counts
    /// stay in memory only. Fails with what could not be saved; later calls
    /// give the same answer.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        let Some(s) = &self.sqlite else {
            return Ok(());
        };
        let unsaved = s.shutdown();
        if unsaved.is_empty() {
            return Ok(());
        }
        Err(StoreError::NotSaved {
            path: s.path().to_path_buf(),
            keys: unsaved.keys,
            audit_rows: unsaved.audit_rows,
        })
    }

    /// Counts SQLite write failures and given-up keys into the app's registry.
    pub fn bind_metrics(&self, metrics: &crate::metrics::Metrics) {
        if let Some(s) = &self.sqlite {
            s.durability().bind_metrics(metrics);
        }
    }

    /// For SQLite: what waits for a retry, and the last write error.
    pub fn durability(&self) -> Option<durability::Status> {
        self.sqlite.as_ref().map(|s| s.durability().status())
    }

    pub fn tracked_keys(&self) -> usize {
        self.table.len()
    }

    /// The bound on [`Store::tracked_keys`] (`store.max_keys`).
    pub fn max_keys(&self) -> usize {
        self.table.max_keys()
    }

    /// Evictions (at rest and live), overflow decisions and refusals of the bounded table.
    pub fn key_counters(&self) -> &memory::KeyCounters {
        self.table.counters()
    }

    pub fn table(&self) -> &memory::Table {
        &self.table
    }
}
