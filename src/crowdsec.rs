//! CrowdSec both ways (`identity.crowdsec`): decisions pulled from a Local API's stream and held in memory with their expiry, checked per request without waiting; tollgate's own bans pushed back as alerts, so the firewall bouncer and every other bouncer act on them.
//!
//! One task ([`follow`]) talks to the Local API: it pulls everything in
//! force at start (`startup=true`), then what changed every `poll_every`,
//! and pushes queued bans as soon as they come. The request path only reads
//! the table ([`CrowdSec::check`]) and queues bans
//! ([`CrowdSec::push_ban`]): neither waits on the network.
//!
//! Fail-open: while the Local API cannot be reached, requests are served as
//! before; the decisions already held keep applying until their own
//! expiry, and no new ones arrive. The outage is logged once, counted
//! (`tollgate_crowdsec_pulls_total{result="error"}`), shown by
//! `tollgate_crowdsec_up` and the dashboard; once the API answers again,
//! the whole set is pulled afresh. Queued bans wait (bounded, see
//! `push.queue`) and go out when it is back.
//!
//! Bounded: at most `max_decisions` held (past it new ones are dropped and
//! counted), at most `push.queue` bans waiting, one answer read up to
//! [`ANSWER_BYTES_PER_DECISION`] × `max_decisions`.

pub mod decisions;
pub mod lapi;
pub mod push;

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::CrowdsecConfig;
use crate::limiter::Nanos;
use crate::metrics::{inc, Counter, Metrics};
use decisions::{Added, DecisionTable};
pub use decisions::{Held, Remedy};
use lapi::{Delta, Lapi, LapiError};
pub use push::OwnBan;

/// What one decision may take of a startup answer (a decision is ~200 bytes of JSON).
pub const ANSWER_BYTES_PER_DECISION: usize = 1024;
/// Alerts sent in one `POST /v1/alerts` at most.
const ALERTS_PER_CALL: usize = 100;

/// One Local API: its decisions held, its health, the bans waiting for it.
pub struct CrowdSec {
    config: CrowdsecConfig,
    table: RwLock<DecisionTable>,
    lapi: Lapi,
    /// The Local API answered the last pull.
    up: AtomicBool,
    /// An outage was logged (once per outage, and once before a first answer).
    said_down: AtomicBool,
    /// When the last pull succeeded (Unix ns; 0: never).
    last_pull: AtomicU64,
    push: Option<push::Queue>,
    /// The machine's token, once logged in.
    token: Mutex<Option<String>>,
    counters: CrowdsecCounters,
}

struct CrowdsecCounters {
    pulls_ok: Counter,
    pulls_error: Counter,
    /// Requests a decision applied to, by [`Remedy::ALL`].
    applied: [Counter; 2],
    dropped: Counter,
    ignored_scope: Counter,
    ignored_type: Counter,
    pushed: Counter,
    push_errors: Counter,
    push_dropped: Counter,
}

pub const PULLS: &str = "tollgate_crowdsec_pulls_total";
pub const APPLIED: &str = "tollgate_crowdsec_applied_total";
pub const DROPPED: &str = "tollgate_crowdsec_decisions_dropped_total";
pub const IGNORED: &str = "tollgate_crowdsec_decisions_ignored_total";
pub const PUSHED: &str = "tollgate_crowdsec_bans_pushed_total";

impl CrowdsecCounters {
    fn new(m: &Metrics) -> CrowdsecCounters {
        let pushed = |r| m.counter(PUSHED, &[("result", r)]);
        CrowdsecCounters {
            pulls_ok: m.counter(PULLS, &[("result", "ok")]),
            pulls_error: m.counter(PULLS, &[("result", "error")]),
            applied: Remedy::ALL.map(|r| m.counter(APPLIED, &[("type", r.as_str())])),
            dropped: m.counter(DROPPED, &[]),
            ignored_scope: m.counter(IGNORED, &[("reason", "scope")]),
            ignored_type: m.counter(IGNORED, &[("reason", "type")]),
            pushed: pushed("ok"),
            push_errors: pushed("error"),
            push_dropped: pushed("dropped"),
        }
    }
}

/// The health the dashboard and `/metrics` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub up: bool,
    pub held: usize,
    /// Unix ns of the last successful pull (0: none yet).
    pub last_pull: Nanos,
    /// Bans waiting to be pushed.
    pub waiting: usize,
}

impl CrowdSec {
    pub fn new(config: &CrowdsecConfig, metrics: &Metrics) -> Arc<CrowdSec> {
        let limit = config
            .max_decisions
            .saturating_mul(ANSWER_BYTES_PER_DECISION)
            .max(1 << 20);
        Arc::new(CrowdSec {
            lapi: Lapi::new(&config.url, &config.api_key, config.timeout, limit),
            table: RwLock::new(DecisionTable::new(config.max_decisions)),
            up: AtomicBool::new(false),
            said_down: AtomicBool::new(false),
            last_pull: AtomicU64::new(0),
            push: config.push.as_ref().map(|p| push::Queue::new(p.queue)),
            token: Mutex::new(None),
            counters: CrowdsecCounters::new(metrics),
            config: config.clone(),
        })
    }

    /// Whether this one is what `config` asks for (a reload keeps it, and its decisions).
    pub fn serves(&self, config: &CrowdsecConfig) -> bool {
        self.config == *config
    }

    /// The strongest decision in force on `ip` at `now`, if any. A read lock
    /// and a few hash probes (see [`decisions`]).
    pub fn check(&self, ip: IpAddr, now: Nanos) -> Option<Held> {
        self.table.read().check(ip, now)
    }

    /// Counts a request a decision was applied to.
    pub fn applied(&self, remedy: Remedy) {
        inc(&self.counters.applied[remedy as usize]);
    }

    /// Queues a ban tollgate started on `key_value` (a limiter's key) for
    /// the Local API, when pushing is configured and the key names an
    /// address. Never waits: a full queue drops it (counted).
    pub fn push_ban(&self, limiter: &str, key_value: &str, duration: Duration, now: Nanos) {
        let Some(queue) = &self.push else { return };
        let Some(target) = crate::key::address_of(key_value) else {
            return;
        };
        let ban = OwnBan {
            target,
            limiter: limiter.to_string(),
            duration,
            at: now,
        };
        if !queue.offer(ban) {
            inc(&self.counters.push_dropped);
        }
    }

    pub fn health(&self) -> Health {
        Health {
            up: self.up.load(Ordering::Relaxed),
            held: self.table.read().len(),
            last_pull: self.last_pull.load(Ordering::Relaxed),
            waiting: self.push.as_ref().map_or(0, push::Queue::len),
        }
    }

    /// Applies one answer of the stream at `now`: a startup answer replaces
    /// everything held. Decisions of scopes other than `Ip`/`Range`, of
    /// types other than `ban`/`captcha`, or already over are skipped.
    pub fn apply(&self, delta: &Delta, startup: bool, now: Nanos) {
        let mut table = self.table.write();
        if startup {
            table.clear();
        }
        for d in &delta.deleted {
            if let Some(net) = target(&d.scope, &d.value) {
                table.remove(net, d.id);
            }
        }
        let mut dropped = 0;
        for d in &delta.new {
            let Some(net) = target(&d.scope, &d.value) else {
                inc(&self.counters.ignored_scope);
                continue;
            };
            let Some(remedy) = Remedy::parse(&d.kind) else {
                inc(&self.counters.ignored_type);
                continue;
            };
            let left = lapi::go_duration(&d.duration).unwrap_or(0);
            if left <= 0 {
                continue;
            }
            let until = now.saturating_add(u64::try_from(left).unwrap_or(u64::MAX));
            let held = Held {
                id: d.id,
                remedy,
                until,
            };
            if table.add(net, held) == Added::Dropped {
                dropped += 1;
            }
        }
        table.sweep(now);
        drop(table);
        if dropped > 0 {
            self.counters.dropped.fetch_add(dropped, Ordering::Relaxed);
            tracing::warn!(
                dropped,
                max = self.config.max_decisions,
                "CrowdSec decisions dropped: identity.crowdsec.max_decisions are held"
            );
        }
    }

    /// One pull: everything (`startup`) or what changed. `true` when it worked.
    async fn pull(&self, startup: bool, clock: &SharedClock) -> bool {
        match self.lapi.stream(startup).await {
            Ok(delta) => {
                let now = clock.now();
                self.apply(&delta, startup, now);
                inc(&self.counters.pulls_ok);
                self.last_pull.store(now, Ordering::Relaxed);
                self.said_down.store(false, Ordering::Relaxed);
                if !self.up.swap(true, Ordering::Relaxed) {
                    tracing::info!(url = %self.config.url, held = self.table.read().len(), "CrowdSec Local API answers; its decisions apply");
                }
                true
            }
            Err(e) => {
                inc(&self.counters.pulls_error);
                self.up.store(false, Ordering::Relaxed);
                if !self.said_down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(url = %self.config.url, error = %e, "CrowdSec Local API unreachable; requests are served without its new decisions (fail-open)");
                }
                false
            }
        }
    }

    /// Sends what the push queue holds, a batch at a time, until it is empty or a call fails.
    async fn push_waiting(&self) {
        let (Some(queue), Some(push)) = (&self.push, &self.config.push) else {
            return;
        };
        while !queue.is_empty() {
            let batch = queue.peek(ALERTS_PER_CALL);
            let alerts: Vec<serde_json::Value> = batch.iter().map(OwnBan::alert).collect();
            let body = bytes::Bytes::from(serde_json::Value::from(alerts).to_string());
            match self.send_alerts(push, body).await {
                Ok(()) => {
                    queue.sent(batch.len());
                    self.counters
                        .pushed
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    for ban in &batch {
                        tracing::info!(target = %ban.target, limiter = %ban.limiter, "ban pushed to the CrowdSec Local API");
                    }
                }
                Err(e) => {
                    inc(&self.counters.push_errors);
                    tracing::warn!(error = %e, waiting = queue.len(), "pushing bans to the CrowdSec Local API failed; they wait for the next try");
                    return;
                }
            }
        }
    }

    /// `POST /v1/alerts`, logging in first (and again once if the token was refused).
    async fn send_alerts(
        &self,
        push: &crate::config::PushConfig,
        body: bytes::Bytes,
    ) -> Result<(), LapiError> {
        for _ in 0..2 {
            let token = self.token.lock().clone();
            let token = match token {
                Some(t) => t,
                None => {
                    let t = self.lapi.login(&push.machine_id, &push.password).await?;
                    *self.token.lock() = Some(t.clone());
                    t
                }
            };
            match self.lapi.alerts(&token, body.clone()).await {
                Err(LapiError::Unauthorized(_)) => *self.token.lock() = None,
                other => return other,
            }
        }
        Err(LapiError::Unauthorized(http::StatusCode::UNAUTHORIZED))
    }
}

/// `/metrics`: the Local API's health, the decisions held, the bans waiting
/// (nothing without `identity.crowdsec`: an alert on `up == 0` stays quiet).
pub fn render_metrics(crowdsec: Option<&CrowdSec>, out: &mut String) {
    use crate::metrics::text::{family, sample};
    let Some(h) = crowdsec.map(CrowdSec::health) else {
        return;
    };
    let h = Some(h);
    let series: [(&str, &str, f64); 4] = [
        (
            "tollgate_crowdsec_up",
            "1 when the CrowdSec Local API answered the last pull (0: down, or not configured).",
            f64::from(u8::from(h.is_some_and(|h| h.up))),
        ),
        (
            "tollgate_crowdsec_decisions_held",
            "CrowdSec decisions held in memory (at most identity.crowdsec.max_decisions).",
            h.map_or(0.0, |h| h.held as f64),
        ),
        (
            "tollgate_crowdsec_push_waiting",
            "Bans waiting to be pushed to the Local API (at most identity.crowdsec.push.queue).",
            h.map_or(0.0, |h| h.waiting as f64),
        ),
        (
            "tollgate_crowdsec_last_pull_timestamp_seconds",
            "Unix time of the last successful pull from the Local API (0: none yet).",
            h.map_or(0.0, |h| (h.last_pull / 1_000_000_000) as f64),
        ),
    ];
    for (name, help, value) in series {
        family(out, name, help, "gauge");
        sample(out, name, "", value);
    }
}

/// The address or range a decision names (`Ip`, `Range`; any case), if it is one.
fn target(scope: &str, value: &str) -> Option<IpNet> {
    if scope.eq_ignore_ascii_case("ip") {
        value.trim().parse::<IpAddr>().ok().map(IpNet::from)
    } else if scope.eq_ignore_ascii_case("range") {
        value.trim().parse::<IpNet>().ok()
    } else {
        None
    }
}

/// Follows the Local API of the CrowdSec in force (`current` reads it
/// from the snapshot, so a reload's change is followed: a new one starts
/// with a full pull) until `stop`: pulls every `poll_every` (the whole set
/// again after a failure), pushes queued bans as they come.
pub async fn follow(
    current: impl Fn() -> Option<Arc<CrowdSec>>,
    clock: SharedClock,
    stop: CancellationToken,
) {
    let mut following: Option<Arc<CrowdSec>> = None;
    let mut startup = true;
    let mut next_pull = tokio::time::Instant::now();
    loop {
        let now_current = current();
        if !same(&now_current, &following) {
            following = now_current;
            startup = true;
            next_pull = tokio::time::Instant::now();
        }
        let Some(cs) = following.clone() else {
            // None configured: look again in a second (a reload may add one).
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
            }
        };
        let woken = async {
            match &cs.push {
                Some(q) => q.wake.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next_pull) => {
                startup = !cs.pull(startup, &clock).await;
                next_pull = tokio::time::Instant::now() + cs.config.poll_every;
                cs.push_waiting().await;
            }
            _ = woken => cs.push_waiting().await,
        }
    }
}

fn same(a: &Option<Arc<CrowdSec>>, b: &Option<Arc<CrowdSec>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}
