//! Validation of `limiters`: the algorithm and its parameters, the key, the mode, per-key overrides, and the `count:`/`ban:` hooks.

use std::collections::HashSet;
use std::time::Duration;

use super::{nanos, valid_name, Validator};
use crate::config::raw::RawLimiter;
use crate::config::{suggest, MAX_DURATION};
use crate::config::{KeyPart, LimiterConfig, OverrideConfig, MAX_SLIDING_WINDOW_LIMIT};
use crate::limiter::{
    concurrency::Concurrency, fixed_window::FixedWindow, leaky_bucket::LeakyBucket,
    sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm, Kind, Nanos,
    NANOS_PER_SEC,
};

impl Validator<'_> {
    pub(super) fn limiter(&mut self, name: &str, raw: &RawLimiter) -> Option<LimiterConfig> {
        let at = |field: &str| format!("limiters.{name}.{field}");
        let before = self.problems.len();
        if !valid_name(name) {
            self.err(
                format!("limiters.{name}"),
                "a limiter name uses only letters, digits, `_` and `-`",
            );
        }
        let written = raw
            .algorithm
            .as_ref()
            .map_or(Kind::FixedWindow.name(), |t| t.0.as_str());
        let Some(kind) = Kind::from_name(written) else {
            self.err(
                at("algorithm"),
                format!(
                    "unknown algorithm {written:?} ({}){}",
                    Kind::choices(),
                    suggest::hint(written, Kind::ALL.map(Kind::name))
                ),
            );
            return None;
        };
        let algorithm = self.algorithm(name, kind, raw);
        let key = self.key(name, raw);
        let shadow = match raw.mode.as_ref().map(|t| t.0.as_str()).unwrap_or("enforce") {
            "enforce" => false,
            "shadow" => true,
            other => {
                self.err(
                    at("mode"),
                    format!(
                        "unknown mode {other:?} (enforce or shadow){}",
                        suggest::hint(other, ["enforce", "shadow"])
                    ),
                );
                false
            }
        };
        self.overrides(name, raw, &algorithm);
        let reject = raw
            .reject
            .as_ref()
            .map(|r| self.reject(&format!("limiters.{name}.reject"), r));
        let count = raw
            .count
            .as_ref()
            .and_then(|c| self.count_rule(name, c, &algorithm));
        let ban = raw
            .ban
            .as_ref()
            .and_then(|b| self.ban_rule(name, b, &algorithm, shadow));
        if self.problems.len() > before {
            return None;
        }
        Some(LimiterConfig {
            reject,
            name: name.to_string(),
            algorithm,
            key,
            shadow,
            count,
            ban,
            overrides: raw
                .overrides
                .iter()
                .map(|o| OverrideConfig {
                    key: o.key.0.clone(),
                    limit: o.limit,
                })
                .collect(),
        })
    }

    /// `overrides:`: each key once, each quota at least 1 (a leaky bucket's may be 0: no queue).
    fn overrides(&mut self, name: &str, raw: &RawLimiter, algorithm: &Algorithm) {
        let mut seen = HashSet::new();
        for (i, o) in raw.overrides.iter().enumerate() {
            if !seen.insert(&o.key.0) {
                self.err(
                    format!("limiters.{name}.overrides[{i}].key"),
                    "this key already has an override",
                );
            }
            if o.limit == 0 && !matches!(algorithm, Algorithm::LeakyBucket(_)) {
                self.err(
                    format!("limiters.{name}.overrides[{i}].limit"),
                    "must be at least 1",
                );
            }
        }
    }

    /// `key:`, one part or a list (default `client`), each part once.
    fn key(&mut self, name: &str, raw: &RawLimiter) -> Vec<KeyPart> {
        let Some(k) = &raw.key else {
            return vec![KeyPart::Client];
        };
        let at = format!("limiters.{name}.key");
        let entries = k.entries(&at);
        if entries.is_empty() {
            self.err(at, "a key list needs at least one part");
        }
        let mut parts = Vec::new();
        for (path, s) in entries {
            if let Some(p) = self.key_part(&path, s) {
                if parts.contains(&p) {
                    self.err(path, format!("key part {s:?} is listed twice"));
                }
                parts.push(p);
            }
        }
        parts
    }

    /// Which fields each algorithm takes, all of them needed; anything else
    /// set is an error, because a stray `limit` on a token bucket would
    /// silently do nothing.
    fn algorithm_fields(&mut self, name: &str, kind: Kind, raw: &RawLimiter) {
        let fields: &[&str] = match kind {
            Kind::FixedWindow | Kind::SlidingWindow => &["limit", "window"],
            Kind::TokenBucket => &["capacity", "refill_per_second"],
            Kind::LeakyBucket => &["capacity", "leak_per_second"],
            Kind::Concurrency => &["max_in_flight"],
        };
        let present = [
            ("limit", raw.limit.is_some()),
            ("window", raw.window.is_some()),
            ("capacity", raw.capacity.is_some()),
            ("refill_per_second", raw.refill_per_second.is_some()),
            ("leak_per_second", raw.leak_per_second.is_some()),
            ("max_in_flight", raw.max_in_flight.is_some()),
        ];
        let algorithm_name = kind.name();
        for (field, is_set) in present {
            if is_set && !fields.contains(&field) {
                self.err(
                    format!("limiters.{name}.{field}"),
                    format!("`{field}` does not apply to {algorithm_name}"),
                );
            }
            if !is_set && fields.contains(&field) {
                self.err(
                    format!("limiters.{name}"),
                    format!("{algorithm_name} needs `{field}`"),
                );
            }
        }
    }

    /// The algorithm and its parameters: exactly the fields `kind` takes,
    /// each within the bounds that let the limiter limit.
    fn algorithm(&mut self, name: &str, kind: Kind, raw: &RawLimiter) -> Algorithm {
        let at = |field: &str| format!("limiters.{name}.{field}");
        self.algorithm_fields(name, kind, raw);
        let positive = |v: &mut Self, field: &str, n: Option<u64>| -> u64 {
            let n = n.unwrap_or(1);
            if n == 0 {
                v.err(at(field), "must be at least 1");
            }
            n.max(1)
        };
        match kind {
            Kind::FixedWindow | Kind::SlidingWindow => {
                let limit = positive(self, "limit", raw.limit);
                let window = nanos(raw.window.map(|d| d.0).unwrap_or(Duration::from_secs(1)));
                if window == 0 {
                    self.err(at("window"), "must be greater than zero");
                }
                let window = window.max(1);
                if kind == Kind::FixedWindow {
                    return Algorithm::FixedWindow(FixedWindow { limit, window });
                }
                if limit > MAX_SLIDING_WINDOW_LIMIT {
                    self.err(
                        at("limit"),
                        format!("sliding_window keeps an exact log of 8 bytes per request; at most {MAX_SLIDING_WINDOW_LIMIT} (use token_bucket or fixed_window for higher rates)"),
                    );
                }
                Algorithm::SlidingWindow(SlidingWindow { limit, window })
            }
            Kind::TokenBucket => {
                let capacity = positive(self, "capacity", raw.capacity);
                Algorithm::TokenBucket(TokenBucket {
                    capacity,
                    interval: self.rate(
                        &at("refill_per_second"),
                        raw.refill_per_second,
                        capacity,
                        "a full bucket's tokens must come back",
                    ),
                })
            }
            Kind::LeakyBucket => {
                let capacity = raw.capacity.unwrap_or(0);
                Algorithm::LeakyBucket(LeakyBucket {
                    capacity,
                    interval: self.rate(
                        &at("leak_per_second"),
                        raw.leak_per_second,
                        capacity,
                        "a full queue must drain",
                    ),
                })
            }
            Kind::Concurrency => Algorithm::Concurrency(Concurrency {
                max_in_flight: positive(self, "max_in_flight", raw.max_in_flight),
            }),
        }
    }

    /// A rate per second as nanoseconds per unit. Too slow a rate cannot
    /// limit: a token bucket's `capacity` tokens must come back, and a leaky
    /// bucket's queue of `capacity` must drain, within [`MAX_DURATION`]
    /// (beyond it the arithmetic saturates and the bucket admits forever,
    /// or a queued request waits forever).
    fn rate(&mut self, path: &str, written: Option<f64>, capacity: u64, within: &str) -> Nanos {
        let r = written.unwrap_or(1.0);
        if !(r.is_finite() && r > 0.0 && r <= 1e9) {
            self.err(path, "must be a number greater than 0 and at most 1e9");
            return NANOS_PER_SEC;
        }
        // `as` saturates: 1e-300 becomes u64::MAX, refused just below.
        let interval = ((NANOS_PER_SEC as f64 / r).round() as Nanos).max(1);
        let units = capacity.max(1);
        if u128::from(interval) * u128::from(units) > MAX_DURATION.as_nanos() {
            self.err(
                path,
                format!(
                    "{r:e} per second is too slow to limit: with capacity {capacity}, {within} within 36500d (100 years), the longest time tollgate counts; the smallest value here is {}",
                    slowest_rate(units)
                ),
            );
        }
        interval
    }

    fn key_part(&mut self, path: &str, s: &str) -> Option<KeyPart> {
        Some(match s {
            "client" => KeyPart::Client,
            "ip" => KeyPart::Ip,
            "api_key" => KeyPart::ApiKey,
            "route" => KeyPart::Route,
            "global" => KeyPart::Global,
            "pass" => KeyPart::Pass,
            other => match other.strip_prefix("header:") {
                Some(h) => KeyPart::Header(self.header_name(path, h.trim())?),
                None => {
                    let parts = [
                        "client", "ip", "api_key", "route", "global", "pass", "header:",
                    ];
                    self.err(
                        path,
                        format!(
                            "unknown key {other:?} (client, ip, api_key, route, global, pass or header:<Name>){}",
                            suggest::hint(other, parts)
                        ),
                    );
                    return None;
                }
            },
        })
    }
}

/// The smallest rate per second at which `units` pass within
/// [`MAX_DURATION`], rounded up to three significant digits (so the value
/// the message names is itself accepted), e.g. `1.59e-9`.
fn slowest_rate(units: u64) -> String {
    let exact = units as f64 / MAX_DURATION.as_secs_f64();
    let scale = 10f64.powi(2 - exact.log10().floor() as i32);
    format!("{:.2e}", (exact * scale).ceil() / scale)
}
