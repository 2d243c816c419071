//! Pruning, in one task: expired limiter state, the state of limiters a reload removed, and old audit rows.
//!
//! The task runs every `store.prune_interval` (read again each round, so a
//! reload changes it) and at once when a [`Trigger`] asks: a reload that
//! removed limiters drops their state without waiting for the next round.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::workers::{self, Workers};

/// Asks the prune task for a round now instead of at its next interval.
#[derive(Clone, Default)]
pub struct Trigger(Arc<Notify>);

impl Trigger {
    /// Requests a round; requests made while one runs fold into the next.
    pub fn now(&self) {
        self.0.notify_one();
    }
}

/// Prunes every `store.prune_interval`, and when `trigger` asks, until `stop`.
pub async fn prune_loop(
    app: App,
    workers: Option<Arc<Workers>>,
    trigger: Trigger,
    stop: CancellationToken,
) {
    loop {
        let every = app.snapshot().config.store.prune_interval;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
            _ = trigger.0.notified() => {}
        }
        let removed = prune_once(&app).await;
        if removed > 0 {
            if let Some(w) = &workers {
                w.release_memory();
            }
            workers::release_memory();
        }
        tracing::debug!(removed, "pruned expired limiter state");
    }
}

/// One round on a blocking thread (the store's SQLite and table walks block);
/// returns how many keys it removed.
async fn prune_once(app: &App) -> usize {
    let snap = app.snapshot();
    let now = app.shared.clock.now();
    let retention = snap
        .config
        .audit
        .enabled
        .then_some(snap.config.audit.retention);
    let shared = app.shared.clone();
    tokio::task::spawn_blocking(move || {
        let removed = shared.store.prune(now, &snap.config.limiters, retention);
        workers::release_memory();
        removed
    })
    .await
    .unwrap_or(0)
}
