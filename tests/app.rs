//! The app called as a value, without sockets: limits, routes and identity decided on `Request`s handed to `App::handle`.
//!
//! Nothing here binds a port: each test builds an `App` from YAML with a
//! memory store ([`common::app`]) and awaits its answers directly, on paused
//! tokio time that the limiters' clock follows (tests/app_time.rs has the
//! behaviour that takes time). The
//! end-to-end suites (limits.rs, identity.rs, proxy.rs, …) keep real sockets
//! for what only a socket shows (framing, connections, upstreams).

mod common;

use bytes::Bytes;
use common::app::{app, from, get, text};
use http::{Request, StatusCode};

const PING: &str = "limiters:
  per_ip: { algorithm: fixed_window, limit: 5, window: 60s, key: ip }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200, body: \"pong\\n\" }, limiters: [per_ip] }
";

#[tokio::test(start_paused = true)]
async fn a_respond_route_answers_with_its_body() {
    let app = app(PING);
    let resp = app.handle(get("/ping", &[]), from("192.0.2.1:40000")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(text(resp).await, "pong\n");
}

#[tokio::test(start_paused = true)]
async fn the_sixth_request_in_a_five_per_minute_window_is_a_429_with_retry_after() {
    let app = app(PING);
    for n in 1..=5 {
        let resp = app.handle(get("/ping", &[]), from("192.0.2.1:40000")).await;
        assert_eq!(resp.status(), StatusCode::OK, "request {n}");
    }
    let resp = app.handle(get("/ping", &[]), from("192.0.2.1:40000")).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // 20 s into the minute: the window ends in 40 s.
    assert_eq!(resp.headers()["retry-after"], "40");
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_str(&text(resp).await).expect("json");
    assert_eq!(body["limiter"], "per_ip");
    assert_eq!(body["limit"], 5);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_path_is_a_404_problem() {
    let app = app(PING);
    let resp = app
        .handle(get("/nowhere", &[]), from("192.0.2.1:40000"))
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
}

const ONE_PER_MINUTE: &str = "limiters:
  once: { limit: 1, window: 60s, key: client }
routes:
  - { name: r, match: { path_prefix: / }, respond: { status: 200 }, limiters: [once] }
";

#[tokio::test(start_paused = true)]
async fn behind_a_trusted_proxy_the_forwarded_for_address_is_the_client() {
    let app = app(&format!(
        "identity: {{ trusted_proxies: [10.0.0.0/8] }}\n{ONE_PER_MINUTE}"
    ));
    let proxy = from("10.0.0.2:50000");
    let first = get("/", &[("x-forwarded-for", "198.51.100.7")]);
    assert_eq!(app.handle(first, proxy).await.status(), StatusCode::OK);
    // Another client behind the same proxy has its own counter …
    let other = get("/", &[("x-forwarded-for", "198.51.100.8")]);
    assert_eq!(app.handle(other, proxy).await.status(), StatusCode::OK);
    // … and the first one is at its limit.
    let again = get("/", &[("x-forwarded-for", "198.51.100.7")]);
    assert_eq!(
        app.handle(again, proxy).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(start_paused = true)]
async fn an_untrusted_peer_cannot_choose_its_client_address_with_forwarded_for() {
    let app = app(&format!(
        "identity: {{ trusted_proxies: [10.0.0.0/8] }}\n{ONE_PER_MINUTE}"
    ));
    let peer = from("203.0.113.9:50000");
    let first = get("/", &[("x-forwarded-for", "198.51.100.7")]);
    assert_eq!(app.handle(first, peer).await.status(), StatusCode::OK);
    // A new spelling of X-Forwarded-For is no new client: the peer is.
    let second = get("/", &[("x-forwarded-for", "198.51.100.8")]);
    let resp = app.handle(second, peer).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(text(resp).await.contains("ip:203.0.113.9"));
}

#[tokio::test(start_paused = true)]
async fn a_listed_api_key_gets_its_own_counter_and_an_unknown_one_is_refused() {
    let app = app(&format!(
        "identity: {{ api_keys: [key-alpha, key-beta] }}\n{ONE_PER_MINUTE}"
    ));
    let peer = from("192.0.2.1:40000");
    for key in ["key-alpha", "key-beta"] {
        let resp = app.handle(get("/", &[("x-client-key", key)]), peer).await;
        assert_eq!(resp.status(), StatusCode::OK, "{key}");
    }
    let alpha_again = app
        .handle(get("/", &[("x-client-key", "key-alpha")]), peer)
        .await;
    assert_eq!(alpha_again.status(), StatusCode::TOO_MANY_REQUESTS);
    let invented = app
        .handle(get("/", &[("x-client-key", "key-gamma")]), peer)
        .await;
    assert_eq!(invented.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(start_paused = true)]
async fn a_request_body_built_in_memory_reaches_a_limited_route() {
    let app = app(PING);
    let req = Request::post("/ping")
        .header("host", "shop.example")
        .body(Bytes::from_static(b"name=value"))
        .expect("request");
    let resp = app.handle(req, from("192.0.2.1:40000")).await;
    assert_eq!(resp.status(), StatusCode::OK);
}
