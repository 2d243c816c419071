//! The YAML schema as serde reads it (unknown keys rejected); [`values`] reads the values operators write in it (`${ENV}` text, durations, sizes, one-or-many lists).
//!
//! Nothing here is checked beyond its shape: `Raw*` mirror what a human
//! wrote, with strings and options; [`super::validate`] turns them into
//! [`super::Config`].

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{balance, observe};

mod limiter;
mod reputation;
mod site;
mod values;

pub use super::store::redis::RawSentinel;
pub use super::store::{RawBackend, RawRedis, RawSqlite, RawStore};
pub use limiter::{RawLimiter, RawOverride, Written};
pub use reputation::{RawCrowdsec, RawGeoip, RawPush};
pub use site::{RawAccess, RawAuth, RawBasic, RawHeaderRules, RawHeaders, RawRedirect, RawRewrite};
pub use values::{
    expand_env, parse_duration, parse_size, Dur, OneOrMany, RawWorkers, Size, Text, MAX_DURATION,
};

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
