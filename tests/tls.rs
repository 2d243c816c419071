//! TLS end to end on real sockets: SNI, ALPN h2, certificate rotation, plain→https redirect, https upstreams.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::certs::{self, Ca, Session, TlsUpstream};
use common::{eventually, raw, status_of, Proxy, Upstream};
use tokio::io::AsyncReadExt;
use tollgate::clock::SystemClock;

/// Everything under `/` goes to `url`; `server` is the YAML of the server section.
fn config(server: &str, url: &str, extra: &str) -> String {
    format!(
        "server:\n{server}\nupstreams:\n  app: {{ url: \"{url}\" {extra} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n"
    )
}

/// A proxy whose config and certificates live in `dir`; the file watch polls every 50 ms.
async fn start(yaml: &str, dir: tempfile::TempDir) -> Proxy {
    Proxy::start_in(
        yaml,
        Arc::new(SystemClock),
        dir,
        Some(Duration::from_millis(50)),
    )
    .await
}

fn single(cert: &std::path::Path, key: &std::path::Path) -> String {
    format!(
        "  tls: {{ cert: \"{}\", key: \"{}\" }}",
        cert.display(),
        key.display()
    )
}

#[tokio::test]
async fn each_sni_host_gets_its_own_certificate_and_others_get_the_default() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (a, b, d) = (
        ca.issue(&["a.test"]),
        ca.issue(&["b.test"]),
        ca.issue(&["default.test", "other.test"]),
    );
    let (ac, ak) = a.write(dir.path(), "a");
    let (bc, bk) = b.write(dir.path(), "b");
    let (dc, dk) = d.write(dir.path(), "d");
    let server = format!(
        "  tls:\n    certs:\n      - {{ cert: \"{}\", key: \"{}\", hosts: [a.test] }}\n      - {{ cert: \"{}\", key: \"{}\", hosts: [B.TEST] }}\n      - {{ cert: \"{}\", key: \"{}\" }}",
        ac.display(), ak.display(), bc.display(), bk.display(), dc.display(), dk.display()
    );
    let proxy = start(&config(&server, &upstream.url(), ""), dir).await;
    let client = ca.client(&[b"http/1.1"]);
    for (sni, leaf) in [("a.test", &a), ("b.test", &b)] {
        let stream = certs::handshake(proxy.addr, sni, client.clone())
            .await
            .unwrap();
        assert_eq!(certs::served_certificate(&stream), leaf.der, "{sni}");
    }
    // A name no entry lists gets the default pair (valid for it here, so the client accepts).
    let stream = certs::handshake(proxy.addr, "other.test", client.clone())
        .await
        .unwrap();
    assert_eq!(certs::served_certificate(&stream), d.der);
    let answer = certs::get(proxy.addr, "a.test", client, "/hello").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}

#[tokio::test]
async fn alpn_negotiates_h2_and_requests_work_over_it() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["shop.test"]).write(dir.path(), "shop");
    let proxy = start(&config(&single(&cert, &key), &upstream.url(), ""), dir).await;

    let stream = certs::handshake(proxy.addr, "shop.test", ca.client(&[b"h2", b"http/1.1"]))
        .await
        .unwrap();
    assert_eq!(certs::alpn(&stream).as_deref(), Some(b"h2".as_slice()));
    let mut session = Session::start(stream).await;
    let Session::H2(send) = &session else {
        panic!("ALPN h2 gives an HTTP/2 session")
    };
    // Two requests in flight at once on the one connection: real multiplexing.
    let (mut s1, mut s2) = (Session::H2(send.clone()), Session::H2(send.clone()));
    let (r1, r2) = tokio::join!(
        s1.get("shop.test", "/slow/100", &[]),
        s2.get("shop.test", "/two", &[])
    );
    for r in [&r1, &r2] {
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.version, http::Version::HTTP_2);
        assert_eq!(r.json()["version"], "HTTP/1.1", "upstreams get HTTP/1.1");
        assert_eq!(r.json()["headers"]["x-forwarded-proto"], "https");
        assert_eq!(r.json()["headers"]["host"], "shop.test");
    }
    let r3 = session.get("shop.test", "/three", &[]).await;
    assert_eq!(r3.status, 200);

    // A client that offers only HTTP/1.1 gets it.
    let stream = certs::handshake(proxy.addr, "shop.test", ca.client(&[b"http/1.1"]))
        .await
        .unwrap();
    assert_eq!(
        certs::alpn(&stream).as_deref(),
        Some(b"http/1.1".as_slice())
    );
    let r = Session::start(stream)
        .await
        .get("shop.test", "/h1", &[])
        .await;
    assert_eq!((r.status, r.version), (200, http::Version::HTTP_11));
}

#[tokio::test]
async fn tls_1_2_clients_are_served_too() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["shop.test"]).write(dir.path(), "shop");
    let proxy = start(&config(&single(&cert, &key), &upstream.url(), ""), dir).await;
    let client = ca.client_with_versions(&[b"h2"], &[&rustls::version::TLS12]);
    let stream = certs::handshake(proxy.addr, "shop.test", client)
        .await
        .unwrap();
    assert_eq!(
        stream.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    let r = Session::start(stream)
        .await
        .get("shop.test", "/", &[])
        .await;
    assert_eq!(r.status, 200);
}

/// Points `link` at `target` in one step, the way certbot moves its `live/` symlinks.
fn repoint(link: &std::path::Path, target: &std::path::Path) {
    let tmp = link.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_the_next_handshake_while_an_open_connection_keeps_working(
) {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (archive, live) = (dir.path().join("archive"), dir.path().join("live"));
    std::fs::create_dir_all(&archive).unwrap();
    std::fs::create_dir_all(&live).unwrap();
    let ca = Ca::new("test CA");
    let (old, new) = (ca.issue(&["shop.test"]), ca.issue(&["shop.test"]));
    let (c1, k1) = old.write(&archive, "1");
    let (cert, key) = (live.join("fullchain.pem"), live.join("privkey.pem"));
    repoint(&cert, &c1);
    repoint(&key, &k1);
    let proxy = start(&config(&single(&cert, &key), &upstream.url(), ""), dir).await;
    let client = ca.client(&[b"http/1.1"]);

    let open = certs::handshake(proxy.addr, "shop.test", client.clone())
        .await
        .unwrap();
    assert_eq!(certs::served_certificate(&open), old.der);
    let mut open = Session::start(open).await;
    assert_eq!(open.get("shop.test", "/before", &[]).await.status, 200);

    // certbot renews: new files in archive/, then the live/ symlinks move.
    let (c2, k2) = new.write(&archive, "2");
    repoint(&cert, &c2);
    repoint(&key, &k2);
    let rotated = eventually(Duration::from_secs(5), || {
        let client = client.clone();
        let addr = proxy.addr;
        let want = new.der.clone();
        async move {
            let s = certs::handshake(addr, "shop.test", client).await.unwrap();
            certs::served_certificate(&s) == want
        }
    })
    .await;
    assert!(rotated, "the new certificate was never served");

    // The connection opened before the rotation still serves requests.
    let r = open.get("shop.test", "/after", &[]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(proxy.app.shared.last_reload_error.lock().is_none());
}

#[tokio::test]
async fn an_invalid_new_key_is_rejected_and_the_old_certificate_still_served() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let good = ca.issue(&["shop.test"]);
    let (cert, key) = good.write(dir.path(), "shop");
    let proxy = start(&config(&single(&cert, &key), &upstream.url(), ""), dir).await;
    let client = ca.client(&[b"http/1.1"]);
    let reloads_failed = || async {
        let text = proxy.metrics().await;
        text.contains("tollgate_config_reloads_total{result=\"error\"} 1")
    };

    // A key that belongs to another certificate.
    std::fs::write(&key, ca.issue(&["shop.test"]).key_pem).unwrap();
    assert!(
        eventually(Duration::from_secs(5), reloads_failed).await,
        "the broken pair was never tried"
    );
    let error = proxy.app.shared.last_reload_error.lock().clone().unwrap();
    assert!(error.contains("does not match the certificate"), "{error}");
    assert!(
        error.contains("shop.key"),
        "the error names the file: {error}"
    );

    let stream = certs::handshake(proxy.addr, "shop.test", client.clone())
        .await
        .unwrap();
    assert_eq!(certs::served_certificate(&stream), good.der);
    let r = Session::start(stream)
        .await
        .get("shop.test", "/", &[])
        .await;
    assert_eq!(r.status, 200);

    // Garbage instead of a key: rejected the same way.
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            proxy
                .app
                .shared
                .last_reload_error
                .lock()
                .as_deref()
                .is_some_and(|e| e.contains("shop.key") && !e.contains("does not match"))
        })
        .await
    );
    let stream = certs::handshake(proxy.addr, "shop.test", client)
        .await
        .unwrap();
    assert_eq!(certs::served_certificate(&stream), good.der);
}

#[tokio::test]
async fn plain_and_tls_listeners_serve_side_by_side_with_the_right_forwarded_proto() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["shop.test"]).write(dir.path(), "shop");
    let server = format!(
        "  tls: {{ cert: \"{}\", key: \"{}\", listen: [\"127.0.0.1:0\"] }}",
        cert.display(),
        key.display()
    );
    let proxy = start(&config(&server, &upstream.url(), ""), dir).await;
    let tls = proxy.tls_addr.expect("a TLS listener of its own");

    let plain = raw(
        proxy.addr,
        b"GET /p HTTP/1.1\r\nHost: shop.test\r\nX-Forwarded-Proto: https\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&plain), 200, "{plain}");
    let seen = upstream.seen.last_headers.lock().clone().unwrap();
    assert_eq!(
        seen["x-forwarded-proto"], "http",
        "a client's own claim is replaced"
    );

    let r = certs::get(tls, "shop.test", ca.client(&[b"http/1.1"]), "/t").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["headers"]["x-forwarded-proto"], "https");
}

#[tokio::test]
async fn plain_requests_are_redirected_to_https_with_308_except_acme_challenges() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["shop.test"]).write(dir.path(), "shop");
    let yaml = format!(
        "server:\n  tls: {{ cert: \"{}\", key: \"{}\", listen: [\"127.0.0.1:0\"], redirect_plain: true }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: \"token\" }} }}\n",
        cert.display(),
        key.display()
    );
    let proxy = start(&yaml, dir).await;
    let tls = proxy.tls_addr.unwrap();

    let answer = raw(
        proxy.addr,
        b"GET /login?next=%2Fcart HTTP/1.1\r\nHost: Shop.Test:8080\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&answer), 308, "{answer}");
    let location = format!(
        "location: https://shop.test:{}/login?next=%2Fcart",
        tls.port()
    );
    assert!(
        answer
            .to_ascii_lowercase()
            .contains(&location.to_ascii_lowercase()),
        "{location} not in {answer}"
    );

    let acme = raw(
        proxy.addr,
        b"GET /.well-known/acme-challenge/abc HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&acme), 200, "{acme}");

    let r = certs::get(tls, "shop.test", ca.client(&[b"h2"]), "/login").await;
    assert_eq!((r.status, r.body.as_str()), (200, "token"));
}

#[tokio::test]
async fn a_client_that_never_finishes_the_handshake_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["shop.test"]).write(dir.path(), "shop");
    let yaml = format!(
        "server:\n  request_header_timeout: 300ms\n{}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200 }} }}\n",
        single(&cert, &key)
    );
    let proxy = start(&yaml, dir).await;
    let mut silent = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(Duration::from_secs(3), silent.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "still open: {closed:?}"
    );
}

#[tokio::test]
async fn an_https_upstream_is_verified_against_its_configured_ca_with_the_url_host_as_sni() {
    let upstream_ca = Ca::new("upstream CA");
    let backend = TlsUpstream::start(&upstream_ca.issue(&["localhost"])).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = upstream_ca.write(dir.path(), "upstream-ca.pem");
    let url = format!("https://localhost:{}", backend.addr.port());
    let yaml = format!(
        "upstreams:\n  app: {{ url: \"{url}\", ca: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        ca_file.display()
    );
    let proxy = start(&yaml, dir).await;
    let http = common::client();
    for _ in 0..3 {
        let resp = http.get(proxy.url("/over-tls")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let body: serde_json::Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        assert_eq!(body["uri"], "/over-tls");
        assert_eq!(body["version"], "HTTP/1.1");
    }
    let names = backend.sni.lock().clone();
    assert_eq!(
        names.first().cloned().flatten().as_deref(),
        Some("localhost")
    );
    assert_eq!(
        names.len(),
        1,
        "three requests, one pooled keep-alive connection"
    );
}

#[tokio::test]
async fn an_https_upstream_with_an_untrusted_certificate_gets_502() {
    let backend = TlsUpstream::start(&Ca::new("someone else").issue(&["localhost"])).await;
    let dir = tempfile::tempdir().unwrap();
    let our_ca = Ca::new("our CA").write(dir.path(), "ca.pem");
    let url = format!("https://localhost:{}", backend.addr.port());
    // Once against a CA that did not sign it, once against the system roots.
    for extra in [format!(", ca: \"{}\"", our_ca.display()), String::new()] {
        let dir = tempfile::tempdir().unwrap();
        let proxy = start(&config("  {}", &url, &extra), dir).await;
        let resp = common::client().get(proxy.url("/x")).send().await.unwrap();
        assert_eq!(resp.status(), 502, "{extra}");
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
    }
    assert_eq!(
        backend
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    // Both failures were tollgate refusing the certificate, not any other
    // connect failure: the backend saw the handshake end in tollgate's alert.
    let failed = backend.failed_handshakes.lock().clone();
    assert!(
        failed.len() >= 2
            && failed
                .iter()
                .all(|e| e.contains("UnknownCA") || e.contains("BadCertificate")),
        "{failed:?}"
    );
}

#[tokio::test]
async fn insecure_skip_verify_accepts_any_upstream_certificate() {
    let backend = TlsUpstream::start(&Ca::new("someone else").issue(&["localhost"])).await;
    let url = format!("https://localhost:{}", backend.addr.port());
    let proxy = start(
        &config("  {}", &url, ", insecure_skip_verify: true"),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let resp = common::client().get(proxy.url("/x")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_config_edit_that_names_other_certificate_files_switches_to_them() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (old, new) = (ca.issue(&["shop.test"]), ca.issue(&["shop.test"]));
    let (c1, k1) = old.write(dir.path(), "old");
    let (c2, k2) = new.write(dir.path(), "new");
    let proxy = start(&config(&single(&c1, &k1), &upstream.url(), ""), dir).await;
    let client = ca.client(&[b"http/1.1"]);
    let served = |client| async move {
        let s = certs::handshake(proxy.addr, "shop.test", client)
            .await
            .unwrap();
        certs::served_certificate(&s)
    };
    assert_eq!(served(client.clone()).await, old.der);
    proxy.write_config(&config(&single(&c2, &k2), &upstream.url(), ""));
    let switched = eventually(Duration::from_secs(5), || {
        let (client, want) = (client.clone(), new.der.clone());
        async move { served(client).await == want }
    })
    .await;
    assert!(
        switched,
        "the certificate of the new config was never served"
    );
}
