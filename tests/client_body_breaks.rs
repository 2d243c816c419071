//! A client body that breaks on its way to the upstream gets one answer, whichever the upstream: HTTP or FastCGI (php-fpm).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::php_fpm::PhpFpm;
use common::{status_of, Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An upgrade request's body streams to the upstream as it arrives (others
/// are read whole first): this one announces 1,000 bytes, sends 10 and
/// half-closes, so the body breaks after the upstream got the request.
const CUT_SHORT: &[u8] = b"POST /index.php HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\n\
Upgrade: websocket\r\nContent-Length: 1000\r\n\r\n0123456789";

/// Sends [`CUT_SHORT`], closes the sending side and reads the answer.
async fn send_cut_short(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(CUT_SHORT).await.unwrap();
    s.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn yaml(url: &str, extra: &str) -> String {
    format!(
        "upstreams:\n  app: {{ url: \"{url}\"{extra} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n"
    )
}

/// The answer is the client's 400, and no upstream error is counted.
async fn assert_the_clients_400(proxy: &Proxy, answer: &str) {
    assert_eq!(status_of(answer), 400, "{answer}");
    assert!(answer.contains("malformed or ended early"), "{answer}");
    let line = proxy.access.wait_lines(1).await.join("\n");
    assert!(line.contains("\" 400 "), "{line}");
    let metrics = proxy.metrics().await;
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_upstream_errors_total{") && !l.ends_with(" 0"))
        .collect();
    assert!(
        counted.is_empty(),
        "a broken client body is not the upstream's error: {counted:?}"
    );
}

#[tokio::test]
async fn a_body_cut_short_on_its_way_to_an_http_upstream_is_the_clients_400() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&yaml(&upstream.url(), "")).await;
    let answer = send_cut_short(proxy.addr).await;
    assert_the_clients_400(&proxy, &answer).await;
}

#[tokio::test]
async fn a_body_cut_short_on_its_way_to_php_fpm_is_the_same_400() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("index.php"),
        "<?php echo strlen(file_get_contents('php://input'));",
    )
    .unwrap();
    let fpm = PhpFpm::start(dir.path(), &root, 1, "");
    let url = format!("fastcgi://{}", fpm.socket.display());
    let extra = format!(", root: \"{}\"", root.display());
    let proxy = Proxy::start(&yaml(&url, &extra)).await;
    let answer = send_cut_short(proxy.addr).await;
    assert_the_clients_400(&proxy, &answer).await;
}
