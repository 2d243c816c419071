//! `store:` — the keys every store has, and one section per backend (`store/<backend>.rs`), declared once in [`with_backends!`].
//!
//! A backend's section holds everything the config knows about it: its
//! keys as written ([`Section::read`]), their validation, its `/config`
//! view and the name messages and metrics call it by. The store's runtime
//! for the same backend lives in `src/store/<backend>`, generated from the
//! same list. Validation sits below the store (the store reads the
//! validated config), so a section lives here rather than in the store's
//! folder.
//!
//! `backend:` may be written after the keys it decides about, so every
//! backend's keys are read where they stand (a wrong value is reported at
//! its own line) and sorted out once the mapping is read: the chosen
//! backend keeps its own, and a key of another backend is kept by name in
//! [`RawStore::foreign`] for validation to refuse with the backend it
//! belongs to.

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use serde::de::{Error, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::raw::{Dur, Text};
use super::validate::{dur, Validator};
use super::{suggest, OnError};

/// The one list of store backends, `Type in module: RawSection`, in the
/// order messages name them (the first is the default). Hands it to
/// `$then!`: the config's sections here and the store's runtimes
/// (`src/store.rs`) are generated from it. A new backend is its runtime
/// (`src/store/<name>.rs`), its section (`src/config/store/<name>.rs`) and
/// one line here.
macro_rules! with_backends {
    ($then:ident! $($rest:tt)*) => {
        $then! {
            [
                Sqlite in sqlite: RawSqlite,
                Memory in memory: RawMemory,
                Redis in redis: RawRedis,
            ]
            $($rest)*
        }
    };
}
pub(crate) use with_backends;

/// How `GET /config` writes what it shows: durations as the config spells
/// them, secrets replaced by `redacted`.
pub struct Shown<'a> {
    pub spell: &'a dyn Fn(Duration) -> String,
    pub redacted: &'a str,
}

/// One backend's part of `store:`, as written (the type implementing it)
/// and validated ([`Section::Config`]).
pub trait Section: Default {
    /// The `backend:` spelling: also the `backend` label of metrics and the
    /// name messages give it.
    const NAME: &'static str;
    /// Its own keys (no other backend takes them), in the order messages list them.
    const KEYS: &'static [&'static str];
    /// Shared by a fleet over the network: a request can find it
    /// unreachable (so `store.on_error` applies), and a fleet's ACME tasks
    /// share their certificates through it.
    const SHARED: bool;

    type Config: Clone + fmt::Debug + PartialEq;

    /// Reads the value of `key`, one of [`Section::KEYS`].
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;

    /// For each of [`Section::KEYS`], in order: was it written?
    fn given(&self) -> Vec<bool>;

    /// Whether going from `was` to `now` takes a restart (a reload refuses
    /// it): by default any change does.
    fn needs_restart(was: &Self::Config, now: &Self::Config) -> bool {
        was != now
    }

    /// Its keys as `GET /config` shows them, secrets redacted, each key of
    /// [`Section::KEYS`] once; `None`: the same keys when another backend is
    /// in force (`null`, or an object of `null`s), so every config shows
    /// the same keys.
    fn view(config: Option<&Self::Config>, shown: &Shown) -> Vec<(&'static str, Value)>;

    /// The keys that were written, in [`Section::KEYS`] order.
    fn written(&self) -> Vec<&'static str> {
        Self::KEYS
            .iter()
            .zip(self.given())
            .filter(|(_, given)| *given)
            .map(|(k, _)| *k)
            .collect()
    }
}

/// A section's validation, which only the config sees.
pub(in crate::config) trait Validate: Section {
    /// The validated section, defaults filled in; each problem is reported
    /// to `v` at its `store.<key>` path.
    fn validate(&self, v: &mut Validator) -> Self::Config;
}

/// Declares each backend's section module and the enums over them.
macro_rules! declare {
    ([$($variant:ident in $module:ident: $raw:ident,)+]) => {
        $(pub mod $module;)+
        pub use self::{$($module::$raw,)+};

        /// The backend `store.backend` names, with the keys only it takes.
        #[derive(Debug, Clone)]
        pub enum RawBackend {
            $($variant($raw),)+
            /// A `backend:` no store has, as written; validation names the choices.
            Unknown(Text),
        }

        /// The backend `store.backend` names, validated with its own keys.
        #[derive(Debug, Clone, PartialEq)]
        pub enum BackendConfig {
            $($variant(<$raw as Section>::Config),)+
        }

        /// Every backend's keys as read, before `backend:` chose one.
        #[derive(Default)]
        struct BackendKeys {
            $($module: $raw,)+
        }

        impl BackendKeys {
            /// Reads `key` into the backend that takes it; false when none does.
            fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
                $(if $raw::KEYS.contains(&key) {
                    self.$module.read(key, map)?;
                    return Ok(true);
                })+
                Ok(false)
            }

            /// The backend spelled `name` with its keys, and the keys written
            /// for every other one, with the backend each belongs to.
            fn choose(self, name: &str) -> Option<(RawBackend, Vec<(&'static str, &'static str)>)> {
                let mut chosen = None;
                let mut foreign = Vec::new();
                $(if name == $raw::NAME {
                    chosen = Some(RawBackend::$variant(self.$module));
                } else {
                    foreign.extend(self.$module.written().into_iter().map(|k| (k, $raw::NAME)));
                })+
                chosen.map(|c| (c, foreign))
            }
        }

        impl Default for RawBackend {
            /// The first backend of the list.
            fn default() -> Self {
                with_backends!(first_backend!)
            }
        }

        impl RawBackend {
            fn validate(&self, v: &mut Validator) -> BackendConfig {
                match self {
                    $(RawBackend::$variant(raw) => BackendConfig::$variant(raw.validate(v)),)+
                    RawBackend::Unknown(Text(other)) => {
                        v.err(
                            "store.backend",
                            format!(
                                "unknown backend {other:?} ({}){}",
                                choices(),
                                suggest::hint(other, NAMES)
                            ),
                        );
                        // Any backend will do: the config is refused.
                        RawBackend::default().validate(v)
                    }
                }
            }
        }

        /// Every backend's `backend:` spelling, in the order of the list.
        const NAMES: [&str; 0 $(+ { stringify!($variant); 1 })+] = [$($raw::NAME,)+];

        /// Every backend's own keys, in the order of the list.
        fn backend_keys() -> impl Iterator<Item = &'static str> {
            std::iter::empty()$(.chain($raw::KEYS.iter().copied()))+
        }

        impl BackendConfig {
            /// The `backend:` spelling, also the `backend` metric label.
            pub fn label(&self) -> &'static str {
                match self {
                    $(BackendConfig::$variant(_) => $raw::NAME,)+
                }
            }

            /// See [`Section::SHARED`].
            pub fn shared(&self) -> bool {
                match self {
                    $(BackendConfig::$variant(_) => $raw::SHARED,)+
                }
            }

            /// Whether going from `was` to this takes a restart: another
            /// backend always does (see [`Section::needs_restart`]).
            pub fn needs_restart(&self, was: &BackendConfig) -> bool {
                match self {
                    $(BackendConfig::$variant(now) => {
                        if let BackendConfig::$variant(was) = was {
                            $raw::needs_restart(was, now)
                        } else {
                            true
                        }
                    })+
                }
            }

            /// Every backend's keys as `GET /config` shows them: this one's
            /// values, `null` for the keys of the others.
            fn view(&self, shown: &Shown) -> Vec<(&'static str, Value)> {
                let mut keys = Vec::new();
                $(if let BackendConfig::$variant(c) = self {
                    keys.extend($raw::view(Some(c), shown));
                } else {
                    keys.extend($raw::view(None, shown));
                })+
                keys
            }
        }
    };
}

/// The first backend of the list, with none of its keys: the default.
macro_rules! first_backend {
    ([$first:ident in $module:ident: $raw:ident, $($rest:tt)*]) => {
        RawBackend::$first($raw::default())
    };
}

with_backends!(declare!);

/// Every backend's name, as a message offers them: `a, b or c`.
fn choices() -> String {
    let (last, rest) = NAMES.split_last().expect("at least one backend");
    match rest {
        [] => last.to_string(),
        _ => format!("{} or {last}", rest.join(", ")),
    }
}

/// `store:` as written: the keys every store has, and the backend with only its own keys.
#[derive(Debug, Clone, Default)]
pub struct RawStore {
    pub backend: RawBackend,
    pub on_error: Option<Text>,
    pub prune_interval: Option<Dur>,
    pub max_keys: Option<u64>,
    /// Keys written that belong to another backend than this store's:
    /// `(key, the backend it belongs to)`, in the order of the list.
    pub foreign: Vec<(&'static str, &'static str)>,
}

/// The keys every store has, after `backend` and the backends' own.
const COMMON_KEYS: [&str; 3] = ["on_error", "prune_interval", "max_keys"];

/// Every key `store:` takes, in the order a message lists them.
fn all_keys() -> &'static [&'static str] {
    static ALL: OnceLock<Vec<&'static str>> = OnceLock::new();
    ALL.get_or_init(|| {
        std::iter::once("backend")
            .chain(backend_keys())
            .chain(COMMON_KEYS)
            .collect()
    })
}

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
        let mut written = BackendKeys::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "backend" => backend = Some(map.next_value()?),
                "on_error" => store.on_error = Some(map.next_value()?),
                "prune_interval" => store.prune_interval = Some(map.next_value()?),
                "max_keys" => store.max_keys = Some(map.next_value()?),
                other => {
                    if !written.read(other, &mut map)? {
                        return Err(A::Error::unknown_field(other, all_keys()));
                    }
                }
            }
        }
        let spelled = backend.as_ref().map_or(NAMES[0], |t| t.0.as_str());
        match written.choose(spelled) {
            Some((chosen, foreign)) => {
                store.backend = chosen;
                store.foreign = foreign;
            }
            // An unknown backend: its own error says so, and no key is foreign to it.
            None => store.backend = RawBackend::Unknown(backend.unwrap_or(Text(String::new()))),
        }
        Ok(store)
    }
}

/// `store.max_keys` when not given: 64 overflow slots + 64 shards × 14,336
/// keys, the most whose shard tables stay at 16,384 buckets each. Measured
/// (`cargo bench --bench keys_memory`): ~100 MB full, where 1,000,000 keys
/// cost ~157 MB because every shard doubles to 32,768 buckets.
pub const DEFAULT_MAX_KEYS: usize = 917_568;

/// The smallest `store.max_keys`: 64 slots for overflow keys and one key per
/// shard (the table asserts that this covers its layout).
pub const MIN_MAX_KEYS: usize = 128;

/// The validated `store:` section.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub backend: BackendConfig,
    pub on_error: OnError,
    pub prune_interval: Duration,
    /// Limiter keys this process tracks at most (overflow keys included).
    pub max_keys: usize,
}

impl StoreConfig {
    /// The `policy` label of the store's errors: `on_error` where a request
    /// can find the store unreachable, `none` where it cannot.
    pub fn error_policy(&self) -> &'static str {
        if self.backend.shared() {
            self.on_error.as_str()
        } else {
            "none"
        }
    }

    /// `store:` as `GET /config` shows it.
    pub fn view(&self, shown: &Shown) -> Value {
        let StoreConfig {
            backend,
            on_error,
            prune_interval,
            max_keys,
        } = self;
        let mut out = serde_json::Map::new();
        out.insert("backend".into(), backend.label().into());
        out.extend(
            backend
                .view(shown)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v)),
        );
        out.insert("on_error".into(), on_error.as_str().into());
        out.insert(
            "prune_interval".into(),
            (shown.spell)(*prune_interval).into(),
        );
        out.insert("max_keys".into(), (*max_keys).into());
        Value::Object(out)
    }
}

impl Validator<'_> {
    /// `store:`, with its backend's section validated by the backend.
    pub(in crate::config) fn store(&mut self, raw: &RawStore) -> StoreConfig {
        let backend = raw.backend.validate(self);
        self.foreign_store_keys(raw, &backend);
        let on_error = match raw
            .on_error
            .as_ref()
            .map(|t| t.0.as_str())
            .unwrap_or("allow")
        {
            "allow" => OnError::Allow,
            "deny" => OnError::Deny,
            "local" => OnError::Local,
            other => {
                self.err(
                    "store.on_error",
                    format!(
                        "unknown policy {other:?} (allow, deny or local){}",
                        suggest::hint(other, ["allow", "deny", "local"])
                    ),
                );
                OnError::Allow
            }
        };
        let prune_interval = dur(raw.prune_interval, Duration::from_secs(60));
        if prune_interval.is_zero() {
            self.err("store.prune_interval", "must be greater than zero");
        }
        let max_keys = self.max_keys(raw.max_keys);
        StoreConfig {
            backend,
            on_error,
            prune_interval,
            max_keys,
        }
    }

    /// A key of another backend is an error, not silently ignored: the
    /// operator meant some other store, or left a key behind when switching.
    fn foreign_store_keys(&mut self, raw: &RawStore, backend: &BackendConfig) {
        let spelled = backend.label();
        for &(key, owner) in &raw.foreign {
            self.err(
                format!("store.{key}"),
                format!(
                    "`{key}` belongs to `backend: {owner}`, and this store is \
                     `backend: {spelled}`: remove it, or set `backend: {owner}`"
                ),
            );
        }
    }

    fn max_keys(&mut self, raw: Option<u64>) -> usize {
        let n = raw.map_or(DEFAULT_MAX_KEYS, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        });
        if n < MIN_MAX_KEYS {
            self.err(
                "store.max_keys",
                format!("{n} is too small: at least {MIN_MAX_KEYS}"),
            );
        }
        n.max(MIN_MAX_KEYS)
    }
}
