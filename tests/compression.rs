//! Response compression against real upstreams (`php -S` over HTTP, php-fpm over FastCGI): negotiation, the types and statuses left alone, the headers a compressed answer changes, streaming.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use common::php::PhpServer;
use common::php_fpm::PhpFpm;
use common::{get_raw, Proxy, RawAnswer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers with the type, headers and length the query asks for:
/// `type`, `cc` (Cache-Control), `ce` (Content-Encoding), `etag`, `n` (body
/// length, default 5000), `len` (send Content-Length).
const ANSWER: &str = r#"<?php
$q = $_GET;
header('Content-Type: ' . ($q['type'] ?? 'text/html; charset=utf-8'));
if (isset($q['cc'])) header('Cache-Control: ' . $q['cc']);
if (isset($q['ce'])) header('Content-Encoding: ' . $q['ce']);
if (isset($q['etag'])) header('ETag: "' . $q['etag'] . '"');
$n = (int)($q['n'] ?? 5000);
$body = substr(str_repeat('tollgate compresses what a browser reads. ', intdiv($n, 10) + 1), 0, $n);
if (isset($q['len'])) header('Content-Length: ' . strlen($body));
echo $body;
"#;

/// The text [`ANSWER`] sends for `n`.
fn text(n: usize) -> Vec<u8> {
    "tollgate compresses what a browser reads. "
        .repeat(n / 10 + 1)
        .into_bytes()[..n]
        .to_vec()
}

/// tollgate in front of `php -S` running [`ANSWER`], with `extra` YAML.
async fn start(extra: &str) -> (Proxy, PhpServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("answer.php");
    std::fs::write(&script, ANSWER).unwrap();
    let php = PhpServer::start(&script, dir.path(), 2);
    let proxy = Proxy::start(&common::forward_all(&format!("http://{}", php.addr), extra)).await;
    (proxy, php, dir)
}

trait Decoded {
    /// The body with its `Content-Encoding` undone.
    fn decoded(&self) -> Vec<u8>;
}

impl Decoded for RawAnswer {
    fn decoded(&self) -> Vec<u8> {
        decode(self.header("content-encoding"), &self.body)
    }
}

fn decode(encoding: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match encoding {
        None => out.extend_from_slice(body),
        Some("gzip") => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .expect("valid gzip");
        }
        Some("br") => {
            brotli::Decompressor::new(body, 4096)
                .read_to_end(&mut out)
                .expect("valid brotli");
        }
        Some(other) => panic!("unexpected encoding {other}"),
    }
    out
}

async fn get(proxy: &Proxy, path: &str, accept: Option<&str>) -> RawAnswer {
    let accept: Vec<_> = accept.map(|a| ("accept-encoding", a)).into_iter().collect();
    get_raw(&proxy.url(path), &accept).await
}

#[tokio::test]
async fn text_is_compressed_with_the_coding_the_client_weighs_highest() {
    let (proxy, _php, _dir) = start("").await;
    let cases = [
        ("gzip, deflate, br", Some("br")),
        ("gzip;q=1.0, br;q=0.5", Some("gzip")),
        ("br;q=0, *", Some("gzip")),
        ("*", Some("br")),
        ("deflate", None),
        ("*;q=0, identity", None),
        ("gzip;q=0", None),
    ];
    for (accept, expected) in cases {
        let r = get(&proxy, "/", Some(accept)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), expected, "{accept}");
        assert_eq!(r.decoded(), text(5000), "{accept}");
        assert_eq!(r.header("vary"), Some("Accept-Encoding"), "{accept}");
        if expected.is_some() {
            assert!(r.body.len() < 1000, "{accept}: {} bytes", r.body.len());
        }
    }
    let r = get(&proxy, "/", None).await;
    assert_eq!(
        r.header("content-encoding"),
        None,
        "no Accept-Encoding: plain"
    );
    assert_eq!(r.body, text(5000));
}

#[tokio::test]
async fn a_short_body_stays_plain_unless_the_client_refuses_identity() {
    let (proxy, _php, _dir) = start("").await;
    let r = get(&proxy, "/?n=100&len=1", Some("gzip")).await;
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.header("content-length"), Some("100"));
    assert_eq!(r.body, text(100));

    let r = get(&proxy, "/?n=100&len=1", Some("gzip, identity;q=0")).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.decoded(), text(100));
}

#[tokio::test]
async fn a_compressed_answer_loses_its_length_and_its_etag_becomes_weak() {
    let (proxy, _php, _dir) = start("").await;
    let r = get(&proxy, "/?len=1&etag=v1", Some("gzip")).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("content-length"), None);
    assert_eq!(r.header("etag"), Some("W/\"v1\""));
    assert_eq!(r.decoded(), text(5000));

    let plain = get(&proxy, "/?len=1&etag=v1", None).await;
    assert_eq!(
        plain.header("etag"),
        Some("\"v1\""),
        "uncompressed, the tag stays strong"
    );
    assert_eq!(plain.header("content-length"), Some("5000"));
}

#[tokio::test]
async fn no_transform_already_encoded_and_media_responses_pass_untouched() {
    let (proxy, _php, _dir) = start("").await;
    let r = get(&proxy, "/?cc=public,%20no-transform", Some("gzip, br")).await;
    assert_eq!(r.header("content-encoding"), None, "no-transform");
    assert_eq!(r.body, text(5000));
    assert_eq!(r.header("vary"), None);

    // The upstream says it is already encoded: not encoded twice (the bytes
    // are passed as they are, whatever they hold).
    let r = get(&proxy, "/?ce=gzip", Some("gzip, br")).await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.body, text(5000), "the upstream's bytes, untouched");

    for t in ["image/png", "video/mp4", "application/zip", "font/woff2"] {
        let r = get(&proxy, &format!("/?type={t}"), Some("gzip, br")).await;
        assert_eq!(r.header("content-encoding"), None, "{t}");
        assert_eq!(r.header("vary"), None, "{t}");
        assert_eq!(r.body, text(5000), "{t}");
    }
    for t in ["application/json", "image/svg%2Bxml", "text/css"] {
        let r = get(&proxy, &format!("/?type={t}"), Some("gzip")).await;
        assert_eq!(r.header("content-encoding"), Some("gzip"), "{t}");
    }
}

#[tokio::test]
async fn head_gets_the_headers_a_get_would_and_no_body() {
    let (proxy, _php, _dir) = start("").await;
    let request = format!(
        "HEAD /?len=1 HTTP/1.1\r\nHost: {}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
        proxy.addr
    );
    let raw = common::raw(proxy.addr, request.as_bytes(), Duration::from_secs(5)).await;
    let reply = common::Reply::parse(&raw).expect("an answer");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert_eq!(reply.header("vary"), Some("Accept-Encoding"));
    assert_eq!(reply.header("content-length"), None);
    assert_eq!(reply.body, "", "a HEAD answer has no body");
}

#[tokio::test]
async fn compression_can_be_turned_off_for_a_route_or_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("answer.php");
    std::fs::write(&script, ANSWER).unwrap();
    let php = PhpServer::start(&script, dir.path(), 2);
    let yaml = format!(
        "upstreams:\n  app: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: secret, match: {{ path_prefix: /account }}, upstream: app, compression: false }}\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        php.addr
    );
    let proxy = Proxy::start(&yaml).await;
    let r = get(&proxy, "/account", Some("gzip, br")).await;
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.header("vary"), None);
    assert_eq!(r.body, text(5000));
    let r = get(&proxy, "/", Some("gzip, br")).await;
    assert_eq!(r.header("content-encoding"), Some("br"));

    let yaml = format!("server: {{ compression: false }}\n{yaml}");
    proxy.write_config(&yaml);
    let (status, body) = proxy.reload().await;
    assert_eq!(status, 200, "{body}");
    let r = get(&proxy, "/", Some("gzip, br")).await;
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.body, text(5000));
}

#[tokio::test]
async fn compressed_responses_and_their_bytes_are_counted() {
    let (proxy, _php, _dir) = start("").await;
    assert_eq!(
        proxy
            .metric("tollgate_compressed_responses_total{encoding=\"gzip\"}")
            .await,
        Some(0.0)
    );
    let r = get(&proxy, "/", Some("gzip")).await;
    assert_eq!(r.decoded(), text(5000));
    let counted = common::eventually(Duration::from_secs(5), || async {
        proxy
            .metric("tollgate_compression_bytes_total{encoding=\"gzip\",direction=\"in\"}")
            .await
            == Some(5000.0)
    })
    .await;
    assert!(counted, "{}", proxy.metrics().await);
    assert_eq!(
        proxy
            .metric("tollgate_compressed_responses_total{encoding=\"gzip\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        proxy
            .metric("tollgate_compression_bytes_total{encoding=\"gzip\",direction=\"out\"}")
            .await,
        Some(r.body.len() as f64)
    );
}

/// Sends its head part, flushes, waits 1.5 s, then sends the rest.
const FLUSHES: &str = r#"<?php
header('Content-Type: text/html; charset=utf-8');
echo str_repeat('<p>the head of the page, flushed early</p>', 50);
flush();
usleep(1500000);
echo '<p>the end</p>';
"#;

fn fpm_site(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("flushes.php"), FLUSHES).unwrap();
    std::fs::write(root.join("answer.php"), ANSWER).unwrap();
    root
}

#[tokio::test]
async fn php_fpm_output_is_compressed_as_it_streams_not_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let root = fpm_site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let yaml = format!(
        "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        fpm.socket.display(),
        root.display()
    );
    let proxy = Proxy::start(&yaml).await;

    let r = get(&proxy, "/answer.php?type=application/json", Some("br")).await;
    assert_eq!(r.header("content-encoding"), Some("br"));
    assert_eq!(r.decoded(), text(5000));

    // Read the raw chunked stream and decode it as it arrives: the flushed
    // head must be readable well before PHP sends the end.
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = format!(
        "GET /flushes.php HTTP/1.1\r\nHost: {}\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
        proxy.addr
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut raw = Vec::new();
    let mut head_seen_at = None;
    let mut buf = [0u8; 16384];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the answer keeps coming")
            .unwrap();
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if head_seen_at.is_none() {
            if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let body = common::dechunk(&raw[at + 4..]);
                let mut d = flate2::write::GzDecoder::new(Vec::new());
                let _ = d.write_all(&body);
                let _ = d.flush();
                if String::from_utf8_lossy(d.get_ref()).contains("flushed early") {
                    head_seen_at = Some(started.elapsed());
                }
            }
        }
    }
    let total = started.elapsed();
    let head_seen_at = head_seen_at.expect("the head was decodable before the end");
    assert!(
        total - head_seen_at >= Duration::from_millis(1000),
        "head at {head_seen_at:?}, end at {total:?}: the head waited for the end"
    );
    let text = String::from_utf8_lossy(&raw).into_owned();
    let reply = common::Reply::parse(&text).unwrap();
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let whole = decode(Some("gzip"), &common::dechunk(&raw[at + 4..]));
    assert!(String::from_utf8_lossy(&whole).ends_with("<p>the end</p>"));
}

#[tokio::test]
async fn our_own_answers_follow_the_length_rule_so_a_short_429_stays_plain_and_sized() {
    let long = "tollgate answers this itself. ".repeat(40);
    let yaml = format!(
        "{}  - {{ name: long, match: {{ path: /long }}, respond: {{ status: 200, body: \"{long}\" }} }}\n",
        common::ping_yaml(1)
    );
    let proxy = Proxy::start(&yaml).await;
    let first = get(&proxy, "/ping", Some("gzip, br")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("content-encoding"), None, "4 bytes stay plain");
    let refused = get(&proxy, "/ping", Some("gzip, br")).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("content-encoding"),
        None,
        "a {}-byte problem is under the minimum",
        refused.body.len()
    );
    assert_eq!(
        refused.header("content-length"),
        Some(refused.body.len().to_string().as_str()),
        "sent with its length, not chunked"
    );
    assert!(
        refused
            .headers
            .get_all("vary")
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"accept-encoding")),
        "it still varies by Accept-Encoding: {:?}",
        refused.headers
    );
    let r = get(&proxy, "/long", Some("gzip, br")).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-encoding"),
        Some("br"),
        "1,200 bytes of ours are compressed"
    );
    assert_eq!(r.decoded(), long.as_bytes());
}
