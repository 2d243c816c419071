//! Config reload: file watch / SIGHUP / admin → parse → validate → swap, or keep the old.
//!
//! A new config is validated completely and its snapshot built before the
//! swap; any error leaves the running snapshot untouched, is logged, counted
//! and kept for `GET /config`. Requests in flight finish on the snapshot they
//! loaded. Counters live in the store, keyed by limiter name, so a limiter
//! that keeps its name keeps its counts.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::admin::count_reload;
use crate::app::App;
use crate::config::{self, Config, ConfigError};
use crate::snapshot::Snapshot;

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
}

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
            other => vec![other.to_string()],
        }
    }
}

/// Reads the config file again and applies it; returns the new version.
pub fn reload(app: &App) -> Result<u64, ReloadError> {
    let result = match &app.shared.config_path {
        None => Err(ReloadError::NoFile),
        Some(path) => config::load_file_text(path)
            .map_err(ReloadError::from)
            .and_then(|(c, text)| {
                let version = apply(app, c)?;
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
    result
}

/// Swaps in a validated config (with its TLS certificates), unless it changes what only a restart can.
pub fn apply(app: &App, config: Config) -> Result<u64, ReloadError> {
    // Held to the end: two reloads (the watch and an admin call) never
    // interleave, so versions stay sequential and listeners consistent.
    let mut listeners = app.shared.listeners.lock();
    let old = app.snapshot();
    let was = &old.config;
    if config.server.workers != was.server.workers {
        return Err(ReloadError::RequiresRestart("server.workers"));
    }
    // The table's shards are sized at start; a live change could only shrink
    // by forgetting counting clients, which the bound promises never to do.
    if config.store.max_keys != was.store.max_keys {
        return Err(ReloadError::RequiresRestart("store.max_keys"));
    }
    if config.store.backend != was.store.backend {
        return Err(ReloadError::RequiresRestart(
            "store.backend / store.path / store.url",
        ));
    }
    // Every public address, plain or TLS: what each serves is read from the
    // snapshot per connection, so only added or removed addresses rebind.
    let listen: Vec<std::net::SocketAddr> =
        config.server.public().into_iter().map(|(a, _)| a).collect();
    let was_listen: Vec<std::net::SocketAddr> =
        was.server.public().into_iter().map(|(a, _)| a).collect();
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
    if app.shared.tls.install(certs.clone()) {
        match &certs {
            Some(c) => {
                tracing::info!(certificates = ?c, "TLS certificates rotated; new handshakes use them")
            }
            None => tracing::info!("TLS turned off"),
        }
    }
    app.shared.snapshot.store(Arc::new(snapshot));
    if let (Some(set), Some(pending)) = (listeners.as_mut(), pending) {
        set.commit(app, pending, &listen);
    }
    drop(listeners);
    prune_removed_limiters(app, &old);
    Ok(version)
}

/// Drops at once the state of limiters the new config removed, instead of
/// waiting for the next prune round.
fn prune_removed_limiters(app: &App, old: &Snapshot) {
    let new = app.snapshot();
    let removed = old
        .limiters
        .iter()
        .any(|l| !new.limiters.iter().any(|n| n.name == l.name));
    if !removed {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let shared = app.shared.clone();
    runtime.spawn_blocking(move || {
        let now = shared.clock.now();
        let snap = shared.snapshot.load_full();
        let retention = snap
            .config
            .audit
            .enabled
            .then_some(snap.config.audit.retention);
        shared.store.prune(now, &snap.config.limiters, retention);
    });
}

/// Polls the config file, the API key file and the TLS certificate and key files it names,
/// and reloads when their content differs from what the running config was
/// built from and held still for one more poll. Polling the content (not
/// mtime or inotify) works alike for in-place writes, write-and-rename,
/// Kubernetes ConfigMap mounts that swap a `..data` symlink, and certbot's
/// `live/` symlinks moving to new files in `archive/`. The extra poll also
/// lets an ACME client finish writing the certificate *and* the key before
/// the pair is checked. A rejected edit is tried once, not on every poll.
pub async fn watch(app: App, path: impl AsRef<Path>, every: Duration, stop: CancellationToken) {
    let path = path.as_ref().to_path_buf();
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
        (text, app.shared.tls.digest(), keys)
    };
    let mut attempted = in_force(&app);
    let mut seen = attempted.clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = (
            tokio::fs::read(&path).await.ok(),
            tls_files_digest(&app).await,
            key_file(&app).await,
        );
        if now.0.is_some() && now != in_force(&app) && now != attempted && now == seen {
            // Reloading reads the files once more; if they moved again, the next poll catches it.
            let _ = reload(&app);
            attempted = now.clone();
        }
        seen = now;
    }
}

/// The digest of the certificate and key files the running config names, as they are on disk now.
async fn tls_files_digest(app: &App) -> Option<crate::tls::FilesDigest> {
    let snap = app.snapshot();
    let tls = snap.config.server.tls.as_ref()?;
    let mut contents = Vec::with_capacity(tls.certs.len() * 2);
    for pair in &tls.certs {
        contents.push(tokio::fs::read(&pair.cert).await.ok());
        contents.push(tokio::fs::read(&pair.key).await.ok());
    }
    crate::tls::digest_of(&contents)
}

/// The API key file the running config names, as it is on disk now
/// (`Some(empty)` when it cannot be read: a vanished file is a change too).
async fn key_file(app: &App) -> Option<Vec<u8>> {
    let path = app.snapshot().config.identity.api_keys_file.clone()?.0;
    Some(tokio::fs::read(&path).await.unwrap_or_default())
}

/// Reloads on every SIGHUP.
pub async fn on_sighup(app: App, stop: CancellationToken) {
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
                let _ = reload(&app);
            }
        }
    }
}
