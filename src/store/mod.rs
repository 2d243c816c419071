//! Where limiter state lives: the atomic check-and-update of every limiter of one request.
//!
//! Every local backend keeps exact live counters in the in-process [`memory::Table`];
//! the SQLite backend adds a writer thread that persists what changed in
//! batches, so the request path never waits on the disk. A clean shutdown
//! persists every count the disk will take (and says which it could not);
//! a `kill -9` loses at most one `flush_interval`; a failed write is retried
//! ([`durability`]); one process per file ([`lock`]).
//! The [`redis`] backend shares counters across a fleet; its table only
//! serves `on_error: local` while Redis is unreachable.
//!
//! Each backend is one implementation of [`backend::Backend`] in its own
//! folder ([`memory`], [`sqlite`], [`redis`]); [`Store`] calls it once per
//! operation and owns only what all of them share.

pub mod backend;
pub mod ban;
pub mod breaker;
pub mod durability;
pub mod lock;
pub mod memory;
pub mod redis;
pub mod sqlite;

use std::path::PathBuf;

use crate::config::{self, LimiterConfig, StoreConfig};
use crate::limiter::ban::BanRule;
use crate::limiter::{Algorithm, Nanos, Quota, Ruling, Ticket};

use backend::{Backend, Local};
pub use ban::{ActiveBan, Banned};

pub use sqlite::AuditRow;

/// One limiter of one request, as the store sees it.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// `<limiter name>:<key value>`, e.g. `strict:ip:203.0.113.9` (see [`crate::key`]).
    pub key: &'a str,
    /// The limiter's overflow key: where the check is counted when the key's
    /// share of `store.max_keys` is full of keys at or over half their quota
    /// (see [`memory`]).
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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the SQLite store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the SQLite store {path} is corrupt or not a tollgate database ({source}); \
         tollgate does not overwrite it: move it aside (e.g. `mv {path} {path}.bad`) \
         to start with empty counters, or restore a backup"
    )]
    Corrupt {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "another process is already using the SQLite store {path} (the file {file}, under this \
         or any other name: it holds the file's lock); one tollgate per file: give each instance \
         its own store.path, or share counters with backend: redis"
    )]
    InUse { path: PathBuf, file: PathBuf },
    #[error("cannot lock the SQLite store {path}: {source}")]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the last save to the SQLite store {path} failed: {keys} limiter key(s) and \
         {audit_rows} audit row(s) were not saved"
    )]
    NotSaved {
        path: PathBuf,
        keys: usize,
        audit_rows: usize,
    },
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    #[error("Redis failed: {0}")]
    Redis(#[source] ::redis::RedisError),
    #[error("Redis did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("Redis is skipped for a moment after repeated failures (circuit breaker open)")]
    CircuitOpen,
    #[error("a window or rate of {0} ns is too long for the Redis store (at most ~52 days)")]
    TooLong(Nanos),
    #[error("Redis answered with {0} values, not what the script returns")]
    BadReply(usize),
    #[error("the Redis store must be opened inside the async runtime")]
    NoRuntime,
    #[error("no Redis primary yet: no sentinel has named a node that answers as primary")]
    NoPrimary,
}

/// The backends under [`Store`], one variant each (see [`backend`]).
enum Backends {
    Memory(memory::Memory),
    Sqlite(sqlite::Sqlite),
    Redis(self::redis::Redis),
}

/// One store operation on whichever backend is open: one exhaustive match,
/// so a new variant of [`Backends`] fails to compile until it is handled.
macro_rules! on_backend {
    // A call on the request path: Redis' future (a round trip, its timeout)
    // is boxed, so it does not make every request's future that much larger
    // on the other stores, whose calls are ready at once; a request's future
    // is copied whole when it starts (docs/PERFORMANCE.md, "The request's future").
    (await $store:expr, $b:ident => $call:expr) => {
        match &$store.backend {
            Backends::Memory($b) => $call.await,
            Backends::Sqlite($b) => $call.await,
            Backends::Redis($b) => Box::pin($call).await,
        }
    };
    ($store:expr, $b:ident => $call:expr) => {
        match &$store.backend {
            Backends::Memory($b) => $call,
            Backends::Sqlite($b) => $call,
            Backends::Redis($b) => $call,
        }
    };
}

pub struct Store {
    /// The counters and bans every backend keeps in-process (see [`backend::Local`]).
    local: Local,
    backend: Backends,
}

impl Store {
    /// Counters in memory only: lost on restart.
    pub fn memory() -> Store {
        Store::memory_bounded(memory::DEFAULT_MAX_KEYS)
    }

    fn memory_bounded(max_keys: usize) -> Store {
        Store {
            local: Local::new(false, max_keys),
            backend: Backends::Memory(memory::Memory),
        }
    }

    /// Opens the configured backend and loads the live state it persisted.
    pub fn open(
        config: &StoreConfig,
        limiters: &[LimiterConfig],
        now: Nanos,
    ) -> Result<Store, StoreError> {
        match &config.backend {
            config::Backend::Memory => Ok(Store::memory_bounded(config.max_keys)),
            config::Backend::Sqlite { path } => {
                let local = Local::new(true, config.max_keys);
                let sqlite = sqlite::Sqlite::open(
                    path,
                    local.table.clone(),
                    local.bans.clone(),
                    config.flush_interval,
                    limiters,
                    now,
                )?;
                Ok(Store {
                    local,
                    backend: Backends::Sqlite(sqlite),
                })
            }
            config::Backend::Redis {
                topology,
                prefix,
                timeout,
            } => Ok(Store {
                // Only `on_error: local` counts here; the fleet's counters
                // live in Redis, which expires them by TTL.
                local: Local::new(false, config.max_keys),
                backend: Backends::Redis(self::redis::Redis::open(topology, prefix, *timeout)?),
            }),
        }
    }

    pub fn backend(&self) -> &'static str {
        on_backend!(self, b => b.label())
    }

    /// Checks and records every limiter of one request atomically.
    pub async fn check(
        &self,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<Vec<Outcome>, StoreError> {
        on_backend!(await self, b => Backend::check(b, &self.local, checks, now))
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
        on_backend!(await self, b => Backend::peek(b, &self.local, key, algorithm, now))
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
        on_backend!(await self, b => Backend::refund(b, &self.local, key, algorithm, ticket, now))
    }

    /// The ban on each of these store keys at `now`, if any.
    pub async fn banned(
        &self,
        keys: &[&str],
        now: Nanos,
    ) -> Result<Vec<Option<Banned>>, StoreError> {
        on_backend!(await self, b => Backend::banned(b, &self.local, keys, now))
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
        on_backend!(await self, b => Backend::strike(b, &self.local, key, rule, window, now))
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

    /// Whether the store answers: for SQLite, whether the last write
    /// succeeded; for Redis, whether its circuit breaker is closed.
    pub fn healthy(&self) -> bool {
        on_backend!(self, b => Backend::healthy(b))
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

    /// Counts SQLite write failures and given-up keys into the app's registry.
    pub fn bind_metrics(&self, metrics: &crate::metrics::Metrics) {
        // Every backend shows the lease families (at zero where nothing leases).
        self::redis::lease_metrics_at_zero(metrics);
        on_backend!(self, b => Backend::bind_metrics(b, metrics))
    }

    /// The limiters of the config in force (at start and after every
    /// reload): the Redis store takes their `lease:` rules from it.
    pub fn configure(&self, limiters: &[LimiterConfig]) {
        on_backend!(self, b => Backend::configure(b, limiters))
    }

    /// For Redis: the topology (`node`, `sentinel`, `cluster`) and the
    /// nodes its last probe saw (empty for one node, whose health is
    /// [`Store::healthy`]).
    pub fn redis_nodes(&self) -> Option<(&'static str, Vec<self::redis::topology::NodeHealth>)> {
        match &self.backend {
            Backends::Redis(r) => Some((r.topology(), r.nodes())),
            Backends::Memory(_) | Backends::Sqlite(_) => None,
        }
    }

    /// Prometheus series of the Redis nodes: `tollgate_store_node_up{node,role}`
    /// and, for a cluster's primaries, `tollgate_store_node_breaker_open{node}`.
    pub fn render_node_metrics(&self, out: &mut String) {
        use crate::metrics::text;
        // The family is always there (one series per node, none without Sentinel or a cluster).
        let nodes = self.redis_nodes().map(|(_, n)| n).unwrap_or_default();
        let name = "tollgate_store_node_up";
        text::family(
            out,
            name,
            "Redis Sentinel or Cluster: 1 when the node answered the last topology probe (sentinels: answered; primary: says ROLE master; cluster: not flagged fail and its link is up).",
            "gauge",
        );
        for n in &nodes {
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
        for n in &nodes {
            if let Some(open) = n.breaker_open {
                let labels = text::labels(&[("node", &n.addr)]);
                text::sample(out, name, &labels, u8::from(open));
            }
        }
    }

    /// For SQLite: what waits for a retry, and the last write error.
    pub fn durability(&self) -> Option<durability::Status> {
        on_backend!(self, b => Backend::durability(b))
    }

    pub fn tracked_keys(&self) -> usize {
        self.local.table.len()
    }

    /// The bound on [`Store::tracked_keys`] (`store.max_keys`).
    pub fn max_keys(&self) -> usize {
        self.local.table.max_keys()
    }

    /// Evictions (at rest and live), overflow decisions and refusals of the bounded table.
    pub fn key_counters(&self) -> &memory::KeyCounters {
        self.local.table.counters()
    }

    pub fn table(&self) -> &memory::Table {
        &self.local.table
    }

    /// The Redis connection when the store is Redis: ACME shares its locks
    /// and certificates through it (one client, one breaker).
    pub fn redis(&self) -> Option<self::redis::Redis> {
        match &self.backend {
            Backends::Redis(r) => Some(r.clone()),
            Backends::Memory(_) | Backends::Sqlite(_) => None,
        }
    }
}
