//! One contract, every store: each algorithm accepts up to its quota, rejects the next with an
//! exact Retry-After, and recovers at the exact instant; SQLite state survives a reopen.

mod common;
use common::WINDOW_START;

use std::path::Path;
use std::time::Duration;

use tollgate::config::{
    BackendConfig, LimiterConfig, MemoryConfig, OnError, SqliteConfig, StoreConfig,
};
use tollgate::limiter::ban::BanRule;
use tollgate::limiter::{
    concurrency::Concurrency, fixed_window::FixedWindow, leaky_bucket::LeakyBucket,
    sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm, Nanos, Ruling, Ticket,
    NANOS_PER_SEC as S,
};
use tollgate::store::{Banned, Check, Store};

/// 2 s into a 10 s window.
const T0: Nanos = WINDOW_START + 2 * S;

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
                refunds: true,
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
        .map(|(name, algorithm)| common::limiter(name, algorithm))
        .collect()
}

fn open(kind: &str, dir: &Path) -> Store {
    let backend = match kind {
        "memory" => BackendConfig::Memory(MemoryConfig),
        _ => BackendConfig::Sqlite(SqliteConfig {
            path: dir.join("contract.db"),
            flush_interval: Duration::from_millis(50),
        }),
    };
    let config = StoreConfig {
        backend,
        on_error: OnError::Deny,
        prune_interval: Duration::from_secs(60),
        max_keys: tollgate::config::DEFAULT_MAX_KEYS,
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

async fn hit(store: &Store, name: &str, now: Nanos) -> Ruling {
    let a = algorithm(name);
    let key = format!("{name}:ip:203.0.113.9");
    store
        .check(
            &[Check {
                key: &key,
                overflow: "overflow",
                algorithm: &a,
                shadow: false,
            }],
            now,
        )
        .await
        .unwrap()[0]
        .ruling
}

async fn fixed_window_contract(store: &Store) {
    for _ in 0..3 {
        assert_eq!(hit(store, "fixed", T0).await, Ruling::Allow);
    }
    assert_eq!(
        hit(store, "fixed", T0).await,
        Ruling::Deny { retry_after: 8 * S }
    );
    assert!(hit(store, "fixed", T0 + 8 * S - 1).await.is_deny());
    assert_eq!(hit(store, "fixed", T0 + 8 * S).await, Ruling::Allow);
}

async fn sliding_window_contract(store: &Store) {
    for i in 0..3 {
        assert_eq!(hit(store, "sliding", T0 + i * S).await, Ruling::Allow);
    }
    assert_eq!(
        hit(store, "sliding", T0 + 3 * S).await,
        Ruling::Deny { retry_after: 7 * S }
    );
    assert!(hit(store, "sliding", T0 + 10 * S - 1).await.is_deny());
    assert_eq!(hit(store, "sliding", T0 + 10 * S).await, Ruling::Allow);
}

async fn token_bucket_contract(store: &Store) {
    for _ in 0..3 {
        assert_eq!(hit(store, "token", T0).await, Ruling::Allow);
    }
    assert_eq!(
        hit(store, "token", T0).await,
        Ruling::Deny { retry_after: S }
    );
    assert!(hit(store, "token", T0 + S - 1).await.is_deny());
    assert_eq!(hit(store, "token", T0 + S).await, Ruling::Allow);
}

async fn leaky_bucket_contract(store: &Store) {
    assert_eq!(hit(store, "leaky", T0).await, Ruling::Allow);
    assert_eq!(hit(store, "leaky", T0).await, Ruling::Delay(S));
    assert_eq!(hit(store, "leaky", T0).await, Ruling::Delay(2 * S));
    assert_eq!(
        hit(store, "leaky", T0).await,
        Ruling::Deny { retry_after: S }
    );
    assert!(hit(store, "leaky", T0 + S - 1).await.is_deny());
    assert_eq!(hit(store, "leaky", T0 + S).await, Ruling::Delay(2 * S));
}

async fn concurrency_contract(store: &Store) {
    assert_eq!(hit(store, "conc", T0).await, Ruling::Allow);
    assert_eq!(hit(store, "conc", T0).await, Ruling::Allow);
    assert!(hit(store, "conc", T0).await.is_deny());
    store.release("conc:ip:203.0.113.9", &algorithm("conc"), T0, T0 + S);
    assert_eq!(hit(store, "conc", T0 + S).await, Ruling::Allow);
}

/// One request's outcome, and the ticket a `count:` refund gives back with.
async fn take(store: &Store, name: &str, now: Nanos) -> (Ruling, Ticket) {
    let a = algorithm(name);
    let key = format!("{name}:ip:203.0.113.9");
    let o = store
        .check(
            &[Check {
                key: &key,
                overflow: "test:*overflow",
                algorithm: &a,
                shadow: false,
            }],
            now,
        )
        .await
        .unwrap()[0];
    (o.ruling, o.ticket(&a))
}

/// `count:` — every counting algorithm: a full key gets room back when an
/// admitted request's unit is refunded, and exactly one request's worth.
async fn refund_contract(store: &Store) {
    for name in ["fixed", "sliding", "token"] {
        let mut last = None;
        for _ in 0..3 {
            let (v, ticket) = take(store, name, T0).await;
            assert_eq!(v, Ruling::Allow, "{name}");
            last = Some(ticket);
        }
        let last = last.expect("three tickets");
        let (refused, refused_ticket) = take(store, name, T0).await;
        assert!(refused.is_deny(), "{name} is full");
        let key = format!("{name}:ip:203.0.113.9");
        let a = algorithm(name);
        if a.counts_refused() {
            // The app gives back a refused attempt's unit too: it never got an answer.
            store.refund(&key, &a, refused_ticket, T0).await.unwrap();
        }
        store.refund(&key, &a, last, T0).await.unwrap();
        assert_eq!(
            take(store, name, T0).await.0,
            Ruling::Allow,
            "{name}: the refund freed one unit"
        );
        assert!(
            take(store, name, T0).await.0.is_deny(),
            "{name}: and only one"
        );
    }
}

/// Token bucket `count:` — a ticket from before the bucket was last full
/// gives nothing back. Three tokens at once, the first two refunded, so the
/// third is paid off one interval later; there the bucket is full and a new
/// request takes a token. The third's late refund must not give that one
/// back (its place, as taken at admission, is still two intervals ahead).
/// `later` is the instant of the second half on a store that takes the
/// caller's clock; Redis keeps its own, so `wait` lets the interval pass.
async fn stale_ticket_contract(store: &Store, interval: Nanos, later: Nanos, wait: Duration) {
    let a = Algorithm::TokenBucket(TokenBucket {
        capacity: 3,
        interval,
        refunds: true,
    });
    let key = "stale:ip:203.0.113.9";
    let take = |now| {
        let a = &a;
        async move {
            let checks = [Check {
                key,
                overflow: "test:*overflow",
                algorithm: a,
                shadow: false,
            }];
            store.check(&checks, now).await.unwrap()[0]
        }
    };
    let mut tickets = Vec::new();
    for _ in 0..3 {
        let o = take(T0).await;
        assert_eq!(o.ruling, Ruling::Allow);
        tickets.push(o.ticket(&a));
    }
    for t in &tickets[..2] {
        store.refund(key, &a, *t, T0).await.unwrap();
    }
    tokio::time::sleep(wait).await;
    assert_eq!(
        take(later).await.quota.remaining,
        2,
        "full again, one taken"
    );
    store.refund(key, &a, tickets[2], later).await.unwrap();
    assert_eq!(
        take(later).await.quota.remaining,
        1,
        "the stale ticket gave nothing back"
    );
}

/// Token bucket `count:` — answers in any order give back exactly their
/// tokens: nine taken at once, seven refunded out of order, and the bucket
/// reads as if only the two counted ones were taken.
async fn any_order_contract(store: &Store) {
    let a = Algorithm::TokenBucket(TokenBucket {
        capacity: 10,
        interval: 3600 * S,
        refunds: true,
    });
    let key = "order:ip:203.0.113.9";
    let checks = [Check {
        key,
        overflow: "test:*overflow",
        algorithm: &a,
        shadow: false,
    }];
    let mut tickets = Vec::new();
    for _ in 0..9 {
        let o = store.check(&checks, T0).await.unwrap()[0];
        assert_eq!(o.ruling, Ruling::Allow);
        tickets.push(o.ticket(&a));
    }
    // 3 and 6 count; the newest (8) comes back in the middle of the others.
    for i in [4, 1, 7, 0, 8, 2, 5] {
        store.refund(key, &a, tickets[i], T0 + 1).await.unwrap();
    }
    let peek = store.peek(key, &a, T0 + 1).await.unwrap();
    assert_eq!(peek.remaining, 8, "{peek:?}");
}

fn three_for_an_hour() -> BanRule {
    BanRule {
        after: 3,
        duration: 3600 * S,
        status: http::StatusCode::TOO_MANY_REQUESTS,
    }
}

/// `ban:` — the `after`-th strike within the window bans until exactly `for` later; a reset lifts it.
async fn ban_contract(store: &Store) {
    let key = "fixed:ip:203.0.113.9";
    let rule = three_for_an_hour();
    assert_eq!(store.strike(key, &rule, 10 * S, T0).await.unwrap(), None);
    assert_eq!(
        store.strike(key, &rule, 10 * S, T0 + S).await.unwrap(),
        None
    );
    assert_eq!(store.banned(&[key], T0 + S).await.unwrap(), vec![None]);
    let ban = store.strike(key, &rule, 10 * S, T0 + 2 * S).await.unwrap();
    assert_eq!(
        ban,
        Some(Banned {
            until: T0 + 3602 * S,
            remaining: 3600 * S
        })
    );
    let other = "fixed:ip:198.51.100.7";
    assert_eq!(
        store.banned(&[other, key], T0 + 3 * S).await.unwrap(),
        vec![
            None,
            Some(Banned {
                until: T0 + 3602 * S,
                remaining: 3599 * S
            })
        ]
    );
    assert_eq!(store.active_bans(T0 + 3 * S), 1);
    assert_eq!(
        store.banned(&[key], T0 + 3602 * S).await.unwrap(),
        vec![None]
    );
    store.reset(&[key.to_string()]).await.unwrap();
    assert_eq!(store.banned(&[key], T0 + 3 * S).await.unwrap(), vec![None]);
    assert_eq!(store.active_bans(T0 + 3 * S), 0);
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

            #[tokio::test]
            async fn a_refund_gives_back_exactly_one_unit_for_each_counting_algorithm() {
                let dir = tempfile::tempdir().unwrap();
                refund_contract(&open(stringify!($store), dir.path())).await;
            }

            #[tokio::test]
            async fn a_token_bucket_ticket_from_before_the_bucket_was_last_full_gives_nothing_back()
            {
                let dir = tempfile::tempdir().unwrap();
                let store = open(stringify!($store), dir.path());
                stale_ticket_contract(&store, S, T0 + S, Duration::ZERO).await;
            }

            #[tokio::test]
            async fn token_bucket_refunds_in_any_order_give_back_exactly_their_tokens() {
                let dir = tempfile::tempdir().unwrap();
                any_order_contract(&open(stringify!($store), dir.path())).await;
            }

            #[tokio::test]
            async fn the_third_strike_in_a_window_bans_until_its_end_and_a_reset_lifts_it() {
                let dir = tempfile::tempdir().unwrap();
                ban_contract(&open(stringify!($store), dir.path())).await;
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
        before = peek_all(&store).await;
        store.shutdown().expect("the last save wrote everything");
    }
    let store = open("sqlite", dir.path());
    let after = peek_all(&store).await;
    assert_eq!(before, after);
    assert!(
        before.iter().all(|q| q.remaining < q.limit),
        "every limiter had counted something: {before:?}"
    );
}

#[tokio::test]
async fn sqlite_bans_survive_a_reopen_and_a_lifted_one_stays_lifted() {
    let dir = tempfile::tempdir().unwrap();
    let (banned, lifted) = ("fixed:ip:203.0.113.9", "fixed:ip:198.51.100.7");
    {
        let store = open("sqlite", dir.path());
        for key in [banned, lifted] {
            for _ in 0..3 {
                store
                    .strike(key, &three_for_an_hour(), 10 * S, T0)
                    .await
                    .unwrap();
            }
        }
        store.flush().unwrap();
        store.reset(&[lifted.to_string()]).await.unwrap();
        store.shutdown().expect("the last save");
    }
    let store = open("sqlite", dir.path());
    assert_eq!(
        store.banned(&[banned, lifted], T0 + S).await.unwrap(),
        vec![
            Some(Banned {
                until: T0 + 3600 * S,
                remaining: 3599 * S
            }),
            None
        ]
    );
    let conn = rusqlite::Connection::open(dir.path().join("contract.db")).unwrap();
    let utc: String = conn
        .query_row(
            "SELECT until_utc FROM limiter_bans WHERE key = ?1",
            [banned],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(utc, "2026-01-01T01:00:02Z");
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
            .await
            .unwrap()
            .remaining,
        3
    );
}

async fn peek_all(store: &Store) -> Vec<tollgate::limiter::Quota> {
    let mut out = Vec::new();
    for n in ["fixed", "sliding", "token", "leaky"] {
        let key = format!("{n}:ip:203.0.113.9");
        out.push(store.peek(&key, &algorithm(n), T0).await.unwrap());
    }
    out
}

// ------------------------------------------------------------------ Redis

#[path = "store_contract/redis.rs"]
mod redis;
