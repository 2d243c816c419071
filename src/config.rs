//! Configuration: the raw YAML schema (serde, unknown keys rejected) and its validation into `Config`.
//!
//! Two kinds of types live here on purpose: `Raw*` mirror the YAML a human
//! wrote, with strings and options; `Config` and friends are what the proxy
//! runs on, with every name resolved to an index and every value checked.
//! `load` reports *every* validation error with its YAML line and column, the
//! way `nginx -t` does, so an operator fixes a config in one pass.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use ipnet::IpNet;
use serde::{Deserialize, Deserializer};

use crate::limiter::{
    concurrency::Concurrency, fixed_window::FixedWindow, leaky_bucket::LeakyBucket,
    sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm, Nanos, NANOS_PER_SEC,
};
use crate::tls::CertSet;
// TLS inputs are the TLS module's own types; the config names them.
pub use crate::tls::{CertConfig, UpstreamTls};

mod admin_token;
/// Duplicate keys and nesting depth, checked on the text before serde reads it.
mod scan;

mod observe;
pub use observe::{HeaderSets, LogConfig, LogFormat, RejectBody, RejectShape};

pub mod balance;
pub use balance::{BalanceConfig, HealthCheck, Policy};

mod fastcgi;
pub use fastcgi::{FastCgiAddress, FastCgiConfig};

mod bodies;
pub use bodies::BodyConfig;

/// The largest sliding-window limit: its exact log costs 8 bytes per admitted
/// request and key, so a larger limit would let one key take megabytes.
pub const MAX_SLIDING_WINDOW_LIMIT: u64 = 100_000;

mod protect;

// ---------------------------------------------------------------- raw schema

/// A string value in which `${ENV_VAR}` is replaced from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        expand_env(&raw, |name| std::env::var(name).ok())
            .map(Text)
            .map_err(serde::de::Error::custom)
    }
}

/// Replaces every `${NAME}`; an unset variable is an error that names it.
pub fn expand_env(raw: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unterminated `${{` in {raw:?}"))?;
        let name = &after[..end];
        if name.is_empty() {
            return Err(format!("empty variable name `${{}}` in {raw:?}"));
        }
        let value =
            lookup(name).ok_or_else(|| format!("environment variable {name} is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A duration written as `500ms`, `2s`, `1m`, `7d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Text(s) = Text::deserialize(d)?;
        humantime::parse_duration(s.trim()).map(Dur).map_err(|e| {
            serde::de::Error::custom(format!(
                "invalid duration {s:?}: {e} (write e.g. 500ms, 2s, 1m, 7d)"
            ))
        })
    }
}

/// A size in bytes written as `10MiB`, `512KiB`, `1MB` or a plain number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Number(u64),
            Text(Text),
        }
        match Either::deserialize(d)? {
            Either::Number(n) => Ok(Size(n)),
            Either::Text(Text(s)) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
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

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(Text),
    Many(Vec<Text>),
}

impl OneOrMany {
    fn items(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(t) => vec![t.0.as_str()],
            OneOrMany::Many(v) => v.iter().map(|t| t.0.as_str()).collect(),
        }
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
}

/// `auto` (one per core) or a number of worker threads.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawWorkers {
    Count(u64),
    Auto(Text),
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
pub struct RawStore {
    pub backend: Option<Text>,
    pub path: Option<Text>,
    pub url: Option<Text>,
    pub prefix: Option<Text>,
    pub timeout: Option<Dur>,
    pub on_error: Option<Text>,
    pub prune_interval: Option<Dur>,
    pub flush_interval: Option<Dur>,
    pub max_keys: Option<u64>,
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimiter {
    pub algorithm: Option<Text>,
    pub limit: Option<u64>,
    pub window: Option<Dur>,
    pub capacity: Option<u64>,
    pub refill_per_second: Option<f64>,
    pub leak_per_second: Option<f64>,
    pub max_in_flight: Option<u64>,
    pub key: Option<OneOrMany>,
    pub mode: Option<Text>,
    #[serde(default)]
    pub overrides: Vec<RawOverride>,
    pub reject: Option<observe::RawReject>,
    /// Only responses that match are counted (see `limiter/count.rs`).
    pub count: Option<protect::RawCount>,
    /// Refuse a key outright after repeated rejections.
    pub ban: Option<protect::RawBan>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverride {
    /// The key value this override applies to (an API key, an IP, a header value).
    pub key: Text,
    /// The quota for that key: limit, capacity or max_in_flight, by algorithm.
    pub limit: u64,
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRespond {
    pub status: u16,
    #[serde(default)]
    pub body: Option<Text>,
    pub content_type: Option<Text>,
}

// ---------------------------------------------------------- validated config

#[derive(Debug, Clone)]
pub struct Config {
    /// Problems that do not stop the config from running, with their YAML paths
    /// (e.g. a route every limiter of which keys on values the client chooses).
    pub warnings: Vec<ConfigProblem>,
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub store: StoreConfig,
    pub audit: AuditConfig,
    pub identity: IdentityConfig,
    pub upstreams: Vec<UpstreamConfig>,
    pub limiters: Vec<LimiterConfig>,
    pub routes: Vec<RouteConfig>,
    pub log: LogConfig,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: Vec<SocketAddr>,
    pub tls: Option<TlsConfig>,
    pub request_header_timeout: Duration,
    pub max_request_body: u64,
    pub shutdown_grace: Duration,
    /// Worker threads serving connections (each a single-threaded runtime).
    pub workers: usize,
    /// Open client connections on the public listeners; `None` = derived from the fd limit.
    pub max_connections: Option<usize>,
    /// Open connections per client address (IPv6: per /64); trusted proxies are exempt.
    pub max_connections_per_ip: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Request body buffering, slow-client timers, HTTP/2 fair share.
    pub bodies: BodyConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    pub certs: Vec<CertConfig>,
    /// The pairs, read and checked when the config was validated.
    pub loaded: Arc<CertSet>,
    /// TLS addresses; empty = every `server.listen` address serves TLS.
    pub listen: Vec<SocketAddr>,
    /// Plain listeners answer 308 to https:// (only with `listen`).
    pub redirect_plain: bool,
}

/// What a public listener serves (see [`crate::tls`] for the choice of shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    Http,
    Https,
    /// Plain HTTP that answers 308 to the https:// listener on this port.
    RedirectToHttps {
        port: u16,
    },
}

impl ServerConfig {
    /// Every public listener and what it serves: `server.listen`, then `server.tls.listen`.
    pub fn public(&self) -> Vec<(SocketAddr, Serve)> {
        let plain = self.plain_serves();
        let tls = self.tls.iter().flat_map(|t| &t.listen);
        self.listen
            .iter()
            .map(|a| (*a, plain))
            .chain(tls.map(|a| (*a, Serve::Https)))
            .collect()
    }

    /// What the listener configured at `addr` serves, if this config still has it.
    /// Asked once per accepted connection, so it does not allocate.
    pub fn serve_at(&self, addr: SocketAddr) -> Option<Serve> {
        if self.listen.contains(&addr) {
            return Some(self.plain_serves());
        }
        self.tls
            .as_ref()
            .filter(|t| t.listen.contains(&addr))
            .map(|_| Serve::Https)
    }

    /// What the `server.listen` addresses serve.
    fn plain_serves(&self) -> Serve {
        match &self.tls {
            None => Serve::Http,
            Some(t) => match t.listen.first() {
                None => Serve::Https,
                Some(first) if t.redirect_plain => Serve::RedirectToHttps { port: first.port() },
                Some(_) => Serve::Http,
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// `admin.token`, or the content of `admin.token_file` once the loader read it.
    pub token: Option<String>,
    /// Where the token came from, when it came from a file (re-read on every reload).
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Backend {
    Memory,
    Sqlite {
        path: PathBuf,
    },
    Redis {
        url: String,
        prefix: String,
        timeout: Duration,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    Allow,
    Deny,
    Local,
}

impl OnError {
    /// The config spelling, also used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub backend: Backend,
    pub on_error: OnError,
    pub prune_interval: Duration,
    /// How often the writer thread persists counters; a `kill -9` loses at most this much.
    pub flush_interval: Duration,
    /// Limiter keys this process tracks at most (overflow keys included).
    pub max_keys: usize,
}

/// `store.max_keys` when not given: 64 overflow slots + 64 shards × 14,336
/// keys, the most whose shard tables stay at 16,384 buckets each. Measured
/// (`cargo bench --bench keys_memory`): ~100 MB full, where 1,000,000 keys
/// cost ~157 MB because every shard doubles to 32,768 buckets.
pub const DEFAULT_MAX_KEYS: usize = 917_568;

/// The smallest `store.max_keys`: 64 slots for overflow keys and one key per
/// shard (the table asserts that this covers its layout).
pub const MIN_MAX_KEYS: usize = 128;

#[derive(Debug, Clone)]
pub struct AuditConfig {
    pub enabled: bool,
    pub retention: Duration,
}

#[derive(Debug, Clone)]
pub struct IdentityConfig {
    pub api_key_header: HeaderName,
    /// `identity.api_keys`, then the lines of `identity.api_keys_file`.
    pub api_keys: Vec<ApiKeyEntry>,
    /// The key file and its content as read with this config (the file watch compares it).
    pub api_keys_file: Option<(PathBuf, Arc<[u8]>)>,
    /// Unknown keys one IP may present per `unknown_key_window` before 429s.
    pub unknown_key_limit: u64,
    pub unknown_key_window: Duration,
    pub trusted_proxies: Vec<IpNet>,
    pub ipv6_prefix: u8,
    pub exempt: Vec<IpNet>,
}

#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub name: String,
    pub url: Uri,
    pub connect_timeout: Duration,
    pub timeout: Duration,
    /// How an https:// upstream's certificate is verified (unused for http://).
    pub tls: UpstreamTls,
    /// The servers (`url` is the first) and how requests spread over them.
    pub balance: BalanceConfig,
    /// Set for a fastcgi:// upstream (php-fpm); `url` is then only for display.
    pub fastcgi: Option<FastCgiConfig>,
}

/// One configured API key: the secret itself, or its SHA-256 (`sha256:<hex>`)
/// so the config need not hold the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiKeyEntry {
    Plain(String),
    Sha256([u8; 32]),
}

impl ApiKeyEntry {
    /// Parses one entry: `sha256:` followed by 64 hex digits, or a plain key.
    pub fn parse(s: &str) -> Result<ApiKeyEntry, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("an API key cannot be empty".into());
        }
        let Some(hex) = s.strip_prefix("sha256:") else {
            return Ok(ApiKeyEntry::Plain(s.to_string()));
        };
        let digits: Vec<u8> = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .filter(|p| p.len() == 2)
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
            })
            .collect::<Option<_>>()
            .unwrap_or_default();
        let digest: [u8; 32] = digits.try_into().map_err(|_| {
            "`sha256:` must be followed by the 64 hex digits of the key's SHA-256 (e.g. `printf %s KEY | sha256sum`)".to_string()
        })?;
        Ok(ApiKeyEntry::Sha256(digest))
    }
}

/// One part of a limiter's key (SPEC §2 `key`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    Client,
    Ip,
    ApiKey,
    Route,
    Global,
    Header(HeaderName),
}

impl KeyPart {
    /// Whether a client can pick this part's value freely (and so get a
    /// fresh counter per value): a header always; an API key unless keys are
    /// verified against `identity.api_keys` / `api_keys_file`.
    pub fn chosen_by_client(&self, keys_verified: bool) -> bool {
        match self {
            KeyPart::Header(_) => true,
            KeyPart::ApiKey => !keys_verified,
            KeyPart::Client | KeyPart::Ip | KeyPart::Route | KeyPart::Global => false,
        }
    }
}

impl IdentityConfig {
    /// Whether API keys are verified (a list or a key file is configured).
    /// Without one, a key header identifies nobody.
    pub fn has_key_source(&self) -> bool {
        !self.api_keys.is_empty() || self.api_keys_file.is_some()
    }
}

impl fmt::Display for KeyPart {
    /// The config spelling (what `key:` accepts).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Client => f.write_str("client"),
            KeyPart::Ip => f.write_str("ip"),
            KeyPart::ApiKey => f.write_str("api_key"),
            KeyPart::Route => f.write_str("route"),
            KeyPart::Global => f.write_str("global"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct LimiterConfig {
    pub name: String,
    pub algorithm: Algorithm,
    pub key: Vec<KeyPart>,
    pub shadow: bool,
    pub overrides: Vec<OverrideConfig>,
    /// How this limiter's rejections look; `None`: the default 429 problem+json.
    pub reject: Option<RejectShape>,
    /// `count:` — which responses count; `None`: every request does.
    pub count: Option<crate::limiter::count::CountRule>,
    /// `ban:` — refuse a key outright after repeated rejections.
    pub ban: Option<crate::limiter::ban::BanRule>,
}

#[derive(Debug, Clone)]
pub struct OverrideConfig {
    /// The key value as written in the config (may be a secret API key).
    pub key: String,
    pub limit: u64,
}

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    pub path: Option<String>,
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<Method>>,
    pub host: Option<String>,
    /// `match.query`: (name, value) pairs, compared with what PHP decodes.
    pub query: Vec<(String, String)>,
    pub action: Action,
    /// Indexes into `Config::limiters`.
    pub limiters: Vec<usize>,
    /// Overrides the deciding limiter's `reject` on this route.
    pub reject: Option<RejectShape>,
    pub rate_limit_headers: HeaderSets,
}

#[derive(Debug, Clone)]
pub enum Action {
    /// Index into `Config::upstreams`.
    Upstream(usize),
    Respond {
        status: StatusCode,
        body: String,
        content_type: String,
    },
}

// -------------------------------------------------------------------- errors

/// Every problem found in one config file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    pub problems: Vec<ConfigProblem>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Where in the document, e.g. `routes[1].limiters[0]`.
    pub path: String,
    /// 1-based line and column, when known.
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.location, self.path.is_empty()) {
            (Some((line, col)), false) => {
                write!(
                    f,
                    "line {line} column {col}: {}: {}",
                    self.path, self.message
                )
            }
            (Some((line, col)), true) => write!(f, "line {line} column {col}: {}", self.message),
            (None, false) => write!(f, "{}: {}", self.path, self.message),
            (None, true) => write!(f, "{}", self.message),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self
            .file
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "config".into());
        let n = self.problems.len();
        write!(f, "{file}: {n} error{}", if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            write!(f, "\n  {file}: {p}")?;
        }
        Ok(())
    }
}

impl Config {
    /// Logs every warning (at start and after each reload): a config that
    /// runs but leaves a limit open must not go unnoticed.
    pub fn log_warnings(&self) {
        for w in &self.warnings {
            tracing::warn!(warning = %w, "config warning");
        }
    }
}

impl ConfigError {
    fn single(file: Option<&Path>, message: String, location: Option<(usize, usize)>) -> Self {
        ConfigError {
            file: file.map(Path::to_path_buf),
            problems: vec![ConfigProblem {
                path: String::new(),
                location,
                message,
            }],
        }
    }
}

// ------------------------------------------------------------------- loading

/// Reads and validates a config file.
pub fn load_file(path: &Path) -> Result<Config, ConfigError> {
    load_file_text(path).map(|(config, _)| config)
}

/// Reads and validates a config file, returning the text it was built from.
pub fn load_file_text(path: &Path) -> Result<(Config, String), ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::single(Some(path), format!("cannot read config: {e}"), None))?;
    match parse(&text) {
        Ok(config) => Ok((config, text)),
        Err(mut e) => {
            e.file = Some(path.to_path_buf());
            Err(e)
        }
    }
}

/// Parses and validates YAML text.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let problems = scan::scan(text);
    if !problems.is_empty() {
        return Err(ConfigError {
            file: None,
            problems,
        });
    }
    let raw: RawConfig = if text.trim().is_empty() {
        RawConfig::default()
    } else {
        serde_yaml::from_str(text).map_err(|e| {
            let location = e.location().map(|l| (l.line(), l.column()));
            ConfigError::single(None, clean_serde_message(&e.to_string()), location)
        })?
    };
    let mut v = Validator {
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    let mut config = v.config(&raw);
    if v.problems.is_empty() {
        // Validation is pure; the files the config names are read here, by the loader.
        if let Err(message) = admin_token::read_token_file(&mut config.admin) {
            v.err("admin.token_file", message);
        }
    }
    if v.problems.is_empty() {
        read_key_file(&mut config.identity, &mut v);
    }
    let index = locate::Index::build(text);
    let locate = |list: Vec<(String, String)>| -> Vec<ConfigProblem> {
        list.into_iter()
            .map(|(path, message)| ConfigProblem {
                location: index.find(&path),
                path,
                message,
            })
            .collect()
    };
    if v.problems.is_empty() {
        config.warnings = locate(v.warnings);
        Ok(config)
    } else {
        Err(ConfigError {
            file: None,
            problems: locate(v.problems),
        })
    }
}

/// Reads `identity.api_keys_file` (the one file the identity section names):
/// one key per line, plain or `sha256:<hex>`; blank lines and `#` comments
/// are skipped. Its content is kept so the file watch can tell when it changes.
fn read_key_file(identity: &mut IdentityConfig, v: &mut Validator) {
    let Some((path, _)) = identity.api_keys_file.clone() else {
        return;
    };
    let at = "identity.api_keys_file";
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            v.err(at, format!("cannot read {}: {e}", path.display()));
            return;
        }
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        v.err(at, format!("{} is not UTF-8 text", path.display()));
        return;
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match ApiKeyEntry::parse(line) {
            Ok(entry) => identity.api_keys.push(entry),
            Err(e) => v.err(at, format!("{} line {}: {e}", path.display(), n + 1)),
        }
    }
    identity.api_keys_file = Some((path, Arc::from(bytes)));
}

/// serde_yaml appends " at line L column C" itself; we print the location up front.
fn clean_serde_message(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

struct Validator {
    problems: Vec<(String, String)>,
    warnings: Vec<(String, String)>,
}

fn dur(d: Option<Dur>, default: Duration) -> Duration {
    d.map(|d| d.0).unwrap_or(default)
}

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Validator {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push((path.into(), message.into()));
    }

    fn config(&mut self, raw: &RawConfig) -> Config {
        let server = self.server(&raw.server);
        let admin = self.admin(&raw.admin, &server);
        let store = self.store(&raw.store);
        let audit = AuditConfig {
            enabled: raw.audit.enabled.unwrap_or(true),
            retention: dur(raw.audit.retention, Duration::from_secs(7 * 86_400)),
        };
        let identity = self.identity(&raw.identity);
        let upstreams: Vec<UpstreamConfig> = raw
            .upstreams
            .iter()
            .filter_map(|(name, u)| self.upstream(name, u))
            .collect();
        let limiters: Vec<LimiterConfig> = raw
            .limiters
            .iter()
            .filter_map(|(name, l)| self.limiter(name, l))
            .collect();
        let routes = self.routes(
            &raw.routes,
            &raw.upstreams,
            &upstreams,
            &raw.limiters,
            &limiters,
        );
        self.warn_walkable_routes(&raw.routes, &routes, &limiters, identity.has_key_source());
        self.warn_unverified_overrides(&limiters, identity.has_key_source());
        let log = self.log(&raw.log);
        Config {
            warnings: Vec::new(),
            server,
            admin,
            store,
            audit,
            identity,
            upstreams,
            limiters,
            routes,
            log,
        }
    }

    /// An override for an API key can only ever apply to a verified key.
    fn warn_unverified_overrides(&mut self, limiters: &[LimiterConfig], key_source: bool) {
        if key_source {
            return;
        }
        for l in limiters {
            if !matches!(l.key.as_slice(), [KeyPart::Client]) {
                continue;
            }
            for (i, o) in l.overrides.iter().enumerate() {
                if o.key.trim().parse::<std::net::IpAddr>().is_err() {
                    self.warnings.push((
                        format!("limiters.{}.overrides[{i}].key", l.name),
                        "this override names an API key, but no identity.api_keys or api_keys_file verifies keys, so `client` is always an IP and it never applies".into(),
                    ));
                }
            }
        }
    }

    /// A route whose every limiter keys on something the client picks (a
    /// header, or an API key nobody verifies) can be walked around by picking
    /// a new value per request: said at `check`, start and reload.
    fn warn_walkable_routes(
        &mut self,
        raw: &[RawRoute],
        routes: &[RouteConfig],
        limiters: &[LimiterConfig],
        key_source: bool,
    ) {
        for route in routes.iter().filter(|r| !r.limiters.is_empty()) {
            let holds = route.limiters.iter().any(|&l| {
                !limiters[l]
                    .key
                    .iter()
                    .any(|p| p.chosen_by_client(key_source))
            });
            if holds {
                continue;
            }
            let i = raw.iter().position(|r| r.name.0 == route.name).unwrap_or(0);
            let names: Vec<&str> = route
                .limiters
                .iter()
                .map(|&l| limiters[l].name.as_str())
                .collect();
            self.warnings.push((
                format!("routes[{i}].limiters"),
                format!(
                    "route {:?}: every limiter ({}) keys on a value the client chooses{}, so a client \
                     gets a fresh counter by sending a new value; add a limiter keyed on `ip` (or `client`) to this route",
                    route.name,
                    names.join(", "),
                    if key_source { "" } else { " (no identity.api_keys or api_keys_file verifies api_key)" },
                ),
            ));
        }
    }

    fn socket_addr(&mut self, path: &str, s: &str) -> Option<SocketAddr> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Some(a);
        }
        match s.to_socket_addrs().map(|mut it| it.next()) {
            Ok(Some(a)) => Some(a),
            _ => {
                self.err(
                    path,
                    format!("invalid listen address {s:?} (write host:port, e.g. 0.0.0.0:8080)"),
                );
                None
            }
        }
    }

    fn server(&mut self, raw: &RawServer) -> ServerConfig {
        let listen = match &raw.listen {
            None => vec!["0.0.0.0:8080".parse().expect("literal address")],
            Some(l) => {
                let items = l.items();
                let many = matches!(l, OneOrMany::Many(_));
                if items.is_empty() {
                    self.err("server.listen", "at least one listen address is needed");
                }
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        let path = if many {
                            format!("server.listen[{i}]")
                        } else {
                            "server.listen".into()
                        };
                        self.socket_addr(&path, s)
                    })
                    .collect()
            }
        };
        let tls = raw.tls.as_ref().and_then(|t| self.tls(t, &listen));
        let max_request_body = raw.max_request_body.map(|s| s.0).unwrap_or(10 << 20);
        ServerConfig {
            listen,
            tls,
            request_header_timeout: dur(raw.request_header_timeout, Duration::from_secs(10)),
            max_request_body,
            shutdown_grace: dur(raw.shutdown_grace, Duration::from_secs(10)),
            workers: self.workers(&raw.workers),
            max_connections: self.count("server.max_connections", raw.max_connections),
            max_connections_per_ip: self
                .count("server.max_connections_per_ip", raw.max_connections_per_ip)
                .unwrap_or(256),
            idle_timeout: dur(raw.idle_timeout, Duration::from_secs(60)),
            bodies: self.bodies(raw),
        }
    }

    /// A connection count: 1 or more.
    fn count(&mut self, path: &str, raw: Option<u64>) -> Option<usize> {
        match raw {
            Some(0) => {
                self.err(path, "must be at least 1");
                None
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        }
    }

    fn workers(&mut self, raw: &Option<RawWorkers>) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match raw {
            None => cores,
            Some(RawWorkers::Auto(t)) if t.0 == "auto" => cores,
            Some(RawWorkers::Count(n)) if (1..=1024).contains(n) => *n as usize,
            Some(_) => {
                self.err(
                    "server.workers",
                    "must be `auto` or a number from 1 to 1024",
                );
                1
            }
        }
    }

    fn tls(&mut self, raw: &RawTls, plain: &[SocketAddr]) -> Option<TlsConfig> {
        let mut certs = Vec::new();
        // The YAML path of each pair, for errors.
        let mut paths = Vec::new();
        match (&raw.cert, &raw.key) {
            (Some(c), Some(k)) => {
                certs.push(CertConfig {
                    cert: PathBuf::from(&c.0),
                    key: PathBuf::from(&k.0),
                    hosts: Vec::new(),
                });
                paths.push("server.tls".to_string());
            }
            (None, None) => {}
            _ => self.err("server.tls", "`cert` and `key` go together"),
        }
        for (i, c) in raw.certs.iter().enumerate() {
            certs.push(CertConfig {
                cert: PathBuf::from(&c.cert.0),
                key: PathBuf::from(&c.key.0),
                hosts: c.hosts.iter().map(|h| h.0.to_ascii_lowercase()).collect(),
            });
            paths.push(format!("server.tls.certs[{i}]"));
        }
        if certs.is_empty() {
            self.err("server.tls", "needs `cert` and `key`, or `certs`");
            return None;
        }
        let mut broken = false;
        for (c, path) in certs.iter().zip(&paths) {
            // One pair at a time, so every broken pair is reported with its own YAML path.
            if let Err(e) = CertSet::load(std::slice::from_ref(c)) {
                let field = match &e {
                    crate::tls::TlsError::Read { path: p, .. } if *p == c.cert => "cert",
                    crate::tls::TlsError::NoCertificate { .. }
                    | crate::tls::TlsError::Certificate { .. } => "cert",
                    crate::tls::TlsError::Pem { path: p, .. } if *p == c.cert => "cert",
                    _ => "key",
                };
                self.err(format!("{path}.{field}"), e.to_string());
                broken = true;
            }
        }
        let listen: Vec<SocketAddr> = match &raw.listen {
            None => Vec::new(),
            Some(l) => {
                let many = matches!(l, OneOrMany::Many(_));
                let items = l.items();
                if items.is_empty() {
                    self.err(
                        "server.tls.listen",
                        "an empty list would serve no TLS; remove the key to serve TLS on server.listen",
                    );
                }
                items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        let path = if many {
                            format!("server.tls.listen[{i}]")
                        } else {
                            "server.tls.listen".into()
                        };
                        let addr = self.socket_addr(&path, s)?;
                        if plain.contains(&addr) {
                            self.err(path, format!("{addr} is also in server.listen"));
                        }
                        Some(addr)
                    })
                    .collect()
            }
        };
        let redirect_plain = raw.redirect_plain.unwrap_or(false);
        if redirect_plain && raw.listen.is_none() {
            self.err(
                "server.tls.redirect_plain",
                "needs server.tls.listen: without it every server.listen address already serves TLS",
            );
        }
        if broken {
            return None;
        }
        let loaded = match CertSet::load(&certs) {
            Ok(set) => Arc::new(set),
            Err(e) => {
                // A file changed between the two reads; the next reload sees it settled.
                self.err("server.tls", e.to_string());
                return None;
            }
        };
        Some(TlsConfig {
            certs,
            loaded,
            listen,
            redirect_plain,
        })
    }

    fn admin(&mut self, raw: &RawAdmin, server: &ServerConfig) -> AdminConfig {
        let listen = match &raw.listen {
            Some(t) => self.socket_addr("admin.listen", &t.0),
            None => Some("127.0.0.1:9901".parse().expect("literal address")),
        }
        .unwrap_or_else(|| "127.0.0.1:9901".parse().expect("literal address"));
        let clash = server.public().iter().any(|(p, _)| {
            p.port() == listen.port()
                && listen.port() != 0
                && (p.ip() == listen.ip()
                    || p.ip().is_unspecified()
                    || listen.ip().is_unspecified())
        });
        if clash {
            self.err(
                "admin.listen",
                format!("{listen} overlaps a public listener; the admin API must never be on the public port"),
            );
        }
        let token = raw.token.as_ref().map(|t| t.0.clone());
        let token_file = raw.token_file.as_ref().map(|t| PathBuf::from(&t.0));
        for (path, problem) in
            admin_token::problems(listen, token.as_deref(), token_file.as_deref())
        {
            self.err(path, problem);
        }
        AdminConfig {
            listen,
            token,
            token_file,
        }
    }

    fn store(&mut self, raw: &RawStore) -> StoreConfig {
        let backend = match raw
            .backend
            .as_ref()
            .map(|t| t.0.as_str())
            .unwrap_or("sqlite")
        {
            "sqlite" => Backend::Sqlite {
                path: PathBuf::from(
                    raw.path
                        .as_ref()
                        .map(|t| t.0.as_str())
                        .unwrap_or("tollgate.db"),
                ),
            },
            "memory" => Backend::Memory,
            "redis" => {
                let url = raw
                    .url
                    .as_ref()
                    .map(|t| t.0.clone())
                    .unwrap_or_else(|| "redis://127.0.0.1:6379/0".into());
                if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                    self.err(
                        "store.url",
                        format!("{url:?} is not a redis:// or rediss:// URL"),
                    );
                }
                Backend::Redis {
                    url,
                    prefix: raw
                        .prefix
                        .as_ref()
                        .map(|t| t.0.clone())
                        .unwrap_or_else(|| "tollgate:".into()),
                    timeout: dur(raw.timeout, Duration::from_millis(50)),
                }
            }
            other => {
                self.err(
                    "store.backend",
                    format!("unknown backend {other:?} (sqlite, memory or redis)"),
                );
                Backend::Memory
            }
        };
        let on_error = match raw
            .on_error
            .as_ref()
            .map(|t| t.0.as_str())
            .unwrap_or("allow")
        {
            "allow" => OnError::Allow,
            "deny" => OnError::Deny,
            "local" => OnError::Local,
            other => {
                self.err(
                    "store.on_error",
                    format!("unknown policy {other:?} (allow, deny or local)"),
                );
                OnError::Allow
            }
        };
        let flush_interval = dur(raw.flush_interval, Duration::from_millis(100));
        if flush_interval.is_zero() {
            self.err("store.flush_interval", "must be greater than zero");
        }
        let prune_interval = dur(raw.prune_interval, Duration::from_secs(60));
        if prune_interval.is_zero() {
            self.err("store.prune_interval", "must be greater than zero");
        }
        let max_keys = self.max_keys(raw.max_keys);
        StoreConfig {
            backend,
            on_error,
            prune_interval,
            flush_interval,
            max_keys,
        }
    }

    fn max_keys(&mut self, raw: Option<u64>) -> usize {
        let n = raw.map_or(DEFAULT_MAX_KEYS, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        });
        if n < MIN_MAX_KEYS {
            self.err(
                "store.max_keys",
                format!("{n} is too small: at least {MIN_MAX_KEYS}"),
            );
        }
        n.max(MIN_MAX_KEYS)
    }

    fn cidrs(&mut self, path: &str, raw: &[Text]) -> Vec<IpNet> {
        raw.iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let s = t.0.trim();
                let parsed = s
                    .parse::<IpNet>()
                    .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from));
                match parsed {
                    Ok(n) => Some(n.trunc()),
                    Err(_) => {
                        self.err(
                            format!("{path}[{i}]"),
                            format!("invalid CIDR or IP address {s:?}"),
                        );
                        None
                    }
                }
            })
            .collect()
    }

    fn header_name(&mut self, path: &str, s: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(s.as_bytes()) {
            Ok(h) => Some(h),
            Err(_) => {
                self.err(path, format!("invalid header name {s:?}"));
                None
            }
        }
    }

    fn identity(&mut self, raw: &RawIdentity) -> IdentityConfig {
        let api_key_header = raw
            .api_key_header
            .as_ref()
            .and_then(|t| self.header_name("identity.api_key_header", &t.0))
            .unwrap_or_else(|| HeaderName::from_static("x-client-key"));
        let ipv6_prefix = raw.ipv6_prefix.unwrap_or(64);
        if ipv6_prefix == 0 || ipv6_prefix > 128 {
            self.err("identity.ipv6_prefix", "must be between 1 and 128");
        }
        let api_keys = raw
            .api_keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| match ApiKeyEntry::parse(&k.0) {
                Ok(entry) => Some(entry),
                Err(e) => {
                    self.err(format!("identity.api_keys[{i}]"), e);
                    None
                }
            })
            .collect();
        let unknown = raw.unknown_keys.clone().unwrap_or_default();
        let unknown_key_limit = unknown.limit.unwrap_or(10);
        let unknown_key_window = dur(unknown.window, Duration::from_secs(60));
        if unknown_key_limit == 0 {
            self.err("identity.unknown_keys.limit", "must be at least 1");
        }
        if unknown_key_window.is_zero() {
            self.err("identity.unknown_keys.window", "must be greater than zero");
        }
        IdentityConfig {
            api_key_header,
            api_keys,
            // Read by the loader once the config is valid (see `read_key_file`).
            api_keys_file: raw
                .api_keys_file
                .as_ref()
                .map(|t| (PathBuf::from(&t.0), Arc::from(&b""[..]))),
            unknown_key_limit: unknown_key_limit.max(1),
            unknown_key_window: unknown_key_window.max(Duration::from_millis(1)),
            trusted_proxies: self.cidrs("identity.trusted_proxies", &raw.trusted_proxies),
            ipv6_prefix: ipv6_prefix.clamp(1, 128),
            exempt: self.cidrs("identity.exempt", &raw.exempt),
        }
    }

    /// One upstream server URL: http(s), with a host, without a query.
    fn upstream_url(&mut self, path: &str, text: &Text) -> Option<Uri> {
        let url: Uri = match text.0.parse() {
            Ok(u) => u,
            Err(e) => {
                self.err(path, format!("invalid URL {:?}: {e}", text.0));
                return None;
            }
        };
        match url.scheme_str() {
            Some("http") | Some("https") => {}
            _ => {
                self.err(
                    path,
                    format!(
                        "{:?} must start with http://, https:// or fastcgi://",
                        text.0
                    ),
                );
                return None;
            }
        }
        if url.authority().is_none() {
            self.err(path, format!("{:?} has no host", text.0));
            return None;
        }
        if url.query().is_some() {
            self.err(path, "an upstream URL cannot carry a query string");
            return None;
        }
        Some(url)
    }

    fn upstream(&mut self, name: &str, raw: &RawUpstream) -> Option<UpstreamConfig> {
        if raw
            .url
            .as_ref()
            .is_some_and(|u| u.0.starts_with("fastcgi://"))
        {
            return self.fastcgi_upstream(name, raw);
        }
        for (field, set) in [
            ("root", raw.root.is_some()),
            ("index", raw.index.is_some()),
            ("fallback", raw.fallback.is_some()),
        ] {
            if set {
                self.err(
                    format!("upstreams.{name}.{field}"),
                    "applies to fastcgi:// upstreams only",
                );
            }
        }
        let written: Vec<(String, &Text)> = match (&raw.url, &raw.servers) {
            (Some(url), None) => vec![(format!("upstreams.{name}.url"), url)],
            (None, Some(list)) if !list.is_empty() => list
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("upstreams.{name}.servers[{i}]"), t))
                .collect(),
            (None, Some(_)) => {
                self.err(format!("upstreams.{name}.servers"), "lists no server");
                return None;
            }
            (Some(_), Some(_)) => {
                self.err(
                    format!("upstreams.{name}"),
                    "`url` and `servers` contradict each other; keep one",
                );
                return None;
            }
            (None, None) => {
                self.err(format!("upstreams.{name}"), "needs `url` or `servers`");
                return None;
            }
        };
        let mut servers = Vec::with_capacity(written.len());
        for (path, text) in &written {
            servers.push(self.upstream_url(path, text));
        }
        let servers: Vec<Uri> = servers.into_iter().collect::<Option<_>>()?;
        let url = servers[0].clone();
        if servers.iter().any(|s| s.scheme() != url.scheme()) {
            self.err(
                format!("upstreams.{name}.servers"),
                "every server needs the same scheme (all http:// or all https://)",
            );
            return None;
        }
        let https = url.scheme_str() == Some("https");
        let insecure = raw.insecure_skip_verify.unwrap_or(false);
        let tls = match (&raw.ca, insecure) {
            (_, true) if !https => {
                self.err(
                    format!("upstreams.{name}.insecure_skip_verify"),
                    "applies to https:// upstreams only",
                );
                return None;
            }
            (Some(_), _) if !https => {
                self.err(
                    format!("upstreams.{name}.ca"),
                    "applies to https:// upstreams only",
                );
                return None;
            }
            (Some(_), true) => {
                self.err(
                    format!("upstreams.{name}"),
                    "`ca` and `insecure_skip_verify` contradict each other; keep one",
                );
                return None;
            }
            (Some(ca), false) => match crate::tls::load_ca(Path::new(&ca.0)) {
                Ok(certs) => UpstreamTls::Ca {
                    path: PathBuf::from(&ca.0),
                    certs,
                },
                Err(e) => {
                    self.err(format!("upstreams.{name}.ca"), e.to_string());
                    return None;
                }
            },
            (None, true) => UpstreamTls::InsecureSkipVerify,
            (None, false) => UpstreamTls::SystemRoots,
        };
        Some(UpstreamConfig {
            name: name.to_string(),
            url,
            connect_timeout: dur(raw.connect_timeout, Duration::from_secs(2)),
            timeout: dur(raw.timeout, Duration::from_secs(30)),
            tls,
            balance: self.balance(
                name,
                balance::RawBalance {
                    servers: &raw.servers,
                    balance: &raw.balance,
                    max_fails: raw.max_fails,
                    fail_timeout: raw.fail_timeout,
                    max_conns: raw.max_conns,
                    queue: raw.queue,
                    queue_timeout: raw.queue_timeout,
                    health: &raw.health,
                    tunnel_idle_timeout: raw.tunnel_idle_timeout,
                },
                servers,
            )?,
            fastcgi: None,
        })
    }

    fn limiter(&mut self, name: &str, raw: &RawLimiter) -> Option<LimiterConfig> {
        let at = |field: &str| format!("limiters.{name}.{field}");
        let before = self.problems.len();
        if !valid_name(name) {
            self.err(
                format!("limiters.{name}"),
                "a limiter name uses only letters, digits, `_` and `-`",
            );
        }
        let algorithm_name = raw
            .algorithm
            .as_ref()
            .map(|t| t.0.as_str())
            .unwrap_or("fixed_window");
        // Which fields each algorithm takes; anything else set is an error,
        // because a stray `limit` on a token bucket would silently do nothing.
        let (needs, allowed): (&[&str], &[&str]) = match algorithm_name {
            "fixed_window" | "sliding_window" => (&["limit", "window"], &["limit", "window"]),
            "token_bucket" => (
                &["capacity", "refill_per_second"],
                &["capacity", "refill_per_second"],
            ),
            "leaky_bucket" => (
                &["capacity", "leak_per_second"],
                &["capacity", "leak_per_second"],
            ),
            "concurrency" => (&["max_in_flight"], &["max_in_flight"]),
            other => {
                self.err(
                    at("algorithm"),
                    format!("unknown algorithm {other:?} (fixed_window, sliding_window, token_bucket, leaky_bucket or concurrency)"),
                );
                return None;
            }
        };
        let present = [
            ("limit", raw.limit.is_some()),
            ("window", raw.window.is_some()),
            ("capacity", raw.capacity.is_some()),
            ("refill_per_second", raw.refill_per_second.is_some()),
            ("leak_per_second", raw.leak_per_second.is_some()),
            ("max_in_flight", raw.max_in_flight.is_some()),
        ];
        for (field, is_set) in present {
            if is_set && !allowed.contains(&field) {
                self.err(
                    at(field),
                    format!("`{field}` does not apply to {algorithm_name}"),
                );
            }
            if !is_set && needs.contains(&field) {
                self.err(
                    format!("limiters.{name}"),
                    format!("{algorithm_name} needs `{field}`"),
                );
            }
        }
        let positive = |v: &mut Self, field: &str, n: Option<u64>| -> u64 {
            let n = n.unwrap_or(1);
            if n == 0 {
                v.err(at(field), "must be at least 1");
            }
            n.max(1)
        };
        let rate_interval = |v: &mut Self, field: &str, r: Option<f64>| -> Nanos {
            let r = r.unwrap_or(1.0);
            if !(r.is_finite() && r > 0.0 && r <= 1e9) {
                v.err(at(field), "must be a number greater than 0 and at most 1e9");
                return NANOS_PER_SEC;
            }
            ((NANOS_PER_SEC as f64 / r).round() as Nanos).max(1)
        };
        let algorithm = match algorithm_name {
            "fixed_window" | "sliding_window" => {
                let limit = positive(self, "limit", raw.limit);
                let window = nanos(raw.window.map(|d| d.0).unwrap_or(Duration::from_secs(1)));
                if window == 0 {
                    self.err(at("window"), "must be greater than zero");
                }
                let window = window.max(1);
                if algorithm_name == "fixed_window" {
                    Algorithm::FixedWindow(FixedWindow { limit, window })
                } else {
                    if limit > MAX_SLIDING_WINDOW_LIMIT {
                        self.err(
                            at("limit"),
                            format!("sliding_window keeps an exact log of 8 bytes per request; at most {MAX_SLIDING_WINDOW_LIMIT} (use token_bucket or fixed_window for higher rates)"),
                        );
                    }
                    Algorithm::SlidingWindow(SlidingWindow { limit, window })
                }
            }
            "token_bucket" => Algorithm::TokenBucket(TokenBucket {
                capacity: positive(self, "capacity", raw.capacity),
                interval: rate_interval(self, "refill_per_second", raw.refill_per_second),
            }),
            "leaky_bucket" => Algorithm::LeakyBucket(LeakyBucket {
                capacity: raw.capacity.unwrap_or(0),
                interval: rate_interval(self, "leak_per_second", raw.leak_per_second),
            }),
            _ => Algorithm::Concurrency(Concurrency {
                max_in_flight: positive(self, "max_in_flight", raw.max_in_flight),
            }),
        };
        let key = match &raw.key {
            None => vec![KeyPart::Client],
            Some(k) => {
                let many = matches!(k, OneOrMany::Many(_));
                let items = k.items();
                if items.is_empty() {
                    self.err(at("key"), "a key list needs at least one part");
                }
                let mut parts = Vec::new();
                for (i, s) in items.iter().enumerate() {
                    let path = if many {
                        format!("limiters.{name}.key[{i}]")
                    } else {
                        at("key")
                    };
                    if let Some(p) = self.key_part(&path, s) {
                        if parts.contains(&p) {
                            self.err(path, format!("key part {s:?} is listed twice"));
                        }
                        parts.push(p);
                    }
                }
                parts
            }
        };
        let shadow = match raw.mode.as_ref().map(|t| t.0.as_str()).unwrap_or("enforce") {
            "enforce" => false,
            "shadow" => true,
            other => {
                self.err(
                    at("mode"),
                    format!("unknown mode {other:?} (enforce or shadow)"),
                );
                false
            }
        };
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

    fn key_part(&mut self, path: &str, s: &str) -> Option<KeyPart> {
        Some(match s {
            "client" => KeyPart::Client,
            "ip" => KeyPart::Ip,
            "api_key" => KeyPart::ApiKey,
            "route" => KeyPart::Route,
            "global" => KeyPart::Global,
            other => match other.strip_prefix("header:") {
                Some(h) => KeyPart::Header(self.header_name(path, h.trim())?),
                None => {
                    self.err(
                        path,
                        format!("unknown key {other:?} (client, ip, api_key, route, global or header:<Name>)"),
                    );
                    return None;
                }
            },
        })
    }

    fn routes(
        &mut self,
        raw: &[RawRoute],
        raw_upstreams: &BTreeMap<String, RawUpstream>,
        upstreams: &[UpstreamConfig],
        raw_limiters: &BTreeMap<String, RawLimiter>,
        limiters: &[LimiterConfig],
    ) -> Vec<RouteConfig> {
        let upstream_index: HashMap<&str, usize> = upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| (u.name.as_str(), i))
            .collect();
        let limiter_index: HashMap<&str, usize> = limiters
            .iter()
            .enumerate()
            .map(|(i, l)| (l.name.as_str(), i))
            .collect();
        let mut names = HashSet::new();
        let mut out = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let at = |field: &str| format!("routes[{i}].{field}");
            if !names.insert(r.name.0.as_str()) {
                self.err(
                    at("name"),
                    format!("route name {:?} is used twice", r.name.0),
                );
            }
            if r.name.0.is_empty() {
                self.err(at("name"), "a route needs a name");
            }
            let m = &r.matcher;
            for (field, value) in [("path", &m.path), ("path_prefix", &m.path_prefix)] {
                if let Some(v) = value {
                    if !v.0.starts_with('/') {
                        self.err(
                            at(&format!("match.{field}")),
                            format!("{:?} must start with /", v.0),
                        );
                    }
                }
            }
            if m.path.is_some() && m.path_prefix.is_some() {
                self.err(at("match"), "use `path` or `path_prefix`, not both");
            }
            let methods = m.methods.as_ref().map(|ms| {
                ms.iter()
                    .enumerate()
                    .filter_map(|(j, t)| {
                        match Method::from_bytes(t.0.to_ascii_uppercase().as_bytes()) {
                            Ok(m) => Some(m),
                            Err(_) => {
                                self.err(
                                    at(&format!("match.methods[{j}]")),
                                    format!("invalid method {:?}", t.0),
                                );
                                None
                            }
                        }
                    })
                    .collect::<Vec<_>>()
            });
            let action = match (&r.upstream, &r.respond) {
                (Some(u), None) => match upstream_index.get(u.0.as_str()) {
                    Some(&idx) => Some(Action::Upstream(idx)),
                    None => {
                        if !raw_upstreams.contains_key(&u.0) {
                            self.err(at("upstream"), format!("no upstream named {:?}", u.0));
                        }
                        None
                    }
                },
                (None, Some(resp)) => match StatusCode::from_u16(resp.status) {
                    Ok(status) => Some(Action::Respond {
                        status,
                        body: resp.body.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
                        content_type: resp
                            .content_type
                            .as_ref()
                            .map(|t| t.0.clone())
                            .unwrap_or_else(|| "text/plain; charset=utf-8".into()),
                    }),
                    Err(_) => {
                        self.err(
                            at("respond.status"),
                            format!("invalid status {}", resp.status),
                        );
                        None
                    }
                },
                (Some(_), Some(_)) => {
                    self.err(
                        at("upstream"),
                        "a route has `upstream` or `respond`, not both",
                    );
                    None
                }
                (None, None) => {
                    self.err(
                        format!("routes[{i}]"),
                        "a route needs `upstream` or `respond`",
                    );
                    None
                }
            };
            let query: Vec<(String, String)> = m
                .query
                .iter()
                .flatten()
                .map(|(name, value)| (name.clone(), value.0.clone()))
                .collect();
            if query.iter().any(|(name, _)| name.is_empty()) {
                self.err(at("match.query"), "a query parameter needs a name");
            }
            let mut route_limiters = Vec::new();
            for (j, l) in r.limiters.iter().enumerate() {
                match limiter_index.get(l.0.as_str()) {
                    Some(&idx) => {
                        if route_limiters.contains(&idx) {
                            self.err(
                                at(&format!("limiters[{j}]")),
                                format!("limiter {:?} is listed twice", l.0),
                            );
                        }
                        route_limiters.push(idx)
                    }
                    None if raw_limiters.contains_key(&l.0) => {} // already reported
                    None => self.err(
                        at(&format!("limiters[{j}]")),
                        format!("no limiter named {:?}", l.0),
                    ),
                }
            }
            let reject = r.reject.as_ref().map(|x| self.reject(&at("reject"), x));
            let rate_limit_headers =
                self.header_sets(&at("rate_limit_headers"), r.rate_limit_headers.as_ref());
            if let Some(action) = action {
                out.push(RouteConfig {
                    reject,
                    rate_limit_headers,
                    name: r.name.0.clone(),
                    path: m.path.as_ref().map(|t| t.0.clone()),
                    path_prefix: m.path_prefix.as_ref().map(|t| t.0.clone()),
                    methods,
                    host: m.host.as_ref().map(|t| t.0.to_ascii_lowercase()),
                    query,
                    action,
                    limiters: route_limiters,
                });
            }
        }
        out
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Maps a document path such as `routes[1].limiters[0]` to its line and column.
mod locate {
    use std::collections::HashMap;
    use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
    use yaml_rust2::scanner::Marker;

    enum Frame {
        Map { prefix: String, key: Option<String> },
        Seq { prefix: String, index: usize },
    }

    #[derive(Default)]
    pub struct Index {
        marks: HashMap<String, (usize, usize)>,
        stack: Vec<Frame>,
    }

    impl Index {
        pub fn build(text: &str) -> Index {
            let mut index = Index::default();
            let _ = Parser::new_from_str(text).load(&mut index, false);
            index
        }

        /// The location of `path`, or of its closest ancestor that exists.
        pub fn find(&self, path: &str) -> Option<(usize, usize)> {
            let mut p = path;
            loop {
                if let Some(m) = self.marks.get(p) {
                    return Some(*m);
                }
                let cut = p.rfind(['.', '['])?;
                p = &p[..cut];
            }
        }

        /// The path the next node takes, and whether that node is a map key.
        fn next_path(&mut self) -> (Option<String>, bool) {
            match self.stack.last_mut() {
                None => (Some(String::new()), false),
                Some(Frame::Map { prefix, key }) => match key.take() {
                    None => (None, true),
                    Some(k) => (Some(join(prefix, &k)), false),
                },
                Some(Frame::Seq { prefix, index }) => {
                    let p = format!("{prefix}[{index}]");
                    *index += 1;
                    (Some(p), false)
                }
            }
        }
    }

    fn join(prefix: &str, key: &str) -> String {
        if prefix.is_empty() {
            key.to_string()
        } else {
            format!("{prefix}.{key}")
        }
    }

    impl MarkedEventReceiver for Index {
        fn on_event(&mut self, ev: Event, mark: Marker) {
            let pos = (mark.line(), mark.col() + 1);
            match ev {
                Event::Scalar(value, ..) => {
                    let (path, is_key) = self.next_path();
                    if is_key {
                        if let Some(Frame::Map { prefix, key }) = self.stack.last_mut() {
                            self.marks.entry(join(prefix, &value)).or_insert(pos);
                            *key = Some(value);
                        }
                    } else if let Some(p) = path {
                        self.marks.insert(p, pos);
                    }
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    let (path, _) = self.next_path();
                    let prefix = path.unwrap_or_default();
                    self.marks.entry(prefix.clone()).or_insert(pos);
                    self.stack.push(if matches!(ev, Event::MappingStart(..)) {
                        Frame::Map { prefix, key: None }
                    } else {
                        Frame::Seq { prefix, index: 0 }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    self.stack.pop();
                }
                Event::Alias(_) => {
                    self.next_path();
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../config.example.yaml");

    fn problems(yaml: &str) -> Vec<String> {
        match parse(yaml) {
            Ok(_) => vec![],
            Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn the_example_config_is_valid() {
        let c = parse(EXAMPLE).expect("example config parses");
        assert_eq!(c.routes[0].name, "ping");
        assert!(matches!(c.store.backend, Backend::Sqlite { .. }));
    }

    #[test]
    fn an_empty_file_gets_the_documented_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.server.listen, vec!["0.0.0.0:8080".parse().unwrap()]);
        assert_eq!(c.admin.listen, "127.0.0.1:9901".parse().unwrap());
        assert_eq!(c.server.max_request_body, 10 << 20);
        assert_eq!(c.store.flush_interval, Duration::from_millis(100));
        assert_eq!(c.identity.ipv6_prefix, 64);
    }

    #[test]
    fn store_max_keys_has_a_default_and_a_floor() {
        assert_eq!(parse("").unwrap().store.max_keys, DEFAULT_MAX_KEYS);
        let c = parse("store: { max_keys: 5000 }").unwrap();
        assert_eq!(c.store.max_keys, 5000);
        let errs = problems("store: { max_keys: 100 }");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("store.max_keys"), "{errs:?}");
        assert!(!problems("store: { max_keys: -1 }").is_empty());
    }

    #[test]
    fn a_misspelt_key_is_an_error_with_its_location() {
        let errs = problems("limiters:\n  strict:\n    limt: 5\n    window: 60s\n");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("unknown field `limt`"), "{errs:?}");
        assert!(errs[0].starts_with("line 3 column 5"), "{errs:?}");
    }

    #[test]
    fn a_route_naming_a_missing_limiter_or_upstream_is_rejected_with_locations() {
        let yaml = "routes:\n  - name: a\n    match: { path: /a }\n    upstream: nowhere\n    limiters: [missing]\n";
        let errs = problems(yaml);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs.iter()
                .any(|e| e.contains("line 4") && e.contains("no upstream named \"nowhere\"")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.contains("line 5") && e.contains("no limiter named \"missing\"")),
            "{errs:?}"
        );
    }

    #[test]
    fn every_error_is_reported_not_just_the_first() {
        let yaml = "identity:\n  trusted_proxies: [10.0.0.0/33]\nlimiters:\n  a: { algorithm: token_bucket, capacity: 0, refill_per_second: -1 }\n  b: { algorithm: fixed_window, limit: 5 }\n";
        let errs = problems(yaml);
        assert!(errs.len() >= 4, "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("invalid CIDR")));
        assert!(errs
            .iter()
            .any(|e| e.contains("fixed_window needs `window`")));
    }

    #[test]
    fn fields_that_do_not_apply_to_the_algorithm_are_errors() {
        let errs = problems("limiters:\n  a: { algorithm: token_bucket, capacity: 5, refill_per_second: 1, limit: 3 }\n");
        assert!(
            errs[0].contains("`limit` does not apply to token_bucket"),
            "{errs:?}"
        );
    }

    #[test]
    fn env_vars_are_expanded_and_an_unset_one_is_named() {
        assert_eq!(
            expand_env("a-${X}-b", |n| (n == "X").then(|| "1".into())),
            Ok("a-1-b".into())
        );
        let err = expand_env("${TOLLGATE_SURELY_UNSET}", |_| None).unwrap_err();
        assert!(err.contains("TOLLGATE_SURELY_UNSET"));
        let errs = problems("admin:\n  token: ${TOLLGATE_TEST_SURELY_UNSET_VAR}\n");
        assert!(
            errs[0].contains("TOLLGATE_TEST_SURELY_UNSET_VAR is not set"),
            "{errs:?}"
        );
    }

    #[test]
    fn sizes_and_durations_parse_in_operator_units() {
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert!(parse_size("10 parsecs").is_err());
        let c = parse("audit: { retention: 7d }\nserver: { shutdown_grace: 500ms }\n").unwrap();
        assert_eq!(c.audit.retention, Duration::from_secs(7 * 86_400));
        assert_eq!(c.server.shutdown_grace, Duration::from_millis(500));
    }

    #[test]
    fn the_admin_api_cannot_share_the_public_port() {
        let errs = problems(
            "server: { listen: \"0.0.0.0:8080\" }\nadmin: { listen: \"127.0.0.1:8080\" }\n",
        );
        assert!(
            errs[0].contains("admin API must never be on the public port"),
            "{errs:?}"
        );
    }

    #[test]
    fn a_yaml_syntax_error_has_a_location() {
        let errs = problems("server:\n  listen: [\"0.0.0.0:8080\"\nadmin: {}\n");
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("line "), "{errs:?}");
    }

    /// A self-signed pair in `dir`, as (cert, key) paths.
    fn tls_pair(dir: &Path, name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![format!("{name}.test")])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c.display().to_string(), k.display().to_string())
    }

    #[test]
    fn tls_listener_options_are_checked_with_their_locations() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = tls_pair(dir.path(), "a");
        let (_, other_key) = tls_pair(dir.path(), "b");
        let table: [(String, &str); 4] = [
            (
                format!("server:\n  tls: {{ cert: {cert}, key: {key}, redirect_plain: true }}\n"),
                "server.tls.redirect_plain: needs server.tls.listen",
            ),
            (
                format!("server:\n  listen: [\"127.0.0.1:8080\"]\n  tls: {{ cert: {cert}, key: {key}, listen: [\"127.0.0.1:8080\"] }}\n"),
                "server.tls.listen[0]: 127.0.0.1:8080 is also in server.listen",
            ),
            (
                format!("server:\n  tls: {{ cert: {cert}, key: {other_key} }}\n"),
                "server.tls.key: ",
            ),
            (
                format!("server:\n  tls:\n    certs:\n      - {{ cert: {cert}, key: {key} }}\n      - {{ cert: {cert}, key: /nonexistent.key }}\n"),
                "server.tls.certs[1].key: cannot read /nonexistent.key",
            ),
        ];
        for (yaml, expected) in table {
            let errs = problems(&yaml);
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected:?} not in {errs:?}"
            );
        }
        let errs = problems(&format!(
            "server:\n  tls: {{ cert: {cert}, key: {other_key} }}\n"
        ));
        assert!(
            errs[0].contains("does not match the certificate"),
            "{errs:?}"
        );
    }

    #[test]
    fn tls_listen_keeps_server_listen_plain_and_redirect_targets_the_first_tls_port() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = tls_pair(dir.path(), "a");
        let c = parse(&format!(
            "server:\n  listen: [\"127.0.0.1:8080\"]\n  tls: {{ cert: {cert}, key: {key} }}\n"
        ))
        .unwrap();
        assert_eq!(
            c.server.public(),
            vec![("127.0.0.1:8080".parse().unwrap(), Serve::Https)]
        );
        let c = parse(&format!("server:\n  listen: [\"127.0.0.1:8080\"]\n  tls: {{ cert: {cert}, key: {key}, listen: [\"127.0.0.1:8443\"], redirect_plain: true }}\n")).unwrap();
        assert_eq!(
            c.server.public(),
            vec![
                (
                    "127.0.0.1:8080".parse().unwrap(),
                    Serve::RedirectToHttps { port: 8443 }
                ),
                ("127.0.0.1:8443".parse().unwrap(), Serve::Https),
            ]
        );
    }

    #[test]
    fn a_route_that_only_limits_client_chosen_values_is_a_warning_naming_it() {
        let yaml = "limiters:\n  per_key: { limit: 5, window: 60s, key: api_key }\n  per_tenant: { limit: 5, window: 60s, key: [\"header:X-Tenant\", ip] }\n  per_ip: { limit: 5, window: 60s, key: ip }\nroutes:\n  - name: open\n    match: { path: /a }\n    respond: { status: 200 }\n    limiters: [per_key, per_tenant]\n  - name: held\n    match: { path: /b }\n    respond: { status: 200 }\n    limiters: [per_key, per_ip]\n";
        let c = parse(yaml).unwrap();
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        let w = c.warnings[0].to_string();
        assert!(w.starts_with("line 9 column"), "{w}");
        assert!(
            w.contains("\"open\"")
                && w.contains("per_key, per_tenant")
                && w.contains("keyed on `ip`"),
            "{w}"
        );
        // With keys verified, `api_key` holds; the header-keyed one still does not on its own.
        let verified = parse(&format!("identity: {{ api_keys: [k1] }}\n{yaml}")).unwrap();
        assert!(verified.warnings.is_empty(), "{:?}", verified.warnings);
        let unverified_override = parse("limiters:\n  l: { limit: 1, window: 1s, overrides: [{ key: vip, limit: 9 }, { key: 10.0.0.1, limit: 9 }] }\n").unwrap();
        assert_eq!(
            unverified_override.warnings.len(),
            1,
            "{:?}",
            unverified_override.warnings
        );
        assert!(unverified_override.warnings[0]
            .path
            .ends_with("overrides[0].key"));
    }

    #[test]
    fn api_keys_are_read_from_a_file_and_a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, "# partners\nk1\n\nsha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n").unwrap();
        let yaml = format!(
            "identity:\n  api_keys: [k0]\n  api_keys_file: {}\n",
            file.display()
        );
        let c = parse(&yaml).unwrap();
        assert_eq!(c.identity.api_keys.len(), 3);
        assert_eq!(
            c.identity.api_keys[2],
            ApiKeyEntry::parse(
                "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
            )
            .unwrap()
        );
        std::fs::write(&file, "k1\nsha256:nothex\n").unwrap();
        let errs = problems(&yaml);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains("line 2: `sha256:` must be followed by the 64 hex digits"),
            "{errs:?}"
        );
        assert!(
            errs[0].starts_with("line 3 column"),
            "located at identity.api_keys_file: {errs:?}"
        );
        let missing = problems("identity: { api_keys_file: /nonexistent/tollgate-keys }\n");
        assert!(
            missing[0].contains("cannot read /nonexistent/tollgate-keys"),
            "{missing:?}"
        );
        assert!(problems("identity: { api_keys: [\"sha256:12\"] }\n")[0]
            .contains("identity.api_keys[0]"));
    }

    #[test]
    fn upstream_tls_options_apply_to_https_only_and_a_ca_must_hold_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = tls_pair(dir.path(), "ca");
        let table: [(String, &str); 4] = [
            (format!("upstreams:\n  app: {{ url: \"http://a\", ca: {cert} }}\n"), "upstreams.app.ca: applies to https:// upstreams only"),
            ("upstreams:\n  app: { url: \"http://a\", insecure_skip_verify: true }\n".to_string(), "upstreams.app.insecure_skip_verify: applies to https://"),
            (format!("upstreams:\n  app: {{ url: \"https://a\", ca: {key} }}\n"), "no PEM certificate in it"),
            (format!("upstreams:\n  app: {{ url: \"https://a\", ca: {cert}, insecure_skip_verify: true }}\n"), "contradict"),
        ];
        for (yaml, expected) in table {
            let errs = problems(&yaml);
            assert!(
                errs.iter().any(|e| e.contains(expected)),
                "{expected:?} not in {errs:?}"
            );
        }
        let c = parse(&format!(
            "upstreams:\n  app: {{ url: \"https://a\", ca: {cert} }}\n"
        ))
        .unwrap();
        assert!(matches!(&c.upstreams[0].tls, UpstreamTls::Ca { certs, .. } if certs.len() == 1));
    }
}
