//! Accept loops and connections: plain or TLS, HTTP/1.1 and HTTP/2 (hyper-util auto), slow-client limits, graceful drain.
//!
//! Connections are spawned on a [`TaskTracker`] and told to finish by a
//! [`CancellationToken`]: on shutdown every listener stops accepting, every
//! connection finishes the request it is serving and closes, and the caller
//! waits for the tracker with the configured grace.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;

use bytes::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acme::state::Managed;
use crate::app::{App, ConnInfo};
use crate::body::Body;
use crate::config::Serve;
use crate::connections::{watch, Activity, Closing, Permit, Watched};
use crate::proxy_protocol::Prefixed;
use crate::tls::Terminator;
use crate::workers::Workers;

mod edge;
mod linger;
mod listeners;
mod on_wake;
use edge::{answer, hsts_header, Edge};
pub use linger::start_at_zero as lingering_start_at_zero;
use linger::{Handoff, Lingering};
pub use listeners::{bind_now, ListenerSet, Pending};
use on_wake::OnWake;

/// Request heads larger than this get 431 (hyper answers it while parsing).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// Concurrent HTTP/2 streams per connection (each may hold an upstream connection).
pub const MAX_CONCURRENT_STREAMS: u32 = 100;

/// Per-connection buffering, in bytes. HTTP/1.1: the read buffer and the
/// write buffer are each capped at `MAX_HEAD_BYTES`; hyper stops polling the
/// response body while the write buffer holds that much, so a client that
/// reads slowly holds at most 32 KiB here plus one upstream chunk
/// (`lean_client::UPSTREAM_READ_BUF`, 64 KiB) plus the upstream's read buffer
/// (64 KiB): about 160 KiB, whatever the response size. HTTP/2: each
/// stream's send buffer and receive window are capped below, and the
/// connection's receive window bounds what all streams can push at once.
const H2_STREAM_WINDOW: u32 = 64 * 1024;
const H2_CONNECTION_WINDOW: u32 = 256 * 1024;
const H2_SEND_BUF: usize = 32 * 1024;

/// The HTTP settings of one connection. `header_read_timeout` is hyper's
/// HTTP/1.1 head timer, which runs from the moment hyper waits for a head, so
/// it also cuts the wait between kept-alive requests: public connections pass
/// `None` and time their heads with [`watch`] instead (the head timer starts
/// with the head's first byte, the idle timer governs the wait before it).
pub fn connection_builder(header_read_timeout: Option<Duration>) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        // Rapid Reset (CVE-2023-44487): streams a client opens and cancels
        // before we accept them, and streams we must reset for its errors,
        // are capped; past either the connection is closed with GOAWAY.
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(100)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .adaptive_window(false)
        .max_send_buf_size(H2_SEND_BUF)
        // RFC 8441: WebSockets over HTTP/2 (extended CONNECT).
        .enable_connect_protocol()
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
}

/// How long a listener waits after a failed accept (out of file descriptors
/// and the like) instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The admin listener's budget for a request head.
const ADMIN_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What the admin listener answers: the admin API, handed in by the caller
/// so this module never depends on it.
pub type AdminHandler = Arc<
    dyn Fn(Request<Incoming>, SocketAddr) -> Pin<Box<dyn Future<Output = Response<Body>> + Send>>
        + Send
        + Sync,
>;

/// The one accept loop: accepts until `stop` is cancelled and hands each
/// socket to `on_accept`, which decides what the listener serves.
async fn accept_loop(
    listener: TcpListener,
    stop: CancellationToken,
    mut on_accept: impl FnMut(TcpStream, SocketAddr),
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => on_accept(stream, peer),
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// What a public listener does with an accepted socket: admit it under the
/// connection caps, then serve it on a worker, each connection on
/// `connections` and draining when `drain` is cancelled. `addr` is the
/// listener's configured address: what it serves (plain, TLS, redirect) is
/// read from the snapshot for each connection, so a reload can change it
/// without rebinding.
fn public_acceptor(
    app: App,
    tls: Arc<Terminator>,
    addr: SocketAddr,
    port: u16,
    drain: CancellationToken,
    connections: TaskTracker,
    workers: Option<Arc<Workers>>,
) -> impl FnMut(TcpStream, SocketAddr) {
    let mut serve = app
        .snapshot()
        .config
        .server
        .serve_at(addr)
        .unwrap_or(Serve::Http);
    move |stream, peer| {
        let snap = app.snapshot();
        let Some(permit) = admit_connection(&app, &snap, peer) else {
            return;
        };
        let server = &snap.config.server;
        let proxied = crate::proxy_protocol::listed(&server.proxy_protocol, peer);
        let _ = stream.set_nodelay(true);
        // A listener a reload is removing keeps what it served until it stops.
        serve = server.serve_at(addr).unwrap_or(serve);
        let timeouts = Timeouts {
            header: server.request_header_timeout,
            idle: server.idle_timeout,
        };
        drop(snap);
        let serving = Serving::of(serve, &tls);
        let acme = tls.managed().clone();
        let app = app.clone();
        let drain = drain.clone();
        let start = move |stream, worker| async move {
            let conn = ConnInfo {
                peer,
                proto: "http",
                port,
                worker,
            };
            serve_accepted(
                stream, conn, serving, app, timeouts, drain, &permit, acme, proxied,
            )
            .await;
        };
        spawn_connection(&connections, workers.as_deref(), stream, peer, start);
    }
}

/// Runs `start` for an accepted socket on `connections`: on a worker
/// runtime, the socket registered with that worker's reactor there (it never
/// changes threads again), or on this runtime when there are no workers.
fn spawn_connection<F, Fut>(
    connections: &TaskTracker,
    workers: Option<&Workers>,
    stream: TcpStream,
    peer: SocketAddr,
    start: F,
) where
    F: FnOnce(TcpStream, usize) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(workers) = workers else {
        connections.spawn(start(stream, 0));
        return;
    };
    match stream.into_std() {
        Ok(std_stream) => {
            let (worker, runtime) = workers.pick();
            let on_worker = async move {
                match TcpStream::from_std(std_stream) {
                    Ok(stream) => start(stream, worker).await,
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "cannot move a connection to a worker")
                    }
                }
            };
            connections.spawn_on(on_worker, runtime);
        }
        Err(e) => tracing::warn!(%peer, error = %e, "cannot move a connection to a worker"),
    }
}

/// The connection caps (`max_connections`, `max_connections_per_ip` for an
/// untrusted peer): a place, or `None` and the socket is closed at once (an
/// answer would cost the writes a flood wants).
fn admit_connection(
    app: &App,
    snap: &crate::snapshot::Snapshot,
    peer: SocketAddr,
) -> Option<Permit> {
    let server = &snap.config.server;
    let max_total = server
        .max_connections
        .unwrap_or_else(crate::connections::default_max_connections);
    // A listed load balancer carries many clients: its address is not one.
    let shared_peer = snap.identity.is_trusted(peer.ip())
        || crate::proxy_protocol::listed(&server.proxy_protocol, peer);
    let per_ip = (!shared_peer).then_some(server.max_connections_per_ip);
    match app.shared.connections.admit(peer.ip(), max_total, per_ip) {
        Ok(permit) => Some(permit),
        Err(refusal) => {
            tracing::debug!(%peer, ?refusal, "connection refused");
            None
        }
    }
}

/// What the admin listener does with an accepted socket: serve `handler` on
/// it (HTTP/1.1 or HTTP/2) until it closes or `stop` is cancelled.
fn admin_acceptor(
    handler: AdminHandler,
    stop: CancellationToken,
) -> impl FnMut(TcpStream, SocketAddr) {
    move |stream, peer| {
        let handler = handler.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let answer = handler(req, peer);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let builder = connection_builder(Some(ADMIN_HEADER_TIMEOUT));
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// A connection's timers, from the snapshot current when it was accepted.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    /// For the TLS handshake, the first byte, and each request head from its first byte.
    header: Duration,
    /// Between requests: from the end of one to the first byte of the next.
    idle: Duration,
}

/// What one accepted connection is served as: [`Serve`], with the TLS
/// acceptor for a TLS listener.
enum Serving {
    Http,
    RedirectToHttps { port: u16 },
    Https(tokio_rustls::TlsAcceptor),
}

impl Serving {
    fn of(serve: Serve, tls: &Terminator) -> Serving {
        match serve {
            Serve::Http => Serving::Http,
            Serve::RedirectToHttps { port } => Serving::RedirectToHttps { port },
            // The rustls config is shared: it picks the certificates in force at each handshake.
            Serve::Https => Serving::Https(tls.acceptor()),
        }
    }
}

/// Serves one accepted connection: from a `proxied` peer (listed in
/// `server.proxy_protocol`) its PROXY header first, within the head's
/// budget; its source is the client from then on. Without one it is closed.
#[allow(clippy::too_many_arguments)] // the connection's parts, each used once
async fn serve_accepted(
    stream: TcpStream,
    mut conn: ConnInfo,
    serve: Serving,
    app: App,
    timeouts: Timeouts,
    drain: CancellationToken,
    permit: &Permit,
    acme: Arc<Managed>,
    proxied: bool,
) {
    let stream = if proxied {
        let activity = permit.activity();
        let counters = &app.shared.proxy_protocol;
        // Like a TLS handshake: nothing of a request yet, so a newcomer may displace it.
        let opened = tokio::select! {
            o = crate::proxy_protocol::open(stream, conn.peer, timeouts.header, counters) => o,
            _ = drain.cancelled() => return,
            _ = activity.displaced() => return,
        };
        let Some((client, stream)) = opened else {
            return;
        };
        conn.peer = client;
        stream
    } else {
        Prefixed::new(Bytes::new(), stream)
    };
    serve_stream(stream, conn, serve, app, timeouts, drain, permit, acme).await
}

/// Serves one connection as its listener says: plain, TLS, or
/// redirect, while `permit` holds its place (its activity is what may be displaced).
#[allow(clippy::too_many_arguments)] // the connection's parts, each used once
async fn serve_stream(
    stream: Prefixed<TcpStream>,
    conn: ConnInfo,
    serve: Serving,
    app: App,
    timeouts: Timeouts,
    drain: CancellationToken,
    permit: &Permit,
    acme: Arc<Managed>,
) {
    let activity = permit.activity();
    // The socket comes back here when hyper is done with it, for a lingering close.
    let handoff = Arc::new(Handoff::default());
    // What came with a PROXY header is read first, from above the socket
    // the lingering close takes back.
    let (front, stream) = stream.into_parts();
    let stream = Prefixed::new(front, Lingering::new(stream, handoff.clone()));
    let serving = Connection {
        app,
        conn,
        timeouts,
        drain,
        activity,
        handoff,
    };
    let mut edge = Edge {
        redirect_to: None,
        acme,
        hsts: None,
    };
    match serve {
        Serving::Http => serving.serve(stream, edge).await,
        Serving::RedirectToHttps { port } => {
            edge.redirect_to = Some(port);
            serving.serve(stream, edge).await
        }
        Serving::Https(acceptor) => serving.serve_tls(acceptor, stream, edge).await,
    }
}

fn handshake_failed(app: &App, reason: &'static str) {
    app.shared
        .metrics
        .counter(
            "tollgate_tls_handshake_failures_total",
            &[("reason", reason)],
        )
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// One accepted connection's parts, from its acceptance to its close.
struct Connection {
    app: App,
    conn: ConnInfo,
    timeouts: Timeouts,
    drain: CancellationToken,
    activity: Arc<Activity>,
    /// Where the socket comes back for a lingering close.
    handoff: Arc<Handoff>,
}

/// How a connection's HTTP ended: by itself (hyper closed it, or the
/// client did), or because tollgate cut it (drain, displacement, a timer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    ByItself,
    Cut,
}

/// The connection's rare event that came first.
enum Rare {
    /// The server is draining.
    Drain,
    /// A newcomer took its place at `server.max_connections`.
    Displaced,
    /// One of its timers ran out.
    Closing(Closing),
}

impl Connection {
    /// A TLS listener's connection: the handshake, within a request head's
    /// budget, then HTTP on it with HSTS.
    async fn serve_tls(
        self,
        acceptor: tokio_rustls::TlsAcceptor,
        stream: Prefixed<Lingering>,
        mut edge: Edge,
    ) {
        let (timeout, peer) = (self.timeouts.header, self.conn.peer);
        let (app, drain, activity) = (&self.app, &self.drain, &self.activity);
        // The handshake gets the same budget as a request head: a
        // client that opens a socket and says nothing is cut off. It
        // has sent no request head yet, so a newcomer may displace it.
        let handshake = tokio::select! {
            r = tokio::time::timeout(timeout, acceptor.accept(stream)) => r,
            _ = drain.cancelled() => return,
            _ = activity.displaced() => return,
        };
        let stream = match handshake {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                handshake_failed(app, "error");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, ?timeout, "TLS handshake timed out");
                handshake_failed(app, "timeout");
                return;
            }
        };
        // A CA's tls-alpn-01 validation ends with its handshake.
        if crate::tls::negotiated_acme(stream.get_ref().1) {
            return;
        }
        edge.hsts = hsts_header(app);
        let conn = ConnInfo {
            proto: "https",
            ..self.conn
        };
        Connection { conn, ..self }.serve(stream, edge).await
    }

    /// Serves HTTP/1.1 or HTTP/2 on `io` until it closes, drains or is
    /// displaced; with `edge.redirect_to`, every request but an ACME
    /// challenge gets 308 to https on that port. A connection that ended by
    /// itself after a request with a body closes the lingering way.
    async fn serve<I>(self, io: I, edge: Edge)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            app,
            conn,
            timeouts,
            drain,
            activity,
            handoff,
        } = self;
        let lingering = app.snapshot().config.server.bodies.lingering;
        let ended = serve_http(
            io,
            app.clone(),
            conn,
            edge,
            timeouts,
            &drain,
            &activity,
            &handoff,
        )
        .await;
        if ended == Ended::Cut || lingering.time.is_zero() {
            return;
        }
        if let Some(stream) = handoff.take() {
            let cut = async {
                tokio::select! {
                    _ = drain.cancelled() => {}
                    _ = activity.displaced() => {}
                }
            };
            let end = linger::close(stream, lingering, &app.shared.metrics, cut).await;
            tracing::debug!(peer = %conn.peer, end, "lingering close");
        }
    }
}

/// Serves HTTP/1.1 or HTTP/2 on one connection until it closes, drains or
/// is displaced. Returns once hyper has let go of `io`.
#[allow(clippy::too_many_arguments)] // the connection's parts, each used once
async fn serve_http<I>(
    io: I,
    app: App,
    conn_info: ConnInfo,
    edge: Edge,
    timeouts: Timeouts,
    drain: &CancellationToken,
    activity: &Arc<Activity>,
    handoff: &Arc<Handoff>,
) -> Ended
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let peer = conn_info.peer;
    let connections = app.shared.connections.clone();
    let (send_timeout, share) = crate::buffering::per_connection(&app.snapshot().config.server);
    let io =
        TokioIo::new(Watched::new(io, activity.clone()).send_timeout(send_timeout, &connections));
    let service = requests(app, conn_info, edge, share, activity, handoff);
    let builder = connection_builder(None);
    // With upgrades: a 101 answer hands the socket to a tunnel (WebSockets).
    let conn = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(conn);
    // `watch` closes a connection that says nothing, one whose request head
    // stalls, and one that stays idle between requests. These rare events
    // are polled only when one of them fired (see `on_wake.rs`), not at
    // every wake of the connection.
    let side = OnWake::new(async {
        tokio::select! {
            _ = drain.cancelled() => Rare::Drain,
            _ = activity.displaced() => Rare::Displaced,
            closing = watch(activity, timeouts.header, timeouts.idle) => Rare::Closing(closing),
        }
    });
    let first = tokio::select! {
        biased;
        r = conn.as_mut() => Err(r),
        rare = side => Ok(rare),
    };
    let (result, ended) = match first {
        Err(r) => (r, Ended::ByItself),
        Ok(Rare::Drain) => {
            conn.as_mut().graceful_shutdown();
            (conn.await, Ended::Cut)
        }
        Ok(rare) => {
            if !closes_gracefully(rare, activity, &connections, peer) {
                return Ended::Cut;
            }
            conn.as_mut().graceful_shutdown();
            tokio::select! {
                r = conn.as_mut() => (r, Ended::Cut),
                _ = drain.cancelled() => (conn.await, Ended::Cut),
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
    ended
}

/// The service [`serve_http`] gives hyper: each request [`answer`]ed,
/// the connection busy meanwhile (multiplexed once on HTTP/2), its start told to `handoff`.
fn requests(
    app: App,
    conn_info: ConnInfo,
    edge: Edge,
    share: crate::buffering::Share,
    activity: &Arc<Activity>,
    handoff: &Arc<Handoff>,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
> {
    let in_service = activity.clone();
    let handoff = handoff.clone();
    service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let busy = in_service.request();
        if req.version() == http::Version::HTTP_2 {
            in_service.set_multiplexed();
        }
        handoff.request_began(&req);
        let answer = answer(&app, req, conn_info, &edge, share.clone());
        async move {
            let _busy = busy;
            Ok::<_, Infallible>(answer.await)
        }
    })
}

/// Whether a connection a rare event ends closes gracefully (finishing a
/// response in progress) or is cut at once; counted and logged. Displaced:
/// one that never started a request is cut at once, one idle between
/// requests closes gracefully (at once, unless a response is still
/// streaming: that one finishes).
fn closes_gracefully(
    rare: Rare,
    activity: &Activity,
    connections: &crate::connections::Connections,
    peer: SocketAddr,
) -> bool {
    match rare {
        Rare::Drain => true,
        Rare::Displaced => {
            tracing::debug!(%peer, "closed: displaced by a new connection at max_connections");
            activity.served_any()
        }
        Rare::Closing(closing) => count_closing(connections, closing, peer),
    }
}

/// Counts why [`watch`] closes a connection; `true` when it closes
/// gracefully (idle between requests), `false` when it is cut at once.
fn count_closing(
    connections: &crate::connections::Connections,
    closing: Closing,
    peer: SocketAddr,
) -> bool {
    match closing {
        Closing::Silent => {
            connections.count_closed_silent();
            tracing::debug!(%peer, "closed: no request within request_header_timeout");
            false
        }
        Closing::SlowHead => {
            connections.count_closed_slow_head();
            tracing::debug!(%peer, "closed: request head incomplete after request_header_timeout");
            false
        }
        Closing::Idle => {
            connections.count_closed_idle();
            tracing::debug!(%peer, "closed: idle");
            true
        }
    }
}
