//! Validation of a limiter's `count:` and `ban:` (raw YAML → [`CountRule`], [`BanRule`]); pure, every problem with its path.

use http::{HeaderName, StatusCode};
use serde::Deserialize;

use super::{nanos, Dur, Text, Validator};
use crate::limiter::ban::BanRule;
use crate::limiter::count::CountRule;
use crate::limiter::{Algorithm, AlgorithmKind};

/// `count: { status: [401, 403], header: X-Login-Failed }` — at least one of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCount {
    pub status: Option<Statuses>,
    pub header: Option<Text>,
}

/// One status or a list of them.
#[derive(Debug, Clone)]
pub enum Statuses {
    One(u16),
    Many(Vec<u16>),
}

impl<'de> Deserialize<'de> for Statuses {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Not `#[serde(untagged)]`: its error names a Rust enum and loses the key's path.
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Statuses;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an HTTP status or a list of them, e.g. `status: [401, 403]`")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Statuses, E> {
                u16::try_from(n)
                    .map(Statuses::One)
                    .map_err(|_| E::custom(format!("{n} is not an HTTP status (100–599)")))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Statuses, A::Error> {
                let mut all = Vec::new();
                while let Some(s) = seq.next_element::<u16>()? {
                    all.push(s);
                }
                Ok(Statuses::Many(all))
            }
        }
        d.deserialize_any(Visitor)
    }
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

impl Validator<'_> {
    pub(super) fn count_rule(
        &mut self,
        name: &str,
        raw: &RawCount,
        algorithm: &Algorithm,
    ) -> Option<CountRule> {
        let at = |field: &str| format!("limiters.{name}.count{field}");
        let before = self.problems.len();
        if let Some(why) = algorithm.kind().count_refusal() {
            self.err(
                at(""),
                format!(
                    "`count` needs an algorithm that counts requests ({}); {} {why}",
                    AlgorithmKind::counting(),
                    algorithm.name(),
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
                format!(
                    "`ban` counts rejections within the limiter's window, and {} has none",
                    algorithm.name()
                ),
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
                self.err(
                    at(""),
                    "`ban` needs `after`: how many rejections start a ban",
                );
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

#[cfg(test)]
mod tests {
    use crate::config::parse;
    use crate::limiter::NANOS_PER_SEC as S;
    use http::StatusCode;

    fn errors(yaml: &str) -> String {
        parse(yaml).expect_err("must be rejected").to_string()
    }

    #[test]
    fn a_failed_login_limiter_with_count_and_ban_is_accepted() {
        let c = parse(
            "limiters:\n  failed_logins:\n    limit: 5\n    window: 15m\n    key: ip\n    count: { status: [403, 401, 401], header: X-Login-Failed }\n    ban: { after: 3, for: 1h, status: 403 }\n",
        )
        .unwrap();
        let l = &c.limiters[0];
        let count = l.count.as_ref().unwrap();
        assert_eq!(count.status, vec![401, 403], "sorted and deduplicated");
        assert_eq!(count.header.as_ref().unwrap().as_str(), "x-login-failed");
        let ban = l.ban.as_ref().unwrap();
        assert_eq!((ban.after, ban.duration), (3, 3600 * S));
        assert_eq!(ban.status, StatusCode::FORBIDDEN);
        let single =
            parse("limiters:\n  l: { limit: 5, window: 1m, count: { status: 401 } }\n").unwrap();
        assert_eq!(single.limiters[0].count.as_ref().unwrap().status, vec![401]);
    }

    #[test]
    fn count_is_refused_where_it_makes_no_sense_with_the_reason() {
        let e = errors("limiters:\n  c: { algorithm: concurrency, max_in_flight: 2, count: { status: [401] } }\n");
        assert!(e.contains("limiters.c.count"), "{e}");
        assert!(e.contains("frees its slot"), "{e}");
        let e = errors("limiters:\n  q: { algorithm: leaky_bucket, capacity: 2, leak_per_second: 1, count: { status: [401] } }\n");
        assert!(e.contains("limiters.q.count"), "{e}");
        assert!(e.contains("delays requests"), "{e}");
    }

    #[test]
    fn every_mistake_in_count_and_ban_is_reported_with_its_path() {
        let e = errors(
            "limiters:\n  l:\n    limit: 5\n    window: 1m\n    count: { status: [401, 999], header: \"bad header\" }\n    ban: { after: 0, for: 0s, status: 404 }\n",
        );
        for needle in [
            "limiters.l.count.status[1]",
            "limiters.l.count.header",
            "limiters.l.ban.after",
            "limiters.l.ban.for",
            "limiters.l.ban.status",
        ] {
            assert!(e.contains(needle), "{needle} missing in {e}");
        }
        let e = errors("limiters:\n  l: { limit: 5, window: 1m, count: {} }\n");
        assert!(e.contains("say which responses count"), "{e}");
        let e = errors("limiters:\n  l: { limit: 5, window: 1m, ban: { after: 3 } }\n");
        assert!(e.contains("`ban` needs `for`"), "{e}");
        let e = errors(
            "limiters:\n  l: { limit: 5, window: 1m, ban: { after: 3, for: 1h, within: 1m } }\n",
        );
        assert!(e.contains("within"), "unknown keys are errors: {e}");
    }

    #[test]
    fn ban_is_refused_on_a_shadow_limiter_and_on_concurrency() {
        let e = errors(
            "limiters:\n  s: { limit: 5, window: 1m, mode: shadow, ban: { after: 3, for: 1h } }\n",
        );
        assert!(e.contains("limiters.s.ban") && e.contains("shadow"), "{e}");
        let e = errors("limiters:\n  c: { algorithm: concurrency, max_in_flight: 2, ban: { after: 3, for: 1h } }\n");
        assert!(
            e.contains("limiters.c.ban") && e.contains("concurrency"),
            "{e}"
        );
    }
}
