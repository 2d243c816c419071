//! Bans in Redis: one hash per banned or striking key, struck and read atomically by `ban.lua` on the Redis clock.
//!
//! The layout of the hash and why it cannot meet a counter key are in
//! [`crate::store::ban`]; every call is bounded like the counters' (`Redis::call`).

use super::topology::{RedisConnection, NodeHealth};
use super::Redis;
use crate::limiter::ban::BanRule;
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::store::ban::{ActiveBan, Banned};
use crate::store::StoreError;

/// The Redis key of a store key's ban hash.
pub fn redis_key(store_key: &str) -> String {
    format!("!ban:{store_key}")
}

/// Nanoseconds as whole Redis milliseconds, never 0.
pub fn millis(ns: Nanos) -> u64 {
    ns.div_ceil(1_000_000).max(1)
}

/// `ban.lua`'s reply of Redis `TIME` as Unix ns.
pub fn redis_now(sec: i64, usec: i64) -> Nanos {
    sec.max(0) as u64 * NANOS_PER_SEC + usec.max(0) as u64 * 1_000
}

const SCRIPT: &str = include_str!("ban.lua");

fn script() -> &'static ::redis::Script {
    static SCRIPT_ONCE: std::sync::OnceLock<::redis::Script> = std::sync::OnceLock::new();
    SCRIPT_ONCE.get_or_init(|| ::redis::Script::new(SCRIPT))
}

/// Bans in Redis (see the module docs); every call is bounded like the counters'.
impl Redis {
    /// The ban on each store key, if any, on Redis' clock: one script call
    /// per slot (one in all on one node).
    pub async fn banned(&self, keys: &[&str]) -> Result<Vec<Option<Banned>>, StoreError> {
        let redis_keys: Vec<String> = keys.iter().map(|k| self.ban_key(k)).collect();
        let groups = super::spread::slot_groups(&redis_keys);
        let reads = groups
            .iter()
            .map(|group| self.banned_in_slot(&redis_keys, group));
        let mut out = vec![None; keys.len()];
        for (group, found) in groups
            .iter()
            .zip(futures_util::future::join_all(reads).await)
        {
            for (&i, ban) in group.iter().zip(found?) {
                out[i] = ban;
            }
        }
        Ok(out)
    }

    async fn banned_in_slot(
        &self,
        redis_keys: &[String],
        positions: &[usize],
    ) -> Result<Vec<Option<Banned>>, StoreError> {
        let mut call = script().prepare_invoke();
        call.arg("peek");
        for &i in positions {
            call.key(&redis_keys[i]);
        }
        let call = &call;
        let reply: Vec<i64> = self
            .call_at(&redis_keys[positions[0]], |mut con| async move {
                call.invoke_async(&mut con).await
            })
            .await?;
        if reply.len() != 2 + positions.len() {
            return Err(super::bad_reply(reply.len()));
        }
        let now = redis_now(reply[0], reply[1]);
        Ok(reply[2..]
            .iter()
            .map(|&ms| {
                (ms > 0).then(|| {
                    let remaining = ms as u64 * 1_000_000;
                    Banned {
                        until: now + remaining,
                        remaining,
                    }
                })
            })
            .collect())
    }

    /// Every ban in force in Redis: a `SCAN` for the ban hashes of this
    /// prefix (on every primary of a cluster), then their time left read on
    /// Redis' clock (a hash that holds only strikes is not a ban).
    pub async fn list_bans(&self) -> Result<Vec<ActiveBan>, StoreError> {
        let (pattern, strip) = self.ban_pattern();
        let mut keys: Vec<String> = Vec::new();
        for node in self.scan_targets().await? {
            for found in self.scan(&pattern, node.as_deref()).await? {
                keys.extend(strip(&found));
            }
        }
        // SCAN may return a key twice.
        keys.sort_unstable();
        keys.dedup();
        let mut out = Vec::new();
        for chunk in keys.chunks(256) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let found = self.banned(&refs).await?;
            out.extend(chunk.iter().zip(found).filter_map(|(key, ban)| {
                Some(ActiveBan {
                    key: key.clone(),
                    ban: ban?,
                })
            }));
        }
        Ok(out)
    }

    /// Counts one rejection of `store_key`; returns the ban when this strike starts one.
    pub async fn strike(
        &self,
        store_key: &str,
        rule: &BanRule,
        window: Nanos,
    ) -> Result<Option<Banned>, StoreError> {
        let mut call = script().prepare_invoke();
        let key = self.ban_key(store_key);
        call.arg("strike")
            .key(&key)
            .arg(rule.after)
            .arg(millis(window))
            .arg(millis(rule.duration));
        let call = &call;
        let reply: Vec<i64> = self
            .call_at(
                &key,
                |mut con| async move { call.invoke_async(&mut con).await },
            )
            .await?;
        let [sec, usec, started, ms] = reply[..] else {
            return Err(super::bad_reply(reply.len()));
        };
        let now = redis_now(sec, usec);
        Ok((started == 1).then(|| {
            let remaining = ms.max(0) as u64 * 1_000_000;
            Banned {
                until: now + remaining,
                remaining,
            }
        }))
    }
}

/// A primary to `SCAN`: `host:port` on a cluster, `None` for the one node.
type ScanTarget = Option<String>;

/// How a ban hash's Redis key gives back its store key.
type Strip = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Where ban hashes are listed from (private to this file).
impl Redis {
    /// The `MATCH` pattern of this prefix's ban hashes, and how a found
    /// Redis key gives back its store key.
    fn ban_pattern(&self) -> (String, Strip) {
        if self.inner.spread {
            let prefix = self.inner.prefix.clone();
            let pattern = format!("{}{{*}}!ban:*", glob_escape(&prefix));
            // The tag holds no `}` (see `key::slot_tag`): the first one ends it.
            let strip = move |k: &str| {
                let rest = k.strip_prefix(prefix.as_str())?.strip_prefix('{')?;
                Some(rest.split_once("}!ban:")?.1.to_string())
            };
            (pattern, Box::new(strip))
        } else {
            let prefix = self.ban_key("");
            let pattern = format!("{}*", glob_escape(&prefix));
            let strip = move |k: &str| k.strip_prefix(prefix.as_str()).map(str::to_string);
            (pattern, Box::new(strip))
        }
    }

    /// Every primary of a cluster (as one of its nodes lists them now), or the one node.
    async fn scan_targets(&self) -> Result<Vec<ScanTarget>, StoreError> {
        if !self.inner.spread {
            return Ok(vec![None]);
        }
        let known = self.known_nodes();
        let (known, link, timeout) = (&known, &self.inner.link, self.inner.timeout);
        if known.is_empty() {
            // A fresh store: its cluster connection may still be connecting
            // (to every seed, up to a second each), well past `store.timeout`.
            let nodes = link.seed_nodes(timeout).await.map_err(super::failed)?;
            return Ok(holders(&nodes));
        }
        let nodes = self
            .call(|con| async move {
                match con {
                    RedisConnection::Cluster(mut c) => link.cluster_nodes(&mut c, known, timeout).await,
                    RedisConnection::Node(_) => Ok(Vec::new()),
                }
            })
            .await?;
        Ok(holders(&nodes))
    }

    /// The keys matching `pattern`, `SCAN` page by page: on the one node, or
    /// on one cluster primary (`host:port`) over a connection of its own
    /// (`Link::dial` says why not through the cluster connection).
    async fn scan(&self, pattern: &str, node: Option<&str>) -> Result<Vec<String>, StoreError> {
        // A primary's failures feed its own breaker, not the whole store's.
        let owner = node.and_then(|addr| self.inner.owners.at(addr));
        let (link, timeout) = (&self.inner.link, self.inner.timeout);
        let direct = match node {
            Some(addr) => Some(
                self.call_via(owner.clone(), |_| link.dial(addr, timeout))
                    .await?,
            ),
            None => None,
        };
        let direct = &direct;
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = ::redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let cmd = &cmd;
            let (next, found): (u64, Vec<String>) = self
                .call_via(owner.clone(), |mut con| async move {
                    match direct.clone() {
                        Some(mut node) => cmd.query_async(&mut node).await,
                        None => cmd.query_async(&mut con).await,
                    }
                })
                .await?;
            keys.extend(found);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }
}

/// The primaries a ban can live on: healthy, and serving slots or taking
/// some over (a key lives in its slot). A primary with neither holds no key
/// of its own. In a fresh cluster a node that has not yet heard that another
/// was made a replica lists it as such a primary: asked, that replica would
/// answer with copies of its primary's bans (and, through the cluster
/// connection, which held no connection to it, it cost the whole
/// `store.timeout`: seen once in 40 loaded test runs).
fn holders(nodes: &[NodeHealth]) -> Vec<ScanTarget> {
    nodes
        .iter()
        .filter(|n| n.role == "primary" && n.healthy && (!n.slots.is_empty() || n.importing))
        .map(|n| Some(n.addr.clone()))
        .collect()
}

/// A Redis `MATCH` pattern that matches `text` literally.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::topology::parse_cluster_nodes;
    use super::*;

    #[test]
    fn the_ban_list_asks_only_the_primaries_that_serve_or_import_slots() {
        // A fresh cluster's node as it answered in a loaded test run: two of
        // its nodes, replicas by then, are still primaries without slots here.
        let fresh = parse_cluster_nodes(
            "\
dc1f 127.0.0.1:16086@16087 myself,master - 0 1796275243000 1 connected 0-5460
53e5 127.0.0.1:16092@16093 master - 0 1796275243603 3 connected 10923-16383
6cc7 127.0.0.1:16100@16101 master - 0 1796275243603 5 connected
25aa 127.0.0.1:16104@16105 master - 1796275244010 1796275243502 6 connected
61c4 127.0.0.1:16096@16097 slave dc1f 0 1796275244010 1 connected
e7e0 127.0.0.1:16088@16089 master - 0 1796275243603 2 connected 5461-10922
",
        );
        let ports = |targets: Vec<ScanTarget>| -> Vec<u16> {
            let port = |a: String| a.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
            targets.into_iter().flatten().filter_map(port).collect()
        };
        assert_eq!(ports(holders(&fresh)), vec![16086, 16088, 16092]);
        // A primary that only imports a slot already holds some of its keys;
        // a failing one is not asked.
        let moving = parse_cluster_nodes(
            "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-16383 [42->-d4]
d4 127.0.0.1:7004@17004 master - 0 0 4 connected [42-<-a1]
b2 127.0.0.1:7002@17002 master,fail - 0 0 2 disconnected 5000
",
        );
        assert_eq!(ports(holders(&moving)), vec![7001, 7004]);
    }

    #[test]
    fn a_match_pattern_takes_the_prefix_literally() {
        assert_eq!(glob_escape("a*{b}[c]?\\"), "a\\*{b}\\[c\\]\\?\\\\");
    }
}
