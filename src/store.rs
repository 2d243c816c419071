//! Where limiter state lives: the atomic check-and-update of every limiter of one request.
//!
//! Every store keeps exact live counters in the in-process [`table::Table`]
//! (a local store decides in it; Redis falls back to it under
//! `on_error: local`), and its bans in [`ban`]. Each backend is one
//! implementation of [`backend::Backend`] in its own module: [`memory`]
//! (the table alone), [`sqlite`] (a writer thread persists what changed in
//! batches, so the request path never waits on the disk; its durability and
//! file lock), [`redis`] (counters shared by a fleet; its breaker, leases
//! and script). The backends are declared once, in
//! [`crate::config::store::with_backends!`], with the config section each
//! reads: [`Store`] is generated from that list, calls the open backend
//! once per operation and owns only what all of them share.

pub mod backend;
pub mod ban;
mod error;
pub mod table;

use crate::config::store::{with_backends, BackendConfig, Section};
use crate::config::{LimiterConfig, StoreConfig};
use crate::limiter::ban::BanRule;
use crate::limiter::{Algorithm, Nanos, Quota, Ruling, Ticket};

use backend::{Backend, Local};
pub use backend::{BackendStatus, NodeStatus};
pub use ban::{ActiveBan, Banned};
pub use error::{StoreError, StoreFailure};

pub use sqlite::AuditRow;

/// One limiter of one request, as the store sees it.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// `<limiter name>:<key value>`, e.g. `strict:ip:203.0.113.9` (see [`crate::key`]).
    pub key: &'a str,
    /// The limiter's overflow key: where the check is counted when the key's
    /// share of `store.max_keys` is full of keys at or over half their quota
    /// (see [`table`]).
    pub overflow: &'a str,
    pub algorithm: &'a Algorithm,
    /// Counts and reports, never blocks the request.
    pub shadow: bool,
}

/// What one limiter decided, and its quota after recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub ruling: Ruling,
    pub quota: Quota,
    /// The instant (Unix ns) the store decided at, on its own clock: the
    /// proxy's for local stores, the Redis server's for Redis. Headers count
    /// from it, so every proxy of a fleet announces the same reset time.
    pub at: Nanos,
    /// The state's [`Algorithm::mark`] right after the decision (0 where
    /// nothing was recorded); a `count:` refund's ticket needs it.
    pub mark: Nanos,
    /// Counted on [`Check::overflow`], not on its own key (the table was
    /// full): a release must name the overflow key.
    pub overflowed: bool,
}

impl Outcome {
    /// What a `count:` refund of this decision's unit names (see [`Algorithm::ticket`]).
    pub fn ticket(&self, algorithm: &Algorithm) -> Ticket {
        algorithm.ticket(self.at, &self.quota, self.mark)
    }
}

/// Declares each backend's module, the enum of open backends, and how
/// each is opened from its validated section.
macro_rules! declare {
    ([$($variant:ident in $module:ident: $raw:ident,)+]) => {
        $(pub mod $module;)+

        /// The backend open under [`Store`], one variant each.
        enum Backends {
            $($variant($module::$variant),)+
        }

        impl Store {
            /// Opens the configured backend and loads the live state it persisted.
            pub fn open(
                config: &StoreConfig,
                limiters: &[LimiterConfig],
                now: Nanos,
            ) -> Result<Store, StoreError> {
                match &config.backend {
                    $(BackendConfig::$variant(section) => {
                        type B = $module::$variant;
                        let local = Local::new(B::TRACKS_CHANGES, config.max_keys);
                        let backend = <B as Backend>::open(section, &local, limiters, now)?;
                        Ok(Store {
                            local,
                            backend: Backends::$variant(backend),
                        })
                    })+
                }
            }

            /// The config spelling of the open backend, also the `backend` metric label.
            pub fn backend(&self) -> &'static str {
                match &self.backend {
                    $(Backends::$variant(_) => <$module::$variant as Backend>::Section::NAME,)+
                }
            }

            /// Counts into the app's registry: every family any backend
            /// counts into starts at zero, whichever backend is open.
            pub fn bind_metrics(&self, metrics: &crate::metrics::Metrics) {
                $(<$module::$variant as Backend>::families_at_zero(metrics);)+
                on_backend!(self, b => Backend::bind_metrics(b, metrics))
            }
        }
    };
}

/// One store operation on whichever backend is open: one exhaustive match,
/// so a new variant of [`Backends`] fails to compile until it is handled.
macro_rules! on_backend {
    ($store:expr, $b:ident => $call:expr) => {
        with_backends!(on_backend_of! $store, $b => $call)
    };
}

macro_rules! on_backend_of {
    ([$($variant:ident in $module:ident: $raw:ident,)+] $store:expr, $b:ident => $call:expr) => {
        match &$store.backend {
            $(Backends::$variant($b) => $call,)+
        }
    };
}

with_backends!(declare!);

pub struct Store {
    /// The counters and bans every backend keeps in-process (see [`backend::Local`]).
    local: Local,
    backend: Backends,
}

impl Store {
    /// Counters in memory only: lost on restart.
    pub fn memory() -> Store {
        Store::memory_bounded(table::DEFAULT_MAX_KEYS)
    }

    fn memory_bounded(max_keys: usize) -> Store {
        Store {
            local: Local::new(false, max_keys),
            backend: Backends::Memory(memory::Memory),
        }
    }

    /// Checks and records every limiter of one request atomically.
    pub async fn check(
        &self,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<Vec<Outcome>, StoreError> {
        on_backend!(self, b => Backend::check(b, &self.local, checks, now).await)
    }

    /// `on_error: local`: checks against this instance's own table while the
    /// shared store is unreachable, so limits still hold approximately.
    pub fn check_local(&self, checks: &[Check<'_>], now: Nanos) -> Vec<Outcome> {
        on_backend!(self, b => b.check_local(&self.local, checks, now))
    }

    /// The quota of one key now, without counting.
    pub async fn peek(
        &self,
        key: &str,
        algorithm: &Algorithm,
        now: Nanos,
    ) -> Result<Quota, StoreError> {
        on_backend!(self, b => Backend::peek(b, &self.local, key, algorithm, now).await)
    }

    /// An admitted request finished, or left while it was still queued.
    /// Never waits: the Redis backend sends it from a spawned task.
    pub fn release(&self, key: &str, algorithm: &Algorithm, ticket: Nanos, now: Nanos) {
        on_backend!(self, b => Backend::release(b, &self.local, key, algorithm, ticket, now))
    }

    /// `count:` — the request recorded with `ticket` got an answer that does
    /// not count: gives its unit back (see `limiter/count.rs`).
    pub async fn refund(
        &self,
        key: &str,
        algorithm: &Algorithm,
        ticket: Ticket,
        now: Nanos,
    ) -> Result<(), StoreError> {
        on_backend!(self, b => Backend::refund(b, &self.local, key, algorithm, ticket, now).await)
    }

    /// The ban on each of these store keys at `now`, if any.
    pub async fn banned(
        &self,
        keys: &[&str],
        now: Nanos,
    ) -> Result<Vec<Option<Banned>>, StoreError> {
        on_backend!(self, b => Backend::banned(b, &self.local, keys, now).await)
    }

    /// Counts one rejection of `key` by a limiter with `ban:`; returns the
    /// ban when this strike starts one. `window` is the span strikes count in.
    pub async fn strike(
        &self,
        key: &str,
        rule: &BanRule,
        window: Nanos,
        now: Nanos,
    ) -> Result<Option<Banned>, StoreError> {
        on_backend!(self, b => Backend::strike(b, &self.local, key, rule, window, now).await)
    }

    /// Every ban in force at `now`, sorted by store key (`GET /bans`).
    pub async fn ban_list(&self, now: Nanos) -> Result<Vec<ActiveBan>, StoreError> {
        let mut out = on_backend!(self, b => b.ban_list(&self.local, now).await)?;
        out.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Lifts the ban on the store key `key` and forgets its strikes (SQLite
    /// deletes its row with the next write); `false` when it was not banned.
    pub async fn lift_ban(&self, key: &str, now: Nanos) -> Result<bool, StoreError> {
        let banned = self.banned(&[key], now).await?[0].is_some();
        if banned {
            on_backend!(self, b => b.lift_ban(&self.local, key).await)?;
        }
        Ok(banned)
    }

    /// Keys banned now: exact for local stores; for Redis, the bans this proxy has seen.
    pub fn active_bans(&self, now: Nanos) -> usize {
        self.local.bans.active(now)
    }

    /// New keys whose strikes were not kept because the ban table was full.
    pub fn ban_strikes_dropped(&self) -> u64 {
        self.local.bans.dropped()
    }

    /// Forgets these keys everywhere, bans included (admin `DELETE /status`);
    /// returns how many counters and bans existed.
    pub async fn reset(&self, keys: &[String]) -> Result<usize, StoreError> {
        on_backend!(self, b => Backend::reset(b, &self.local, keys).await)
    }

    /// Drops expired state and the state of limiters that no longer exist.
    pub fn prune(
        &self,
        now: Nanos,
        limiters: &[LimiterConfig],
        audit_retention: Option<std::time::Duration>,
    ) -> usize {
        // A fixed window at rest lingers one more window, as the file keeps
        // it: memory forgets it when the writer's prune deletes its row, so
        // the file never holds a key the table forgot without deleting it.
        let live: std::collections::HashMap<&str, Nanos> = limiters
            .iter()
            .map(|l| (l.name.as_str(), l.algorithm.linger()))
            .collect();
        let removed = self.local.table.remove_where(|limiter, rests_at| {
            live.get(limiter)
                .is_none_or(|linger| rests_at.saturating_add(*linger) <= now)
        });
        self.local.bans.sweep(now);
        on_backend!(self, b => Backend::prune(b, now, limiters, audit_retention));
        removed
    }

    /// Records one forwarded request in the audit table (dropped, and counted, if the writer lags).
    pub fn audit(&self, row: AuditRow) {
        on_backend!(self, b => Backend::audit(b, row))
    }

    pub fn audit_dropped(&self) -> u64 {
        on_backend!(self, b => Backend::audit_dropped(b))
    }

    /// What the open backend says about itself now: health, breaker,
    /// nodes, what waits for a failing disk (`/readyz`, `/metrics`, the dashboard).
    pub fn status(&self) -> BackendStatus {
        on_backend!(self, b => Backend::status(b))
    }

    /// Waits until everything counted so far is on disk.
    pub fn flush(&self) -> Result<(), StoreError> {
        on_backend!(self, b => Backend::flush(b))
    }

    /// Persists what the disk will take and stops the writer; later counts
    /// stay in memory only. Fails with what could not be saved; later calls
    /// give the same answer.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        on_backend!(self, b => Backend::shutdown(b))
    }

    /// The limiters of the config in force (at start and after every
    /// reload): the Redis store takes their `lease:` rules from it.
    pub fn configure(&self, limiters: &[LimiterConfig]) {
        on_backend!(self, b => Backend::configure(b, limiters))
    }

    pub fn tracked_keys(&self) -> usize {
        self.local.table.len()
    }

    /// The bound on [`Store::tracked_keys`] (`store.max_keys`).
    pub fn max_keys(&self) -> usize {
        self.local.table.max_keys()
    }

    /// Evictions (at rest and live), overflow decisions and refusals of the bounded table.
    pub fn key_counters(&self) -> &table::KeyCounters {
        self.local.table.counters()
    }

    pub fn table(&self) -> &table::Table {
        &self.local.table
    }

    /// The Redis connection a fleet's ACME tasks share their locks and
    /// certificates through (one client, one breaker), where the store is
    /// shared that way (see [`Backend::acme_share`]).
    pub fn acme_share(&self) -> Option<redis::Redis> {
        on_backend!(self, b => Backend::acme_share(b))
    }
}
