//! Where limiter state lives: the atomic check-and-update of every limiter of one request.
//!
//! Every backend keeps exact live counters in the in-process [`memory::Table`];
//! the SQLite backend adds a writer thread that persists what changed in
//! batches, so the request path never waits on the disk. A clean shutdown
//! persists every count; a `kill -9` loses at most one `flush_interval`.

pub mod memory;
pub mod sqlite;

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{Backend, LimiterConfig, StoreConfig};
use crate::limiter::{Algorithm, Nanos, Quota, Verdict};

pub use sqlite::AuditRow;

/// One limiter of one request, as the store sees it.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// `<limiter name>:<key value>`, e.g. `strict:ip:203.0.113.9`.
    pub key: &'a str,
    pub algorithm: &'a Algorithm,
    /// Counts and reports, never blocks the request.
    pub shadow: bool,
}

/// What one limiter decided, and its quota after recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    pub quota: Quota,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the SQLite store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the {0} store backend is not available in this build")]
    Unsupported(&'static str),
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
}

pub struct Store {
    table: Arc<memory::Table>,
    sqlite: Option<sqlite::Sqlite>,
    backend: &'static str,
}

impl Store {
    /// Counters in memory only: lost on restart.
    pub fn memory() -> Store {
        Store {
            table: Arc::new(memory::Table::new(false)),
            sqlite: None,
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
            Backend::Memory => Ok(Store::memory()),
            Backend::Sqlite { path } => {
                let table = Arc::new(memory::Table::new(true));
                let sqlite = sqlite::Sqlite::open(
                    path,
                    table.clone(),
                    config.flush_interval,
                    limiters,
                    now,
                )?;
                Ok(Store {
                    table,
                    sqlite: Some(sqlite),
                    backend: "sqlite",
                })
            }
            Backend::Redis { .. } => Err(StoreError::Unsupported("redis")),
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
        Ok(self.table.check(checks, now))
    }

    /// The quota of one key now, without counting.
    pub fn peek(&self, key: &str, algorithm: &Algorithm, now: Nanos) -> Quota {
        self.table.peek(key, algorithm, now)
    }

    /// An admitted request finished, or left while it was still queued.
    pub fn release(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        self.table.release(key, algorithm, ticket, now);
    }

    /// Forgets these keys everywhere (admin `DELETE /status`); returns how many existed.
    pub fn reset(&self, keys: &[String]) -> usize {
        self.table.remove_where(|k, _| keys.iter().any(|x| x == k))
    }

    /// Drops expired state and the state of limiters that no longer exist.
    pub fn prune(
        &self,
        now: Nanos,
        limiters: &[LimiterConfig],
        audit_retention: Option<std::time::Duration>,
    ) -> usize {
        let live: std::collections::HashSet<&str> =
            limiters.iter().map(|l| l.name.as_str()).collect();
        let removed = self.table.remove_where(|key, expires_at| {
            let limiter = key.split(':').next().unwrap_or("");
            expires_at <= now || !live.contains(limiter)
        });
        if let Some(s) = &self.sqlite {
            s.prune(now, limiters, audit_retention);
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

    /// Whether the store answers: for SQLite, whether the last write succeeded.
    pub fn healthy(&self) -> bool {
        self.sqlite.as_ref().is_none_or(|s| s.healthy())
    }

    /// Waits until everything counted so far is on disk.
    pub fn flush(&self) -> Result<(), StoreError> {
        match &self.sqlite {
            Some(s) => s.flush(),
            None => Ok(()),
        }
    }

    /// Persists everything and stops the writer; later counts stay in memory only.
    pub fn shutdown(&self) {
        if let Some(s) = &self.sqlite {
            s.shutdown();
        }
    }

    pub fn tracked_keys(&self) -> usize {
        self.table.len()
    }

    pub fn table(&self) -> &memory::Table {
        &self.table
    }
}
