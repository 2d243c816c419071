//! The seam under [`super::Store`]: what one backend (memory, SQLite, Redis) does for each store operation, and what it says about itself ([`BackendStatus`]).
//!
//! Every backend runs beside the in-process [`Local`] state (the counter
//! table and the ban table): memory and SQLite decide in it, Redis falls back
//! to it under `on_error: local`. The default methods are the local
//! decisions, so a backend writes only what it does differently; the hooks
//! past `lift_ban` (prune, audit, flush, shutdown) default to "nothing to
//! do". `Store` holds the backends in an enum generated from the one list
//! of backends and calls each operation through one exhaustive match
//! (static dispatch: no vtable on the request path). A backend whose call
//! waits on the network boxes its own future, so a request's future does
//! not grow by it on the other backends (docs/PERFORMANCE.md, "The
//! request's future").

use std::sync::Arc;
use std::time::Duration;

use super::ban::{ActiveBan, Banned, Bans};
use super::redis::Redis;
use super::sqlite::durability;
use super::table::Table;
use super::{AuditRow, Check, Outcome, StoreError};
use crate::config::store::Section;
use crate::config::LimiterConfig;
use crate::limiter::ban::BanRule;
use crate::limiter::{Algorithm, Nanos, Quota, Ticket};

/// The in-process state every backend has: exact counters and bans for the
/// local backends, the `on_error: local` fallback (and the bans this proxy
/// saw, for the gauge) for Redis.
pub struct Local {
    pub table: Arc<Table>,
    pub bans: Arc<Bans>,
}

impl Local {
    /// `persisted`: the SQLite writer reads what changed, so both tables track changes.
    pub fn new(persisted: bool, max_keys: usize) -> Local {
        Local {
            table: Arc::new(Table::with_max_keys(persisted, max_keys)),
            bans: Arc::new(Bans::new(persisted)),
        }
    }

    /// Forgets these keys' counters and bans; returns how many existed.
    pub fn forget(&self, keys: &[String]) -> usize {
        self.table.remove_keys(keys) + self.bans.lift(keys)
    }
}

/// What a backend says about itself now, for `/readyz`, `/metrics` and the dashboard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendStatus {
    /// Whether it answers now (SQLite: the last write succeeded; Redis: no
    /// circuit breaker is open).
    pub healthy: bool,
    /// Its circuit breaker, where it has one: whether it is open.
    pub breaker_open: Option<bool>,
    /// How its servers are laid out (Redis: `node`, `sentinel` or
    /// `cluster`), where it has servers.
    pub topology: Option<&'static str>,
    /// Its servers as the last probe saw them (empty for one node: its
    /// health is `healthy`).
    pub nodes: Vec<NodeStatus>,
    /// What waits for a failing disk, where it persists.
    pub durability: Option<durability::Status>,
}

impl BackendStatus {
    /// A backend with nothing to report but that it answers.
    pub fn healthy() -> BackendStatus {
        BackendStatus {
            healthy: true,
            ..BackendStatus::default()
        }
    }

    /// Prometheus series of its nodes: `tollgate_store_node_up{node,role}`
    /// and, for those with a breaker of their own (a cluster's primaries),
    /// `tollgate_store_node_breaker_open{node}`. The families are always
    /// there, with one series per node (none without nodes).
    pub fn render_node_metrics(&self, out: &mut String) {
        use crate::metrics::text;
        let name = "tollgate_store_node_up";
        text::family(
            out,
            name,
            "Redis Sentinel or Cluster: 1 when the node answered the last topology probe (sentinels: answered; primary: says ROLE master; cluster: not flagged fail and its link is up).",
            "gauge",
        );
        for n in &self.nodes {
            let labels = text::labels(&[("node", &n.addr), ("role", n.role)]);
            text::sample(out, name, &labels, u8::from(n.healthy));
        }
        let name = "tollgate_store_node_breaker_open";
        text::family(
            out,
            name,
            "Redis Cluster: 1 while this primary's own circuit breaker is open (requests whose keys it serves apply on_error).",
            "gauge",
        );
        for n in &self.nodes {
            if let Some(open) = n.breaker_open {
                let labels = text::labels(&[("node", &n.addr)]);
                text::sample(out, name, &labels, u8::from(open));
            }
        }
    }
}

/// One server of a backend as its last probe saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// `host:port`.
    pub addr: String,
    /// `sentinel`, `primary`, or a cluster's `primary` / `replica`.
    pub role: &'static str,
    pub healthy: bool,
    /// A cluster primary's own circuit breaker, open or not; `None` for nodes without one.
    pub breaker_open: Option<bool>,
}

/// One store backend, opened from its section of `store:` (its
/// [`Section::Config`]). Async methods are awaited on the request path; the
/// others never wait (see each backend for how it keeps that promise).
#[allow(async_fn_in_trait)] // Called on concrete types only (enum dispatch), where `Send` is known.
pub trait Backend: Sized {
    /// Its section of `store:`.
    type Section: Section;

    /// Whether the local table remembers what changed (for a writer that persists it).
    const TRACKS_CHANGES: bool = false;

    /// Opens it beside `local` and loads the live state it persisted.
    fn open(
        config: &<Self::Section as Section>::Config,
        local: &Local,
        limiters: &[LimiterConfig],
        now: Nanos,
    ) -> Result<Self, StoreError>;

    /// Creates at zero the metric families it counts into, whichever
    /// backend is open (a dashboard sees 0, not "no data").
    fn families_at_zero(_metrics: &crate::metrics::Metrics) {}

    /// Checks and records every limiter of one request atomically.
    async fn check(
        &self,
        local: &Local,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<Vec<Outcome>, StoreError> {
        Ok(local.table.check(checks, now))
    }

    /// `on_error: local`: the check in this instance's own table.
    fn check_local(&self, local: &Local, checks: &[Check<'_>], now: Nanos) -> Vec<Outcome> {
        local.table.check(checks, now)
    }

    async fn peek(
        &self,
        local: &Local,
        key: &str,
        algorithm: &Algorithm,
        now: Nanos,
    ) -> Result<Quota, StoreError> {
        Ok(local.table.peek(key, algorithm, now))
    }

    fn release(&self, local: &Local, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        local.table.release(key, algorithm, ticket, now)
    }

    async fn refund(
        &self,
        local: &Local,
        key: &str,
        algorithm: &Algorithm,
        ticket: Ticket,
        now: Nanos,
    ) -> Result<(), StoreError> {
        local.table.refund(key, algorithm, ticket, now);
        Ok(())
    }

    async fn banned(
        &self,
        local: &Local,
        keys: &[&str],
        now: Nanos,
    ) -> Result<Vec<Option<Banned>>, StoreError> {
        Ok(keys.iter().map(|k| local.bans.banned(k, now)).collect())
    }

    async fn strike(
        &self,
        local: &Local,
        key: &str,
        rule: &BanRule,
        window: Nanos,
        now: Nanos,
    ) -> Result<Option<Banned>, StoreError> {
        Ok(local.bans.strike(key, rule, window, now))
    }

    /// Forgets these keys everywhere, bans included; returns how many existed.
    async fn reset(&self, local: &Local, keys: &[String]) -> Result<usize, StoreError> {
        Ok(local.forget(keys))
    }

    /// Every ban in force at `now`, in no particular order.
    async fn ban_list(&self, local: &Local, now: Nanos) -> Result<Vec<ActiveBan>, StoreError> {
        Ok(local.bans.list(now))
    }

    /// Lifts the ban on one store key (the caller checked that it is banned).
    async fn lift_ban(&self, local: &Local, key: &str) -> Result<(), StoreError> {
        local.bans.lift(&[key.to_string()]);
        Ok(())
    }

    /// Drops the backend's own expired state (the local tables are pruned by the store).
    fn prune(&self, _now: Nanos, _limiters: &[LimiterConfig], _retention: Option<Duration>) {}

    /// Records one forwarded request in the audit log, where the backend keeps one.
    fn audit(&self, _row: AuditRow) {}

    fn audit_dropped(&self) -> u64 {
        0
    }

    /// What it says about itself now.
    fn status(&self) -> BackendStatus {
        BackendStatus::healthy()
    }

    /// Waits until everything counted so far is durable.
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Makes what it can durable and stops; later calls give the same answer.
    fn shutdown(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn bind_metrics(&self, _metrics: &crate::metrics::Metrics) {}

    /// The limiters of the config in force, at start and after every reload.
    fn configure(&self, _limiters: &[LimiterConfig]) {}

    /// The connection a fleet's ACME tasks share their locks and
    /// certificates through, where the store is shared that way.
    fn acme_share(&self) -> Option<Redis> {
        None
    }
}
