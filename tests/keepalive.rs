//! Kept-alive connections over real sockets: `idle_timeout` governs the wait between requests, `request_header_timeout` a head once it has started.

mod common;

use std::time::{Duration, Instant};

use common::{forward_all, Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A header timeout well below the idle timeout, so each is told apart;
/// both under a second, so no test waits a whole second on the clock.
const TIMEOUTS: &str = "server: { request_header_timeout: 300ms, idle_timeout: 1s }";

async fn get_on(s: &mut TcpStream, path: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Reads until the server closes the connection; how long that took.
async fn time_until_closed(s: &mut TcpStream) -> Duration {
    let started = Instant::now();
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut sink))
        .await
        .expect("the server closed the connection within 15 s")
        .ok();
    started.elapsed()
}

#[tokio::test]
async fn a_kept_alive_connection_idle_longer_than_the_header_timeout_still_serves_its_next_request()
{
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), TIMEOUTS)).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(get_on(&mut s, "/one").await.starts_with("HTTP/1.1 200"));
    // Twice the header timeout, within the idle timeout: the wait itself is the behaviour.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let answer = get_on(&mut s, "/two").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[tokio::test]
async fn a_kept_alive_connection_idle_past_idle_timeout_is_closed_as_idle() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), TIMEOUTS)).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(get_on(&mut s, "/one").await.starts_with("HTTP/1.1 200"));
    let took = time_until_closed(&mut s).await;
    assert!(
        took >= Duration::from_millis(900),
        "closed before idle_timeout: {took:?}"
    );
    assert_eq!(
        proxy
            .metric("tollgate_connections_closed_total{reason=\"idle\"}")
            .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn a_request_head_that_stalls_after_a_kept_alive_request_is_cut_at_the_header_timeout() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), TIMEOUTS)).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    assert!(get_on(&mut s, "/one").await.starts_with("HTTP/1.1 200"));
    // Idle for longer than the header timeout first: the head's timer starts with its first byte.
    tokio::time::sleep(Duration::from_millis(450)).await;
    s.write_all(b"GET /two HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let took = time_until_closed(&mut s).await;
    assert!(
        took >= Duration::from_millis(270),
        "cut before the header timeout: {took:?}"
    );
    // The idle timeout (1 s) is not what closed it.
    assert!(
        took < Duration::from_millis(900),
        "a stalled head was kept for {took:?}"
    );
    assert_eq!(
        proxy
            .metric("tollgate_connections_closed_total{reason=\"request_header_timeout\"}")
            .await,
        Some(1.0)
    );
}
