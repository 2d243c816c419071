//! Automatic HTTPS against a real ACME CA (pebble, real http-01 and tls-alpn-01 validation): obtaining, serving per SNI name, restart, limiters, a CA that is down, renewal under keep-alive, a fleet sharing its storage.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::acme::{
    accept_any, acme_block, config, serial, start, status_of, validation, verified_serial,
    wait_certificate, with_static_name, Scene,
};
use common::certs::{self, Ca, Session};
use common::Upstream;
use serde_json::Value;

#[tokio::test]
async fn http_01_obtains_a_certificate_per_name_and_each_sni_name_gets_a_valid_chain_and_a_proxied_answer(
) {
    let scene = Scene::new().await;
    let acme = scene.acme(&["a.test", "b.test"], "http-01", "");
    // redirect_plain: every plain request is redirected, except the challenge.
    let yaml = config(&acme, &scene.upstream.url(), "    redirect_plain: true", "");
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    let tls = proxy.tls_addr.unwrap();
    // Before any certificate: the name's handshake fails (no other certificate is served).
    let early = certs::handshake(tls, "a.test", accept_any()).await;
    assert!(
        early.is_err(),
        "a managed name without a certificate must not handshake"
    );
    let pebble = scene.pebble(&validation(&proxy, 0));
    let client = pebble.client().await;
    for domain in ["a.test", "b.test"] {
        let serial = wait_certificate(&proxy, domain, &pebble).await;
        let served = verified_serial(tls, domain, client.clone()).await.unwrap();
        assert_eq!(served, serial, "{domain}");
        let answer = certs::get(tls, domain, client.clone(), "/hello").await;
        assert_eq!(answer.status, 200, "{domain}: {}", answer.body);
        assert!(answer.body.contains("/hello"), "proxied: {}", answer.body);
    }
    let a = verified_serial(tls, "a.test", client.clone())
        .await
        .unwrap();
    let b = verified_serial(tls, "b.test", client.clone())
        .await
        .unwrap();
    assert_ne!(a, b, "one certificate per name");
    let status = status_of(&proxy, "a.test").await;
    assert!(
        status["issuer"].as_str().unwrap().contains("Pebble"),
        "{status}"
    );
    assert!(
        status["not_after"].is_string() && status["last_error"].is_null(),
        "{status}"
    );
    let metrics = proxy.metrics().await;
    assert_eq!(
        common::metric(&metrics, "tollgate_acme_orders_total{result=\"ok\"}"),
        Some(2.0),
        "{metrics}"
    );
    let expiry = common::metric(
        &metrics,
        "tollgate_certificate_expiry_seconds{domain=\"a.test\"}",
    )
    .unwrap();
    assert!(expiry > 1.7e9, "a Unix time: {expiry}");
    // The rest of the plain listener still redirects.
    let plain = common::raw(
        proxy.addr,
        b"GET /x HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(common::status_of(&plain), 308, "{plain}");
}

#[tokio::test]
async fn tls_alpn_01_obtains_certificates_on_the_tls_listener_and_serves_them_by_sni() {
    let scene = Scene::new().await;
    let acme = scene.acme(&["c.test", "d.test"], "tls-alpn-01", "");
    let proxy = start(
        &config(&acme, &scene.upstream.url(), "", ""),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let tls = proxy.tls_addr.unwrap();
    let pebble = scene.pebble(&validation(&proxy, 0));
    let client = pebble.client().await;
    for domain in ["c.test", "d.test"] {
        let serial = wait_certificate(&proxy, domain, &pebble).await;
        assert_eq!(
            verified_serial(tls, domain, client.clone()).await.unwrap(),
            serial
        );
        let answer = certs::get(tls, domain, client.clone(), "/over-tls").await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(answer.version, http::Version::HTTP_2, "h2 by ALPN");
    }
    // A client offering only acme-tls/1 outside a validation gets no certificate.
    let mut only_acme = (*client).clone();
    only_acme.alpn_protocols = vec![b"acme-tls/1".to_vec()];
    assert!(certs::handshake(tls, "c.test", Arc::new(only_acme))
        .await
        .is_err());
}

#[tokio::test]
async fn a_restart_serves_the_stored_certificate_and_orders_nothing() {
    let scene = Scene::new().await;
    let acme = scene.acme(&["e.test"], "http-01", "");
    let yaml = config(&acme, &scene.upstream.url(), "", "");
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    let pebble = scene.pebble(&validation(&proxy, 0));
    let serial = wait_certificate(&proxy, "e.test", &pebble).await;
    let orders = pebble.orders();
    assert_eq!(orders, 1, "{}", pebble.output());
    proxy.stop().await;
    let account = std::fs::read_dir(scene.storage())
        .unwrap()
        .flatten()
        .map(|e| e.path().join("account.json"))
        .find(|p| p.exists())
        .expect("the account is stored");
    let account_before = std::fs::read(&account).unwrap();

    let again = start(&yaml, tempfile::tempdir().unwrap()).await;
    let client = pebble.client().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut served = None;
    while served.is_none() && tokio::time::Instant::now() < deadline {
        served = verified_serial(again.tls_addr.unwrap(), "e.test", client.clone())
            .await
            .ok();
        if served.is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(
        served.is_some(),
        "the stored certificate is served after a restart"
    );
    assert_eq!(served.unwrap(), serial);
    // The name's first look ends by scheduling its next one: from then on
    // the decision (serve the stored certificate, order nothing) is made.
    let decided = common::eventually(Duration::from_secs(10), || async {
        status_of(&again, "e.test").await["next_attempt"].is_string()
    })
    .await;
    let status = status_of(&again, "e.test").await;
    assert!(decided, "the first look never scheduled the next: {status}");
    let next = tollgate::clock::parse_iso8601(status["next_attempt"].as_str().unwrap()).unwrap();
    assert!(
        next > unix_now() + 1800,
        "the next look is the hourly one, not an order soon: {status}"
    );
    assert_eq!(pebble.orders(), orders, "no new order: {}", pebble.output());
    assert_eq!(
        std::fs::read(&account).unwrap(),
        account_before,
        "same account"
    );
    assert_eq!(
        status_of(&again, "e.test").await["last_attempt"],
        Value::Null
    );
}

#[tokio::test]
async fn an_http_01_challenge_succeeds_while_every_limiter_of_the_route_is_exhausted() {
    let scene = Scene::new().await;
    let acme = scene.acme(&["f.test"], "http-01", "");
    let limiters =
        "limiters:\n  per_ip: { algorithm: fixed_window, limit: 1, window: 1h, key: ip }";
    let yaml = config(&acme, &scene.upstream.url(), "", limiters);
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    // Exhaust the limiter for 127.0.0.1 (pebble validates from there too).
    let get = |path: &'static str| {
        common::raw(
            proxy.addr,
            format!("GET {path} HTTP/1.1\r\nHost: f.test\r\nConnection: close\r\n\r\n")
                .into_bytes()
                .leak(),
            Duration::from_secs(2),
        )
    };
    assert_eq!(common::status_of(&get("/").await), 200);
    assert_eq!(common::status_of(&get("/").await), 429);
    assert_eq!(
        common::status_of(&get("/.well-known/acme-challenge/unknown").await),
        429,
        "an unknown token is an ordinary request"
    );
    let pebble = scene.pebble(&validation(&proxy, 0));
    wait_certificate(&proxy, "f.test", &pebble).await;
    assert_eq!(common::status_of(&get("/").await), 429, "still limited");
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A "CA" that accepts connections and closes them at once, counting them.
async fn broken_ca() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    (addr, count)
}

#[tokio::test]
async fn with_the_ca_down_other_names_are_served_retries_back_off_and_the_error_is_reported() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let (ca_addr, requests) = broken_ca().await;
    let acme = acme_block(
        &format!("https://{ca_addr}/dir"),
        &ca_file,
        &dir.path().join("acme"),
        &["g.test"],
        "tls-alpn-01",
        "",
    );
    let yaml = with_static_name(&acme, &upstream.url(), dir.path(), &ca);
    let started = std::time::Instant::now();
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    let tls = proxy.tls_addr.unwrap();
    // Delays of 2, 4 and 8 s (±20 %) after failures 1, 2 and 3: each failure's
    // scheduled wait, read from the status, instead of 30 s of watching.
    let mut gaps = Vec::new();
    for failure in 1..=3u64 {
        let last = std::cell::RefCell::new(Value::Null);
        let scheduled = common::eventually(Duration::from_secs(30), || async {
            let status = status_of(&proxy, "g.test").await;
            let at = |field: &str| {
                status[field]
                    .as_str()
                    .and_then(tollgate::clock::parse_iso8601)
            };
            // The new schedule is in once it is later than the attempt it follows.
            let done = status["failures"].as_u64() == Some(failure)
                && matches!((at("last_attempt"), at("next_attempt")), (Some(l), Some(n)) if n > l);
            *last.borrow_mut() = status;
            done
        })
        .await;
        let status = last.into_inner();
        assert!(
            scheduled,
            "failure {failure} never scheduled a retry: {status}"
        );
        let at =
            |field: &str| tollgate::clock::parse_iso8601(status[field].as_str().unwrap()).unwrap();
        gaps.push(at("next_attempt") - at("last_attempt"));
    }
    let elapsed = started.elapsed();
    let seen = requests.load(Ordering::SeqCst);
    // Whole seconds: a wait of 1.6–2.4 s shows as 1–2, plus at most 1 for the
    // second the failed attempt ended in (the CA closes at once).
    assert!(
        (1..=3).contains(&gaps[0]) && (3..=5).contains(&gaps[1]) && (6..=10).contains(&gaps[2]),
        "retry gaps after failures 1, 2, 3: {gaps:?} s (expected about 2, 4, 8)"
    );
    assert!(
        elapsed >= Duration::from_millis(4_800),
        "the third failure came after {elapsed:?}, before the 2 s and 4 s waits (less 20 %) had passed"
    );
    assert_eq!(seen, 3, "one CA connection per attempt, three attempts");
    let answer = certs::get(tls, "static.test", ca.client(&[b"http/1.1"]), "/").await;
    assert_eq!(answer.status, 200, "other names are served");
    // A managed name without a certificate never gets the default pair,
    // even from a client that would accept any certificate.
    assert!(certs::handshake(tls, "g.test", accept_any()).await.is_err());
    assert!(certs::handshake(tls, "other.test", accept_any())
        .await
        .is_ok());
    let status = status_of(&proxy, "g.test").await;
    assert!(status["last_error"].is_string(), "{status}");
    assert!(status["failures"].as_u64().unwrap() >= 3, "{status}");
    assert!(status["next_attempt"].is_string(), "{status}");
    let metrics = proxy.metrics().await;
    let failing = common::metric(
        &metrics,
        "tollgate_certificate_renewal_failing{domain=\"g.test\"}",
    );
    assert_eq!(failing, Some(1.0), "{metrics}");
}

#[tokio::test]
async fn a_renewed_certificate_is_swapped_in_while_keep_alive_clients_go_on_without_a_failure() {
    let scene = Scene::new().await;
    // 75 s certificates renewed 60 s (the least `renew_before` takes) before
    // they expire: 15 s after issuance, time for 20-odd keep-alive requests.
    let acme = scene.acme(&["h.test"], "tls-alpn-01", ", renew_before: 60s");
    let proxy = start(
        &config(&acme, &scene.upstream.url(), "", ""),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let tls = proxy.tls_addr.unwrap();
    let pebble = scene.pebble(&validation(&proxy, 75));
    let client = pebble.client().await;
    let first = wait_certificate(&proxy, "h.test", &pebble).await;
    let stream = certs::handshake(tls, "h.test", client.clone())
        .await
        .unwrap();
    assert_eq!(serial(&certs::served_certificate(&stream)), first);
    let mut session = Session::start(stream).await;
    let mut renewed = None;
    let mut requests = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        let answer = session.get("h.test", "/keep-alive", &[]).await;
        assert_eq!(answer.status, 200, "request {requests}: {}", answer.body);
        requests += 1;
        let now = verified_serial(tls, "h.test", client.clone())
            .await
            .unwrap();
        if now != first {
            renewed = Some(now);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let renewed = renewed.unwrap_or_else(|| panic!("not renewed:\n{}", pebble.output()));
    // The held connection still works after the swap.
    assert_eq!(session.get("h.test", "/after", &[]).await.status, 200);
    assert_eq!(
        status_of(&proxy, "h.test").await["serial"],
        renewed.as_str()
    );
    assert!(requests > 10, "{requests} requests on one connection");
}

#[tokio::test]
async fn two_tollgates_sharing_the_storage_directory_order_once_and_both_serve_the_certificate() {
    let scene = Scene::new().await;
    let acme = scene.acme(&["i.test"], "http-01", "");
    let yaml = config(&acme, &scene.upstream.url(), "", "");
    let one = start(&yaml, tempfile::tempdir().unwrap()).await;
    let two = start(&yaml, tempfile::tempdir().unwrap()).await;
    // pebble validates on the first one's ports: the instance that orders may be
    // either, so a challenge answer must reach every instance (shared storage).
    let pebble = scene.pebble(&validation(&one, 0));
    let client = pebble.client().await;
    let serial = wait_certificate(&one, "i.test", &pebble).await;
    assert_eq!(wait_certificate(&two, "i.test", &pebble).await, serial);
    for p in [&one, &two] {
        assert_eq!(
            verified_serial(p.tls_addr.unwrap(), "i.test", client.clone())
                .await
                .unwrap(),
            serial
        );
    }
    assert_eq!(pebble.orders(), 1, "{}", pebble.output());
}
