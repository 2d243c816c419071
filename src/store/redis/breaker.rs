//! A circuit breaker: after repeated store failures, stop paying the timeout on every request.
//!
//! Closed: every call goes to the store. After `threshold` consecutive
//! failures it opens: calls are refused at once (the caller applies
//! `on_error`) until a probe outside the request path succeeds and closes it
//! again. Requests never probe, so no request ever waits on a store that is
//! known to be down. State is a pair of atomics: the request path takes no lock.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    failures: AtomicU32,
    open: AtomicBool,
    /// When the last failure happened, in ms since `base`: probes wait `cool_down` after it.
    last_failure_ms: AtomicU64,
    base: Instant,
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Breaker {
        Breaker {
            threshold: threshold.max(1),
            cool_down,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            last_failure_ms: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    /// Whether a request may call the store now.
    pub fn allows(&self) -> bool {
        !self.open.load(Ordering::Relaxed)
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Whether an open breaker has cooled down enough for the next probe.
    pub fn probe_due(&self) -> bool {
        self.is_open()
            && self
                .elapsed_ms()
                .saturating_sub(self.last_failure_ms.load(Ordering::Relaxed))
                >= self.cool_down.as_millis() as u64
    }

    /// A call (or probe) succeeded. Returns true when this closed an open breaker.
    pub fn success(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        self.open.swap(false, Ordering::Relaxed)
    }

    /// A call (or probe) failed. Returns true when this opened the breaker.
    pub fn failure(&self) -> bool {
        self.last_failure_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
        let failures = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        failures >= self.threshold && !self.open.swap(true, Ordering::Relaxed)
    }

    /// Opens at once (start-up found the store down): no request pays the timeout first.
    pub fn trip(&self) -> bool {
        self.failures.store(self.threshold, Ordering::Relaxed);
        self.last_failure_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
        !self.open.swap(true, Ordering::Relaxed)
    }

    fn elapsed_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_consecutive_failures_and_a_success_resets_the_count() {
        let b = Breaker::new(3, Duration::from_secs(1));
        assert!(!b.failure());
        assert!(!b.failure());
        assert!(!b.success(), "a success of a closed breaker closes nothing");
        assert!(!b.failure());
        assert!(!b.failure());
        assert!(b.allows());
        assert!(b.failure(), "the third failure in a row opens it");
        assert!(!b.allows());
        assert!(!b.failure(), "already open");
    }

    #[test]
    fn a_successful_probe_closes_it() {
        let b = Breaker::new(1, Duration::ZERO);
        assert!(b.trip());
        assert!(b.probe_due());
        assert!(b.success());
        assert!(b.allows());
        assert!(!b.probe_due());
    }

    #[test]
    fn a_probe_is_not_due_before_the_cool_down() {
        let b = Breaker::new(1, Duration::from_secs(3600));
        b.failure();
        assert!(b.is_open());
        assert!(!b.probe_due());
    }
}
