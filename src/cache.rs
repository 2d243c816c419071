//! The one shared response cache: a bounded map (quick_cache, S3-FIFO) of stored answers by key, the renders under way, purges and counts.
//!
//! Why quick_cache: its S3-FIFO policy admits a new key into a small probation
//! queue and promotes it only when it is asked for again, so a scan of
//! one-off URLs (a scraper walking every page once) cycles through the
//! probation queue and leaves the pages people keep asking for in the main
//! one; it charges each entry a weight (its bytes) against one capacity,
//! resizes in place (`set_capacity` evicts the coldest first), runs no
//! background thread, and reports evictions through a lifecycle hook.
//!
//! - [`key`]: the key, built in one place;
//! - [`policy`]: who bypasses, what may be stored and for how long;
//! - [`entry`]: one stored answer and the answer a client gets from it;
//! - [`flight`]: one render for concurrent misses.

pub mod entry;
pub mod flight;
pub mod key;
pub mod policy;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName};
use parking_lot::RwLock;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, OptionsBuilder, Weighter};

use crate::config::cache::CacheConfig;
use crate::limiter::Nanos;
use crate::metrics::{Counter, Metrics};
pub use entry::{Entry, Standing, CACHE_STATUS};
pub use key::Key;

/// A caching route's rules and its counts (`tollgate_cache_requests_total{route,result}`).
pub struct RouteCache {
    pub config: crate::config::cache::RouteCacheConfig,
    pub hit: Counter,
    pub miss: Counter,
    /// Served stale: while a refresh runs, or because the upstream failed.
    pub stale: Counter,
    pub bypass: Counter,
}

impl RouteCache {
    pub fn new(
        config: crate::config::cache::RouteCacheConfig,
        route: &str,
        metrics: &Metrics,
    ) -> RouteCache {
        let c = |result| metrics.counter(REQUESTS, &[("route", route), ("result", result)]);
        RouteCache {
            config,
            hit: c("hit"),
            miss: c("miss"),
            stale: c("stale"),
            bypass: c("bypass"),
        }
    }

    /// Answers that never reached the upstream: PHP renders saved.
    pub fn saved(&self) -> u64 {
        self.hit.load(Ordering::Relaxed) + self.stale.load(Ordering::Relaxed)
    }
}

/// `tollgate_cache_requests_total{route,result}`.
pub const REQUESTS: &str = "tollgate_cache_requests_total";

/// What a key holds: an answer, or (under a URL's key) the request headers
/// its answers vary by, under whose values the answers are stored.
#[derive(Clone)]
pub enum Slot {
    Stored(Arc<Entry>),
    Vary(Arc<[HeaderName]>),
    /// The key's answer could not be stored (private, a cookie, no
    /// freshness), remembered until this time: its requests ask the
    /// upstream without waiting on one another's render.
    Unstorable(Nanos),
}

/// How long an answer found not storable is remembered (Varnish's
/// hit-for-pass, shorter than its 120 s: a page that becomes storable is
/// stored again within this time). Not renewed by the requests it lets
/// through: asking each of their answers whether it may be stored cost
/// ~7,000 instructions a request (docs/PERFORMANCE.md, the ladder).
pub const UNSTORABLE_FOR: Nanos = 10 * crate::limiter::NANOS_PER_SEC;

/// What a lookup found for a request.
pub enum Found {
    Entry(Key, Arc<Entry>),
    /// Nothing usable; the key an answer would be stored under.
    Nothing(Key),
    /// The key's last answer could not be stored, a moment ago
    /// ([`UNSTORABLE_FOR`]): ask the upstream without waiting on another
    /// request's render, and store nothing.
    Unstorable(Key),
}

#[derive(Clone)]
struct Weigh;

impl Weighter<Key, Slot> for Weigh {
    fn weight(&self, key: &Key, slot: &Slot) -> u64 {
        match slot {
            Slot::Stored(e) => e.weight,
            Slot::Vary(names) => {
                entry::ENTRY_OVERHEAD
                    + key.len() as u64
                    + names
                        .iter()
                        .map(|n| n.as_str().len() as u64 + 16)
                        .sum::<u64>()
            }
            Slot::Unstorable(_) => entry::ENTRY_OVERHEAD + key.len() as u64,
        }
    }
}

/// Counts what the map evicts to make room (`tollgate_cache_evictions_total`).
#[derive(Clone)]
struct Evictions(Counter);

impl Lifecycle<Key, Slot> for Evictions {
    type RequestState = ();

    fn on_evict(&self, _: &mut (), _key: Key, _slot: Slot) {
        crate::metrics::inc(&self.0);
    }
}

/// The response cache the whole process shares (reloads keep it).
pub struct ResponseCache {
    map: Cache<Key, Slot, Weigh, DefaultHashBuilder, Evictions>,
    pub flights: flight::Flights,
    settings: RwLock<CacheConfig>,
    pub evictions: Counter,
    /// Answers stored (`tollgate_cache_stored_total`).
    pub stored: Counter,
    /// Lookups that found a usable answer, and those that did not (for `GET /cache`).
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

/// A typical page, for the map's first table size (it grows past it).
const TYPICAL_ENTRY: u64 = 16 * 1024;

/// Shards of the map (each its own lock and its own share of `max_size`):
/// four per core, but never so many that a share holds fewer than four of
/// the largest answers (the map refuses an entry heavier than its shard's main queue).
fn shards(config: &CacheConfig) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let fit = (config.max_size / config.max_entry_size.max(1) / 4).max(1) as usize;
    let n = fit.min(cores * 4);
    1 << (usize::BITS - 1 - n.leading_zeros())
}

impl ResponseCache {
    pub fn new(config: &CacheConfig, metrics: &Metrics) -> ResponseCache {
        let evictions = metrics.counter("tollgate_cache_evictions_total", &[]);
        let options = OptionsBuilder::new()
            .estimated_items_capacity((config.max_size / TYPICAL_ENTRY).max(64) as usize)
            .weight_capacity(config.max_size)
            .shards(shards(config))
            // A tenth on probation (S3-FIFO's small queue): a new page must be
            // asked for again before a tenth of the cache has churned.
            .hot_allocation(0.9)
            .build()
            .expect("valid cache options");
        ResponseCache {
            map: Cache::with_options(
                options,
                Weigh,
                DefaultHashBuilder::default(),
                Evictions(evictions.clone()),
            ),
            flights: flight::Flights::default(),
            settings: RwLock::new(*config),
            evictions,
            stored: metrics.counter("tollgate_cache_stored_total", &[]),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// A reload's new bounds: a smaller `max_size` evicts the coldest entries first.
    pub fn reconfigure(&self, config: &CacheConfig) {
        let old = std::mem::replace(&mut *self.settings.write(), *config);
        if old.max_size != config.max_size {
            self.map.set_capacity(config.max_size);
        }
    }

    pub fn settings(&self) -> CacheConfig {
        *self.settings.read()
    }

    /// The entry for a request whose key before `Vary` is `base` (and its
    /// headers `headers`); an entry past every window is removed and not returned.
    pub fn find(&self, base: Key, headers: &HeaderMap, now: Nanos) -> Found {
        let key = match self.map.get(&*base.0) {
            None => return self.missed(base),
            Some(Slot::Stored(e)) => return self.usable(base, e, now),
            Some(Slot::Unstorable(until)) => return self.unstorable(base, until, now),
            Some(Slot::Vary(names)) => base.varied(&names, headers),
        };
        match self.map.get(&*key.0) {
            Some(Slot::Stored(e)) => self.usable(key, e, now),
            Some(Slot::Unstorable(until)) => self.unstorable(key, until, now),
            _ => self.missed(key),
        }
    }

    fn unstorable(&self, key: Key, until: Nanos, now: Nanos) -> Found {
        if now >= until {
            self.map.remove(&*key.0);
            return self.missed(key);
        }
        Found::Unstorable(key)
    }

    /// Remembers that the answer under `key` (a key [`find`](Self::find)
    /// found nothing under) could not be stored, for [`UNSTORABLE_FOR`]. A
    /// marker is an entry like any other: bounded by `max_size`, evicted
    /// first while it is asked for once.
    pub fn remember_unstorable(&self, key: &Key, now: Nanos) {
        if !matches!(self.map.get(&*key.0), None | Some(Slot::Unstorable(_))) {
            return;
        }
        self.map
            .insert(key.clone(), Slot::Unstorable(now + UNSTORABLE_FOR));
    }

    fn usable(&self, key: Key, e: Arc<Entry>, now: Nanos) -> Found {
        if e.standing(now) == Standing::Dead {
            self.map.remove(&*key.0);
            return self.missed(key);
        }
        Found::Entry(key, e)
    }

    fn missed(&self, key: Key) -> Found {
        Found::Nothing(key)
    }

    /// Stores `entry` for the request keyed `base` before `Vary` (`vary`:
    /// the headers the answer varies by, `headers` the request's); returns
    /// the key it went under. Too heavy an answer is not stored.
    pub fn store(
        &self,
        base: &Key,
        vary: &[HeaderName],
        headers: &HeaderMap,
        entry: Arc<Entry>,
    ) -> Option<Key> {
        // Past the shard's half (a reload shrank the cache under its
        // largest answers) the map would take it only to evict it.
        if entry.body.len() as u64 > self.settings().max_entry_size
            || entry.weight > self.map.shard_capacity() / 2
        {
            return None;
        }
        let key = if vary.is_empty() {
            base.clone()
        } else {
            self.map.insert(base.clone(), Slot::Vary(vary.into()));
            base.varied(vary, headers)
        };
        self.map.insert(key.clone(), Slot::Stored(entry));
        crate::metrics::inc(&self.stored);
        Some(key)
    }

    /// Removes one key (a refresh found the answer no longer storable, or an unsafe method changed it).
    pub fn remove(&self, key: &Key) {
        self.map.remove(&*key.0);
    }

    /// Removes everything (`prefix: None, host: None`), or every key whose
    /// path starts with `prefix` and whose host is `host`; returns how many.
    pub fn purge(&self, prefix: Option<&str>, host: Option<&str>) -> usize {
        let before = self.map.len();
        if prefix.is_none() && host.is_none() {
            self.map.clear();
        } else {
            let host = host.map(|h| key::host("http", h));
            self.map.retain(|k, _| {
                let path_matches = prefix.is_none_or(|p| k.path().starts_with(p));
                let host_matches = host.as_deref().is_none_or(|h| k.host() == h);
                !(path_matches && host_matches)
            });
        }
        before.saturating_sub(self.map.len())
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The bytes the accounting charges now (at most `max_size`).
    pub fn weight(&self) -> u64 {
        self.map.weight()
    }

    pub fn capacity(&self) -> u64 {
        self.map.capacity()
    }

    /// Whether `key` is stored (for tests and `GET /cache`).
    pub fn contains(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub fn count_lookup(&self, hit: bool) {
        let c = if hit { &self.hits } else { &self.misses };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
