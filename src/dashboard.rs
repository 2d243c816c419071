//! The live dashboard on the admin listener: its page (compiled in), its data, and the sampler that feeds it.
//!
//! What it shows besides the counters (keys limited lately, recent rates) is
//! kept by [`crate::activity`], which the request path records into.
//!
//! The page, its script and its stylesheet hold no data and are served
//! without the token; `GET /dashboard.json` holds the data and needs it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::activity::SAMPLE_EVERY;
use crate::app::App;

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
                let rejected = m.rejected.load(Ordering::Relaxed);
                let requests = m.allowed.load(Ordering::Relaxed)
                    + rejected
                    + m.exempt.load(Ordering::Relaxed)
                    + m.store_error.load(Ordering::Relaxed);
                (r.name.clone(), requests, rejected)
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

/// Everything the page shows, as `GET /dashboard.json` answers it.
pub fn data(app: &App) -> Value {
    let snap = app.snapshot();
    let shared = &app.shared;
    let now = shared.clock.now();
    let names: Vec<Arc<str>> = snap.routes.iter().map(|r| r.name.clone()).collect();
    let (times, routes) = shared.activity.rates(&names);
    let limited = shared.activity.limited_now(now);
    let backend = shared.store.backend();
    let healthy = shared.store.healthy();
    json!({
        "version": snap.version,
        "uptime_seconds": shared.started.elapsed().as_secs(),
        "last_reload_error": *shared.last_reload_error.lock(),
        "store": {
            "backend": backend,
            "healthy": healthy,
            // Only Redis has a circuit breaker; it is open exactly when Redis is unhealthy.
            "breaker": (backend == "redis").then_some(if healthy { "closed" } else { "open" }),
            "tracked_keys": shared.store.tracked_keys(),
        },
        "sample_seconds": SAMPLE_EVERY.as_secs(),
        "times": times,
        "routes": routes,
        "limited": limited,
    })
}
