//! Validation of a limiter's `count:` and `ban:` (raw YAML → [`CountRule`], [`BanRule`]); pure, every problem with its path.

use http::{HeaderName, StatusCode};
use serde::Deserialize;

use super::{nanos, Dur, Text, Validator};
use crate::limiter::ban::BanRule;
use crate::limiter::count::CountRule;
use crate::limiter::Algorithm;

/// `count: { status: [401, 403], header: X-Login-Failed }` — at least one of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCount {
    pub status: Option<Statuses>,
    pub header: Option<Text>,
}

/// One status or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Statuses {
    One(u16),
    Many(Vec<u16>),
}

/// `ban: { after: 3, for: 1h, status: 429 }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBan {
    pub after: Option<u64>,
    #[serde(rename = "for")]
    pub duration: Option<Dur>,
    pub status: Option<u16>,
}

impl Validator {
    pub(super) fn count_rule(
        &mut self,
        name: &str,
        raw: &RawCount,
        algorithm: &Algorithm,
    ) -> Option<CountRule> {
        let at = |field: &str| format!("limiters.{name}.count{field}");
        let before = self.problems.len();
        if !algorithm.accepts_count() {
            self.err(
                at(""),
                format!(
                    "`count` needs an algorithm that counts requests (fixed_window, sliding_window or token_bucket); {} {}",
                    algorithm.name(),
                    if matches!(algorithm, Algorithm::Concurrency(_)) {
                        "frees its slot when any response ends, whatever it is"
                    } else {
                        "delays requests rather than counting them"
                    }
                ),
            );
        }
        let mut status: Vec<u16> = match &raw.status {
            None => Vec::new(),
            Some(Statuses::One(s)) => vec![*s],
            Some(Statuses::Many(v)) => v.clone(),
        };
        for (i, s) in status.iter().enumerate() {
            if !(100..=599).contains(s) {
                let path = match &raw.status {
                    Some(Statuses::Many(_)) => at(&format!(".status[{i}]")),
                    _ => at(".status"),
                };
                self.err(path, format!("{s} is not an HTTP status (100–599)"));
            }
        }
        status.sort_unstable();
        status.dedup();
        let header = match &raw.header {
            None => None,
            Some(Text(h)) => match HeaderName::from_bytes(h.trim().as_bytes()) {
                Ok(h) => Some(h),
                Err(_) => {
                    self.err(at(".header"), format!("{h:?} is not a header name"));
                    None
                }
            },
        };
        if status.is_empty() && raw.header.is_none() {
            self.err(
                at(""),
                "say which responses count: `status: [401, 403]` and/or `header: X-Login-Failed`",
            );
        }
        (self.problems.len() == before).then_some(CountRule { status, header })
    }

    pub(super) fn ban_rule(
        &mut self,
        name: &str,
        raw: &RawBan,
        algorithm: &Algorithm,
        shadow: bool,
    ) -> Option<BanRule> {
        let at = |field: &str| format!("limiters.{name}.ban{field}");
        let before = self.problems.len();
        if algorithm.ban_window().is_none() {
            self.err(
                at(""),
                "`ban` counts rejections within the limiter's window, and concurrency has none",
            );
        }
        if shadow {
            self.err(
                at(""),
                "a shadow limiter never refuses, so it cannot ban (remove `ban` or `mode: shadow`)",
            );
        }
        let after = match raw.after {
            None => {
                self.err(at(""), "`ban` needs `after`: how many rejections start a ban");
                1
            }
            Some(0) => {
                self.err(at(".after"), "must be at least 1");
                1
            }
            Some(n) => n,
        };
        let duration = match raw.duration {
            None => {
                self.err(at(""), "`ban` needs `for`: how long a ban lasts, e.g. 1h");
                0
            }
            Some(Dur(d)) if d.is_zero() => {
                self.err(at(".for"), "must be greater than zero");
                0
            }
            Some(Dur(d)) => nanos(d),
        };
        let status = match raw.status.unwrap_or(429) {
            429 => StatusCode::TOO_MANY_REQUESTS,
            403 => StatusCode::FORBIDDEN,
            other => {
                self.err(at(".status"), format!("{other}: a ban answers 429 or 403"));
                StatusCode::TOO_MANY_REQUESTS
            }
        };
        (self.problems.len() == before).then_some(BanRule {
            after,
            duration,
            status,
        })
    }
}
