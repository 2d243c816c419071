//! Validation: the raw YAML schema → [`Config`], every problem with its YAML path, and no I/O.
//!
//! Validation reads no file, resolves no name and asks no clock: what it
//! needs to know about the machine comes in as a [`Host`], and the files a
//! config names (certificates, CA bundles, the API key file, the admin token
//! file) are read afterwards by [`super::load`]. So a table of YAML
//! documents and their expected problems is a test of every rule, and the
//! same config validates the same way on any machine.
//!
//! One section per file: `server` (listeners, TLS, admin), `upstreams`,
//! `limiters`, `routes`; the identity section is small and lives
//! here. `balance`, `fastcgi`, `observe`, `protect` and `store` (beside this folder)
//! add the sections they own to the same [`Validator`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;

use super::raw::{Dur, RawConfig, RawIdentity, Text};
use super::{
    ApiKeyEntry, AuditConfig, Config, ConfigError, ConfigProblem, IdentityConfig, LimiterConfig,
    RouteConfig, UpstreamConfig,
};
use crate::limiter::Nanos;

mod limiters;
mod routes;
mod server;
mod upstreams;
mod warnings;

pub(in crate::config) use warnings::position;

#[cfg(test)]
mod tests;

/// What validation needs to know about the machine, gathered beforehand by
/// the loader (see `load::survey`) so that validating is a pure function.
#[derive(Debug, Clone)]
pub struct Host {
    /// The worker threads `server.workers: auto` means (the cores available).
    pub cores: usize,
    /// Listen addresses written as a name (`localhost:8080`), as DNS
    /// answered them; a name missing here is an invalid address. Addresses
    /// written as IP:port need no entry.
    pub resolved: HashMap<String, SocketAddr>,
}

/// Validates a raw config. On success the config is complete except for
/// what the files it names hold: TLS pairs and CA bundles are listed but not
/// read (`TlsConfig::loaded` is empty, `UpstreamTls::Ca` has no
/// certificates), and neither is `admin.token_file` or
/// `identity.api_keys_file`; [`super::parse`] reads them. Problems and
/// warnings carry their YAML path but no line yet.
pub fn validate(raw: &RawConfig, host: &Host) -> Result<Config, ConfigError> {
    let checked = check(raw, host);
    if checked.problems.is_empty() {
        Ok(checked.config)
    } else {
        Err(ConfigError::new(checked.problems))
    }
}

/// Everything validation found, also when it found problems: the loader
/// still reads the certificates of an invalid config, so one `check` names
/// a broken file together with a misspelt limit.
pub(in crate::config) struct Checked {
    /// Complete only when `problems` is empty; warnings are in it.
    pub config: Config,
    /// The YAML path of each `server.tls` pair, in `TlsConfig::certs` order.
    pub cert_paths: Vec<String>,
    pub problems: Vec<ConfigProblem>,
}

/// Runs every rule over `raw`, collecting every problem (not only the first).
pub(in crate::config) fn check(raw: &RawConfig, host: &Host) -> Checked {
    let mut v = Validator {
        host,
        problems: Vec::new(),
        warnings: Vec::new(),
        cert_paths: Vec::new(),
    };
    let mut config = v.config(raw);
    config.warnings = v.warnings;
    Checked {
        config,
        cert_paths: v.cert_paths,
        problems: v.problems,
    }
}

/// Collects the problems and warnings of one document while its sections are validated.
pub(in crate::config) struct Validator<'a> {
    host: &'a Host,
    pub(in crate::config) problems: Vec<ConfigProblem>,
    warnings: Vec<ConfigProblem>,
    cert_paths: Vec<String>,
}

pub(in crate::config) fn dur(d: Option<Dur>, default: Duration) -> Duration {
    d.map(|d| d.0).unwrap_or(default)
}

/// Whether a name (of a route, upstream or limiter) keeps to letters,
/// digits, `_` and `-`: names appear in log lines, metric labels and URLs,
/// where anything else (a newline above all) could forge or break a record.
pub(in crate::config) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(in crate::config) fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Validator<'_> {
    pub(in crate::config) fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.problems.push(ConfigProblem::at(path, message));
    }

    pub(super) fn warn(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(ConfigProblem::at(path, message));
    }

    fn config(&mut self, raw: &RawConfig) -> Config {
        let mut server = self.server(&raw.server);
        let admin = self.admin(&raw.admin, &server);
        let store = self.store(&raw.store);
        let audit = AuditConfig {
            enabled: raw.audit.enabled.unwrap_or(true),
            retention: dur(raw.audit.retention, Duration::from_secs(7 * 86_400)),
        };
        let identity = self.identity(&raw.identity);
        let (upstreams, limiters) = self.named(raw);
        let routes = self.routes(
            &raw.routes,
            &raw.upstreams,
            &upstreams,
            &raw.limiters,
            &limiters,
        );
        self.across(raw, &identity, &routes, &limiters);
        if let Some(acme) = server.tls.as_mut().and_then(|t| t.acme.as_mut()) {
            let hosts = routes.iter().filter_map(|r| r.host.clone());
            self.acme_domains_from_routes(acme, hosts);
            self.acme_fleet(acme, store.backend.shared());
        }
        let log = self.log(&raw.log);
        let site = self.site_wide(raw, &identity);
        let cache = self.cache(raw.cache.as_ref(), routes.iter().any(|r| r.cache.is_some()));
        Config {
            site,
            cache,
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
            allow_no_routes: raw.allow_no_routes.unwrap_or(false),
        }
    }

    /// The named upstreams and limiters, in the order written; the ones
    /// with a problem are left out, and the routes' references to them
    /// are reported where the routes are read.
    fn named(&mut self, raw: &RawConfig) -> (Vec<UpstreamConfig>, Vec<LimiterConfig>) {
        let upstreams = raw
            .upstreams
            .iter()
            .filter_map(|(name, u)| {
                if self.upstream_name(name) {
                    self.upstream(name, u)
                } else {
                    None
                }
            })
            .collect();
        let limiters = raw
            .limiters
            .iter()
            .filter_map(|(name, l)| self.limiter(name, l))
            .collect();
        (upstreams, limiters)
    }

    /// What one section needs of another: a `pass` or a GeoIP database for
    /// the keys and matches that read them, and the warnings that only the
    /// whole config can give.
    fn across(
        &mut self,
        raw: &RawConfig,
        identity: &IdentityConfig,
        routes: &[RouteConfig],
        limiters: &[LimiterConfig],
    ) {
        self.need_pass(identity.pass.as_ref(), routes, limiters);
        self.need_geoip(identity.geoip.as_ref(), routes, limiters);
        self.need_geoip_for_crawlers(identity.geoip.as_ref(), identity.pass.as_ref());
        self.warn_all(&raw.routes, routes, limiters, identity.has_key_source());
    }

    /// The top-level `access` and `headers`, which every route's answers go through.
    fn site_wide(&mut self, raw: &RawConfig, identity: &IdentityConfig) -> crate::site::Rules {
        let site = crate::site::Rules {
            access: raw.access.as_ref().map(|a| self.access("access", a)),
            headers: raw.headers.as_ref().map(|h| self.headers("headers", h)),
            ..Default::default()
        };
        if let Some(a) = &site.access {
            self.need_geoip_for_access(identity.geoip.as_ref(), "access", a);
        }
        site
    }

    pub(in crate::config) fn cidrs(&mut self, path: &str, raw: &[Text]) -> Vec<IpNet> {
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

    pub(super) fn header_name(&mut self, path: &str, s: &str) -> Option<HeaderName> {
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
            // Read by the loader once the config is valid (`load::read_key_file`).
            api_keys_file: raw
                .api_keys_file
                .as_ref()
                .map(|t| (PathBuf::from(&t.0), Arc::from(&b""[..]))),
            unknown_key_limit: unknown_key_limit.max(1),
            unknown_key_window: unknown_key_window.max(Duration::from_millis(1)),
            trusted_proxies: self.cidrs("identity.trusted_proxies", &raw.trusted_proxies),
            ipv6_prefix: ipv6_prefix.clamp(1, 128),
            exempt: self.cidrs("identity.exempt", &raw.exempt),
            pass: self.pass(raw.pass.as_ref()),
            geoip: self.geoip(raw.geoip.as_ref()),
            crowdsec: self.crowdsec(raw.crowdsec.as_ref()),
        }
    }
}
