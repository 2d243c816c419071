//! Idle HTTP/1.1 connections to a plain-http upstream, one list per worker thread.
//!
//! hyper-util's pooled client shares one pool between threads (a mutex and a
//! hashed pool key per request, and connections whose task may live on
//! another thread). Here each worker keeps its own idle list of hyper
//! `SendRequest` handles, so a request takes a connection its own thread
//! drives, with one uncontended lock and no hashing.

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

use crate::proxy::UpstreamBody;

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
}

pub struct Pool {
    authority: Authority,
    connect_timeout: Duration,
    idle: Vec<Mutex<Vec<SendRequest<UpstreamBody>>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("authority", &self.authority)
            .finish()
    }
}

/// Puts the connection back in its worker's idle list when the response body
/// is done (dropped): only then can HTTP/1.1 carry the next request.
pub struct Return {
    pool: Arc<Pool>,
    slot: usize,
    sender: Option<SendRequest<UpstreamBody>>,
}

impl Return {
    /// The connection was upgraded (101): it carries a tunnel now, never another request.
    pub fn discard(&mut self) {
        self.sender = None;
    }
}

impl Drop for Return {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            if !sender.is_closed() {
                let mut idle = self.pool.idle[self.slot].lock();
                if idle.len() < MAX_IDLE_PER_WORKER {
                    idle.push(sender);
                }
            }
        }
    }
}

impl Pool {
    pub fn new(authority: Authority, connect_timeout: Duration) -> Arc<Pool> {
        Arc::new(Pool {
            authority,
            connect_timeout,
            idle: (0..=crate::workers::count())
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
        })
    }

    /// Sends `req` (origin-form URI) on an idle connection of this worker, or
    /// a new one; returns the response head and the guard that recycles the
    /// connection once the body has been passed on. When no connection could
    /// be made, the request comes back untouched with the error, so a caller
    /// may send it to another server.
    pub async fn send(
        self: &Arc<Pool>,
        mut req: Request<UpstreamBody>,
    ) -> Result<(Response<Incoming>, Return), (PoolError, Option<Request<UpstreamBody>>)> {
        let slot = crate::workers::current().min(self.idle.len() - 1);
        loop {
            let Some(mut sender) = self.idle[slot].lock().pop() else {
                break;
            };
            // Ready now, or useless: a connection still busy with an abandoned
            // body, or closed by the upstream, is dropped.
            let ready = poll_fn(|cx| Poll::Ready(sender.poll_ready(cx))).await;
            if !matches!(ready, Poll::Ready(Ok(()))) {
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok((resp, self.returner(slot, sender))),
                Err(mut e) => match e.take_message() {
                    // The upstream closed it before our request went out: try another.
                    Some(unsent) => req = unsent,
                    None => return Err((PoolError::Exchange(e.into_error()), None)),
                },
            }
        }
        let mut sender = match self.connect().await {
            Ok(sender) => sender,
            Err(e) => return Err((e, Some(req))),
        };
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| (PoolError::Exchange(e), None))?;
        Ok((resp, self.returner(slot, sender)))
    }

    fn returner(self: &Arc<Pool>, slot: usize, sender: SendRequest<UpstreamBody>) -> Return {
        Return {
            pool: self.clone(),
            slot,
            sender: Some(sender),
        }
    }

    async fn connect(&self) -> Result<SendRequest<UpstreamBody>, PoolError> {
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
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
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
}
