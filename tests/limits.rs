//! End-to-end limiting over real sockets: the 429 contract, exact admission under concurrency, windows.

mod common;

use common::T0;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{client, Proxy, Upstream};
use tollgate::clock::ManualClock;

const PING: &str = "
limiters:
  strict: { algorithm: fixed_window, limit: 5, window: 60s, key: client }
routes:
  - name: ping
    match: { path: /ping }
    respond: { status: 200, body: \"pong\\n\" }
    limiters: [strict]
";

#[tokio::test]
async fn the_sixth_ping_in_a_window_is_a_429_with_headers_and_problem_body() {
    let clock = ManualClock::at(T0);
    let proxy = Proxy::start_with_clock(PING, clock.clone()).await;
    let c = client();
    for i in 1..=5u64 {
        let r = c.get(proxy.url("/ping")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit"], "5");
        assert_eq!(
            r.headers()["x-ratelimit-remaining"],
            (5 - i).to_string().as_str()
        );
        assert_eq!(r.headers()["x-ratelimit-reset"], "1767225660");
        assert_eq!(r.headers()["ratelimit-policy"], "\"strict\";q=5;w=60");
        assert_eq!(
            r.headers()["ratelimit"],
            format!("\"strict\";r={};t=40", 5 - i).as_str()
        );
        assert_eq!(r.text().await.unwrap(), "pong\n");
    }
    let r = c.get(proxy.url("/ping")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "40");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_string();
    let body: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "type": "rate-limit-exceeded", "title": "Too Many Requests", "status": 429,
            "detail": "Rate limit of 5 requests per 60s exceeded for key 'ip:127.0.0.1'.",
            "limiter": "strict", "limit": 5, "window_seconds": 60, "retry_after": 40,
            "violated-policies": ["strict"], "request_id": request_id
        })
    );

    // The next window starts exactly at the minute.
    clock.advance(Duration::from_secs(39));
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 429);
    clock.advance(Duration::from_secs(1));
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
}

#[tokio::test]
async fn a_429_keeps_the_connection_open() {
    let proxy = Proxy::start_with_clock(PING, ManualClock::at(T0)).await;
    let mut req = Vec::new();
    for _ in 0..7 {
        req.extend_from_slice(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    let answer = common::raw(proxy.addr, &req, Duration::from_millis(500)).await;
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 5, "{answer}");
    assert_eq!(
        answer.matches("HTTP/1.1 429").count(),
        2,
        "both 429s came on the same connection"
    );
}

async fn exactly_limit_admitted_under_concurrency(store: &str) {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: {store} }}\nupstreams:\n  app: {{ url: \"{}\" }}\nlimiters:\n  fifty: {{ limit: 50, window: 60s }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app, limiters: [fifty] }}\n",
        upstream.url()
    );
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let c = client();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (c, url) = (c.clone(), proxy.url(&format!("/r/{i}")));
            tokio::spawn(async move { common::status(&c, &url, &[]).await })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((ok, limited), (50, 150), "on the {store} store");
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_requests_against_fifty_admit_exactly_fifty_in_memory() {
    exactly_limit_admitted_under_concurrency("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_requests_against_fifty_admit_exactly_fifty_on_sqlite() {
    exactly_limit_admitted_under_concurrency("sqlite").await;
}

#[tokio::test]
async fn routes_sharing_a_limiter_share_its_counters_and_the_tightest_limiter_sets_the_headers() {
    let yaml = "
limiters:
  global: { limit: 3, window: 60s }
  strict: { limit: 10, window: 60s }
routes:
  - { name: a, match: { path: /a }, respond: { status: 200 }, limiters: [strict, global] }
  - { name: b, match: { path: /b }, respond: { status: 200 }, limiters: [global] }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let c = client();
    let a = c.get(proxy.url("/a")).send().await.unwrap();
    assert_eq!(
        a.headers()["x-ratelimit-limit"],
        "3",
        "global has fewer left than strict"
    );
    assert_eq!(
        a.headers()["ratelimit-policy"],
        "\"strict\";q=10;w=60, \"global\";q=3;w=60"
    );
    assert_eq!(common::status(&c, &proxy.url("/b"), &[]).await, 200);
    assert_eq!(common::status(&c, &proxy.url("/b"), &[]).await, 200);
    let denied = c.get(proxy.url("/a")).send().await.unwrap();
    assert_eq!(denied.status(), 429);
    let body: serde_json::Value = denied.json_text().await;
    assert_eq!(body["violated-policies"], serde_json::json!(["global"]));
}

#[tokio::test]
async fn a_strict_limit_cannot_be_bypassed_by_spelling_the_path_differently() {
    let yaml = "
limiters:
  strict: { limit: 2, window: 60s }
routes:
  - { name: login, match: { path: /login }, respond: { status: 200 }, limiters: [strict] }
  - { name: other, match: { path_prefix: / }, respond: { status: 204 } }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let spellings = [
        "/login",
        "//login",
        "/./login",
        "/%6Cogin",
        "/login/",
        "/x/../login",
    ];
    let mut statuses = Vec::new();
    for p in spellings {
        let raw = common::raw(
            proxy.addr,
            format!("GET {p} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            Duration::from_secs(2),
        )
        .await;
        statuses.push(common::status_of(&raw));
    }
    assert_eq!(statuses, vec![200, 200, 429, 429, 429, 429]);
}

#[tokio::test]
async fn exempt_clients_are_never_limited() {
    let yaml = "
identity: { exempt: [127.0.0.0/8] }
limiters:
  strict: { limit: 1, window: 60s }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200 }, limiters: [strict] }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let c = client();
    for _ in 0..5 {
        let r = c.get(proxy.url("/ping")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(!r.headers().contains_key("x-ratelimit-limit"));
    }
}

#[tokio::test]
async fn retry_after_is_the_longest_wait_among_the_limiters_that_rejected() {
    let yaml = "
limiters:
  minute: { limit: 1, window: 60s }
  hour: { limit: 1, window: 3600s }
routes:
  - { name: r, match: { path: /r }, respond: { status: 200 }, limiters: [minute, hour] }
";
    let clock = ManualClock::at(T0);
    let proxy = Proxy::start_with_clock(yaml, clock).await;
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/r"), &[]).await, 200);
    let r = c.get(proxy.url("/r")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    // T0 is 20 s into its minute and into its hour.
    assert_eq!(r.headers()["retry-after"], "3580");
    let body = r.json_text().await;
    assert_eq!(body["limiter"], "hour");
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["minute", "hour"])
    );
}

trait JsonText {
    async fn json_text(self) -> serde_json::Value;
}

impl JsonText for reqwest::Response {
    async fn json_text(self) -> serde_json::Value {
        serde_json::from_str(&self.text().await.unwrap()).unwrap()
    }
}
