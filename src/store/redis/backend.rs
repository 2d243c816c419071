//! The Redis backend: the fleet's shared counters and bans, with the local table as the `on_error: local` fallback.
//!
//! A call on the request path waits for a round trip and its timeout: its
//! future is boxed here, so it does not make every request's future that
//! much larger on the other stores, whose calls are ready at once; a
//! request's future is copied whole when it starts (docs/PERFORMANCE.md,
//! "The request's future").

use std::time::Duration;

use super::Redis;
use crate::config::store::RawRedis;
use crate::config::{LimiterConfig, RedisConfig};
use crate::limiter::ban::BanRule;
use crate::limiter::{Algorithm, Nanos, Quota, Ticket};
use crate::store::backend::{Backend, BackendStatus, Local};
use crate::store::ban::{ActiveBan, Banned};
use crate::store::{Check, Outcome, StoreError};

/// Every call goes to Redis under its timeout and circuit breaker
/// (`Redis::call`); the local table counts only while the app applies
/// `on_error: local`, and the local ban table only mirrors the bans this
/// proxy saw (for the active-bans gauge).
impl Backend for Redis {
    type Section = RawRedis;

    /// Only `on_error: local` counts in the local table; the fleet's
    /// counters live in Redis, which expires them by TTL.
    fn open(
        config: &RedisConfig,
        _local: &Local,
        _limiters: &[LimiterConfig],
        _now: Nanos,
    ) -> Result<Redis, StoreError> {
        Redis::open(&config.topology, &config.prefix, config.timeout)
    }

    /// Every store shows the lease families (at zero where nothing leases).
    fn families_at_zero(metrics: &crate::metrics::Metrics) {
        super::lease_metrics_at_zero(metrics);
    }

    async fn check(
        &self,
        _local: &Local,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<Vec<Outcome>, StoreError> {
        Box::pin(Redis::check(self, checks, now)).await
    }

    /// Counts in the local table and remembers what it admitted, so the
    /// release goes back there and not to Redis.
    fn check_local(&self, local: &Local, checks: &[Check<'_>], now: Nanos) -> Vec<Outcome> {
        let outcomes = local.table.check(checks, now);
        self.note_local(checks, &outcomes, now);
        outcomes
    }

    async fn peek(
        &self,
        _local: &Local,
        key: &str,
        algorithm: &Algorithm,
        _now: Nanos,
    ) -> Result<Quota, StoreError> {
        Box::pin(Redis::peek(self, key, algorithm)).await
    }

    fn release(&self, local: &Local, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        Redis::release(self, &local.table, key, algorithm, ticket, now)
    }

    async fn refund(
        &self,
        _local: &Local,
        key: &str,
        algorithm: &Algorithm,
        ticket: Ticket,
        _now: Nanos,
    ) -> Result<(), StoreError> {
        Box::pin(Redis::refund(self, key, algorithm, ticket)).await
    }

    async fn banned(
        &self,
        local: &Local,
        keys: &[&str],
        now: Nanos,
    ) -> Result<Vec<Option<Banned>>, StoreError> {
        let found = Box::pin(Redis::banned(self, keys)).await?;
        for (k, b) in keys.iter().zip(&found) {
            if let Some(b) = b {
                local.bans.note(k, now + b.remaining);
            }
        }
        Ok(found)
    }

    async fn strike(
        &self,
        local: &Local,
        key: &str,
        rule: &BanRule,
        window: Nanos,
        now: Nanos,
    ) -> Result<Option<Banned>, StoreError> {
        let started = Box::pin(Redis::strike(self, key, rule, window)).await?;
        if let Some(b) = started {
            local.bans.note(key, now + b.remaining);
        }
        Ok(started)
    }

    /// Counts the keys that existed in Redis, counters and ban hashes.
    async fn reset(&self, local: &Local, keys: &[String]) -> Result<usize, StoreError> {
        local.forget(keys);
        let mut all: Vec<String> = keys.iter().map(|k| self.key(k)).collect();
        all.extend(keys.iter().map(|k| self.ban_key(k)));
        self.delete(&all).await
    }

    async fn ban_list(&self, _local: &Local, _now: Nanos) -> Result<Vec<ActiveBan>, StoreError> {
        self.list_bans().await
    }

    async fn lift_ban(&self, local: &Local, key: &str) -> Result<(), StoreError> {
        local.bans.lift(&[key.to_string()]);
        self.delete(&[self.ban_key(key)]).await?;
        Ok(())
    }

    /// Forgets leaky-bucket tickets whose turn has passed; ends the leases past their end.
    fn prune(&self, now: Nanos, _limiters: &[LimiterConfig], _retention: Option<Duration>) {
        self.sweep(now);
        self.sweep_leases(now);
    }

    /// Takes the limiters' `lease:` rules (a changed limiter's leases end).
    fn configure(&self, limiters: &[LimiterConfig]) {
        self.configure_leases(limiters)
    }

    fn bind_metrics(&self, metrics: &crate::metrics::Metrics) {
        self.bind_lease_metrics(metrics)
    }

    /// Unhealthy while a circuit breaker is open (the store's, or on a
    /// cluster any primary's); its topology and nodes as the last probe saw them.
    fn status(&self) -> BackendStatus {
        let healthy = Redis::healthy(self);
        BackendStatus {
            healthy,
            breaker_open: Some(!healthy),
            topology: Some(self.topology()),
            nodes: self.nodes(),
            durability: None,
        }
    }

    /// The fleet's ACME tasks share their locks and certificates through this connection.
    fn acme_share(&self) -> Option<Redis> {
        Some(self.clone())
    }
}
