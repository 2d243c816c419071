//! Accept loops and connections: HTTP/1.1 and HTTP/2 (hyper-util auto), slow-client limits, graceful drain.
//!
//! Connections are spawned on a [`TaskTracker`] and told to finish by a
//! [`CancellationToken`]: on shutdown every listener stops accepting, every
//! connection finishes the request it is serving and closes, and the caller
//! waits for the tracker with the configured grace.

use std::convert::Infallible;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::{App, ConnInfo};

/// Request heads larger than this get 431 (hyper answers it while parsing).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// The HTTP settings of one connection, from the snapshot current when it was accepted.
pub fn connection_builder(request_header_timeout: Duration) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(request_header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
}

/// Accepts connections until `stop` is cancelled; each runs on `connections`
/// and drains when `drain` is cancelled.
pub async fn accept_loop(
    listener: TcpListener,
    app: App,
    proto: &'static str,
    stop: CancellationToken,
    drain: CancellationToken,
    connections: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let timeout = app.snapshot().config.server.request_header_timeout;
        let conn_info = ConnInfo { peer, proto };
        let app = app.clone();
        let drain = drain.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| {
                let app = app.clone();
                async move { Ok::<_, Infallible>(app.handle(req, conn_info).await) }
            });
            let builder = connection_builder(timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = drain.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
