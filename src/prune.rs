//! Pruning, in one task: expired limiter state, the state of limiters a reload removed once their grace ends, and old audit rows.
//!
//! The task runs every `store.prune_interval` (read again each round, so a
//! reload changes it) and at once when a [`Trigger`] asks.
//!
//! A limiter a reload removes is pruned like a live one for a grace period
//! ([`grace`]): its keys are forgotten only once at rest, so re-adding it
//! with the same algorithm and window resumes its counts. A bad edit and its
//! revert must not hand every exhausted client a fresh quota.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::config::LimiterConfig;
use crate::limiter::{Algorithm, Nanos};
use crate::workers::{self, Workers};

/// How long a removed concurrency limiter's state is kept: it counts
/// requests in flight, which have no window to outlast.
pub const CONCURRENCY_GRACE: Duration = Duration::from_secs(300);

/// How long the state of a limiter a reload removed is kept: twice its
/// window (a fixed window's previous window still counts), or twice the
/// time its bucket takes to refill completely.
pub fn grace(algorithm: &Algorithm) -> Nanos {
    match algorithm.ban_window() {
        Some(span) => span.saturating_mul(2),
        None => CONCURRENCY_GRACE.as_nanos() as Nanos,
    }
}

/// Asks the prune task for a round now instead of at its next interval, and
/// holds the limiters reloads removed while their grace lasts.
#[derive(Clone, Default)]
pub struct Trigger {
    notify: Arc<Notify>,
    retired: Arc<Mutex<Vec<Retired>>>,
}

/// A removed limiter, kept until `until`.
struct Retired {
    limiter: LimiterConfig,
    until: Nanos,
}

impl Trigger {
    /// Requests a round; requests made while one runs fold into the next.
    pub fn now(&self) {
        self.notify.notify_one();
    }

    /// Keeps the state of `removed` (limiters a reload took out at `now`)
    /// for their grace, then asks for a round.
    pub fn retire(&self, removed: Vec<LimiterConfig>, now: Nanos) {
        let mut retired = self.retired.lock();
        for limiter in removed {
            retired.retain(|r| r.limiter.name != limiter.name);
            let until = now.saturating_add(grace(&limiter.algorithm));
            retired.push(Retired { limiter, until });
        }
        drop(retired);
        self.now();
    }

    /// The removed limiters still in their grace at `now` and not back in
    /// `live`; the others are forgotten, and the next round prunes their state.
    fn in_grace(&self, now: Nanos, live: &[LimiterConfig]) -> Vec<LimiterConfig> {
        let mut retired = self.retired.lock();
        retired.retain(|r| r.until > now && !live.iter().any(|l| l.name == r.limiter.name));
        retired.iter().map(|r| r.limiter.clone()).collect()
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
            _ = trigger.notify.notified() => {}
        }
        let removed = prune_once(&app, &trigger).await;
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
/// the limiters in their grace count as live. Returns how many keys it removed.
async fn prune_once(app: &App, trigger: &Trigger) -> usize {
    let snap = app.snapshot();
    let now = app.shared.clock.now();
    let mut limiters = snap.config.stored_limiters();
    limiters.extend(trigger.in_grace(now, &limiters));
    let retention = snap
        .config
        .audit
        .enabled
        .then_some(snap.config.audit.retention);
    let shared = app.shared.clone();
    tokio::task::spawn_blocking(move || {
        let removed = shared.store.prune(now, &limiters, retention);
        workers::release_memory();
        removed
    })
    .await
    .unwrap_or(0)
}
