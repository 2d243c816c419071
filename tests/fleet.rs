//! A fleet on one Redis: tollgates share every limit exactly, survive Redis going away under each
//! `on_error` policy without waiting longer than the timeout, and agree despite skewed clocks.

mod common;

use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::{concurrent, eventually_blocking, http, wait_for_window_room, Process, Proxy, Reply};
use tollgate::clock::ManualClock;
use tollgate::limiter::NANOS_PER_SEC as S;

/// The fleet's Redis timeout. 50 ms (the default) made the outage tests'
/// before-and-after checks fail on a loaded machine: a Redis that answered
/// in 60 ms was an outage there (503, or a count kept locally).
const STORE_TIMEOUT: Duration = Duration::from_millis(250);

fn fleet_yaml(redis: &RedisServer, on_error: &str, limiters: &str, routes: &str) -> String {
    format!(
        "store: {{ backend: redis, url: \"{}\", prefix: \"fleet:\", timeout: {}ms, on_error: {on_error} }}\nlimiters:\n{limiters}routes:\n{routes}",
        redis.url(),
        STORE_TIMEOUT.as_millis()
    )
}

fn get(p: &Process, path: &str) -> Reply {
    http(p.addr, "GET", path).unwrap_or_else(|e| panic!("{path}: {e}\n{}", p.output()))
}

#[test]
fn two_tollgates_on_one_redis_admit_exactly_the_limit_in_total() {
    let redis = RedisServer::start();
    let yaml = fleet_yaml(
        &redis,
        "deny",
        "  five: { algorithm: fixed_window, limit: 5, window: 3600s, key: global }\n  fifty: { algorithm: sliding_window, limit: 50, window: 3600s, key: global }\n",
        "  - { name: five, match: { path: /five }, respond: { status: 200, body: ok }, limiters: [five] }\n  - { name: fifty, match: { path: /fifty }, respond: { status: 200, body: ok }, limiters: [fifty] }\n",
    )
    // This test is about exactness, not the outage timer: on a busy machine
    // 200 concurrent scripts can take longer than 50 ms, and `deny` would
    // turn that into a 503 that says nothing about the count.
    .replace(&format!("timeout: {}ms", STORE_TIMEOUT.as_millis()), "timeout: 5s");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Process::serve(&yaml, dir_a.path());
    let b = Process::serve(&yaml, dir_b.path());
    // Redis decides on its own clock: hour-long windows make waiting for room rare.
    wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(15));

    assert_eq!(
        concurrent(&[&a, &b], "/five", 40),
        5,
        "5/h across the fleet"
    );
    assert_eq!(
        concurrent(&[&a, &b], "/fifty", 200),
        50,
        "50/h under 200 concurrent requests"
    );
    let denied = get(&b, "/five");
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
}

/// Two proxies with one policy: shared counting, Redis dies, then comes back.
fn outage(on_error: &str, while_down: impl Fn(&[Reply])) {
    let mut redis = RedisServer::start();
    let yaml = fleet_yaml(
        &redis,
        on_error,
        "  three: { algorithm: sliding_window, limit: 3, window: 60s, key: global }\n",
        "  - { name: all, match: { path_prefix: / }, respond: { status: 200, body: ok }, limiters: [three] }\n",
    );
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Process::serve(&yaml, dir_a.path());
    let b = Process::serve(&yaml, dir_b.path());
    let shared = |label: &str| {
        let got: Vec<u16> = [&a, &b, &a, &b]
            .iter()
            .map(|p| get(p, "/").status)
            .collect();
        assert_eq!(
            got,
            [200, 200, 200, 429],
            "{label}: one limit for both proxies"
        );
    };
    shared("before the outage");

    redis.stop();
    let mut replies = Vec::new();
    for _ in 0..6 {
        let started = Instant::now();
        replies.push(get(&a, "/"));
        let waited = started.elapsed();
        assert!(
            waited < STORE_TIMEOUT + Duration::from_millis(250),
            "{on_error}: a request waited {waited:?} with a {STORE_TIMEOUT:?} store timeout"
        );
    }
    while_down(&replies);
    assert_eq!(http(a.admin, "GET", "/readyz").unwrap().status, 503);
    let metrics = http(a.admin, "GET", "/metrics").unwrap().body;
    assert!(
        metrics.contains(&format!(
            "tollgate_store_fallback_total{{policy=\"{on_error}\"}} 6"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_store_errors_total{backend=\"redis\""));

    redis.restart();
    for p in [&a, &b] {
        let ready = eventually_blocking(Duration::from_secs(5), || {
            http(p.admin, "GET", "/readyz").unwrap().status == 200
        });
        assert!(ready, "never ready again:\n{}", p.output());
    }
    shared("after Redis restarted (empty), without restarting tollgate");
}

#[test]
fn with_on_error_allow_requests_pass_while_redis_is_down() {
    outage("allow", |replies| {
        assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    });
}

#[test]
fn with_on_error_deny_requests_get_503_problem_json_while_redis_is_down() {
    outage("deny", |replies| {
        for r in replies {
            assert_eq!(r.status, 503, "{r:?}");
            assert_eq!(r.header("content-type"), Some("application/problem+json"));
            assert!(r
                .header("retry-after")
                .is_some_and(|v| v.parse::<u64>().unwrap() >= 1));
            assert_eq!(r.json()["type"], "store-unavailable");
        }
    });
}

#[test]
fn with_on_error_local_each_proxy_applies_the_limit_itself_while_redis_is_down() {
    outage("local", |replies| {
        let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
        assert_eq!(
            statuses,
            [200, 200, 200, 429, 429, 429],
            "the local limit of 3 holds"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxies_whose_clocks_are_hours_apart_share_one_window() {
    let redis = RedisServer::start();
    let yaml = fleet_yaml(
        &redis,
        "deny",
        "  three: { algorithm: fixed_window, limit: 3, window: 60s, key: global }\n",
        "  - { name: all, match: { path_prefix: / }, respond: { status: 200, body: ok }, limiters: [three] }\n",
    );
    let t0 = 1_767_225_600 * S;
    let early = Proxy::start_with_clock(&yaml, ManualClock::at(t0)).await;
    let late = Proxy::start_with_clock(&yaml, ManualClock::at(t0 + 5 * 3600 * S)).await;
    tokio::task::spawn_blocking(|| {
        wait_for_window_room(Duration::from_secs(60), Duration::from_secs(5))
    })
    .await
    .unwrap();
    let c = common::client();
    let mut statuses = Vec::new();
    let mut resets = Vec::new();
    for p in [&early, &late, &early, &late] {
        let r = c.get(p.url("/")).send().await.unwrap();
        statuses.push(r.status().as_u16());
        resets.push(
            r.headers()["x-ratelimit-reset"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 429], "one window for both clocks");
    assert!(
        resets.windows(2).all(|w| w[0] == w[1]),
        "both announce the reset on Redis' clock: {resets:?}"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let reset: u64 = resets[0].parse().unwrap();
    assert!(
        reset > now && reset <= now + 60,
        "reset {reset} is within a minute of now ({now})"
    );
}
