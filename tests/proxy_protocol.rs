//! The PROXY protocol on real sockets: from a listed peer the header's source is the client (limits, `X-Forwarded-For`, FastCGI `REMOTE_ADDR`, TLS behind it); a connection without one is closed; an unlisted peer's header is not believed; a slow or oversized header is cut off.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::php_fpm::PhpFpm;
use common::{Proxy, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `127.0.0.1` (the tests' own address) is the listed load balancer.
fn yaml(listed: &str, upstream: &str) -> String {
    format!(
        "log: {{ format: json }}\nserver:\n  proxy_protocol: [{listed}]\n  request_header_timeout: 300ms\nlimiters:\n  per_ip: {{ limit: 1, window: 60s, key: ip }}\nupstreams:\n  app: {{ url: \"{upstream}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app, limiters: [per_ip] }}\n"
    )
}

fn v1(source: &str) -> Vec<u8> {
    let family = if source.contains(':') { "TCP6" } else { "TCP4" };
    let dest = if source.contains(':') {
        "::1"
    } else {
        "127.0.0.1"
    };
    format!("PROXY {family} {source} {dest} 40000 80\r\n").into_bytes()
}

/// A v2 PROXY header for an IPv6 source, with TLVs (an AWS endpoint id, a NOOP) to skip.
fn v2(source: std::net::Ipv6Addr) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend([0x21, 0x21]);
    let tlvs = [0xEA, 0, 5, 1, b'v', b'p', b'c', b'e', 0x04, 0, 0];
    h.extend(((36 + tlvs.len()) as u16).to_be_bytes());
    h.extend(source.octets());
    h.extend(std::net::Ipv6Addr::LOCALHOST.octets());
    h.extend([0x9c, 0x40, 0, 80]);
    h.extend(tlvs);
    h
}

/// Opens a connection, sends `header` then one request, returns what came back
/// (empty when the connection was closed without an answer).
async fn exchange(addr: SocketAddr, header: &[u8], path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut bytes = header.to_vec();
    bytes.extend(format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes());
    s.write_all(&bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn forwarded_for(up: &Upstream) -> String {
    let headers = up
        .seen
        .last_headers
        .lock()
        .clone()
        .expect("a request reached the upstream");
    headers["x-forwarded-for"].to_str().unwrap().to_string()
}

#[tokio::test]
async fn the_headers_source_is_the_client_for_limits_and_forwarding() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&yaml("127.0.0.0/8", &up.url())).await;
    assert!(exchange(proxy.addr, &v1("203.0.113.9"), "/")
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(forwarded_for(&up), "203.0.113.9");
    assert!(
        exchange(proxy.addr, &v1("198.51.100.7"), "/")
            .await
            .starts_with("HTTP/1.1 200"),
        "limits count per source"
    );
    assert!(exchange(proxy.addr, &v1("203.0.113.9"), "/")
        .await
        .starts_with("HTTP/1.1 429"));
    let source: std::net::Ipv6Addr = "2001:db8::7".parse().unwrap();
    assert!(exchange(proxy.addr, &v2(source), "/")
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(forwarded_for(&up), "2001:db8::7");
    let records = proxy.access.wait_records(4).await;
    assert_eq!(records[0]["ip"], "203.0.113.9", "{records:?}");
    let accepted = |v: &str| format!("tollgate_proxy_protocol_accepted_total{{version=\"{v}\"}}");
    assert_eq!(proxy.metric(&accepted("1")).await, Some(3.0));
    assert_eq!(proxy.metric(&accepted("2")).await, Some(1.0));
}

#[tokio::test]
async fn local_and_unknown_headers_leave_the_balancer_as_the_client() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&yaml("127.0.0.0/8", &up.url())).await;
    assert!(exchange(proxy.addr, b"PROXY UNKNOWN\r\n", "/")
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(forwarded_for(&up), "127.0.0.1");
    // v2 LOCAL (the balancer's own health check), addresses ignored.
    let mut local = v2("2001:db8::7".parse().unwrap());
    local[12] = 0x20;
    assert!(
        exchange(proxy.addr, &local, "/")
            .await
            .starts_with("HTTP/1.1 429"),
        "the balancer's own count"
    );
}

#[tokio::test]
async fn a_listed_peer_without_a_valid_header_is_closed_and_counted() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&yaml("127.0.0.0/8", &up.url())).await;
    assert_eq!(
        exchange(proxy.addr, b"", "/").await,
        "",
        "a bare request gets no answer"
    );
    assert_eq!(exchange(proxy.addr, b"PROXY TCP4 1.2.3\r\n", "/").await, "");
    let mut huge = v2("2001:db8::7".parse().unwrap());
    huge[14..16].copy_from_slice(&u16::MAX.to_be_bytes());
    assert_eq!(
        exchange(proxy.addr, &huge, "/").await,
        "",
        "a header announcing 64 KiB"
    );
    assert_eq!(up.seen.requests.load(Ordering::SeqCst), 0);
    let refused = |r: &str| format!("tollgate_proxy_protocol_refused_total{{reason=\"{r}\"}}");
    assert_eq!(proxy.metric(&refused("missing")).await, Some(1.0));
    assert_eq!(proxy.metric(&refused("invalid")).await, Some(1.0));
    assert_eq!(proxy.metric(&refused("too_long")).await, Some(1.0));
}

#[tokio::test]
async fn a_header_that_never_ends_is_cut_at_the_head_budget() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&yaml("127.0.0.0/8", &up.url())).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"PROXY TCP4 203.0.113.9 ").await.unwrap();
    let mut out = Vec::new();
    // request_header_timeout is 300ms: the close comes well within this bound.
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    assert!(matches!(closed, Ok(Ok(0))), "{closed:?}");
    let timeouts = proxy
        .metric("tollgate_proxy_protocol_refused_total{reason=\"timeout\"}")
        .await;
    assert_eq!(timeouts, Some(1.0));
}

#[tokio::test]
async fn an_unlisted_peers_header_is_never_believed() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&yaml("10.0.0.0/8", &up.url())).await;
    let answer = exchange(proxy.addr, &v1("203.0.113.9"), "/").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(up.seen.requests.load(Ordering::SeqCst), 0);
    // Without a header it is an ordinary client.
    assert!(exchange(proxy.addr, b"", "/")
        .await
        .starts_with("HTTP/1.1 200"));
    assert_eq!(forwarded_for(&up), "127.0.0.1");
}

#[tokio::test]
async fn tls_behind_the_header_is_served_to_the_headers_source() {
    let dir = tempfile::tempdir().unwrap();
    let ca = common::certs::Ca::new("test CA");
    let (cert, key) = ca.issue(&["a.test"]).write(dir.path(), "a");
    let up = Upstream::start().await;
    let tls = format!(
        "server:\n  proxy_protocol: [127.0.0.1]\n  tls: {{ cert: \"{}\", key: \"{}\" }}\n",
        cert.display(),
        key.display()
    );
    let proxy = Proxy::start(&format!(
        "{tls}upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        up.url()
    ))
    .await;
    let mut tcp = TcpStream::connect(proxy.addr).await.unwrap();
    tcp.write_all(&v1("203.0.113.9")).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("a.test").unwrap();
    let stream = tokio_rustls::TlsConnector::from(ca.client(&[b"http/1.1"]))
        .connect(name, tcp)
        .await
        .expect("the handshake follows the header");
    let mut session = common::certs::Session::start(stream).await;
    assert_eq!(session.get("a.test", "/", &[]).await.status, 200);
    assert_eq!(forwarded_for(&up), "203.0.113.9");
}

#[tokio::test]
async fn php_sees_the_headers_source_as_remote_addr() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("index.php"),
        "<?php echo $_SERVER['REMOTE_ADDR'];",
    )
    .unwrap();
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let proxy = Proxy::start(&format!(
        "server:\n  proxy_protocol: [127.0.0.1]\nupstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        fpm.tcp,
        root.display()
    ))
    .await;
    let answer = exchange(proxy.addr, &v1("203.0.113.9"), "/index.php").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\r\n\r\nB\r\n203.0.113.9\r\n"), "{answer}");
}
