//! `server.proxy_protocol`, `identity.geoip`, `identity.crowdsec` and the `asn:`/`country:` route matches: raw YAML → validated config, pure; the files they name are read by the loader (`load.rs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;

use super::raw::{RawCrowdsec, RawGeoip, RawPush};
use super::{dur, KeyPart, LimiterConfig, OneOrMany, RouteConfig, Text, Validator};

/// GeoIP databases (MaxMind DB format), each optional; the loader reads them.
#[derive(Debug, Clone)]
pub struct GeoipConfig {
    pub asn_db: Option<GeoFile>,
    pub country_db: Option<GeoFile>,
    pub check_every: Duration,
}

/// One database file and, once the loader read it, its content.
#[derive(Clone)]
pub struct GeoFile {
    pub path: PathBuf,
    /// Empty straight out of `validate`.
    pub loaded: Arc<crate::geodb::GeoDb>,
}

impl std::fmt::Debug for GeoFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GeoFile({})", self.path.display())
    }
}

/// The Local API of a CrowdSec agent: where decisions are pulled from and,
/// with `push`, where tollgate's own bans go.
#[derive(Debug, Clone, PartialEq)]
pub struct CrowdsecConfig {
    pub url: Uri,
    pub api_key_file: PathBuf,
    /// The bouncer key, read by the loader (empty straight out of `validate`).
    pub api_key: String,
    pub poll_every: Duration,
    pub timeout: Duration,
    /// Decisions held at most; past it new ones are dropped and counted.
    pub max_decisions: usize,
    pub push: Option<PushConfig>,
}

/// A CrowdSec machine (watcher) tollgate logs in as to push its bans.
#[derive(Debug, Clone, PartialEq)]
pub struct PushConfig {
    pub machine_id: String,
    pub password_file: PathBuf,
    /// Read by the loader (empty straight out of `validate`).
    pub password: String,
    /// Bans waiting to be pushed at most; past it they are dropped and counted.
    pub queue: usize,
}

/// Defaults: a poll every 10s (CrowdSec's own bouncers default to 10s), 2s per call.
pub const DEFAULT_POLL_EVERY: Duration = Duration::from_secs(10);
pub const DEFAULT_CROWDSEC_TIMEOUT: Duration = Duration::from_secs(2);
/// 200,000 decisions: a community blocklist and a busy site's own, ~12 MB
/// held (`cargo bench --bench crowdsec_memory` measures 100,000).
pub const DEFAULT_MAX_DECISIONS: usize = 200_000;
pub const DEFAULT_PUSH_QUEUE: usize = 1_000;

impl Validator<'_> {
    pub(super) fn geoip(&mut self, raw: Option<&RawGeoip>) -> Option<GeoipConfig> {
        let raw = raw?;
        let file = |t: &Option<Text>| {
            t.as_ref().map(|t| GeoFile {
                path: PathBuf::from(&t.0),
                loaded: Arc::default(),
            })
        };
        let config = GeoipConfig {
            asn_db: file(&raw.asn_db),
            country_db: file(&raw.country_db),
            check_every: dur(raw.check_every, Duration::from_secs(60)),
        };
        if config.asn_db.is_none() && config.country_db.is_none() {
            self.err("identity.geoip", "name `asn_db`, `country_db` or both");
        }
        if config.check_every.is_zero() {
            self.err("identity.geoip.check_every", "must be greater than zero");
        }
        Some(config)
    }

    pub(super) fn crowdsec(&mut self, raw: Option<&RawCrowdsec>) -> Option<CrowdsecConfig> {
        let raw = raw?;
        let at = |field: &str| format!("identity.crowdsec.{field}");
        let url = match raw.url.as_ref().map(|t| t.0.parse::<Uri>()) {
            Some(Ok(u))
                if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() =>
            {
                u
            }
            Some(_) => {
                self.err(
                    at("url"),
                    "the Local API's http:// or https:// URL, e.g. http://127.0.0.1:8080",
                );
                return None;
            }
            None => {
                self.err(at("url"), "the Local API's URL is needed");
                return None;
            }
        };
        let Some(api_key_file) = raw.api_key_file.as_ref().map(|t| PathBuf::from(&t.0)) else {
            self.err(
                at("api_key_file"),
                "a file holding the bouncer key (`cscli bouncers add tollgate -o raw`) is needed",
            );
            return None;
        };
        let poll_every = dur(raw.poll_every, DEFAULT_POLL_EVERY);
        let timeout = dur(raw.timeout, DEFAULT_CROWDSEC_TIMEOUT);
        for (field, d) in [("poll_every", poll_every), ("timeout", timeout)] {
            if d.is_zero() {
                self.err(at(field), "must be greater than zero");
            }
        }
        let max_decisions = raw
            .max_decisions
            .map_or(DEFAULT_MAX_DECISIONS, |n| n as usize);
        if max_decisions == 0 {
            self.err(at("max_decisions"), "must be at least 1");
        }
        Some(CrowdsecConfig {
            url,
            api_key_file,
            api_key: String::new(),
            poll_every,
            timeout,
            max_decisions,
            push: raw.push.as_ref().and_then(|p| self.crowdsec_push(p)),
        })
    }

    fn crowdsec_push(&mut self, raw: &RawPush) -> Option<PushConfig> {
        let at = |field: &str| format!("identity.crowdsec.push.{field}");
        let machine_id = raw.machine_id.as_ref().map(|t| t.0.clone());
        let password_file = raw.password_file.as_ref().map(|t| PathBuf::from(&t.0));
        let (Some(machine_id), Some(password_file)) = (machine_id, password_file) else {
            self.err(
                at("machine_id"),
                "pushing bans needs a machine: `machine_id` and `password_file` (`cscli machines add`)",
            );
            return None;
        };
        let queue = raw.queue.map_or(DEFAULT_PUSH_QUEUE, |n| n as usize);
        if queue == 0 {
            self.err(at("queue"), "must be at least 1");
        }
        Some(PushConfig {
            machine_id,
            password_file,
            password: String::new(),
            queue,
        })
    }

    /// `match.asn`: numbers, written `13335` or `AS13335`.
    pub(super) fn route_asn(&mut self, i: usize, raw: Option<&OneOrMany>) -> Option<Vec<u32>> {
        let entries = raw?.entries(&format!("routes[{i}].match.asn"));
        let parsed = entries.into_iter().filter_map(|(path, s)| {
            let digits = s.trim().trim_start_matches("AS").trim_start_matches("as");
            match digits.parse::<u32>() {
                Ok(n) => Some(n),
                Err(_) => {
                    self.err(
                        path,
                        format!("{s:?} is not an AS number (e.g. 13335 or AS13335)"),
                    );
                    None
                }
            }
        });
        Some(parsed.collect())
    }

    /// `match.country`: ISO 3166 two-letter codes, any case.
    pub(super) fn route_country(
        &mut self,
        i: usize,
        raw: Option<&OneOrMany>,
    ) -> Option<Vec<crate::geodb::Country>> {
        let entries = raw?.entries(&format!("routes[{i}].match.country"));
        let parsed =
            entries.into_iter().filter_map(|(path, s)| {
                match crate::geodb::Country::parse(s.trim()) {
                    Some(c) => Some(c),
                    None => {
                        self.err(
                            path,
                            format!("{s:?} is not a two-letter country code (e.g. DE)"),
                        );
                        None
                    }
                }
            });
        Some(parsed.collect())
    }

    /// `key: asn` / `key: country` and the matches on them need the database
    /// that answers them.
    pub(super) fn need_geoip(
        &mut self,
        geoip: Option<&GeoipConfig>,
        routes: &[RouteConfig],
        limiters: &[LimiterConfig],
    ) {
        let asn = geoip.is_some_and(|g| g.asn_db.is_some());
        let country = geoip.is_some_and(|g| g.country_db.is_some());
        for l in limiters {
            for (part, has, db) in [
                (KeyPart::Asn, asn, "asn_db"),
                (KeyPart::Country, country, "country_db"),
            ] {
                if l.key.contains(&part) && !has {
                    self.err(
                        format!("limiters.{}.key", l.name),
                        format!("`{part}` needs `identity.geoip.{db}`"),
                    );
                }
            }
        }
        for (i, r) in routes.iter().enumerate() {
            if r.asn.is_some() && !asn {
                self.err(
                    format!("routes[{i}].match.asn"),
                    "needs `identity.geoip.asn_db`",
                );
            }
            if r.country.is_some() && !country {
                self.err(
                    format!("routes[{i}].match.country"),
                    "needs `identity.geoip.country_db`",
                );
            }
            if let Some(a) = &r.site.access {
                self.need_geoip_for_access(geoip, &format!("routes[{i}].access"), a);
            }
        }
    }

    /// A crawler verified by `asn` needs the database that answers it.
    pub(super) fn need_geoip_for_crawlers(
        &mut self,
        geoip: Option<&GeoipConfig>,
        pass: Option<&super::PassConfig>,
    ) {
        let Some(pass) = pass else { return };
        let has = geoip.is_some_and(|g| g.asn_db.is_some());
        for (i, rule) in pass.crawlers.verify.iter().enumerate() {
            if !rule.asn.is_empty() && !has {
                self.err(
                    format!("identity.pass.crawlers.verify[{i}].asn"),
                    "needs `identity.geoip.asn_db`",
                );
            }
        }
    }

    /// `asn:` and `country:` entries of `access` (at `at`) need the database
    /// that answers them.
    pub(super) fn need_geoip_for_access(
        &mut self,
        geoip: Option<&GeoipConfig>,
        at: &str,
        access: &crate::site::Access,
    ) {
        let (names_asn, names_country) = access.names();
        if names_asn && geoip.is_none_or(|g| g.asn_db.is_none()) {
            self.err(at, "an `asn:` entry needs `identity.geoip.asn_db`");
        }
        if names_country && geoip.is_none_or(|g| g.country_db.is_none()) {
            self.err(at, "a `country:` entry needs `identity.geoip.country_db`");
        }
    }
}
