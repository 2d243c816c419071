//! Idle HTTP/1.1 connections to a plain-http upstream, one list per worker thread.
//!
//! hyper-util's pooled client shares one pool between threads (a mutex and a
//! hashed pool key per request, and connections whose task may live on
//! another thread). Here each worker keeps its own idle lists, so a request
//! takes a connection its own thread drives, with one uncontended lock and
//! no hashing: sockets for requests without a body, which the request's
//! task speaks to itself (see `lean_client`), and hyper `SendRequest`
//! handles for requests with a body or an upgrade.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::request_body::UpstreamBody;

use crate::lean_client as lean;
pub use crate::lean_client::UPSTREAM_READ_BUF;

/// Open connections (busy and idle, all workers) to one upstream, at most
/// the descriptor budget that `server.max_connections` defaults to (see
/// `connections::default_max_connections`): an HTTP/1.1 client holds one
/// upstream connection at a time, so this bites only when HTTP/2 clients fan
/// out (100 streams each). Past it a request waits for a connection to come
/// free, within the upstream's timeout (then 504), so no client can make
/// tollgate open connections without bound.
pub fn max_connections_per_upstream() -> usize {
    crate::connections::default_max_connections()
}

/// More idle connections than this per worker are closed instead of kept.
const MAX_IDLE_PER_WORKER: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: Authority,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {authority} within {timeout:?}")]
    ConnectTimeout {
        authority: Authority,
        timeout: Duration,
    },
    #[error("HTTP/1.1 handshake with the upstream failed: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("the upstream exchange failed: {0}")]
    Exchange(#[source] hyper::Error),
    #[error("the upstream exchange failed: {0}")]
    Lean(#[source] lean::ExchangeError),
}

pub struct Pool {
    authority: Authority,
    connect_timeout: Duration,
    idle: Vec<Mutex<Vec<Conn>>>,
    /// Sockets for requests without a body, per worker (see `lean_client`).
    lean: Vec<Arc<lean::Idle>>,
    /// One permit per open connection (see `max_connections_per_upstream`).
    slots: Arc<Semaphore>,
}

/// A connection and its place under the cap: dropped together.
type Conn = (SendRequest<UpstreamBody>, OwnedSemaphorePermit);

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("authority", &self.authority)
            .finish()
    }
}

/// An upstream's answer: its head, and a body that reads the connection.
pub enum Answer {
    /// hyper's, and the guard that puts its connection back once the body is done.
    Hyper(Response<Incoming>, Return),
    /// Read by the request's task; the body puts its connection back itself.
    Lean(Response<lean::Body>),
}

/// Puts the connection back in its worker's idle list when the response body
/// is done (dropped): only then can HTTP/1.1 carry the next request.
pub struct Return {
    pool: Arc<Pool>,
    slot: usize,
    sender: Option<Conn>,
}

impl Return {
    /// The connection was upgraded (101): it carries a tunnel now, never another request.
    pub fn discard(&mut self) {
        self.sender = None;
    }
}

impl Drop for Return {
    fn drop(&mut self) {
        if let Some(conn) = self.sender.take() {
            if !conn.0.is_closed() {
                let mut idle = self.pool.idle[self.slot].lock();
                if idle.len() < MAX_IDLE_PER_WORKER {
                    idle.push(conn);
                }
            }
        }
    }
}

impl Pool {
    /// One idle list per worker runtime (`workers` of them) and one for the
    /// runtime `run` was called on.
    pub fn new(authority: Authority, connect_timeout: Duration, workers: usize) -> Arc<Pool> {
        Arc::new(Pool {
            authority,
            connect_timeout,
            idle: (0..=workers).map(|_| Mutex::new(Vec::new())).collect(),
            lean: (0..=workers)
                .map(|_| lean::Idle::new(MAX_IDLE_PER_WORKER))
                .collect(),
            slots: Arc::new(Semaphore::new(max_connections_per_upstream())),
        })
    }

    /// Sends `req` (origin-form URI) on an idle connection of this worker, or
    /// a new one; returns the response head and a body that recycles the
    /// connection once it has been passed on. When no connection could be
    /// made, the request comes back untouched with the error, so a caller
    /// may send it to another server.
    pub async fn send(
        self: &Arc<Pool>,
        req: Request<UpstreamBody>,
        worker: usize,
        upgrade: bool,
    ) -> Result<Answer, Failed> {
        let slot = worker.min(self.idle.len() - 1);
        if !upgrade && http_body::Body::is_end_stream(req.body()) {
            return self.send_lean(req, slot).await;
        }
        self.send_hyper(req, slot).await
    }

    /// A request without a body, on a socket this task speaks to itself.
    async fn send_lean(
        self: &Arc<Pool>,
        req: Request<UpstreamBody>,
        slot: usize,
    ) -> Result<Answer, Failed> {
        loop {
            let Some(mut conn) = self.lean[slot].take() else {
                break;
            };
            if !conn.usable().await {
                continue;
            }
            match conn.exchange(&req).await {
                Ok(resp) => return Ok(Answer::Lean(resp)),
                // The upstream closed an idle connection as the request went
                // out: it saw no request, or (nothing read back) none it
                // answered, which only a method safe to repeat may assume.
                Err((lean::ExchangeError::Write(_), _)) => continue,
                Err((lean::ExchangeError::Closed, false)) if req.method().is_idempotent() => {
                    continue
                }
                Err((e, _)) => return Err((PoolError::Lean(e), None)),
            }
        }
        let permit = self.slot().await;
        let io = match self.connect_tcp().await {
            Ok(io) => io,
            Err(e) => return Err((e, Some(req))),
        };
        match lean::Conn::new(io, permit, self.lean[slot].clone())
            .exchange(&req)
            .await
        {
            Ok(resp) => Ok(Answer::Lean(resp)),
            Err((e, _)) => Err((PoolError::Lean(e), None)),
        }
    }

    /// A request with a body or an upgrade, through hyper's client.
    async fn send_hyper(
        self: &Arc<Pool>,
        mut req: Request<UpstreamBody>,
        slot: usize,
    ) -> Result<Answer, Failed> {
        loop {
            let Some((mut sender, permit)) = self.idle[slot].lock().pop() else {
                break;
            };
            // Ready now, or useless: a connection still busy with an abandoned
            // body, or closed by the upstream, is dropped.
            let ready = poll_fn(|cx| Poll::Ready(sender.poll_ready(cx))).await;
            if !matches!(ready, Poll::Ready(Ok(()))) {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(Answer::Hyper(resp, self.returner(slot, (sender, permit)))),
                Err(mut e) => match e.take_message() {
                    // The upstream closed it before our request went out: try another.
                    Some(unsent) => req = unsent,
                    None => return Err((PoolError::Exchange(e.into_error()), None)),
                },
            }
        }
        let permit = self.slot().await;
        let mut sender = match self.connect().await {
            Ok(sender) => sender,
            Err(e) => return Err((e, Some(req))),
        };
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| (PoolError::Exchange(e), None))?;
        Ok(Answer::Hyper(resp, self.returner(slot, (sender, permit))))
    }

    /// A place under the cap for one more connection.
    async fn slot(&self) -> OwnedSemaphorePermit {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return permit;
        }
        // At the cap: an idle connection another worker keeps is worth less
        // than this request; close one, or wait for a busy one.
        let lean = || self.lean.iter().find_map(|list| list.take()).map(drop);
        let hyper = || {
            self.idle
                .iter()
                .find_map(|list| list.lock().pop())
                .map(drop)
        };
        let _ = lean().or_else(hyper);
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    fn returner(self: &Arc<Pool>, slot: usize, sender: Conn) -> Return {
        Return {
            pool: self.clone(),
            slot,
            sender: Some(sender),
        }
    }

    /// A hyper client connection on a new socket, driven by a task of this worker.
    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, PoolError> {
        let stream = self.connect_tcp().await?;
        // Chunks read from the upstream are at most this big, which bounds
        // what a slow-reading client can make tollgate hold (see server.rs).
        let (sender, conn) = http1::Builder::new()
            .max_buf_size(UPSTREAM_READ_BUF)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(PoolError::Handshake)?;
        // Driven by this worker's runtime, next to the requests that use it;
        // `with_upgrades` lets a 101 answer hand the socket to a tunnel.
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    async fn connect_tcp(&self) -> Result<TcpStream, PoolError> {
        let authority = &self.authority;
        let host_port = match authority.port_u16() {
            Some(_) => authority.as_str().to_string(),
            None => format!("{}:80", authority.host()),
        };
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(host_port))
            .await
            .map_err(|_| PoolError::ConnectTimeout {
                authority: authority.clone(),
                timeout: self.connect_timeout,
            })?
            .map_err(|source| PoolError::Connect {
                authority: authority.clone(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

/// A send that failed: why, and the request when it never left.
pub type Failed = (PoolError, Option<Request<UpstreamBody>>);
