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
            tracing::error!("config reload rejected, the running config stays:\n{e}");
        }
    }
    count_reload(app, result.is_ok());
    result
}

/// Swaps in a validated config, unless it changes what only a restart can.
pub fn apply(app: &App, config: Config) -> Result<u64, ReloadError> {
    let old = app.snapshot();
    let was = &old.config;
    if config.store.backend != was.store.backend {
        return Err(ReloadError::RequiresRestart(
            "store.backend / store.path / store.url",
        ));
    }
    if config.server.tls != was.server.tls {
        return Err(ReloadError::RequiresRestart("server.tls"));
    }
    // Bind new sockets before anything changes: a port in use rejects the reload.
    let mut listeners = app.shared.listeners.lock();
    let pending = match listeners.as_ref() {
        Some(set) => Some(
            set.prepare(&config.server.listen, config.admin.listen)
                .map_err(ReloadError::Bind)?,
        ),
        None if config.server.listen != was.server.listen
            || config.admin.listen != was.admin.listen =>
        {
            return Err(ReloadError::RequiresRestart("server.listen / admin.listen"));
        }
        None => None,
    };
    let listen = config.server.listen.clone();
    let version = old.version + 1;
    let snapshot = Snapshot::build(config, version, Some(&old), &app.shared.metrics);
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

/// Polls the config file and reloads when its content differs from what
/// the running config was built from and held still for one more poll.
/// Polling the content (not mtime or inotify) works alike for in-place
/// writes, write-and-rename, and Kubernetes ConfigMap mounts that swap a
/// `..data` symlink. A rejected edit is tried once, not on every poll.
pub async fn watch(app: App, path: impl AsRef<Path>, every: Duration, stop: CancellationToken) {
    let path = path.as_ref().to_path_buf();
    let mut attempted = app
        .shared
        .config_text
        .lock()
        .clone()
        .map(String::into_bytes);
    let mut seen = attempted.clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = tokio::fs::read(&path).await.ok();
        let in_force = app
            .shared
            .config_text
            .lock()
            .clone()
            .map(String::into_bytes);
        if now.is_some() && now != in_force && now != attempted && now == seen {
            // Reloading reads the file once more; if it moved again, the next poll catches it.
            let _ = reload(&app);
            attempted = now.clone();
        }
        seen = now;
    }
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
