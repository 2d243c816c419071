//! A start that finds more keys in the SQLite file than `store.max_keys` holds (the bound was lowered): the table keeps the heaviest, most limited keys, and the file follows.

mod common;

use std::time::Duration;

use common::T0;
use tollgate::config::{BackendConfig, LimiterConfig, OnError, SqliteConfig, StoreConfig};
use tollgate::limiter::fixed_window::FixedWindow;
use tollgate::limiter::token_bucket::TokenBucket;
use tollgate::limiter::{Algorithm, NANOS_PER_SEC as S};
use tollgate::store::{Check, Store};

/// Limited keys per limiter: each has used its whole quota.
const HEAVY: usize = 640;
/// Keys per limiter with a third of their quota used.
const LIGHT: usize = 3_000;
/// 64 shards of 40 keys, and the 64 overflow slots: room for every limited
/// key of both limiters (20 a shard on average), not for the light ones.
const SMALL: usize = 64 + 64 * 40;

/// Three per minute, in a fixed window (its rows: `rate_limit_windows`).
fn window() -> Algorithm {
    Algorithm::FixedWindow(FixedWindow {
        limit: 3,
        window: 60 * S,
    })
}

/// Three tokens, one back per hour (its rows: `limiter_state`).
fn bucket() -> Algorithm {
    Algorithm::TokenBucket(TokenBucket {
        capacity: 3,
        interval: 3_600 * S,
        refunds: false,
    })
}

fn limiters() -> Vec<(&'static str, Algorithm)> {
    vec![("w", window()), ("t", bucket())]
}

fn open(path: &std::path::Path, max_keys: usize) -> Store {
    let config = StoreConfig {
        backend: BackendConfig::Sqlite(SqliteConfig {
            path: path.to_path_buf(),
            flush_interval: Duration::from_secs(3_600),
        }),
        on_error: OnError::Deny,
        prune_interval: Duration::from_secs(3_600),
        max_keys,
    };
    let limiters: Vec<LimiterConfig> = limiters()
        .into_iter()
        .map(|(name, a)| common::limiter(name, a))
        .collect();
    Store::open(&config, &limiters, T0).expect("store opens")
}

/// `times` requests on `key` of `limiter`; whether the last was admitted.
async fn hit(store: &Store, limiter: &str, algorithm: &Algorithm, key: &str, times: usize) -> bool {
    let overflow = format!("{limiter}:*overflow");
    let mut admitted = false;
    for _ in 0..times {
        let check = Check {
            key,
            overflow: &overflow,
            algorithm,
            shadow: false,
        };
        let out = store.check(&[check], T0).await.expect("the store answers");
        admitted = !out[0].ruling.is_deny();
    }
    admitted
}

fn key(limiter: &str, kind: &str, i: usize) -> String {
    format!("{limiter}:ip:{kind}.{}.{}", i / 256, i % 256)
}

#[tokio::test]
async fn a_keys_file_larger_than_the_table_keeps_its_heaviest_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.db");
    let store = open(&path, 100_000);
    for (limiter, algorithm) in limiters() {
        for i in 0..HEAVY {
            hit(&store, limiter, &algorithm, &key(limiter, "10", i), 3).await;
        }
        for i in 0..LIGHT {
            hit(&store, limiter, &algorithm, &key(limiter, "20", i), 1).await;
        }
    }
    store.shutdown().expect("everything saved");
    drop(store);

    let store = open(&path, SMALL);
    assert!(store.tracked_keys() <= SMALL, "{}", store.tracked_keys());
    for (limiter, algorithm) in limiters() {
        let kept = (0..HEAVY)
            .filter(|&i| store.table().holds(&key(limiter, "10", i)))
            .count();
        assert_eq!(kept, HEAVY, "every limited key of {limiter} was kept");
        let limited = key(limiter, "10", 7);
        assert!(
            !hit(&store, limiter, &algorithm, &limited, 1).await,
            "{limited} is still limited"
        );
    }
    store.shutdown().expect("everything saved");
    drop(store);

    let store = open(&path, 100_000);
    assert!(
        store.tracked_keys() <= SMALL,
        "the file kept only what the table held: {}",
        store.tracked_keys()
    );
}
