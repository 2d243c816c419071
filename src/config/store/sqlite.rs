//! `backend: sqlite`: its keys (`path`, `flush_interval`), their defaults, and how `/config` shows them.

use std::path::PathBuf;
use std::time::Duration;

use serde::de::MapAccess;
use serde_json::Value;

use super::{Section, Shown, Validate};
use crate::config::raw::{Dur, Text};
use crate::config::validate::{dur, Validator};

/// `store:` keys of `backend: sqlite`, as written.
#[derive(Debug, Clone, Default)]
pub struct RawSqlite {
    pub path: Option<Text>,
    pub flush_interval: Option<Dur>,
}

/// The SQLite store: its file and how often the writer flushes to it.
#[derive(Debug, Clone, PartialEq)]
pub struct SqliteConfig {
    pub path: PathBuf,
    /// How often the writer thread persists counters; a `kill -9` loses at most this much.
    pub flush_interval: Duration,
}

impl Section for RawSqlite {
    const NAME: &'static str = "sqlite";
    const KEYS: &'static [&'static str] = &["path", "flush_interval"];
    const SHARED: bool = false;
    type Config = SqliteConfig;

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

    /// The file is opened at start; a new `flush_interval` applies at the
    /// next start, without refusing the reload.
    fn needs_restart(was: &SqliteConfig, now: &SqliteConfig) -> bool {
        was.path != now.path
    }

    fn view(config: Option<&SqliteConfig>, shown: &Shown) -> Vec<(&'static str, Value)> {
        vec![
            ("path", config.map(|c| c.path.display().to_string()).into()),
            ("flush_interval", config.map(|c| (shown.spell)(c.flush_interval)).into()),
        ]
    }
}

impl Validate for RawSqlite {
    fn validate(&self, v: &mut Validator) -> SqliteConfig {
        let flush_interval = dur(self.flush_interval, Duration::from_millis(100));
        if flush_interval.is_zero() {
            v.err("store.flush_interval", "must be greater than zero");
        }
        SqliteConfig {
            path: PathBuf::from(self.path.as_ref().map_or("tollgate.db", |t| t.0.as_str())),
            flush_interval,
        }
    }
}
