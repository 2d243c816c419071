//! HTTP as the RFCs say between client, tollgate and upstream: an HTTP/1.0 upstream answered as HTTP/1.1, an HTTP/2 client's cookie fields joined, a request without any host refused, a 304's validator the one its 200 carried, `Accept` parameters read without case.

mod common;

use bytes::Bytes;
use common::app::{app, from, text};
use common::Upstream;
use http::{Request, StatusCode, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request as hyper hands an HTTP/2 one to the app: the authority in the
/// URI (`:authority`), no `Host` field.
fn h2(uri: &str) -> http::request::Builder {
    Request::get(uri).version(Version::HTTP_2)
}

#[tokio::test(start_paused = true)]
async fn an_http2_request_with_neither_authority_nor_host_gets_400() {
    let app = app("routes:\n  - { name: all, match: { path_prefix: / }, respond: { status: 200, body: ok } }\n");
    let bare = h2("/").body(Bytes::new()).unwrap();
    let resp = app.handle(bare, from("192.0.2.1:5000")).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(text(resp).await.contains(":authority"));
    // With :authority, or with a Host field, it is answered.
    let with_authority = h2("https://shop.example/").body(Bytes::new()).unwrap();
    let resp = app.handle(with_authority, from("192.0.2.1:5000")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let with_host = h2("/")
        .header("host", "shop.example")
        .body(Bytes::new())
        .unwrap();
    let resp = app.handle(with_host, from("192.0.2.1:5000")).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_http2_clients_cookie_fields_reach_an_http11_upstream_as_one_cookie_line() {
    let upstream = Upstream::start().await;
    let app = app(&common::forward_all(&upstream.url(), ""));
    let req = h2("http://shop.example/cart")
        .header("cookie", "session=abc")
        .header("cookie", "theme=dark")
        .header("cookie", "lang=de")
        .body(Bytes::new())
        .unwrap();
    let resp = app.handle(req, from("192.0.2.1:5000")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = upstream
        .seen
        .last_headers
        .lock()
        .clone()
        .expect("the upstream saw the request");
    let cookies: Vec<_> = seen.get_all("cookie").iter().collect();
    assert_eq!(cookies, ["session=abc; theme=dark; lang=de"]);
}

/// An upstream that speaks HTTP/1.0: one answer per connection, without
/// `Content-Length`, ended by closing the connection. Returns its URL.
async fn http10_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                if !common::read_head(&mut s).await {
                    return;
                }
                let _ = s
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nfrom 1.0")
                    .await;
            });
        }
    });
    url
}

#[tokio::test]
async fn an_http10_upstreams_answer_reaches_an_http11_client_as_http11_and_keeps_the_connection() {
    let proxy = common::Proxy::start(&common::forward_all(&http10_upstream().await, "")).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    for round in 0..2 {
        s.write_all(b"GET /page HTTP/1.1\r\nHost: shop.example\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        // The body is chunked (the upstream gave no length); it ends with the last chunk.
        while !answer.ends_with(b"0\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "round {round}: the connection closed after {:?}",
                String::from_utf8_lossy(&answer)
            );
            answer.extend_from_slice(&buf[..n]);
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.starts_with("HTTP/1.1 200 OK\r\n"),
            "round {round}: {answer}"
        );
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
        assert!(answer.contains("from 1.0"), "{answer}");
    }
}

#[tokio::test]
async fn a_304_for_a_file_compressed_on_the_fly_carries_the_weak_etag_its_200_did() {
    let dir = tempfile::tempdir().unwrap();
    let css: String = (0..200)
        .map(|i| format!(".c{i} {{ margin: {i}px; }}\n"))
        .collect();
    std::fs::write(dir.path().join("site.css"), &css).unwrap();
    let app = app(&format!(
        "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        common::free_addr(),
        dir.path().display()
    ));
    let get = |headers: &[(&str, &str)]| common::app::get("/site.css", headers);
    let first = app
        .handle(get(&[("accept-encoding", "gzip")]), from("192.0.2.1:5000"))
        .await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["content-encoding"], "gzip");
    let etag = first.headers()["etag"].to_str().unwrap().to_string();
    assert!(etag.starts_with("W/\""), "{etag}");
    let again = get(&[("accept-encoding", "gzip"), ("if-none-match", &etag)]);
    let revalidated = app.handle(again, from("192.0.2.1:5000")).await;
    assert_eq!(revalidated.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(revalidated.headers()["etag"], etag.as_str());
    let vary: Vec<_> = revalidated.headers().get_all("vary").iter().collect();
    assert!(
        vary.iter()
            .any(|v| v.to_str().unwrap().contains("Accept-Encoding")),
        "{vary:?}"
    );
    // A client that takes no coding got the identity bytes and their strong tag.
    let plain = app.handle(get(&[]), from("192.0.2.1:5000")).await;
    let strong = plain.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(format!("W/{strong}"), etag);
    let revalidated = app
        .handle(get(&[("if-none-match", &strong)]), from("192.0.2.1:5000"))
        .await;
    assert_eq!(revalidated.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(revalidated.headers()["etag"], strong.as_str());
}

#[tokio::test]
async fn accept_text_html_with_a_zero_weight_in_capitals_is_no_browser() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("pass.keys");
    std::fs::write(&keys, "0123456789abcdef0123456789abcdef-a-secret\n").unwrap();
    let app = app(&format!(
        "identity: {{ pass: {{ secret_file: \"{}\" }} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }}, challenge: {{ when: always, difficulty: 8 }} }}\n",
        keys.display()
    ));
    for accept in ["text/html;Q=0", "text/html ; Q = 0.000, application/json"] {
        let resp = app
            .handle(
                common::app::get("/", &[("accept", accept)]),
                from("192.0.2.1:5000"),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "{accept}");
        assert_eq!(
            text(resp).await,
            "ok",
            "{accept}: no challenge page for a client that refuses HTML"
        );
    }
    let browser = common::app::get("/", &[("accept", "text/html;Q=0.9")]);
    let page = text(app.handle(browser, from("192.0.2.1:5000")).await).await;
    assert!(
        page.contains("name=\"c\""),
        "a browser gets the challenge: {page}"
    );
}
