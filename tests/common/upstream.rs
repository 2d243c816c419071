//! Stub servers a proxy under test talks to: an HTTP upstream that describes each request, a recording TCP relay, a WebSocket echo.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What the stub upstream saw.
#[derive(Default)]
pub struct Seen {
    /// Connections accepted, open now, and the most ever open at once.
    pub accepted: AtomicUsize,
    pub open: AtomicUsize,
    pub max_open: AtomicUsize,
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    pub arrivals: Mutex<Vec<Instant>>,
    pub last_headers: Mutex<Option<hyper::HeaderMap>>,
}

impl Seen {
    /// Waits (at most 5 s) until a request is being served by the upstream.
    pub async fn wait_for_in_flight(&self) {
        let reached = super::eventually(Duration::from_secs(5), || async {
            self.in_flight.load(Ordering::SeqCst) > 0
        })
        .await;
        assert!(reached, "the request never reached the upstream");
    }
}

/// A real HTTP upstream on 127.0.0.1 port 0. It answers with JSON describing
/// the request; `/slow/<ms>` waits first, `/echo` streams the body back,
/// `/big/<bytes>` answers that many bytes.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    stop: CancellationToken,
}

impl Upstream {
    pub async fn start() -> Upstream {
        Upstream::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts on `addr` (a killed upstream's, to bring it back).
    pub async fn start_on(addr: SocketAddr) -> Upstream {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let stop = CancellationToken::new();
        let (s, st) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = st.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                s.accepted.fetch_add(1, Ordering::SeqCst);
                let now = s.open.fetch_add(1, Ordering::SeqCst) + 1;
                s.max_open.fetch_max(now, Ordering::SeqCst);
                let open = OpenConnection(s.clone());
                let seen = s.clone();
                let killed = st.clone();
                tokio::spawn(async move {
                    let _open = open;
                    let svc = service_fn(move |req| handle_upstream(seen.clone(), req));
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection(TokioIo::new(stream), svc);
                    // Killed: the socket closes mid-exchange, like a crashed server.
                    tokio::select! {
                        _ = conn => {}
                        _ = killed.cancelled() => {}
                    }
                });
            }
        });
        Upstream { addr, seen, stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and closes every open connection, like a crashed server.
    pub fn kill(&self) {
        self.stop.cancel();
    }

    pub fn accepted(&self) -> usize {
        self.seen.accepted.load(Ordering::SeqCst)
    }

    pub fn open(&self) -> usize {
        self.seen.open.load(Ordering::SeqCst)
    }

    pub fn max_open(&self) -> usize {
        self.seen.max_open.load(Ordering::SeqCst)
    }
}

struct OpenConnection(Arc<Seen>);
impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct InFlight(Arc<Seen>);
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) async fn handle_upstream(
    seen: Arc<Seen>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    seen.arrivals.lock().push(Instant::now());
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _guard = InFlight(seen.clone());
    *seen.last_headers.lock() = Some(req.headers().clone());
    let path = req.uri().path().to_string();
    if let Some(ms) = path
        .strip_prefix("/slow/")
        .and_then(|m| m.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(n) = path
        .strip_prefix("/big/")
        .and_then(|m| m.parse::<usize>().ok())
    {
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; n]))));
    }
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let version = format!("{:?}", req.version());
    let headers: serde_json::Map<String, serde_json::Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if path == "/echo" {
        return Ok(Response::new(Full::new(body)));
    }
    let json = serde_json::json!({
        "method": method, "uri": uri, "version": version, "headers": headers, "body_len": body.len(),
    });
    let mut resp = Response::new(Full::new(Bytes::from(json.to_string())));
    resp.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    resp.headers_mut()
        .insert("connection", "x-upstream-hop".parse().unwrap());
    resp.headers_mut()
        .insert("x-upstream-hop", "must-not-reach-client".parse().unwrap());
    Ok(resp)
}

/// The bytes one relayed connection carried towards the upstream.
pub type Recording = Arc<Mutex<Vec<u8>>>;

/// A TCP relay in front of an upstream that records, per connection, the exact
/// bytes tollgate sent: what a loosely-parsing backend would have read.
pub struct Tap {
    pub addr: SocketAddr,
    /// Client-to-upstream bytes, one entry per connection, in accept order.
    pub streams: Arc<Mutex<Vec<Recording>>>,
    stop: CancellationToken,
}

impl Tap {
    pub async fn start(target: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let streams: Arc<Mutex<Vec<Recording>>> = Arc::default();
        let stop = CancellationToken::new();
        let (all, st) = (streams.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let inbound = tokio::select! {
                    _ = st.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let record = Arc::new(Mutex::new(Vec::new()));
                all.lock().push(record.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut in_read, mut in_write) = inbound.into_split();
                    let (mut out_read, mut out_write) = outbound.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            match in_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    record.lock().extend_from_slice(&buf[..n]);
                                    if out_write.write_all(&buf[..n]).await.is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = out_write.shutdown().await;
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut out_read, &mut in_write).await;
                        let _ = in_write.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Tap {
            addr,
            streams,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What each upstream connection has carried so far.
    pub fn recorded(&self) -> Vec<Vec<u8>> {
        self.streams
            .lock()
            .iter()
            .map(|r| r.lock().clone())
            .collect()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
/// A WebSocket upstream on 127.0.0.1 port 0 that echoes every message and
/// counts the sessions it opened and saw closed.
pub struct WsEcho {
    pub addr: SocketAddr,
    pub opened: Arc<AtomicUsize>,
    pub closed: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl WsEcho {
    pub async fn start() -> WsEcho {
        use futures_util::{SinkExt, StreamExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (opened, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let stop = CancellationToken::new();
        let (o, c, st) = (opened.clone(), closed.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = st.cancelled() => return,
                    a = listener.accept() => match a { Ok((s, _)) => s, Err(_) => continue },
                };
                let (o, c) = (o.clone(), c.clone());
                tokio::spawn(async move {
                    let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                        return;
                    };
                    o.fetch_add(1, Ordering::SeqCst);
                    while let Some(Ok(msg)) = ws.next().await {
                        if msg.is_close() {
                            break;
                        }
                        if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                            break;
                        }
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        WsEcho {
            addr,
            opened,
            closed,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for WsEcho {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
