//! `store.url`, `store.sentinel`, `store.cluster`: where the Redis store lives, exactly one of the three.

use super::super::raw::{RawRedis, RawSentinel, Text};
use super::super::RedisTopology;
use super::Validator;

const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

impl Validator<'_> {
    /// One topology; a second one named beside it is an error, since the
    /// operator cannot mean both and either silent choice would surprise.
    pub(super) fn redis_topology(&mut self, raw: &RawRedis) -> RedisTopology {
        let named: Vec<&str> = [
            ("url", raw.url.is_some()),
            ("sentinel", raw.sentinel.is_some()),
            ("cluster", raw.cluster.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, given)| given.then_some(k))
        .collect();
        if named.len() > 1 {
            self.err(
                format!("store.{}", named[1]),
                format!(
                    "`{}` and `{}` contradict: a Redis store is one node (`url`), a primary \
                     found through Sentinel (`sentinel`) or a Redis Cluster (`cluster`)",
                    named[0], named[1]
                ),
            );
        }
        if let Some(seeds) = &raw.cluster {
            return RedisTopology::Cluster(self.cluster_seeds(seeds));
        }
        if let Some(sentinel) = &raw.sentinel {
            return self.sentinel(sentinel);
        }
        let url = raw
            .url
            .as_ref()
            .map_or_else(|| DEFAULT_URL.to_string(), |t| t.0.clone());
        self.redis_url("store.url", &url);
        RedisTopology::Node(url)
    }

    fn cluster_seeds(&mut self, seeds: &[Text]) -> Vec<String> {
        if seeds.is_empty() {
            self.err(
                "store.cluster",
                "an empty list names no node: give at least one seed URL of the cluster",
            );
        }
        let mut schemes = Vec::new();
        for (i, seed) in seeds.iter().enumerate() {
            let path = format!("store.cluster[{i}]");
            self.redis_url(&path, &seed.0);
            let (scheme, rest) = seed.0.split_once("://").unwrap_or(("", ""));
            schemes.push(scheme);
            let db = rest.split_once('/').map_or("", |(_, db)| db);
            if !(db.is_empty() || db == "0") {
                self.err(
                    path,
                    format!("database {db:?}: a Redis Cluster has only database 0"),
                );
            }
        }
        if schemes.windows(2).any(|w| w[0] != w[1]) {
            self.err(
                "store.cluster",
                "mixes redis:// and rediss://: one cluster speaks TLS on every node or on none",
            );
        }
        seeds.iter().map(|t| t.0.clone()).collect()
    }

    fn sentinel(&mut self, raw: &RawSentinel) -> RedisTopology {
        let master = raw.master.as_ref().map_or("", |t| t.0.as_str());
        if master.is_empty() {
            self.err(
                "store.sentinel.master",
                "needs the name the sentinels monitor the primary under (`sentinel monitor <name> …`)",
            );
        }
        if raw.nodes.is_empty() {
            self.err(
                "store.sentinel.nodes",
                "needs at least one sentinel URL, e.g. redis://10.0.0.7:26379",
            );
        }
        for (i, node) in raw.nodes.iter().enumerate() {
            self.redis_url(&format!("store.sentinel.nodes[{i}]"), &node.0);
        }
        RedisTopology::Sentinel {
            master: master.to_string(),
            nodes: raw.nodes.iter().map(|t| t.0.clone()).collect(),
        }
    }

    fn redis_url(&mut self, path: &str, url: &str) {
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            self.err(path, format!("{url:?} is not a redis:// or rediss:// URL"));
        }
    }
}
