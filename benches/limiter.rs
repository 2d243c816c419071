//! Micro-benchmark: the cost of one limiter decision, per algorithm and store.
//!
//! `cargo bench --bench limiter` measures (medians of 5 runs); under
//! `cargo test --all-targets` it runs once with a handful of iterations as a
//! smoke test, so CI proves it still works without timing anything.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tollgate::config::{
    BackendConfig, KeyPart, LimiterConfig, MemoryConfig, OnError, SqliteConfig, StoreConfig,
};
use tollgate::limiter::{
    concurrency::Concurrency, fixed_window::FixedWindow, leaky_bucket::LeakyBucket,
    sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm, NANOS_PER_SEC,
};
use tollgate::store::{Check, Store};

const T0: u64 = 1_767_225_600 * NANOS_PER_SEC;

fn algorithms() -> Vec<(&'static str, Algorithm)> {
    // Quotas large enough that every decision is an admission (the allow path).
    vec![
        (
            "fixed_window",
            Algorithm::FixedWindow(FixedWindow {
                limit: u64::MAX / 2,
                window: 3600 * NANOS_PER_SEC,
            }),
        ),
        (
            "sliding_window",
            Algorithm::SlidingWindow(SlidingWindow {
                limit: 64,
                window: 1_000,
            }),
        ),
        (
            "token_bucket",
            Algorithm::TokenBucket(TokenBucket {
                capacity: 1 << 40,
                interval: 1,
                refunds: true,
            }),
        ),
        (
            "leaky_bucket",
            Algorithm::LeakyBucket(LeakyBucket {
                capacity: 1 << 40,
                interval: 1,
            }),
        ),
        (
            "concurrency",
            Algorithm::Concurrency(Concurrency {
                max_in_flight: u64::MAX / 2,
            }),
        ),
    ]
}

fn open(backend: BackendConfig) -> Store {
    let limiters: Vec<LimiterConfig> = algorithms()
        .into_iter()
        .map(|(name, algorithm)| LimiterConfig {
            name: name.into(),
            algorithm,
            key: vec![KeyPart::Client],
            shadow: false,
            overrides: vec![],
            reject: None,
            count: None,
            ban: None,
            lease: None,
        })
        .collect();
    let config = StoreConfig {
        backend,
        on_error: OnError::Allow,
        prune_interval: Duration::from_secs(60),
        max_keys: tollgate::config::DEFAULT_MAX_KEYS,
    };
    Store::open(&config, &limiters, T0).expect("store opens")
}

/// Nanoseconds per decision over `iters` decisions cycling through `keys`.
async fn measure(
    store: &Store,
    name: &str,
    algorithm: &Algorithm,
    keys: &[String],
    iters: usize,
) -> f64 {
    let started = Instant::now();
    for i in 0..iters {
        let key = &keys[i % keys.len()];
        let check = [Check {
            key,
            overflow: "overflow",
            algorithm,
            shadow: false,
        }];
        let out = store
            .check(&check, T0 + i as u64 * 1_000)
            .await
            .expect("local stores never fail");
        black_box(out);
        if name == "concurrency" {
            store.release(key, algorithm, T0, T0);
        }
    }
    started.elapsed().as_nanos() as f64 / iters as f64
}

/// `count:` — nanoseconds per request whose answer did not count: the
/// check that takes the unit plus the refund that gives it back.
async fn measure_refund(store: &Store, algorithm: &Algorithm, key: &str, iters: usize) -> f64 {
    let started = Instant::now();
    for i in 0..iters {
        let now = T0 + i as u64 * 1_000;
        let check = [Check {
            key,
            overflow: "overflow",
            algorithm,
            shadow: false,
        }];
        let out = store.check(&check, now).await.expect("local");
        let ticket = out[0].ticket(algorithm);
        store
            .refund(key, algorithm, ticket, now)
            .await
            .expect("local");
    }
    started.elapsed().as_nanos() as f64 / iters as f64
}

/// `ban:` — nanoseconds per ban lookup (the extra step of a route with `ban:`).
async fn measure_ban_lookup(store: &Store, key: &str, iters: usize) -> f64 {
    let started = Instant::now();
    for i in 0..iters {
        black_box(store.banned(&[key], T0 + i as u64).await.expect("local"));
    }
    started.elapsed().as_nanos() as f64 / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (iters, runs) = if full { (1_000_000, 5) } else { (1_000, 1) };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    println!(
        "{:<8} {:<22} {:>12} {:>16}",
        "store", "algorithm", "hot key ns", "100k keys ns"
    );
    for (store_name, backend) in [
        ("memory", BackendConfig::Memory(MemoryConfig)),
        (
            "sqlite",
            BackendConfig::Sqlite(SqliteConfig {
                path: dir.path().join("bench.db"),
                flush_interval: Duration::from_millis(100),
            }),
        ),
    ] {
        let store = open(backend);
        for (name, algorithm) in algorithms() {
            let hot = vec![format!("{name}:ip:203.0.113.9")];
            let spread: Vec<String> = (0..100_000)
                .map(|i| format!("{name}:ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
                .collect();
            let (h, s) = runtime.block_on(async {
                let mut h = Vec::new();
                let mut s = Vec::new();
                for _ in 0..runs {
                    h.push(measure(&store, name, &algorithm, &hot, iters).await);
                    s.push(measure(&store, name, &algorithm, &spread, iters).await);
                }
                (median(h), median(s))
            });
            println!("{store_name:<8} {name:<22} {h:>12.0} {s:>16.0}");
            if algorithm.accepts_count() {
                let key = format!("{name}:ip:198.51.100.1");
                let r = runtime.block_on(async {
                    let mut r = Vec::new();
                    for _ in 0..runs {
                        r.push(measure_refund(&store, &algorithm, &key, iters).await);
                    }
                    median(r)
                });
                println!("{store_name:<8} {:<22} {r:>12.0}", format!("{name}+refund"));
            }
        }
        let b = runtime.block_on(async {
            let mut b = Vec::new();
            for _ in 0..runs {
                b.push(measure_ban_lookup(&store, "fixed_window:ip:203.0.113.9", iters).await);
            }
            median(b)
        });
        println!("{store_name:<8} {:<22} {b:>12.0}", "ban lookup");
        store.shutdown().expect("the last save wrote everything");
    }
    if !full {
        println!("(smoke run: `cargo bench --bench limiter` measures)");
    }
}
