//! The admin listener: per-key status and reset, bans, metrics, health, readiness, reload, effective config.
//!
//! It listens on its own address (never the public port, `config` enforces
//! that). With `admin.token` set, every call but `/healthz` and `/readyz`
//! needs `Authorization: Bearer <token>`; probes stay open so orchestrators
//! need no secret. Without a token the listener is on loopback (config
//! enforces that too) and answers only loopback `Host` names (see `guard`).

use std::net::SocketAddr;

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use crate::app::App;
use crate::body::Body;
use crate::config::{Backend, Config};
use crate::identity::ApiKey;
use crate::key;
use crate::limiter::{ceil_secs, NANOS_PER_SEC};
use crate::problem::admin_error;
use crate::reload::Reloader;
use crate::snapshot::Snapshot;
use guard::Refusal;

mod bans;
mod guard;

pub use guard::is_loopback_host;

fn json_response(status: StatusCode, v: Value) -> Response<Body> {
    let mut resp = Response::new(Body::full(format!("{v}\n")));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// A compiled-in dashboard file. The policy lets it load only itself and
/// talk only to this listener, and forbids framing (clickjacking).
fn asset(text: &'static str, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(Body::full(text));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    resp
}

fn not_allowed(allow: &'static str) -> Response<Body> {
    let mut resp = admin_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed on this admin path.",
    );
    resp.headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static(allow));
    resp
}

/// Answers one admin call; `reloader` is how `POST /reload` reaches the listeners.
pub async fn handle(
    app: &App,
    reloader: &Reloader,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    let snap = app.snapshot();
    let path = req.uri().path();
    // Probes need no secret; the dashboard's page, script and style hold no
    // data (its JSON does, and needs the token).
    let open = matches!(
        path,
        "/healthz" | "/readyz" | "/" | "/dashboard.js" | "/dashboard.css"
    );
    let token = snap.config.admin.token.as_deref();
    match guard::admit(&req, token, open) {
        Ok(()) => {}
        Err(Refusal::Unauthorized) => {
            let mut resp = admin_error(
                StatusCode::UNAUTHORIZED,
                "This admin call needs `Authorization: Bearer <token>`.",
            );
            resp.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
            return resp;
        }
        Err(Refusal::ForeignHost) => {
            tracing::warn!(%peer, host = ?req.headers().get(http::header::HOST), path, "admin call refused: no token is set and the Host is not a loopback name");
            return admin_error(
                StatusCode::FORBIDDEN,
                "Without admin.token this API answers only Host: localhost, 127.0.0.1 or [::1].",
            );
        }
    }
    if token.is_none() && guard::changes_state(req.method()) {
        tracing::warn!(%peer, method = %req.method(), path, "admin call without a token changes state (set admin.token to require one)");
    }
    let query_key = query_param(req.uri().query().unwrap_or(""), "key");
    match (req.method(), path) {
        (&Method::GET, "/") => asset(crate::dashboard::PAGE, "text/html; charset=utf-8"),
        (&Method::GET, "/dashboard.js") => asset(crate::dashboard::SCRIPT, "text/javascript; charset=utf-8"),
        (&Method::GET, "/dashboard.css") => asset(crate::dashboard::STYLE, "text/css; charset=utf-8"),
        (&Method::GET, "/dashboard.json") => {
            let mut resp = json_response(StatusCode::OK, crate::dashboard::data(app));
            resp.headers_mut()
                .insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            resp
        }
        (&Method::GET, "/healthz") => json_response(StatusCode::OK, json!({"status": "ok"})),
        (&Method::GET, "/readyz") => {
            let healthy = app.shared.store.healthy();
            let status = if healthy {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json_response(
                status,
                json!({"ready": healthy, "config_version": snap.version, "store": store_readiness(app, healthy)}),
            )
        }
        (&Method::GET, "/metrics") => {
            let mut text = metrics_text(app, &snap).await;
            crate::balance::Balancer::render_metrics(&snap.upstreams, &mut text);
            let mut resp = Response::new(Body::full(text));
            resp.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        (&Method::GET, "/status") | (&Method::DELETE, "/status") => match query_key {
            None => admin_error(
                StatusCode::BAD_REQUEST,
                "Pass the client as ?key=<IP or API key>.",
            ),
            Some(k) if req.method() == Method::GET => match status(app, &snap, &k).await {
                Ok(v) => json_response(StatusCode::OK, v),
                Err(e) => admin_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
            },
            Some(k) => {
                let keys: Vec<String> = status_keys(&snap, &k)
                    .into_iter()
                    .map(|(_, key)| key)
                    .collect();
                match app.shared.store.reset(&keys).await {
                    Ok(removed) => json_response(
                        StatusCode::OK,
                        json!({"key": key::for_admin_client(&snap.identity, &k), "reset": removed}),
                    ),
                    Err(e) => admin_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
                }
            }
        },
        (&Method::POST, "/reload") => match reloader.reload().await {
            Ok(version) => {
                // The snapshot the reload installed (a later reload would carry a higher version).
                let now = app.snapshot();
                let warnings: Vec<String> = if now.version == version {
                    now.config.warnings.iter().map(ToString::to_string).collect()
                } else {
                    Vec::new()
                };
                json_response(
                    StatusCode::OK,
                    json!({"result": "ok", "version": version, "warnings": warnings}),
                )
            }
            Err(e) => json_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"result": "error", "version": snap.version, "errors": e.messages()}),
            ),
        },
        (&Method::GET, "/bans") => bans::list(app, &snap, req.uri().query().unwrap_or("")).await,
        (&Method::DELETE, p) if p.starts_with("/bans/") => bans::lift(app, &p["/bans/".len()..]).await,
        (&Method::GET, "/upstreams") => json_response(
            StatusCode::OK,
            json!({"upstreams": upstreams_status(&snap)}),
        ),
        (&Method::GET, "/config") => json_response(
            StatusCode::OK,
            json!({
                "version": snap.version,
                "path": app.shared.config_path.as_ref().map(|p| p.display().to_string()),
                "last_reload_error": *app.shared.last_reload_error.lock(),
                "config": effective_config(&snap.config),
            }),
        ),
        (_, "/status") => not_allowed("GET, DELETE"),
        (_, "/reload") => not_allowed("POST"),
        (_, p) if p.starts_with("/bans/") => not_allowed("DELETE"),
        (
            _,
            "/healthz" | "/readyz" | "/metrics" | "/config" | "/upstreams" | "/bans" | "/"
            | "/dashboard.js" | "/dashboard.css" | "/dashboard.json",
        ) => not_allowed("GET"),
        _ => admin_error(
            StatusCode::NOT_FOUND,
            "Admin paths: / (dashboard), /dashboard.json, /status, /bans, /bans/{key}, /upstreams, /metrics, /healthz, /readyz, /reload, /config.",
        ),
    }
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Every (limiter index, store key) the client `raw` can have, without counting.
fn status_keys(snap: &Snapshot, raw: &str) -> Vec<(usize, String)> {
    let client = key::for_admin_client(&snap.identity, raw);
    let mut out = Vec::new();
    for (i, l) in snap.limiters.iter().enumerate() {
        let routes: Vec<&str> = snap
            .routes
            .iter()
            .filter(|r| r.limiters.contains(&i))
            .map(|r| &*r.name)
            .collect();
        let values = key::values_for_client(&l.key, &client, &routes);
        out.extend(values.into_iter().map(|v| (i, l.store_key(&v))));
    }
    out
}

/// Every limiter's state for one client; fails when the store does not answer.
async fn status(app: &App, snap: &Snapshot, raw: &str) -> Result<Value, crate::store::StoreError> {
    let now = app.shared.clock.now();
    let mut limiters: Vec<Value> = Vec::new();
    for (i, store_key) in status_keys(snap, raw) {
        let l = &snap.limiters[i];
        let value = key::value_of(&store_key);
        let algorithm = l.algorithm_for(value);
        let q = app.shared.store.peek(&store_key, algorithm, now).await?;
        let ban = match &l.ban {
            None => Value::Null,
            Some((rule, _)) => {
                let b = app.shared.store.banned(&[store_key.as_str()], now).await?[0];
                json!({
                    "after": rule.after,
                    "for_seconds": ceil_secs(rule.duration),
                    "banned": b.is_some(),
                    "until": b.map(|b| b.until.div_ceil(NANOS_PER_SEC)),
                    "until_utc": b.map(|b| crate::clock::iso8601(b.until.div_ceil(NANOS_PER_SEC))),
                    "retry_after_seconds": b.map(|b| ceil_secs(b.remaining).max(1)),
                })
            }
        };
        limiters.push(json!({
                "limiter": l.name,
                "algorithm": algorithm.name(),
                "mode": if l.shadow { "shadow" } else { "enforce" },
                "key": value,
                "limit": q.limit,
                "remaining": q.remaining,
                "window_seconds": q.window.map(ceil_secs),
                "reset_after_seconds": ceil_secs(q.reset_after),
                "reset": (now + q.reset_after).div_ceil(NANOS_PER_SEC),
                "ban": ban,
        }));
    }
    Ok(
        json!({"key": key::for_admin_client(&snap.identity, raw), "limiters": limiters, "upstreams": upstreams_status(snap)}),
    )
}

/// Every upstream's servers: up or down, in flight, failures counted.
fn upstreams_status(snap: &Snapshot) -> Value {
    Value::Array(snap.upstreams.iter().map(|u| u.status()).collect())
}

/// The store part of `/readyz`: for SQLite, also what waits for a failing disk.
fn store_readiness(app: &App, healthy: bool) -> Value {
    let store = &app.shared.store;
    let mut out = json!({"backend": store.backend(), "healthy": healthy});
    if let Some(d) = store.durability() {
        out["unsaved_keys"] = d.unsaved_keys.into();
        out["unsaved_dropped_total"] = d.unsaved_dropped_total.into();
        out["unsaved_cap_reached"] = d.unsaved_cap_reached.into();
        out["write_errors_total"] = d.write_errors_total.into();
        out["last_error"] = d.last_error.into();
    }
    out
}

async fn metrics_text(app: &App, snap: &Snapshot) -> String {
    use crate::metrics::Extra;
    use std::sync::atomic::Ordering::Relaxed;
    let s = &app.shared;
    // /proc reads are file I/O: off the runtime.
    let process = tokio::task::spawn_blocking(crate::metrics::process::sample)
        .await
        .ok()
        .flatten();
    let durability = s.store.durability().unwrap_or_default();
    let keys = s.store.key_counters();
    let gauge = |name, help, value| Extra {
        name,
        help,
        kind: "gauge",
        value,
    };
    let counter = |name, help, value: u64| Extra {
        name,
        help,
        kind: "counter",
        value: value as f64,
    };
    s.metrics.render(
        &[
            gauge(
                "tollgate_config_version",
                "The version of the config in force (1 at start, +1 per successful reload).",
                snap.version as f64,
            ),
            gauge(
                "tollgate_open_connections",
                "Client connections open on the public listeners.",
                s.connections.open() as f64,
            ),
            gauge(
                "tollgate_tracked_keys",
                "Limiter keys held in memory (overflow keys included); at most tollgate_max_keys.",
                s.store.tracked_keys() as f64,
            ),
            gauge(
                "tollgate_max_keys",
                "store.max_keys: the bound on tollgate_tracked_keys.",
                s.store.max_keys() as f64,
            ),
            counter(
                "tollgate_keys_evicted_total",
                "Limiter keys forgotten to make room for new ones (store.max_keys): at rest, or live and under half their quota.",
                keys.evicted.load(Relaxed),
            ),
            counter(
                "tollgate_keys_evicted_live_total",
                "Of tollgate_keys_evicted_total, live keys under half their quota (lightest first): each such client starts afresh.",
                keys.evicted_live.load(Relaxed),
            ),
            counter(
                "tollgate_keys_overflow_total",
                "Checks counted on their limiter's shared overflow key because the key's shard was full of keys at or over half their quota.",
                keys.overflowed.load(Relaxed),
            ),
            counter(
                "tollgate_keys_refused_total",
                "Checks refused because the table and its overflow slots were all full of live state.",
                keys.refused.load(Relaxed),
            ),
            gauge(
                "tollgate_store_healthy",
                "1 when the store answers (SQLite: the last write succeeded; Redis: its circuit breaker is closed).",
                f64::from(u8::from(s.store.healthy())),
            ),
            gauge(
                "tollgate_store_unsaved_keys",
                "SQLite: keys whose newest state is only in memory, waiting for a failed write to be retried.",
                durability.unsaved_keys as f64,
            ),
            gauge(
                "tollgate_store_unsaved_cap_reached",
                "SQLite: 1 when the last failed write had more unsaved keys than the cap and gave some up.",
                f64::from(u8::from(durability.unsaved_cap_reached)),
            ),
            counter(
                "tollgate_audit_dropped_total",
                "Audit rows dropped because the writer lagged.",
                s.store.audit_dropped(),
            ),
            counter(
                "tollgate_access_log_dropped_total",
                "Access records dropped because the log writer lagged.",
                s.access.dropped(),
            ),
            gauge(
                "tollgate_dashboard_limited_keys",
                "Keys rejected lately that the dashboard tracks (at most 128; when full, idle and least rejected keys are replaced).",
                s.activity.limited_keys_tracked() as f64,
            ),
            gauge(
                "tollgate_tunnels_open",
                "Upgraded connections (WebSockets) being tunnelled.",
                s.tunnels.len() as f64,
            ),
            gauge(
                "tollgate_active_bans",
                "Keys banned now (memory, SQLite: exact; Redis: the bans this proxy has seen).",
                s.store.active_bans(s.clock.now()) as f64,
            ),
            counter(
                "tollgate_ban_strikes_dropped_total",
                "New keys whose rejections were not counted towards a ban because the ban table was full.",
                s.store.ban_strikes_dropped(),
            ),
            gauge(
                "tollgate_uptime_seconds",
                "Seconds since start.",
                s.started.elapsed().as_secs_f64(),
            ),
        ],
        process.as_ref(),
    )
}

/// The config in force, with every secret replaced.
pub fn effective_config(c: &Config) -> Value {
    let redis_url = |url: &str| match url.split_once('@') {
        Some((scheme_and_auth, host)) => {
            let scheme = scheme_and_auth.split("://").next().unwrap_or("redis");
            format!("{scheme}://[redacted]@{host}")
        }
        None => url.to_string(),
    };
    let store = match &c.store.backend {
        Backend::Memory => json!({"backend": "memory"}),
        Backend::Sqlite { path } => {
            json!({"backend": "sqlite", "path": path.display().to_string()})
        }
        Backend::Redis {
            url,
            prefix,
            timeout,
        } => {
            json!({"backend": "redis", "url": redis_url(url), "prefix": prefix, "timeout_ms": timeout.as_millis() as u64})
        }
    };
    json!({
        "server": {
            "listen": c.server.listen.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "tls": c.server.tls.as_ref().map(|t| json!({
                "certs": t.certs.iter().map(|x| json!({"cert": x.cert.display().to_string(), "key": x.key.display().to_string(), "hosts": x.hosts})).collect::<Vec<_>>(),
                "listen": t.listen.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                "redirect_plain": t.redirect_plain,
            })),
            "request_header_timeout_ms": c.server.request_header_timeout.as_millis() as u64,
            "max_request_body": c.server.max_request_body,
            "shutdown_grace_ms": c.server.shutdown_grace.as_millis() as u64,
        },
        "admin": {"listen": c.admin.listen.to_string(), "token": c.admin.token.as_ref().map(|_| "[redacted]"), "token_file": c.admin.token_file.as_ref().map(|p| p.display().to_string())},
        "store": store,
        "store_policy": {
            "on_error": c.store.on_error.as_str(),
            "prune_interval_ms": c.store.prune_interval.as_millis() as u64,
            "flush_interval_ms": c.store.flush_interval.as_millis() as u64,
            "max_keys": c.store.max_keys,
        },
        "audit": {"enabled": c.audit.enabled, "retention_s": c.audit.retention.as_secs()},
        "identity": {
            "api_key_header": c.identity.api_key_header.as_str(),
            "api_keys": c.identity.api_keys.iter().map(|k| ApiKey::from_entry(k).short).collect::<Vec<_>>(),
            "api_keys_file": c.identity.api_keys_file.as_ref().map(|(p, _)| p.display().to_string()),
            "trusted_proxies": c.identity.trusted_proxies.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            "ipv6_prefix": c.identity.ipv6_prefix,
            "exempt": c.identity.exempt.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        },
        "upstreams": c.upstreams.iter().map(|u| json!({"name": u.name, "url": u.url.to_string(), "connect_timeout_ms": u.connect_timeout.as_millis() as u64, "timeout_ms": u.timeout.as_millis() as u64, "servers": u.balance.servers.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "max_conns": u.balance.max_conns, "queue": u.balance.queue})).collect::<Vec<_>>(),
        "limiters": c.limiters.iter().map(|l| json!({
            "name": l.name,
            "algorithm": l.algorithm.name(),
            "policy": crate::snapshot::Limiter::describe_policy(&l.algorithm),
            "key": l.key.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "mode": if l.shadow { "shadow" } else { "enforce" },
            // Override keys may be API keys: shown the way logs show keys.
            "overrides": l.overrides.iter().map(|o| json!({"key": if o.key.parse::<std::net::IpAddr>().is_ok() { o.key.clone() } else { ApiKey::from_secret(&o.key).short }, "limit": o.limit})).collect::<Vec<_>>(),
            "count": l.count.as_ref().map(|c| json!({"status": c.status, "header": c.header.as_ref().map(|h| h.as_str())})),
            "ban": l.ban.as_ref().map(|b| json!({"after": b.after, "for_seconds": ceil_secs(b.duration), "status": b.status.as_u16()})),
        })).collect::<Vec<_>>(),
        "routes": c.routes.iter().map(|r| json!({
            "name": r.name,
            "path": r.path, "path_prefix": r.path_prefix, "host": r.host,
            "methods": r.methods.as_ref().map(|m| m.iter().map(|m| m.to_string()).collect::<Vec<_>>()),
            "limiters": r.limiters.iter().map(|&i| c.limiters[i].name.clone()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_keys_are_percent_decoded() {
        assert_eq!(
            query_param("a=1&key=2001%3Adb8%3A%3A1", "key").as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(query_param("key", "key").as_deref(), Some(""));
        assert_eq!(query_param("a=1", "key"), None);
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
}
