//! The values operators write in the YAML: `${ENV}` text, durations, sizes, one-or-many lists and the worker count, each read by its own serde visitor.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A string value in which `${ENV_VAR}` is replaced from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(TextVisitor)
    }
}

/// Reads a [`Text`]. A visitor rather than `String::deserialize` and a check
/// after it: an error raised while the reader is at the value (an unset
/// `${VAR}`) carries that value's path and line, not its mapping's.
struct TextVisitor;

impl serde::de::Visitor<'_> for TextVisitor {
    type Value = Text;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("text")
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Text, E> {
        expand_env(s, |name| std::env::var(name).ok())
            .map(Text)
            .map_err(E::custom)
    }
}

/// What opens and closes a `${NAME}`. Named, so no brace stands alone in
/// a literal of the function below (a line counter that matches braces
/// would read past its end).
const VAR_OPEN: &str = "${";
const VAR_CLOSE: char = '}';

/// Replaces every `${NAME}`; an unset variable is an error that names it.
pub fn expand_env(raw: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(start) = rest.find(VAR_OPEN) {
        out.push_str(&rest[..start]);
        let after = &rest[start + VAR_OPEN.len()..];
        let end = after
            .find(VAR_CLOSE)
            .ok_or_else(|| format!("unterminated `{VAR_OPEN}` in {raw:?}"))?;
        let name = &after[..end];
        if name.is_empty() {
            return Err(format!(
                "empty variable name `{VAR_OPEN}{VAR_CLOSE}` in {raw:?}"
            ));
        }
        let value =
            lookup(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A duration written as a whole number and one unit: `500ms`, `2s`, `1m`, `1h`, `7d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

/// The longest duration any key takes: 36500d (100 years). Times are kept
/// as 64-bit nanoseconds of Unix time, which end in 2554; a window or ban
/// this long still ends well before that, and a longer one would be
/// capped without a word.
pub const MAX_DURATION: Duration = Duration::from_secs(36_500 * 86_400);

/// How a duration is written, for messages.
const DURATION_SHAPE: &str =
    "a duration is a whole number and one of the units ms, s, m, h, d, e.g. `60s` or `1m`";

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a duration like `60s` or `1m` (a whole number and one unit: ms, s, m, h or d)",
                )
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dur, E> {
                let Text(s) = TextVisitor.visit_str(s)?;
                parse_duration(&s).map(Dur).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{n}` has no unit, write e.g. `{n}s`; {DURATION_SHAPE}"
                )))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{n}` is not a duration; {DURATION_SHAPE}"
                )))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Dur, E> {
                Err(E::custom(format!(
                    "`{n}` has a fraction and no unit; {DURATION_SHAPE}"
                )))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Reads a duration: a whole number directly followed by one of `ms s m h
/// d`, at most [`MAX_DURATION`]. Nothing else: `1M` (a month? a minute?),
/// `1y`, `1 minute` and `1.5m` are refused rather than guessed.
pub fn parse_duration(written: &str) -> Result<Duration, String> {
    let s = written.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let unit_nanos: Option<u128> = match unit {
        _ if digits.is_empty() => None,
        "ms" => Some(1_000_000),
        "s" => Some(1_000_000_000),
        "m" => Some(60_000_000_000),
        "h" => Some(3_600_000_000_000),
        "d" => Some(86_400_000_000_000),
        _ => None,
    };
    let Some(unit_nanos) = unit_nanos else {
        let why = if s.contains(char::is_whitespace) {
            "no space between the number and the unit".to_string()
        } else if unit.starts_with(['.', ',']) {
            "whole numbers only, so use a smaller unit (`90s`, not `1.5m`)".to_string()
        } else if digits.is_empty() {
            "it starts with no number".to_string()
        } else if unit.is_empty() {
            "it has no unit".to_string()
        } else if unit == "M" {
            "`M` is not a unit (minutes are `m`, and a month is written `30d`)".to_string()
        } else {
            format!("`{unit}` is not a unit")
        };
        return Err(format!("`{s}`: {why}; {DURATION_SHAPE}"));
    };
    let nanos = digits
        .parse::<u128>()
        .ok()
        .and_then(|n| n.checked_mul(unit_nanos))
        .filter(|&n| n <= MAX_DURATION.as_nanos())
        .ok_or_else(|| {
            format!(
                "`{s}` is longer than the longest duration tollgate supports, 36500d (100 years)"
            )
        })?;
    // At most MAX_DURATION, so it fits a u64 of nanoseconds.
    Ok(Duration::from_nanos(nanos as u64))
}

/// A size in bytes written as `10MiB`, `512KiB`, `1MB` or a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size like `10MiB`, `512KiB` or a number of bytes")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Size, E> {
                let Text(s) = TextVisitor.visit_str(s)?;
                parse_size(&s).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size {s:?} (write e.g. 10MiB, 512KiB, 1048576)"))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" | "kB" => 1000,
        "KiB" => 1 << 10,
        "MB" => 1000 * 1000,
        "MiB" => 1 << 20,
        "GB" => 1000 * 1000 * 1000,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// One value or a list of them (`listen: a` or `listen: [a, b]`).
#[derive(Debug, Clone)]
pub enum OneOrMany {
    One(Text),
    Many(Vec<Text>),
}

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Not `#[serde(untagged)]`: its error names a Rust enum and loses the key's path.
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("one value or a list of values, e.g. `ip` or `[ip, route]`")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<OneOrMany, E> {
                TextVisitor.visit_str(s).map(OneOrMany::One)
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<OneOrMany, E> {
                Ok(OneOrMany::One(Text(n.to_string())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<OneOrMany, A::Error> {
                let mut items = Vec::new();
                while let Some(t) = seq.next_element::<Text>()? {
                    items.push(t);
                }
                Ok(OneOrMany::Many(items))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl OneOrMany {
    /// Each value with its YAML path: `path` itself for a single value,
    /// `path[i]` for the entries of a list, so an error points at the entry.
    pub fn entries(&self, path: &str) -> Vec<(String, &str)> {
        match self {
            OneOrMany::One(t) => vec![(path.to_string(), t.0.as_str())],
            OneOrMany::Many(v) => v
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("{path}[{i}]"), t.0.as_str()))
                .collect(),
        }
    }
}

/// `auto` (one per core) or a number of worker threads.
#[derive(Debug, Clone)]
pub enum RawWorkers {
    Count(u64),
    Auto(Text),
}

impl<'de> Deserialize<'de> for RawWorkers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawWorkers;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`auto` or a number of threads, e.g. `workers: 4`")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<RawWorkers, E> {
                Ok(RawWorkers::Count(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<RawWorkers, E> {
                TextVisitor.visit_str(s).map(RawWorkers::Auto)
            }
        }
        d.deserialize_any(Visitor)
    }
}
