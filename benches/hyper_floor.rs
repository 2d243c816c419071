//! The floor: the least a hyper 1.x forwarding proxy costs per request, to measure tollgate against.
//!
//! hyper's HTTP/1.1 server, one idle list of hyper HTTP/1.1 client
//! connections to the upstream per worker thread, the upstream's response
//! streamed back unchanged. No limiting, no header rewriting, no logging, no
//! metrics: whatever tollgate costs above this is tollgate's, and whatever
//! this costs above nginx is hyper's. The worker layout is tollgate's (one
//! current-thread runtime per worker), and so are the header-read timer and
//! Nagle off, so the difference is the proxy's own work.
//!
//! ```sh
//! cargo build --release --bench hyper_floor    # binary: target/release/deps/hyper_floor-<hash>
//! hyper_floor serve 127.0.0.1:19130 127.0.0.1:19080 [--workers 2] [--auto] [--inline] [--reject]
//! ```
//!
//! `--auto` serves with hyper-util's HTTP/1-or-2 auto builder (what tollgate
//! uses) instead of hyper's HTTP/1.1 one, to price the protocol sniffing.
//! `--inline` spawns no task per upstream connection: the `Connection` future
//! waits in the idle list next to its `SendRequest`, and the request's own
//! task polls it, with the exchange until the response head arrives, then
//! from the response body, to price the connection's own task (two task
//! wake-ups per request; docs/PERFORMANCE.md: no instructions to speak of).
//! `--reject` forwards nothing: every request is answered with one prebuilt
//! 429 carrying the headers and the body size of tollgate's 429 on
//! `bench/instructions.py`'s config (see [`reject_answer`]), so a hyper server
//! writing that answer is the floor tollgate's reject path is measured
//! against. Its headers are handed to hyper as a `HeaderMap` cloned per
//! response, as any hyper service must.
//! With no arguments, as `cargo test --all-targets` runs it, it forwards one
//! request through itself on port 0 (and asks the reject mode once) and
//! exits, so the floor cannot rot unnoticed; it serves only when told to.

use std::convert::Infallible;
use std::future::Future;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

/// One worker's idle upstream connections.
struct Pool {
    upstream: SocketAddr,
    idle: Mutex<Vec<Upstream>>,
    /// `--inline`: connections are driven by the requests that use them.
    inline: bool,
}

/// One upstream connection: the handle requests are sent on and, with
/// `--inline`, the connection future itself (otherwise a spawned task owns
/// it). Boxed: hyper's connection state is large and would be copied with
/// every response body that carries it (unboxed, even the spawned mode,
/// which carries `None`, measured +7 % instructions per request).
struct Upstream {
    sender: SendRequest<Incoming>,
    driver: Option<Pin<Box<Driver>>>,
}

/// hyper's HTTP/1 client connection: it writes the requests and reads the responses.
type Driver = Connection<TokioIo<TcpStream>, Incoming>;

impl Upstream {
    /// Polls the inline connection future, if any; false once it has ended
    /// (the upstream closed it, or it failed), and then it is gone.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = &mut self.driver else {
            return true;
        };
        if driver.as_mut().poll(cx).is_ready() {
            self.driver = None;
            return false;
        }
        true
    }
}

/// The upstream's body; its connection goes back to the idle list when the
/// body is done (dropped), the only time HTTP/1.1 can carry the next request.
/// An inline connection is polled from `poll_frame`: it is what reads the body.
struct Returning {
    body: Option<Incoming>,
    /// The body ended (`poll_frame` gave `None`).
    ended: bool,
    back: Option<(Upstream, Arc<Pool>)>,
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some((conn, pool)) = self.back.take() {
            // An inline connection whose body was not read to its end is
            // dropped: nobody would poll it to finish the read.
            let done = conn.driver.is_none()
                || self.ended
                || self.body.as_ref().is_none_or(Incoming::is_end_stream);
            if done && !conn.sender.is_closed() {
                if let Ok(mut idle) = pool.idle.lock() {
                    idle.push(conn);
                }
            }
        }
    }
}

impl Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let Some(body) = &mut this.body else {
            return Poll::Ready(None);
        };
        let mut polled = Pin::new(&mut *body).poll_frame(cx);
        if polled.is_pending() {
            if let Some((conn, _)) = &mut this.back {
                if conn.driver.is_some() {
                    // The connection reads the next chunk into the body.
                    if !conn.drive(cx) {
                        this.back = None;
                    }
                    polled = Pin::new(body).poll_frame(cx);
                }
            }
        }
        if matches!(polled, Poll::Ready(None)) {
            this.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Incoming::size_hint)
    }
}

impl Pool {
    async fn connect(&self) -> Result<Upstream, Box<dyn std::error::Error>> {
        let stream = TcpStream::connect(self.upstream).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        if self.inline {
            return Ok(Upstream {
                sender,
                driver: Some(Box::pin(conn)),
            });
        }
        tokio::spawn(conn);
        Ok(Upstream {
            sender,
            driver: None,
        })
    }

    /// An idle connection ready for a request. An inline one is polled once
    /// first: if that ends it, the upstream closed it and the next is tried.
    /// The poll registers no waker (the exchange's first poll, right after,
    /// registers this task), or sending the request would wake this task.
    fn take(&self) -> Option<Upstream> {
        loop {
            let mut conn = self.idle.lock().ok().and_then(|mut idle| idle.pop())?;
            let alive = conn.drive(&mut Context::from_waker(Waker::noop()));
            if alive && conn.sender.is_ready() {
                return Some(conn);
            }
        }
    }

    async fn forward(self: Arc<Pool>, req: Request<Incoming>) -> Response<Returning> {
        let conn = match self.take() {
            Some(conn) => Some(conn),
            None => self.connect().await.ok(),
        };
        let Some(mut conn) = conn else {
            return bad_gateway();
        };
        let mut sent = std::pin::pin!(conn.sender.send_request(req));
        let inline = conn.driver.is_some();
        // Inline, the connection writes the request and reads the response
        // head when polled here, on this task. The answer can arrive only
        // during that poll, so asking for it right after needs no waker of
        // its own (hyper's answer would wake this task once more).
        let answer = std::future::poll_fn(|cx| {
            if !inline {
                return sent.as_mut().poll(cx);
            }
            conn.drive(cx);
            sent.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        })
        .await;
        match answer {
            Ok(resp) => resp.map(|body| Returning {
                body: Some(body),
                ended: false,
                back: Some((conn, self)),
            }),
            Err(_) => bad_gateway(),
        }
    }
}

fn bad_gateway() -> Response<Returning> {
    let mut resp = Response::new(Returning {
        body: None,
        ended: false,
        back: None,
    });
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

/// One worker: a current-thread runtime accepting on its copy of the listener.
async fn worker(listener: TcpListener, upstream: SocketAddr, mode: Mode) {
    let pool = Arc::new(Pool {
        upstream,
        idle: Mutex::new(Vec::new()),
        inline: mode.inline,
    });
    let answer = Arc::new(reject_answer());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        if mode.reject {
            let answer = answer.clone();
            let service = service_fn(move |_req| {
                let resp = answer.respond();
                async move { Ok::<_, Infallible>(resp) }
            });
            tokio::spawn(serve(stream, service, mode));
            continue;
        }
        let pool = pool.clone();
        let service = service_fn(move |req| {
            let pool = pool.clone();
            async move { Ok::<_, Infallible>(pool.forward(req).await) }
        });
        tokio::spawn(serve(stream, service, mode));
    }
}

/// Serves one client connection with `service`, as tollgate does (or with
/// hyper's HTTP/1.1 builder, without `--auto`).
async fn serve<S, B>(stream: TcpStream, service: S, mode: Mode)
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let io = TokioIo::new(stream);
    let _ = if mode.auto {
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10));
        builder.serve_connection(io, service).await
    } else {
        hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10))
            .serve_connection(io, service)
            .await
            .map_err(Into::into)
    };
}

/// The `--reject` answer: tollgate's 429 on `bench/instructions.py`'s
/// config (limiter `reject`, 1 request per hour per IP), as one was seen on
/// the wire: the same header fields in the same order — hyper adds
/// `content-length` and `date` for both — and the same body, with a request
/// id as long as the bench's (the counter is 4 hex digits by then).
struct RejectAnswer {
    headers: http::HeaderMap,
    body: Bytes,
}

/// The header fields of tollgate's 429 (a repeated name is appended).
const REJECT_HEADERS: [(&str, &str); 11] = [
    ("content-type", "application/problem+json"),
    ("vary", "accept"),
    ("vary", "Accept-Encoding"),
    ("retry-after", "1241"),
    ("cache-control", "no-store"),
    ("x-ratelimit-limit", "1"),
    ("x-ratelimit-remaining", "0"),
    ("x-ratelimit-reset", "1796155200"),
    ("ratelimit-policy", "\"reject\";q=1;w=3600"),
    ("ratelimit", "\"reject\";r=0;t=1241"),
    ("x-request-id", "a36f3f0abf3e-a3c1"),
];

/// tollgate's 429 body (problem+json) on that config, byte for byte.
const REJECT_BODY: &str = concat!(
    r#"{"type":"rate-limit-exceeded","title":"Too Many Requests","status":429,"#,
    r#""detail":"Rate limit of 1 requests per 3600s exceeded for key 'ip:127.0.0.1'.","#,
    r#""limiter":"reject","limit":1,"window_seconds":3600,"retry_after":1241,"#,
    r#""violated-policies":["reject"],"request_id":"a36f3f0abf3e-a3c1"}"#
);

fn reject_answer() -> RejectAnswer {
    let mut headers = http::HeaderMap::with_capacity(REJECT_HEADERS.len());
    for (name, value) in REJECT_HEADERS {
        headers.append(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static(value),
        );
    }
    RejectAnswer {
        headers,
        body: Bytes::from_static(REJECT_BODY.as_bytes()),
    }
}

impl RejectAnswer {
    /// One response: the header map cloned (hyper takes it by value) and the body shared.
    fn respond(&self) -> Response<http_body_util::Full<Bytes>> {
        let mut resp = Response::new(http_body_util::Full::new(self.body.clone()));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        *resp.headers_mut() = self.headers.clone();
        resp
    }
}

/// How the floor serves: `--auto`, `--inline` and `--reject` (see the module doc).
#[derive(Debug, Clone, Copy)]
struct Mode {
    auto: bool,
    inline: bool,
    reject: bool,
}

/// Starts `workers` threads serving `listener`; they run until the process ends.
fn start(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    workers: usize,
    mode: Mode,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    for _ in 0..workers {
        let listener = listener.try_clone()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => worker(listener, upstream, mode).await,
                    Err(e) => eprintln!("hyper_floor: {e}"),
                }
            })
        });
    }
    Ok(())
}

/// An upstream that answers every request `ok\n`, for the self-check.
fn start_upstream() -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                    TokioIo::new(stream),
                    service_fn(|_req| async {
                        Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                            Bytes::from_static(b"ok\n"),
                        )))
                    }),
                ));
            }
        })
    });
    Ok(addr)
}

/// Two requests on one connection through the floor (the second reuses
/// the pooled upstream connection); panics unless both come back `ok` (or,
/// with `--reject`, both as the prebuilt 429).
fn self_check(mode: Mode) -> std::io::Result<()> {
    let upstream = start_upstream()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    start(listener, upstream, 1, mode)?;
    let mut client = std::net::TcpStream::connect(addr)?;
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    for _ in 0..2 {
        client.write_all(b"GET / HTTP/1.1\r\nHost: floor\r\n\r\n")?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        if mode.reject {
            let ends = reject_answer().body;
            while !answer.ends_with(&ends) {
                let n = client.read(&mut buf)?;
                assert!(n > 0, "the floor closed the connection: {answer:?}");
                answer.extend_from_slice(&buf[..n]);
            }
            assert!(
                answer.starts_with(b"HTTP/1.1 429 Too Many Requests\r\n"),
                "unexpected answer: {}",
                String::from_utf8_lossy(&answer)
            );
            continue;
        }
        while !answer.ends_with(b"\r\n\r\nok\n") {
            let n = client.read(&mut buf)?;
            assert!(n > 0, "the floor closed the connection: {answer:?}");
            answer.extend_from_slice(&buf[..n]);
        }
        assert!(
            answer.starts_with(b"HTTP/1.1 200 OK\r\n"),
            "unexpected answer: {}",
            String::from_utf8_lossy(&answer)
        );
    }
    println!("hyper_floor: answers ({mode:?})");
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = Mode {
        auto: args.iter().any(|a| a == "--auto"),
        inline: args.iter().any(|a| a == "--inline"),
        reject: args.iter().any(|a| a == "--reject"),
    };
    if args.first().map(String::as_str) != Some("serve") {
        // `cargo test --all-targets` / `cargo bench` without arguments.
        for (auto, inline, reject) in [
            (false, false, false),
            (true, false, false),
            (false, true, false),
            (true, false, true),
        ] {
            self_check(Mode {
                auto,
                inline,
                reject,
            })?;
        }
        return Ok(());
    }
    let usage =
        "usage: hyper_floor serve LISTEN_ADDR UPSTREAM_ADDR [--workers N] [--auto] [--inline] [--reject]";
    let parse = |i: usize| -> std::io::Result<SocketAddr> {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| std::io::Error::other(usage))
    };
    let (listen, upstream) = (parse(1)?, parse(2)?);
    let workers = match args.iter().position(|a| a == "--workers") {
        Some(i) => args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| std::io::Error::other(usage))?,
        None => 1,
    };
    start(
        std::net::TcpListener::bind(listen)?,
        upstream,
        workers,
        mode,
    )?;
    eprintln!("hyper_floor: {listen} -> {upstream}, {workers} worker(s), {mode:?}");
    loop {
        std::thread::park();
    }
}
