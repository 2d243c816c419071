//! The Redis store's background probe: finds Redis down at start, closes an open breaker when Redis answers again, follows Sentinel's primary and reads a cluster's nodes and slot owners.
//!
//! Requests never probe: no request waits on a Redis that is known to be
//! down. The probe runs every 100 ms but acts only when something is due
//! (the first look, an open breaker's cool-down, or the topology's periodic
//! check every [`PROBE_INTERVAL`]), each step bounded by the store's timeout.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::owners::Owner;
use super::topology::{Link, NodeHealth};
use super::{Inner, PROBE_INTERVAL};

/// Probes Redis in the background: at start (so a Redis that is down opens
/// the breaker before any request pays the timeout), while the breaker is
/// open, and — for Sentinel and a cluster — every [`PROBE_INTERVAL`] while
/// healthy, so a new primary or a failed node is seen without an error. A
/// probe's fresh connection replaces the old one when it answers, except a
/// healthy store's periodic check, which switches only to a new primary.
pub(super) async fn probe_loop(inner: Weak<Inner>) {
    let mut first = true;
    let mut last_watch = tokio::time::Instant::now();
    loop {
        if !first {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let watch = inner.link.watched() && last_watch.elapsed() >= PROBE_INTERVAL;
        let healthy = !inner.breaker.is_open();
        let due = first || inner.breaker.probe_due() || (healthy && watch);
        if !due {
            continue;
        }
        last_watch = tokio::time::Instant::now();
        let was_first = std::mem::take(&mut first);
        let wait = inner.timeout.max(Duration::from_secs(1)) * 2;
        // A cluster is re-read on the connection it has (see `Link::probe`).
        let current = inner.conn.load_full().filter(|_| !was_first);
        let known = known_nodes(&inner);
        let probe = inner.link.probe(current.as_deref(), &known, inner.timeout);
        let probe = tokio::time::timeout(wait, probe).await;
        let (conn, nodes) = probe.unwrap_or((None, Vec::new()));
        if inner.link.watched() {
            inner.nodes.store(Arc::new(nodes.clone()));
        }
        if inner.spread {
            probe_primaries(&inner, &nodes).await;
        }
        match conn {
            Some(conn) => {
                let switch = !healthy || was_first || new_primary(&inner, &nodes);
                if switch {
                    inner.conn.store(Some(Arc::new(conn)));
                    inner.primary.store(Some(Arc::new(primary_of(&nodes))));
                }
                if !healthy && inner.breaker.success() {
                    tracing::info!("Redis answers again; shared limits resume");
                }
            }
            None if was_first => {
                if inner.breaker.trip() {
                    tracing::warn!(
                        "Redis does not answer at start; on_error applies until it does"
                    );
                }
            }
            None if healthy => {} // the periodic check failed; requests' own errors decide
            None => {
                inner.breaker.failure();
            }
        }
    }
}

/// A cluster: takes the slot map the probe read, then pings each primary
/// whose breaker is open and due, on a connection of its own
/// ([`Link::dial`]); the first answer closes it. All at once, each bounded
/// like a request's call.
async fn probe_primaries(inner: &Inner, nodes: &[NodeHealth]) {
    let served: Vec<(String, Vec<(u16, u16)>)> = nodes
        .iter()
        .filter(|n| n.role == "primary")
        .map(|n| (n.addr.clone(), n.slots.clone()))
        .collect();
    inner.owners.update(&served);
    let due: Vec<Arc<Owner>> = inner
        .owners
        .all()
        .into_iter()
        .filter(|o| o.breaker.probe_due())
        .collect();
    let pings = due.iter().map(|o| async move {
        let ping = async {
            let mut con = inner.link.dial(&o.addr, inner.timeout).await?;
            ::redis::cmd("PING").query_async::<()>(&mut con).await
        };
        let answered = matches!(tokio::time::timeout(inner.timeout, ping).await, Ok(Ok(())));
        if !answered {
            o.breaker.failure();
        } else if o.breaker.success() {
            tracing::info!(node = %o.addr, "Redis primary answers again; shared limits resume for its slots");
        }
    });
    futures_util::future::join_all(pings).await;
}

/// A cluster's nodes as the last probe saw them (`host:port`).
pub(super) fn known_nodes(inner: &Inner) -> Vec<String> {
    inner.nodes.load().iter().map(|n| n.addr.clone()).collect()
}

/// Sentinel named another primary than the one requests use.
fn new_primary(inner: &Inner, nodes: &[NodeHealth]) -> bool {
    matches!(inner.link, Link::Sentinel { .. })
        && inner.primary.load().as_deref().map(String::as_str) != Some(primary_of(nodes).as_str())
}

fn primary_of(nodes: &[NodeHealth]) -> String {
    nodes
        .iter()
        .find(|n| n.role == "primary" && n.healthy)
        .map_or_else(String::new, |n| n.addr.clone())
}
