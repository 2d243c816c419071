//! Warnings: a config that runs but leaves protection off somewhere — a route no request reaches, a limiter no route uses, a limit or ban a client can walk around or turn on a victim.
//!
//! All of them live here so `check`, start and reload say the same things;
//! only the FastCGI `root`/`index` warning, which looks at the disk, is the
//! loader's (`load::warn_missing_fastcgi_files`). `check --strict` makes
//! every warning an error.

use super::Validator;
use crate::config::raw::RawRoute;
use crate::config::{KeyPart, LimiterConfig, RouteConfig};

impl Validator<'_> {
    /// Every warning of a validated document.
    pub(super) fn warn_all(
        &mut self,
        raw: &[RawRoute],
        routes: &[RouteConfig],
        limiters: &[LimiterConfig],
        key_source: bool,
    ) {
        self.warn_shadowed_routes(raw, routes);
        self.warn_unused_limiters(routes, limiters);
        self.warn_walkable_routes(raw, routes, limiters, key_source);
        self.warn_client_chosen_hooks(limiters, key_source);
        self.warn_unverified_overrides(limiters, key_source);
        self.warn_regex_shadows(raw, routes);
        self.warn_redirect_loops(raw, routes);
    }

    /// A route after one that matches every request it would match is dead
    /// config: its limiters never run (a catch-all `path_prefix: /` placed
    /// before `/login.php` switches the login limit off).
    fn warn_shadowed_routes(&mut self, raw: &[RawRoute], routes: &[RouteConfig]) {
        for (j, later) in routes.iter().enumerate() {
            let Some(earlier) = routes[..j].iter().find(|e| covers(e, later)) else {
                continue;
            };
            let at = position(raw, &later.name);
            self.warn(
                format!("routes[{at}].name"),
                format!(
                    "route {:?} is never reached: route {:?} (routes[{}]) comes first and matches every request it would{}; move {:?} above {:?} or narrow {:?}'s `match`",
                    later.name,
                    earlier.name,
                    position(raw, &earlier.name),
                    if later.limiters.is_empty() { "" } else { ", so its limiters never run" },
                    later.name,
                    earlier.name,
                    earlier.name,
                ),
            );
        }
    }

    /// A limiter that no route lists limits nothing.
    fn warn_unused_limiters(&mut self, routes: &[RouteConfig], limiters: &[LimiterConfig]) {
        for (i, l) in limiters.iter().enumerate() {
            if !routes.iter().any(|r| r.limiters.contains(&i)) {
                self.warn(
                    format!("limiters.{}", l.name),
                    format!(
                        "no route lists limiter {:?}, so it limits nothing; add it to a route's `limiters` or remove it",
                        l.name
                    ),
                );
            }
        }
    }

    /// A route whose every limiter keys on something the client picks (a
    /// header, or an API key nobody verifies) can be walked around by picking
    /// a new value per request.
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
            let names: Vec<&str> = route
                .limiters
                .iter()
                .map(|&l| limiters[l].name.as_str())
                .collect();
            self.warn(
                format!("routes[{}].limiters", position(raw, &route.name)),
                format!(
                    "route {:?}: every limiter ({}) keys on a value the client chooses{}, so a client \
                     gets a fresh counter by sending a new value; add a limiter keyed on `ip` (or `client`) to this route",
                    route.name,
                    names.join(", "),
                    unverified(key_source),
                ),
            );
        }
    }

    /// `count:` and `ban:` turn a client's requests against the key they
    /// carry; when nothing in the key identifies the sender, anyone can send
    /// a victim's value and use up (or ban) the victim.
    fn warn_client_chosen_hooks(&mut self, limiters: &[LimiterConfig], key_source: bool) {
        for l in limiters {
            let identifies = l.key.iter().any(|p| p.names_sender(key_source));
            let chosen = l.key.iter().any(|p| p.chosen_by_client(key_source));
            if identifies || !chosen {
                continue;
            }
            let key: Vec<String> = l.key.iter().map(ToString::to_string).collect();
            let key = key.join(", ");
            let hooks = [
                (l.ban.is_some(), "ban", "get a victim banned"),
                (l.count.is_some(), "count", "use up a victim's limit"),
            ];
            for (set, hook, harm) in hooks {
                if set {
                    self.warn(
                        format!("limiters.{}.{hook}", l.name),
                        format!(
                            "`{hook}` on limiter {:?}, keyed only on values the client chooses ({key}){}: anyone can {harm} by sending the victim's value; add `ip` to the key (e.g. `key: [ip, {key}]`)",
                            l.name,
                            unverified(key_source || !l.key.contains(&KeyPart::ApiKey)),
                        ),
                    );
                }
            }
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
                    self.warn(
                        format!("limiters.{}.overrides[{i}].key", l.name),
                        "this override names an API key, but no identity.api_keys or api_keys_file verifies keys, so `client` is always an IP and it never applies",
                    );
                }
            }
        }
    }
}

fn unverified(key_source: bool) -> &'static str {
    if key_source {
        ""
    } else {
        " (no identity.api_keys or api_keys_file verifies api_key)"
    }
}

/// The index of the route named `name` in the document (names are unique once valid).
pub(in crate::config) fn position(raw: &[RawRoute], name: &str) -> usize {
    raw.iter().position(|r| r.name.0 == name).unwrap_or(0)
}

/// Whether every request `later` matches is matched by `earlier` too, so
/// first-match routing never reaches `later`. Conservative: paths compare as
/// written (without a trailing `/`), so a shadow hidden behind a spelling the
/// router folds is missed rather than invented.
fn covers(earlier: &RouteConfig, later: &RouteConfig) -> bool {
    let methods = match (&earlier.methods, &later.methods) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(e), Some(l)) => l.iter().all(|m| e.contains(m)),
    };
    let host = earlier.host.is_none() || earlier.host == later.host;
    let query =
        earlier.query.iter().all(|q| later.query.contains(q)) && earlier.query_regex.is_none();
    // A network match covers only the same networks or fewer.
    let networks = subset(&earlier.asn, &later.asn) && subset(&earlier.country, &later.country);
    methods && host && query && networks && path_covers(earlier, later)
}

/// Whether every value `later` accepts, `earlier` accepts (`None`: any).
fn subset<T: PartialEq>(earlier: &Option<Vec<T>>, later: &Option<Vec<T>>) -> bool {
    match (earlier, later) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(e), Some(l)) => l.iter().all(|x| e.contains(x)),
    }
}

fn path_covers(earlier: &RouteConfig, later: &RouteConfig) -> bool {
    if earlier.path_regex.is_some() || later.path_regex.is_some() {
        return super::super::site::regex_covers(earlier, later);
    }
    let later_path = later.path.as_deref().or(later.path_prefix.as_deref());
    match (&earlier.path, &earlier.path_prefix) {
        (None, None) => true,
        (_, Some(prefix)) => match later_path {
            Some(p) => under(p, prefix),
            None => trimmed(prefix) == "/",
        },
        // `path: /x.php` also takes its PATH_INFO forms `/x.php/…`.
        (Some(path), None) => {
            let php = path.ends_with(".php");
            match (&later.path, &later.path_prefix) {
                (Some(p), None) => trimmed(p) == trimmed(path) || (php && under(p, path)),
                (_, Some(p)) => php && under(p, path),
                (None, None) => false,
            }
        }
    }
}

/// Whether `path` is `prefix` or below it, segment by segment.
fn under(path: &str, prefix: &str) -> bool {
    let (path, prefix) = (trimmed(path), trimmed(prefix));
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

fn trimmed(p: &str) -> &str {
    match p.trim_end_matches('/') {
        "" => "/",
        t => t,
    }
}
