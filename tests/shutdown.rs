//! Shutdown: in-flight requests finish, new connections are refused, and counters survive
//! SIGTERM (all of them) and `kill -9` (all but the last flush interval).

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{http, window_start_now, Process, Proxy, Upstream};

fn forward_to(upstream: &Upstream, grace: &str) -> String {
    format!(
        "server: {{ shutdown_grace: {grace} }}\nupstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        upstream.url()
    )
}

/// Polls until the public port refuses connections, at most `limit`.
async fn refused_within(addr: std::net::SocketAddr, limit: Duration) -> bool {
    common::eventually(limit, || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_while_new_connections_are_refused() {
    let upstream = Upstream::start().await;
    // A grace far above the request's 1.5 s, so that "run waited for the
    // request" and "run waited out the grace" stay apart on a loaded machine
    // (a CI run with 3 test binaries at once saw run return 3.47 s after
    // shutdown began; alone it returns at 1.5 s).
    let mut proxy = Proxy::start(&forward_to(&upstream, "20s")).await;
    let c = common::client();
    let url = proxy.url("/slow/1500");
    let in_flight = tokio::spawn(async move {
        let r = c.get(url).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    upstream.seen.wait_for_in_flight().await;

    let started = Instant::now();
    let run = proxy.begin_shutdown();
    assert!(
        refused_within(proxy.addr, Duration::from_millis(500)).await,
        "the listener still accepts after shutdown began"
    );
    assert!(
        !in_flight.is_finished(),
        "the slow request is still being served while new connections are refused"
    );

    let (status, body) = tokio::time::timeout(Duration::from_secs(20), in_flight)
        .await
        .expect("the in-flight request ends")
        .unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("/slow/1500"), "{body}");
    tokio::time::timeout(Duration::from_secs(25), run)
        .await
        .expect("run returns within shutdown_grace")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "run waited for the request, not for the whole grace: {took:?}"
    );
    assert_eq!(upstream.seen.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_within_shutdown_grace_when_a_request_outlasts_it() {
    let upstream = Upstream::start().await;
    let mut proxy = Proxy::start(&forward_to(&upstream, "500ms")).await;
    let c = common::client();
    let url = proxy.url("/slow/10000");
    let stuck = tokio::spawn(async move { c.get(url).send().await.map(|r| r.status().as_u16()) });
    upstream.seen.wait_for_in_flight().await;
    let started = Instant::now();
    let run = proxy.begin_shutdown();
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run returns")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450),
        "it waited for the grace first: {took:?}"
    );
    assert!(
        took < Duration::from_millis(2000),
        "it did not wait beyond the grace: {took:?}"
    );
    stuck.abort();
}

/// One fixed window of an hour, so a scenario of a few seconds stays inside it.
const HOUR: Duration = Duration::from_secs(3600);

fn five_per_hour(flush: &str) -> String {
    format!(
        "store: {{ flush_interval: {flush} }}\nlimiters:\n  five: {{ limit: 5, window: 3600s }}\nroutes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [five] }}\n"
    )
}

fn ping(p: &Process) -> u16 {
    http(p.addr, "GET", "/ping").unwrap().status
}

/// `five`'s remaining count for 127.0.0.1, from the admin API.
fn remaining(p: &Process) -> u64 {
    let status = http(p.admin, "GET", "/status?key=127.0.0.1")
        .unwrap()
        .json();
    let five = status["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limiter"] == "five")
        .cloned();
    five.and_then(|l| l["remaining"].as_u64())
        .unwrap_or_else(|| panic!("no remaining for five in {status}"))
}

#[test]
fn the_last_requests_access_records_are_written_before_sigterm_exits() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Process::serve(
        "routes:\n  - { name: ping, match: { path: /ping }, respond: { status: 200, body: pong } }\n",
        dir.path(),
    );
    let mut last = String::new();
    for _ in 0..50 {
        let r = http(p.addr, "GET", "/ping").unwrap();
        assert_eq!(r.status, 200);
        last = r.header("x-request-id").unwrap().to_string();
    }
    // At once: the log writer rests between batches, shutdown must not outrun it.
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    let out = p.output();
    let logged = out.lines().filter(|l| l.contains(" rid=")).count();
    assert_eq!(logged, 50, "every request has its record:\n{out}");
    assert!(out.contains(&format!("rid={last} ")), "{out}");
}

#[test]
fn counters_survive_sigterm_and_a_restart() {
    common::wait_for_window_room(HOUR, Duration::from_secs(60));
    let window = window_start_now(HOUR);
    let dir = tempfile::tempdir().unwrap();
    // An hour-long flush interval: only the shutdown path can have written the counters.
    let yaml = five_per_hour("1h");

    let mut first = Process::serve(&yaml, dir.path());
    for expected_remaining in ["4", "3", "2"] {
        let r = http(first.addr, "GET", "/ping").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(expected_remaining));
    }
    first.signal("TERM");
    let status = first.wait_exit(Duration::from_secs(15));
    assert!(
        status.success(),
        "SIGTERM exits 0, got {status}:\n{}",
        first.output()
    );
    assert!(first.output().contains("stopped"), "{}", first.output());

    let second = Process::serve(&yaml, dir.path());
    assert_eq!(
        remaining(&second),
        2,
        "the restarted proxy knows the 3 requests"
    );
    assert_eq!(ping(&second), 200);
    assert_eq!(ping(&second), 200);
    assert_eq!(ping(&second), 429);
    assert_eq!(remaining(&second), 0);
    assert_eq!(
        window_start_now(HOUR),
        window,
        "the scenario stayed in one window"
    );
}

#[test]
fn kill_9_loses_at_most_the_last_flush_interval() {
    common::wait_for_window_room(HOUR, Duration::from_secs(60));
    let window = window_start_now(HOUR);
    let dir = tempfile::tempdir().unwrap();
    const FLUSH: Duration = Duration::from_millis(200);
    let yaml = five_per_hour("200ms").replace("limit: 5", "limit: 100");
    // OLD requests, then a little more than one flush interval, then RECENT
    // requests and the kill at once: every old one must be on disk.
    const OLD: u64 = 7;
    const RECENT: u64 = 5;

    let mut first = Process::serve(&yaml, dir.path());
    for _ in 0..OLD {
        assert_eq!(ping(&first), 200);
    }
    std::thread::sleep(FLUSH + Duration::from_millis(150));
    for _ in 0..RECENT {
        assert_eq!(ping(&first), 200);
    }
    first.signal("KILL");
    let status = first.wait_exit(Duration::from_secs(5));
    assert!(!status.success(), "killed, not exited: {status}");

    let conn = rusqlite::Connection::open(dir.path().join("tollgate.db")).unwrap();
    let (start, count): (String, u64) = conn
        .query_row(
            "SELECT window_start, count FROM rate_limit_windows WHERE key = 'five:ip:127.0.0.1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("the counter row was flushed before the kill");
    assert!(
        (OLD..=OLD + RECENT).contains(&count),
        "every request older than one flush interval is on disk, at most the last interval's are lost: {count}"
    );
    assert_eq!(start, tollgate::clock::iso8601(window));
    drop(conn);

    let second = Process::serve(&yaml, dir.path());
    assert_eq!(remaining(&second), 100 - count);
    let r = http(second.addr, "GET", "/ping").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some((100 - count - 1).to_string().as_str())
    );
    assert_eq!(
        window_start_now(HOUR),
        window,
        "the scenario stayed in one window"
    );
}
