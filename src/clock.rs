//! Time as the limiters see it: Unix time in nanoseconds, injected so tests never sleep.
//!
//! Unix time rather than `Instant`, because stored state must mean the same
//! to another process and after a restart.

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds: a timestamp since the Unix epoch, or a duration.
pub type Nanos = u64;
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since the Unix epoch.
    fn now(&self) -> Nanos;
}

pub type SharedClock = Arc<dyn Clock>;

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as Nanos)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn at(now: Nanos) -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicU64::new(now)))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_nanos() as Nanos, Ordering::SeqCst);
    }

    pub fn set(&self, now: Nanos) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::SeqCst)
    }
}

/// The last second ISO 8601's four-digit year can write: 9999-12-31T23:59:59Z.
const LAST_WRITABLE: u64 = 253_402_300_799;

/// Unix seconds as the 20 ASCII bytes of ISO 8601 UTC
/// (`2026-01-01T00:00:00Z`), the form the SQLite tables store; a later
/// instant is written as the last one the form can hold.
pub fn iso8601_bytes(unix_secs: u64) -> [u8; 20] {
    let at = UNIX_EPOCH + Duration::from_secs(unix_secs.min(LAST_WRITABLE));
    let mut out = [0u8; 20];
    // Exactly 20 bytes up to the clamp above, so the write cannot fall short.
    let _ = write!(&mut out[..], "{}", humantime::format_rfc3339_seconds(at));
    out
}

/// [`iso8601_bytes`] as a string.
pub fn iso8601(unix_secs: u64) -> String {
    iso8601_bytes(unix_secs)
        .iter()
        .map(|&b| char::from(b))
        .collect()
}

/// Parses what [`iso8601`] writes (and nothing longer: no fractions).
pub fn parse_iso8601(s: &str) -> Option<u64> {
    if s.len() != 20 {
        return None;
    }
    let at = humantime::parse_rfc3339(s).ok()?;
    at.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_matches_known_instants_and_round_trips() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(1_767_225_600), "2026-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        for t in [0, 1_767_225_660, 4_102_444_799, 951_868_799] {
            assert_eq!(parse_iso8601(&iso8601(t)), Some(t));
        }
        assert_eq!(parse_iso8601("2026-01-01 00:00:00"), None);
        assert_eq!(iso8601(u64::MAX), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let c = ManualClock::at(5);
        assert_eq!(c.now(), 5);
        c.advance(Duration::from_nanos(10));
        assert_eq!(c.now(), 15);
    }
}
