//! The SQLite backend: decides in the in-process table, persists through the writer thread.

use std::time::Duration;

use super::{AuditRow, Sqlite};
use crate::config::LimiterConfig;
use crate::limiter::Nanos;
use crate::store::backend::Backend;
use crate::store::{durability, StoreError};

/// The request path is the seam's local default; the hooks reach the writer.
impl Backend for Sqlite {
    fn label(&self) -> &'static str {
        "sqlite"
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

    /// Whether the last write succeeded.
    fn healthy(&self) -> bool {
        Sqlite::healthy(self)
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
        Err(StoreError::NotSaved {
            path: self.path().to_path_buf(),
            keys: unsaved.keys,
            audit_rows: unsaved.audit_rows,
        })
    }

    /// Counts write failures and given-up keys into the app's registry.
    fn bind_metrics(&self, metrics: &crate::metrics::Metrics) {
        Sqlite::durability(self).bind_metrics(metrics)
    }

    fn durability(&self) -> Option<durability::Status> {
        Some(Sqlite::durability(self).status())
    }
}
