//! Upgraded connections (WebSockets): detecting an upgrade request and piping bytes both ways until close, idle timeout or shutdown.
//!
//! A tunnel outlives the HTTP exchange that opened it, so hyper's graceful
//! shutdown no longer sees it: [`Tunnels`] tracks every open one, and `run`
//! closes them once the shutdown grace period is over. Whatever the request
//! held while it was served (concurrency slots, the upstream server's
//! `max_conns` place) is moved into the tunnel and released when it closes.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::header_value::lists;

/// Bytes read from one side before they are written to the other.
const BUFFER: usize = 16 * 1024;

/// The `Upgrade` value of an HTTP/1.1 upgrade request (`Connection: upgrade`
/// plus `Upgrade: <protocol>`). `h2c` is never passed on: tollgate speaks
/// HTTP/2 to clients itself, and an upstream must not switch a shared hop.
pub fn requested_upgrade(headers: &HeaderMap) -> Option<HeaderValue> {
    // `Upgrade` first: nearly every request has none, and this is asked a
    // few times per request, so one lookup answers it, not two.
    let upgrade = headers.get(header::UPGRADE)?;
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| lists(v, &["upgrade"]));
    // An `Upgrade` that is not visible ASCII is refused as h2c would be.
    let h2c = upgrade.to_str().is_err() || lists(upgrade, &["h2c"]);
    (asks && !h2c).then(|| upgrade.clone())
}

/// The client's side of an upgrade: the connection hyper hands over once
/// the answer is sent, and whether it came as an HTTP/2 extended CONNECT.
pub struct ClientSide {
    on: OnUpgrade,
    h2: bool,
}

/// Takes the client's side of an upgrade request off `req`. An HTTP/2
/// WebSocket (RFC 8441: `CONNECT` with `:protocol websocket`) is rewritten
/// into the HTTP/1.1 handshake the upstream expects (`GET`, `Upgrade`, a
/// fresh `Sec-WebSocket-Key`), so routes and limits see it as the same GET.
pub fn client_side<B>(req: &mut Request<B>) -> Option<ClientSide> {
    if req.version() == Version::HTTP_2 {
        let websocket = req.method() == Method::CONNECT
            && req
                .extensions()
                .get::<hyper::ext::Protocol>()
                .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"));
        if !websocket {
            return None;
        }
        *req.method_mut() = Method::GET;
        let h = req.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::SEC_WEBSOCKET_KEY, fresh_key());
        return Some(ClientSide {
            on: hyper::upgrade::on(req),
            h2: true,
        });
    }
    requested_upgrade(req.headers())?;
    Some(ClientSide {
        on: hyper::upgrade::on(req),
        h2: false,
    })
}

impl ClientSide {
    /// Turns the upstream's 101 into the answer this client expects: as is
    /// over HTTP/1.1; `200` without the handshake headers over HTTP/2.
    pub fn answer<B>(&self, resp: &mut Response<B>) {
        if self.h2 {
            *resp.status_mut() = StatusCode::OK;
            let h = resp.headers_mut();
            h.remove(header::UPGRADE);
            h.remove(header::CONNECTION);
            h.remove(header::SEC_WEBSOCKET_ACCEPT);
        }
    }
}

/// A `Sec-WebSocket-Key`: 16 unpredictable bytes, base64. It is a nonce of
/// the handshake between tollgate and the upstream, not a secret.
fn fresh_key() -> HeaderValue {
    use std::hash::BuildHasher;
    let state = std::collections::hash_map::RandomState::new();
    let a = state.hash_one(std::time::SystemTime::now());
    let b = state.hash_one(a);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_le_bytes());
    bytes[8..].copy_from_slice(&b.to_le_bytes());
    HeaderValue::from_str(&base64(&bytes)).expect("base64 is a valid header value")
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Every open tunnel, and the signal that closes them all.
#[derive(Debug, Default)]
pub struct Tunnels {
    tracker: TaskTracker,
    close: CancellationToken,
}

impl Tunnels {
    /// Opens a tunnel between the client's and the upstream's upgraded
    /// connections once both are ready; `guard` is dropped when it closes.
    pub fn open<G: Send + 'static>(
        &self,
        client: ClientSide,
        upstream: OnUpgrade,
        idle: Duration,
        guard: G,
    ) {
        let close = self.close.clone();
        self.tracker.spawn(async move {
            let _guard = guard;
            let (client, upstream) = match tokio::try_join!(client.on, upstream) {
                Ok(both) => both,
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade did not complete");
                    return;
                }
            };
            let (client, upstream): (TokioIo<Upgraded>, TokioIo<Upgraded>) =
                (TokioIo::new(client), TokioIo::new(upstream));
            match pipe(client, upstream, idle, close).await {
                Ok(end) => tracing::debug!(?end, "tunnel closed"),
                Err(e) => tracing::debug!(error = %e, "tunnel ended with an error"),
            }
        });
    }

    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits until every tunnel has closed by itself (at shutdown: tunnels
    /// opened meanwhile are still tracked and waited for).
    pub async fn wait(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Closes every tunnel (shutdown, after the grace period) and waits for them to let go.
    pub async fn close_all(&self) {
        self.close.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// Why a tunnel ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Both sides closed their half.
    Closed,
    /// No byte either way for the idle timeout.
    Idle,
    /// The proxy is shutting down.
    Shutdown,
}

/// Copies bytes both ways until both sides have closed, nothing moved for
/// `idle`, or `close` fires. A side's end of stream is passed on as a
/// half-close, so the other side can still answer.
pub async fn pipe<A, B>(
    a: A,
    b: B,
    idle: Duration,
    close: CancellationToken,
) -> std::io::Result<End>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let mut a_buf = vec![0u8; BUFFER];
    let mut b_buf = vec![0u8; BUFFER];
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        tokio::select! {
            n = a_read.read(&mut a_buf), if a_open => {
                let n = n?;
                if n == 0 {
                    a_open = false;
                    b_write.shutdown().await?;
                } else {
                    b_write.write_all(&a_buf[..n]).await?;
                    b_write.flush().await?;
                }
            }
            n = b_read.read(&mut b_buf), if b_open => {
                let n = n?;
                if n == 0 {
                    b_open = false;
                    a_write.shutdown().await?;
                } else {
                    a_write.write_all(&b_buf[..n]).await?;
                    a_write.flush().await?;
                }
            }
            _ = tokio::time::sleep(idle) => return Ok(End::Idle),
            _ = close.cancelled() => return Ok(End::Shutdown),
        }
    }
    Ok(End::Closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn an_upgrade_needs_both_connection_upgrade_and_an_upgrade_header() {
        let ws = headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        assert_eq!(requested_upgrade(&ws).unwrap(), "websocket");
        assert!(requested_upgrade(&headers(&[("upgrade", "websocket")])).is_none());
        assert!(requested_upgrade(&headers(&[("connection", "upgrade")])).is_none());
    }

    #[test]
    fn a_key_is_sixteen_bytes_of_base64() {
        assert_eq!(
            base64(b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"),
            "AAECAwQFBgcICQoLDA0ODw=="
        );
        assert_eq!(base64(b"foob"), "Zm9vYg==");
        assert_eq!(base64(b"fooba"), "Zm9vYmE=");
        assert_eq!(fresh_key().len(), 24);
        assert_ne!(fresh_key(), fresh_key());
    }

    #[test]
    fn an_h2c_upgrade_is_never_passed_on() {
        let h2c = headers(&[("connection", "upgrade"), ("upgrade", "h2c")]);
        assert!(requested_upgrade(&h2c).is_none());
    }

    #[tokio::test]
    async fn a_tunnel_carries_bytes_both_ways_and_passes_half_closes_on() {
        let (client, mut client_far) = tokio::io::duplex(64);
        let (upstream, mut upstream_far) = tokio::io::duplex(64);
        let task = tokio::spawn(pipe(
            client,
            upstream,
            Duration::from_secs(30),
            CancellationToken::new(),
        ));
        client_far.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        upstream_far.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        upstream_far.write_all(b"pong").await.unwrap();
        client_far.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        client_far.shutdown().await.unwrap();
        assert_eq!(upstream_far.read(&mut buf).await.unwrap(), 0);
        upstream_far.shutdown().await.unwrap();
        assert_eq!(task.await.unwrap().unwrap(), End::Closed);
    }

    #[tokio::test]
    async fn a_silent_tunnel_closes_after_the_idle_timeout() {
        let (client, _client_far) = tokio::io::duplex(64);
        let (upstream, _upstream_far) = tokio::io::duplex(64);
        let end = pipe(
            client,
            upstream,
            Duration::from_millis(50),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(end, End::Idle);
    }

    #[tokio::test]
    async fn a_tunnel_closes_when_shutdown_says_so() {
        let (client, _client_far) = tokio::io::duplex(64);
        let (upstream, _upstream_far) = tokio::io::duplex(64);
        let close = CancellationToken::new();
        close.cancel();
        let end = pipe(client, upstream, Duration::from_secs(60), close)
            .await
            .unwrap();
        assert_eq!(end, End::Shutdown);
    }
}
