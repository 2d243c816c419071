//! The live dashboard on the admin listener: its page (compiled in), its data, and the sampler that feeds it.
//!
//! What it shows besides the counters (keys limited lately, recent rates,
//! the last reload) is kept by [`crate::activity`], which the request path
//! and the reloader record into. Bans come from `GET /bans`, which the page
//! asks for itself.
//!
//! The page, its script and its stylesheet hold no data and are served
//! without the token; `GET /dashboard.json` holds the data and needs it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::acme::state::{Attention, Managed};
use crate::activity::{RouteCounts, SAMPLE_EVERY};
use crate::app::App;
use crate::metrics::Decision;

pub const PAGE: &str = include_str!("dashboard/index.html");
pub const SCRIPT: &str = include_str!("dashboard/dashboard.js");
pub const STYLE: &str = include_str!("dashboard/dashboard.css");

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Copies the route counters into the history every `SAMPLE_EVERY` until `stop`.
pub async fn sample_loop(app: App, stop: CancellationToken) {
    loop {
        let snap = app.snapshot();
        let routes = snap
            .routes
            .iter()
            .map(|r| {
                let m = &r.metrics;
                let statuses = &m.series.statuses;
                let counts = RouteCounts {
                    requests: Decision::ALL.iter().map(|&d| m.requests(d)).sum(),
                    rejections: m.requests(Decision::Rejected)
                        + m.requests(Decision::Banned)
                        + m.requests(Decision::CrowdSec),
                    responses: statuses.sum(100..=999),
                    server_errors: statuses.sum(500..=599),
                    challenges: m.requests(Decision::Challenged),
                };
                (r.name.clone(), counts)
            })
            .collect();
        drop(snap);
        app.shared.activity.record_sample(unix_ms(), routes);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

/// Every managed (ACME) name with its expiry and why it needs attention, if it does.
fn certificates(managed: &Managed, now_secs: u64) -> Value {
    let list: Vec<Value> = managed
        .statuses()
        .into_iter()
        .map(|(domain, s)| {
            json!({
                "domain": domain,
                "not_after": s.not_after.map(crate::clock::iso8601),
                "days_left": s.not_after.map(|t| round1(t.saturating_sub(now_secs) as f64 / 86_400.0)),
                "attention": s.attention(now_secs).map(Attention::as_str),
                "last_error": s.last_error,
            })
        })
        .collect();
    json!(list)
}

/// Everything the page shows but the bans, as `GET /dashboard.json` answers it;
/// `managed`: the names `server.tls.acme` orders.
pub fn data(app: &App, managed: &Managed) -> Value {
    let snap = app.snapshot();
    let shared = &app.shared;
    let now = shared.clock.now();
    let names: Vec<Arc<str>> = snap.routes.iter().map(|r| r.name.clone()).collect();
    let (times, mut routes) = shared.activity.rates(&names);
    for (r, v) in snap.routes.iter().zip(routes.iter_mut()) {
        since_start(r, v);
    }
    let limited = shared.activity.limited_now(now);
    let store = shared.store.status();
    json!({
        "version": snap.version,
        "uptime_seconds": shared.started.elapsed().as_secs(),
        "last_reload_error": *shared.last_reload_error.lock(),
        "last_reload": shared.activity.last_reload().map(|r| json!({
            "at": r.at,
            "at_utc": crate::clock::iso8601(r.at),
            "result": if r.ok { "ok" } else { "error" },
        })),
        "store": {
            "backend": shared.store.backend(),
            "healthy": store.healthy,
            // Redis' breaker is open exactly when it is unhealthy (on a
            // cluster: when any primary's is open, see `nodes`).
            "breaker": store.breaker_open.map(|open| if open { "open" } else { "closed" }),
            "tracked_keys": shared.store.tracked_keys(),
            "topology": store.topology,
            "nodes": nodes_json(&store.nodes),
        },
        "upstreams": snap.upstreams.iter().map(|u| u.status()).collect::<Vec<_>>(),
        "sample_seconds": SAMPLE_EVERY.as_secs(),
        "times": times,
        "routes": routes,
        "limited": limited,
        "certificates": certificates(managed, now / 1_000_000_000),
        "crowdsec": snap.crowdsec.as_ref().map(|c| {
            let h = c.health();
            json!({"up": h.up, "held": h.held, "waiting": h.waiting,
                   "last_pull": (h.last_pull > 0).then(|| crate::clock::iso8601(h.last_pull / 1_000_000_000))})
        }),
        "proxy_protocol_refused": shared.proxy_protocol.refused_total(),
        "networks": snap.networks.as_ref().map(|n| {
            n.top(crate::networks::TOP_SHOWN, now)
                .into_iter()
                .map(|(asn, requests)| json!({"asn": asn, "requests": requests}))
                .collect::<Vec<_>>()
        }),
    })
}

/// A route's figures since start, added to its `rates` entry `v`.
fn since_start(r: &crate::snapshot::Route, v: &mut Value) {
    // Latency, from the request duration histograms (every decision).
    let ms = |q| r.metrics.series.quantile(q).map(|s| round1(s * 1000.0));
    v["p50_ms"] = json!(ms(0.5));
    v["p99_ms"] = json!(ms(0.99));
    // Answers site rules made, by kind (redirect, respond, denied, unauthenticated).
    let site: serde_json::Map<String, Value> = crate::metrics::SiteAnswer::ALL
        .iter()
        .map(|&k| (k.as_str().to_string(), json!(r.metrics.answers(k))))
        .collect();
    v["site_answers"] = Value::Object(site);
    // Caching routes: the share answered from the cache, and the upstream renders it saved.
    v["cache"] = r.cache.as_ref().map_or(Value::Null, |c| {
        let load = |n: &crate::metrics::Counter| n.load(std::sync::atomic::Ordering::Relaxed);
        let (served, forwarded) = (c.saved(), load(&c.miss) + load(&c.bypass));
        let ratio = (served + forwarded > 0).then(|| served as f64 / (served + forwarded) as f64);
        json!({"hit_ratio": ratio, "renders_saved": served})
    });
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// A Sentinel group's or cluster's nodes as `/readyz` and `/dashboard.json`
/// show them; `breaker` is a cluster primary's own (`"open"`/`"closed"`),
/// null for nodes without one.
pub fn nodes_json(nodes: &[crate::store::NodeStatus]) -> Value {
    let breaker = |open: Option<bool>| open.map(|o| if o { "open" } else { "closed" });
    nodes
        .iter()
        .map(|n| json!({"addr": n.addr, "role": n.role, "healthy": n.healthy, "breaker": breaker(n.breaker_open)}))
        .collect()
}
