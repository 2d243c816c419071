//! Slow and large bodies over real sockets: buffering before the upstream, 408 for stalled or trickling bodies, spilled bodies byte-exact, slow readers cut off, HTTP/2's fair share of upstream connections, pooled upstream connections reused or replaced.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, Proxy, Upstream};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// tollgate in front of `upstream` on every path, with these `server:` settings.
fn config(upstream: &Upstream, server: &str) -> String {
    format!(
        "upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\nserver: {{ {server} }}\n",
        upstream.url()
    )
}

/// Reads what the server answers until it closes the connection, at most `limit`.
async fn answer_and_close(s: &mut TcpStream, limit: Duration) -> Option<String> {
    let mut out = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn a_trickling_body_never_reaches_the_upstream_before_its_last_byte() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "request_body_timeout: 5s")).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
        .await
        .unwrap();
    for piece in b"0123456789abcdefghi".chunks(2) {
        s.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            upstream.accepted(),
            0,
            "the upstream was connected to while the body trickled"
        );
    }
    s.write_all(b"j").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.ends_with("0123456789abcdefghij"),
        "the body arrived changed: {text}"
    );
    assert_eq!(upstream.accepted(), 1);
}

#[tokio::test]
async fn a_stalled_body_gets_408_within_the_timeout_and_the_connection_closes() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "request_body_timeout: 500ms")).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nfive!")
        .await
        .unwrap();
    let started = Instant::now();
    let out = answer_and_close(&mut s, Duration::from_secs(5))
        .await
        .expect("a stalled body was held for 5 s");
    let took = started.elapsed();
    assert_eq!(common::status_of(&out), 408, "{out}");
    assert!(out.contains("application/problem+json"), "{out}");
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_millis(2000),
        "answered after {took:?}, not about 500 ms"
    );
    assert_eq!(
        upstream.accepted(),
        0,
        "a stalled body reached the upstream"
    );
    assert_eq!(
        proxy.metric("tollgate_request_body_timeouts_total").await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_body_below_the_minimum_rate_gets_408_though_no_gap_is_long() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(
        &upstream,
        "request_body_timeout: 1s, request_body_min_rate: 1000",
    ))
    .await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    // 10 bytes every 200 ms (50 B/s): every gap is well under the 1 s timeout.
    let trickle = async {
        loop {
            if s.write_all(b"0123456789").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut buf = [0u8; 1024];
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await
            {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
        }
        String::new()
    };
    let out = tokio::time::timeout(Duration::from_secs(5), trickle)
        .await
        .expect("a body at 50 B/s was accepted for 5 s");
    let took = started.elapsed();
    assert_eq!(common::status_of(&out), 408, "{out}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(3000),
        "answered after {took:?}, not about 1 s"
    );
    assert_eq!(upstream.accepted(), 0);
}

#[tokio::test]
async fn a_body_larger_than_the_memory_buffer_is_spilled_and_arrives_byte_exact() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "request_body_buffer: 1KiB")).await;
    let body: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let resp = client()
        .post(proxy.url("/echo"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let echoed = resp.bytes().await.unwrap();
    assert_eq!(echoed.len(), body.len());
    assert!(echoed[..] == body[..], "the spilled body came back changed");
    assert_eq!(
        proxy.metric("tollgate_request_bodies_spilled_total").await,
        Some(1.0)
    );
    // A small one stays in memory.
    let small = client()
        .post(proxy.url("/echo"))
        .body("small")
        .send()
        .await
        .unwrap();
    assert_eq!(small.text().await.unwrap(), "small");
    assert_eq!(
        proxy.metric("tollgate_request_bodies_spilled_total").await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_chunked_body_over_max_request_body_gets_413_and_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(
        &upstream,
        "max_request_body: 1KiB, request_body_buffer: 512",
    ))
    .await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let chunk = vec![b'a'; 600];
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..2 {
        s.write_all(b"258\r\n").await.unwrap();
        s.write_all(&chunk).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
    }
    s.write_all(b"0\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    let out = String::from_utf8_lossy(&buf[..n]);
    assert_eq!(common::status_of(&out), 413, "{out}");
    assert_eq!(upstream.accepted(), 0);
}

#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected_and_its_upstream_connection_closes() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "send_timeout: 500ms")).await;
    // A small receive buffer, so the stall shows at once.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(proxy.addr).await.unwrap();
    s.write_all(b"GET /big/67108864 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.open() == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stalled = Instant::now();
    // Reading nothing: within the timeout plus a margin, the proxy gives up on
    // this client and the upstream connection behind it is closed.
    let deadline = stalled + Duration::from_secs(5);
    while upstream.open() > 0 {
        assert!(
            Instant::now() < deadline,
            "the upstream connection was still held 5 s after the client stopped reading"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = stalled.elapsed();
    assert!(
        took >= Duration::from_millis(400),
        "cut off early: {took:?}"
    );
    assert_eq!(
        proxy
            .metric("tollgate_connections_closed_total{reason=\"send_timeout\"}")
            .await,
        Some(1.0)
    );
    // The client's side is closed too: what it reads now ends.
    let mut sink = vec![0u8; 1 << 16];
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the slow reader's connection stayed open");
}

#[tokio::test]
async fn a_client_that_reads_slowly_but_steadily_gets_the_whole_response() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "send_timeout: 500ms")).await;
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(proxy.addr).await.unwrap();
    s.write_all(b"GET /big/1048576 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Never a pause as long as the timeout.
        tokio::time::sleep(Duration::from_millis(100)).await;
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => got += n,
            other => panic!("reading stopped after {got} bytes: {other:?}"),
        }
    }
    assert!(got > 1_048_576, "only {got} bytes arrived");
}

#[tokio::test]
async fn one_http2_connection_holds_at_most_its_share_of_upstream_connections() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "upstream_requests_per_connection: 4")).await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let streams: Vec<_> = (0..20)
        .map(|i| {
            let mut sender = sender.clone();
            let url = format!("http://{}/slow/200?stream={i}", proxy.addr);
            tokio::spawn(async move {
                let req = http::Request::get(url)
                    .body(http_body_util::Empty::<Bytes>::new())
                    .unwrap();
                let resp = sender.send_request(req).await.unwrap();
                let status = resp.status();
                resp.into_body().collect().await.unwrap();
                status
            })
        })
        .collect();
    for s in streams {
        assert_eq!(s.await.unwrap(), 200);
    }
    assert!(
        upstream.max_open() <= 4,
        "one HTTP/2 client made {} upstream connections",
        upstream.max_open()
    );
    assert!(
        upstream.max_open() >= 2,
        "the streams never ran side by side"
    );
    assert!(proxy.metric("tollgate_upstream_share_waits_total").await >= Some(1.0));
}

#[tokio::test]
async fn requests_one_after_another_share_one_upstream_connection_whatever_their_body_size() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "workers: 1")).await;
    let http = client();
    // Answers small, read in many pieces, and bodies sent up and echoed,
    // interleaved: each exchange hands the connection on to the next.
    for round in 0..2 {
        for path in ["/echo", "/big/3000000", "/echo", "/big/10"] {
            let resp = http.get(proxy.url(path)).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{path}");
            let want = path.strip_prefix("/big/").map_or(0, |n| n.parse().unwrap());
            assert_eq!(resp.bytes().await.unwrap().len(), want, "{path}");
        }
        let echoed = http
            .post(proxy.url("/echo"))
            .body(vec![b'y'; 200_000 + round])
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(echoed.len(), 200_000 + round);
    }
    assert_eq!(
        upstream.accepted(),
        1,
        "each finished exchange gives its connection back for the next"
    );
}

/// An upstream that answers one request per connection, as keep-alive, then
/// closes it; `closed` hears of each close.
async fn closing_after_one_answer() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed, heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let closed = closed.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
                drop(s);
                let _ = closed.send(());
            });
        }
    });
    (addr, heard)
}

#[tokio::test]
async fn an_upstream_that_closes_an_idle_connection_does_not_fail_the_next_request() {
    let (addr, mut closed) = closing_after_one_answer().await;
    let config = format!(
        "upstreams:\n  app: {{ url: \"http://{addr}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\nserver: {{ workers: 1 }}\n"
    );
    let proxy = Proxy::start(&config).await;
    let http = client();
    for round in 0..3 {
        let resp = http.get(proxy.url("/")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "request {round}");
        assert_eq!(resp.text().await.unwrap(), "ok", "request {round}");
        tokio::time::timeout(Duration::from_secs(5), closed.recv())
            .await
            .expect("the upstream closed its connection");
        // The close reaches tollgate's idle connection on loopback at once;
        // a moment more so the next request finds it closed, not closing.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
