//! Validation of `routes`: the name, the match, the action (an upstream or a local answer), the limiters by name.

use std::collections::{BTreeMap, HashMap, HashSet};

use http::{Method, StatusCode};

use super::{valid_name, Validator};
use crate::config::cache::RouteCacheConfig;
use crate::config::raw::{RawLimiter, RawMatch, RawRespond, RawRoute, RawUpstream, Text};
use crate::config::suggest;
use crate::config::{Action, LimiterConfig, RouteConfig, UpstreamConfig};

/// What a route names: the upstreams and limiters as written (to tell a
/// missing one from one already reported) and as validated (by index).
struct RouteRefs<'a> {
    upstream_index: HashMap<&'a str, usize>,
    raw_upstreams: &'a BTreeMap<String, RawUpstream>,
    upstreams: &'a [UpstreamConfig],
    limiter_index: HashMap<&'a str, usize>,
    raw_limiters: &'a BTreeMap<String, RawLimiter>,
}

impl Validator<'_> {
    pub(super) fn routes(
        &mut self,
        raw: &[RawRoute],
        raw_upstreams: &BTreeMap<String, RawUpstream>,
        upstreams: &[UpstreamConfig],
        raw_limiters: &BTreeMap<String, RawLimiter>,
        limiters: &[LimiterConfig],
    ) -> Vec<RouteConfig> {
        let refs = RouteRefs {
            upstream_index: upstreams
                .iter()
                .enumerate()
                .map(|(i, u)| (u.name.as_str(), i))
                .collect(),
            raw_upstreams,
            upstreams,
            limiter_index: limiters
                .iter()
                .enumerate()
                .map(|(i, l)| (l.name.as_str(), i))
                .collect(),
            raw_limiters,
        };
        let mut names = HashSet::new();
        let mut out = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            if let Some(route) = self.route(i, r, &mut names, &refs) {
                out.push(route);
            }
        }
        out
    }

    /// One route, checked part by part; `None` if it has no action, its
    /// other parts checked all the same so every error is reported.
    fn route<'r>(
        &mut self,
        i: usize,
        r: &'r RawRoute,
        names: &mut HashSet<&'r str>,
        refs: &RouteRefs<'_>,
    ) -> Option<RouteConfig> {
        let at = |field: &str| format!("routes[{i}].{field}");
        self.route_name(i, &r.name.0, names);
        let m = &r.matcher;
        self.route_paths(i, m);
        let (path_regex, query_regex) = self.route_regexes(i, m);
        let methods = self.route_methods(i, m);
        let action = self.route_action(i, r, refs, path_regex.as_ref());
        let site = self.route_site(i, r, path_regex.as_ref(), &action, refs.upstreams);
        let query = self.route_query(i, m);
        let asn = self.route_asn(i, m.asn.as_ref());
        let country = self.route_country(i, m.country.as_ref());
        let route_limiters =
            self.route_limiters(i, &r.limiters, &refs.limiter_index, refs.raw_limiters);
        let reject = r.reject.as_ref().map(|x| self.reject(&at("reject"), x));
        let rate_limit_headers =
            self.header_sets(&at("rate_limit_headers"), r.rate_limit_headers.as_ref());
        let errors = self.error_answers(
            &format!("routes[{i}]"),
            r.error_format.as_ref(),
            r.error_pages.as_ref(),
        );
        let action = action?;
        Some(RouteConfig {
            errors,
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
            allow_unlimited: r.allow_unlimited.unwrap_or(false),
            compression: r.compression.unwrap_or(true),
            challenge: r
                .challenge
                .as_ref()
                .map(|c| self.challenge(&at("challenge"), c)),
            path_regex,
            query_regex,
            site,
            cache: self.route_cache_of(&at("cache"), r),
            asn,
            country,
        })
    }

    /// `cache`: only on a route whose answers are the same for every visitor.
    fn route_cache_of(&mut self, at: &str, r: &RawRoute) -> Option<RouteCacheConfig> {
        let c = r.cache.as_ref()?;
        if r.respond.is_some() {
            self.err(
                at,
                "a route that answers itself (`respond`) has nothing to cache",
            );
        }
        if r.auth.is_some() {
            // Its pages are one user's: a shared cache must not hand them to another.
            self.err(
                at,
                "a route behind `auth` serves each user their own pages; a shared cache cannot hold them",
            );
        }
        Some(self.route_cache(at, c))
    }

    /// `match.path_regex` and `match.query_regex`, each compiled.
    fn route_regexes(
        &mut self,
        i: usize,
        m: &RawMatch,
    ) -> (Option<regex::Regex>, Option<regex::Regex>) {
        let at = |field: &str| format!("routes[{i}].match.{field}");
        let path_regex = m
            .path_regex
            .as_ref()
            .and_then(|p| self.path_regex(&at("path_regex"), &p.0));
        let query_regex = m
            .query_regex
            .as_ref()
            .and_then(|p| self.path_regex(&at("query_regex"), &p.0));
        (path_regex, query_regex)
    }

    /// `match.methods`: each a valid method, upper-cased.
    fn route_methods(&mut self, i: usize, m: &RawMatch) -> Option<Vec<Method>> {
        let ms = m.methods.as_ref()?;
        let methods = ms.iter().enumerate().filter_map(|(j, t)| {
            match Method::from_bytes(t.0.to_ascii_uppercase().as_bytes()) {
                Ok(m) => Some(m),
                Err(_) => {
                    self.err(
                        format!("routes[{i}].match.methods[{j}]"),
                        format!("invalid method {:?}", t.0),
                    );
                    None
                }
            }
        });
        Some(methods.collect())
    }

    /// `match.query`: name/value pairs, each with a name.
    fn route_query(&mut self, i: usize, m: &RawMatch) -> Vec<(String, String)> {
        let query: Vec<(String, String)> = m
            .query
            .iter()
            .flatten()
            .map(|(name, value)| (name.clone(), value.0.clone()))
            .collect();
        if query.iter().any(|(name, _)| name.is_empty()) {
            self.err(
                format!("routes[{i}].match.query"),
                "a query parameter needs a name",
            );
        }
        query
    }

    /// `match.path` and `match.path_prefix`: absolute, and not both.
    fn route_paths(&mut self, i: usize, m: &RawMatch) {
        let at = |field: &str| format!("routes[{i}].{field}");
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
        let paths = [
            m.path.is_some(),
            m.path_prefix.is_some(),
            m.path_regex.is_some(),
        ];
        if paths.iter().filter(|&&p| p).count() > 1 {
            self.err(
                at("match"),
                "use one of `path`, `path_prefix` and `path_regex`",
            );
        }
    }

    /// Where a route sends its requests: an upstream by name, or a local
    /// answer (`respond`, `redirect`); exactly one of the three.
    fn route_action(
        &mut self,
        i: usize,
        r: &RawRoute,
        refs: &RouteRefs<'_>,
        regex: Option<&regex::Regex>,
    ) -> Option<Action> {
        let at = |field: &str| format!("routes[{i}].{field}");
        let given = [
            r.upstream.is_some(),
            r.respond.is_some(),
            r.redirect.is_some(),
        ];
        match given.iter().filter(|&&g| g).count() {
            0 => {
                self.err(
                    format!("routes[{i}]"),
                    "a route needs `upstream`, `respond` or `redirect`",
                );
                return None;
            }
            1 => {}
            _ => {
                self.err(
                    format!("routes[{i}]"),
                    "a route has one of `upstream`, `respond` and `redirect`",
                );
                return None;
            }
        }
        if let Some(redirect) = &r.redirect {
            return self
                .redirect(&at("redirect"), redirect, regex)
                .map(Action::Redirect);
        }
        if let Some(resp) = &r.respond {
            return self.respond(&at("respond.status"), resp);
        }
        let u = r.upstream.as_ref()?;
        self.upstream_named(&at("upstream"), &u.0, refs)
    }

    /// A route's `respond`: its own answer, with a valid status.
    fn respond(&mut self, at_status: &str, resp: &RawRespond) -> Option<Action> {
        match StatusCode::from_u16(resp.status) {
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
                self.err(at_status, format!("invalid status {}", resp.status));
                None
            }
        }
    }

    /// A route's `upstream`: the index of the one it names. A name of an
    /// upstream that failed its own validation is not reported again.
    fn upstream_named(&mut self, at: &str, name: &str, refs: &RouteRefs<'_>) -> Option<Action> {
        if let Some(&idx) = refs.upstream_index.get(name) {
            return Some(Action::Upstream(idx));
        }
        if !refs.raw_upstreams.contains_key(name) {
            let names = refs.raw_upstreams.keys().map(String::as_str);
            self.err(
                at,
                format!("no upstream named {name:?}{}", suggest::hint(name, names)),
            );
        }
        None
    }

    /// A route's `access`, `auth`, `headers` and `rewrite` (which needs an upstream).
    fn route_site(
        &mut self,
        i: usize,
        r: &RawRoute,
        regex: Option<&regex::Regex>,
        action: &Option<Action>,
        upstreams: &[UpstreamConfig],
    ) -> crate::site::Rules {
        let at = |field: &str| format!("routes[{i}].{field}");
        let rewrite = r.rewrite.as_ref().and_then(|rw| match action {
            Some(Action::Upstream(u)) => {
                let fastcgi = upstreams[*u].fastcgi.is_some();
                self.rewrite(&at("rewrite"), rw, regex, fastcgi)
            }
            Some(_) => {
                self.err(
                    at("rewrite"),
                    "a rewrite changes what the upstream sees; this route answers itself (`respond` or `redirect`)",
                );
                None
            }
            None => None,
        });
        crate::site::Rules {
            access: r.access.as_ref().map(|a| self.access(&at("access"), a)),
            auth: r
                .auth
                .as_ref()
                .map(|a| self.basic_auth(&at("auth.basic"), &a.basic)),
            headers: r.headers.as_ref().map(|h| self.headers(&at("headers"), h)),
            rewrite,
        }
    }

    /// A route's name: present, unique, and of the characters a log line can carry.
    fn route_name<'r>(&mut self, i: usize, name: &'r str, names: &mut HashSet<&'r str>) {
        let at = format!("routes[{i}].name");
        if !names.insert(name) {
            self.err(at.clone(), format!("route name {name:?} is used twice"));
        }
        if name.is_empty() {
            self.err(at, "a route needs a name");
        } else if !valid_name(name) {
            self.err(
                at,
                format!(
                    "route name {name:?} may use only letters, digits, `_` and `-` (it appears in log lines and metric labels)"
                ),
            );
        }
    }

    /// A route's `limiters`, by name, each once: their indexes in the config.
    fn route_limiters(
        &mut self,
        i: usize,
        written: &[Text],
        index: &HashMap<&str, usize>,
        raw_limiters: &BTreeMap<String, RawLimiter>,
    ) -> Vec<usize> {
        let mut out = Vec::new();
        for (j, l) in written.iter().enumerate() {
            let at = format!("routes[{i}].limiters[{j}]");
            match index.get(l.0.as_str()) {
                Some(&idx) => {
                    if out.contains(&idx) {
                        self.err(at, format!("limiter {:?} is listed twice", l.0));
                    }
                    out.push(idx)
                }
                None if raw_limiters.contains_key(&l.0) => {} // already reported
                None => self.err(
                    at,
                    format!(
                        "no limiter named {:?}{}",
                        l.0,
                        suggest::hint(&l.0, raw_limiters.keys().map(String::as_str))
                    ),
                ),
            }
        }
        out
    }
}
