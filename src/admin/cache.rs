//! `GET /cache` (entries, bytes, hit ratio, per route) and `DELETE /cache` (everything, a path prefix, a host).

use std::sync::atomic::Ordering::Relaxed;

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::{json_response, query_param};
use crate::body::Body;
use crate::problem::admin_error;
use crate::snapshot::Snapshot;

/// Hits over lookups, or `null` before the first lookup.
fn ratio(hits: u64, others: u64) -> Value {
    match hits + others {
        0 => Value::Null,
        n => json!(hits as f64 / n as f64),
    }
}

/// `GET /cache`.
pub fn status(snap: &Snapshot) -> Response<Body> {
    let Some(cache) = &snap.cache else {
        return json_response(StatusCode::OK, json!({"enabled": false}));
    };
    let (hits, misses) = (cache.hits.load(Relaxed), cache.misses.load(Relaxed));
    let routes: Vec<Value> = snap
        .routes
        .iter()
        .filter_map(|r| Some((r, r.cache.as_ref()?)))
        .map(|(r, c)| {
            let [hit, miss, stale, bypass] =
                [&c.hit, &c.miss, &c.stale, &c.bypass].map(|n| n.load(Relaxed));
            json!({
                "route": &*r.name, "hit": hit, "miss": miss, "stale": stale, "bypass": bypass,
                "hit_ratio": ratio(hit + stale, miss + bypass), "renders_saved": c.saved(),
            })
        })
        .collect();
    json_response(
        StatusCode::OK,
        json!({
            "enabled": true,
            "entries": cache.len(),
            "bytes": cache.weight(),
            "max_bytes": cache.capacity(),
            "hits": hits,
            "misses": misses,
            "hit_ratio": ratio(hits, misses),
            "evictions": cache.evictions.load(Relaxed),
            "stored": cache.stored.load(Relaxed),
            "renders_in_flight": cache.flights.len(),
            "routes": routes,
        }),
    )
}

/// `DELETE /cache`, `DELETE /cache?prefix=/blog/`, `DELETE /cache?host=shop.example` (or both).
pub fn purge(snap: &Snapshot, query: &str) -> Response<Body> {
    let Some(cache) = &snap.cache else {
        return admin_error(StatusCode::NOT_FOUND, "No cache is configured (`cache:`).");
    };
    let prefix = query_param(query, "prefix");
    let host = query_param(query, "host");
    if prefix.as_deref().is_some_and(|p| !p.starts_with('/')) {
        return admin_error(
            StatusCode::BAD_REQUEST,
            "`prefix` is a path: it starts with /.",
        );
    }
    let removed = cache.purge(prefix.as_deref(), host.as_deref());
    json_response(
        StatusCode::OK,
        json!({"removed": removed, "prefix": prefix, "host": host, "entries": cache.len()}),
    )
}
