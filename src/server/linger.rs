//! Lingering close (nginx's `lingering_close`): after an answer sent before the request body's end, the rest of the body is read and discarded, within bounds, before the socket closes.
//!
//! A socket closed with unread bytes in its receive buffer (or receiving
//! more after the close) is reset (RST), and a reset makes the client's
//! kernel or TLS library drop what it had not yet handed to the client,
//! the answer included. So a `413` (or a 429, a 401 …) sent while the
//! client is still uploading would often never be read: over TLS, Python's
//! `requests` lost it in 24 of 50 uploads of 3 MB against a 256 KiB limit.
//! Reading the rest first lets the client finish writing and read the answer.
//!
//! The socket is taken back from under hyper (and TLS) when hyper is done
//! with it: [`Lingering`] wraps the `TcpStream` and hands it to its
//! [`Handoff`] when dropped. What is read while lingering are raw bytes
//! (TLS records are not decrypted), at most [`MAX_DISCARD`] of them.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

pub use crate::config::LingeringConfig as Bounds;
use crate::metrics::{inc, Metrics};

/// The most bytes one connection discards while lingering: past it the
/// socket is closed (and reset). Time alone would let a fast client make us
/// read for `lingering_time` at line rate.
pub const MAX_DISCARD: u64 = 64 << 20;

/// The metric counting lingering closes, by how each ended.
pub const LINGERING_CLOSES: &str = "tollgate_lingering_closes_total";

/// How a lingering close ended: `eof` (the client finished and closed),
/// `reset` (the client closed with our close unread, as a TLS client that
/// never reads the `close_notify` does), `timeout` (`lingering_timeout`
/// without a byte), `time` (`lingering_time` in all), `size`
/// ([`MAX_DISCARD`]), `error` (the socket failed otherwise), `cut` (tollgate
/// shutting down, or the place given to a new connection).
pub const ENDS: [&str; 7] = ["eof", "reset", "timeout", "time", "size", "error", "cut"];

/// Where a connection's socket goes when hyper drops it, and whether the
/// last request on it may have left part of its body unread.
#[derive(Default)]
pub struct Handoff {
    stream: Mutex<Option<TcpStream>>,
    body_pending: AtomicBool,
}

impl Handoff {
    /// Notes, per HTTP/1.1 request, whether it carries a body: a body the
    /// answer does not wait for is what lingering is for. HTTP/2 needs none
    /// (a stream answered early is reset with `NO_ERROR`, the connection lives on).
    pub fn request_began(&self, req: &http::Request<hyper::body::Incoming>) {
        use http_body::Body as _;
        let pending = req.version() < http::Version::HTTP_2 && !req.body().is_end_stream();
        self.body_pending.store(pending, Ordering::Relaxed);
    }

    /// The socket back, when the last request had a body and hyper has let go of it.
    pub fn take(&self) -> Option<TcpStream> {
        if !self.body_pending.load(Ordering::Relaxed) {
            return None;
        }
        self.stream.lock().take()
    }
}

/// The client's socket, given to its [`Handoff`] when dropped.
pub struct Lingering {
    stream: Option<TcpStream>,
    handoff: Arc<Handoff>,
}

impl Lingering {
    pub fn new(stream: TcpStream, handoff: Arc<Handoff>) -> Lingering {
        Lingering {
            stream: Some(stream),
            handoff,
        }
    }

    fn stream(self: Pin<&mut Self>) -> Pin<&mut TcpStream> {
        // Some until dropped.
        Pin::new(self.get_mut().stream.as_mut().expect("a stream until drop"))
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            *self.handoff.stream.lock() = Some(stream);
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.stream().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }
}

/// Closes `stream` the lingering way: our side is shut (FIN, if hyper has
/// not), then what the client still sends is read and thrown away until it
/// closes, stays silent for `bounds.timeout`, `bounds.time` has passed,
/// [`MAX_DISCARD`] bytes were read, or `cut` resolves. Returns how it ended
/// (one of [`ENDS`]), which is also counted.
pub async fn close(
    mut stream: TcpStream,
    bounds: Bounds,
    metrics: &Metrics,
    cut: impl std::future::Future<Output = ()>,
) -> &'static str {
    let end = tokio::select! {
        end = discard(&mut stream, bounds) => end,
        _ = cut => "cut",
    };
    inc(&metrics.counter(LINGERING_CLOSES, &[("end", end)]));
    end
}

async fn discard(stream: &mut TcpStream, bounds: Bounds) -> &'static str {
    // Already shut by hyper on a clean close; a second shutdown is harmless.
    let _ = stream.shutdown().await;
    let deadline = tokio::time::Instant::now() + bounds.time;
    let mut scratch = vec![0u8; 16 * 1024];
    let mut discarded = 0u64;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return "time";
        }
        let wait = bounds.timeout.min(left);
        match tokio::time::timeout(wait, stream.read(&mut scratch)).await {
            Ok(Ok(0)) => return "eof",
            Ok(Ok(n)) => {
                discarded += n as u64;
                if discarded >= MAX_DISCARD {
                    return "size";
                }
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => return "reset",
            Ok(Err(_)) => return "error",
            Err(_) if wait < bounds.timeout => return "time",
            Err(_) => return "timeout",
        }
    }
}

/// Every end at zero, so the family is there from the first scrape.
pub fn start_at_zero(metrics: &Metrics) {
    for end in ENDS {
        metrics.counter(LINGERING_CLOSES, &[("end", end)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        (accepted.unwrap().0, client.unwrap())
    }

    const BOUNDS: Bounds = Bounds {
        time: Duration::from_secs(30),
        timeout: Duration::from_secs(5),
    };

    #[tokio::test]
    async fn a_client_that_finishes_its_body_and_closes_ends_the_linger_at_eof() {
        let (server, mut client) = pair().await;
        let writer = tokio::spawn(async move {
            client.write_all(&[b'x'; 100_000]).await.unwrap();
            client.shutdown().await.unwrap();
            let mut rest = Vec::new();
            // Our side was shut first: the client reads its end of the stream.
            client.read_to_end(&mut rest).await.unwrap();
        });
        let metrics = Metrics::default();
        let end = close(server, BOUNDS, &metrics, std::future::pending()).await;
        assert_eq!(end, "eof");
        writer.await.unwrap();
        let counted = metrics.counter(LINGERING_CLOSES, &[("end", "eof")]);
        assert_eq!(counted.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_closed_after_lingering_timeout() {
        let (server, _client) = pair().await;
        let end = close(server, BOUNDS, &Metrics::default(), std::future::pending()).await;
        assert_eq!(end, "timeout");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_keeps_sending_is_closed_after_lingering_time() {
        let (server, mut client) = pair().await;
        let _writer = tokio::spawn(async move {
            while client.write_all(b"more").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let bounds = Bounds {
            time: Duration::from_secs(3),
            timeout: Duration::from_millis(500),
        };
        let started = tokio::time::Instant::now();
        let end = close(server, bounds, &Metrics::default(), std::future::pending()).await;
        assert_eq!(end, "time");
        assert_eq!(started.elapsed().as_secs(), 3);
    }

    #[tokio::test]
    async fn a_linger_is_cut_when_asked() {
        let (server, _client) = pair().await;
        let end = close(server, BOUNDS, &Metrics::default(), async {}).await;
        assert_eq!(end, "cut");
    }

    #[tokio::test]
    async fn the_socket_reaches_the_handoff_only_after_a_request_with_a_body() {
        let (server, _client) = pair().await;
        let handoff = Arc::new(Handoff::default());
        drop(Lingering::new(server, handoff.clone()));
        assert!(handoff.take().is_none(), "no body: nothing to linger for");
        handoff.body_pending.store(true, Ordering::Relaxed);
        assert!(handoff.take().is_some());
    }
}
