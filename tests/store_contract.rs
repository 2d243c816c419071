//! One contract, every store: each algorithm accepts up to its quota, rejects the next with an
//! exact Retry-After, and recovers at the exact instant; SQLite state survives a reopen.

mod common;
use common::WINDOW_START;

use std::path::Path;
use std::time::Duration;

use tollgate::config::{Backend, LimiterConfig, OnError, StoreConfig};
use tollgate::limiter::ban::BanRule;
use tollgate::limiter::{
    concurrency::Concurrency, fixed_window::FixedWindow, leaky_bucket::LeakyBucket,
    sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm, Nanos, Ticket, Verdict,
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

async fn hit(store: &Store, name: &str, now: Nanos) -> Verdict {
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

/// One request's outcome, and the ticket a `count:` refund gives back with.
async fn take(store: &Store, name: &str, now: Nanos) -> (Verdict, Ticket) {
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
    (o.verdict, o.ticket(&a))
}

/// `count:` — every counting algorithm: a full key gets room back when an
/// admitted request's unit is refunded, and exactly one request's worth.
async fn refund_contract(store: &Store) {
    for name in ["fixed", "sliding", "token"] {
        let mut last = None;
        for _ in 0..3 {
            let (v, ticket) = take(store, name, T0).await;
            assert_eq!(v, Verdict::Allow, "{name}");
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
            Verdict::Allow,
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
        assert_eq!(o.verdict, Verdict::Allow);
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
        assert_eq!(o.verdict, Verdict::Allow);
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

/// Redis decides on its own clock (`TIME`), which a test cannot drive, so the
/// contract runs there on short real windows, and every answer is compared
/// with the in-memory table fed the same checks at the instant Redis reports
/// (`Outcome::at`): the Lua port must give exactly the Rust arithmetic's answers.
mod redis {
    use std::time::Instant;

    use super::common::redis_server::RedisServer;
    use super::common::wait_for_window_room;
    use super::*;
    use tollgate::store::memory::Table;
    use tollgate::store::Outcome;

    const MS: Nanos = 1_000_000;

    /// The contract's algorithms with windows short enough to wait for.
    fn fast(name: &str) -> Algorithm {
        match name {
            "fixed" => Algorithm::FixedWindow(FixedWindow {
                limit: 3,
                window: S,
            }),
            "sliding" => Algorithm::SlidingWindow(SlidingWindow {
                limit: 3,
                window: S,
            }),
            "token" => Algorithm::TokenBucket(TokenBucket {
                capacity: 3,
                interval: 300 * MS,
                refunds: true,
            }),
            "leaky" => Algorithm::LeakyBucket(LeakyBucket {
                capacity: 2,
                interval: 300 * MS,
            }),
            "one" => Algorithm::FixedWindow(FixedWindow {
                limit: 1,
                window: 3600 * S,
            }),
            _ => algorithm(name),
        }
    }

    fn open_redis(server: &RedisServer, timeout: Duration) -> Store {
        let config = StoreConfig {
            backend: Backend::Redis {
                topology: tollgate::config::RedisTopology::Node(server.url()),
                prefix: "contract:".into(),
                timeout,
            },
            on_error: OnError::Deny,
            prune_interval: Duration::from_secs(60),
            flush_interval: Duration::from_millis(50),
            max_keys: tollgate::config::DEFAULT_MAX_KEYS,
        };
        Store::open(&config, &limiters(), T0).expect("store opens")
    }

    fn key(name: &str) -> String {
        format!("{name}:ip:203.0.113.9")
    }

    /// The Redis store and its model, the in-memory table.
    struct Twin {
        _server: RedisServer,
        store: Store,
        model: Table,
    }

    impl Twin {
        fn start() -> Twin {
            let server = RedisServer::start();
            let store = open_redis(&server, Duration::from_millis(500));
            Twin {
                _server: server,
                store,
                model: Table::new(false),
            }
        }

        /// One request through the limiters `(name, shadow)`, in one store call.
        async fn request(&self, limiters: &[(&str, bool)]) -> Vec<Outcome> {
            let algorithms: Vec<Algorithm> = limiters.iter().map(|(n, _)| fast(n)).collect();
            let keys: Vec<String> = limiters.iter().map(|(n, _)| key(n)).collect();
            let checks: Vec<Check<'_>> = limiters
                .iter()
                .zip(&algorithms)
                .zip(&keys)
                .map(|(((_, shadow), algorithm), key)| Check {
                    key,
                    overflow: "overflow",
                    algorithm,
                    shadow: *shadow,
                })
                .collect();
            let got = self.store.check(&checks, T0).await.expect("Redis answers");
            let want = self.model.check(&checks, got[0].at);
            assert_eq!(got, want, "Redis and the Rust arithmetic disagree");
            got
        }

        async fn hit(&self, name: &str) -> Verdict {
            self.request(&[(name, false)]).await[0].verdict
        }

        async fn remaining(&self, name: &str) -> u64 {
            let q = self.store.peek(&key(name), &fast(name), T0).await;
            q.expect("Redis answers").remaining
        }

        /// Releases are sent in the background: waits until Redis shows one more free.
        async fn wait_remaining(&self, name: &str, at_least: u64) {
            assert!(
                common::eventually(Duration::from_secs(3), || async {
                    self.remaining(name).await >= at_least
                })
                .await,
                "the release never reached Redis"
            );
        }
    }

    fn retry_after(v: Verdict) -> Duration {
        match v {
            Verdict::Deny { retry_after } => Duration::from_nanos(retry_after),
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fixed_window_allows_its_limit_and_recovers_at_the_window_end() {
        let twin = Twin::start();
        wait_for_window_room(Duration::from_secs(1), Duration::from_millis(400));
        for _ in 0..3 {
            assert_eq!(twin.hit("fixed").await, Verdict::Allow);
        }
        let denied = twin.request(&[("fixed", false)]).await[0];
        let window = S;
        assert_eq!(
            denied.verdict,
            Verdict::Deny {
                retry_after: window - denied.at % window
            },
            "Retry-After is the time to the window's end on Redis' clock"
        );
        tokio::time::sleep(retry_after(denied.verdict)).await;
        assert_eq!(twin.hit("fixed").await, Verdict::Allow);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sliding_window_recovers_when_the_oldest_admission_leaves() {
        let twin = Twin::start();
        let first = twin.request(&[("sliding", false)]).await[0];
        assert_eq!(first.verdict, Verdict::Allow);
        for _ in 0..2 {
            assert_eq!(twin.hit("sliding").await, Verdict::Allow);
        }
        let denied = twin.request(&[("sliding", false)]).await[0];
        assert_eq!(
            denied.verdict,
            Verdict::Deny {
                retry_after: first.at + S - denied.at
            }
        );
        tokio::time::sleep(retry_after(denied.verdict)).await;
        assert_eq!(twin.hit("sliding").await, Verdict::Allow);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn token_bucket_refills_one_token_per_interval() {
        let twin = Twin::start();
        for _ in 0..3 {
            assert_eq!(twin.hit("token").await, Verdict::Allow);
        }
        let denied = twin.hit("token").await;
        assert!(retry_after(denied) <= Duration::from_millis(300));
        tokio::time::sleep(retry_after(denied)).await;
        assert_eq!(twin.hit("token").await, Verdict::Allow);
        assert!(
            twin.hit("token").await.is_deny(),
            "one token came back, not two"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leaky_bucket_queues_up_to_capacity_then_rejects() {
        let twin = Twin::start();
        assert_eq!(twin.hit("leaky").await, Verdict::Allow);
        assert!(matches!(twin.hit("leaky").await, Verdict::Delay(d) if d <= 300 * MS));
        assert!(
            matches!(twin.hit("leaky").await, Verdict::Delay(d) if d > 300 * MS && d <= 600 * MS)
        );
        let denied = twin.hit("leaky").await;
        tokio::time::sleep(retry_after(denied)).await;
        assert!(matches!(twin.hit("leaky").await, Verdict::Delay(_)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queued_request_that_leaves_gives_its_place_back() {
        let twin = Twin::start();
        twin.hit("leaky").await;
        twin.hit("leaky").await;
        let Verdict::Delay(last) = twin.hit("leaky").await else {
            panic!("the third request waits")
        };
        assert_eq!(twin.remaining("leaky").await, 0);
        // As the app does: the ticket is the check's `now` plus the delay.
        twin.store
            .release(&key("leaky"), &fast("leaky"), T0 + last, T0);
        twin.wait_remaining("leaky", 1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_frees_a_slot_on_release() {
        let twin = Twin::start();
        assert_eq!(twin.hit("conc").await, Verdict::Allow);
        assert_eq!(twin.hit("conc").await, Verdict::Allow);
        assert!(twin.hit("conc").await.is_deny());
        twin.store.release(&key("conc"), &fast("conc"), T0, T0 + S);
        twin.model.release(&key("conc"), &fast("conc"), T0, T0 + S);
        twin.wait_remaining("conc", 1).await;
        assert_eq!(twin.hit("conc").await, Verdict::Allow);
        assert!(twin.hit("conc").await.is_deny());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refusal_by_one_limiter_is_counted_by_a_fixed_window_but_costs_no_token() {
        let twin = Twin::start();
        wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(2));
        let both = [("one", false), ("token", false)];
        twin.request(&both).await;
        let second = twin.request(&both).await;
        assert!(second[0].verdict.is_deny());
        assert_eq!(second[0].quota.remaining, 0);
        assert_eq!(
            second[1].quota.remaining, 2,
            "the refused request took no token"
        );
        // A shadow limiter reports its denial but lets the request through.
        let shadowed = twin.request(&[("one", true), ("token", false)]).await;
        assert!(shadowed[0].verdict.is_deny());
        assert_eq!(shadowed[1].quota.remaining, 1, "admitted: it took a token");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_carry_the_prefix_and_hash_tag_and_expire_on_their_own() {
        let twin = Twin::start();
        wait_for_window_room(Duration::from_secs(1), Duration::from_millis(300));
        for name in ["fixed", "sliding", "token", "leaky", "conc"] {
            twin.hit(name).await;
            let redis_key = format!("contract:{{contract}}{}", key(name));
            let ttl = twin
                ._server
                .command(&["PTTL", &redis_key])
                .unwrap_or_default();
            let ms: i64 = ttl.trim_start_matches(':').parse().unwrap_or(-3);
            let most = match name {
                "fixed" => 2_000,
                "sliding" => 1_000,
                "token" | "leaky" => 300,
                _ => 600_000,
            };
            assert!(
                ms > 0 && ms <= most,
                "{redis_key}: PTTL {ttl}, expected 1..={most}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn peek_counts_nothing_and_reset_forgets_the_key() {
        let twin = Twin::start();
        twin.hit("sliding").await;
        twin.hit("sliding").await;
        assert_eq!(twin.remaining("sliding").await, 1);
        assert_eq!(
            twin.remaining("sliding").await,
            1,
            "peeking counted nothing"
        );
        let removed = twin.store.reset(&[key("sliding"), key("token")]).await;
        assert_eq!(removed.unwrap(), 1);
        assert_eq!(twin.remaining("sliding").await, 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refund_gives_back_exactly_what_the_rust_arithmetic_gives_back() {
        let twin = Twin::start();
        // Hour-long windows and bucket: nothing refills while the test runs,
        // and Redis' clock (which the test cannot stop) rarely nears a window's end.
        let slow = |name: &str| match name {
            "fixed" => Algorithm::FixedWindow(FixedWindow {
                limit: 3,
                window: 3600 * S,
            }),
            "sliding" => Algorithm::SlidingWindow(SlidingWindow {
                limit: 3,
                window: 3600 * S,
            }),
            _ => Algorithm::TokenBucket(TokenBucket {
                capacity: 3,
                interval: 3600 * S,
                refunds: true,
            }),
        };
        wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(5));
        for name in ["fixed", "sliding", "token"] {
            let a = slow(name);
            let k = format!("refund-{name}:ip:203.0.113.9");
            let once = || async {
                let checks = [Check {
                    key: &k,
                    overflow: "test:*overflow",
                    algorithm: &a,
                    shadow: false,
                }];
                let got = twin.store.check(&checks, T0).await.unwrap()[0];
                let want = twin.model.check(&checks, got.at)[0];
                assert_eq!(got, want, "{name}: Redis and the Rust arithmetic disagree");
                got
            };
            let mut tickets = Vec::new();
            for _ in 0..3 {
                let o = once().await;
                assert_eq!(o.verdict, Verdict::Allow, "{name}");
                tickets.push((o.at, o.ticket(&a)));
            }
            let refused = once().await;
            assert!(refused.verdict.is_deny(), "{name} is full");
            if a.counts_refused() {
                let ticket = refused.ticket(&a);
                twin.store.refund(&k, &a, ticket, T0).await.unwrap();
                twin.model.refund(&k, &a, ticket, refused.at);
            }
            // The middle request's answer did not count.
            let (at, ticket) = tickets[1];
            twin.store.refund(&k, &a, ticket, T0).await.unwrap();
            twin.model.refund(&k, &a, ticket, at);
            let o = once().await;
            assert_eq!(o.verdict, Verdict::Allow, "{name}: one unit came back");
            // The newest unit back too (a token bucket's moves nobody): the
            // next check still reads the same in Redis and in the arithmetic.
            let ticket = o.ticket(&a);
            twin.store.refund(&k, &a, ticket, T0).await.unwrap();
            twin.model.refund(&k, &a, ticket, o.at);
            assert_eq!(
                once().await.verdict,
                Verdict::Allow,
                "{name}: the newest came back"
            );
            assert!(once().await.verdict.is_deny(), "{name}: only one");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_token_bucket_ticket_from_before_the_bucket_was_last_full_gives_nothing_back() {
        // A second to spare: the last steps must come before the new token is paid off.
        let twin = Twin::start();
        stale_ticket_contract(&twin.store, 2 * S, 0, Duration::from_millis(2_100)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn token_bucket_refunds_in_any_order_give_back_exactly_their_tokens() {
        any_order_contract(&Twin::start().store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ban_is_shared_by_the_fleet_expires_in_redis_and_a_reset_lifts_it() {
        let twin = Twin::start();
        let other = open_redis(&twin._server, Duration::from_millis(500));
        let k = key("fixed");
        let rule = three_for_an_hour();
        assert_eq!(
            twin.store.strike(&k, &rule, 60 * S, T0).await.unwrap(),
            None
        );
        // Strikes count across proxies: the third, on another proxy, bans.
        assert_eq!(other.strike(&k, &rule, 60 * S, T0).await.unwrap(), None);
        let ban = twin.store.strike(&k, &rule, 60 * S, T0).await.unwrap();
        assert_eq!(ban.map(|b| b.remaining), Some(3600 * S));
        let seen = other.banned(&[k.as_str()], T0).await.unwrap()[0].expect("banned everywhere");
        assert!(
            seen.remaining <= 3600 * S && seen.remaining > 3590 * S,
            "{seen:?}"
        );
        let ban_key = format!("contract:{{contract}}!ban:{k}");
        let reply = twin
            ._server
            .command(&["PTTL", &ban_key])
            .expect("Redis answers");
        let ttl: i64 = reply.trim_start_matches(':').parse().unwrap();
        assert!(ttl > 3_590_000 && ttl <= 3_600_000, "PTTL {ttl}");
        assert_eq!(twin.store.active_bans(T0), 1, "this proxy saw it");
        other.reset(std::slice::from_ref(&k)).await.unwrap();
        assert_eq!(
            twin.store.banned(&[k.as_str()], T0).await.unwrap(),
            vec![None]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn strikes_spread_over_more_than_the_window_never_ban_in_redis() {
        let twin = Twin::start();
        let k = key("fixed");
        let rule = three_for_an_hour();
        let window = 300 * MS;
        for _ in 0..4 {
            assert_eq!(
                twin.store.strike(&k, &rule, window, T0).await.unwrap(),
                None
            );
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        assert_eq!(
            twin.store.banned(&[k.as_str()], T0).await.unwrap(),
            vec![None]
        );
    }

    async fn hit_once(store: &Store) -> Result<Outcome, tollgate::store::StoreError> {
        let a = fast("fixed");
        let k = key("fixed");
        let checks = [Check {
            key: &k,
            overflow: "overflow",
            algorithm: &a,
            shadow: false,
        }];
        store.check(&checks, T0).await.map(|o| o[0])
    }

    async fn wait_healthy(store: &Store, healthy: bool) {
        assert!(
            common::eventually(Duration::from_secs(5), || async {
                store.healthy() == healthy
            })
            .await,
            "the store never became healthy={healthy}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_opened_while_redis_is_down_starts_and_recovers_when_redis_comes_up() {
        let mut server = RedisServer::unstarted();
        let started = Instant::now();
        let store = open_redis(&server, Duration::from_millis(50));
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "opening never waits for Redis"
        );
        let call = Instant::now();
        assert!(hit_once(&store).await.is_err());
        assert!(
            call.elapsed() < Duration::from_millis(300),
            "a failed call decides within the timeout"
        );
        wait_healthy(&store, false).await;
        assert!(matches!(
            hit_once(&store).await,
            Err(tollgate::store::StoreError::CircuitOpen)
        ));
        server.restart();
        wait_healthy(&store, true).await;
        assert_eq!(
            hit_once(&store).await.expect("Redis answers").verdict,
            Verdict::Allow
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_frozen_redis_costs_at_most_the_timeout_then_the_breaker_skips_it() {
        let server = RedisServer::start();
        let timeout = Duration::from_millis(100);
        let store = open_redis(&server, timeout);
        hit_once(&store).await.expect("Redis answers");
        server.freeze();
        let mut waits = Vec::new();
        for _ in 0..5 {
            let call = Instant::now();
            assert!(hit_once(&store).await.is_err());
            waits.push(call.elapsed());
        }
        server.thaw();
        assert!(
            waits
                .iter()
                .all(|w| *w < timeout + Duration::from_millis(100)),
            "{waits:?}"
        );
        assert!(
            waits[0] >= timeout,
            "the first call waited for the frozen Redis: {waits:?}"
        );
        assert!(
            waits[3] < Duration::from_millis(10) && waits[4] < Duration::from_millis(10),
            "after {} failures the breaker answers at once: {waits:?}",
            tollgate::store::redis::BREAKER_THRESHOLD
        );
        assert!(!store.healthy());
        wait_healthy(&store, true).await;
        hit_once(&store).await.expect("Redis answers again");
    }
}
