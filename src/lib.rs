//! tollgate: a reverse proxy with built-in, durable rate limiting.
//!
//! # Layout
//!
//! A request reads top to bottom through these modules:
//!
//! - [`server`]: accept loops, HTTP/1.1 + HTTP/2, slow-client limits, graceful drain,
//!   handing each connection to one of the [`workers`] (a single-threaded runtime per core);
//! - [`tls`]: rustls termination (SNI, ALPN, certificate rotation) and https:// upstreams;
//! - [`app`]: the request lifecycle, on one [`snapshot::Snapshot`], with its
//!   [`request_id`] and, at the end, one [`access`] record;
//! - [`identity`]: who the client is (API key hash, or real IP behind trusted proxies);
//! - [`router`]: which route, on the normalized path;
//! - [`limiter`]: the algorithms as pure arithmetic on an injected [`clock`];
//! - [`store`]: where their state lives (memory, SQLite write-behind, Redis for a fleet);
//! - [`protect`]: `ban:` (refuse a banned key, strike a refused one) and `count:` (give back what did not count);
//! - [`buffering`]: the request body read whole before an upstream is taken, slow bodies cut off (408);
//! - [`proxy`]: forwarding to the upstream (HTTP, or [`fastcgi`] to php-fpm);
//!   [`problem`]: everything answered locally.
//!
//! Around them: [`config`] (raw YAML → validated `Config`), [`reload`]
//! (validate, then swap, or keep the old), [`admin`] (and its live
//! [`dashboard`], fed by one call on the rejection path), [`metrics`], and
//! [`body`] (the response body: our own bytes or the upstream's, streamed).

pub mod access;
pub mod admin;
pub mod app;
pub mod balance;
pub mod body;
pub mod buffering;
pub mod clock;
pub mod config;
pub mod connections;
pub mod dashboard;
pub mod fastcgi;
pub mod framing;
pub mod identity;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod pool;
pub mod problem;
pub mod protect;
pub mod proxy;
pub mod reload;
pub mod request_id;
pub mod router;
pub mod server;
pub mod snapshot;
pub mod store;
pub mod tls;
pub mod tunnel;
pub mod workers;

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use app::App;
pub use config::Config;

/// The sockets tollgate serves on, bound before `run` so tests can bind port 0.
pub struct Listeners {
    /// In the order of [`config::ServerConfig::public`]: `server.listen`, then `server.tls.listen`.
    pub public: Vec<TcpListener>,
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds every address the config names.
    pub async fn bind(config: &Config) -> std::io::Result<Listeners> {
        let mut public = Vec::new();
        for (addr, _) in config.server.public() {
            public.push(server::bind_now(addr)?);
        }
        Ok(Listeners {
            public,
            admin: server::bind_now(config.admin.listen)?,
        })
    }
}

/// Options of one `run` that are not config: where reloads read from.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub config_path: Option<PathBuf>,
    /// How often the config file is polled; `None` = no file watch.
    pub watch_every: Option<Duration>,
    /// Worker runtimes to serve connections on; `None` = the calling runtime.
    pub workers: Option<std::sync::Arc<workers::Workers>>,
}

/// Serves until `shutdown` is cancelled, then stops accepting, lets requests
/// in flight finish within `server.shutdown_grace`, persists the store and returns.
pub async fn run(listeners: Listeners, app: App, options: RunOptions, shutdown: CancellationToken) {
    crate::connections::raise_fd_limit();
    let background = CancellationToken::new();
    let connections = TaskTracker::new();
    let config = app.snapshot().config.clone();
    let mut set = server::ListenerSet::new(
        connections.clone(),
        shutdown.child_token(),
        CancellationToken::new(),
        options.workers.clone(),
    );
    for ((addr, _), listener) in config.server.public().into_iter().zip(listeners.public) {
        set.start_public(&app, addr, listener);
    }
    proxy::warn_insecure_upstreams(&config.upstreams);
    config.log_warnings();
    set.start_admin(&app, config.admin.listen, listeners.admin);
    *app.shared.listeners.lock() = Some(set);

    tokio::spawn(prune_loop(
        app.clone(),
        options.workers.clone(),
        background.clone(),
    ));
    tokio::spawn(rejection_episodes(app.clone(), background.clone()));
    tokio::spawn(reload::on_sighup(app.clone(), background.clone()));
    tokio::spawn(dashboard::sample_loop(app.clone(), background.clone()));
    let health_app = app.clone();
    tokio::spawn(balance::health_checks(
        move || health_app.snapshot().upstreams.clone(),
        background.clone(),
    ));
    if let (Some(path), Some(every)) = (options.config_path.clone(), options.watch_every) {
        tokio::spawn(reload::watch(app.clone(), path, every, background.clone()));
    }

    shutdown.cancelled().await;
    tracing::info!("shutting down: no new connections, draining requests in flight");
    let set = app.shared.listeners.lock().take();
    if let Some(mut set) = set {
        // Every connection drains: the request it serves finishes, then it closes.
        set.shutdown().await;
    }
    connections.close();
    let grace = app.snapshot().config.server.shutdown_grace;
    // Upgraded connections (WebSockets) left hyper's watch when they
    // switched protocols: they get the same grace, then are closed.
    let tunnels = &app.shared.tunnels;
    if tokio::time::timeout(grace, async {
        connections.wait().await;
        tunnels.wait().await;
    })
    .await
    .is_err()
    {
        tracing::warn!(
            ?grace,
            remaining = connections.len(),
            tunnels = tunnels.len(),
            "grace period over; closing the remaining connections"
        );
    }
    tunnels.close_all().await;
    background.cancel();
    let store = app.shared.clone();
    // The writer logs what it could not save; `main` turns it into the exit status.
    let _ = tokio::task::spawn_blocking(move || store.store.shutdown()).await;
    tracing::info!("stopped");
}

/// Logs when a limiter stops rejecting (the start is logged by the request that began it).
async fn rejection_episodes(app: App, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
        app.shared
            .metrics
            .episodes
            .end_quiet(app.shared.clock.now());
    }
}

/// Removes expired limiter state, state of removed limiters, and old audit rows.
async fn prune_loop(
    app: App,
    workers: Option<std::sync::Arc<workers::Workers>>,
    stop: CancellationToken,
) {
    loop {
        let every = app.snapshot().config.store.prune_interval;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let snap = app.snapshot();
        let now = app.shared.clock.now();
        let retention = snap
            .config
            .audit
            .enabled
            .then_some(snap.config.audit.retention);
        let shared = app.shared.clone();
        let removed = tokio::task::spawn_blocking(move || {
            let removed = shared.store.prune(now, &snap.config.limiters, retention);
            workers::release_memory();
            removed
        })
        .await
        .unwrap_or(0);
        if removed > 0 {
            if let Some(w) = &workers {
                w.release_memory();
            }
            workers::release_memory();
        }
        tracing::debug!(removed, "pruned expired limiter state");
    }
}
