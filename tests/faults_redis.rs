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

/// `CLIENTS` threads sending `GET /ping` back to back, each answer recorded.
struct Load {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: std::net::SocketAddr) -> Load {
        let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..CLIENTS)
            .map(|_| {
                let (samples, stop) = (samples.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let started = Instant::now();
                        let r = http(addr, "GET", "/ping").expect("every request is answered");
                        samples.lock().push((started, started.elapsed(), r.status));
                    }
                })
            })
            .collect();
        Load {
            samples,
            stop,
            threads,
        }
    }

    /// How many requests started at `since` or later have been answered.
    fn answered_since(&self, since: Instant) -> usize {
        self.samples
            .lock()
            .iter()
            .filter(|(s, ..)| *s >= since)
            .count()
    }

    fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().expect("client thread");
        }
        self.samples.lock().clone()
    }
}

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

    let load = Load::start(p.addr);
    std::thread::sleep(Duration::from_millis(500));
    redis.freeze();
    let frozen_at = Instant::now();
    // The breaker opening shows on /readyz: the event, not a guess at its time.
    let opened = eventually_blocking(Duration::from_secs(10), || {
        http(p.admin, "GET", "/readyz").unwrap().status == 503
    });
    let opened_at = Instant::now();
    let metrics = http(p.admin, "GET", "/metrics").unwrap().body;
    // Requests from a second after the freeze, or from when the breaker was
    // seen open if sooner, must not wait on Redis; let 100 of them be answered.
    let open_from = opened_at.min(frozen_at + Duration::from_secs(1));
    let loaded = eventually_blocking(Duration::from_secs(10), || {
        load.answered_since(opened_at) >= 100
    });
    redis.thaw();
    let thawed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let samples = load.stop();

    assert!(opened, "the open breaker never showed on /readyz");
    assert!(loaded, "no load went on with the breaker open");
    assert!(
        metric(&metrics, "tollgate_store_fallback_total{policy=\"allow\"}").unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "tollgate_store_errors_total{backend=\"redis\"").unwrap_or(0.0) >= 1.0,
        "{metrics}"
    );
    assert_bounded(&samples, frozen_at, open_from, thawed_at);

    let closed = eventually_blocking(Duration::from_secs(10), || {
        http(p.admin, "GET", "/readyz").unwrap().status == 200
    });
    assert!(closed, "the breaker never closed:\n{}", p.output());
}

/// Every request answered 200 within the timeout plus a margin, and none
/// started from `open_from` on (the breaker open) waited a whole timeout.
fn assert_bounded(samples: &[Sample], frozen_at: Instant, open_from: Instant, thawed_at: Instant) {
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
    // With the breaker open, requests no longer call Redis.
    let after_open: Vec<Duration> = during
        .iter()
        .filter(|(s, _, _)| *s >= open_from)
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
}
