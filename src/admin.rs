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
use crate::key;
use crate::limiter::{ceil_secs, NANOS_PER_SEC};
use crate::problem::admin_error;
use crate::reload::Reloader;
use crate::snapshot::Snapshot;
use crate::store::BackendStatus;
use guard::AdminRefusal;

mod bans;
mod cache;
mod certificates;
mod effective;
mod exposition;
mod guard;

pub use effective::effective_config;

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
    if let Some(refused) = refusal(&req, &snap, peer) {
        return refused;
    }
    let path = req.uri().path();
    if req.method() == Method::GET {
        if let Some(page) = dashboard(app, reloader, path) {
            return page;
        }
    }
    match (req.method(), path) {
        (&Method::GET, "/healthz") => json_response(StatusCode::OK, json!({"status": "ok"})),
        (&Method::GET, "/readyz") => readiness(app, &snap),
        (&Method::GET, "/metrics") => metrics(app, reloader, &snap).await,
        (&Method::GET, "/certificates") => json_response(
            StatusCode::OK,
            certificates::list(reloader.certificates(), &snap),
        ),
        (&Method::GET, "/status") | (&Method::DELETE, "/status") => {
            client_status(app, &snap, &req).await
        }
        (&Method::POST, "/reload") => match strict(req.uri().query().unwrap_or("")) {
            Some(strict) => reload(app, reloader, &snap, strict).await,
            // A misspelt flag must not reload without the check it asked for.
            None => admin_error(StatusCode::BAD_REQUEST, "strict is true or false."),
        },
        (&Method::GET, "/bans") => bans::list(app, &snap, req.uri().query().unwrap_or("")).await,
        (&Method::DELETE, p) if p.starts_with("/bans/") => {
            bans::lift(app, &p["/bans/".len()..]).await
        }
        (&Method::GET, "/cache") => cache::status(&snap),
        (&Method::DELETE, "/cache") => cache::purge(&snap, req.uri().query().unwrap_or("")),
        (&Method::GET, "/upstreams") => json_response(
            StatusCode::OK,
            json!({"upstreams": upstreams_status(&snap)}),
        ),
        (&Method::GET, "/config") => json_response(StatusCode::OK, config_view(app, &snap)),
        (_, p) => unknown(p),
    }
}

/// The dashboard's page, its assets and its data, for a GET of `path`.
fn dashboard(app: &App, reloader: &Reloader, path: &str) -> Option<Response<Body>> {
    Some(match path {
        "/" => asset(crate::dashboard::PAGE, "text/html; charset=utf-8"),
        "/dashboard.js" => asset(crate::dashboard::SCRIPT, "text/javascript; charset=utf-8"),
        "/dashboard.css" => asset(crate::dashboard::STYLE, "text/css; charset=utf-8"),
        "/dashboard.json" => {
            let data = crate::dashboard::data(app, reloader.certificates());
            let mut resp = json_response(StatusCode::OK, data);
            resp.headers_mut().insert(
                http::header::CACHE_CONTROL,
                HeaderValue::from_static("no-store"),
            );
            resp
        }
        _ => return None,
    })
}

/// `POST /reload`'s `strict` flag: false when absent, `None` when misspelt.
fn strict(query: &str) -> Option<bool> {
    match query_param(query, "strict").as_deref() {
        None | Some("false") => Some(false),
        Some("true") => Some(true),
        Some(_) => None,
    }
}

/// `GET /config`: the effective config (secrets redacted), its version and source.
fn config_view(app: &App, snap: &Snapshot) -> serde_json::Value {
    json!({
        "version": snap.version,
        "path": app.shared.config_path.as_ref().map(|p| p.display().to_string()),
        "last_reload_error": *app.shared.last_reload_error.lock(),
        "config": effective_config(&snap.config),
    })
}

/// The guard phase: token and `Host` checks; the refusal to send, if any.
fn refusal(req: &Request<Incoming>, snap: &Snapshot, peer: SocketAddr) -> Option<Response<Body>> {
    let path = req.uri().path();
    // Probes need no secret; the dashboard's page, script and style hold no
    // data (its JSON does, and needs the token).
    let open = matches!(
        path,
        "/healthz" | "/readyz" | "/" | "/dashboard.js" | "/dashboard.css"
    );
    let token = snap.config.admin.token.as_deref();
    match guard::admit(req, token, open) {
        Ok(()) => {}
        Err(AdminRefusal::Unauthorized) => {
            let mut resp = admin_error(
                StatusCode::UNAUTHORIZED,
                "This admin call needs `Authorization: Bearer <token>`.",
            );
            resp.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
            return Some(resp);
        }
        Err(AdminRefusal::CrossSite) => {
            tracing::warn!(%peer, origin = ?req.headers().get(http::header::ORIGIN), site = ?req.headers().get("sec-fetch-site"), method = %req.method(), path, "admin call refused: sent by a page of another site (cross-site request forgery?)");
            return Some(admin_error(
                StatusCode::FORBIDDEN,
                "This admin call changes state and was sent by a page of another origin; call it from the dashboard, curl or `tollgate reload`.",
            ));
        }
        Err(AdminRefusal::ForeignHost) => {
            tracing::warn!(%peer, host = ?req.headers().get(http::header::HOST), path, "admin call refused: no token is set and the Host is not a loopback name");
            return Some(admin_error(
                StatusCode::FORBIDDEN,
                "Without admin.token this API answers only Host: localhost, 127.0.0.1 or [::1].",
            ));
        }
    }
    if token.is_none() && guard::changes_state(req.method()) {
        tracing::warn!(%peer, method = %req.method(), path, "admin call without a token changes state (set admin.token to require one)");
    }
    None
}

/// `GET /readyz`: 503 while the store does not answer.
fn readiness(app: &App, snap: &Snapshot) -> Response<Body> {
    let store = app.shared.store.status();
    let healthy = store.healthy;
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(
        status,
        json!({"ready": healthy, "config_version": snap.version, "store": store_readiness(app, store)}),
    )
}

/// `GET /metrics`: the Prometheus text exposition.
async fn metrics(app: &App, reloader: &Reloader, snap: &Snapshot) -> Response<Body> {
    let mut text = exposition::metrics_text(app, snap).await;
    reloader.certificates().render_metrics(&mut text);
    let mut resp = Response::new(Body::full(text));
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// `GET /status?key=`: one client's state; `DELETE /status?key=`: reset it.
async fn client_status(app: &App, snap: &Snapshot, req: &Request<Incoming>) -> Response<Body> {
    let Some(k) = query_param(req.uri().query().unwrap_or(""), "key") else {
        return admin_error(
            StatusCode::BAD_REQUEST,
            "Pass the client as ?key=<IP or API key>.",
        );
    };
    if req.method() == Method::GET {
        return match status(app, snap, &k).await {
            Ok(v) => json_response(StatusCode::OK, v),
            Err(e) => admin_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        };
    }
    let keys: Vec<String> = status_keys(snap, &k)
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

/// `POST /reload`: the new version and its warnings, or the errors (422);
/// with `?strict=true` a config with warnings is refused too.
async fn reload(app: &App, reloader: &Reloader, snap: &Snapshot, strict: bool) -> Response<Body> {
    match reloader.reload_with(strict).await {
        Ok(version) => {
            // The snapshot the reload installed (a later reload would carry a higher version).
            let now = app.snapshot();
            let warnings: Vec<String> = if now.version == version {
                now.config
                    .warnings
                    .iter()
                    .map(ToString::to_string)
                    .collect()
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
    }
}

/// A known path with the wrong method (405 and `Allow`), or an unknown path (404).
fn unknown(path: &str) -> Response<Body> {
    match path {
        "/status" | "/cache" => not_allowed("GET, DELETE"),
        "/reload" => not_allowed("POST"),
        p if p.starts_with("/bans/") => not_allowed("DELETE"),
        "/healthz" | "/readyz" | "/metrics" | "/config" | "/upstreams" | "/bans" | "/certificates" | "/"
        | "/dashboard.js" | "/dashboard.css" | "/dashboard.json" => not_allowed("GET"),
        _ => admin_error(
            StatusCode::NOT_FOUND,
            "Admin paths: / (dashboard), /dashboard.json, /status, /bans, /bans/{key}, /upstreams, /cache, /certificates, /metrics, /healthz, /readyz, /reload, /config.",
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
                "limiter": &*l.name,
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

/// The store part of `/readyz`: a backend with servers adds them (Redis:
/// its topology and nodes), one that persists what waits for a failing disk.
fn store_readiness(app: &App, store: BackendStatus) -> Value {
    let mut out = json!({"backend": app.shared.store.backend(), "healthy": store.healthy});
    if let Some(topology) = store.topology {
        out["topology"] = topology.into();
        out["nodes"] = crate::dashboard::nodes_json(&store.nodes);
    }
    if let Some(d) = store.durability {
        out["unsaved_keys"] = d.unsaved_keys.into();
        out["unsaved_dropped_total"] = d.unsaved_dropped_total.into();
        out["unsaved_cap_reached"] = d.unsaved_cap_reached.into();
        out["write_errors_total"] = d.write_errors_total.into();
        out["last_error"] = d.last_error.into();
    }
    out
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
}
