//! One immutable view of the running config: routes, identity rules, limiter instances, upstreams.
//!
//! A request loads the current snapshot once and finishes on it, so a reload
//! can never make one request mix two configs. Everything the hot path needs
//! is precomputed here: counters, override tables, header-ready names.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};

use crate::balance::Balancer;
use crate::config::{Action, Config, KeyPart, LimiterConfig, RouteConfig};
use crate::identity::{Client, Identity};
use crate::key::{self, StoreKey};
use crate::limiter::{Algorithm, Nanos};
use crate::metrics::{Counter, Decision, Histogram, Metrics, RouteSeries, SiteAnswer};
use crate::reject::PolicyCache;
use crate::router::Router;

pub struct Snapshot {
    pub version: u64,
    pub config: Arc<Config>,
    pub identity: Identity,
    /// Challenges and passes (`identity.pass`); `None` without one.
    pub challenge_gate: Option<crate::challenge::ChallengeGate>,
    pub router: Router,
    pub routes: Vec<Route>,
    pub limiters: Vec<Limiter>,
    pub upstreams: Vec<Arc<Balancer>>,
    /// `tollgate_upstream_duration_seconds`, parallel to `upstreams`.
    pub upstream_durations: Vec<Arc<Histogram>>,
    /// The request series of requests that matched no route.
    pub unrouted: RouteSeries,
    /// The shared response cache (`cache:`); the same one across reloads.
    pub cache: Option<Arc<crate::cache::ResponseCache>>,
    /// `identity.geoip`: ASN and country of an address; `None` without it.
    pub networks: Option<Arc<crate::networks::Networks>>,
    /// `identity.crowdsec`: its decisions and the bans pushed to it; `None` without it.
    pub crowdsec: Option<Arc<crate::crowdsec::CrowdSec>>,
}

pub struct Route {
    /// Shared, so an audit row takes it without a copy.
    pub name: Arc<str>,
    pub action: RouteAction,
    /// Indexes into `Snapshot::limiters`, in the order the route lists them.
    pub limiters: Vec<usize>,
    pub metrics: RouteMetrics,
    /// Its `RateLimit-Policy` field, once a response has written it.
    pub policy: PolicyCache,
    /// `cache:` — `None` unless the route is an upstream route that caches.
    pub cache: Option<crate::cache::RouteCache>,
}

pub enum RouteAction {
    Respond {
        status: StatusCode,
        body: Bytes,
        content_type: HeaderValue,
    },
    /// `redirect:`, answered with a `Location` (see [`crate::site::Redirect`]).
    Redirect(crate::site::Redirect),
    /// Index into `Snapshot::upstreams`.
    Upstream(usize),
}

pub struct RouteMetrics {
    /// `tollgate_requests_total` of this route, indexed by `Decision as usize`.
    pub requests: [Counter; Decision::ALL.len()],
    /// Request durations and response statuses.
    pub series: RouteSeries,
    /// `tollgate_site_answers_total` of this route, indexed by `SiteAnswer as usize`
    /// (registered only for the kinds the route or the site configures).
    pub site: [Counter; SiteAnswer::ALL.len()],
}

impl RouteMetrics {
    /// Counts one request of this route under `decision`.
    pub fn count(&self, decision: Decision) {
        crate::metrics::inc(&self.requests[decision as usize]);
    }

    /// Requests counted under `decision` so far.
    pub fn requests(&self, decision: Decision) -> u64 {
        self.requests[decision as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts one answer a site rule made.
    pub fn answered(&self, kind: SiteAnswer) {
        crate::metrics::inc(&self.site[kind as usize]);
    }

    /// Answers of `kind` so far.
    pub fn answers(&self, kind: SiteAnswer) -> u64 {
        self.site[kind as usize].load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub struct LimiterMetrics {
    pub allowed: Counter,
    pub delayed: Counter,
    pub rejected: Counter,
    pub would_reject: Counter,
    pub episode: Arc<crate::metrics::episode::Episode>,
    /// Refused outright because the key is banned.
    pub banned: Counter,
    /// `count:` — requests given back because their response did not count.
    pub not_counted: Counter,
    /// `ban:` — bans this limiter started.
    pub bans_started: Counter,
}

pub struct Limiter {
    pub name: Arc<str>,
    pub algorithm: Algorithm,
    pub key: Vec<KeyPart>,
    pub shadow: bool,
    /// `count:` — only responses that match count.
    pub count: Option<crate::limiter::count::CountRule>,
    /// `ban:` — and the span its strikes count in.
    pub ban: Option<(crate::limiter::ban::BanRule, Nanos)>,
    /// Its key names the sender (an address, a pass, a verified API key):
    /// it also counts requests that failed `auth` (see `decide`).
    pub names_sender: bool,
    /// Key value (as [`key::for_request`] builds it) → its own policy.
    overrides: HashMap<String, Algorithm>,
    /// [`Limiter::describe`] of `algorithm`, written once: a 429 only clones it.
    policy: Arc<str>,
    /// [`StoreKey::overflow`], built once.
    overflow_key: String,
    pub metrics: LimiterMetrics,
}

impl Snapshot {
    /// Builds the runtime view of `config`, reusing the upstream pools of
    /// `previous` that the new config leaves unchanged.
    pub fn build(
        config: Config,
        version: u64,
        previous: Option<&Snapshot>,
        metrics: &Metrics,
    ) -> Snapshot {
        let identity = Identity::new(&config.identity, previous.map(|p| &p.identity), metrics);
        crate::challenge::start_at_zero(metrics);
        let challenge_gate = config
            .identity
            .pass
            .as_ref()
            .and_then(|p| crate::challenge::ChallengeGate::new(p, metrics));
        let networks = config.identity.geoip.as_ref().map(|g| {
            let old = previous.and_then(|p| p.networks.as_deref());
            Arc::new(crate::networks::Networks::new(g, old, metrics))
        });
        let crowdsec = kept_crowdsec(&config, previous, metrics);
        let upstream_names: Vec<&str> = config.upstreams.iter().map(|u| u.name.as_str()).collect();
        metrics.start_at_zero(
            &upstream_names,
            config.store.backend.label(),
            config.store.error_policy(),
            config.store.on_error.as_str(),
        );
        let upstreams = kept_upstreams(&config, previous, metrics);
        let limiters = config
            .limiters
            .iter()
            .map(|l| Limiter::new(l, &identity, config.identity.has_key_source(), metrics))
            .collect();
        let routes = config
            .routes
            .iter()
            .map(|r| Route::new(r, &config.site, metrics))
            .collect();
        let cache = kept_cache(config.cache.as_ref(), previous, metrics);
        let upstream_durations = config
            .upstreams
            .iter()
            .map(|u| metrics.histogram(crate::metrics::UPSTREAM_DURATION, &[("upstream", &u.name)]))
            .collect();
        Snapshot {
            cache,
            networks,
            crowdsec,
            challenge_gate,
            upstream_durations,
            unrouted: metrics.route_series(crate::metrics::NO_ROUTE),
            version,
            router: Router::new(&config.routes),
            identity,
            routes,
            limiters,
            upstreams,
            config: Arc::new(config),
        }
    }
}

/// The upstream pools: `previous`'s where the new config leaves an
/// upstream unchanged (its connections stay warm), new ones otherwise.
fn kept_upstreams(
    config: &Config,
    previous: Option<&Snapshot>,
    metrics: &Metrics,
) -> Vec<Arc<Balancer>> {
    config
        .upstreams
        .iter()
        .map(|u| {
            previous
                .and_then(|p| p.upstreams.iter().find(|old| old.serves(u)).cloned())
                .unwrap_or_else(|| Arc::new(Balancer::new(u, metrics, config.server.workers)))
        })
        .collect()
}

/// The CrowdSec client, kept across a reload that leaves it unchanged:
/// its decisions and its queue stay.
fn kept_crowdsec(
    config: &Config,
    previous: Option<&Snapshot>,
    metrics: &Metrics,
) -> Option<Arc<crate::crowdsec::CrowdSec>> {
    config.identity.crowdsec.as_ref().map(|c| {
        previous
            .and_then(|p| p.crowdsec.clone())
            .filter(|old| old.serves(c))
            .unwrap_or_else(|| crate::crowdsec::CrowdSec::new(c, metrics))
    })
}

impl Snapshot {
    /// How a refusal on route `index` by limiter `limiter` (an index into
    /// `limiters`, which follow the config's order) looks: the route's `reject`, else the limiter's.
    pub fn reject_shape(
        &self,
        index: usize,
        limiter: usize,
    ) -> Option<&crate::config::RejectShape> {
        let config = &self.config;
        config.routes[index]
            .reject
            .as_ref()
            .or(config.limiters[limiter].reject.as_ref())
    }
}

impl Route {
    fn new(r: &RouteConfig, site: &crate::site::Rules, metrics: &Metrics) -> Route {
        let c = |decision: Decision| {
            metrics.counter(
                "tollgate_requests_total",
                &[("route", &r.name), ("decision", decision.as_str())],
            )
        };
        Route {
            name: Arc::from(r.name.as_str()),
            action: match &r.action {
                Action::Upstream(i) => RouteAction::Upstream(*i),
                Action::Respond {
                    status,
                    body,
                    content_type,
                } => RouteAction::Respond {
                    status: *status,
                    body: Bytes::from(body.clone()),
                    content_type: HeaderValue::from_str(content_type)
                        .unwrap_or(HeaderValue::from_static("text/plain")),
                },
                Action::Redirect(redirect) => RouteAction::Redirect(redirect.clone()),
            },
            limiters: r.limiters.clone(),
            metrics: RouteMetrics {
                // `error` is decided before a route is known: no series of its own here.
                requests: Decision::ALL.map(|d| match d {
                    Decision::Error => Counter::default(),
                    d => c(d),
                }),
                series: metrics.route_series(&r.name),
                site: site_counters(r, site, metrics),
            },
            policy: PolicyCache::default(),
            cache: match (&r.cache, &r.action) {
                (Some(c), Action::Upstream(_)) => {
                    Some(crate::cache::RouteCache::new(c.clone(), &r.name, metrics))
                }
                _ => None,
            },
        }
    }
}

/// A route's `tollgate_site_answers_total` series, registered only for the
/// kinds its rules (or the site's `access`) can answer, so a config without
/// site rules adds no series.
fn site_counters(
    r: &RouteConfig,
    site: &crate::site::Rules,
    metrics: &Metrics,
) -> [Counter; SiteAnswer::ALL.len()] {
    SiteAnswer::ALL.map(|kind| {
        let used = match kind {
            SiteAnswer::Redirect => matches!(r.action, Action::Redirect(_)),
            SiteAnswer::Respond => matches!(r.action, Action::Respond { .. }),
            SiteAnswer::Denied => r.site.access.is_some() || site.access.is_some(),
            SiteAnswer::Unauthenticated => r.site.auth.is_some(),
        };
        if used {
            metrics.counter(
                "tollgate_site_answers_total",
                &[("route", &r.name), ("kind", kind.as_str())],
            )
        } else {
            Counter::default()
        }
    })
}

impl Limiter {
    fn new(
        config: &LimiterConfig,
        identity: &Identity,
        keys_verified: bool,
        metrics: &Metrics,
    ) -> Limiter {
        let overrides = config
            .overrides
            .iter()
            .map(|o| {
                (
                    key::for_override(&config.key, &o.key, identity),
                    config.algorithm.with_limit(o.limit),
                )
            })
            .collect();
        let c = |result: &str| {
            metrics.counter(
                "tollgate_limiter_decisions_total",
                &[("limiter", &config.name), ("result", result)],
            )
        };
        Limiter {
            name: config.name.as_str().into(),
            algorithm: config.algorithm.clone(),
            key: config.key.clone(),
            shadow: config.shadow,
            count: config.count.clone(),
            ban: config
                .ban
                .clone()
                .and_then(|b| Some((b, config.algorithm.ban_window()?))),
            names_sender: config.key.iter().any(|p| p.names_sender(keys_verified)),
            overrides,
            policy: Limiter::describe_policy(&config.algorithm).into(),
            overflow_key: StoreKey::overflow(&config.name),
            metrics: LimiterMetrics {
                allowed: c("allowed"),
                delayed: c("delayed"),
                rejected: c("rejected"),
                would_reject: c("would_reject"),
                episode: metrics.episodes.of(&config.name),
                banned: c("banned"),
                not_counted: c("not_counted"),
                bans_started: metrics.counter("tollgate_bans_total", &[("limiter", &config.name)]),
            },
        }
    }

    /// The store key of this request (see [`key::for_request`]); `None`
    /// when the limiter does not apply to it.
    pub fn request_key(&self, client: &Client, route: &str, headers: &HeaderMap) -> Option<String> {
        key::for_request(&self.name, &self.key, client, route, headers)
    }

    /// The key value part of a store key this limiter built.
    pub fn value_of<'k>(&self, store_key: &'k str) -> &'k str {
        key::value_of(store_key)
    }

    /// The store key for a key value: `<limiter>:<key value>`.
    pub fn store_key(&self, key_value: &str) -> String {
        StoreKey::new(&self.name, key_value).to_key()
    }

    /// This limiter's overflow key (see [`crate::store::Check::overflow`]).
    pub fn overflow_key(&self) -> &str {
        &self.overflow_key
    }

    /// The policy for this key value: its override, or the limiter's own.
    pub fn algorithm_for(&self, key_value: &str) -> &Algorithm {
        if self.overrides.is_empty() {
            return &self.algorithm;
        }
        self.overrides.get(key_value).unwrap_or(&self.algorithm)
    }

    /// [`Limiter::describe_policy`] of `algorithm`, from the cache when it is
    /// this limiter's own (not an override's).
    pub fn describe(&self, algorithm: &Algorithm) -> Arc<str> {
        if std::ptr::eq(algorithm, &self.algorithm) {
            self.policy.clone()
        } else {
            Limiter::describe_policy(algorithm).into()
        }
    }

    /// The policy in words, for problem bodies: `5 requests per 60s`.
    pub fn describe_policy(algorithm: &Algorithm) -> String {
        algorithm.describe()
    }
}

/// The response cache of a new snapshot: a reload keeps the one in force
/// (and what it holds), resized in place to new bounds.
fn kept_cache(
    config: Option<&crate::config::cache::CacheConfig>,
    previous: Option<&Snapshot>,
    metrics: &Metrics,
) -> Option<Arc<crate::cache::ResponseCache>> {
    let c = config?;
    Some(match previous.and_then(|p| p.cache.clone()) {
        Some(kept) => {
            kept.reconfigure(c);
            kept
        }
        None => Arc::new(crate::cache::ResponseCache::new(c, metrics)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::identity::ApiKey;

    impl Limiter {
        fn key_value_for_test(
            &self,
            client: &Client,
            route: &str,
            headers: &HeaderMap,
        ) -> Option<String> {
            let key = self.request_key(client, route, headers)?;
            Some(self.value_of(&key).to_string())
        }
    }

    fn snapshot(yaml: &str) -> Snapshot {
        Snapshot::build(parse(yaml).unwrap(), 1, None, &Metrics::default())
    }

    fn client(ip: &str, key: Option<&str>) -> Client {
        Client {
            ip: ip.parse().unwrap(),
            ip_key: format!("ip:{ip}").into(),
            api_key: key.map(ApiKey::from_secret),
            key_verified: key.is_some(),
            peer_trusted: false,
            exempt: false,
            pass: None,
            network: Default::default(),
        }
    }

    #[test]
    fn composite_keys_join_their_parts_and_a_missing_part_skips_the_limiter() {
        let s = snapshot("limiters:\n  l: { limit: 1, window: 1s, key: [api_key, route] }\n");
        let l = &s.limiters[0];
        let with_key = l
            .key_value_for_test(
                &client("203.0.113.9", Some("k1")),
                "login",
                &HeaderMap::new(),
            )
            .unwrap();
        assert_eq!(
            with_key,
            format!("{}|route:login", ApiKey::from_secret("k1").id)
        );
        assert_eq!(
            l.key_value_for_test(&client("203.0.113.9", None), "login", &HeaderMap::new()),
            None
        );
    }

    #[test]
    fn an_override_for_an_api_key_matches_by_hash() {
        let s = snapshot("limiters:\n  l:\n    limit: 5\n    window: 60s\n    overrides: [{ key: premium, limit: 1000 }, { key: 203.0.113.9, limit: 7 }]\n");
        let l = &s.limiters[0];
        let premium = l
            .key_value_for_test(
                &client("198.51.100.1", Some("premium")),
                "r",
                &HeaderMap::new(),
            )
            .unwrap();
        assert!(!premium.contains("premium"));
        assert_eq!(l.algorithm_for(&premium), &l.algorithm.with_limit(1000));
        let by_ip = l
            .key_value_for_test(&client("203.0.113.9", None), "r", &HeaderMap::new())
            .unwrap();
        assert_eq!(l.algorithm_for(&by_ip), &l.algorithm.with_limit(7));
        assert_eq!(l.algorithm_for("ip:198.51.100.2"), &l.algorithm);
    }

    #[test]
    fn header_keys_are_readable_when_short_and_hashed_when_long() {
        let s = snapshot("limiters:\n  l: { limit: 1, window: 1s, key: \"header:X-Tenant\" }\n");
        let l = &s.limiters[0];
        let mut h = HeaderMap::new();
        h.insert("x-tenant", HeaderValue::from_static("acme"));
        assert_eq!(
            l.key_value_for_test(&client("203.0.113.9", None), "r", &h)
                .unwrap(),
            "h:acme"
        );
        h.insert("x-tenant", HeaderValue::from_str(&"x".repeat(100)).unwrap());
        assert!(l
            .key_value_for_test(&client("203.0.113.9", None), "r", &h)
            .unwrap()
            .starts_with("h:sha:"));
        assert_eq!(
            l.key_value_for_test(&client("203.0.113.9", None), "r", &HeaderMap::new()),
            None
        );
    }

    #[test]
    fn policies_are_described_in_operator_words() {
        let s = snapshot(include_str!("../config.example.yaml"));
        let by_name = |n: &str| s.limiters.iter().find(|l| *l.name == *n).unwrap();
        assert_eq!(
            Limiter::describe_policy(&by_name("strict").algorithm),
            "5 requests per 60s"
        );
        assert_eq!(
            Limiter::describe_policy(&by_name("burst").algorithm),
            "20 requests burst, refilled at 2/s"
        );
    }

    #[test]
    fn a_reload_keeps_the_pool_of_an_unchanged_upstream_and_renews_a_changed_one() {
        let yaml = |b: &str| {
            format!(
                "upstreams:\n  a: {{ url: \"http://127.0.0.1:9000\" }}\n  b: {{ url: \"{b}\" }}\n"
            )
        };
        let metrics = Metrics::default();
        let old = Snapshot::build(
            parse(&yaml("http://127.0.0.1:9001")).unwrap(),
            1,
            None,
            &metrics,
        );
        let new = Snapshot::build(
            parse(&yaml("http://127.0.0.1:9002")).unwrap(),
            2,
            Some(&old),
            &metrics,
        );
        assert!(
            Arc::ptr_eq(&old.upstreams[0], &new.upstreams[0]),
            "a: unchanged, pool kept warm"
        );
        assert!(
            !Arc::ptr_eq(&old.upstreams[1], &new.upstreams[1]),
            "b: new URL, new pool"
        );
    }
}
