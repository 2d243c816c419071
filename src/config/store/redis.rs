//! `backend: redis`: its keys (`url`, `sentinel` or `cluster`: exactly one of the three; `prefix`, `timeout`), their validation, and how `/config` shows them, passwords redacted.

use std::time::Duration;

use serde::de::MapAccess;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Section, Shown, Validate};
use crate::config::raw::{Dur, Text};
use crate::config::validate::{dur, Validator};

const DEFAULT_URL: &str = "redis://127.0.0.1:6379/0";

/// `store:` keys of `backend: redis`, as written.
#[derive(Debug, Clone, Default)]
pub struct RawRedis {
    pub url: Option<Text>,
    /// Seed nodes of a Redis Cluster (instead of `url`).
    pub cluster: Option<Vec<Text>>,
    /// A primary found through Sentinel (instead of `url`).
    pub sentinel: Option<RawSentinel>,
    pub prefix: Option<Text>,
    pub timeout: Option<Dur>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSentinel {
    /// The name the sentinels monitor the primary under.
    pub master: Option<Text>,
    #[serde(default)]
    pub nodes: Vec<Text>,
}

/// The Redis store: where it lives, the prefix of its keys, and how long a request waits for it.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    pub topology: RedisTopology,
    pub prefix: String,
    pub timeout: Duration,
}

/// Where the Redis store's data lives: `store.url`, `store.sentinel` or `store.cluster` (exactly one).
#[derive(Debug, Clone, PartialEq)]
pub enum RedisTopology {
    /// One node (`store.url`).
    Node(String),
    /// A primary found through Sentinel (`store.sentinel`): the master's
    /// name and the sentinels' URLs; the primary is reached with the
    /// scheme, credentials and database of the sentinel URL that named it.
    Sentinel { master: String, nodes: Vec<String> },
    /// A Redis Cluster (`store.cluster`): seed nodes, any of them will do.
    Cluster(Vec<String>),
}

impl RedisTopology {
    /// The config spelling: `node`, `sentinel` or `cluster` (also a metric label).
    pub fn label(&self) -> &'static str {
        match self {
            RedisTopology::Node(_) => "node",
            RedisTopology::Sentinel { .. } => "sentinel",
            RedisTopology::Cluster(_) => "cluster",
        }
    }
}

impl Section for RawRedis {
    const NAME: &'static str = "redis";
    const KEYS: &'static [&'static str] = &["url", "cluster", "sentinel", "prefix", "timeout"];
    const SHARED: bool = true;
    type Config = RedisConfig;

    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "url" => self.url = Some(map.next_value()?),
            "cluster" => self.cluster = Some(map.next_value()?),
            "sentinel" => self.sentinel = Some(map.next_value()?),
            "prefix" => self.prefix = Some(map.next_value()?),
            _ => self.timeout = Some(map.next_value()?),
        }
        Ok(())
    }

    fn given(&self) -> Vec<bool> {
        vec![
            self.url.is_some(),
            self.cluster.is_some(),
            self.sentinel.is_some(),
            self.prefix.is_some(),
            self.timeout.is_some(),
        ]
    }

    fn view(config: Option<&RedisConfig>, shown: &Shown) -> Vec<(&'static str, Value)> {
        let redacted = |url: &String| redact(url, shown.redacted);
        let all = |urls: &[String]| urls.iter().map(redacted).collect::<Vec<_>>();
        let (url, cluster, master, nodes) = match config.map(|c| &c.topology) {
            Some(RedisTopology::Node(url)) => (Some(redacted(url)), None, None, None),
            Some(RedisTopology::Cluster(seeds)) => (None, Some(all(seeds)), None, None),
            Some(RedisTopology::Sentinel { master, nodes }) => {
                (None, None, Some(master.clone()), Some(all(nodes)))
            }
            None => (None, None, None, None),
        };
        vec![
            ("url", url.into()),
            ("cluster", cluster.into()),
            ("sentinel", json!({"master": master, "nodes": nodes})),
            ("prefix", config.map(|c| c.prefix.clone()).into()),
            ("timeout", config.map(|c| (shown.spell)(c.timeout)).into()),
        ]
    }
}

impl Validate for RawRedis {
    fn validate(&self, v: &mut Validator) -> RedisConfig {
        RedisConfig {
            topology: v.redis_topology(self),
            prefix: self
                .prefix
                .as_ref()
                .map_or_else(|| "tollgate:".into(), |t| t.0.clone()),
            timeout: dur(self.timeout, Duration::from_millis(50)),
        }
    }
}

/// A Redis URL without its password (the host stays, to tell stores apart).
fn redact(url: &str, redacted: &str) -> String {
    match url.split_once('@') {
        Some((scheme_and_auth, host)) => {
            let scheme = scheme_and_auth.split("://").next().unwrap_or("redis");
            format!("{scheme}://{redacted}@{host}")
        }
        None => url.to_string(),
    }
}

impl Validator<'_> {
    /// One topology; a second one named beside it is an error, since the
    /// operator cannot mean both and either silent choice would surprise.
    fn redis_topology(&mut self, raw: &RawRedis) -> RedisTopology {
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
