//! Leased quotas on a fleet of 4 tollgate processes and one real Redis: far fewer Redis calls
//! for keys far from their limit, never one admission past the limit, and the under-admission
//! leases cost, measured per algorithm.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::{http, http_with, wait_for_window_room, Process};
use tollgate::config::{BackendConfig, LimiterConfig, OnError, RedisConfig, StoreConfig};
use tollgate::limiter::fixed_window::FixedWindow;
use tollgate::limiter::lease::{grant, Lease};
use tollgate::limiter::sliding_window::SlidingWindow;
use tollgate::limiter::token_bucket::TokenBucket;
use tollgate::limiter::{Algorithm, NANOS_PER_SEC as S};
use tollgate::store::{Check, Store};

/// Each algorithm twice, with and without `lease:`, every key a header's
/// value so that one run can use fresh keys.
const LIMITERS: &str = "
  fw: { algorithm: fixed_window, limit: 1000, window: 60s, key: header:X-Key, lease: { max: 50 } }
  fw_plain: { algorithm: fixed_window, limit: 1000, window: 60s, key: header:X-Key }
  sw: { algorithm: sliding_window, limit: 1000, window: 60s, key: header:X-Key, lease: { max: 50 } }
  sw_plain: { algorithm: sliding_window, limit: 1000, window: 60s, key: header:X-Key }
  tb: { algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001, key: header:X-Key, lease: { max: 50 } }
  tb_plain: { algorithm: token_bucket, capacity: 1000, refill_per_second: 0.001, key: header:X-Key }
";

const LIMIT: usize = 1000;
/// A lease not spent for this long is given back (`lease::IDLE`).
const LEASE_IDLE: Duration = tollgate::store::redis::LEASE_IDLE;
const NAMES: [&str; 3] = ["fw", "sw", "tb"];

fn fleet_yaml(redis: &RedisServer) -> String {
    let routes: String = NAMES
        .iter()
        .flat_map(|n| [n.to_string(), format!("{n}_plain")])
        .map(|l| format!("  - {{ name: {l}, match: {{ path: /{l} }}, respond: {{ status: 200, body: ok }}, limiters: [{l}] }}\n"))
        .collect();
    // A prune round every second gives back the units of ended leases soon.
    format!(
        "store: {{ backend: redis, url: \"{}\", prefix: \"lease:\", timeout: 5s, on_error: deny, prune_interval: 1s }}\nlimiters:{LIMITERS}routes:\n{routes}",
        redis.url()
    )
}

/// Four tollgates on one Redis, each in its own directory.
struct Fleet {
    procs: Vec<Process>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Fleet {
    fn start(redis: &RedisServer) -> Fleet {
        let yaml = fleet_yaml(redis);
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        let procs = dirs
            .iter()
            .map(|d| Process::serve(&yaml, d.path()))
            .collect();
        Fleet { procs, _dirs: dirs }
    }

    /// Sends `total` requests to `path` with `X-Key: key` from 8 threads,
    /// request `i` to tollgate `i % 4`; returns how many got 200.
    fn drive(&self, path: &str, key: &str, total: usize) -> usize {
        let next = Arc::new(AtomicUsize::new(0));
        let ok = Arc::new(AtomicUsize::new(0));
        let addrs: Vec<_> = self.procs.iter().map(|p| p.addr).collect();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (next, ok, addrs) = (next.clone(), ok.clone(), addrs.clone());
                let (path, key) = (path.to_string(), key.to_string());
                std::thread::spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= total {
                        return;
                    }
                    let r = http_with(addrs[i % addrs.len()], "GET", &path, &[("X-Key", &key)])
                        .expect("the proxy answers");
                    assert!(
                        matches!(r.status, 200 | 429),
                        "{path}: unexpected {}: {}",
                        r.status,
                        r.body
                    );
                    if r.status == 200 {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("request thread");
        }
        ok.load(Ordering::SeqCst)
    }

    /// The fleet's leased units: granted, then spent, returned and lost.
    fn lease_units(&self) -> [f64; 4] {
        ["granted", "spent", "returned", "lost"]
            .map(|o| self.metric(&format!("tollgate_lease_units_total{{outcome=\"{o}\"}}")))
    }

    /// Whether every lease the fleet was granted has ended and its unspent
    /// units were given back (the give-back call done) or lost.
    fn leases_settled(&self) -> bool {
        let [granted, spent, returned, lost] = self.lease_units();
        granted == spent + returned + lost
    }

    /// The sum of one counter over the fleet's `/metrics`.
    fn metric(&self, series: &str) -> f64 {
        self.procs
            .iter()
            .map(|p| {
                let text = http(p.admin, "GET", "/metrics").expect("metrics").body;
                text.lines()
                    .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            })
            .sum()
    }
}

/// Script calls Redis has run so far (EVALSHA, EVAL, FCALL), from `INFO commandstats`.
fn script_calls(redis: &RedisServer) -> u64 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", redis.port)).expect("redis");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    // A bulk string: `$<len>\r\n<body>\r\n`.
    loop {
        let n = s.read(&mut buf).expect("INFO reply");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        let Some((len, body)) = text.split_once("\r\n") else {
            continue;
        };
        let len: usize = len.trim_start_matches('$').parse().expect("bulk length");
        if body.len() >= len || n == 0 {
            break;
        }
    }
    text.lines()
        .filter_map(|l| {
            let (name, stats) = l.split_once(':')?;
            if !matches!(name, "cmdstat_evalsha" | "cmdstat_eval" | "cmdstat_fcall") {
                return None;
            }
            let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="))?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

/// Whether `name`'s leases end within a test and give their unspent units
/// back with calls of their own: a fixed or sliding window's, after 600 ms.
/// A token bucket's here last 10^4 s (1 % of a refill), and its unspent
/// units are never given back, so no call of theirs can come later.
fn gives_back(name: &str) -> bool {
    matches!(name, "fw" | "sw")
}

/// Redis script calls per request for `requests` requests on each of
/// `keys` fresh keys of `path`, with (when `settle`) the units of every
/// lease given back first (the give-backs are calls too, and counted).
fn calls_per_request(
    redis: &RedisServer,
    fleet: &Fleet,
    path: &str,
    keys: &[&str],
    requests: usize,
    settle: bool,
) -> f64 {
    let before = script_calls(redis);
    for key in keys {
        assert_eq!(
            fleet.drive(path, key, requests),
            requests,
            "{path} {key}: under half the limit, every request passes"
        );
    }
    // Fixed and sliding windows' leases last 600 ms (1 % of 60 s); a
    // prune round every second gives their unspent units back, and those
    // calls count too: wait until every leased unit is accounted for.
    if settle {
        let settled =
            common::eventually_blocking(Duration::from_secs(15), || fleet.leases_settled());
        assert!(
            settled,
            "{path}: leases still open: {:?}",
            fleet.lease_units()
        );
    }
    let calls = script_calls(redis) - before;
    calls as f64 / (keys.len() * requests) as f64
}

#[test]
fn leases_save_ten_times_the_redis_calls_and_never_admit_past_the_limit() {
    let redis = RedisServer::start();
    let fleet = Fleet::start(&redis);
    // Each tollgate's first call loads the script (NOSCRIPT, then again): not per request.
    for p in &fleet.procs {
        let r = http_with(p.addr, "GET", "/fw_plain", &[("X-Key", "warm-up")]).unwrap();
        assert_eq!(r.status, 200);
    }

    let keys = ["a", "b", "c", "d"];
    let mut report = Vec::new();
    for name in NAMES {
        // 400 of 1000 on each key: under half the limit.
        let plain = calls_per_request(&redis, &fleet, &format!("/{name}_plain"), &keys, 400, false);
        let leased = calls_per_request(
            &redis,
            &fleet,
            &format!("/{name}"),
            &keys,
            400,
            gives_back(name),
        );
        report.push(format!(
            "{name}: {plain:.3} calls/request without leases, {leased:.4} with"
        ));
        assert!(
            (plain - 1.0).abs() < 1e-9,
            "{name}: one call per request without leases, got {plain}"
        );
        assert!(
            leased * 10.0 <= plain,
            "{name}: at least 10x fewer calls with leases: {plain} vs {leased}"
        );
    }

    for name in NAMES {
        if name == "fw" {
            // A fixed window of 60 s must not roll over during its burst.
            wait_for_window_room(Duration::from_secs(60), Duration::from_secs(15));
        }
        // 1400 requests from all 4 tollgates at once against a limit of 1000.
        let admitted = fleet.drive(&format!("/{name}"), "burst", LIMIT + 400);
        let plain = fleet.drive(&format!("/{name}_plain"), "burst", LIMIT + 400);
        report.push(format!(
            "{name}: {admitted} of {LIMIT} admitted past the limit with leases ({} under), {plain} without",
            LIMIT - admitted.min(LIMIT)
        ));
        assert!(
            admitted <= LIMIT,
            "{name}: over-admitted: {admitted} > {LIMIT}"
        );
        assert!(
            admitted * 100 >= LIMIT * 99,
            "{name}: under-admitted more than 1 % of the limit: {admitted} of {LIMIT}"
        );
        assert_eq!(plain, LIMIT, "{name}: without leases, exactly the limit");
    }
    metrics_of(&fleet, &mut report);
    crash_with_open_leases(fleet, &mut report);
    eprintln!("{}", report.join("\n"));
}

/// A tollgate killed with open leases never gives their units back: the
/// others admit that many fewer (one lease, at most `max`; a token bucket
/// also its term's charge, at most 1 % of the capacity), never more.
fn crash_with_open_leases(mut fleet: Fleet, report: &mut Vec<String>) {
    // The fixed window's lease and its burst must fall in one window.
    wait_for_window_room(Duration::from_secs(60), Duration::from_secs(25));
    let first = fleet.procs[0].addr;
    for name in NAMES {
        let r = http_with(first, "GET", &format!("/{name}"), &[("X-Key", "crash")]).unwrap();
        assert_eq!(r.status, 200, "{name}: the first request takes a lease");
    }
    let mut killed = fleet.procs.remove(0);
    killed.child.kill().expect("kill -9 the first tollgate");
    killed.child.wait().unwrap();
    for name in NAMES {
        let admitted = 1 + fleet.drive(&format!("/{name}"), "crash", LIMIT + 400);
        report.push(format!(
            "{name}: {admitted} of {LIMIT} admitted after a crash with an open lease"
        ));
        assert!(
            admitted <= LIMIT,
            "{name}: over-admitted after a crash: {admitted}"
        );
        let bound = if name == "tb" { 50 + LIMIT / 100 } else { 50 };
        assert!(
            LIMIT - admitted <= bound,
            "{name}: a crash loses at most one lease ({bound}): {admitted} of {LIMIT}"
        );
    }
}

/// The fleet's lease counters: requests decided without Redis, leases taken.
fn metrics_of(fleet: &Fleet, report: &mut Vec<String>) {
    let saved = fleet.metric("tollgate_lease_calls_saved_total");
    let taken = fleet.metric("tollgate_leases_taken_total");
    report.push(format!(
        "fleet: {saved} requests decided from leases, {taken} leases taken"
    ));
    assert!(saved > 0.0 && taken > 0.0, "the metrics count the leases");
}

/// The requests (1-based) that must call Redis when one tollgate drives a
/// fresh key with `limit` units and `lease: {max}` to its limit and one past:
/// `lease.rs`'s arithmetic, replayed.
fn expected_calls(limit: u64, max: u64) -> Vec<u64> {
    let (mut counted, mut held, mut calls) = (0, 0, Vec::new());
    for request in 1..=limit + 1 {
        if held > 0 {
            held -= 1;
            continue;
        }
        calls.push(request);
        if counted < limit {
            counted += 1;
            held = grant(max, limit - counted);
            counted += held;
        }
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_shrinks_as_the_key_fills_and_the_last_units_each_call_redis() {
    let redis = RedisServer::start();
    let config = StoreConfig {
        backend: BackendConfig::Redis(RedisConfig {
            topology: tollgate::config::RedisTopology::Node(redis.url()),
            prefix: "contract:".into(),
            timeout: Duration::from_secs(5),
        }),
        on_error: OnError::Deny,
        prune_interval: Duration::from_secs(3600),
        max_keys: 1024,
    };
    // Slow enough that nothing refills or rolls over while the test runs.
    let algorithms = [
        Algorithm::FixedWindow(FixedWindow {
            limit: 100,
            window: 3600 * S,
        }),
        Algorithm::SlidingWindow(SlidingWindow {
            limit: 100,
            window: 3600 * S,
        }),
        Algorithm::TokenBucket(TokenBucket {
            capacity: 100,
            interval: 3600 * S,
            refunds: false,
        }),
    ];
    let limiters: Vec<LimiterConfig> = algorithms
        .iter()
        .enumerate()
        .map(|(i, a)| LimiterConfig {
            lease: Some(Lease { max: 50 }),
            ..common::limiter(&format!("l{i}"), a.clone())
        })
        .collect();
    let store = Store::open(&config, &limiters, 0).expect("store opens");
    store.configure(&limiters);
    let expected = expected_calls(100, 50);
    assert_eq!(&expected[..3], [1, 14, 25], "leases of 12, then 10, …");
    assert_eq!(
        &expected[expected.len() - 9..],
        [93, 94, 95, 96, 97, 98, 99, 100, 101],
        "… and the last units one call each"
    );
    for (l, algorithm) in limiters.iter().zip(&algorithms) {
        let key = format!("{}:global", l.name);
        let (mut calls, mut admitted) = (Vec::new(), 0);
        for request in 1..=101u64 {
            let before = script_calls(&redis);
            let now = tollgate::clock::Clock::now(&tollgate::clock::SystemClock);
            let out = store
                .check(
                    &[Check {
                        key: &key,
                        overflow: "overflow",
                        algorithm,
                        shadow: false,
                    }],
                    now,
                )
                .await
                .expect("Redis answers");
            if !out[0].ruling.is_deny() {
                admitted += 1;
            }
            if script_calls(&redis) > before {
                calls.push(request);
            }
        }
        assert_eq!(admitted, 100, "{}: exactly the limit", l.name);
        assert_eq!(
            calls, expected,
            "{}: Redis leased what lease.rs says",
            l.name
        );
    }
}

#[test]
fn a_tollgate_spends_its_lease_while_redis_is_down_then_on_error_local_takes_over() {
    let mut redis = RedisServer::start();
    let yaml = fleet_yaml(&redis)
        .replace("timeout: 5s", "timeout: 250ms")
        .replace("on_error: deny", "on_error: local");
    let dir = tempfile::tempdir().unwrap();
    let p = Process::serve(&yaml, dir.path());
    wait_for_window_room(Duration::from_secs(60), Duration::from_secs(20));
    let get = || {
        http_with(p.addr, "GET", "/fw", &[("X-Key", "outage")])
            .unwrap()
            .status
    };
    assert_eq!(get(), 200, "the first request takes a lease of 50");
    redis.stop();
    let errors = |p: &Process| {
        let text = http(p.admin, "GET", "/metrics").unwrap().body;
        text.lines()
            .find_map(|l| {
                l.strip_prefix("tollgate_store_errors_total{backend=\"redis\",policy=\"local\"}")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    for i in 0..50 {
        assert_eq!(get(), 200, "leased unit {i}");
    }
    assert_eq!(errors(&p), 0.0, "the lease is spent without asking Redis");
    assert_eq!(
        get(),
        200,
        "spent out: Redis fails and the local table admits"
    );
    assert_eq!(errors(&p), 1.0, "{}", p.output());
}

/// One command's whole reply as text (read until Redis stops sending).
fn redis_reply(redis: &RedisServer, args: &[&str]) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", redis.port)).expect("redis");
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The count of the fixed-window key whose name ends with `suffix`.
fn window_count(redis: &RedisServer, suffix: &str) -> Option<u64> {
    let keys = redis_reply(redis, &["KEYS", &format!("*{suffix}")]);
    let key = keys.lines().find(|l| l.ends_with(suffix))?;
    let reply = redis_reply(redis, &["HGET", key, "n"]);
    reply.lines().nth(1)?.parse().ok()
}

#[test]
fn an_idle_lease_gives_its_unspent_units_back_within_about_a_second_without_a_prune_round() {
    let redis = RedisServer::start();
    // No prune round in this test: only the idle round can end the lease.
    // (A reload that changes the limiter ends it at once: the unit test
    // `a_reload_that_changes_the_limiter_ends_its_leases_and_gives_their_units_back`.)
    let yaml = fleet_yaml(&redis).replace("prune_interval: 1s", "prune_interval: 1h");
    let dir = tempfile::tempdir().unwrap();
    let p = Process::serve(&yaml, dir.path());
    wait_for_window_room(Duration::from_secs(60), Duration::from_secs(20));
    let sent = Instant::now();
    let r = http_with(p.addr, "GET", "/fw", &[("X-Key", "idle")]).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        window_count(&redis, "idle"),
        Some(51),
        "the request and its lease of 50"
    );
    let given_back = common::eventually_blocking(Duration::from_secs(10), || {
        window_count(&redis, "idle") == Some(1)
    });
    assert!(
        given_back,
        "the 50 unspent units went back: {:?}\n{}",
        window_count(&redis, "idle"),
        p.output()
    );
    // Not before the lease had been idle a second (it was taken after `sent`).
    assert!(sent.elapsed() >= LEASE_IDLE, "{:?}", sent.elapsed());
}

/// One hot key (`key: global`) with `lease: { max: 50 }`, on `proxies` tollgates sharing one Redis.
fn hot_key_fleet(redis: &RedisServer, limit: u64, proxies: usize) -> Fleet {
    hot_key_fleet_on(&format!("url: \"{}\"", redis.url()), limit, proxies)
}

/// [`hot_key_fleet`] on the Redis `server` names (`url: …` or `cluster: […]`).
fn hot_key_fleet_on(server: &str, limit: u64, proxies: usize) -> Fleet {
    let yaml = format!(
        "store: {{ backend: redis, {server}, prefix: \"hot{limit}:\", timeout: 5s, on_error: deny }}\nlimiters:\n  hot: {{ algorithm: fixed_window, limit: {limit}, window: 3600s, key: global, lease: {{ max: 50 }} }}\nroutes:\n  - {{ name: hot, match: {{ path: /hot }}, respond: {{ status: 200, body: ok }}, limiters: [hot] }}\n"
    );
    let dirs: Vec<_> = (0..proxies).map(|_| tempfile::tempdir().unwrap()).collect();
    let procs = dirs
        .iter()
        .map(|d| Process::serve(&yaml, d.path()))
        .collect();
    Fleet { procs, _dirs: dirs }
}

#[test]
fn sixty_four_requests_at_once_on_one_hot_key_wait_for_one_lease_fetch() {
    let redis = RedisServer::start();
    let fleet = hot_key_fleet(&redis, 100_000, 1);
    let proxy = [&fleet.procs[0]];
    // The script is loaded (NOSCRIPT, then again) before counting.
    assert_eq!(common::concurrent(&proxy, "/hot", 1), 1);
    let mut rounds = Vec::new();
    for _ in 0..3 {
        wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(30));
        // The lease left by the round before ends (600 ms) or runs out first.
        let before = script_calls(&redis);
        assert_eq!(common::concurrent(&proxy, "/hot", 64), 64);
        rounds.push(script_calls(&redis) - before);
        std::thread::sleep(Duration::from_millis(700));
    }
    eprintln!("script calls for 64 concurrent requests on one key: {rounds:?}");
    let calls: u64 = rounds.iter().sum();
    assert!(
        calls * 10 <= 3 * 64,
        "at least 10x fewer Redis calls than requests: {rounds:?} for 3 x 64"
    );
}

#[test]
fn two_tollgates_waiting_on_lease_fetches_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let fleet = hot_key_fleet(&redis, 400, 2);
    let both = [&fleet.procs[0], &fleet.procs[1]];
    wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(30));
    let mut admitted = common::concurrent(&both, "/hot", 500);
    // Leases are never taken in the last eighth, and the units an ended
    // lease left come back at a prune round: ask one at a time until the
    // limit is reached (or 10 s pass), then never once more.
    let full = common::eventually_blocking(Duration::from_secs(10), || {
        admitted += common::concurrent(&both, "/hot", 1);
        admitted >= 400
    });
    assert!(full, "{admitted} admitted: the limit was never reached");
    let more = common::concurrent(&both, "/hot", 100);
    assert_eq!((admitted, more), (400, 0), "exactly the limit");
}

/// `series`' value on one tollgate's `/metrics` (0 when absent).
fn metric_of(p: &Process, series: &str) -> f64 {
    let text = http(p.admin, "GET", "/metrics").expect("metrics").body;
    common::metric(&text, series).unwrap_or(0.0)
}

#[test]
fn when_a_keys_traffic_moves_to_another_tollgate_the_first_gives_its_idle_lease_back_and_the_second_admits_the_rest(
) {
    let redis = RedisServer::start();
    traffic_moves(&hot_key_fleet(&redis, 1000, 2), 1000);
}

#[test]
fn on_a_redis_cluster_leases_admit_exactly_the_limit_and_come_back_when_traffic_moves() {
    let cluster = common::redis_cluster::Cluster::without_replicas();
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("\"{}\"", n.url()))
        .collect();
    let fleet = hot_key_fleet_on(&format!("cluster: [{}]", seeds.join(", ")), 400, 2);
    traffic_moves(&fleet, 400);
}

/// Half of `limit` through the first of two tollgates, then all traffic
/// through the second once the first has given its idle lease back (with no
/// prune round and no request of its own): the second admits exactly the
/// rest, and nothing more.
fn traffic_moves(fleet: &Fleet, limit: usize) {
    let (a, b) = (&fleet.procs[0], &fleet.procs[1]);
    // A window of an hour: a lease's term is 36 s, its prune round a minute away.
    wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(30));
    // In rounds of 50: hundreds of connections at once are not the subject.
    let mut admitted = 0;
    for _ in 0..limit / 100 {
        admitted += common::concurrent(&[a], "/hot", 50);
    }
    assert_eq!(admitted, limit / 2);
    let units = |outcome: &str| {
        metric_of(
            a,
            &format!("tollgate_lease_units_total{{outcome=\"{outcome}\"}}"),
        )
    };
    let (returned, lost) = (units("returned"), units("lost"));
    let held = units("granted") - units("spent") - returned - lost;
    assert!(held > 0.0, "the first tollgate holds unspent units");
    let given_back = common::eventually_blocking(Duration::from_secs(10), || {
        units("returned") - returned >= held
    });
    assert!(
        given_back,
        "the idle lease's {held} units were not given back (returned {}, lost {})\n{}",
        units("returned") - returned,
        units("lost") - lost,
        a.output()
    );
    for _ in 0..(limit - admitted) / 10 {
        admitted += common::concurrent(&[b], "/hot", 10);
    }
    let more = common::concurrent(&[b], "/hot", 100);
    assert_eq!((admitted, more), (limit, 0), "exactly the limit");
}
