//! Redis frozen (SIGSTOP) under concurrent load, on the real binary and a test-owned
//! `redis-server`: every request is answered within `store.timeout` plus a margin, the breaker
//! opens, and once it is open no request waits on the dead connection at all.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use common::redis_server::RedisServer;
use common::{eventually_blocking, http, metric, Process};

const TIMEOUT: Duration = Duration::from_millis(250);
/// Scheduling on a loaded CI machine; the point is "bounded", not "fast".
const MARGIN: Duration = Duration::from_millis(750);
const CLIENTS: usize = 8;

/// One answered request: when it started, how long it took, its status.
type Sample = (Instant, Duration, u16);

#[test]
fn redis_frozen_under_load_answers_every_request_within_the_timeout_and_opens_the_breaker() {
    let redis = RedisServer::start();
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", timeout: {}ms, on_error: allow }}\nlimiters:\n  many: {{ limit: 1000000000, window: 60s }}\nroutes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [many] }}\n",
        redis.url(),
        TIMEOUT.as_millis()
    );
    let dir = tempfile::tempdir().unwrap();
    let p = Process::serve(&yaml, dir.path());
    assert_eq!(http(p.addr, "GET", "/ping").unwrap().status, 200);

    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (samples, stop, addr) = (samples.clone(), stop.clone(), p.addr);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let r = http(addr, "GET", "/ping").expect("every request is answered");
                    samples.lock().push((started, started.elapsed(), r.status));
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(500));
    redis.freeze();
    let frozen_at = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let ready = http(p.admin, "GET", "/readyz").unwrap();
    let metrics = http(p.admin, "GET", "/metrics").unwrap().body;
    std::thread::sleep(Duration::from_millis(1000));
    redis.thaw();
    let thawed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("client thread");
    }

    assert_eq!(
        ready.status, 503,
        "the open breaker shows on /readyz: {}",
        ready.body
    );
    assert!(
        metric(&metrics, "tollgate_store_fallback_total{policy=\"allow\"}").unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "tollgate_store_errors_total{backend=\"redis\"").unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );

    let samples = samples.lock().clone();
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|(s, _, _)| *s >= frozen_at && *s < thawed_at)
        .collect();
    assert!(
        during.len() > 50,
        "load went on while Redis was frozen: {}",
        during.len()
    );
    assert!(
        samples.iter().all(|(_, _, status)| *status == 200),
        "on_error: allow lets every request through"
    );
    let slowest = samples.iter().map(|(_, took, _)| *took).max().unwrap();
    assert!(
        slowest <= TIMEOUT + MARGIN,
        "a request took {slowest:?} with a {TIMEOUT:?} store timeout"
    );
    // A second after the freeze the breaker is open: requests no longer call Redis.
    let after_open: Vec<Duration> = during
        .iter()
        .filter(|(s, _, _)| *s >= frozen_at + Duration::from_secs(1))
        .map(|(_, took, _)| *took)
        .collect();
    let waited = after_open.iter().filter(|t| **t >= TIMEOUT).count();
    assert!(!after_open.is_empty());
    assert_eq!(
        waited,
        0,
        "{waited} of {} requests waited a whole timeout with the breaker open",
        after_open.len()
    );
    let slow_while_frozen = during.iter().filter(|(_, t, _)| *t >= TIMEOUT).count();
    eprintln!(
        "Redis frozen {:?} under {CLIENTS} clients: {} requests, {slow_while_frozen} waited the {TIMEOUT:?} timeout (before the breaker opened), slowest {slowest:?}; with the breaker open: {} requests, slowest {:?}",
        thawed_at - frozen_at,
        during.len(),
        after_open.len(),
        after_open.iter().max().unwrap()
    );

    let closed = eventually_blocking(Duration::from_secs(10), || {
        http(p.admin, "GET", "/readyz").unwrap().status == 200
    });
    assert!(closed, "the breaker never closed:\n{}", p.output());
}
