//! Validation of `routes`: the match, the action (an upstream or a local answer), the limiters by name; and the warning for a route a client can walk around.

use std::collections::{BTreeMap, HashMap, HashSet};

use http::{Method, StatusCode};

use super::Validator;
use crate::config::raw::{RawLimiter, RawRoute, RawUpstream};
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
                    allow_unlimited: r.allow_unlimited.unwrap_or(false),
                });
            }
        }
        out
    }

    /// A route whose every limiter keys on something the client picks (a
    /// header, or an API key nobody verifies) can be walked around by picking
    /// a new value per request: said at `check`, start and reload.
    pub(super) fn warn_walkable_routes(
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
            self.warn(
                format!("routes[{i}].limiters"),
                format!(
                    "route {:?}: every limiter ({}) keys on a value the client chooses{}, so a client \
                     gets a fresh counter by sending a new value; add a limiter keyed on `ip` (or `client`) to this route",
                    route.name,
                    names.join(", "),
                    if key_source { "" } else { " (no identity.api_keys or api_keys_file verifies api_key)" },
                ),
            );
        }
    }
}
