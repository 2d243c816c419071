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
//! hyper_floor serve 127.0.0.1:19130 127.0.0.1:19080 [--workers 2] [--auto]
//! ```
//!
//! `--auto` serves with hyper-util's HTTP/1-or-2 auto builder (what tollgate
//! uses) instead of hyper's HTTP/1.1 one, to price the protocol sniffing.
//! With no arguments, as `cargo test --all-targets` runs it, it forwards one
//! request through itself on port 0 and exits, so the floor cannot rot
//! unnoticed; it serves only when told to.

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};

/// One worker's idle upstream connections.
struct Pool {
    upstream: SocketAddr,
    idle: Mutex<Vec<SendRequest<Incoming>>>,
}

/// The upstream's body; its connection goes back to the idle list when the
/// body is done (dropped), the only time HTTP/1.1 can carry the next request.
struct Returning {
    body: Option<Incoming>,
    back: Option<(SendRequest<Incoming>, Arc<Pool>)>,
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some((sender, pool)) = self.back.take() {
            if !sender.is_closed() {
                if let Ok(mut idle) = pool.idle.lock() {
                    idle.push(sender);
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
        match &mut self.body {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
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
    async fn connect(&self) -> Result<SendRequest<Incoming>, Box<dyn std::error::Error>> {
        let stream = TcpStream::connect(self.upstream).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(sender)
    }

    async fn forward(self: Arc<Pool>, req: Request<Incoming>) -> Response<Returning> {
        let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let sender = match idle {
            Some(sender) if sender.is_ready() => Some(sender),
            _ => self.connect().await.ok(),
        };
        let Some(mut sender) = sender else {
            return bad_gateway();
        };
        match sender.send_request(req).await {
            Ok(resp) => resp.map(|body| Returning {
                body: Some(body),
                back: Some((sender, self)),
            }),
            Err(_) => bad_gateway(),
        }
    }
}

fn bad_gateway() -> Response<Returning> {
    let mut resp = Response::new(Returning {
        body: None,
        back: None,
    });
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

/// One worker: a current-thread runtime accepting on its copy of the listener.
async fn worker(listener: TcpListener, upstream: SocketAddr, auto: bool) {
    let pool = Arc::new(Pool {
        upstream,
        idle: Mutex::new(Vec::new()),
    });
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let pool = pool.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let pool = pool.clone();
                async move { Ok::<_, Infallible>(pool.forward(req).await) }
            });
            let io = TokioIo::new(stream);
            let _ = if auto {
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
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
        });
    }
}

/// Starts `workers` threads serving `listener`; they run until the process ends.
fn start(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    workers: usize,
    auto: bool,
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
                    Ok(listener) => worker(listener, upstream, auto).await,
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
/// the pooled upstream connection); panics unless both come back `ok`.
fn self_check(auto: bool) -> std::io::Result<()> {
    let upstream = start_upstream()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    start(listener, upstream, 1, auto)?;
    let mut client = std::net::TcpStream::connect(addr)?;
    client.set_read_timeout(Some(Duration::from_secs(10)))?;
    for _ in 0..2 {
        client.write_all(b"GET / HTTP/1.1\r\nHost: floor\r\n\r\n")?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
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
    println!("hyper_floor: forwards (auto builder: {auto})");
    Ok(())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let auto = args.iter().any(|a| a == "--auto");
    if args.first().map(String::as_str) != Some("serve") {
        // `cargo test --all-targets` / `cargo bench` without arguments.
        self_check(false)?;
        return self_check(true);
    }
    let usage = "usage: hyper_floor serve LISTEN_ADDR UPSTREAM_ADDR [--workers N] [--auto]";
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
        auto,
    )?;
    eprintln!("hyper_floor: {listen} -> {upstream}, {workers} worker(s), auto builder: {auto}");
    loop {
        std::thread::park();
    }
}
