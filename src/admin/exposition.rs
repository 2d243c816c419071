//! What `/metrics` shows: the registry's series, then the gauges and counters the app's parts keep themselves, then the upstream gauges.

use std::sync::atomic::Ordering::Relaxed;

use crate::app::{App, Shared};
use crate::metrics::Extra;
use crate::snapshot::Snapshot;
use crate::store::BackendStatus;

/// The whole text exposition for one scrape.
pub async fn metrics_text(app: &App, snap: &Snapshot) -> String {
    let s = &app.shared;
    // /proc reads are file I/O: off the runtime.
    let process = tokio::task::spawn_blocking(crate::metrics::process::sample)
        .await
        .ok()
        .flatten();
    let mut extra = vec![
        Extra::gauge(
            "tollgate_config_version",
            "The version of the config in force (1 at start, +1 per successful reload).",
            snap.version as f64,
        ),
        Extra::gauge(
            "tollgate_open_connections",
            "Client connections open on the public listeners.",
            s.connections.open() as f64,
        ),
    ];
    let store = s.store.status();
    extra.extend(store_series(s, &store));
    extra.extend(traffic_series(s));
    extra.extend(cache_series(snap));
    let mut text = s.metrics.render(&extra, process.as_ref());
    crate::balance::Balancer::render_metrics(&snap.upstreams, &mut text);
    store.render_node_metrics(&mut text);
    crate::crowdsec::render_metrics(snap.crowdsec.as_deref(), &mut text);
    crate::networks::render_metrics(snap.networks.as_deref(), s.clock.now(), &mut text);
    text
}

/// The response cache's size and bound (its counters are in the registry).
fn cache_series(snap: &Snapshot) -> Vec<Extra<'static>> {
    let Some(cache) = &snap.cache else {
        return Vec::new();
    };
    vec![
        Extra::gauge(
            "tollgate_cache_bytes",
            "Bytes the response cache holds by its accounting (bodies, their compressed forms, headers, keys, a per-entry overhead); at most tollgate_cache_max_bytes.",
            cache.weight() as f64,
        ),
        Extra::gauge(
            "tollgate_cache_max_bytes",
            "cache.max_size: the bound on tollgate_cache_bytes.",
            cache.capacity() as f64,
        ),
        Extra::gauge(
            "tollgate_cache_entries",
            "Keys the response cache holds (stored answers, per-URL Vary records, and keys whose answer was not storable, remembered for 10 s).",
            cache.len() as f64,
        ),
    ]
}

/// The store's keys, health and durability.
fn store_series(s: &Shared, store: &BackendStatus) -> Vec<Extra<'static>> {
    let durability = store.durability.clone().unwrap_or_default();
    let keys = s.store.key_counters();
    vec![
        Extra::gauge(
            "tollgate_tracked_keys",
            "Limiter keys held in memory (overflow keys included); at most tollgate_max_keys.",
            s.store.tracked_keys() as f64,
        ),
        Extra::gauge(
            "tollgate_max_keys",
            "store.max_keys: the bound on tollgate_tracked_keys.",
            s.store.max_keys() as f64,
        ),
        Extra::counter(
            "tollgate_keys_evicted_total",
            "Limiter keys forgotten to make room for new ones (store.max_keys): at rest, or live and under half their quota.",
            keys.evicted.load(Relaxed),
        ),
        Extra::counter(
            "tollgate_keys_evicted_live_total",
            "Of tollgate_keys_evicted_total, live keys under half their quota (lightest first): each such client starts afresh.",
            keys.evicted_live.load(Relaxed),
        ),
        Extra::counter(
            "tollgate_keys_overflow_total",
            "Checks counted on their limiter's shared overflow key because the key's shard was full of keys at or over half their quota.",
            keys.overflowed.load(Relaxed),
        ),
        Extra::counter(
            "tollgate_keys_refused_total",
            "Checks refused because the table and its overflow slots were all full of live state.",
            keys.refused.load(Relaxed),
        ),
        Extra::gauge(
            "tollgate_store_healthy",
            "1 when the store answers (SQLite: the last write succeeded; Redis: its circuit breaker is closed).",
            f64::from(u8::from(store.healthy)),
        ),
        Extra::gauge(
            "tollgate_store_unsaved_keys",
            "SQLite: keys whose newest state is only in memory, waiting for a failed write to be retried.",
            durability.unsaved_keys as f64,
        ),
        Extra::gauge(
            "tollgate_store_unsaved_cap_reached",
            "SQLite: 1 when the last failed write had more unsaved keys than the cap and gave some up.",
            f64::from(u8::from(durability.unsaved_cap_reached)),
        ),
        Extra::counter(
            "tollgate_audit_dropped_total",
            "Audit rows dropped because the writer lagged.",
            s.store.audit_dropped(),
        ),
    ]
}

/// Dropped log records, tunnels, bans and uptime.
fn traffic_series(s: &Shared) -> Vec<Extra<'static>> {
    vec![
        Extra::counter(
            "tollgate_access_log_dropped_total",
            "Access records dropped because the log writer lagged or could not write them.",
            s.access.dropped(),
        ),
        Extra::counter(
            "tollgate_access_log_write_errors_total",
            "Failed writes of the access log (a full disk) and failed reopens of log.access_file.",
            s.access.write_errors(),
        ),
        Extra::counter(
            "tollgate_access_log_refusals_folded_total",
            "Refusals counted in a summary line instead of written on their own (log.refusals: first).",
            s.access.refusals_folded(),
        ),
        Extra::gauge(
            "tollgate_access_log_refusal_windows",
            "log.refusals: first's open windows (bounded; when all are taken, other clients' refusals are written in full).",
            s.access.refusal_windows() as f64,
        ),
        Extra::gauge(
            "tollgate_dashboard_limited_keys",
            "Keys rejected lately that the dashboard tracks (at most 128; when full, idle and least rejected keys are replaced).",
            s.activity.limited_keys_tracked() as f64,
        ),
        Extra::gauge(
            "tollgate_tunnels_open",
            "Upgraded connections (WebSockets) being tunnelled.",
            s.tunnels.len() as f64,
        ),
        Extra::gauge(
            "tollgate_active_bans",
            "Keys banned now (memory, SQLite: exact; Redis: the bans this proxy has seen).",
            s.store.active_bans(s.clock.now()) as f64,
        ),
        Extra::counter(
            "tollgate_ban_strikes_dropped_total",
            "New keys whose rejections were not counted towards a ban because the ban table was full.",
            s.store.ban_strikes_dropped(),
        ),
        Extra::gauge(
            "tollgate_uptime_seconds",
            "Seconds since start.",
            s.started.elapsed().as_secs_f64(),
        ),
    ]
}
