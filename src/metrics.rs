//! Counters and gauges in the Prometheus text format.
//!
//! A counter is created once (when a snapshot is built) and its handle kept
//! by the route or limiter that bumps it, so the request path does one
//! relaxed atomic add and never looks anything up. Counters outlive reloads:
//! the registry hands out the same handle for the same name and labels.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub type Counter = Arc<AtomicU64>;

pub fn inc(c: &Counter) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(&'static str, String), Counter>>,
}

const HELP: &[(&str, &str)] = &[
    ("tollgate_requests_total", "Requests by route and decision (allowed, rejected, exempt, no_route, unauthorized, bad_request, store_error)."),
    ("tollgate_limiter_decisions_total", "Limiter verdicts by limiter and result (allowed, delayed, rejected, would_reject for shadow limiters, banned, not_counted for count: requests given back because their answer did not match or tollgate refused them)."),
    ("tollgate_bans_total", "Bans started, by limiter (ban: after N rejections within the window)."),
    ("tollgate_upstream_errors_total", "Failed forwards by upstream and kind (connect, timeout, body_too_large, other)."),
    ("tollgate_store_errors_total", "Store calls that failed, by backend and the on_error policy applied."),
    ("tollgate_store_fallback_total", "Requests decided by the on_error policy (allow, deny, local) because the store failed."),
    ("tollgate_config_reloads_total", "Config reloads by result (ok, error)."),
];

impl Metrics {
    /// The counter for `name` with `labels` (label values are escaped on output).
    pub fn counter(&self, name: &'static str, labels: &[(&str, &str)]) -> Counter {
        let mut key = String::new();
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                key.push(',');
            }
            let _ = write!(key, "{k}=\"{}\"", escape(v));
        }
        self.counters.lock().entry((name, key)).or_default().clone()
    }

    /// The text exposition, with `gauges` (name, help, value) appended.
    pub fn render(&self, gauges: &[(&str, &str, f64)]) -> String {
        let counters = self.counters.lock();
        let mut out = String::with_capacity(4096);
        let mut last = "";
        for ((name, labels), value) in counters.iter() {
            if *name != last {
                let help = HELP.iter().find(|(n, _)| n == name).map_or("", |(_, h)| h);
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
                last = name;
            }
            let v = value.load(Ordering::Relaxed);
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        out
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_and_labels_share_one_counter_across_snapshots() {
        let m = Metrics::default();
        let a = m.counter(
            "tollgate_requests_total",
            &[("route", "ping"), ("decision", "allowed")],
        );
        let b = m.counter(
            "tollgate_requests_total",
            &[("route", "ping"), ("decision", "allowed")],
        );
        inc(&a);
        inc(&b);
        let text = m.render(&[("tollgate_tracked_keys", "Keys.", 3.0)]);
        assert!(
            text.contains("tollgate_requests_total{route=\"ping\",decision=\"allowed\"} 2"),
            "{text}"
        );
        assert!(text.contains("# TYPE tollgate_requests_total counter"));
        assert!(text.contains("tollgate_tracked_keys 3"));
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::default();
        m.counter("tollgate_requests_total", &[("route", "a\"b")]);
        assert!(m.render(&[]).contains("route=\"a\\\"b\""));
    }
}
