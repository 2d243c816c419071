//! `store:` as written: the keys every store has, and one variant per backend holding only that backend's keys.
//!
//! `backend:` may be written after the keys it decides about, so every
//! backend's keys are read where they stand (a wrong value is reported at
//! its own line) and sorted out once the mapping is read: the chosen
//! backend keeps its own, and a key of another backend is kept by name in
//! [`RawStore::foreign`] for validation to refuse with the backend it
//! belongs to.

use std::fmt;

use serde::de::{Error, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::{Dur, Text};

#[derive(Debug, Clone, Default)]
pub struct RawStore {
    pub backend: RawBackend,
    pub on_error: Option<Text>,
    pub prune_interval: Option<Dur>,
    pub max_keys: Option<u64>,
    /// Keys written that belong to another backend than this store's:
    /// `(key, the backend it belongs to)`, in the order written.
    pub foreign: Vec<(&'static str, &'static str)>,
}

/// The backend and the keys only it takes.
#[derive(Debug, Clone)]
pub enum RawBackend {
    Sqlite(RawSqlite),
    Memory,
    Redis(RawRedis),
    /// A `backend:` no store has, as written; validation names the choices.
    Unknown(Text),
}

impl Default for RawBackend {
    fn default() -> Self {
        RawBackend::Sqlite(RawSqlite::default())
    }
}

#[derive(Debug, Clone, Default)]
pub struct RawSqlite {
    pub path: Option<Text>,
    pub flush_interval: Option<Dur>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSentinel {
    /// The name the sentinels monitor the primary under.
    pub master: Option<Text>,
    #[serde(default)]
    pub nodes: Vec<Text>,
}

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

/// One backend's own keys: which they are, and reading one of them.
trait OwnKeys: Default {
    /// The `backend:` spelling.
    const NAME: &'static str;
    const KEYS: &'static [&'static str];
    /// Reads the value of `key`, one of [`OwnKeys::KEYS`].
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;
    /// For each of [`OwnKeys::KEYS`], in order: was it written?
    fn given(&self) -> Vec<bool>;
    /// The keys that were written, in [`OwnKeys::KEYS`] order.
    fn written(&self) -> Vec<&'static str> {
        Self::KEYS
            .iter()
            .zip(self.given())
            .filter(|(_, given)| *given)
            .map(|(k, _)| *k)
            .collect()
    }
}

impl OwnKeys for RawSqlite {
    const NAME: &'static str = "sqlite";
    const KEYS: &'static [&'static str] = &["path", "flush_interval"];
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "path" => self.path = Some(map.next_value()?),
            _ => self.flush_interval = Some(map.next_value()?),
        }
        Ok(())
    }
    fn given(&self) -> Vec<bool> {
        vec![self.path.is_some(), self.flush_interval.is_some()]
    }
}

impl OwnKeys for RawRedis {
    const NAME: &'static str = "redis";
    const KEYS: &'static [&'static str] = &["url", "cluster", "sentinel", "prefix", "timeout"];
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
}

/// Every key `store:` takes, in the order a message lists them.
const ALL_KEYS: &[&str] = &[
    "backend",
    "path",
    "url",
    "cluster",
    "sentinel",
    "prefix",
    "timeout",
    "on_error",
    "prune_interval",
    "flush_interval",
    "max_keys",
];

impl<'de> Deserialize<'de> for RawStore {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(StoreVisitor)
    }
}

struct StoreVisitor;

impl<'de> Visitor<'de> for StoreVisitor {
    type Value = RawStore;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        // The name serde's derive would give: `explain` turns it into YAML words.
        f.write_str("struct RawStore")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawStore, A::Error> {
        let mut store = RawStore::default();
        let mut backend: Option<Text> = None;
        let (mut sqlite, mut redis) = (RawSqlite::default(), RawRedis::default());
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "backend" => backend = Some(map.next_value()?),
                "on_error" => store.on_error = Some(map.next_value()?),
                "prune_interval" => store.prune_interval = Some(map.next_value()?),
                "max_keys" => store.max_keys = Some(map.next_value()?),
                k if RawSqlite::KEYS.contains(&k) => sqlite.read(k, &mut map)?,
                k if RawRedis::KEYS.contains(&k) => redis.read(k, &mut map)?,
                other => return Err(A::Error::unknown_field(other, ALL_KEYS)),
            }
        }
        let spelled = backend.as_ref().map_or(RawSqlite::NAME, |t| t.0.as_str());
        let foreign = |keys: Vec<&'static str>, owner: &'static str| {
            keys.into_iter().map(move |k| (k, owner))
        };
        store.backend = match spelled {
            RawSqlite::NAME => {
                store
                    .foreign
                    .extend(foreign(redis.written(), RawRedis::NAME));
                RawBackend::Sqlite(sqlite)
            }
            RawRedis::NAME => {
                store
                    .foreign
                    .extend(foreign(sqlite.written(), RawSqlite::NAME));
                RawBackend::Redis(redis)
            }
            "memory" => {
                store
                    .foreign
                    .extend(foreign(sqlite.written(), RawSqlite::NAME));
                store
                    .foreign
                    .extend(foreign(redis.written(), RawRedis::NAME));
                RawBackend::Memory
            }
            // An unknown backend: its own error says so, and no key is foreign to it.
            _ => RawBackend::Unknown(backend.unwrap_or(Text(String::new()))),
        };
        Ok(store)
    }
}
