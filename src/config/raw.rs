//! The YAML schema as serde reads it (unknown keys rejected), with the value types operators write: `${ENV}` text, durations, sizes, one-or-many lists.
//!
//! Nothing here is checked beyond its shape: `Raw*` mirror what a human
//! wrote, with strings and options; [`super::validate`] turns them into
//! [`super::Config`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::{balance, observe};

mod limiter;
mod reputation;
mod site;

pub use super::store::redis::RawSentinel;
pub use super::store::{RawBackend, RawRedis, RawSqlite, RawStore};
pub use limiter::{RawLimiter, RawOverride, Written};
pub use reputation::{RawCrowdsec, RawGeoip, RawPush};
pub use site::{RawAccess, RawAuth, RawBasic, RawHeaderRules, RawHeaders, RawRedirect, RawRewrite};

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

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub audit: RawAudit,
    #[serde(default)]
    pub identity: RawIdentity,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    pub limiters: BTreeMap<String, RawLimiter>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub log: observe::RawLog,
    /// The one shared response cache (`routes[].cache` stores in it).
    pub cache: Option<super::cache::RawCache>,
    /// Run with no routes at all (every request 404, no limit): said on purpose.
    pub allow_no_routes: Option<bool>,
    /// Site-wide address lists, before every route's own.
    pub access: Option<RawAccess>,
    /// Site-wide header rules, before every route's own.
    pub headers: Option<RawHeaders>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<OneOrMany>,
    pub tls: Option<RawTls>,
    pub request_header_timeout: Option<Dur>,
    pub max_request_body: Option<Size>,
    pub shutdown_grace: Option<Dur>,
    pub workers: Option<RawWorkers>,
    pub max_connections: Option<u64>,
    pub max_connections_per_ip: Option<u64>,
    pub idle_timeout: Option<Dur>,
    pub request_body_buffer: Option<Size>,
    pub request_body_timeout: Option<Dur>,
    pub request_body_min_rate: Option<Size>,
    pub send_timeout: Option<Dur>,
    pub upstream_requests_per_connection: Option<u64>,
    /// After an early answer, how long the rest of a body is read (nginx's names).
    pub lingering_time: Option<Dur>,
    pub lingering_timeout: Option<Dur>,
    /// `reject` (default) or `decode`.
    pub encoded_separators: Option<Text>,
    pub underscores_in_headers: Option<bool>,
    /// `negotiate` (default) or `json`: whether tollgate's own errors may be HTML pages.
    pub error_format: Option<Text>,
    /// Status → an HTML file, the page a browser gets for that error.
    pub error_pages: Option<BTreeMap<u16, Text>>,
    /// gzip/brotli for text responses (default on).
    pub compression: Option<bool>,
    /// Peers (load balancers) that open every connection with a PROXY protocol header.
    #[serde(default)]
    pub proxy_protocol: Vec<Text>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: Option<Text>,
    pub key: Option<Text>,
    #[serde(default)]
    pub certs: Vec<RawCert>,
    /// TLS addresses; when given, `server.listen` stays plain HTTP.
    pub listen: Option<OneOrMany>,
    /// Plain listeners answer 308 to `https://` (needs `listen`).
    pub redirect_plain: Option<bool>,
    /// Automatic HTTPS: certificates ordered and renewed from an ACME CA.
    pub acme: Option<RawAcme>,
    /// `Strict-Transport-Security` on TLS responses (off without it).
    pub hsts: Option<RawHsts>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAcme {
    pub directory: Option<Text>,
    /// A PEM file trusted for the directory's own TLS (a test CA such as pebble's).
    pub directory_ca: Option<Text>,
    pub email: Option<Text>,
    pub domains: Option<Vec<Text>>,
    /// `tls-alpn-01` (default) or `http-01`.
    pub challenge: Option<Text>,
    pub storage: Option<Text>,
    /// Renew when this little validity is left (default: a third of the lifetime).
    pub renew_before: Option<Dur>,
    /// The secret that encrypts what a fleet shares through Redis (needed with `store.backend: redis`).
    pub shared_key_file: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHsts {
    pub max_age: Option<Dur>,
    pub include_subdomains: Option<bool>,
    pub preload: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCert {
    pub cert: Text,
    pub key: Text,
    #[serde(default)]
    pub hosts: Vec<Text>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub listen: Option<Text>,
    pub token: Option<Text>,
    /// A file holding the token (Docker/Kubernetes secrets); read by the loader.
    pub token_file: Option<Text>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAudit {
    pub enabled: Option<bool>,
    pub retention: Option<Dur>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdentity {
    pub api_key_header: Option<Text>,
    #[serde(default)]
    pub api_keys: Vec<Text>,
    /// One key per line (plain or `sha256:<hex>`), read with the config.
    pub api_keys_file: Option<Text>,
    /// How many unknown keys one IP may try per window before its 401s become 429s.
    pub unknown_keys: Option<RawUnknownKeys>,
    #[serde(default)]
    pub trusted_proxies: Vec<Text>,
    pub ipv6_prefix: Option<u8>,
    #[serde(default)]
    pub exempt: Vec<Text>,
    /// Signed passes a solved challenge earns (`key: pass`, `routes[].challenge`).
    pub pass: Option<super::challenge::RawPass>,
    /// ASN and country databases (MaxMind DB format): `key: asn`, `match.country`.
    pub geoip: Option<RawGeoip>,
    /// A CrowdSec Local API: its decisions enforced, tollgate's bans pushed to it.
    pub crowdsec: Option<RawCrowdsec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUnknownKeys {
    pub limit: Option<u64>,
    pub window: Option<Dur>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// One server; `servers` lists several (exactly one of the two).
    pub url: Option<Text>,
    pub servers: Option<Vec<Text>>,
    pub balance: Option<Text>,
    pub max_fails: Option<u32>,
    pub fail_timeout: Option<Dur>,
    /// Per server: requests in flight (http), or connections to php-fpm
    /// (fastcgi://, its pm.max_children; default 5).
    pub max_conns: Option<u32>,
    pub queue: Option<u32>,
    pub queue_timeout: Option<Dur>,
    pub health: Option<balance::RawHealth>,
    pub tunnel_idle_timeout: Option<Dur>,
    pub connect_timeout: Option<Dur>,
    pub timeout: Option<Dur>,
    /// PEM CA bundle that verifies an https:// upstream instead of the system roots.
    pub ca: Option<Text>,
    pub insecure_skip_verify: Option<bool>,
    /// fastcgi:// only: the document root as php-fpm sees it.
    pub root: Option<Text>,
    /// fastcgi:// only: a directory's default script (index.php).
    pub index: Option<Text>,
    /// fastcgi:// only: the script that answers paths naming no file (front controller).
    pub fallback: Option<Text>,
    /// fastcgi:// only: `Cache-Control` of every static file, instead of the default by type.
    pub cache_control: Option<Text>,
    /// fastcgi:// only: how long a path's script is trusted without a new stat.
    pub script_cache: Option<Dur>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Text,
    #[serde(rename = "match", default)]
    pub matcher: RawMatch,
    pub upstream: Option<Text>,
    pub respond: Option<RawRespond>,
    #[serde(default)]
    pub limiters: Vec<Text>,
    pub reject: Option<observe::RawReject>,
    pub rate_limit_headers: Option<Text>,
    /// A reload may leave this route with no limiter though it had some.
    pub allow_unlimited: Option<bool>,
    /// As `server.error_format`, for this route (an API route: `json`).
    pub error_format: Option<Text>,
    /// As `server.error_pages`; a page here wins over the server's for its status.
    pub error_pages: Option<BTreeMap<u16, Text>>,
    /// This route's responses may be compressed (default: `server.compression`).
    pub compression: Option<bool>,
    /// A proof-of-work page for browsers (`always`, or `over_limit`).
    pub challenge: Option<super::challenge::RawChallenge>,
    pub redirect: Option<RawRedirect>,
    pub rewrite: Option<RawRewrite>,
    pub access: Option<RawAccess>,
    pub auth: Option<RawAuth>,
    pub headers: Option<RawHeaders>,
    /// Answers stored in the shared cache and served from it.
    pub cache: Option<super::cache::RawRouteCache>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub path: Option<Text>,
    pub path_prefix: Option<Text>,
    pub methods: Option<Vec<Text>>,
    pub host: Option<Text>,
    /// Query parameters that must all be present with these values.
    pub query: Option<BTreeMap<String, Text>>,
    /// A regular expression on the normalised path; its captures fill `redirect.to` and `rewrite.to`.
    pub path_regex: Option<Text>,
    /// A regular expression on the query string as sent (Apache's `%{QUERY_STRING}` conditions).
    pub query_regex: Option<Text>,
    /// The client's network: AS numbers (`identity.geoip.asn_db`).
    pub asn: Option<OneOrMany>,
    /// The client's country: ISO codes (`identity.geoip.country_db`).
    pub country: Option<OneOrMany>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRespond {
    pub status: u16,
    #[serde(default)]
    pub body: Option<Text>,
    pub content_type: Option<Text>,
}
