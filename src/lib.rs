//! tollgate: a reverse proxy with built-in, durable rate limiting.
//!
//! # Layout
//!
//! A request reads top to bottom: [`server`] accepts it and hands it to
//! [`app`], whose phases run on one [`snapshot::Snapshot`]: admit
//! ([`framing`]) → identify ([`identity`]) → route ([`router`]) → limit
//! (one call into [`decide`]: bans, [`limiter`] on its [`store`], a
//! [`decide::Verdict`] back) → dispatch (the route's own answer, or
//! [`buffering`] → [`balance`] → [`proxy`] or [`fastcgi`]) → settle (one
//! more call into [`decide`]) → log ([`access`]). Whatever tollgate answers
//! itself, [`problem`] writes.
//!
//! The binary (`main.rs`) only parses the command line, sets up logging and
//! signals, and calls [`run`] with the listeners it bound.
//!
//! Each module imports only modules on the lines below its own (so no cycles,
//! and none reaches up into its caller); `tests/module_map.rs` checks every
//! `crate::` path in `src/` against this list. The admin API reaches the server as
//! a handler `run` passes in, and reloads reach the listeners through the
//! [`reload::Reloader`] `run` owns.
//!
//! - [`admin`]: status, metrics, health, reload, config, upstreams; `admin/bans.rs` (`GET /bans`,
//!   `DELETE /bans/{key}`), `admin/guard.rs` (token, loopback-Host rule), `admin/exposition.rs` (what
//!   `/metrics` shows);
//! - [`reload`]: file watch / SIGHUP / admin → read (on a blocking thread) → validate → swap, or keep
//!   the old;
//! - [`server`]: the accept loops (public and admin), HTTP/1.1 + HTTP/2, graceful drain, the listener
//!   set; [`dashboard`]: the live dashboard (HTML, JS, CSS compiled in) and its sampler; [`prune`]:
//!   one task removing expired limiter state, removed limiters' state, old audit rows;
//! - [`app`]: the request lifecycle as named phases, callable without sockets; `app/trail.rs` (the
//!   log phase), `app/upstream.rs` (the upstream phase: body, share, forward, a failure's answer),
//!   `app/refuse.rs` (a refusal's answer);
//! - [`decide`]: the limit phase's one decision, a value: the ban check, the limiter checks in one
//!   store call, `on_error`, strikes, refunds, places given back; `decide/ban.rs` (`ban:`),
//!   `decide/refund.rs` (`count:`), `decide/release.rs` (queued places, concurrency slots);
//! - [`snapshot`]: one immutable view of the running config; [`buffering`]: request bodies read whole
//!   before an upstream is taken (memory, then a temp file), 408;
//! - [`balance`]: several servers per upstream: policy, health, the `max_conns` queue, retries;
//! - [`framing`]: what a request must be before anything else: one valid Host, a method we proxy;
//! - [`logging`]: one-line log records, text or JSON;
//! - [`activity`]: what the dashboard shows besides counters;
//! - [`cache`]: the one shared response cache (a bounded S3-FIFO map
//!   of stored answers by key, the renders under way, purges); `app/cache.rs` is its phase;
//!   [`workers`]: one single-threaded runtime per core;
//! - [`challenge`]: signed proof-of-work challenges for browsers, their page, and the signed pass
//!   (`key: pass`); `app/challenge.rs` is its phase (the pass a request carries, the pass path, the
//!   page instead of a refusal);
//! - [`import`]: `tollgate import htaccess`: an `.htaccess` as routes (a config `check` accepts);
//! - [`proxy_protocol`]: the PROXY protocol header (v1, v2) listed load balancers open each
//!   connection with, read under a bound; its source is the client; [`crowdsec`]: a CrowdSec Local
//!   API's decisions held and checked per request (`crowdsec/decisions.rs`), tollgate's bans pushed
//!   back as alerts (`crowdsec/push.rs`), one task following it (`crowdsec/lapi.rs` the calls);
//!   `app/reputation.rs` is the phase that enforces a decision;
//! - [`proxy`]: forwarding to one server: hop-by-hop and edge-owned headers, timeouts, pooling;
//! - [`fastcgi`]: FastCGI to php-fpm: codec, pooled client, CGI response, the script/static decision;
//! - [`forward_error`]: the one forwarding error (kind, origin, retry, cause) and the answer each
//!   kind gets;
//! - [`access`]: the access log (bounded queue, writer thread, JSON or text; stdout or a file
//!   reopened on SIGUSR1);
//! - [`problem`]: every answer tollgate writes itself, each failure's status and origin, and the one
//!   writer of refusals (429s);
//! - [`page`]: tollgate's own HTML pages (whether `Accept` prefers one, the built-in error pages,
//!   operators' templates); [`pool`]: the per-worker HTTP/1.1 connection pool;
//! - [`router`]: path normalization and first-match routing;
//! - [`location`]: every `Location` header tollgate writes (never off the site by accident);
//! - [`reject`]: a 429's bytes and the rate-limit headers, written without a formatter;
//!   [`connections`]: connection caps (`connections/timers.rs`: first-byte, head, idle and send
//!   timers); [`tls`]: rustls termination (the certificates in force, swapped by reloads) and
//!   https:// upstream trust;
//! - [`acme`]: automatic HTTPS (one task per name: storage, order with instant-acme, renewal,
//!   backoff, the fleet lock), whose `acme/state.rs` table the TLS resolver, the plain listener's
//!   http-01 answer and `GET /certificates` read;
//! - [`store`]: where limiter state lives: `Store` over one `Backend` (`store/backend.rs`, with the
//!   status each reports), one module each, generated from the list in `config/store.rs`:
//!   `memory.rs`; `sqlite/` (write-behind, schema, writer thread, durability, file lock); `redis/` (a
//!   fleet's counters and bans, breaker, leases, the script assembled from `redis/*.lua` and each
//!   algorithm's Lua); `table/` the in-process table every backend keeps (exact, sharded, bounded),
//!   `ban.rs` the local bans, `error.rs` the one `StoreError`;
//! - [`key`]: store keys `<limiter>:<key value>`;
//! - [`identity`]: who the client is (verified API key, trusted-proxy real IP, IPv6 prefix, exempt);
//! - [`request_body`]: the request body as forwarded (none, in memory, a temp file, streamed);
//! - [`compression`]: the response filter phase (gzip/brotli by `Accept-Encoding`, streamed);
//! - [`body`]: the response body, our own bytes or the upstream's, streamed and counted; [`tunnel`]:
//!   WebSockets and other upgrades;
//! - [`lean_client`]: a request on a pooled plain-http upstream connection, spoken by the request's
//!   own task (`lean_client/upload.rs` writes the head and body while listening for an early answer;
//!   `lean_client/head.rs` reads the answer's head with httparse), and the body that hands the
//!   connection back;
//! - [`header_value`]: numbers and built values as header values, with one allocation or none;
//! - [`request_id`]: `X-Request-Id`, a trusted peer's or generated (one allocation its copies count);
//! - [`networks`]: ASN and country from MaxMind DB files (`key: asn`, `match.country`), reloaded when
//!   they change, and the busiest networks;
//! - [`config`]: raw YAML (`raw.rs`; `raw/values.rs`: the values operators write, `${ENV}` text,
//!   durations, sizes; `raw/limiter.rs`: a limiter's keys, its parameters read as its algorithm
//!   declares them) → pure validation (`validate/`) → `Config`, with the I/O in `load.rs`
//!   and certificate pairs and CA bundles as data in `certs.rs`; `store.rs`: `store:` and the one
//!   list of backends (`with_backends!`), each backend's section (its keys as written, validation,
//!   `/config` view, name) in `store/<backend>.rs`;
//! - [`site`]: site rules a route carries (redirect, rewrite, access lists, basic auth, header
//!   rules), built once per config; `app/site.rs` is their phases (docs/SITE.md: the order);
//! - [`geodb`]: what a MaxMind DB file says about an address (ASN, country), as data `config` holds;
//! - [`metrics`]: Prometheus counters, gauges, histograms, and the one text writer
//!   (`metrics/text.rs`);
//! - [`limiter`]: the algorithms as pure arithmetic on an injected clock, one file each implementing
//!   `Rule` (`limiter/rule.rs`): its arithmetic and every fact about it (parameter names, measures
//!   and bounds, policy words, ban window, stored form, lease facts, the Redis script's arguments),
//!   with its part of the Redis script beside it (`limiter/<name>.lua`, see `limiter/script.rs`);
//!   `limiter/lease.rs` leased quotas' arithmetic. Algorithms are declared once, one line each in
//!   `limiter.rs`'s `with_algorithms!`, which generates the enums and their one exhaustive `match`
//!   per question: a new algorithm is its `.rs`, its `.lua` and that line;
//! - [`clock`]: Unix time in ns, `SystemClock`, `ManualClock`; [`normal_path`]: the one spelling of a
//!   request path routes and redirects compare (`router` re-exports it);
//! - [`build_info`]: what `--version` says (version, commit, build date); [`sd_notify`]: systemd
//!   readiness (`READY=1`, `STOPPING=1`) for a `Type=notify` unit; [`allocator`]: the binary's
//!   allocator (mimalloc), which the memory benches share.

// One module layout: `x.rs` beside its `x/`, never `x/mod.rs`. Set here
// rather than in Cargo.toml's `[lints]`, which would reach the integration
// tests too: their shared helpers must stay `tests/common/mod.rs`, since a
// `tests/common.rs` would be a test target of its own.
#![deny(clippy::mod_module_files)]

pub mod access;
pub mod acme;
pub mod activity;
pub mod admin;
pub mod allocator;
pub mod app;
pub mod balance;
pub mod body;
pub mod buffering;
pub mod build_info;
pub mod cache;
pub mod challenge;
pub mod clock;
pub mod compression;
pub mod config;
pub mod connections;
pub mod crowdsec;
pub mod dashboard;
pub mod decide;
pub mod fastcgi;
pub mod forward_error;
pub mod framing;
pub mod geodb;
pub mod header_value;
pub mod identity;
pub mod import;
pub mod key;
pub mod lean_client;
pub mod limiter;
pub mod location;
pub mod logging;
pub mod metrics;
pub mod networks;
pub mod normal_path;
pub mod page;
pub mod pool;
pub mod problem;
pub mod proxy;
pub mod proxy_protocol;
pub mod prune;
pub mod reject;
pub mod reload;
pub mod request_body;
pub mod request_id;
pub mod router;
pub mod sd_notify;
pub mod server;
pub mod site;
pub mod snapshot;
pub mod store;
pub mod tls;
pub mod tunnel;
pub mod workers;

use std::path::PathBuf;
use std::sync::Arc;
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
    pub workers: Option<Arc<workers::Workers>>,
}

/// Serves until `shutdown` is cancelled, then stops accepting, lets requests
/// in flight finish within `server.shutdown_grace`, persists the store and returns.
pub async fn run(listeners: Listeners, app: App, options: RunOptions, shutdown: CancellationToken) {
    crate::connections::raise_fd_limit();
    let background = CancellationToken::new();
    let connections = TaskTracker::new();
    let config = app.snapshot().config.clone();
    // One pruning task; a reload that removes limiters asks it for a round.
    let prune_now = prune::Trigger::default();
    let tls = tls_front(&app, &config, &background).await;
    // The reloader holds the listeners; the admin API reloads through it.
    let reloader = Arc::new(reload::Reloader::new(
        app.clone(),
        tls.clone(),
        prune_now.clone(),
    ));
    let mut set = server::ListenerSet::new(
        app.clone(),
        tls,
        admin_handler(&reloader),
        connections.clone(),
        shutdown.child_token(),
        options.workers.clone(),
    );
    for ((addr, _), listener) in config.server.public().into_iter().zip(listeners.public) {
        set.start_public(addr, listener);
    }
    proxy::warn_insecure_upstreams(&config.upstreams);
    config.log_warnings();
    set.start_admin(config.admin.listen, listeners.admin);
    reloader.attach(set);
    spawn_background(&app, &reloader, &options, prune_now, &background);

    shutdown.cancelled().await;
    stop(&app, &reloader, &connections, &background).await;
}

/// The TLS terminator: the configured certificates, and the names under
/// `server.tls.acme`, their stored certificates in force before the first
/// handshake, ordered and renewed in the background until `background` ends.
async fn tls_front(
    app: &App,
    config: &config::Config,
    background: &CancellationToken,
) -> Arc<tls::Terminator> {
    let certs = config.server.tls.as_ref().map(|t| t.loaded.clone());
    let managed = Arc::new(acme::state::Managed::default());
    // Managed from the first handshake (refused until ordered) and in the first scrape.
    let acme_config = config.server.tls.as_ref().and_then(|t| t.acme.as_ref());
    for domain in acme_config.iter().flat_map(|a| &a.domains) {
        managed.manage(domain);
    }
    acme::start_at_zero(&app.shared.metrics);
    if let Some(acme) = acme_config {
        acme::load_stored(acme, &managed, &app.shared.clock).await;
    }
    server::lingering_start_at_zero(&app.shared.metrics);
    let tls = Arc::new(tls::Terminator::new(certs, managed.clone()));
    tokio::spawn(acme::manage(acme_context(app), managed, background.clone()));
    tls
}

/// Shutdown: no new connections, the requests in flight drained, the
/// background tasks ended, the last records logged and the store persisted.
async fn stop(
    app: &App,
    reloader: &reload::Reloader,
    connections: &TaskTracker,
    background: &CancellationToken,
) {
    tracing::info!("shutting down: no new connections, draining requests in flight");
    // Taking the listeners back also ends the reloader's hold on the admin handler.
    if let Some(mut set) = reloader.detach() {
        // Every connection drains: the request it serves finishes, then it closes.
        set.shutdown().await;
    }
    drain(app, connections).await;
    background.cancel();
    let shared = app.shared.clone();
    let _ = tokio::task::spawn_blocking(move || {
        // The last requests' records reach the log before the process ends.
        shared.access.flush(std::time::Duration::from_secs(1));
        // The writer logs what it could not save; `main` turns it into the exit status.
        shared.store.shutdown()
    })
    .await;
    tracing::info!("stopped");
}

/// The tasks that run beside the listeners until `background` is cancelled:
/// pruning, rejection episodes, SIGHUP, the dashboard's samples, health
/// checks and, with a config path and a period, the file watch.
fn spawn_background(
    app: &App,
    reloader: &Arc<reload::Reloader>,
    options: &RunOptions,
    prune_now: prune::Trigger,
    background: &CancellationToken,
) {
    tokio::spawn(prune::prune_loop(
        app.clone(),
        options.workers.clone(),
        prune_now,
        background.clone(),
    ));
    tokio::spawn(rejection_episodes(app.clone(), background.clone()));
    tokio::spawn(reload::on_sighup(reloader.clone(), background.clone()));
    // Listened for before `run` first waits, so no SIGUSR1 after start can
    // meet the default action (ending the process).
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()) {
        Ok(usr1) => {
            tokio::spawn(reopen_access_log(usr1, app.clone(), background.clone()));
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGUSR1; the access log file will not be reopened")
        }
    }
    tokio::spawn(dashboard::sample_loop(app.clone(), background.clone()));
    // GeoIP files and the CrowdSec Local API: each followed by a task of its own,
    // reading what the snapshot in force names.
    let (geo, cs) = (app.clone(), app.clone());
    tokio::spawn(networks::watch(
        move || geo.snapshot().networks.clone(),
        background.clone(),
    ));
    tokio::spawn(crowdsec::follow(
        move || cs.snapshot().crowdsec.clone(),
        app.shared.clock.clone(),
        background.clone(),
    ));
    let health_app = app.clone();
    tokio::spawn(balance::health_checks(
        move || health_app.snapshot().upstreams.clone(),
        background.clone(),
    ));
    if let (Some(path), Some(every)) = (options.config_path.clone(), options.watch_every) {
        tokio::spawn(reload::watch(
            reloader.clone(),
            path,
            every,
            background.clone(),
        ));
    }
}

/// Waits for the connections (and the tunnels upgraded from them) to finish
/// within `server.shutdown_grace`, then closes the tunnels left.
async fn drain(app: &App, connections: &TaskTracker) {
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
}

/// The admin API as the admin listener serves it.
fn admin_handler(reloader: &Arc<reload::Reloader>) -> server::AdminHandler {
    let reloader = reloader.clone();
    Arc::new(move |req, peer| {
        let reloader = reloader.clone();
        Box::pin(async move { admin::handle(reloader.app(), &reloader, req, peer).await })
    })
}

/// SIGUSR1 (logrotate's `postrotate` convention): the access log file is
/// reopened by its name, by the writer thread, before its next write.
async fn reopen_access_log(
    mut usr1: tokio::signal::unix::Signal,
    app: App,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = usr1.recv() => {
                if got.is_none() { return; }
                tracing::info!("SIGUSR1: reopening the access log file");
                app.shared.access.reopen();
            }
        }
    }
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

/// What the ACME tasks need from the running app, as values (see [`acme::Context`]).
fn acme_context(app: &app::App) -> acme::Context {
    let (config, metrics) = (app.clone(), app.clone());
    acme::Context {
        acme: Arc::new(move || {
            let snap = config.snapshot();
            snap.config.server.tls.as_ref().and_then(|t| t.acme.clone())
        }),
        clock: app.shared.clock.clone(),
        redis: app.shared.store.acme_share(),
        count_order: Arc::new(move |result| {
            let counter = metrics
                .shared
                .metrics
                .counter(acme::ORDERS, &[("result", result)]);
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }),
    }
}
