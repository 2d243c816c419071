//! Idle HTTP/1.1 connections to a plain-http upstream, one list per worker thread.
//!
//! hyper-util's pooled client shares one pool between threads (a mutex and a
//! hashed pool key per request, and connections whose task may live on
//! another thread). Here each worker keeps its own idle list, so a request
//! takes a connection its own thread drives, with one uncontended lock and
//! no hashing: sockets the request's task speaks to itself (see
//! `lean_client`). A request asking for an upgrade goes through hyper's
//! client on a connection of its own, which a tunnel then takes over.

use std::sync::Arc;
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
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
    /// Each worker's idle sockets (see `lean_client`).
    lean: Vec<Arc<lean::Idle>>,
    /// One permit per open connection (see `max_connections_per_upstream`).
    slots: Arc<Semaphore>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("authority", &self.authority)
            .finish()
    }
}

/// An upstream's answer: its head, and a body that reads the connection.
pub enum Answer {
    /// hyper's, to an upgrade request, and what must live as long as its
    /// body (or until its tunnel takes the socket).
    Hyper(Response<Incoming>, Held),
    /// Read by the request's task; the body puts its connection back itself.
    Lean(Response<lean::Body>),
}

/// An upgrade's hyper connection and its place under the cap, kept until
/// the answer's body is done: a connection whose upstream refused the
/// upgrade carries no other request, and closes then.
pub type Held = (SendRequest<UpstreamBody>, OwnedSemaphorePermit);

impl Pool {
    /// One idle list per worker runtime (`workers` of them) and one for the
    /// runtime `run` was called on.
    pub fn new(authority: Authority, connect_timeout: Duration, workers: usize) -> Arc<Pool> {
        Arc::new(Pool {
            authority,
            connect_timeout,
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
        if upgrade {
            return self.send_upgrade(req).await;
        }
        let slot = worker.min(self.lean.len() - 1);
        self.send_lean(req, slot).await
    }

    /// A request on a socket this task speaks to itself.
    async fn send_lean(
        self: &Arc<Pool>,
        mut req: Request<UpstreamBody>,
        slot: usize,
    ) -> Result<Answer, Failed> {
        loop {
            let Some(mut conn) = self.lean[slot].take() else {
                break;
            };
            if !conn.usable().await {
                continue;
            }
            match conn.exchange(&mut req).await {
                Ok(resp) => return Ok(Answer::Lean(resp)),
                // The upstream closed an idle connection as the request
                // went out, and the request can go again (see `exchange`).
                Err((_, true)) => continue,
                Err((e, false)) => return Err((PoolError::Lean(e), None)),
            }
        }
        let permit = self.slot().await;
        let io = match self.connect_tcp().await {
            Ok(io) => io,
            Err(e) => return Err((e, Some(req))),
        };
        match lean::Conn::new(io, permit, self.lean[slot].clone())
            .exchange(&mut req)
            .await
        {
            Ok(resp) => Ok(Answer::Lean(resp)),
            Err((e, _)) => Err((PoolError::Lean(e), None)),
        }
    }

    /// A request asking for an upgrade, through hyper's client on a new
    /// connection: if the upstream agrees, the tunnel takes the socket.
    async fn send_upgrade(self: &Arc<Pool>, req: Request<UpstreamBody>) -> Result<Answer, Failed> {
        let permit = self.slot().await;
        let mut sender = match self.connect().await {
            Ok(sender) => sender,
            Err(e) => return Err((e, Some(req))),
        };
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| (PoolError::Exchange(e), None))?;
        Ok(Answer::Hyper(resp, (sender, permit)))
    }

    /// A place under the cap for one more connection.
    async fn slot(&self) -> OwnedSemaphorePermit {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return permit;
        }
        // At the cap: an idle connection another worker keeps is worth less
        // than this request; close one, or wait for a busy one.
        drop(self.lean.iter().find_map(|list| list.take()));
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
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
