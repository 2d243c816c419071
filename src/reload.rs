//! Config reload: file watch / SIGHUP / admin → parse → validate → swap, or keep the old.
//!
//! A new config is validated completely and its snapshot built before the
//! swap; any error leaves the running snapshot untouched, is logged, counted
//! and kept for `GET /config`. Requests in flight finish on the snapshot they
//! loaded. Counters live in the store, keyed by limiter name, so a limiter
//! that keeps its name keeps its counts, and one a reload removes keeps them
//! for a grace period (see [`crate::prune`]): an edit and its revert reset
//! nobody's counters.
//!
//! A reload cannot hang: reading and checking the files has an overall
//! deadline ([`RELOAD_DEADLINE`]), past which it is rejected (a reader
//! stuck on a stalled disk is left behind; the next reload does not wait
//! for it). Nor can it silently open the gate: a reload that takes every
//! limiter off a route that had some is rejected unless that route says
//! `allow_unlimited: true`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::config::{self, Config, ConfigError};
use crate::server::ListenerSet;
use crate::snapshot::Snapshot;
use crate::tls::Terminator;

mod report;
pub use report::{report, Report};

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0} cannot change while running; restart tollgate to apply it")]
    RequiresRestart(&'static str),
    #[error("the config was not read from a file, so there is nothing to reload")]
    NoFile,
    #[error("{0}")]
    Bind(std::io::Error),
    #[error("reading the config failed: {0}")]
    Read(#[from] tokio::task::JoinError),
    #[error("reading and checking the config took longer than {0:?} (a file on a stalled disk?); the running config stays")]
    Timeout(Duration),
    #[error("{}", .0.join("; "))]
    Unlimited(Vec<String>),
    /// A strict reload (`POST /reload?strict=true`) of a config with warnings.
    #[error("strict reload: the config has {} warning(s), so it was not applied: {}", .0.len(), .0.join("; "))]
    Warnings(Vec<String>),
}

/// The longest a reload may spend reading and checking the config and the files it names.
pub const RELOAD_DEADLINE: Duration = Duration::from_secs(10);

impl ReloadError {
    /// One line per problem, for the admin API.
    pub fn messages(&self) -> Vec<String> {
        match self {
            ReloadError::Config(e) => e
                .problems
                .iter()
                .map(|p| match &e.file {
                    Some(f) => format!("{}: {p}", f.display()),
                    None => p.to_string(),
                })
                .collect(),
            ReloadError::Unlimited(routes) => routes.clone(),
            ReloadError::Warnings(warnings) => warnings
                .iter()
                .map(|w| format!("warning (strict: not applied): {w}"))
                .collect(),
            ReloadError::RequiresRestart(_)
            | ReloadError::NoFile
            | ReloadError::Bind(_)
            | ReloadError::Read(_)
            | ReloadError::Timeout(_) => vec![self.to_string()],
        }
    }
}

/// Reloads, for the SIGHUP task, the file watch and the admin API: it holds
/// the listeners `run` started, so a reload that adds or removes an address
/// binds or drains them.
pub struct Reloader {
    app: App,
    /// TLS termination, shared with the listeners: a reload swaps its certificates.
    tls: Arc<Terminator>,
    /// The listeners in service while `run` runs (`None` before and after).
    listeners: Mutex<Option<ListenerSet>>,
    /// One reload at a time, from reading the file to the swap: versions stay
    /// sequential, and an older read never lands after a newer one.
    turn: tokio::sync::Mutex<()>,
    /// Asks the prune task to drop the state of limiters a reload removed at
    /// once, instead of at its next round.
    prune_now: crate::prune::Trigger,
}

impl Reloader {
    pub fn new(app: App, tls: Arc<Terminator>, prune_now: crate::prune::Trigger) -> Reloader {
        Reloader {
            app,
            tls,
            listeners: Mutex::new(None),
            turn: tokio::sync::Mutex::new(()),
            prune_now,
        }
    }

    /// Hands over the listeners in service; reloads rebind through them from now on.
    pub fn attach(&self, listeners: ListenerSet) {
        *self.listeners.lock() = Some(listeners);
    }

    /// Takes the listeners back (at shutdown); later reloads cannot rebind.
    pub fn detach(&self) -> Option<ListenerSet> {
        self.listeners.lock().take()
    }

    pub fn app(&self) -> &App {
        &self.app
    }

    /// The ACME names, their certificates and status.
    pub fn certificates(&self) -> &Arc<crate::acme::state::Managed> {
        self.tls.managed()
    }

    /// Reads the config file again and applies it; returns the new version.
    pub async fn reload(&self) -> Result<u64, ReloadError> {
        self.reload_with(false).await
    }

    /// As [`Reloader::reload`]; `strict` treats warnings as errors (as
    /// `tollgate check --strict`): a config with any is not applied.
    pub async fn reload_with(&self, strict: bool) -> Result<u64, ReloadError> {
        let _turn = self.turn.lock().await;
        let app = &self.app;
        let result = match &app.shared.config_path {
            None => Err(ReloadError::NoFile),
            Some(path) => read(path.clone()).await.and_then(|(c, text)| {
                if strict && !c.warnings.is_empty() {
                    let warnings = c.warnings.iter().map(ToString::to_string).collect();
                    return Err(ReloadError::Warnings(warnings));
                }
                let version = self.apply(c)?;
                *app.shared.config_text.lock() = Some(text);
                Ok(version)
            }),
        };
        match &result {
            Ok(version) => {
                *app.shared.last_reload_error.lock() = None;
                tracing::info!(version, "config reloaded");
            }
            Err(e) => {
                *app.shared.last_reload_error.lock() = Some(e.to_string());
                // One record, one line: the problems are joined, not listed line by line.
                let problems = e.to_string().replace("\n  ", " | ");
                tracing::error!(error = %problems, "config reload rejected, the running config stays");
            }
        }
        count_reload(app, result.is_ok());
        app.shared
            .activity
            .reloaded(app.shared.clock.now(), result.is_ok());
        result
    }

    /// Swaps in a validated config (with its TLS certificates), unless it changes what only a restart can.
    pub fn apply(&self, config: Config) -> Result<u64, ReloadError> {
        let app = &self.app;
        // Held to the end: the snapshot and the listeners change together.
        let mut listeners = self.listeners.lock();
        let old = app.snapshot();
        let was = &old.config;
        if let Some(key) = needs_restart(was, &config) {
            return Err(ReloadError::RequiresRestart(key));
        }
        let unlimited = routes_losing_every_limiter(was, &config);
        if !unlimited.is_empty() {
            return Err(ReloadError::Unlimited(unlimited));
        }
        // Every public address, plain or TLS: what each serves is read from the
        // snapshot per connection, so only added or removed addresses rebind.
        let listen: Vec<SocketAddr> = config.server.public().into_iter().map(|(a, _)| a).collect();
        let was_listen: Vec<SocketAddr> = was.server.public().into_iter().map(|(a, _)| a).collect();
        // Bind new sockets before anything changes: a port in use rejects the reload.
        let pending = match listeners.as_ref() {
            Some(set) => Some(
                set.prepare(&listen, config.admin.listen)
                    .map_err(ReloadError::Bind)?,
            ),
            None if listen != was_listen || config.admin.listen != was.admin.listen => {
                return Err(ReloadError::RequiresRestart(
                    "server.listen / server.tls.listen / admin.listen",
                ));
            }
            None => None,
        };
        // The certificates were read and checked with the config; from here on nothing can fail.
        let certs = config.server.tls.as_ref().map(|t| t.loaded.clone());
        crate::proxy::warn_insecure_upstreams(&config.upstreams);
        config.log_warnings();
        let version = old.version + 1;
        let snapshot = Snapshot::build(config, version, Some(&old), &app.shared.metrics);
        // Certificates first: a connection accepted as TLS under the new snapshot
        // finds the new pairs. Open connections keep the session they have.
        if self.tls.install(certs.clone()) {
            match &certs {
                Some(c) => {
                    tracing::info!(certificates = ?c, "TLS certificates rotated; new handshakes use them")
                }
                None => tracing::info!("TLS turned off"),
            }
        }
        app.shared.snapshot.store(Arc::new(snapshot));
        if let (Some(set), Some(pending)) = (listeners.as_mut(), pending) {
            set.commit(pending, &listen);
        }
        drop(listeners);
        let new = app.snapshot();
        app.shared.store.configure(&new.config.limiters);
        let removed: Vec<_> = was
            .limiters
            .iter()
            .filter(|l| !new.config.limiters.iter().any(|n| n.name == l.name))
            .cloned()
            .collect();
        if !removed.is_empty() {
            self.prune_now.retire(removed, app.shared.clock.now());
        }
        Ok(version)
    }
}

/// The first setting that differs and only a restart can change, by its name.
fn needs_restart(was: &Config, config: &Config) -> Option<&'static str> {
    if config.server.workers != was.server.workers {
        return Some("server.workers");
    }
    // The table's shards are sized at start; a live change could only shrink
    // by forgetting counting clients, which the bound promises never to do.
    if config.store.max_keys != was.store.max_keys {
        return Some("store.max_keys");
    }
    // The log subscriber is installed once, before anything logs; a live
    // change would mix both formats on stdout (the access log would follow
    // the new one, every other record the old one).
    if config.log.format != was.log.format {
        return Some("log.format");
    }
    // The file is checked and opened at start; SIGUSR1 reopens the same name.
    if config.log.access_file != was.log.access_file {
        return Some("log.access_file");
    }
    if config.store.backend.needs_restart(&was.store.backend) {
        return Some("store.backend / store.path / store.url / store.cluster / store.sentinel");
    }
    None
}

/// Every route of `new` that had limiters in `was` (by name) and has none
/// now, unless it says `allow_unlimited: true`: one message each.
fn routes_losing_every_limiter(was: &Config, new: &Config) -> Vec<String> {
    new.routes
        .iter()
        .filter(|r| r.limiters.is_empty() && !r.allow_unlimited)
        .filter_map(|r| {
            let before = was.routes.iter().find(|o| o.name == r.name)?;
            let names: Vec<&str> = before
                .limiters
                .iter()
                .map(|&i| was.limiters[i].name.as_str())
                .collect();
            (!names.is_empty()).then(|| {
                format!(
                    "routes.{}: this reload would take every limiter off the route ({}); \
                     set `allow_unlimited: true` on it to mean that",
                    r.name,
                    names.join(", ")
                )
            })
        })
        .collect()
}

/// Reads and validates the config file (and the certificate and key files
/// it names) on a blocking thread, never on the runtime that accepts
/// connections, within [`RELOAD_DEADLINE`].
async fn read(path: PathBuf) -> Result<(Config, String), ReloadError> {
    let load = move || -> Result<(Config, String), ReloadError> {
        let (loaded, text) = config::load_file_text(&path)?;
        Ok((config::require_routes(loaded, &path)?, text))
    };
    within(RELOAD_DEADLINE, load).await?
}

/// Runs blocking `work` on a blocking thread and waits at most `deadline`
/// for it. Past the deadline the thread is left to finish on its own (a
/// blocking thread cannot be cancelled); the caller moves on.
async fn within<T: Send + 'static>(
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ReloadError> {
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(work)).await {
        Ok(joined) => Ok(joined?),
        Err(_) => Err(ReloadError::Timeout(deadline)),
    }
}

/// Reload outcomes are counted here, so the admin call, the watch and SIGHUP agree.
pub fn count_reload(app: &App, ok: bool) {
    app.shared
        .metrics
        .counter(
            "tollgate_config_reloads_total",
            &[("result", if ok { "ok" } else { "error" })],
        )
        .fetch_add(1, Ordering::Relaxed);
}

/// Polls the config file, the API key file and the TLS certificate and key files it names,
/// and reloads when their content differs from what the running config was
/// built from and held still for one more poll. Polling the content (not
/// mtime or inotify) works alike for in-place writes, write-and-rename,
/// Kubernetes ConfigMap mounts that swap a `..data` symlink, and certbot's
/// `live/` symlinks moving to new files in `archive/`. The extra poll also
/// lets an ACME client finish writing the certificate *and* the key before
/// the pair is checked. A rejected edit is tried once, not on every poll; a
/// file put back to the config in force after a rejected reload is reloaded
/// once more, so the error it left is cleared by a reload that succeeds.
pub async fn watch(
    reloader: Arc<Reloader>,
    path: impl AsRef<Path>,
    every: Duration,
    stop: CancellationToken,
) {
    let path = path.as_ref().to_path_buf();
    let app = reloader.app().clone();
    let tls = reloader.tls.clone();
    let in_force = |app: &App| {
        let text = app
            .shared
            .config_text
            .lock()
            .clone()
            .map(String::into_bytes);
        let keys = app
            .snapshot()
            .config
            .identity
            .api_keys_file
            .as_ref()
            .map(|(_, bytes)| bytes.to_vec());
        (
            text,
            tls.digest(),
            keys,
            users_in_force(&app.snapshot().config),
        )
    };
    let mut attempted = in_force(&app);
    let mut seen = attempted.clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let files = WatchedFiles::of(&app, &path);
        let Ok(now) = within(RELOAD_DEADLINE, move || files.read()).await else {
            continue;
        };
        let worth_reloading =
            now != in_force(&app) || app.shared.last_reload_error.lock().is_some();
        if now.0.is_some() && worth_reloading && now != attempted && now == seen {
            // Reloading reads the files once more; if they moved again, the next poll catches it.
            let _ = reloader.reload().await;
            attempted = now.clone();
        }
        seen = now;
    }
}

/// The files one poll of the watch reads: the config, the TLS certificate
/// and key files and the API key file the running config names.
struct WatchedFiles {
    config: PathBuf,
    /// Certificate, key, certificate, key… (`None` without TLS).
    tls: Option<Vec<PathBuf>>,
    api_keys: Option<PathBuf>,
    /// `auth.basic.users_file` of each route that has one.
    users: Vec<PathBuf>,
}

/// What one poll found: the config's bytes, the digest of the TLS files, and
/// the API key file's bytes (`Some(empty)` when it cannot be read: a vanished
/// file is a change too), and the users files' texts (empty when unreadable).
type Polled = (
    Option<Vec<u8>>,
    Option<crate::config::certs::FilesDigest>,
    Option<Vec<u8>>,
    Vec<String>,
);

/// The users files' texts the running config was built from.
fn users_in_force(config: &crate::config::Config) -> Vec<String> {
    config
        .routes
        .iter()
        .filter_map(|r| r.site.auth.as_ref())
        .map(|a| a.users.source.clone())
        .collect()
}

impl WatchedFiles {
    fn of(app: &App, config: &Path) -> WatchedFiles {
        let snap = app.snapshot();
        let tls = snap.config.server.tls.as_ref().map(|t| {
            t.certs
                .iter()
                .flat_map(|pair| [pair.cert.clone(), pair.key.clone()])
                .collect()
        });
        WatchedFiles {
            config: config.to_path_buf(),
            tls,
            api_keys: snap
                .config
                .identity
                .api_keys_file
                .as_ref()
                .map(|(p, _)| p.clone()),
            users: snap
                .config
                .routes
                .iter()
                .filter_map(|r| r.site.auth.as_ref())
                .map(|a| a.users_file.clone())
                .collect(),
        }
    }

    /// Reads them all, under the loader's rules (regular files only, each
    /// up to its bound): blocking file I/O, for a blocking thread.
    fn read(self) -> Polled {
        use config::{read_named_file, CONFIG_FILE_LIMIT, KEYS_FILE_LIMIT, SMALL_FILE_LIMIT};
        let tls = self.tls.and_then(|files| {
            let contents: Vec<Option<Vec<u8>>> = files
                .iter()
                .map(|p| read_named_file(p, SMALL_FILE_LIMIT).ok())
                .collect();
            crate::config::certs::digest_of(&contents)
        });
        (
            read_named_file(&self.config, CONFIG_FILE_LIMIT).ok(),
            tls,
            self.api_keys
                .map(|p| read_named_file(&p, KEYS_FILE_LIMIT).unwrap_or_default()),
            self.users
                .iter()
                .map(|p| {
                    let bytes = read_named_file(p, SMALL_FILE_LIMIT).unwrap_or_default();
                    String::from_utf8(bytes).unwrap_or_default()
                })
                .collect(),
        )
    }
}

/// Reloads on every SIGHUP.
pub async fn on_sighup(reloader: Arc<Reloader>, stop: CancellationToken) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; reload through the admin API or the file watch");
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = hup.recv() => {
                if got.is_none() { return; }
                tracing::info!("SIGHUP: reloading the config");
                let _ = reloader.reload().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_past_the_deadline_is_a_timeout_and_does_not_hold_up_the_next() {
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let late = within(Duration::from_millis(50), move || stuck.recv().is_ok()).await;
        assert!(matches!(late, Err(ReloadError::Timeout(_))), "{late:?}");
        assert_eq!(within(RELOAD_DEADLINE, || 7).await.unwrap(), 7);
        drop(release);
    }
}
