//! Connection floods over real sockets: silent and idle connections, the total and per-address caps, HTTP/2 limits, Expect on a limited route.

mod common;

use common::T0;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{eventually, forward_all, Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::clock::ManualClock;

/// Reads until the server closes the connection; how long that took, or `None` after `limit`.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut sink = Vec::new();
    match tokio::time::timeout(limit, s.read_to_end(&mut sink)).await {
        Ok(_) => Some(started.elapsed()),
        Err(_) => None,
    }
}

async fn get_on(s: &mut TcpStream, path: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn a_connection_that_never_sends_a_byte_is_closed_after_request_header_timeout() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { request_header_timeout: 500ms, idle_timeout: 60s }",
    ))
    .await;
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let took = closed_within(&mut silent, Duration::from_secs(5))
        .await
        .expect("a silent connection was kept for 5 s");
    assert!(took >= Duration::from_millis(400), "closed early: {took:?}");
    assert_eq!(
        proxy
            .metric("tollgate_connections_closed_total{reason=\"no_request\"}")
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_idle_timeout() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { request_header_timeout: 10s, idle_timeout: 1s }",
    ))
    .await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(get_on(&mut s, "/one").await.starts_with("HTTP/1.1 200"));
    // Kept alive between requests shorter apart than the idle timeout (with
    // 800 ms to spare for a loaded machine's scheduler).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(get_on(&mut s, "/two").await.starts_with("HTTP/1.1 200"));
    let took = closed_within(&mut s, Duration::from_secs(5))
        .await
        .expect("an idle connection was kept for 5 s");
    // Counted from after the answer was read, so a little under the timeout.
    assert!(took >= Duration::from_millis(800), "closed early: {took:?}");
    assert_eq!(
        proxy
            .metric("tollgate_connections_closed_total{reason=\"idle\"}")
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn an_idle_http2_connection_gets_goaway_after_idle_timeout() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { request_header_timeout: 10s, idle_timeout: 500ms }",
    ))
    .await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let driver = tokio::spawn(conn);
    let req = http::Request::get(format!("http://{}/h2", proxy.addr))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    tokio::time::timeout(Duration::from_secs(5), driver)
        .await
        .expect("an idle HTTP/2 connection was kept for 5 s")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));
}

/// Opens `n` connections that each sent part of a request head (so they are
/// neither silent nor idle), and checks each was accepted.
async fn held_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    held
}

#[tokio::test]
async fn past_max_connections_with_every_connection_busy_a_new_one_is_closed_and_the_admin_api_still_answers(
) {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { max_connections: 3, request_header_timeout: 30s }\nidentity: { trusted_proxies: [127.0.0.0/8] }",
    ))
    .await;
    // Each with a request in flight: a connection that waits for nothing
    // would be displaced by the fourth (tests/connection_cap.rs).
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(b"GET /slow/600000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            upstream
                .seen
                .in_flight
                .load(std::sync::atomic::Ordering::SeqCst)
                == 3
        })
        .await,
        "three requests never reached the upstream"
    );
    let mut fourth = TcpStream::connect(proxy.addr).await.unwrap();
    let _ = fourth.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(
        closed_within(&mut fourth, Duration::from_secs(2))
            .await
            .is_some(),
        "the fourth connection was served"
    );
    // The admin listener is not capped: it answered `metric` above and answers now.
    assert_eq!(
        proxy
            .metric("tollgate_connections_refused_total{reason=\"max_connections\"}")
            .await,
        Some(1.0)
    );
    // A closed connection frees its place.
    drop(held.pop());
    let served = || async {
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(2), async {
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await?;
            let mut buf = [0u8; 12];
            s.read_exact(&mut buf).await.map(|_| buf)
        })
        .await;
        matches!(answered, Ok(Ok(_)))
    };
    assert!(
        eventually(Duration::from_secs(5), served).await,
        "no place was freed"
    );
}

#[tokio::test]
async fn one_address_cannot_hold_more_than_max_connections_per_ip_unless_it_is_a_trusted_proxy() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { max_connections_per_ip: 2, request_header_timeout: 30s }",
    ))
    .await;
    let _held = held_connections(proxy.addr, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(proxy.addr).await.unwrap();
    let _ = third.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), third.read_to_end(&mut out)).await;
    assert!(out.is_empty(), "the third connection was served");
    assert_eq!(
        proxy
            .metric("tollgate_connections_refused_total{reason=\"max_connections_per_ip\"}")
            .await,
        Some(1.0)
    );

    // Behind a load balancer every client shares its address: a trusted proxy is not capped.
    let trusted = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { max_connections_per_ip: 2, request_header_timeout: 30s }\nidentity: { trusted_proxies: [127.0.0.0/8] }",
    ))
    .await;
    let _held = held_connections(trusted.addr, 2).await;
    let mut third = TcpStream::connect(trusted.addr).await.unwrap();
    assert!(get_on(&mut third, "/").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn expect_100_continue_on_a_limited_route_gets_its_429_without_a_continue() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "upstreams:\n  app: {{ url: \"{}\" }}\nlimiters:\n  once: {{ algorithm: fixed_window, limit: 1, window: 60s, key: client }}\nroutes:\n  - {{ name: limited, match: {{ path_prefix: / }}, upstream: app, limiters: [once] }}\n",
        upstream.url()
    );
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let expect =
        b"POST /upload HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";

    // Admitted: the client is told to go on, and its body arrives.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(expect).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100 Continue"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    s.write_all(b"hello").await.unwrap();
    let mut answer = String::from_utf8_lossy(&buf[..n]).into_owned();
    while !answer.contains("\"body_len\":5") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the answer: {answer}");
        answer.push_str(&String::from_utf8_lossy(&buf[..n]));
    }

    // Refused: a 429 straight away, no 100 Continue, and the body is never asked for.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(expect).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(!answer.contains("100 Continue"), "{answer}");
    assert_eq!(
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

/// One HTTP/2 frame: 9-byte header and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

#[tokio::test]
async fn an_http2_rapid_reset_flood_gets_goaway_and_the_connection_closed() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(0x4, 0, 0, &[]));
    // GET / on :authority x (HPACK: static indexes, one literal), never ended,
    // each cancelled at once: CVE-2023-44487.
    let block = [0x82, 0x86, 0x84, 0x01, 0x01, b'x'];
    for i in 0..2000u32 {
        let stream = 2 * i + 1;
        out.extend(h2_frame(0x1, 0x4, stream, &block));
        out.extend(h2_frame(0x3, 0, stream, &8u32.to_be_bytes()));
    }
    // The server may close while we still write: that is the point.
    let _ = s.write_all(&out).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the connection was kept open");
    // Somewhere in what came back is a GOAWAY frame (type 7).
    let mut at = 0;
    let mut goaway = false;
    while at + 9 <= got.len() {
        let len = (usize::from(got[at]) << 16)
            | (usize::from(got[at + 1]) << 8)
            | usize::from(got[at + 2]);
        if got[at + 3] == 0x7 && at + 17 <= got.len() {
            let code = &got[at + 13..at + 17];
            // ENHANCE_YOUR_CALM: refused as a flood, not as a malformed frame.
            assert_eq!(code, [0, 0, 0, 0xb], "GOAWAY with another error code");
            goaway = true;
        }
        at += 9 + len;
    }
    assert!(goaway, "no GOAWAY in {} bytes", got.len());
    assert!(
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
            < 2000,
        "every cancelled stream was still forwarded"
    );
}
