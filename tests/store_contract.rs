//! One contract, every store: each algorithm accepts up to its quota, rejects the next with an
//! exact Retry-After, and recovers at the exact instant; SQLite state survives a reopen.

use std::path::Path;
use std::time::Duration;

use tollgate::config::{Backend, KeyPart, LimiterConfig, OnError, StoreConfig};
use tollgate::limiter::{
    concurrency::Concurrency, fixed_window::FixedWindow, leaky_bucket::LeakyBucket,
    sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm, Nanos, Verdict,
    NANOS_PER_SEC as S,
};
use tollgate::store::{Check, Store};

/// 2 s into a 10 s window.
const T0: Nanos = 1_767_225_602 * S;

fn algorithms() -> Vec<(&'static str, Algorithm)> {
    vec![
        (
            "fixed",
            Algorithm::FixedWindow(FixedWindow {
                limit: 3,
                window: 10 * S,
            }),
        ),
        (
            "sliding",
            Algorithm::SlidingWindow(SlidingWindow {
                limit: 3,
                window: 10 * S,
            }),
        ),
        (
            "token",
            Algorithm::TokenBucket(TokenBucket {
                capacity: 3,
                interval: S,
            }),
        ),
        (
            "leaky",
            Algorithm::LeakyBucket(LeakyBucket {
                capacity: 2,
                interval: S,
            }),
        ),
        (
            "conc",
            Algorithm::Concurrency(Concurrency { max_in_flight: 2 }),
        ),
    ]
}

fn limiters() -> Vec<LimiterConfig> {
    algorithms()
        .into_iter()
        .map(|(name, algorithm)| LimiterConfig {
            name: name.into(),
            algorithm,
            key: vec![KeyPart::Client],
            shadow: false,
            overrides: vec![],
        })
        .collect()
}

fn open(kind: &str, dir: &Path) -> Store {
    let backend = match kind {
        "memory" => Backend::Memory,
        _ => Backend::Sqlite {
            path: dir.join("contract.db"),
        },
    };
    let config = StoreConfig {
        backend,
        on_error: OnError::Deny,
        prune_interval: Duration::from_secs(60),
        flush_interval: Duration::from_millis(50),
    };
    Store::open(&config, &limiters(), T0).expect("store opens")
}

fn algorithm(name: &str) -> Algorithm {
    algorithms()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap()
        .1
}

async fn hit(store: &Store, name: &str, now: Nanos) -> Verdict {
    let a = algorithm(name);
    let key = format!("{name}:ip:203.0.113.9");
    store
        .check(
            &[Check {
                key: &key,
                algorithm: &a,
                shadow: false,
            }],
            now,
        )
        .await
        .unwrap()[0]
        .verdict
}

async fn fixed_window_contract(store: &Store) {
    for _ in 0..3 {
        assert_eq!(hit(store, "fixed", T0).await, Verdict::Allow);
    }
    assert_eq!(
        hit(store, "fixed", T0).await,
        Verdict::Deny { retry_after: 8 * S }
    );
    assert!(hit(store, "fixed", T0 + 8 * S - 1).await.is_deny());
    assert_eq!(hit(store, "fixed", T0 + 8 * S).await, Verdict::Allow);
}

async fn sliding_window_contract(store: &Store) {
    for i in 0..3 {
        assert_eq!(hit(store, "sliding", T0 + i * S).await, Verdict::Allow);
    }
    assert_eq!(
        hit(store, "sliding", T0 + 3 * S).await,
        Verdict::Deny { retry_after: 7 * S }
    );
    assert!(hit(store, "sliding", T0 + 10 * S - 1).await.is_deny());
    assert_eq!(hit(store, "sliding", T0 + 10 * S).await, Verdict::Allow);
}

async fn token_bucket_contract(store: &Store) {
    for _ in 0..3 {
        assert_eq!(hit(store, "token", T0).await, Verdict::Allow);
    }
    assert_eq!(
        hit(store, "token", T0).await,
        Verdict::Deny { retry_after: S }
    );
    assert!(hit(store, "token", T0 + S - 1).await.is_deny());
    assert_eq!(hit(store, "token", T0 + S).await, Verdict::Allow);
}

async fn leaky_bucket_contract(store: &Store) {
    assert_eq!(hit(store, "leaky", T0).await, Verdict::Allow);
    assert_eq!(hit(store, "leaky", T0).await, Verdict::Delay(S));
    assert_eq!(hit(store, "leaky", T0).await, Verdict::Delay(2 * S));
    assert_eq!(
        hit(store, "leaky", T0).await,
        Verdict::Deny { retry_after: S }
    );
    assert!(hit(store, "leaky", T0 + S - 1).await.is_deny());
    assert_eq!(hit(store, "leaky", T0 + S).await, Verdict::Delay(2 * S));
}

async fn concurrency_contract(store: &Store) {
    assert_eq!(hit(store, "conc", T0).await, Verdict::Allow);
    assert_eq!(hit(store, "conc", T0).await, Verdict::Allow);
    assert!(hit(store, "conc", T0).await.is_deny());
    store.release("conc:ip:203.0.113.9", &algorithm("conc"), T0, T0 + S);
    assert_eq!(hit(store, "conc", T0 + S).await, Verdict::Allow);
}

macro_rules! contract {
    ($store:ident) => {
        mod $store {
            use super::*;

            #[tokio::test]
            async fn fixed_window_allows_its_limit_and_recovers_at_the_window_end() {
                let dir = tempfile::tempdir().unwrap();
                fixed_window_contract(&open(stringify!($store), dir.path())).await;
            }

            #[tokio::test]
            async fn sliding_window_recovers_when_the_oldest_admission_leaves() {
                let dir = tempfile::tempdir().unwrap();
                sliding_window_contract(&open(stringify!($store), dir.path())).await;
            }

            #[tokio::test]
            async fn token_bucket_refills_one_token_per_interval() {
                let dir = tempfile::tempdir().unwrap();
                token_bucket_contract(&open(stringify!($store), dir.path())).await;
            }

            #[tokio::test]
            async fn leaky_bucket_queues_up_to_capacity_then_rejects() {
                let dir = tempfile::tempdir().unwrap();
                leaky_bucket_contract(&open(stringify!($store), dir.path())).await;
            }

            #[tokio::test]
            async fn concurrency_frees_a_slot_on_release() {
                let dir = tempfile::tempdir().unwrap();
                concurrency_contract(&open(stringify!($store), dir.path())).await;
            }
        }
    };
}

contract!(memory);
contract!(sqlite);

#[tokio::test]
async fn sqlite_state_of_every_persisted_algorithm_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let before: Vec<_>;
    {
        let store = open("sqlite", dir.path());
        for name in ["fixed", "sliding", "token", "leaky"] {
            for _ in 0..2 {
                hit(&store, name, T0).await;
            }
        }
        before = ["fixed", "sliding", "token", "leaky"]
            .iter()
            .map(|n| store.peek(&format!("{n}:ip:203.0.113.9"), &algorithm(n), T0))
            .collect();
        store.shutdown();
    }
    let store = open("sqlite", dir.path());
    let after: Vec<_> = ["fixed", "sliding", "token", "leaky"]
        .iter()
        .map(|n| store.peek(&format!("{n}:ip:203.0.113.9"), &algorithm(n), T0))
        .collect();
    assert_eq!(before, after);
    assert!(
        before.iter().all(|q| q.remaining < q.limit),
        "every limiter had counted something: {before:?}"
    );
}

#[tokio::test]
async fn a_memory_store_forgets_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open("memory", dir.path());
    hit(&store, "fixed", T0).await;
    drop(store);
    let store = open("memory", dir.path());
    assert_eq!(
        store
            .peek("fixed:ip:203.0.113.9", &algorithm("fixed"), T0)
            .remaining,
        3
    );
}
