//! The SQLite backend: decides in the in-process table, persists through the writer thread.

use std::time::Duration;

use super::{AuditRow, Sqlite};
use crate::config::store::{RawSqlite, Section};
use crate::config::{LimiterConfig, SqliteConfig};
use crate::limiter::Nanos;
use crate::store::backend::{Backend, BackendStatus, Local};
use crate::store::{StoreError, StoreFailure};

/// The request path is the seam's local default; the hooks reach the writer.
impl Backend for Sqlite {
    type Section = RawSqlite;
    /// The writer persists what changed in the table.
    const TRACKS_CHANGES: bool = true;

    fn open(
        config: &SqliteConfig,
        local: &Local,
        limiters: &[LimiterConfig],
        now: Nanos,
    ) -> Result<Sqlite, StoreError> {
        Sqlite::open(
            &config.path,
            local.table.clone(),
            local.bans.clone(),
            config.flush_interval,
            limiters,
            now,
        )
    }

    fn prune(&self, now: Nanos, limiters: &[LimiterConfig], retention: Option<Duration>) {
        Sqlite::prune(self, now, limiters, retention)
    }

    fn audit(&self, row: AuditRow) {
        Sqlite::audit(self, row)
    }

    fn audit_dropped(&self) -> u64 {
        Sqlite::audit_dropped(self)
    }

    /// Healthy while the last write succeeded; what waits for a failing disk.
    fn status(&self) -> BackendStatus {
        BackendStatus {
            healthy: Sqlite::healthy(self),
            durability: Some(Sqlite::durability(self).status()),
            ..BackendStatus::default()
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        Sqlite::flush(self)
    }

    /// Persists what the disk will take and stops the writer; later counts
    /// stay in memory only. Fails with what could not be saved.
    fn shutdown(&self) -> Result<(), StoreError> {
        let unsaved = Sqlite::shutdown(self);
        if unsaved.is_empty() {
            return Ok(());
        }
        Err(StoreError::new(
            StoreFailure::NotSaved,
            RawSqlite::NAME,
            format!(
                "the last save to the SQLite store {} failed: {} limiter key(s) and \
                 {} audit row(s) were not saved",
                self.path().display(),
                unsaved.keys,
                unsaved.audit_rows
            ),
        ))
    }

    /// Counts write failures and given-up keys into the app's registry.
    fn bind_metrics(&self, metrics: &crate::metrics::Metrics) {
        Sqlite::durability(self).bind_metrics(metrics)
    }
}
