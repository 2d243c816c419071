//! Validation of `routes`: the name, the match, the action (an upstream or a local answer), the limiters by name.

use std::collections::{BTreeMap, HashMap, HashSet};

use http::{Method, StatusCode};

use super::{valid_name, Validator};
use crate::config::raw::{RawLimiter, RawMatch, RawRoute, RawUpstream, Text};
use crate::config::suggest;
use crate::config::{Action, LimiterConfig, RouteConfig, UpstreamConfig};

impl Validator<'_> {
    pub(super) fn routes(
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
            self.route_name(i, &r.name.0, &mut names);
            let m = &r.matcher;
            self.route_paths(i, m);
            let methods = self.route_methods(i, m);
            let action = self.route_action(i, r, &upstream_index, raw_upstreams);
            let query = self.route_query(i, m);
            let asn = self.route_asn(i, m.asn.as_ref());
            let country = self.route_country(i, m.country.as_ref());
            let route_limiters = self.route_limiters(i, &r.limiters, &limiter_index, raw_limiters);
            let reject = r.reject.as_ref().map(|x| self.reject(&at("reject"), x));
            let rate_limit_headers =
                self.header_sets(&at("rate_limit_headers"), r.rate_limit_headers.as_ref());
            let errors = self.error_answers(
                &format!("routes[{i}]"),
                r.error_format.as_ref(),
                r.error_pages.as_ref(),
            );
            if let Some(action) = action {
                out.push(RouteConfig {
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
                    asn,
                    country,
                });
            }
        }
        out
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
        if m.path.is_some() && m.path_prefix.is_some() {
            self.err(at("match"), "use `path` or `path_prefix`, not both");
        }
    }

    /// Where a route sends its requests: an upstream by name, or a local answer.
    fn route_action(
        &mut self,
        i: usize,
        r: &RawRoute,
        upstream_index: &HashMap<&str, usize>,
        raw_upstreams: &BTreeMap<String, RawUpstream>,
    ) -> Option<Action> {
        let at = |field: &str| format!("routes[{i}].{field}");
        match (&r.upstream, &r.respond) {
            (Some(u), None) => match upstream_index.get(u.0.as_str()) {
                Some(&idx) => Some(Action::Upstream(idx)),
                None => {
                    if !raw_upstreams.contains_key(&u.0) {
                        let names = raw_upstreams.keys().map(String::as_str);
                        self.err(
                            at("upstream"),
                            format!("no upstream named {:?}{}", u.0, suggest::hint(&u.0, names)),
                        );
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
