//! Behaviour over time on `App::handle`, in virtual time: leaky-bucket shaping, windows, token refills, bans and upstream timeouts, none waited out.
//!
//! Every test runs on a paused tokio runtime and an app whose limiters read
//! tokio's clock ([`common::app`]): a shaping delay or an upstream timeout
//! is a tokio timer the paused runtime skips to, and `tokio::time::advance`
//! moves the limiters' clock with it. Times are asserted exactly where the
//! product promises exactness, since no scheduler noise can reach them.

mod common;

use std::time::Duration;

use common::app::{app, from, get, text};
use http::StatusCode;
use tokio::time::{advance, Instant};

const MS: Duration = Duration::from_millis(1);
const CLIENT: &str = "192.0.2.1:40000";

fn respond_with(limiters: &str) -> String {
    format!(
        "limiters:\n{limiters}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }}, limiters: [l] }}\n"
    )
}

/// Sends `n` requests at once; each one's status and when it was answered,
/// counted from the moment they were sent.
async fn burst(app: &tollgate::App, n: usize) -> Vec<(StatusCode, Duration)> {
    let sent = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                let resp = app.handle(get(&format!("/b/{i}"), &[]), from(CLIENT)).await;
                (resp.status(), sent.elapsed())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.expect("request task"));
    }
    answers
}

#[tokio::test(start_paused = true)]
async fn a_leaky_bucket_releases_a_burst_exactly_at_the_leak_rate() {
    let app = app(&respond_with(
        "  l: { algorithm: leaky_bucket, capacity: 10, leak_per_second: 5, key: route }",
    ));
    let started = std::time::Instant::now();
    let mut answers = burst(&app, 6).await;
    answers.sort_by_key(|(_, at)| *at);
    let released: Vec<Duration> = answers.iter().map(|(_, at)| *at).collect();
    // 5/s: one every 200 ms, the first at once.
    let expected: Vec<Duration> = (0..6).map(|i| 200 * MS * i).collect();
    assert_eq!(released, expected);
    assert!(
        answers.iter().all(|(s, _)| *s == StatusCode::OK),
        "{answers:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "a second of shaping was waited out in real time: {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_burst_beyond_the_leaky_bucket_capacity_gets_its_429s_at_once() {
    let app = app(&respond_with(
        "  l: { algorithm: leaky_bucket, capacity: 5, leak_per_second: 20, key: route }",
    ));
    let answers = burst(&app, 10).await;
    let refused: Vec<_> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    // One goes at once, five wait their turn, four find the queue full.
    assert_eq!(refused.len(), 4, "{answers:?}");
    assert!(refused.iter().all(|(_, at)| at.is_zero()), "{answers:?}");
    let mut waited: Vec<Duration> = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .map(|(_, at)| *at)
        .collect();
    waited.sort();
    let expected: Vec<Duration> = (0..6).map(|i| 50 * MS * i).collect();
    assert_eq!(waited, expected);
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_whose_client_leaves_gives_its_place_back() {
    let app = app(&respond_with(
        "  l: { algorithm: leaky_bucket, capacity: 1, leak_per_second: 2, key: route }",
    ));
    let at_once = app.handle(get("/a", &[]), from(CLIENT)).await;
    assert_eq!(at_once.status(), StatusCode::OK);
    // B's turn is 500 ms away; its client gives up after 100 ms.
    let b = tokio::time::timeout(100 * MS, app.handle(get("/b", &[]), from(CLIENT))).await;
    assert!(b.is_err(), "B was still queued");
    // Had B kept its place, the one-place queue would be full: C would be a 429.
    let sent = Instant::now();
    let c = app.handle(get("/c", &[]), from(CLIENT)).await;
    assert_eq!(c.status(), StatusCode::OK);
    assert_eq!(sent.elapsed(), 400 * MS, "C takes B's turn, 500 ms after A");
}

#[tokio::test(start_paused = true)]
async fn a_fixed_window_refuses_until_its_last_second_and_admits_from_the_next_minute() {
    let app = app(&respond_with(
        "  l: { algorithm: fixed_window, limit: 5, window: 60s, key: ip }",
    ));
    for n in 1..=5 {
        let resp = app.handle(get("/", &[]), from(CLIENT)).await;
        assert_eq!(resp.status(), StatusCode::OK, "request {n}");
    }
    // T0 is 20 s into its minute.
    let refused = app.handle(get("/", &[]), from(CLIENT)).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "40");
    advance(Duration::from_secs(39)).await;
    let last_second = app.handle(get("/", &[]), from(CLIENT)).await;
    assert_eq!(last_second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(last_second.headers()["retry-after"], "1");
    advance(Duration::from_secs(1)).await;
    let next_minute = app.handle(get("/", &[]), from(CLIENT)).await;
    assert_eq!(next_minute.status(), StatusCode::OK);
    assert_eq!(next_minute.headers()["x-ratelimit-remaining"], "4");
}

#[tokio::test(start_paused = true)]
async fn a_token_bucket_gives_back_one_token_per_refill_interval() {
    let app = app(&respond_with(
        "  l: { algorithm: token_bucket, capacity: 3, refill_per_second: 2, key: ip }",
    ));
    let status = || async { app.handle(get("/", &[]), from(CLIENT)).await.status() };
    for _ in 0..3 {
        assert_eq!(status().await, StatusCode::OK);
    }
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    advance(499 * MS).await;
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS, "not yet");
    advance(MS).await;
    assert_eq!(status().await, StatusCode::OK, "one token after 500 ms");
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS, "only one");
}

#[tokio::test(start_paused = true)]
async fn a_ban_refuses_a_key_for_its_whole_duration_across_windows_and_then_lifts() {
    let app = app(&respond_with(
        "  l: { algorithm: fixed_window, limit: 1, window: 60s, key: ip, ban: { after: 2, for: 1h } }",
    ));
    let send = || async { app.handle(get("/", &[]), from(CLIENT)).await };
    assert_eq!(send().await.status(), StatusCode::OK);
    assert_eq!(send().await.status(), StatusCode::TOO_MANY_REQUESTS);
    // The second refusal within the window bans the key for an hour.
    assert_eq!(send().await.status(), StatusCode::TOO_MANY_REQUESTS);
    advance(Duration::from_secs(60)).await;
    let banned = send().await;
    assert_eq!(
        banned.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a new window does not lift a ban"
    );
    assert_eq!(banned.headers()["retry-after"], "3540");
    assert!(
        !banned.headers().contains_key("x-ratelimit-limit"),
        "no limiter was asked"
    );
    let body = text(banned).await;
    assert!(body.contains("ip:192.0.2.1"), "{body}");
    advance(Duration::from_secs(3539)).await;
    assert_eq!(
        send().await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "still banned"
    );
    advance(Duration::from_secs(1)).await;
    assert_eq!(send().await.status(), StatusCode::OK, "the hour is over");
    // Another client was never touched by the ban.
    let other = app.handle(get("/", &[]), from("192.0.2.2:40000")).await;
    assert_eq!(other.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_slow_upstream_is_a_504_problem_at_its_timeout_not_before() {
    let upstream = common::Upstream::start().await;
    let app = app(&format!(
        "upstreams:\n  app: {{ url: \"{}\", timeout: 30s }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        upstream.url()
    ));
    let started = std::time::Instant::now();
    let sent = Instant::now();
    // The stub would answer after ten minutes (of the same paused clock).
    let resp = app.handle(get("/slow/600000", &[]), from(CLIENT)).await;
    let waited = sent.elapsed();
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_str(&text(resp).await).expect("json");
    assert_eq!(body["type"], "upstream-timeout", "{body}");
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "answered after {waited:?} of virtual time"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the timeout was waited out in real time: {:?}",
        started.elapsed()
    );
}
