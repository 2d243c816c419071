//! The Redis store: every limiter of one request in one atomic Lua call, on the Redis server's clock.
//!
//! A fleet of tollgates pointed at one Redis shares every limit exactly: one
//! script, assembled at build time from `redis/head.lua`, each algorithm's
//! Lua beside its arithmetic (`src/limiter/<name>.lua`) and `redis/modes.lua`,
//! ports the arithmetic of `src/limiter/*.rs` and runs check →
//! admit → record for all limiters of a request inside one `EVALSHA` (the
//! `redis` crate reloads the script on `NOSCRIPT`), so no read-then-write
//! race exists whatever the number of proxies, and time comes from Redis'
//! `TIME`, so proxies with skewed clocks agree. Keys expire on their own
//! (`PEXPIRE` = what the algorithm still needs).
//!
//! Key names: `<prefix>{<tag>}<limiter>:<key value>`. On one node (`store.url`,
//! or the primary Sentinel names) `tag` is the prefix without its trailing
//! `:` (default `tollgate:{tollgate}strict:ip:…`): every key of a request
//! is in one script. On a Redis Cluster (`store.cluster`) `tag` is the
//! request's identity ([`crate::key::slot_tag`]), so one client's limiters
//! share a slot and are decided in one script, and clients spread over every
//! master; a request whose limiters span slots is decided slot group by slot
//! group (`spread.rs`), refunding what admitted groups took when another
//! refuses. Where the connection goes (node, Sentinel, cluster) is
//! `topology.rs`.
//!
//! Failure: every call is bounded by `store.timeout`; after
//! [`BREAKER_THRESHOLD`] consecutive failures the [`Breaker`] opens and calls
//! fail at once (the app applies `on_error`) while a background probe, every
//! [`BREAKER_COOL_DOWN`], tries a fresh connection and closes it again. On a
//! cluster each primary has a breaker of its own (`owners.rs`): a call feeds
//! the breaker of the primary serving its key's slot, so one failed primary
//! sends only the requests whose keys it serves to `on_error`.
//! Releases (a concurrency slot, a leaky-bucket place) never wait on Redis:
//! they are sent from a spawned task.

pub mod acme;
mod args;
mod backend;
pub mod ban;
pub mod breaker;
mod lease;
mod owners;
mod probe;
mod spread;
pub mod topology;

pub use lease::metrics_at_zero as lease_metrics_at_zero;
pub use lease::IDLE as LEASE_IDLE;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;
use tokio::runtime::Handle;

use super::table::Table;
use super::{Check, NodeStatus, Outcome, StoreError, StoreFailure};
use crate::config::store::{RawRedis, Section};
use crate::config::RedisTopology;
use breaker::Breaker;
use crate::limiter::{Algorithm, Hold, Nanos, Quota, Ruling, Ticket, NANOS_PER_SEC};
use owners::{Owner, Owners};
use topology::{RedisConnection, Link, NodeHealth};

/// The script, assembled from its parts in one chunk (see `redis/head.lua`):
/// the head, each algorithm's part beside its arithmetic, the modes, and
/// leases (which read the request's state the modes left in scope).
macro_rules! script {
    ([$($variant:ident in $module:ident,)+]) => {
        concat!(
            include_str!("redis/head.lua"),
            $(include_str!(concat!("../limiter/", stringify!($module), ".lua")),)+
            include_str!("redis/modes.lua"),
            include_str!("redis/lease.lua"),
        )
    };
}

const SCRIPT: &str = crate::limiter::with_algorithms!(script!);

/// Consecutive failures that open the breaker.
pub const BREAKER_THRESHOLD: u32 = 3;
/// How long an open breaker skips Redis before the next probe.
pub const BREAKER_COOL_DOWN: Duration = Duration::from_secs(1);
/// Past this many remembered tickets, those whose turn has passed are swept.
const SWEEP_AT: usize = 4096;
/// How often the probe checks a healthy store's topology (Sentinel's
/// primary, the cluster's nodes), and how often an open breaker is probed.
pub const PROBE_INTERVAL: Duration = BREAKER_COOL_DOWN;

/// A handle: clones share one connection, breaker and ticket table.
#[derive(Clone)]
pub struct Redis {
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    /// `None` only before Sentinel first named a primary.
    conn: ArcSwapOption<RedisConnection>,
    /// The nodes as the last probe saw them (Sentinel, cluster).
    nodes: ArcSwap<Vec<NodeHealth>>,
    /// The primary requests go to (Sentinel: `host:port`, else empty).
    primary: ArcSwapOption<String>,
    script: ::redis::Script,
    /// `<prefix>{<tag>}` on one node, put in front of every store key.
    key_prefix: String,
    /// `store.prefix` as written: on a cluster each key gets its own tag
    /// after it; ACME keys carry a tag of their own (see `acme.rs`).
    prefix: String,
    /// Keys spread over a cluster's slots by client (see the module docs).
    spread: bool,
    timeout: Duration,
    /// The whole store's breaker: one node, Sentinel, and a cluster before
    /// its slot map is known (or a cluster that answers nothing at all).
    breaker: Breaker,
    /// A cluster's slot owners, each with its own breaker (empty otherwise).
    owners: Owners,
    tickets: Mutex<Tickets>,
    runtime: Handle,
    /// Makes concurrency slot ids unique across the fleet.
    instance: String,
    next_member: AtomicU64,
    /// Leased quotas this tollgate holds (`lease:`).
    leases: lease::Leases,
}

/// What admitted requests hold, by (store key, ticket in the proxy's clock).
type Tickets = HashMap<(Box<str>, Nanos), Vec<Holder>>;

/// Who holds what an admitted request must give back, keyed by the store key
/// and the ticket the app will release with (in the proxy's clock).
#[derive(Debug, Clone)]
pub(super) enum Holder {
    /// A concurrency slot in Redis: the sorted-set member.
    Slot(String),
    /// A leaky-bucket place in Redis: the ticket in Redis' clock.
    Place(Nanos),
    /// Admitted by the local fallback table (`on_error: local`); `queued` for a leaky place.
    Local { queued: bool },
}

impl Redis {
    /// Never waits for Redis: the connection is made lazily and a background
    /// probe opens the breaker at once if Redis is down at start.
    pub fn open(
        topology: &RedisTopology,
        prefix: &str,
        timeout: Duration,
    ) -> Result<Redis, StoreError> {
        let runtime = Handle::try_current().map_err(|_| not_in_runtime())?;
        let link = Link::open(topology, timeout)?;
        let conn = link.first(timeout)?.map(Arc::new);
        let tag = match prefix.trim_end_matches(':') {
            "" => "tollgate",
            t => t,
        };
        let inner = Arc::new(Inner {
            spread: matches!(link, Link::Cluster { .. }),
            link,
            conn: ArcSwapOption::new(conn),
            nodes: ArcSwap::from_pointee(Vec::new()),
            primary: ArcSwapOption::empty(),
            script: ::redis::Script::new(SCRIPT),
            key_prefix: format!("{prefix}{{{tag}}}"),
            prefix: prefix.to_string(),
            timeout,
            breaker: breaker_for_redis(),
            owners: Owners::default(),
            tickets: Mutex::new(HashMap::new()),
            runtime: runtime.clone(),
            instance: instance_id(),
            next_member: AtomicU64::new(0),
            leases: lease::Leases::new(),
        });
        runtime.spawn(probe::probe_loop(Arc::downgrade(&inner)));
        runtime.spawn(lease::idle_loop(Arc::downgrade(&inner)));
        Ok(Redis { inner })
    }

    /// The Redis key of a store key.
    pub fn key(&self, store_key: &str) -> String {
        self.tagged(store_key, store_key)
    }

    /// The Redis key of a store key's ban hash: beside the store key's own slot.
    pub fn ban_key(&self, store_key: &str) -> String {
        self.tagged(store_key, &ban::redis_key(store_key))
    }

    /// `name` behind the hash tag `store_key` gets.
    fn tagged(&self, store_key: &str, name: &str) -> String {
        let inner = &self.inner;
        if inner.spread {
            let tag = crate::key::slot_tag(store_key);
            format!("{}{{{tag}}}{name}", inner.prefix)
        } else {
            format!("{}{name}", inner.key_prefix)
        }
    }

    /// `node`, `sentinel` or `cluster`.
    pub fn topology(&self) -> &'static str {
        self.inner.link.label()
    }

    /// The nodes the last probe saw (empty for one node: its health is the
    /// breaker's), a cluster's primaries with their own breaker's state.
    pub fn nodes(&self) -> Vec<NodeStatus> {
        let inner = &self.inner;
        inner
            .nodes
            .load()
            .iter()
            .map(|n| NodeStatus {
                addr: n.addr.clone(),
                role: n.role,
                healthy: n.healthy,
                breaker_open: match (inner.spread, n.role) {
                    (true, "primary") => inner.owners.at(&n.addr).map(|o| o.breaker.is_open()),
                    _ => n.breaker_open,
                },
            })
            .collect()
    }

    /// A cluster's known nodes (`host:port`), for a probe whose random node fails.
    fn known_nodes(&self) -> Vec<String> {
        probe::known_nodes(&self.inner)
    }

    /// Checks and records every limiter of one request: in one round trip
    /// when its keys share a slot (always on one node), else slot group by
    /// slot group (`spread.rs`).
    pub async fn check(
        &self,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<Vec<Outcome>, StoreError> {
        let inner = &self.inner;
        // Leased units are counted in Redis already: spending them needs no
        // call, and stays exact while Redis is unreachable.
        let deadline = tokio::time::Instant::now() + inner.timeout;
        if let Some(outcomes) = self.spend_leased(checks, now, deadline).await {
            return Ok(outcomes);
        }
        if !inner.breaker.allows() {
            return Err(circuit_open());
        }
        let keys: Vec<String> = checks.iter().map(|c| self.key(c.key)).collect();
        let groups = spread::slot_groups(&keys);
        // A group on a primary known to be failing: the request applies
        // `on_error` before anything is recorded (nothing to give back).
        if groups.iter().any(|g| !self.owner_allows(&keys[g[0]])) {
            return Err(circuit_open());
        }
        let members: Vec<String> = checks.iter().map(|c| self.member(c.algorithm)).collect();
        let outcomes = match &groups[..] {
            // Leases are asked for only where one call sees every limiter.
            // A key whose lease another request began fetching meanwhile:
            // wait for that one too (within the same deadline).
            [_] => loop {
                if let Some(o) = self.check_whole(checks, &keys, &members, now, deadline).await? {
                    break o;
                }
                if let Some(o) = self.spend_leased(checks, now, deadline).await {
                    return Ok(o);
                }
            },
            _ => {
                self.give_back(inner.leases.take_ended());
                spread::check_groups(self, checks, &keys, &members, &groups).await?
            }
        };
        if admits(checks, &outcomes) {
            for ((c, o), member) in checks.iter().zip(&outcomes).zip(members) {
                match (c.algorithm.holds(), o.ruling) {
                    (Hold::Slot, _) => self.remember(c.key, now, Holder::Slot(member), now),
                    (Hold::Place, Ruling::Delay(d)) => {
                        self.remember(c.key, now + d, Holder::Place(o.at + d), now)
                    }
                    // Let through at once: no place in the queue to give back.
                    (Hold::Place, Ruling::Allow | Ruling::Deny { .. }) | (Hold::Nothing, _) => {}
                }
            }
        }
        Ok(outcomes)
    }

    /// Decides the request from leases: at once, or after waiting (up to
    /// `store.timeout` in all) for the lease being fetched on its key, and
    /// for the next one while each fetch opens a lease (a hot key's requests
    /// wait on one fetch instead of each calling Redis). `None`: call Redis.
    async fn spend_leased(
        &self,
        checks: &[Check<'_>],
        now: Nanos,
        deadline: tokio::time::Instant,
    ) -> Option<Vec<Outcome>> {
        let leases = &self.inner.leases;
        loop {
            if let Some(outcomes) = leases.spend(checks, now) {
                return Some(outcomes);
            }
            if leases.wait_for_ask(checks, deadline).await == lease::Waited::No {
                return None;
            }
        }
    }

    /// A concurrency slot's member id, unique in the fleet; empty for other algorithms.
    fn member(&self, algorithm: &Algorithm) -> String {
        match algorithm.holds() {
            Hold::Slot => {
                let n = self.inner.next_member.fetch_add(1, Ordering::Relaxed);
                format!("{}:{n}", self.inner.instance)
            }
            Hold::Nothing | Hold::Place => String::new(),
        }
    }

    /// Every limiter of the request in one slot: one atomic call, which also
    /// asks for leases where the limiters have `lease:`.
    async fn check_whole(
        &self,
        checks: &[Check<'_>],
        keys: &[String],
        members: &[String],
        now: Nanos,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Vec<Outcome>>, StoreError> {
        let inner = &self.inner;
        let asking = inner.leases.ask(checks, now);
        self.give_back(inner.leases.take_ended());
        if !asking.any()
            && tokio::time::Instant::now() < deadline
            && inner.leases.fetching(checks)
        {
            return Ok(None);
        }
        if !asking.any() {
            let all: Vec<usize> = (0..checks.len()).collect();
            return self.check_group(checks, keys, members, &all).await.map(Some);
        }
        let mut call = inner.script.prepare_invoke();
        call.arg("lease");
        for ((c, key), member) in checks.iter().zip(keys).zip(members) {
            call.key(key);
            args::push_check(&mut call, c.algorithm, c.shadow, member)?;
        }
        asking.push_args(&mut call);
        let call = &call;
        let reply: Vec<i64> = self
            .call_at(&keys[0], |mut con| async move {
                call.invoke_async(&mut con).await
            })
            .await?;
        let (head, grants) = lease::split_reply(&reply, checks.len())?;
        let (_, outcomes) = parse(head, checks)?;
        asking.settle(checks, grants, &outcomes, now);
        Ok(Some(outcomes))
    }

    /// The checks at `positions` (keys of one slot) in one atomic script
    /// call; outcomes in the order of `positions`.
    async fn check_group(
        &self,
        checks: &[Check<'_>],
        keys: &[String],
        members: &[String],
        positions: &[usize],
    ) -> Result<Vec<Outcome>, StoreError> {
        let mut call = self.inner.script.prepare_invoke();
        call.arg("check");
        let mut group = Vec::with_capacity(positions.len());
        for &i in positions {
            call.key(&keys[i]);
            args::push_check(
                &mut call,
                checks[i].algorithm,
                checks[i].shadow,
                &members[i],
            )?;
            group.push(checks[i]);
        }
        let call = &call;
        let reply: Vec<i64> = self
            .call_at(&keys[positions[0]], |mut con| async move {
                call.invoke_async(&mut con).await
            })
            .await?;
        let (_, outcomes) = parse(&reply, &group)?;
        Ok(outcomes)
    }

    /// Remembers what the local fallback admitted, so its release goes back there.
    pub fn note_local(&self, checks: &[Check<'_>], outcomes: &[Outcome], now: Nanos) {
        if !admits(checks, outcomes) {
            return;
        }
        for (c, o) in checks.iter().zip(outcomes) {
            // The release names the key the table counted on.
            let key = if o.overflowed { c.overflow } else { c.key };
            match (c.algorithm.holds(), o.ruling) {
                (Hold::Slot, _) => self.remember(key, now, Holder::Local { queued: false }, now),
                (Hold::Place, Ruling::Delay(d)) => {
                    self.remember(key, now + d, Holder::Local { queued: true }, now)
                }
                (Hold::Place, Ruling::Allow | Ruling::Deny { .. }) | (Hold::Nothing, _) => {}
            }
        }
    }

    /// The quota of one key now, without counting (admin `/status`).
    pub async fn peek(&self, store_key: &str, algorithm: &Algorithm) -> Result<Quota, StoreError> {
        let mut call = self.inner.script.prepare_invoke();
        let key = self.key(store_key);
        call.arg("peek").key(&key);
        args::push_check(&mut call, algorithm, false, "")?;
        let call = &call;
        let reply: Vec<i64> = self
            .call_at(
                &key,
                |mut con| async move { call.invoke_async(&mut con).await },
            )
            .await?;
        let check = Check {
            key: store_key,
            overflow: store_key,
            algorithm,
            shadow: false,
        };
        let (_, outcomes) = parse(&reply, &[check])?;
        Ok(outcomes[0].quota)
    }

    /// Gives back what an admitted request held; never waits (a spawned task talks to Redis).
    pub fn release(
        &self,
        table: &Table,
        store_key: &str,
        algorithm: &Algorithm,
        ticket: Nanos,
        now: Nanos,
    ) {
        let holder = {
            let mut tickets = self.inner.tickets.lock();
            let slot = (Box::<str>::from(store_key), ticket);
            let holder = tickets.get_mut(&slot).and_then(|v| v.pop());
            if tickets.get(&slot).is_some_and(|v| v.is_empty()) {
                tickets.remove(&slot);
            }
            holder
        };
        let held = match holder {
            Some(Holder::Local { .. }) => {
                table.release(store_key, algorithm, ticket, now);
                return;
            }
            Some(held) => held,
            // Unknown (already swept): a slot frees itself with its lease, a place with its turn.
            None => return,
        };
        let Some(args) = args::release(algorithm, held) else {
            return;
        };
        self.send_in_background("release", self.key(store_key), args.to_vec());
    }

    /// A `release` or `refund` script call nobody waits for: an admitted
    /// request's finished slot, or what a slot group took for a request
    /// another group refused. Failing leaves the safe side (the unit stays
    /// counted until its lease, turn or window ends).
    fn send_in_background(&self, mode: &'static str, key: String, args: Vec<String>) {
        let inner = self.inner.clone();
        self.inner.runtime.spawn(async move {
            let Some(conn) = inner.conn.load_full() else {
                return;
            };
            let mut con = (*conn).clone();
            let mut call = inner.script.prepare_invoke();
            call.arg(mode).key(key).arg(&args[..]);
            let wait = inner.timeout.max(Duration::from_secs(1));
            match tokio::time::timeout(wait, call.invoke_async::<i64>(&mut con)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, mode, "Redis {mode} failed; the unit stays counted until it expires")
                }
                Err(_) => tracing::debug!(mode, "Redis {mode} timed out; the unit stays counted until it expires"),
            }
        });
    }

    /// `count:` — gives back the unit a request took (see `limiter/count.rs`);
    /// `ticket` is in Redis' clock. Awaited by the request, so the client's
    /// next request already sees it; bounded by the timeout like every call.
    pub async fn refund(
        &self,
        store_key: &str,
        algorithm: &Algorithm,
        ticket: Ticket,
    ) -> Result<(), StoreError> {
        let Some(args) = args::refund(algorithm, ticket) else {
            return Ok(());
        };
        let mut call = self.inner.script.prepare_invoke();
        let key = self.key(store_key);
        call.arg("refund").key(&key).arg(&args[..]);
        let call = &call;
        let _: i64 = self
            .call_at(
                &key,
                |mut con| async move { call.invoke_async(&mut con).await },
            )
            .await?;
        Ok(())
    }

    /// Deletes these Redis keys (one `DEL` per slot); returns how many existed.
    pub async fn delete(&self, keys: &[String]) -> Result<usize, StoreError> {
        let deletes = spread::slot_groups(keys)
            .into_iter()
            .map(|group| async move {
                let mut cmd = ::redis::cmd("DEL");
                for &i in &group {
                    cmd.arg(&keys[i]);
                }
                let cmd = &cmd;
                self.call_at(&keys[group[0]], |mut con| async move {
                    cmd.query_async::<usize>(&mut con).await
                })
                .await
            });
        let mut removed = 0;
        for n in futures_util::future::join_all(deletes).await {
            removed += n?;
        }
        Ok(removed)
    }

    /// Forgets leaky-bucket tickets whose turn has passed (the app releases only before it).
    pub fn sweep(&self, now: Nanos) {
        sweep(&mut self.inner.tickets.lock(), now);
    }

    /// False while a breaker is open (Redis failed repeatedly and has not
    /// answered a probe since): the store's, or on a cluster any primary's.
    pub fn healthy(&self) -> bool {
        !self.inner.breaker.is_open() && !self.inner.owners.any_open()
    }

    /// The primary serving `redis_key`'s slot, on a cluster whose slot map the probe has read.
    fn owner(&self, redis_key: &str) -> Option<Arc<Owner>> {
        if self.inner.spread {
            self.inner.owners.of(redis_key)
        } else {
            None
        }
    }

    /// Whether the breaker a call on `redis_key` would feed lets it through.
    fn owner_allows(&self, redis_key: &str) -> bool {
        self.owner(redis_key).is_none_or(|o| o.breaker.allows())
    }

    fn remember(&self, store_key: &str, ticket: Nanos, holder: Holder, now: Nanos) {
        let mut tickets = self.inner.tickets.lock();
        if tickets.len() >= SWEEP_AT {
            sweep(&mut tickets, now);
        }
        tickets
            .entry((store_key.into(), ticket))
            .or_default()
            .push(holder);
    }

    fn connection(&self) -> Result<RedisConnection, StoreError> {
        self.inner
            .conn
            .load_full()
            .map(|c| (*c).clone())
            .ok_or_else(no_primary)
    }

    /// One call that feeds the whole store's breaker.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: Fn(RedisConnection) -> Fut,
        Fut: std::future::Future<Output = ::redis::RedisResult<T>>,
    {
        self.call_via(None, f).await
    }

    /// One call on `redis_key`: on a cluster it feeds (and is refused by) the
    /// breaker of the primary serving that key's slot.
    async fn call_at<T, F, Fut>(&self, redis_key: &str, f: F) -> Result<T, StoreError>
    where
        F: Fn(RedisConnection) -> Fut,
        Fut: std::future::Future<Output = ::redis::RedisResult<T>>,
    {
        self.call_via(self.owner(redis_key), f).await
    }

    /// One call under the timeout, feeding `owner`'s breaker (a cluster
    /// primary's, which refuses the call at once while open) or else the
    /// store's. A connection found dead (Redis restarted since the last call)
    /// is retried once, within the same timeout, on the connection the manager
    /// re-opens: a proxy that saw no traffic during an outage must not fail
    /// its first request after it.
    async fn call_via<T, F, Fut>(&self, owner: Option<Arc<Owner>>, f: F) -> Result<T, StoreError>
    where
        F: Fn(RedisConnection) -> Fut,
        Fut: std::future::Future<Output = ::redis::RedisResult<T>>,
    {
        if owner.as_ref().is_some_and(|o| !o.breaker.allows()) {
            return Err(circuit_open());
        }
        let inner = &self.inner;
        let attempt = async {
            match f(self.connection()?).await {
                Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                    f(self.connection()?).await.map_err(failed)
                }
                result => result.map_err(failed),
            }
        };
        let result = match tokio::time::timeout(inner.timeout, attempt).await {
            Ok(r) => r,
            Err(_) => Err(timed_out(inner.timeout)),
        };
        match (&result, owner) {
            (Ok(_), None) => {
                if inner.breaker.success() {
                    tracing::info!("Redis answers again; shared limits resume");
                }
            }
            (Err(e), None) => {
                if inner.breaker.failure() {
                    tracing::warn!(error = %e, cool_down = ?BREAKER_COOL_DOWN, "Redis failed {BREAKER_THRESHOLD} times in a row; skipping it (on_error applies) until a probe succeeds");
                }
            }
            (Ok(_), Some(o)) => {
                if o.breaker.success() {
                    tracing::info!(node = %o.addr, "Redis primary answers again; shared limits resume for its slots");
                }
            }
            (Err(e), Some(o)) => {
                if o.breaker.failure() {
                    tracing::warn!(error = %e, node = %o.addr, cool_down = ?BREAKER_COOL_DOWN, "Redis primary failed {BREAKER_THRESHOLD} times in a row; requests whose keys it serves apply on_error until a probe succeeds");
                }
            }
        }
        result
    }
}

fn sweep(tickets: &mut Tickets, now: Nanos) {
    tickets.retain(|(_, ticket), holders| {
        holders.retain(|h| {
            !matches!(h, Holder::Place(_) | Holder::Local { queued: true }) || *ticket > now
        });
        !holders.is_empty()
    });
}

/// A breaker with the Redis store's threshold and cool-down.
fn breaker_for_redis() -> Breaker {
    Breaker::new(BREAKER_THRESHOLD, BREAKER_COOL_DOWN)
}

/// Whether no limiter that is not in shadow mode refused.
fn admits(checks: &[Check<'_>], outcomes: &[Outcome]) -> bool {
    !checks
        .iter()
        .zip(outcomes)
        .any(|(c, o)| o.ruling.is_deny() && !c.shadow)
}

/// Numbers per check in a check reply: ruling, its nanoseconds,
/// remaining, reset after, mark (see `redis/head.lua`).
pub(super) const PER_CHECK: usize = 5;

/// The reply's Redis time (Unix ns) and one outcome per check.
fn parse(reply: &[i64], checks: &[Check<'_>]) -> Result<(Nanos, Vec<Outcome>), StoreError> {
    if reply.len() != 2 + PER_CHECK * checks.len() {
        return Err(bad_reply(reply.len()));
    }
    let n = |v: i64| v.max(0) as u64;
    let at = n(reply[0]) * NANOS_PER_SEC + n(reply[1]) * 1_000;
    let outcomes = checks
        .iter()
        .zip(reply[2..].chunks_exact(PER_CHECK))
        .map(|(c, r)| {
            let ruling = match r[0] {
                0 => Ruling::Allow,
                1 => Ruling::Delay(n(r[1])),
                _ => Ruling::Deny {
                    retry_after: n(r[1]).max(1),
                },
            };
            let (limit, window) = c.algorithm.frame();
            Outcome {
                ruling,
                quota: Quota {
                    limit,
                    window,
                    remaining: n(r[2]),
                    reset_after: n(r[3]),
                },
                at,
                mark: n(r[4]),
                overflowed: false,
            }
        })
        .collect();
    Ok((at, outcomes))
}

/// Distinguishes this process's concurrency slots from every other proxy's.
fn instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos)
}

/// Redis failed: the call's error, or a connection that failed.
pub(super) fn failed(e: ::redis::RedisError) -> StoreError {
    StoreError::new(StoreFailure::Failed, RawRedis::NAME, format!("Redis failed: {e}")).because(e)
}

fn timed_out(timeout: Duration) -> StoreError {
    StoreError::new(
        StoreFailure::Timeout,
        RawRedis::NAME,
        format!("Redis did not answer within {timeout:?}"),
    )
}

fn circuit_open() -> StoreError {
    StoreError::new(
        StoreFailure::CircuitOpen,
        RawRedis::NAME,
        "Redis is skipped for a moment after repeated failures (circuit breaker open)",
    )
}

/// A window or rate whose nanoseconds the script cannot compute with exactly.
pub(super) fn too_long(ns: Nanos) -> StoreError {
    StoreError::new(
        StoreFailure::TooLong,
        RawRedis::NAME,
        format!("a window or rate of {ns} ns is too long for the Redis store (at most ~52 days)"),
    )
}

/// An answer of `values` numbers, not what the script returns.
pub(super) fn bad_reply(values: usize) -> StoreError {
    StoreError::new(
        StoreFailure::BadReply,
        RawRedis::NAME,
        format!("Redis answered with {values} values, not what the script returns"),
    )
}

fn not_in_runtime() -> StoreError {
    StoreError::new(
        StoreFailure::Open,
        RawRedis::NAME,
        "the Redis store must be opened inside the async runtime",
    )
}

fn no_primary() -> StoreError {
    StoreError::new(
        StoreFailure::NoServer,
        RawRedis::NAME,
        "no Redis primary yet: no sentinel has named a node that answers as primary",
    )
}
