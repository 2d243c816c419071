//! Time as the limiters see it: Unix time in nanoseconds, injected so tests never sleep.
//!
//! Unix time rather than `Instant`, because stored state must mean the same
//! to another process and after a restart.

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

/// Formats Unix seconds as ISO 8601 UTC (`2026-01-01T00:00:00Z`), the form the
/// SQLite tables store, without pulling in a calendar crate.
pub fn iso8601(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let rem = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses what [`iso8601`] writes.
pub fn parse_iso8601(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let days = days_from_civil(num(0..4)?, num(5..7)?, num(8..10)?);
    let secs = days * 86_400 + num(11..13)? * 3600 + num(14..16)? * 60 + num(17..19)?;
    u64::try_from(secs).ok()
}

// Howard Hinnant's civil calendar algorithms.
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
    }

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let c = ManualClock::at(5);
        assert_eq!(c.now(), 5);
        c.advance(Duration::from_nanos(10));
        assert_eq!(c.now(), 15);
    }
}
