//! Validation of `limiters`: the algorithm and its parameters, the key, the mode, per-key overrides, and the `count:`/`ban:` hooks.

use std::collections::HashSet;

use super::{nanos, valid_name, Validator};
use crate::config::raw::{RawLimiter, Written};
use crate::config::{suggest, MAX_DURATION};
use crate::config::{KeyPart, LimiterConfig, OverrideConfig};
use crate::limiter::{Algorithm, AlgorithmKind, Given, Nanos, NANOS_PER_SEC};

impl Validator<'_> {
    pub(super) fn limiter(&mut self, name: &str, raw: &RawLimiter) -> Option<LimiterConfig> {
        let before = self.problems.len();
        if !valid_name(name) {
            self.err(
                format!("limiters.{name}"),
                "a limiter name uses only letters, digits, `_` and `-`",
            );
        }
        let kind = self.algorithm_kind(name, raw)?;
        let mut algorithm = self.algorithm(name, kind, raw);
        let key = self.key(name, raw);
        let shadow = self.shadow_mode(name, raw);
        self.overrides(name, raw, &algorithm);
        let reject = raw
            .reject
            .as_ref()
            .map(|r| self.reject(&format!("limiters.{name}.reject"), r));
        let count = self.count_of(name, raw, &mut algorithm);
        let ban = raw
            .ban
            .as_ref()
            .and_then(|b| self.ban_rule(name, b, &algorithm, shadow));
        let lease = raw
            .lease
            .as_ref()
            .and_then(|l| self.lease_rule(name, l, &algorithm, raw.count.is_some()));
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
            lease,
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

    /// `algorithm`, by name; a fixed window unless written.
    fn algorithm_kind(&mut self, name: &str, raw: &RawLimiter) -> Option<AlgorithmKind> {
        let written = raw
            .algorithm
            .as_ref()
            .map_or(AlgorithmKind::FixedWindow.name(), |t| t.0.as_str());
        let kind = AlgorithmKind::from_name(written);
        if kind.is_none() {
            self.err(
                format!("limiters.{name}.algorithm"),
                format!(
                    "unknown algorithm {written:?} ({}){}",
                    AlgorithmKind::choices(),
                    suggest::hint(written, AlgorithmKind::ALL.map(AlgorithmKind::name))
                ),
            );
        }
        kind
    }

    /// `mode`: whether the limiter only counts (`shadow`) or also refuses
    /// (`enforce`, the default); an unknown one is reported and enforced.
    fn shadow_mode(&mut self, name: &str, raw: &RawLimiter) -> bool {
        match raw.mode.as_ref().map(|t| t.0.as_str()).unwrap_or("enforce") {
            "enforce" => false,
            "shadow" => true,
            other => {
                self.err(
                    format!("limiters.{name}.mode"),
                    format!(
                        "unknown mode {other:?} (enforce or shadow){}",
                        suggest::hint(other, ["enforce", "shadow"])
                    ),
                );
                false
            }
        }
    }

    /// `count:`, validated; with it the algorithm keeps what refunds need.
    fn count_of(
        &mut self,
        name: &str,
        raw: &RawLimiter,
        algorithm: &mut Algorithm,
    ) -> Option<crate::limiter::count::CountRule> {
        let count = raw
            .count
            .as_ref()
            .and_then(|c| self.count_rule(name, c, algorithm))?;
        algorithm.keep_refunds();
        Some(count)
    }

    /// `overrides:`: each key once, each quota at least what the algorithm's own may be.
    fn overrides(&mut self, name: &str, raw: &RawLimiter, algorithm: &Algorithm) {
        let mut seen = HashSet::new();
        for (i, o) in raw.overrides.iter().enumerate() {
            if !seen.insert(&o.key.0) {
                self.err(
                    format!("limiters.{name}.overrides[{i}].key"),
                    "this key already has an override",
                );
            }
            let least = algorithm.kind().least_limit();
            if o.limit < least {
                self.err(
                    format!("limiters.{name}.overrides[{i}].limit"),
                    format!("must be at least {least}"),
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

    /// Exactly the parameters `kind` takes, all of them needed; one of
    /// another algorithm is an error, because a stray `limit` on a token
    /// bucket would silently do nothing.
    fn algorithm_fields(&mut self, name: &str, kind: AlgorithmKind, raw: &RawLimiter) {
        let algorithm_name = kind.name();
        for (field, _) in &raw.params {
            if !kind.takes(field) {
                self.err(
                    format!("limiters.{name}.{field}"),
                    format!("`{field}` does not apply to {algorithm_name}"),
                );
            }
        }
        for (field, _) in kind.params() {
            if raw.param(field).is_none() {
                self.err(
                    format!("limiters.{name}"),
                    format!("{algorithm_name} needs `{field}`"),
                );
            }
        }
    }

    /// The algorithm and its parameters: exactly the fields `kind` takes,
    /// each within the bounds its own file sets (see [`Given`]).
    fn algorithm(&mut self, name: &str, kind: AlgorithmKind, raw: &RawLimiter) -> Algorithm {
        self.algorithm_fields(name, kind, raw);
        kind.build(&mut FromRaw { v: self, name, raw })
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
            "asn" => KeyPart::Asn,
            "country" => KeyPart::Country,
            other => match other.strip_prefix("header:") {
                Some(h) => KeyPart::Header(self.header_name(path, h.trim())?),
                None => {
                    let parts = [
                        "client", "ip", "api_key", "route", "global", "pass", "asn", "country",
                        "header:",
                    ];
                    self.err(
                        path,
                        format!(
                            "unknown key {other:?} (client, ip, api_key, route, global, pass, asn, country or header:<Name>){}",
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

/// An algorithm's parameters as one limiter's YAML gives them. A missing
/// one was reported already ([`Validator::algorithm_fields`]): it reads as
/// the smallest value that lets the remaining checks run.
struct FromRaw<'v, 'a, 'r> {
    v: &'v mut Validator<'a>,
    name: &'r str,
    raw: &'r RawLimiter,
}

impl FromRaw<'_, '_, '_> {
    fn at(&self, field: &str) -> String {
        format!("limiters.{}.{field}", self.name)
    }
}

impl Given for FromRaw<'_, '_, '_> {
    fn number(&mut self, name: &'static str, least: u64) -> u64 {
        let n = match self.raw.param(name) {
            Some(Written::Count(n)) => n,
            Some(Written::Span(_) | Written::PerSecond(_)) | None => least,
        };
        if n < least {
            self.v
                .err(self.at(name), format!("must be at least {least}"));
            return least;
        }
        n
    }

    fn span(&mut self, name: &'static str) -> Nanos {
        let written = match self.raw.param(name) {
            Some(Written::Span(d)) => nanos(d.0),
            Some(Written::Count(_) | Written::PerSecond(_)) | None => NANOS_PER_SEC,
        };
        if written == 0 {
            self.v.err(self.at(name), "must be greater than zero");
        }
        written.max(1)
    }

    fn rate(&mut self, name: &'static str, units: u64, within: &str) -> Nanos {
        let written = match self.raw.param(name) {
            Some(Written::PerSecond(r)) => Some(r),
            Some(Written::Count(_) | Written::Span(_)) | None => None,
        };
        let at = self.at(name);
        self.v.rate(&at, written, units, within)
    }

    fn refuse(&mut self, name: &'static str, why: String) {
        self.v.err(self.at(name), why);
    }
}
