//! `GET /config`: the validated config in force, in the shape and key names of the YAML, secrets redacted.
//!
//! Every struct is taken apart with an exhaustive pattern (no `..`), so a
//! field added to the validated config does not compile until it is shown
//! here (or deliberately skipped with `_`). Keys that do not apply (a Redis
//! URL with SQLite, a `window` for a token bucket) are `null` rather than
//! missing, so every config shows the same keys: the ones docs/CONFIG.md
//! lists, which a test compares both ways.

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::config::acme::{AcmeConfig, HstsConfig};
use crate::config::store::Shown;
use crate::config::{
    Action, AdminConfig, AuditConfig, BalanceConfig, BodyConfig, Config, EncodedSeparators,
    ErrorAnswers, ErrorFormat, ErrorPage, FastCgiConfig, HeaderSets, HealthCheck, IdentityConfig,
    LimiterConfig, LogConfig, LogFormat, OverrideConfig, Policy, RejectBody, RejectShape,
    RouteConfig, ServerConfig, StoreConfig, TlsConfig, UpstreamConfig, UpstreamTls,
};
use crate::identity::ApiKey;
use crate::limiter::{AlgorithmKind, Nanos, Param, NANOS_PER_SEC};

/// What a secret is replaced with.
const REDACTED: &str = "[redacted]";

/// The config in force, with every secret replaced.
pub fn effective_config(c: &Config) -> Value {
    let Config {
        // Shown by `check` and logged; not config keys.
        warnings: _,
        server,
        admin,
        store,
        audit,
        identity,
        upstreams,
        limiters,
        routes,
        log,
        allow_no_routes,
        site,
        cache,
    } = c;
    json!({
        "allow_no_routes": allow_no_routes,
        "access": site.access.as_ref().map(access),
        "headers": site.headers.as_ref().map(headers_rules),
        "server": server_section(server),
        "log": log_section(log),
        "admin": admin_section(admin),
        "store": store_section(store),
        "audit": audit_section(audit),
        "identity": identity_section(identity),
        "upstreams": upstreams.iter().map(upstream).collect::<Vec<_>>(),
        "limiters": limiters.iter().map(limiter).collect::<Vec<_>>(),
        "routes": routes.iter().map(|r| route(r, c)).collect::<Vec<_>>(),
        "cache": cache.map(|k| json!({"max_size": k.max_size, "max_entry_size": k.max_entry_size, "lock_timeout": dur(k.lock_timeout)})),
    })
}

/// A duration the way the config spells one (`250ms`, `10s`, `5m`, `1h`, `7d`).
fn dur(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        _ if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ if s.is_multiple_of(60) => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

fn nanos(n: Nanos) -> String {
    dur(Duration::from_nanos(n))
}

/// Events per second from the nanoseconds between two of them.
fn per_second(interval: Nanos) -> f64 {
    NANOS_PER_SEC as f64 / interval.max(1) as f64
}

fn server_section(s: &ServerConfig) -> Value {
    let ServerConfig {
        listen,
        tls,
        request_header_timeout,
        max_request_body,
        shutdown_grace,
        workers,
        max_connections,
        max_connections_per_ip,
        idle_timeout,
        bodies,
        encoded_separators,
        underscores_in_headers,
        errors,
        compression,
        proxy_protocol,
    } = s;
    let BodyConfig {
        buffer,
        timeout,
        min_rate,
        send_timeout,
        upstream_per_connection,
        lingering,
    } = bodies;
    json!({
        "listen": listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "tls": tls.as_ref().map(tls_section),
        "request_header_timeout": dur(*request_header_timeout),
        "max_request_body": max_request_body,
        "shutdown_grace": dur(*shutdown_grace),
        "workers": workers,
        "max_connections": max_connections,
        "max_connections_per_ip": max_connections_per_ip,
        "idle_timeout": dur(*idle_timeout),
        "request_body_buffer": buffer,
        "request_body_timeout": dur(*timeout),
        "request_body_min_rate": min_rate,
        "send_timeout": dur(*send_timeout),
        "upstream_requests_per_connection": upstream_per_connection,
        "lingering_time": dur(lingering.time),
        "lingering_timeout": dur(lingering.timeout),
        "encoded_separators": match encoded_separators {
            EncodedSeparators::Reject => "reject",
            EncodedSeparators::Decode => "decode",
        },
        "underscores_in_headers": underscores_in_headers,
        "error_format": error_format(errors.format.unwrap_or_default()),
        "error_pages": error_pages(errors),
        "compression": compression,
        "proxy_protocol": proxy_protocol.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

fn tls_section(t: &TlsConfig) -> Value {
    let TlsConfig {
        certs,
        // The certificates read from `certs`: key material, never shown.
        loaded: _,
        listen,
        redirect_plain,
        acme,
        hsts,
    } = t;
    json!({
        "certs": certs.iter().map(|x| json!({"cert": x.cert.display().to_string(), "key": x.key.display().to_string(), "hosts": x.hosts})).collect::<Vec<_>>(),
        "listen": listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "redirect_plain": redirect_plain,
        "acme": acme.as_ref().map(acme_section),
        "hsts": hsts.as_ref().map(|h| {
            let HstsConfig { max_age, include_subdomains, preload } = h;
            json!({"max_age": dur(*max_age), "include_subdomains": include_subdomains, "preload": preload})
        }),
    })
}

fn acme_section(a: &AcmeConfig) -> Value {
    let AcmeConfig {
        directory,
        directory_ca,
        email,
        domains,
        challenge,
        storage,
        renew_before,
        shared_key_file,
        shared_key: _, // key material, never shown
    } = a;
    json!({
        "directory": directory,
        "directory_ca": directory_ca.as_ref().map(|p| p.display().to_string()),
        "email": email,
        "domains": domains,
        "challenge": challenge.as_str(),
        "storage": storage.display().to_string(),
        "renew_before": renew_before.map(dur),
        "shared_key_file": shared_key_file.as_ref().map(|p| p.display().to_string()),
    })
}

fn log_section(l: &LogConfig) -> Value {
    let LogConfig {
        format,
        access,
        access_file,
        refusals,
    } = l;
    let format = match format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    let access_file = access_file.as_ref().map(|p| p.display().to_string());
    json!({"format": format, "access": access, "access_file": access_file, "refusals": refusals.as_str()})
}

fn admin_section(a: &AdminConfig) -> Value {
    let AdminConfig {
        listen,
        token,
        token_file,
    } = a;
    json!({
        "listen": listen.to_string(),
        "token": token.as_ref().map(|_| REDACTED),
        "token_file": token_file.as_ref().map(|p| p.display().to_string()),
    })
}

fn store_section(s: &StoreConfig) -> Value {
    s.view(&Shown {
        spell: &dur,
        redacted: REDACTED,
    })
}

fn audit_section(a: &AuditConfig) -> Value {
    let AuditConfig { enabled, retention } = a;
    json!({"enabled": enabled, "retention": dur(*retention)})
}

fn identity_section(i: &IdentityConfig) -> Value {
    let IdentityConfig {
        api_key_header,
        api_keys,
        api_keys_file,
        unknown_key_limit,
        unknown_key_window,
        trusted_proxies,
        ipv6_prefix,
        exempt,
        pass,
        geoip,
        crowdsec,
    } = i;
    json!({
        "api_key_header": api_key_header.as_str(),
        // The hash prefix the logs show, never the key.
        "api_keys": api_keys.iter().map(|k| ApiKey::from_entry(k).short).collect::<Vec<_>>(),
        "api_keys_file": api_keys_file.as_ref().map(|(p, _)| p.display().to_string()),
        "trusted_proxies": trusted_proxies.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "ipv6_prefix": ipv6_prefix,
        "exempt": exempt.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "unknown_keys": {"limit": unknown_key_limit, "window": dur(*unknown_key_window)},
        "pass": pass.as_ref().map(pass_section),
        "geoip": geoip.as_ref().map(geoip_section),
        "crowdsec": crowdsec.as_ref().map(crowdsec_section),
    })
}

/// `identity.geoip`: the files, never their content.
fn geoip_section(g: &crate::config::GeoipConfig) -> Value {
    let crate::config::GeoipConfig {
        asn_db,
        country_db,
        check_every,
    } = g;
    let path =
        |f: &Option<crate::config::GeoFile>| f.as_ref().map(|f| f.path.display().to_string());
    json!({"asn_db": path(asn_db), "country_db": path(country_db), "check_every": dur(*check_every)})
}

/// `identity.crowdsec`: the files the secrets come from, never the secrets.
fn crowdsec_section(c: &crate::config::CrowdsecConfig) -> Value {
    let crate::config::CrowdsecConfig {
        url,
        api_key_file,
        api_key: _,
        poll_every,
        timeout,
        max_decisions,
        push,
    } = c;
    json!({
        "url": url.to_string(),
        "api_key_file": api_key_file.display().to_string(),
        "poll_every": dur(*poll_every),
        "timeout": dur(*timeout),
        "max_decisions": max_decisions,
        "push": push.as_ref().map(|p| json!({
            "machine_id": p.machine_id,
            "password_file": p.password_file.display().to_string(),
            "queue": p.queue,
        })),
    })
}

/// `identity.pass`: the key ids (never a secret), the newest last, as it signs.
fn pass_section(p: &crate::config::PassConfig) -> Value {
    let crate::config::PassConfig {
        secret_file,
        keys,
        ttl,
        ipv4_prefix,
        ipv6_prefix,
        issue_limit,
        crawlers,
    } = p;
    let crate::config::CrawlerConfig {
        resolver,
        timeout,
        cache_size,
        cache_ttl,
        cidrs,
        verify,
    } = crawlers;
    json!({
        "secret_file": secret_file.display().to_string(),
        "key_ids": keys.0.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
        "ttl": dur(*ttl),
        "ipv4_prefix": ipv4_prefix,
        "ipv6_prefix": ipv6_prefix,
        "issue_limit": issue_limit,
        "crawlers": {
            "resolver": resolver.to_string(),
            "timeout": dur(*timeout),
            "cache_size": cache_size,
            "cache_ttl": dur(*cache_ttl),
            "cidrs": cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "verify": verify.iter().map(|v| json!({"user_agent": v.user_agent, "domains": v.domains})).collect::<Vec<_>>(),
        },
    })
}

fn upstream(u: &UpstreamConfig) -> Value {
    let UpstreamConfig {
        name,
        url,
        connect_timeout,
        timeout,
        tls,
        balance,
        fastcgi,
    } = u;
    let BalanceConfig {
        servers,
        policy,
        max_fails,
        fail_timeout,
        max_conns,
        queue,
        queue_timeout,
        health,
        tunnel_idle_timeout,
    } = balance;
    let (ca, insecure_skip_verify) = upstream_tls(tls);
    let policy = match policy {
        Policy::RoundRobin => "round_robin",
        Policy::LeastConn => "least_conn",
    };
    let mut out = json!({
        "name": name,
        "url": url.to_string(),
        "servers": servers.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "balance": policy,
        "max_conns": max_conns,
        "queue": queue,
        "queue_timeout": dur(*queue_timeout),
        "max_fails": max_fails,
        "fail_timeout": dur(*fail_timeout),
        "health": health.as_ref().map(|HealthCheck { path, interval }| json!({"path": path, "interval": dur(*interval)})),
        "tunnel_idle_timeout": dur(*tunnel_idle_timeout),
        "connect_timeout": dur(*connect_timeout),
        "timeout": dur(*timeout),
        "ca": ca,
        "insecure_skip_verify": insecure_skip_verify,
        "root": null,
        "index": null,
        "fallback": null,
        "cache_control": null,
        "script_cache": null,
    });
    if let Some(f) = fastcgi {
        fastcgi_fields(&mut out, f);
    }
    out
}

/// An upstream's `ca` (the file it trusts) and `insecure_skip_verify`.
fn upstream_tls(tls: &UpstreamTls) -> (Option<String>, bool) {
    match tls {
        UpstreamTls::SystemRoots => (None, false),
        UpstreamTls::Ca { path, certs: _ } => (Some(path.display().to_string()), false),
        UpstreamTls::InsecureSkipVerify => (None, true),
    }
}

/// A FastCGI upstream's own keys, filled into its entry (`null` for others).
fn fastcgi_fields(out: &mut Value, f: &FastCgiConfig) {
    let FastCgiConfig {
        // Shown as `url`.
        address: _,
        root,
        index,
        fallback,
        cache_control,
        max_conns,
        script_cache,
    } = f;
    out["root"] = json!(root.display().to_string());
    out["index"] = json!(index);
    out["fallback"] = json!(fallback);
    out["cache_control"] = json!(cache_control);
    out["script_cache"] = json!(dur(*script_cache));
    // php-fpm connections are capped by the FastCGI client, not the balancer.
    out["max_conns"] = json!(max_conns);
}

fn limiter(l: &LimiterConfig) -> Value {
    let LimiterConfig {
        name,
        algorithm,
        key,
        shadow,
        overrides,
        reject,
        count,
        ban,
        lease,
    } = l;
    let mut out = json!({
        "name": name,
        "algorithm": algorithm.name(),
        "key": key.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "mode": if *shadow { "shadow" } else { "enforce" },
        "overrides": overrides.iter().map(override_entry).collect::<Vec<_>>(),
        "count": count.as_ref().map(|c| json!({"status": c.status, "header": c.header.as_ref().map(|h| h.as_str())})),
        "ban": ban.as_ref().map(|b| json!({"after": b.after, "for": nanos(b.duration), "status": b.status.as_u16()})),
        "reject": reject.as_ref().map(reject_shape),
        "lease": lease.as_ref().map(|l| json!({"max": l.max})),
    });
    // Every algorithm's parameter is shown, `null` where this one takes none.
    for (k, _) in AlgorithmKind::ALL
        .into_iter()
        .flat_map(AlgorithmKind::params)
    {
        out[*k] = Value::Null;
    }
    let params = algorithm.params().into_iter().map(|(k, p)| {
        let v = match p {
            Param::Count(n) => json!(n),
            Param::Span(ns) => json!(nanos(ns)),
            Param::PerSecond(interval) => json!(per_second(interval)),
        };
        (k, v)
    });
    for (k, v) in params {
        out[k] = v;
    }
    out
}

fn override_entry(o: &OverrideConfig) -> Value {
    let OverrideConfig { key, limit } = o;
    // An override key may be an API key: shown the way logs show keys.
    let key = if key.parse::<std::net::IpAddr>().is_ok() {
        key.clone()
    } else {
        ApiKey::from_secret(key).short
    };
    json!({"key": key, "limit": limit})
}

fn reject_shape(r: &RejectShape) -> Value {
    let RejectShape { status, body } = r;
    let (body, template, content_type) = match body {
        RejectBody::Problem => ("problem", None, None),
        RejectBody::Html => ("html", None, None),
        RejectBody::Template { text, content_type } => {
            ("template", Some(text.as_str()), Some(content_type.as_str()))
        }
    };
    json!({"status": status.as_u16(), "body": body, "template": template, "content_type": content_type})
}

fn route(r: &RouteConfig, c: &Config) -> Value {
    // Every field is named, so a new one cannot be left out of the view
    // unnoticed; the matching ones are shown by `route_match`.
    let RouteConfig {
        name,
        path: _,
        path_prefix: _,
        methods: _,
        host: _,
        query: _,
        action,
        limiters,
        reject,
        rate_limit_headers,
        allow_unlimited,
        errors,
        compression,
        challenge,
        path_regex: _,
        query_regex: _,
        site,
        cache,
        asn: _,
        country: _,
    } = r;
    let (upstream, respond, redirect) = action_view(action, c);
    json!({
        "name": name,
        "match": route_match(r),
        "upstream": upstream,
        "respond": respond,
        "redirect": redirect,
        "rewrite": site.rewrite.as_ref().map(|r| json!({"to": r.to.written, "unless_exists": r.unless_exists, "append_query": r.to.append_query()})),
        "access": site.access.as_ref().map(access),
        "auth": site.auth.as_ref().map(|a| json!({"basic": {
            "realm": a.realm,
            "users_file": a.users_file.display().to_string(),
            "users": a.users.len(),
            "forward_authorization": a.forward_authorization,
        }})),
        "headers": site.headers.as_ref().map(headers_rules),
        "limiters": limiters.iter().map(|&i| c.limiters[i].name.as_str()).collect::<Vec<_>>(),
        "reject": reject.as_ref().map(reject_shape),
        "rate_limit_headers": header_sets(*rate_limit_headers),
        "allow_unlimited": allow_unlimited,
        "error_format": errors.format.map(error_format),
        "error_pages": error_pages(errors),
        "compression": compression,
        "challenge": challenge.map(|c| json!({"mode": c.mode.as_str(), "when": c.when.as_str(), "difficulty": c.difficulty, "unverified_crawlers": c.unverified_crawlers.as_str(), "exempt_public": c.exempt_public})),
        "cache": cache.as_ref().map(route_cache),
    })
}

/// What a request must carry for the route to be its own: the `match` object.
fn route_match(r: &RouteConfig) -> Value {
    let RouteConfig {
        path,
        path_prefix,
        methods,
        host,
        query,
        path_regex,
        query_regex,
        asn,
        country,
        ..
    } = r;
    let query: Map<String, Value> = query
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    json!({
        "path": path,
        "path_prefix": path_prefix,
        "methods": methods.as_ref().map(|m| m.iter().map(ToString::to_string).collect::<Vec<_>>()),
        "host": host,
        "query": query,
        "path_regex": path_regex.as_ref().map(regex::Regex::as_str),
        "query_regex": query_regex.as_ref().map(regex::Regex::as_str),
        "asn": asn,
        "country": country.as_ref().map(|c| c.iter().map(|c| c.as_str()).collect::<Vec<_>>()),
    })
}

/// `rate_limit_headers` as the config spells it.
fn header_sets(sets: HeaderSets) -> &'static str {
    match sets {
        HeaderSets::Both => "both",
        HeaderSets::XRateLimit => "x-ratelimit",
        HeaderSets::Draft => "draft",
        HeaderSets::None => "none",
    }
}

/// A route's action as the three keys that spell it: `upstream`, `respond`, `redirect`.
fn action_view<'c>(
    action: &Action,
    c: &'c Config,
) -> (Option<&'c str>, Option<Value>, Option<Value>) {
    match action {
        Action::Upstream(i) => (Some(c.upstreams[*i].name.as_str()), None, None),
        Action::Respond {
            status,
            body,
            content_type,
        } => (
            None,
            Some(json!({"status": status.as_u16(), "body": body, "content_type": content_type})),
            None,
        ),
        Action::Redirect(r) => (
            None,
            None,
            Some(
                json!({"to": r.to.written, "status": r.status.as_u16(), "append_query": r.to.append_query()}),
            ),
        ),
    }
}

/// `routes[].cache` as the config spells it.
fn route_cache(c: &crate::config::cache::RouteCacheConfig) -> Value {
    let globs = |g: &[crate::config::cache::Glob]| {
        g.iter().map(|g| g.as_str().to_string()).collect::<Vec<_>>()
    };
    json!({
        "ttl": c.ttl.map(dur),
        "stale_while_revalidate": dur(c.stale_while_revalidate),
        "stale_if_error": dur(c.stale_if_error),
        "bypass_cookies": globs(&c.bypass_cookies),
        "statuses": c.statuses,
        "query": {"sort": c.query_sort, "drop": globs(&c.query_drop)},
        "hits_free": c.hits_free,
    })
}

/// `access` as written (networks truncated, `asn:`, `country:`).
fn access(a: &crate::site::Access) -> Value {
    let nets = |l: &[crate::site::access::AccessEntry]| {
        l.iter().map(ToString::to_string).collect::<Vec<_>>()
    };
    json!({"allow": nets(&a.allow), "deny": nets(&a.deny)})
}

/// `headers` rules: names and values as written (no secret goes in a header rule).
fn headers_rules(h: &crate::site::Headers) -> Value {
    let rules = |r: &crate::site::HeaderRules| {
        let pairs = |l: &[(http::HeaderName, http::HeaderValue)]| {
            l.iter()
                .map(|(n, v)| {
                    (
                        n.to_string(),
                        Value::from(String::from_utf8_lossy(v.as_bytes())),
                    )
                })
                .collect::<Map<String, Value>>()
        };
        json!({"set": pairs(&r.set), "add": pairs(&r.add), "remove": r.remove.iter().map(ToString::to_string).collect::<Vec<_>>()})
    };
    json!({"request": h.request.as_ref().map(rules), "response": h.response.as_ref().map(rules)})
}

fn error_format(f: ErrorFormat) -> &'static str {
    match f {
        ErrorFormat::Negotiate => "negotiate",
        ErrorFormat::Json => "json",
    }
}

/// `error_pages` as written: status → file (the text is not shown).
fn error_pages(errors: &ErrorAnswers) -> Value {
    let ErrorAnswers { format: _, pages } = errors;
    pages
        .iter()
        .map(
            |ErrorPage {
                 status,
                 file,
                 text: _,
             }| {
                (
                    status.as_u16().to_string(),
                    Value::from(file.display().to_string()),
                )
            },
        )
        .collect::<Map<String, Value>>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_spelled_as_the_config_spells_them() {
        assert_eq!(dur(Duration::from_millis(250)), "250ms");
        assert_eq!(dur(Duration::from_secs(10)), "10s");
        assert_eq!(dur(Duration::from_secs(300)), "5m");
        assert_eq!(dur(Duration::from_secs(7 * 86_400)), "7d");
    }

    #[test]
    fn secrets_never_appear_in_the_effective_config() {
        let c = crate::config::parse(
            "admin: { token: hunter2 }\nstore: { backend: redis, url: \"redis://:pw@127.0.0.1:6379/0\" }\nidentity: { api_keys: [sekrit] }\nlimiters:\n  l: { limit: 1, window: 1s, overrides: [{ key: vip-key, limit: 5 }] }\n",
        )
        .unwrap();
        let text = effective_config(&c).to_string();
        for secret in ["hunter2", ":pw@", "sekrit", "vip-key"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
    }

    #[test]
    fn cluster_seeds_and_sentinels_show_without_their_passwords() {
        for store in [
            "{ backend: redis, cluster: [\"redis://:pw1@10.0.0.5:6379\", \"redis://:pw2@10.0.0.6:6379\"] }",
            "{ backend: redis, sentinel: { master: m, nodes: [\"redis://:pw1@10.0.0.7:26379\"] } }",
        ] {
            let c = crate::config::parse(&format!("store: {store}\n")).unwrap();
            let shown = &effective_config(&c)["store"];
            let text = shown.to_string();
            assert!(!text.contains("pw1") && !text.contains("pw2"), "{text}");
            assert!(text.contains("10.0.0."), "the hosts stay: {text}");
            assert!(shown["url"].is_null(), "{text}");
        }
    }
}
