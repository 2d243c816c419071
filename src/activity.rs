//! What the dashboard shows besides the counters: the keys limited lately, recent per-route rates, the last reload.
//!
//! Two bounded trackers, so the request path pays one call and nothing else:
//! - `LimitedKeys`: the keys rejected lately, fed on the rejection path only
//!   (one short lock, no allocation for a key already tracked). It holds at
//!   most [`LIMITED_KEYS_TRACKED`] keys; when full, a key idle for longer
//!   than [`LIMITED_NOW`] is replaced first, else the one with the fewest
//!   rejections, so a flood of one-off keys never pushes out a key that is
//!   being limited hard.
//! - `History`: every [`SAMPLE_EVERY`], the dashboard's sampler copies each
//!   route's request, rejection, response and 5xx counters here; rates are
//!   differences of consecutive samples, kept for [`HISTORY_SAMPLES`]
//!   samples (5 minutes).
//!
//! And the last reload: when it was tried and whether it applied, so the
//! page can say when a rejected edit was fixed.
//!
//! The app and the reloader record into it; the dashboard reads it. It knows neither.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::limiter::{Nanos, NANOS_PER_SEC};

/// At most this many limited keys are tracked (and a few dozen bytes each).
pub const LIMITED_KEYS_TRACKED: usize = 128;
/// At most this many are shown, most rejected first.
pub const LIMITED_KEYS_SHOWN: usize = 10;
/// A key counts as "limited now" while its last rejection is this recent.
pub const LIMITED_NOW: Nanos = 60 * NANOS_PER_SEC;
/// How often the route counters are sampled for the chart.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// How many samples are kept: 150 × 2 s = 5 minutes.
pub const HISTORY_SAMPLES: usize = 150;

/// What the dashboard tracks besides the counters the routes keep.
#[derive(Default)]
pub struct RouteActivity {
    limited: Mutex<LimitedKeys>,
    history: Mutex<History>,
    last_reload: Mutex<Option<LastReload>>,
}

/// One route's counters at one instant, as the sampler reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteCounts {
    /// Every decision.
    pub requests: u64,
    /// Refused by a limiter or a ban.
    pub rejections: u64,
    pub responses: u64,
    /// Responses with a 5xx status.
    pub server_errors: u64,
    /// Answered with the challenge page (`challenge:`).
    pub challenges: u64,
}

/// The last reload tried (admin call, file watch or SIGHUP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastReload {
    /// Unix seconds.
    pub at: u64,
    /// Whether it applied (else the previous config kept serving).
    pub ok: bool,
}

impl RouteActivity {
    /// One rejection of `key` (its display form) by `limiter` on `route`, at `now`.
    pub fn rejected(&self, key: &str, limiter: &str, route: &Arc<str>, now: Nanos) {
        self.limited.lock().record(key, limiter, route, now);
    }

    pub fn limited_keys_tracked(&self) -> usize {
        self.limited.lock().keys.len()
    }

    /// One sample of the route counters at `unix_ms`.
    pub fn record_sample(&self, unix_ms: u64, routes: Vec<(Arc<str>, RouteCounts)>) {
        self.history.lock().push(RouteSample { unix_ms, routes });
    }

    /// Per route in `names`: the sample times (ms), requests/s and
    /// rejections/s between them, and the share of 5xx responses over them.
    pub fn rates(&self, names: &[Arc<str>]) -> (Vec<u64>, Vec<Value>) {
        self.history.lock().rates(names)
    }

    /// A reload was tried at `now`; `ok`: it applied.
    pub fn reloaded(&self, now: Nanos, ok: bool) {
        *self.last_reload.lock() = Some(LastReload {
            at: now / NANOS_PER_SEC,
            ok,
        });
    }

    pub fn last_reload(&self) -> Option<LastReload> {
        *self.last_reload.lock()
    }

    /// The keys rejected within [`LIMITED_NOW`] of `now`, most rejected first, as the dashboard shows them.
    pub fn limited_now(&self, now: Nanos) -> Vec<Value> {
        self.limited
            .lock()
            .now_limited(now)
            .into_iter()
            .map(|(key, e)| {
                json!({
                    "key": key,
                    "limiter": e.limiter,
                    "route": *e.route,
                    "rejections": e.rejections,
                    "since": e.since / NANOS_PER_SEC,
                    "last": e.last / NANOS_PER_SEC,
                })
            })
            .collect()
    }
}

/// One key that was rejected lately.
#[derive(Debug, Clone)]
struct Limited {
    limiter: String,
    route: Arc<str>,
    rejections: u64,
    /// The first rejection of this streak (a key idle for `LIMITED_NOW` starts a new one).
    since: Nanos,
    last: Nanos,
}

#[derive(Default)]
struct LimitedKeys {
    keys: HashMap<String, Limited>,
}

impl LimitedKeys {
    fn record(&mut self, key: &str, limiter: &str, route: &Arc<str>, now: Nanos) {
        if let Some(e) = self.keys.get_mut(key) {
            if now.saturating_sub(e.last) > LIMITED_NOW {
                e.rejections = 0;
                e.since = now;
            }
            e.rejections += 1;
            e.last = now;
            if e.limiter != limiter {
                e.limiter = limiter.to_string();
            }
            if !Arc::ptr_eq(&e.route, route) {
                e.route = route.clone();
            }
            return;
        }
        if self.keys.len() >= LIMITED_KEYS_TRACKED {
            // Idle keys first, then the least rejected: a heavy hitter stays.
            let victim = self
                .keys
                .iter()
                .min_by_key(|(_, e)| {
                    (
                        now.saturating_sub(e.last) <= LIMITED_NOW,
                        e.rejections,
                        e.last,
                    )
                })
                .map(|(k, _)| k.clone());
            if let Some(v) = victim {
                self.keys.remove(&v);
            }
        }
        self.keys.insert(
            key.to_string(),
            Limited {
                limiter: limiter.to_string(),
                route: route.clone(),
                rejections: 1,
                since: now,
                last: now,
            },
        );
    }

    /// The keys rejected within `LIMITED_NOW`, most rejected first.
    fn now_limited(&self, now: Nanos) -> Vec<(&str, &Limited)> {
        let mut out: Vec<(&str, &Limited)> = self
            .keys
            .iter()
            .filter(|(_, e)| now.saturating_sub(e.last) <= LIMITED_NOW)
            .map(|(k, e)| (k.as_str(), e))
            .collect();
        out.sort_by(|a, b| b.1.rejections.cmp(&a.1.rejections).then(a.0.cmp(b.0)));
        out.truncate(LIMITED_KEYS_SHOWN);
        out
    }
}

/// Route counters at one instant.
struct RouteSample {
    unix_ms: u64,
    routes: Vec<(Arc<str>, RouteCounts)>,
}

#[derive(Default)]
struct History {
    samples: VecDeque<RouteSample>,
}

impl History {
    fn push(&mut self, sample: RouteSample) {
        if self.samples.len() == HISTORY_SAMPLES + 1 {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    /// Per route in `names`: requests/s and rejections/s between consecutive
    /// samples, and 5xx responses over all responses from the first sample to
    /// the last (`null` without responses).
    fn rates(&self, names: &[Arc<str>]) -> (Vec<u64>, Vec<Value>) {
        let times: Vec<u64> = self.samples.iter().skip(1).map(|s| s.unix_ms).collect();
        let routes = names
            .iter()
            .map(|name| {
                let find = |s: &RouteSample| s.routes.iter().find(|r| r.0 == *name).map(|r| r.1);
                let (mut requests, mut rejections) = (Vec::new(), Vec::new());
                let mut challenges = Vec::new();
                for (a, b) in self.samples.iter().zip(self.samples.iter().skip(1)) {
                    let secs = (b.unix_ms.saturating_sub(a.unix_ms) as f64 / 1000.0).max(0.001);
                    let (r, j, c) = match (find(a), find(b)) {
                        (Some(x), Some(y)) => (
                            y.requests.saturating_sub(x.requests) as f64 / secs,
                            y.rejections.saturating_sub(x.rejections) as f64 / secs,
                            y.challenges.saturating_sub(x.challenges) as f64 / secs,
                        ),
                        _ => (0.0, 0.0, 0.0),
                    };
                    requests.push(round2(r));
                    rejections.push(round2(j));
                    challenges.push(round2(c));
                }
                let first = self.samples.iter().find_map(find).unwrap_or_default();
                let last = self.samples.iter().rev().find_map(find).unwrap_or_default();
                let responses = last.responses.saturating_sub(first.responses);
                let errors = last.server_errors.saturating_sub(first.server_errors);
                let share = (responses > 0).then(|| round4(errors as f64 / responses as f64));
                json!({
                    "name": **name,
                    "requests_per_second": requests,
                    "rejections_per_second": rejections,
                    "challenges_per_second": challenges,
                    "server_error_share": share,
                })
            })
            .collect();
        (times, routes)
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;

    fn counts(requests: u64, rejections: u64, responses: u64, server_errors: u64) -> RouteCounts {
        RouteCounts {
            requests,
            rejections,
            responses,
            server_errors,
            challenges: 0,
        }
    }

    #[test]
    fn a_flood_of_one_off_keys_never_pushes_out_a_key_limited_hard() {
        let route: Arc<str> = Arc::from("login");
        let mut t = LimitedKeys::default();
        for i in 0..50 {
            t.record("ip:203.0.113.9", "strict", &route, i * S / 10);
        }
        for i in 0..10_000u64 {
            t.record(
                &format!("ip:10.0.{}.{}", i / 256, i % 256),
                "strict",
                &route,
                5 * S,
            );
        }
        assert!(t.keys.len() <= LIMITED_KEYS_TRACKED);
        let shown = t.now_limited(6 * S);
        assert_eq!(shown[0].0, "ip:203.0.113.9");
        assert_eq!(shown[0].1.rejections, 50);
        assert!(shown.len() <= LIMITED_KEYS_SHOWN);
    }

    #[test]
    fn a_key_idle_for_a_minute_is_no_longer_limited_and_starts_a_new_streak() {
        let route: Arc<str> = Arc::from("ping");
        let mut t = LimitedKeys::default();
        t.record("ip:1.2.3.4", "strict", &route, S);
        t.record("ip:1.2.3.4", "strict", &route, 2 * S);
        assert_eq!(t.now_limited(3 * S).len(), 1);
        assert!(t.now_limited(2 * S + LIMITED_NOW + 1).is_empty());
        t.record("ip:1.2.3.4", "strict", &route, 100 * S);
        let shown = t.now_limited(100 * S);
        assert_eq!((shown[0].1.rejections, shown[0].1.since), (1, 100 * S));
    }

    #[test]
    fn rates_are_differences_of_consecutive_samples_per_second() {
        let a: Arc<str> = Arc::from("a");
        let mut h = History::default();
        h.push(RouteSample {
            unix_ms: 0,
            routes: vec![(a.clone(), counts(10, 0, 10, 0))],
        });
        h.push(RouteSample {
            unix_ms: 2000,
            routes: vec![(a.clone(), counts(30, 4, 30, 3))],
        });
        h.push(RouteSample {
            unix_ms: 4000,
            routes: vec![],
        });
        let (times, routes) = h.rates(std::slice::from_ref(&a));
        assert_eq!(times, vec![2000, 4000]);
        assert_eq!(routes[0]["requests_per_second"], json!([10.0, 0.0]));
        assert_eq!(routes[0]["rejections_per_second"], json!([2.0, 0.0]));
        assert_eq!(
            routes[0]["server_error_share"],
            json!(0.15),
            "3 of 20 responses"
        );
        for i in 0..(2 * HISTORY_SAMPLES as u64) {
            h.push(RouteSample {
                unix_ms: i,
                routes: vec![],
            });
        }
        assert_eq!(h.samples.len(), HISTORY_SAMPLES + 1);
    }
}
