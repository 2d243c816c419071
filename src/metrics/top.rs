//! The keys being limited right now: a bounded Space-Saving table of rejections per (limiter, key).
//!
//! Only rejections touch it, so the allow path pays nothing. The table never
//! holds more than [`CAPACITY`] entries: a new key takes the place of the
//! least-rejected one and inherits its count (the Space-Saving rule), so a
//! flood of fresh keys cannot push out a key that is hammering a limit, and
//! any key with more than 1/CAPACITY of the rejections is always listed.

use parking_lot::Mutex;

use crate::limiter::Nanos;

pub const CAPACITY: usize = 64;

/// One limited key as the dashboard shows it (the display form: API keys shortened).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LimitedKey {
    pub limiter: String,
    pub key: String,
    /// Rejections counted for it; may overstate by at most `error`.
    pub rejections: u64,
    /// The count it inherited when it took a place (Space-Saving's error bound).
    pub error: u64,
    /// Unix time (ns) of its first and latest counted rejection.
    pub since: Nanos,
    pub last: Nanos,
}

#[derive(Debug, Default)]
pub struct TopKeys {
    entries: Mutex<Vec<LimitedKey>>,
}

impl TopKeys {
    pub fn record(&self, limiter: &str, key: &str, now: Nanos) {
        let mut entries = self.entries.lock();
        if let Some(e) = entries
            .iter_mut()
            .find(|e| e.key == key && e.limiter == limiter)
        {
            e.rejections += 1;
            e.last = now;
            return;
        }
        let fresh = |inherited: u64| LimitedKey {
            limiter: limiter.to_string(),
            key: key.to_string(),
            rejections: inherited + 1,
            error: inherited,
            since: now,
            last: now,
        };
        if entries.len() < CAPACITY {
            entries.push(fresh(0));
            return;
        }
        if let Some(min) = entries.iter_mut().min_by_key(|e| (e.rejections, e.last)) {
            *min = fresh(min.rejections);
        }
    }

    /// Up to `n` keys, most rejected first; only those rejected at or after `since`.
    pub fn top(&self, n: usize, since: Nanos) -> Vec<LimitedKey> {
        let mut out: Vec<LimitedKey> = self
            .entries
            .lock()
            .iter()
            .filter(|e| e.last >= since)
            .cloned()
            .collect();
        out.sort_by(|a, b| b.rejections.cmp(&a.rejections).then(b.last.cmp(&a.last)));
        out.truncate(n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_new_keys_never_pushes_out_the_key_hammering_a_limit() {
        let t = TopKeys::default();
        for i in 0..1_000u64 {
            t.record("login", "ip:203.0.113.9", i);
            t.record("login", &format!("ip:10.0.{}.{}", i / 256, i % 256), i);
        }
        let top = t.top(3, 0);
        assert_eq!(top[0].key, "ip:203.0.113.9");
        assert_eq!(top[0].rejections, 1_000);
        assert_eq!(t.entries.lock().len(), CAPACITY);
        assert!(t.top(10, 2_000).is_empty(), "nothing rejected since then");
    }
}
