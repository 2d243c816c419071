//! Rejection episodes: one INFO line when a limiter starts rejecting and one when it stops.
//!
//! A 429 per line would flood the log under attack (the access log has
//! those); these two lines tell an operator *when* a limit began to bite and
//! how long and how hard, at a rate of at most two lines per quiet period.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::limiter::{Nanos, NANOS_PER_SEC};

/// A limiter that rejected nothing for this long has stopped rejecting.
pub const QUIET: Nanos = 10 * NANOS_PER_SEC;

#[derive(Debug, Default)]
pub struct Episode {
    rejecting: AtomicBool,
    started: AtomicU64,
    last: AtomicU64,
    rejections: AtomicU64,
}

impl Episode {
    /// A rejection by `limiter` of `key` (display form) at `now`.
    pub fn rejected(&self, limiter: &str, key: &str, now: Nanos) {
        self.last.store(now, Ordering::Relaxed);
        self.rejections.fetch_add(1, Ordering::Relaxed);
        if !self.rejecting.load(Ordering::Relaxed) && !self.rejecting.swap(true, Ordering::AcqRel) {
            self.started.store(now, Ordering::Relaxed);
            tracing::info!(limiter, first_key = key, "limiter started rejecting");
        }
    }
}

#[derive(Debug, Default)]
pub struct Episodes(Mutex<BTreeMap<String, Arc<Episode>>>);

impl Episodes {
    /// The episode state of `limiter`, shared across reloads.
    pub fn of(&self, limiter: &str) -> Arc<Episode> {
        self.0
            .lock()
            .entry(limiter.to_string())
            .or_default()
            .clone()
    }

    /// Ends (and logs) every episode with no rejection in the last [`QUIET`];
    /// returns the limiters whose episode ended.
    pub fn end_quiet(&self, now: Nanos) -> Vec<String> {
        let mut ended = Vec::new();
        for (name, e) in self.0.lock().iter() {
            let last = e.last.load(Ordering::Relaxed);
            if e.rejecting.load(Ordering::Relaxed)
                && now.saturating_sub(last) >= QUIET
                && e.rejecting.swap(false, Ordering::AcqRel)
            {
                let started = e.started.load(Ordering::Relaxed);
                let rejections = e.rejections.swap(0, Ordering::Relaxed);
                let seconds = last.saturating_sub(started) / NANOS_PER_SEC;
                tracing::info!(
                    limiter = %name,
                    rejections,
                    seconds,
                    "limiter stopped rejecting"
                );
                ended.push(name.clone());
            }
        }
        ended
    }

    /// Limiters rejecting now (for the dashboard).
    pub fn rejecting(&self) -> Vec<String> {
        self.0
            .lock()
            .iter()
            .filter(|(_, e)| e.rejecting.load(Ordering::Relaxed))
            .map(|(n, _)| n.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_ends_only_after_a_quiet_period() {
        let eps = Episodes::default();
        let e = eps.of("strict");
        e.rejected("strict", "ip:203.0.113.9", 100 * NANOS_PER_SEC);
        e.rejected("strict", "ip:203.0.113.9", 105 * NANOS_PER_SEC);
        assert_eq!(eps.rejecting(), vec!["strict".to_string()]);
        assert!(eps.end_quiet(114 * NANOS_PER_SEC).is_empty());
        assert_eq!(
            eps.end_quiet(115 * NANOS_PER_SEC),
            vec!["strict".to_string()]
        );
        assert!(eps.rejecting().is_empty());
        assert!(eps.end_quiet(200 * NANOS_PER_SEC).is_empty(), "logged once");
    }
}
