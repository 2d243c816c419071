//! The seam under [`super::Store`]: what one backend (memory, SQLite, Redis) does for each store operation.
//!
//! Every backend runs beside the in-process [`Local`] state (the counter
//! table and the ban table): memory and SQLite decide in it, Redis falls back
//! to it under `on_error: local`. The default methods are the local
//! decisions, so a backend writes only what it does differently; the hooks
//! past `lift_ban` (prune, audit, health, flush, shutdown) default to
//! "nothing to do". `Store` holds the backends in an enum and calls each
//! operation through one exhaustive match (static dispatch: no boxed future
//! and no vtable on the request path), so a new backend fails to compile
//! until `Store` knows it.

use std::sync::Arc;
use std::time::Duration;

use super::ban::{ActiveBan, Banned, Bans};
use super::memory::Table;
use super::{durability, AuditRow, Check, Outcome, StoreError};
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

/// One store backend. Async methods are awaited on the request path; the
/// others never wait (see each backend for how it keeps that promise).
#[allow(async_fn_in_trait)] // Called on concrete types only (enum dispatch), where `Send` is known.
pub trait Backend {
    /// The config spelling, also the `backend` metric label.
    fn label(&self) -> &'static str;

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

    /// Whether the backend answers now.
    fn healthy(&self) -> bool {
        true
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

    /// What waits for a retry and the last write error, for a persisting backend.
    fn durability(&self) -> Option<durability::Status> {
        None
    }
}
