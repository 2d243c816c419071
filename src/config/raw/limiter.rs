//! One limiter as written: the keys every limiter has, and its algorithm's parameters as that algorithm declares them.
//!
//! The parameters are not fields here: each algorithm's file lists its
//! own with how each is written ([`crate::limiter::Rule::PARAMS`]), and this
//! reader takes any of them by that declaration. A new algorithm with a new
//! parameter therefore changes nothing in this file or in validation.
//!
//! A key neither common nor any algorithm's parameter is refused once the
//! whole mapping is read (the algorithm may be written after it), naming
//! the keys the limiter's own algorithm takes.

use std::fmt;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::{Dur, OneOrMany, Text};
use crate::config::{observe, protect};
use crate::limiter::{AlgorithmKind, Measure};

#[derive(Debug, Clone, Default)]
pub struct RawLimiter {
    pub algorithm: Option<Text>,
    pub key: Option<OneOrMany>,
    pub mode: Option<Text>,
    pub overrides: Vec<RawOverride>,
    pub reject: Option<observe::RawReject>,
    /// Only responses that match are counted (see `limiter/count.rs`).
    pub count: Option<protect::RawCount>,
    /// Refuse a key outright after repeated rejections.
    pub ban: Option<protect::RawBan>,
    /// Reserve units from the Redis store and spend them without a call.
    pub lease: Option<crate::config::lease::RawLease>,
    /// The algorithm parameters written, in the order written, each read
    /// in the unit the algorithms declare for its name. Which of them the
    /// limiter's algorithm takes is validation's question.
    pub params: Vec<(&'static str, Written)>,
}

/// One algorithm parameter as written, by its declared [`Measure`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Written {
    Count(u64),
    Span(Dur),
    PerSecond(f64),
}

impl RawLimiter {
    /// The parameter `name`, if it is written.
    pub fn param(&self, name: &str) -> Option<Written> {
        self.params
            .iter()
            .find(|(p, _)| *p == name)
            .map(|(_, w)| *w)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverride {
    /// The key value this override applies to (an API key, an IP, a header value).
    pub key: Text,
    /// The quota for that key: limit, capacity or max_in_flight, by algorithm.
    pub limit: u64,
}

/// The keys every limiter takes besides its algorithm's parameters, in the
/// order a message lists them (`algorithm` first, the parameters after it).
const COMMON: [&str; 8] = [
    "algorithm",
    "key",
    "mode",
    "overrides",
    "reject",
    "count",
    "ban",
    "lease",
];

impl<'de> Deserialize<'de> for RawLimiter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(LimiterVisitor)
    }
}

struct LimiterVisitor;

impl<'de> Visitor<'de> for LimiterVisitor {
    type Value = RawLimiter;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        // The name serde's derive would give: `explain` turns it into YAML words.
        f.write_str("struct RawLimiter")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawLimiter, A::Error> {
        let mut raw = RawLimiter::default();
        let mut unknown: Option<String> = None;
        while let Some(name) = map.next_key::<String>()? {
            match name.as_str() {
                "algorithm" => raw.algorithm = Some(map.next_value()?),
                "key" => raw.key = Some(map.next_value()?),
                "mode" => raw.mode = Some(map.next_value()?),
                "overrides" => raw.overrides = map.next_value()?,
                "reject" => raw.reject = Some(map.next_value()?),
                "count" => raw.count = Some(map.next_value()?),
                "ban" => raw.ban = Some(map.next_value()?),
                "lease" => raw.lease = Some(map.next_value()?),
                other => match AlgorithmKind::param(other) {
                    Some((name, unit)) => {
                        let written = match unit {
                            Measure::Count => Written::Count(map.next_value()?),
                            Measure::Span => Written::Span(map.next_value()?),
                            Measure::PerSecond => Written::PerSecond(map.next_value()?),
                        };
                        raw.params.push((name, written));
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                        unknown.get_or_insert(name);
                    }
                },
            }
        }
        match unknown {
            Some(name) => Err(serde::de::Error::custom(unknown_key(&name, &raw))),
            None => Ok(raw),
        }
    }
}

/// serde's unknown-field message, with the keys of the limiter's own
/// algorithm and which algorithm that is (`explain` words it). An
/// algorithm no one knows lists every key; validation names the algorithm.
fn unknown_key(name: &str, raw: &RawLimiter) -> String {
    let written = raw
        .algorithm
        .as_ref()
        .map_or(AlgorithmKind::FixedWindow.name(), |t| t.0.as_str());
    let (kinds, owner) = match AlgorithmKind::from_name(written) {
        Some(kind) => (
            vec![kind],
            format!("; these are the keys of a {written} limiter"),
        ),
        None => (AlgorithmKind::ALL.to_vec(), String::new()),
    };
    let mut keys = vec![COMMON[0]];
    for (param, _) in kinds.iter().flat_map(|k| k.params()) {
        if !keys.contains(param) {
            keys.push(param);
        }
    }
    keys.extend(&COMMON[1..]);
    let list: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    format!(
        "unknown field `{name}`, expected one of {}{owner}",
        list.join(", ")
    )
}
