//! The Redis store: every limiter of one request in one atomic Lua call, on the Redis server's clock.
//!
//! A fleet of tollgates pointed at one Redis shares every limit exactly:
//! `redis.lua` ports the arithmetic of `src/limiter/*.rs` and runs check →
//! admit → record for all limiters of a request inside one `EVALSHA` (the
//! `redis` crate reloads the script on `NOSCRIPT`), so no read-then-write
//! race exists whatever the number of proxies, and time comes from Redis'
//! `TIME`, so proxies with skewed clocks agree. Keys expire on their own
//! (`PEXPIRE` = what the algorithm still needs).
//!
//! Key names: `<prefix>{<tag>}<limiter>:<key value>` with `tag` = the prefix
//! without its trailing `:` (default `tollgate:{tollgate}strict:ip:…`). One
//! script call touches several keys, which Redis Cluster only allows within
//! one hash slot, so every key of a fleet shares one tag: correct on a
//! cluster, but all limiter state lives on one shard.
//!
//! Failure: every call is bounded by `store.timeout`; after
//! [`BREAKER_THRESHOLD`] consecutive failures the [`Breaker`] opens and calls
//! fail at once (the app applies `on_error`) while a background probe, every
//! [`BREAKER_COOL_DOWN`], tries a fresh connection and closes it again.
//! Releases (a concurrency slot, a leaky-bucket place) never wait on Redis:
//! they are sent from a spawned task.

pub mod acme;
mod args;
mod backend;
pub mod ban;
mod lease;

pub use lease::metrics_at_zero as lease_metrics_at_zero;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::runtime::Handle;

use super::breaker::Breaker;
use super::memory::Table;
use super::{Check, Outcome, StoreError};
use crate::limiter::{Algorithm, Hold, Nanos, Quota, Verdict, NANOS_PER_SEC};

/// `lease.lua` continues `redis.lua`'s chunk (it reads the request's state).
const SCRIPT: &str = concat!(include_str!("redis.lua"), include_str!("lease.lua"));

/// Consecutive failures that open the breaker.
pub const BREAKER_THRESHOLD: u32 = 3;
/// How long an open breaker skips Redis before the next probe.
pub const BREAKER_COOL_DOWN: Duration = Duration::from_secs(1);
/// A concurrency slot whose release never arrives (a proxy crashed, Redis was
/// down when it finished) frees itself after this long.
pub const CONCURRENCY_LEASE: Duration = Duration::from_secs(600);
/// Lua computes with doubles: relative nanoseconds must stay below 2^53 (~104 days).
const MAX_EXACT: u64 = 1 << 53;
/// Past this many remembered tickets, those whose turn has passed are swept.
const SWEEP_AT: usize = 4096;

/// A handle: clones share one connection, breaker and ticket table.
#[derive(Clone)]
pub struct Redis {
    inner: Arc<Inner>,
}

struct Inner {
    client: ::redis::Client,
    manager: ArcSwap<ConnectionManager>,
    script: ::redis::Script,
    /// `<prefix>{<tag>}`, put in front of every store key.
    key_prefix: String,
    /// `store.prefix` as written (ACME keys carry a tag of their own, see `acme.rs`).
    prefix: String,
    timeout: Duration,
    breaker: Breaker,
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
enum Holder {
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
    pub fn open(url: &str, prefix: &str, timeout: Duration) -> Result<Redis, StoreError> {
        let runtime = Handle::try_current().map_err(|_| StoreError::NoRuntime)?;
        let client = ::redis::Client::open(url).map_err(StoreError::Redis)?;
        let manager = connect(&client, timeout)?;
        let tag = match prefix.trim_end_matches(':') {
            "" => "tollgate",
            t => t,
        };
        let inner = Arc::new(Inner {
            client,
            manager: ArcSwap::from_pointee(manager),
            script: ::redis::Script::new(SCRIPT),
            key_prefix: format!("{prefix}{{{tag}}}"),
            prefix: prefix.to_string(),
            timeout,
            breaker: Breaker::new(BREAKER_THRESHOLD, BREAKER_COOL_DOWN),
            tickets: Mutex::new(HashMap::new()),
            runtime: runtime.clone(),
            instance: instance_id(),
            next_member: AtomicU64::new(0),
            leases: lease::Leases::new(),
        });
        runtime.spawn(probe_loop(Arc::downgrade(&inner)));
        Ok(Redis { inner })
    }

    /// The Redis key of a store key.
    pub fn key(&self, store_key: &str) -> String {
        format!("{}{store_key}", self.inner.key_prefix)
    }

    /// Checks and records every limiter of one request in one round trip.
    pub async fn check(
        &self,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<Vec<Outcome>, StoreError> {
        let inner = &self.inner;
        // Leased units are counted in Redis already: spending them needs no
        // call, and stays exact while Redis is unreachable.
        if let Some(outcomes) = inner.leases.spend(checks, now) {
            return Ok(outcomes);
        }
        if !inner.breaker.allows() {
            return Err(StoreError::CircuitOpen);
        }
        let asking = inner.leases.ask(checks, now);
        self.give_back(inner.leases.take_ended());
        let mut members = Vec::new();
        let mut call = inner.script.prepare_invoke();
        call.arg(if asking.any() { "lease" } else { "check" });
        for c in checks {
            let member = match c.algorithm.holds() {
                Hold::Slot => {
                    let n = inner.next_member.fetch_add(1, Ordering::Relaxed);
                    format!("{}:{n}", inner.instance)
                }
                Hold::Nothing | Hold::Place => String::new(),
            };
            call.key(self.key(c.key));
            args::push_check(&mut call, c.algorithm, c.shadow, &member)?;
            members.push(member);
        }
        if asking.any() {
            asking.push_args(&mut call);
        }
        let call = &call;
        let reply: Vec<i64> = self
            .call(|mut con| async move { call.invoke_async(&mut con).await })
            .await?;
        let (at, outcomes) = if asking.any() {
            let (head, grants) = lease::split_reply(&reply, checks.len())?;
            let (at, outcomes) = parse(head, checks)?;
            asking.settle(checks, grants, &outcomes, now);
            (at, outcomes)
        } else {
            parse(&reply, checks)?
        };

        let admitted = !checks
            .iter()
            .zip(&outcomes)
            .any(|(c, o)| o.verdict.is_deny() && !c.shadow);
        if admitted {
            for ((c, o), member) in checks.iter().zip(&outcomes).zip(members) {
                match (c.algorithm.holds(), o.verdict) {
                    (Hold::Slot, _) => self.remember(c.key, now, Holder::Slot(member), now),
                    (Hold::Place, Verdict::Delay(d)) => {
                        self.remember(c.key, now + d, Holder::Place(at + d), now)
                    }
                    // Let through at once: no place in the queue to give back.
                    (Hold::Place, Verdict::Allow | Verdict::Deny { .. }) | (Hold::Nothing, _) => {}
                }
            }
        }
        Ok(outcomes)
    }

    /// Remembers what the local fallback admitted, so its release goes back there.
    pub fn note_local(&self, checks: &[Check<'_>], outcomes: &[Outcome], now: Nanos) {
        let admitted = !checks
            .iter()
            .zip(outcomes)
            .any(|(c, o)| o.verdict.is_deny() && !c.shadow);
        if !admitted {
            return;
        }
        for (c, o) in checks.iter().zip(outcomes) {
            // The release names the key the table counted on.
            let key = if o.overflowed { c.overflow } else { c.key };
            match (c.algorithm.holds(), o.verdict) {
                (Hold::Slot, _) => self.remember(key, now, Holder::Local { queued: false }, now),
                (Hold::Place, Verdict::Delay(d)) => {
                    self.remember(key, now + d, Holder::Local { queued: true }, now)
                }
                (Hold::Place, Verdict::Allow | Verdict::Deny { .. }) | (Hold::Nothing, _) => {}
            }
        }
    }

    /// The quota of one key now, without counting (admin `/status`).
    pub async fn peek(&self, store_key: &str, algorithm: &Algorithm) -> Result<Quota, StoreError> {
        let mut call = self.inner.script.prepare_invoke();
        call.arg("peek").key(self.key(store_key));
        args::push_check(&mut call, algorithm, false, "")?;
        let call = &call;
        let reply: Vec<i64> = self
            .call(|mut con| async move { call.invoke_async(&mut con).await })
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
            Some(Holder::Slot(member)) => args::Held::Slot(member),
            Some(Holder::Place(at)) => args::Held::Place(at),
            // Unknown (already swept): a slot frees itself with its lease, a place with its turn.
            None => return,
        };
        let Some(args) = args::release(algorithm, held) else {
            return;
        };
        let key = self.key(store_key);
        let inner = self.inner.clone();
        self.inner.runtime.spawn(async move {
            let mut con = (**inner.manager.load()).clone();
            let mut call = inner.script.prepare_invoke();
            call.arg("release").key(key).arg(&args[..]);
            let wait = inner.timeout.max(Duration::from_secs(1));
            match tokio::time::timeout(wait, call.invoke_async::<i64>(&mut con)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "Redis release failed; the lease frees it")
                }
                Err(_) => tracing::debug!("Redis release timed out; the lease frees it"),
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
        ticket: Nanos,
    ) -> Result<(), StoreError> {
        let Some(args) = args::refund(algorithm, ticket) else {
            return Ok(());
        };
        let mut call = self.inner.script.prepare_invoke();
        call.arg("refund").key(self.key(store_key)).arg(&args[..]);
        let call = &call;
        let _: i64 = self
            .call(|mut con| async move { call.invoke_async(&mut con).await })
            .await?;
        Ok(())
    }

    /// Deletes these store keys in Redis; returns how many existed.
    pub async fn reset(&self, keys: &[String]) -> Result<usize, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut cmd = ::redis::cmd("DEL");
        for k in keys {
            cmd.arg(self.key(k));
        }
        let cmd = &cmd;
        let removed: usize = self
            .call(|mut con| async move { cmd.query_async(&mut con).await })
            .await?;
        Ok(removed)
    }

    /// Forgets leaky-bucket tickets whose turn has passed (the app releases only before it).
    pub fn sweep(&self, now: Nanos) {
        sweep(&mut self.inner.tickets.lock(), now);
    }

    /// False while the breaker is open (Redis failed repeatedly and has not answered a probe since).
    pub fn healthy(&self) -> bool {
        !self.inner.breaker.is_open()
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

    fn connection(&self) -> ConnectionManager {
        (**self.inner.manager.load()).clone()
    }

    /// One call under the timeout, feeding the breaker. A connection found
    /// dead (Redis restarted since the last call) is retried once, within the
    /// same timeout, on the connection the manager re-opens: a proxy that saw
    /// no traffic during an outage must not fail its first request after it.
    pub(super) async fn call<T, F, Fut>(&self, f: F) -> Result<T, StoreError>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = ::redis::RedisResult<T>>,
    {
        let inner = &self.inner;
        let attempt = async {
            match f(self.connection()).await {
                Err(e) if e.is_connection_dropped() || e.is_io_error() => {
                    f(self.connection()).await
                }
                result => result,
            }
        };
        let result = match tokio::time::timeout(inner.timeout, attempt).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(inner.timeout)),
        };
        match &result {
            Ok(_) => {
                if inner.breaker.success() {
                    tracing::info!("Redis answers again; shared limits resume");
                }
            }
            Err(e) => {
                if inner.breaker.failure() {
                    tracing::warn!(error = %e, cool_down = ?BREAKER_COOL_DOWN, "Redis failed {BREAKER_THRESHOLD} times in a row; skipping it (on_error applies) until a probe succeeds");
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

/// A connection manager that connects on first use and reconnects on I/O errors.
fn connect(client: &::redis::Client, timeout: Duration) -> Result<ConnectionManager, StoreError> {
    // Our own timeout bounds every request; these only bound the background
    // (re)connection so it neither gives up on a slow link nor hangs.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_secs(1))))
        .set_response_timeout(Some(timeout.max(Duration::from_secs(1))))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(StoreError::Redis)
}

/// Probes Redis in the background: at start (so a Redis that is down opens the
/// breaker before any request pays the timeout) and while the breaker is open.
/// A probe uses a fresh connection, which replaces the old one when it answers.
async fn probe_loop(inner: Weak<Inner>) {
    let mut first = true;
    loop {
        if !first {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if !first && !inner.breaker.probe_due() {
            continue;
        }
        let was_first = std::mem::take(&mut first);
        let wait = inner.timeout.max(Duration::from_secs(1));
        let ping = async {
            let mut con = connect(&inner.client, inner.timeout).ok()?;
            let pong: ::redis::RedisResult<String> =
                ::redis::cmd("PING").query_async(&mut con).await;
            pong.ok().map(|_| con)
        };
        match tokio::time::timeout(wait, ping).await {
            Ok(Some(con)) => {
                inner.manager.store(Arc::new(con));
                if inner.breaker.success() {
                    tracing::info!("Redis answers again; shared limits resume");
                }
            }
            _ if was_first => {
                if inner.breaker.trip() {
                    tracing::warn!(
                        "Redis does not answer at start; on_error applies until it does"
                    );
                }
            }
            _ => {
                inner.breaker.failure();
            }
        }
    }
}

/// The reply's Redis time (Unix ns) and one outcome per check.
fn parse(reply: &[i64], checks: &[Check<'_>]) -> Result<(Nanos, Vec<Outcome>), StoreError> {
    if reply.len() != 2 + 4 * checks.len() {
        return Err(StoreError::BadReply(reply.len()));
    }
    let n = |v: i64| v.max(0) as u64;
    let at = n(reply[0]) * NANOS_PER_SEC + n(reply[1]) * 1_000;
    let outcomes = checks
        .iter()
        .zip(reply[2..].chunks_exact(4))
        .map(|(c, r)| {
            let verdict = match r[0] {
                0 => Verdict::Allow,
                1 => Verdict::Delay(n(r[1])),
                _ => Verdict::Deny {
                    retry_after: n(r[1]).max(1),
                },
            };
            let (limit, window) = c.algorithm.frame();
            Outcome {
                verdict,
                quota: Quota {
                    limit,
                    window,
                    remaining: n(r[2]),
                    reset_after: n(r[3]),
                },
                at,
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
