//! Forwarding and server hardening over real sockets: headers, bodies, framing, slow clients, upstream failures, audit.

mod common;

use common::T0;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{client, forward_all, free_addr, json, raw, status_of, Proxy, Reply, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::clock::ManualClock;

/// Asserts a problem+json answer of `status` and `kind`, and returns its body.
async fn problem(resp: reqwest::Response, status: u16, kind: &str) -> serde_json::Value {
    assert_eq!(resp.status(), status);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body = json(&resp.text().await.unwrap());
    assert_eq!(body["type"], kind, "{body}");
    assert_eq!(body["status"], status, "{body}");
    body
}

fn seen_header(upstream: &Upstream, name: &str) -> Option<String> {
    let headers = upstream.seen.last_headers.lock();
    let headers = headers.as_ref().expect("the upstream got a request");
    headers.get(name).map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test]
async fn a_forwarded_request_keeps_host_and_end_to_end_headers_and_loses_hop_by_hop_ones() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let request = "GET /fwd?q=1 HTTP/1.1\r\n\
        Host: shop.example\r\n\
        Connection: close, X-Secret-Hop, Host\r\n\
        Keep-Alive: timeout=5\r\n\
        TE: trailers\r\n\
        Upgrade: websocket\r\n\
        Proxy-Connection: keep-alive\r\n\
        X-Secret-Hop: 1\r\n\
        X-Forwarded-For: 6.6.6.6\r\n\
        X-Real-IP: 6.6.6.6\r\n\
        X-Forwarded-Proto: https\r\n\
        Forwarded: for=6.6.6.6\r\n\
        X-Kept: yes\r\n\r\n";
    let answer = raw(proxy.addr, request.as_bytes(), Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let reply = Reply::parse(&answer).expect("an HTTP answer");
    let head = reply.head.to_ascii_lowercase();
    assert!(reply.header("x-upstream-hop").is_none(), "{head}");
    assert!(!head.contains("must-not-reach-client"), "{head}");
    assert!(
        !reply
            .header("connection")
            .unwrap_or("")
            .to_ascii_lowercase()
            .contains("x-upstream-hop"),
        "{head}"
    );

    let seen = reply.json();
    assert_eq!(seen["method"], "GET");
    assert_eq!(seen["uri"], "/fwd?q=1");
    assert_eq!(seen["version"], "HTTP/1.1");
    let headers = upstream.seen.last_headers.lock().clone().unwrap();
    assert_eq!(
        headers["host"], "shop.example",
        "the client's Host is kept, though its Connection names it"
    );
    for hop in [
        "connection",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-connection",
        "x-secret-hop",
        "forwarded",
    ] {
        assert!(
            !headers.contains_key(hop),
            "{hop} reached the upstream: {headers:?}"
        );
    }
    assert_eq!(headers.get_all("x-forwarded-for").iter().count(), 1);
    assert_eq!(
        headers["x-forwarded-for"], "127.0.0.1",
        "an untrusted peer's XFF is replaced"
    );
    assert_eq!(headers["x-real-ip"], "127.0.0.1");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-kept"], "yes");
}

#[tokio::test]
async fn the_upstreams_hop_by_hop_response_headers_do_not_reach_the_client() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let r = client().get(proxy.url("/anything")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "application/json",
        "end-to-end headers pass"
    );
    assert!(
        !r.headers().contains_key("x-upstream-hop"),
        "{:?}",
        r.headers()
    );
    assert!(!r.headers().contains_key("connection"), "{:?}", r.headers());
}

#[tokio::test]
async fn a_trusted_proxy_gets_its_peer_appended_and_x_real_ip_is_the_rightmost_untrusted_address() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "identity: { trusted_proxies: [127.0.0.0/8] }",
    ))
    .await;
    let c = client();

    let r = c
        .get(proxy.url("/a"))
        .header("x-forwarded-for", "6.6.6.6, 198.51.100.7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        seen_header(&upstream, "x-forwarded-for").unwrap(),
        "6.6.6.6, 198.51.100.7, 127.0.0.1"
    );
    assert_eq!(seen_header(&upstream, "x-real-ip").unwrap(), "198.51.100.7");

    // Trusted hops inside the chain are skipped.
    let r = c
        .get(proxy.url("/b"))
        .header("x-forwarded-for", "6.6.6.6, 198.51.100.8, 127.0.0.9")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        seen_header(&upstream, "x-forwarded-for").unwrap(),
        "6.6.6.6, 198.51.100.8, 127.0.0.9, 127.0.0.1"
    );
    assert_eq!(seen_header(&upstream, "x-real-ip").unwrap(), "198.51.100.8");

    // Without a chain the trusted peer is the client.
    c.get(proxy.url("/c")).send().await.unwrap();
    assert_eq!(
        seen_header(&upstream, "x-forwarded-for").unwrap(),
        "127.0.0.1"
    );
    assert_eq!(seen_header(&upstream, "x-real-ip").unwrap(), "127.0.0.1");
}

#[tokio::test]
async fn a_multi_megabyte_body_is_echoed_back_byte_for_byte() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let sent: Vec<u8> = (0..4 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(31) % 251) as u8)
        .collect();
    let r = client()
        .post(proxy.url("/echo"))
        .body(sent.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = r.bytes().await.unwrap();
    assert_eq!(got.len(), sent.len());
    assert!(got[..] == sent[..], "the echoed body differs");
}

#[tokio::test]
async fn a_five_megabyte_response_arrives_whole() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let r = client()
        .get(proxy.url("/big/5242880"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = r.bytes().await.unwrap();
    assert_eq!(got.len(), 5_242_880);
    assert!(got.iter().all(|&b| b == b'x'));
}

#[tokio::test]
async fn a_content_length_over_max_request_body_is_a_413_and_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { max_request_body: 1KiB }",
    ))
    .await;
    let c = client();
    let r = c
        .post(proxy.url("/echo"))
        .body(vec![b'a'; 2048])
        .send()
        .await
        .unwrap();
    let body = problem(r, 413, "body-too-large").await;
    assert_eq!(body["max_request_body"], 1024);
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 0);

    // Exactly the limit passes.
    let r = c
        .post(proxy.url("/echo"))
        .body(vec![b'a'; 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 1024);
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 1);
}

fn chunked(chunks: usize, size: usize) -> Vec<u8> {
    let mut req = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..chunks {
        req.extend_from_slice(format!("{size:x}\r\n").as_bytes());
        req.extend(std::iter::repeat_n(b'c', size));
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    req
}

#[tokio::test]
async fn a_chunked_body_over_max_request_body_is_a_413() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { max_request_body: 1KiB }",
    ))
    .await;

    let answer = raw(proxy.addr, &chunked(3, 800), Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 413, "{answer}");
    let reply = Reply::parse(&answer).expect("an HTTP answer");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.json()["type"], "body-too-large");

    // Under the limit, a chunked body goes through whole.
    let answer = raw(proxy.addr, &chunked(1, 800), Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let reply = Reply::parse(&answer).expect("an HTTP answer");
    assert_eq!(reply.body, "c".repeat(800));
}

const CL_AND_TE: &[u8] = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n";

#[tokio::test]
/// RFC 9112 §6.3: Transfer-Encoding overrides Content-Length and the
/// connection closes after the response, so no second request can be
/// smuggled behind the body; the upstream only ever sees the chunked framing.
async fn a_request_with_both_content_length_and_transfer_encoding_is_read_as_chunked_and_the_connection_closed(
) {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let request = String::from_utf8(CL_AND_TE.to_vec())
        .unwrap()
        .replace("/echo", "/framing");
    let smuggled = format!("{request}GET /second HTTP/1.1\r\nHost: x\r\n\r\n");
    let answer = raw(proxy.addr, smuggled.as_bytes(), Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert_eq!(
        answer.matches("HTTP/1.1 ").count(),
        1,
        "the connection closed after one response: {answer}"
    );
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 1);
    let seen = Reply::parse(&answer).expect("an HTTP answer").json();
    assert_eq!(seen["headers"].get("content-length"), None, "{seen}");
    assert_eq!(seen["body_len"], 5, "the chunked framing won: {seen}");
}

#[tokio::test]
async fn a_request_head_over_32_kib_is_a_431() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "b".repeat(40 * 1024)
    );
    let answer = raw(proxy.addr, big.as_bytes(), Duration::from_secs(5)).await;
    assert_eq!(status_of(&answer), 431, "{answer}");
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 0);

    // A head just under the limit is served.
    let fits = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: {}\r\n\r\n",
        "b".repeat(30 * 1024)
    );
    assert_eq!(
        status_of(&raw(proxy.addr, fits.as_bytes(), Duration::from_secs(5)).await),
        200
    );
}

/// Sends `head` and then one more byte of it every `every` (never finishing),
/// and returns how long until the server closed the connection.
async fn time_until_closed(
    addr: std::net::SocketAddr,
    head: &'static [u8],
    every: Option<Duration>,
) -> Duration {
    let started = Instant::now();
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    write.write_all(head).await.unwrap();
    // The writer stays open throughout: dropping it would send a FIN.
    let trickle = tokio::spawn(async move {
        let Some(every) = every else {
            return std::future::pending::<()>().await;
        };
        loop {
            tokio::time::sleep(every).await;
            if write.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), read.read_to_end(&mut sink)).await;
    trickle.abort();
    assert!(closed.is_ok(), "the server kept a stalled client for 5 s");
    started.elapsed()
}

#[tokio::test]
async fn a_client_that_stalls_or_trickles_its_request_head_is_cut_off() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(
        &upstream.url(),
        "server: { request_header_timeout: 500ms }",
    ))
    .await;
    // A prompt client is served.
    let r = client().get(proxy.url("/ok")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    let stalled = time_until_closed(proxy.addr, b"GET / HTTP/1.1\r\nHost: x\r\n", None).await;
    assert!(
        stalled >= Duration::from_millis(400),
        "cut off before the timeout: {stalled:?}"
    );
    assert!(
        stalled < Duration::from_secs(2),
        "stalled client kept for {stalled:?}"
    );

    let trickled = time_until_closed(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ",
        Some(Duration::from_millis(100)),
    )
    .await;
    assert!(
        trickled >= Duration::from_millis(400),
        "cut off before the timeout: {trickled:?}"
    );
    assert!(
        trickled < Duration::from_secs(2),
        "trickling client kept for {trickled:?}"
    );
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_problem() {
    let down = free_addr();
    let proxy = Proxy::start(&forward_all(&format!("http://{down}"), "")).await;
    let r = client().get(proxy.url("/x")).send().await.unwrap();
    let body = problem(r, 502, "upstream-unreachable").await;
    assert_eq!(body["title"], "Bad Gateway");
}

#[tokio::test]
async fn a_request_no_route_matches_is_a_404_problem() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: api, match: {{ path_prefix: /api }}, upstream: app }}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let c = client();
    problem(
        c.get(proxy.url("/nope")).send().await.unwrap(),
        404,
        "no-route",
    )
    .await;
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 0);
    assert_eq!(common::status(&c, &proxy.url("/api/yes"), &[]).await, 200);
}

#[tokio::test]
async fn an_http2_prior_knowledge_request_is_forwarded_as_http_1_1() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&forward_all(&upstream.url(), "")).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2.get(proxy.url("/h2?x=1")).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    let seen = json(&r.text().await.unwrap());
    assert_eq!(seen["version"], "HTTP/1.1");
    assert_eq!(seen["uri"], "/h2?x=1");
    assert_eq!(
        seen["headers"]["host"],
        proxy.addr.to_string(),
        "the :authority becomes Host"
    );

    let r = h2
        .post(proxy.url("/echo"))
        .body("over h2")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "over h2");
}

#[tokio::test]
async fn a_route_with_limiters_sends_the_rate_limit_headers_even_on_a_502() {
    let down = free_addr();
    let yaml = format!(
        "upstreams:\n  app: {{ url: \"http://{down}\" }}\nlimiters:\n  strict: {{ limit: 5, window: 60s }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app, limiters: [strict] }}\n"
    );
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let r = client().get(proxy.url("/x")).send().await.unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["x-ratelimit-limit"], "5");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "4");
    assert_eq!(r.headers()["x-ratelimit-reset"], "1767225660");
    assert_eq!(r.headers()["ratelimit-policy"], "\"strict\";q=5;w=60");
    assert_eq!(r.headers()["ratelimit"], "\"strict\";r=4;t=40");
    problem(r, 502, "upstream-unreachable").await;
}

/// One row of the `api_calls` audit table: time, client, method, path, route, status.
type AuditRow = (String, String, String, String, String, u16);

/// Every row of the audit table in `db`, oldest first.
fn api_calls(db: &std::path::Path) -> Vec<AuditRow> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut select = conn
        .prepare("SELECT time, client, method, path, route, status FROM api_calls ORDER BY id")
        .unwrap();
    let rows = select
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// No `tollgate.db*` file in `dir` (the database, its WAL and shm) holds `secret`.
fn assert_no_database_file_holds(dir: &std::path::Path, secret: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("tollgate.db")
        {
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{} holds the key",
                path.display()
            );
        }
    }
}

#[tokio::test]
async fn every_forwarded_request_gets_one_audit_row_and_api_keys_appear_only_hashed() {
    const SECRET: &str = "sk_live_Audit7Secret";
    let upstream = Upstream::start().await;
    let yaml = format!(
        "identity: {{ api_keys: [{SECRET}] }}\nupstreams:\n  app: {{ url: \"{}\" }}\nlimiters:\n  per_client: {{ limit: 100, window: 60s }}\nroutes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200 }} }}\n  - {{ name: api, match: {{ path_prefix: /api }}, upstream: app, limiters: [per_client] }}\n  - {{ name: rest, match: {{ path_prefix: / }}, upstream: app }}\n",
        upstream.url()
    );
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/api/a"), &[]).await, 200);
    assert_eq!(
        c.post(proxy.url("/api/b"))
            .body("x")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        common::status(&c, &proxy.url("/ping"), &[]).await,
        200,
        "answered locally"
    );
    let keyed = c
        .delete(proxy.url("/other?q=1"))
        .header("x-client-key", SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), 200);
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 3);

    proxy.app.shared.store.flush().unwrap();
    let db = proxy.dir.path().join("tollgate.db");
    let rows = api_calls(&db);
    let short = {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(SECRET.as_bytes());
        format!(
            "key:{:02x}{:02x}{:02x}{:02x}…",
            digest[0], digest[1], digest[2], digest[3]
        )
    };
    let summary: Vec<(&str, &str, &str, &str, u16)> = rows
        .iter()
        .map(|(_, client, method, path, route, status)| {
            (
                client.as_str(),
                method.as_str(),
                path.as_str(),
                route.as_str(),
                *status,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("ip:127.0.0.1", "GET", "/api/a", "api", 200),
            ("ip:127.0.0.1", "POST", "/api/b", "api", 200),
            (short.as_str(), "DELETE", "/other", "rest", 200),
        ]
    );
    assert!(
        rows.iter().all(|r| r.0.starts_with("2026-01-01T00:00:20")),
        "{rows:?}"
    );

    // Nowhere in the database files, hashes included, is the plain key.
    assert_no_database_file_holds(proxy.dir.path(), SECRET);
}

#[tokio::test]
async fn with_the_access_log_off_an_audit_row_still_names_its_path_and_request_id() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "log: {{ access: false }}\nupstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let resp = client()
        .get(proxy.url("/orders/7?page=2"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();

    proxy.app.shared.store.flush().unwrap();
    let db = rusqlite::Connection::open(proxy.dir.path().join("tollgate.db")).unwrap();
    let row: (String, String) = db
        .query_row("SELECT path, request_id FROM api_calls", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(row, ("/orders/7".to_string(), id));
}
