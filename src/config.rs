//! Configuration: the validated types the proxy runs on, and the way in (`load_file`, `parse`).
//!
//! A config travels in three steps, one file each:
//! - [`raw`]: the YAML as serde reads it (unknown keys rejected), `Raw*`
//!   types that mirror what a human wrote, with strings and options;
//! - [`validate`]: raw → [`Config`], every name resolved to an index and every
//!   value checked, each problem with its YAML path; pure, so a table of
//!   documents tests every rule;
//! - `load`: everything that touches the outside world — reading the config
//!   file, resolving listen names, reading the certificate, CA, token and API
//!   key files — reporting its problems in the same path format.
//!
//! [`parse`] runs all three and reports *every* problem with its YAML line
//! and column (`locate`), the way `nginx -t` does, so an operator fixes a
//! config in one pass.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode, Uri};
use ipnet::IpNet;

use crate::limiter::Algorithm;
pub use certs::{CertConfig, CertSet, UpstreamTls};

/// Certificate pairs and CA bundles, read and checked as config data.
pub mod acme;
pub mod certs;
pub mod raw;
pub mod validate;

mod error;
/// serde's messages in YAML terms, at the key's own path.
mod explain;
mod load;
mod locate;
/// Duplicate keys and nesting depth, checked on the text before serde reads it.
mod scan;

mod admin_token;
/// `cache` and `routes[].cache`.
pub mod cache;
/// `identity.pass` and `routes[].challenge`.
pub mod challenge;
mod lease;
mod observe;
mod protect;
/// `server.proxy_protocol`, `identity.geoip`, `identity.crowdsec`, `match.asn` / `match.country`.
pub mod reputation;
/// `store:`: the keys every store has and one section per backend.
pub mod store;
/// "Did you mean …?" over the names a config defines.
mod suggest;

pub mod balance;
mod bodies;
mod fastcgi;
/// `path_regex`, `redirect`, `rewrite`, `access`, `auth`, `headers`.
pub mod site;

pub use balance::{BalanceConfig, HealthCheck, Policy};
pub use bodies::{BodyConfig, LingeringConfig};
pub use challenge::{
    ChallengeConfig, ChallengeMode, ChallengeWhen, CrawlerConfig, PassConfig, PassKey, PassKeys,
    UnverifiedCrawlers, VerifyRule, ISSUE_LIMITER,
};
pub use error::{ConfigError, ConfigProblem};
pub use fastcgi::{FastCgiAddress, FastCgiConfig};
pub use load::{
    check_file_within, load_file, load_file_text, parse, read_named_file, require_routes, survey,
    CONFIG_FILE_LIMIT, KEYS_FILE_LIMIT, PAGE_FILE_LIMIT, SMALL_FILE_LIMIT,
};
pub use observe::{
    ErrorAnswers, ErrorFormat, ErrorPage, HeaderSets, LogConfig, LogFormat, RefusalLog, RejectBody,
    RejectShape, OWN_ERROR_STATUSES,
};
pub use raw::{expand_env, parse_size, Dur, OneOrMany, RawConfig, Size, Text, MAX_DURATION};
pub use reputation::{CrowdsecConfig, GeoFile, GeoipConfig, PushConfig};
pub use store::memory::MemoryConfig;
pub use store::redis::{RedisConfig, RedisTopology};
pub use store::sqlite::SqliteConfig;
pub use store::{BackendConfig, StoreConfig, DEFAULT_MAX_KEYS, MIN_MAX_KEYS};
pub use validate::{validate, Host};

// The section files (balance, fastcgi, observe, protect) extend the validator.
use validate::{dur, nanos, Validator};

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
    /// `allow_no_routes`: a config file without routes is loaded (else refused).
    pub allow_no_routes: bool,
    /// Site-wide `access` and `headers` (its `auth` and `rewrite` stay `None`).
    pub site: crate::site::Rules,
    /// `cache`: the shared response cache, when the section is there or a route caches.
    pub cache: Option<cache::CacheConfig>,
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
    /// What a path with `%2F`, `%5C` or `\` gets (`server.encoded_separators`).
    pub encoded_separators: EncodedSeparators,
    /// Header names with `_` are forwarded (`server.underscores_in_headers`); off: dropped.
    pub underscores_in_headers: bool,
    /// `server.error_format` and `server.error_pages`: how tollgate's own errors are written.
    pub errors: ErrorAnswers,
    /// gzip/brotli for text responses (`server.compression`); a route can turn it off.
    pub compression: bool,
    /// `server.proxy_protocol`: peers whose connections open with a PROXY header.
    pub proxy_protocol: Vec<IpNet>,
}

/// `server.encoded_separators`: a path separator spelled so that the router
/// would not see it (`%2F`, `%5C`, a raw `\`) is refused, or routed as the
/// upstream resolves it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EncodedSeparators {
    /// `400`: nginx, `php -S` and php-fpm behind tollgate would run another script than the one routed.
    #[default]
    Reject,
    /// `%2F` is routed as `/` (what nginx, `php -S` and tollgate's FastCGI
    /// run); `%5C` and `\` are plain characters, as on the POSIX systems those run on.
    Decode,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    pub certs: Vec<CertConfig>,
    /// The pairs, read and checked when the config was loaded (empty straight out of `validate`).
    pub loaded: Arc<CertSet>,
    /// TLS addresses; empty = every `server.listen` address serves TLS.
    pub listen: Vec<SocketAddr>,
    /// Plain listeners answer 308 to https:// (only with `listen`).
    pub redirect_plain: bool,
    /// Automatic HTTPS for these names (`server.tls.acme`).
    pub acme: Option<acme::AcmeConfig>,
    /// `Strict-Transport-Security` on TLS responses (`server.tls.hsts`).
    pub hsts: Option<acme::HstsConfig>,
}

/// What a public listener serves (plain, TLS, or a redirect to TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    Http,
    Https,
    /// Plain HTTP that answers 308 to the https:// listener on this port.
    RedirectToHttps {
        port: u16,
    },
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
    /// `lease:` — reserve units from the Redis store (see `limiter/lease.rs`).
    pub lease: Option<crate::limiter::lease::Lease>,
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
    /// `allow_unlimited`: a reload may take every limiter off this route.
    pub allow_unlimited: bool,
    /// `error_format` and `error_pages` of this route (over the server's).
    pub errors: ErrorAnswers,
    /// `compression`: this route's responses may be compressed (and `server.compression` is on).
    pub compression: bool,
    /// `challenge`: browsers without a pass get a proof-of-work page.
    pub challenge: Option<ChallengeConfig>,
    /// `match.path_regex`, compiled once for the config's life.
    pub path_regex: Option<regex::Regex>,
    /// `match.query_regex`, on the query string as sent.
    pub query_regex: Option<regex::Regex>,
    /// `access`, `auth`, `headers`, `rewrite` (each `None` unless configured).
    pub site: crate::site::Rules,
    /// `cache`: this route's answers are stored in and served from the shared cache.
    pub cache: Option<cache::RouteCacheConfig>,
    /// `match.asn`: the client's AS is one of these.
    pub asn: Option<Vec<u32>>,
    /// `match.country`: the client's country is one of these.
    pub country: Option<Vec<crate::geodb::Country>>,
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
    /// `redirect:`, answered by tollgate.
    Redirect(crate::site::Redirect),
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
    /// `identity.pass`: the secrets that sign challenges and passes.
    pub pass: Option<PassConfig>,
    /// `identity.geoip`: the ASN and country databases.
    pub geoip: Option<GeoipConfig>,
    /// `identity.crowdsec`: the Local API whose decisions apply.
    pub crowdsec: Option<CrowdsecConfig>,
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

/// One part of a limiter's key (`key:` in the config).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    Client,
    Ip,
    ApiKey,
    Route,
    Global,
    Header(HeaderName),
    /// A verified pass (a solved challenge); without one, the client's IP.
    Pass,
    /// The client's autonomous system (`identity.geoip.asn_db`).
    Asn,
    /// The client's country (`identity.geoip.country_db`).
    Country,
}

impl KeyPart {
    /// Whether a client can pick this part's value freely (and so get a
    /// fresh counter per value): a header always; an API key unless keys are
    /// verified against `identity.api_keys` / `api_keys_file`.
    pub fn chosen_by_client(&self, keys_verified: bool) -> bool {
        match self {
            KeyPart::Header(_) => true,
            KeyPart::ApiKey => !keys_verified,
            // A pass is signed by tollgate and costs a solved challenge.
            // A network is the database's answer for the client's address.
            KeyPart::Client
            | KeyPart::Ip
            | KeyPart::Route
            | KeyPart::Global
            | KeyPart::Pass
            | KeyPart::Asn
            | KeyPart::Country => false,
        }
    }
}

impl KeyPart {
    /// Whether this part names the sender of the request (its address, its
    /// pass, its verified API key): a key with one such part counts the
    /// sender's own requests, never a victim's.
    pub fn names_sender(&self, keys_verified: bool) -> bool {
        match self {
            KeyPart::Client | KeyPart::Ip | KeyPart::Pass => true,
            KeyPart::ApiKey => keys_verified,
            // A whole network or country: every client in it shares the key.
            KeyPart::Route
            | KeyPart::Global
            | KeyPart::Header(_)
            | KeyPart::Asn
            | KeyPart::Country => false,
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
            KeyPart::Pass => f.write_str("pass"),
            KeyPart::Asn => f.write_str("asn"),
            KeyPart::Country => f.write_str("country"),
        }
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

    /// Every limiter whose state the store keeps: the configured ones and
    /// tollgate's own (the limit on issuing passes), so a start loads and a
    /// prune keeps the state of both.
    pub fn stored_limiters(&self) -> Vec<LimiterConfig> {
        let mut all = self.limiters.clone();
        all.extend(self.identity.pass.as_ref().map(PassConfig::issue_limiter));
        all
    }

    /// Whether a request's record keeps its path: only a reader of the path
    /// (an access-log line, an audit row) is worth its copy on every request.
    /// A new reader of `AccessRecord::path` is added here, or it reads `""`.
    pub fn keeps_request_path(&self) -> bool {
        self.log.access || self.audit.enabled
    }
}

#[cfg(test)]
mod tests;
