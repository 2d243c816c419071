//! What the SQLite writer has not saved yet: retry backoff, the bound on unsaved keys, and the health the admin API reports.
//!
//! A failed flush (disk full, I/O error, another program holding the write
//! lock) never forgets what it was writing: the keys go back into the
//! table's changed set and the next flush, after a backoff, writes their
//! newest state. Counters stay exact in memory all along. What a dead disk
//! can make grow is bounded by [`MAX_UNSAVED_KEYS`]: beyond it the changes of
//! the excess keys are given up (each is saved again the next time it
//! changes), counted, logged and shown on `/readyz` and `/metrics`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::metrics::{inc, Counter, Metrics};

/// Keys whose newest change waits for a retry, at most. A key costs its name
/// (~50 bytes) in the retry list on top of its table entry.
pub const MAX_UNSAVED_KEYS: usize = 1_000_000;

/// The longest wait between two attempts on a failing disk.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// How long the writer waits after `failures` consecutive failed flushes:
/// the flush interval, doubled per failure, at most [`MAX_BACKOFF`] (or the
/// flush interval when that is longer).
pub fn backoff(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    let doubled = interval.saturating_mul(1u32 << failures.min(16));
    doubled.min(MAX_BACKOFF.max(interval))
}

/// The writer's counters as metrics; fresh handles until the app binds the registry's.
#[derive(Debug, Default)]
struct FlushCounters {
    /// Failed flushes (`tollgate_store_errors_total{backend="sqlite"}`).
    errors: Counter,
    /// Keys whose change was given up at the cap (`tollgate_store_unsaved_dropped_total`).
    dropped: Counter,
}

/// Shared between the writer thread (which updates it) and the admin API (which reads it).
#[derive(Debug)]
pub struct Durability {
    healthy: AtomicBool,
    unsaved: AtomicU64,
    at_cap: AtomicBool,
    counters: ArcSwap<FlushCounters>,
    last_error: Mutex<Option<String>>,
}

impl Default for Durability {
    fn default() -> Durability {
        Durability {
            healthy: AtomicBool::new(true),
            unsaved: AtomicU64::new(0),
            at_cap: AtomicBool::new(false),
            counters: ArcSwap::from_pointee(FlushCounters::default()),
            last_error: Mutex::new(None),
        }
    }
}

/// A point-in-time view for `/readyz` and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// The last flush succeeded.
    pub healthy: bool,
    /// Keys whose newest state is only in memory, waiting for a retry.
    pub unsaved_keys: u64,
    /// Keys given up at the cap since start (exact in memory, saved when they change again).
    pub unsaved_dropped_total: u64,
    /// The cap on unsaved keys was reached by the last failed flush.
    pub unsaved_cap_reached: bool,
    pub write_errors_total: u64,
    pub last_error: Option<String>,
}

impl Durability {
    pub fn new() -> Arc<Durability> {
        Arc::new(Durability::default())
    }

    /// Counts into the app's registry from now on (and carries over what was counted before).
    pub fn bind_metrics(&self, metrics: &Metrics) {
        let errors = metrics.counter(
            "tollgate_store_errors_total",
            &[("backend", "sqlite"), ("policy", "none")],
        );
        let dropped = metrics.counter("tollgate_store_unsaved_dropped_total", &[]);
        let old = self.counters.swap(Arc::new(FlushCounters {
            errors: errors.clone(),
            dropped: dropped.clone(),
        }));
        errors.fetch_add(old.errors.load(Ordering::Relaxed), Ordering::Relaxed);
        dropped.fetch_add(old.dropped.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// A flush wrote everything it took.
    pub fn saved(&self) {
        self.healthy.store(true, Ordering::Relaxed);
        self.unsaved.store(0, Ordering::Relaxed);
        self.at_cap.store(false, Ordering::Relaxed);
    }

    /// A flush failed; `requeued` keys wait for the retry, `dropped` were given up at the cap.
    pub fn failed(&self, error: &str, requeued: usize, dropped: usize) {
        self.healthy.store(false, Ordering::Relaxed);
        self.unsaved.store(requeued as u64, Ordering::Relaxed);
        self.at_cap.store(dropped > 0, Ordering::Relaxed);
        let counters = self.counters.load();
        inc(&counters.errors);
        counters
            .dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
        *self.last_error.lock() = Some(error.to_string());
    }

    pub fn status(&self) -> Status {
        let counters = self.counters.load();
        Status {
            healthy: self.healthy(),
            unsaved_keys: self.unsaved.load(Ordering::Relaxed),
            unsaved_dropped_total: counters.dropped.load(Ordering::Relaxed),
            unsaved_cap_reached: self.at_cap.load(Ordering::Relaxed),
            write_errors_total: counters.errors.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
        }
    }
}

/// What the last save before exit could not write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unsaved {
    pub keys: usize,
    pub audit_rows: usize,
    /// A few of the keys, for the log line.
    pub sample: Vec<String>,
}

impl Unsaved {
    pub fn is_empty(&self) -> bool {
        self.keys == 0 && self.audit_rows == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_flush_interval_up_to_the_cap() {
        let ms = Duration::from_millis;
        assert_eq!(backoff(ms(100), 0), ms(100));
        assert_eq!(backoff(ms(100), 1), ms(200));
        assert_eq!(backoff(ms(100), 3), ms(800));
        assert_eq!(backoff(ms(100), 10), MAX_BACKOFF);
        assert_eq!(backoff(ms(100), u32::MAX), MAX_BACKOFF);
        assert_eq!(
            backoff(Duration::from_secs(60), 4),
            Duration::from_secs(60),
            "never more often than the flush interval"
        );
    }

    #[test]
    fn counts_made_before_the_registry_was_bound_carry_over() {
        let d = Durability::default();
        d.failed("disk full", 3, 2);
        let metrics = Metrics::default();
        d.bind_metrics(&metrics);
        d.failed("disk full", 3, 0);
        let s = d.status();
        assert_eq!((s.write_errors_total, s.unsaved_dropped_total), (2, 2));
        let text = metrics.render(&[], None);
        assert!(
            text.contains("tollgate_store_errors_total{backend=\"sqlite\",policy=\"none\"} 2"),
            "{text}"
        );
        d.saved();
        assert!(d.status().healthy && d.status().unsaved_keys == 0);
    }
}
