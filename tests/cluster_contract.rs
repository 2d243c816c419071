//! The store contract on a real 3-primary Redis Cluster: one client's limiters share a slot and
//! agree with the Rust arithmetic exactly; limiters in different slots never over-admit, and what
//! an admitting slot took for a request another slot refused comes back; bans and resets reach
//! every primary.

mod common;

use std::time::Duration;

use common::redis_cluster::Cluster;
use common::WINDOW_START;
use tollgate::config::{
    BackendConfig, LimiterConfig, OnError, RedisConfig, RedisTopology, StoreConfig,
};
use tollgate::limiter::ban::BanRule;
use tollgate::limiter::{
    concurrency::Concurrency, fixed_window::FixedWindow, leaky_bucket::LeakyBucket,
    sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm, Nanos, NANOS_PER_SEC as S,
};
use tollgate::store::table::Table;
use tollgate::store::{Check, Store};

const T0: Nanos = WINDOW_START + 2 * S;
const NAMES: [&str; 5] = ["one", "sliding", "token", "leaky", "conc"];

fn limiters() -> Vec<LimiterConfig> {
    NAMES
        .iter()
        .map(|name| common::limiter(name, fast(name)))
        .collect()
}

fn three_for_an_hour() -> BanRule {
    BanRule {
        after: 3,
        duration: 3600 * S,
        status: http::StatusCode::TOO_MANY_REQUESTS,
    }
}

const MS: Nanos = 1_000_000;

fn open_cluster(cluster: &Cluster) -> Store {
    open_seeded(vec![cluster.nodes[0].url()], Duration::from_secs(5))
}

fn open_seeded(seeds: Vec<String>, timeout: Duration) -> Store {
    let config = StoreConfig {
        backend: BackendConfig::Redis(RedisConfig {
            topology: RedisTopology::Cluster(seeds),
            prefix: "contract:".into(),
            // No test here measures latency: a generous bound for a loaded
            // machine. (The ban list's SCAN that once outlasted 2 s and then
            // 5 s went to a replica that a fresh cluster's node still listed
            // as a primary without slots; `ban::holders` no longer asks one.)
            timeout,
        }),
        on_error: OnError::Deny,
        prune_interval: Duration::from_secs(60),
        max_keys: tollgate::config::DEFAULT_MAX_KEYS,
    };
    Store::open(&config, &limiters(), T0).expect("store opens")
}

fn fast(name: &str) -> Algorithm {
    match name {
        "token" => Algorithm::TokenBucket(TokenBucket {
            capacity: 3,
            interval: 3600 * S,
            refunds: false,
        }),
        "leaky" => Algorithm::LeakyBucket(LeakyBucket {
            capacity: 2,
            interval: 300 * MS,
        }),
        "one" => Algorithm::FixedWindow(FixedWindow {
            limit: 1,
            window: 3600 * S,
        }),
        "sliding" => Algorithm::SlidingWindow(SlidingWindow {
            limit: 3,
            window: 3600 * S,
        }),
        _ => Algorithm::Concurrency(Concurrency { max_in_flight: 2 }),
    }
}

/// One request through `(limiter, store key)` pairs, in one store call.
async fn request(store: &Store, limiters: &[(&str, &str)]) -> Vec<tollgate::store::Outcome> {
    let algorithms: Vec<Algorithm> = limiters.iter().map(|(n, _)| fast(n)).collect();
    let checks: Vec<Check<'_>> = limiters
        .iter()
        .zip(&algorithms)
        .map(|((_, key), algorithm)| Check {
            key,
            overflow: "overflow",
            algorithm,
            shadow: false,
        })
        .collect();
    store.check(&checks, T0).await.expect("the cluster answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_limiters_share_a_slot_and_agree_with_the_rust_arithmetic() {
    let cluster = Cluster::start();
    let store = open_cluster(&cluster);
    let model = Table::new(false);
    let names = NAMES;
    let keys: Vec<String> = names
        .iter()
        .map(|n| format!("{n}:ip:203.0.113.9"))
        .collect();
    let pairs: Vec<(&str, &str)> = names
        .iter()
        .copied()
        .zip(keys.iter().map(String::as_str))
        .collect();
    let algorithms: Vec<Algorithm> = names.iter().map(|n| fast(n)).collect();
    for _ in 0..4 {
        let got = request(&store, &pairs).await;
        let checks: Vec<Check<'_>> = keys
            .iter()
            .zip(&algorithms)
            .map(|(key, algorithm)| Check {
                key,
                overflow: "overflow",
                algorithm,
                shadow: false,
            })
            .collect();
        let want = model.check(&checks, got[0].at);
        assert_eq!(got, want, "the cluster and the Rust arithmetic disagree");
    }
    let slots: Vec<u16> = keys
        .iter()
        .map(|k| cluster.slot(&format!("contract:{{ip:203.0.113.9}}{k}")))
        .collect();
    assert!(slots.windows(2).all(|w| w[0] == w[1]), "{slots:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_in_one_slot_gives_back_what_another_slot_took_and_never_over_admits() {
    let cluster = Cluster::start();
    let store = open_cluster(&cluster);
    let (mine, shared) = ("one:ip:203.0.113.9", "token:global");
    assert_ne!(
        cluster.slot(&format!("contract:{{ip:203.0.113.9}}{mine}")),
        cluster.slot(&format!("contract:{{global}}{shared}")),
        "two slots"
    );
    let both = [("one", mine), ("token", shared)];
    let first = request(&store, &both).await;
    assert!(first.iter().all(|o| !o.ruling.is_deny()), "{first:?}");
    assert_eq!(first[1].quota.remaining, 2);
    // The client's own limit refuses; the shared bucket had admitted and taken a token.
    let second = request(&store, &both).await;
    assert!(second[0].ruling.is_deny(), "{second:?}");
    let token = fast("token");
    let given_back = common::eventually(Duration::from_secs(5), || async {
        store.peek(shared, &token, T0).await.unwrap().remaining == 2
    })
    .await;
    assert!(given_back, "the refused request's token never came back");
    // Never over-admits: a third client-refused request leaves the bucket as it was, and
    // three other clients take exactly the two tokens left.
    let third = request(&store, &both).await;
    assert!(third[0].ruling.is_deny());
    let given_back = common::eventually(Duration::from_secs(5), || async {
        store.peek(shared, &token, T0).await.unwrap().remaining == 2
    })
    .await;
    assert!(
        given_back,
        "the third refused request's token never came back"
    );
    let mut admitted = 0;
    for ip in ["198.51.100.1", "198.51.100.2", "198.51.100.3"] {
        let own = format!("one:ip:{ip}");
        let got = request(&store, &[("one", &own), ("token", shared)]).await;
        admitted += usize::from(!got.iter().any(|o| o.ruling.is_deny()));
    }
    assert_eq!(admitted, 2, "two tokens were left");
}

/// Bans `n` clients (three strikes each under [`three_for_an_hour`]); their keys.
async fn ban_clients(store: &Store, n: usize) -> Vec<String> {
    let rule = three_for_an_hour();
    let keys: Vec<String> = (1..=n).map(|i| format!("one:ip:192.0.2.{i}")).collect();
    for k in &keys {
        for _ in 0..3 {
            store.strike(k, &rule, 60 * S, T0).await.unwrap();
        }
    }
    keys
}

/// The keys `GET /bans` would list, sorted.
async fn listed_bans(store: &Store) -> Vec<String> {
    let mut listed: Vec<String> = store
        .ban_list(T0)
        .await
        .expect("the ban list")
        .into_iter()
        .map(|b| b.key)
        .collect();
    listed.sort();
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_and_resets_reach_every_primary() {
    let cluster = Cluster::start();
    let store = open_cluster(&cluster);
    let keys = ban_clients(&store, 12).await;
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let banned = store.banned(&refs, T0).await.unwrap();
    assert!(banned.iter().all(Option::is_some), "{banned:?}");
    let mut want = keys.clone();
    want.sort();
    assert_eq!(
        listed_bans(&store).await,
        want,
        "every ban, from every primary"
    );
    let holding = cluster
        .primaries()
        .iter()
        .filter(|&&p| !cluster.keys_on(p, "contract:").is_empty())
        .count();
    assert!(holding >= 2, "12 clients spread over the primaries");
    store.reset(&keys).await.unwrap();
    let after = store.banned(&refs, T0).await.unwrap();
    assert!(after.iter().all(Option::is_none), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_store_whose_first_seed_never_answers_still_lists_every_ban() {
    let cluster = Cluster::start();
    let mut keys = ban_clients(&open_cluster(&cluster), 6).await;
    keys.sort();
    // A seed that takes connections (the kernel completes them) and never
    // answers: the fresh store's cluster connection waits a second for it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("redis://{}", listener.local_addr().unwrap());
    let fresh = open_seeded(
        vec![silent, cluster.nodes[0].url()],
        Duration::from_millis(250),
    );
    // Asked of the seeds in turn: the silent one, then a live one.
    assert_eq!(
        listed_bans(&fresh).await,
        keys,
        "every ban, from every primary"
    );
}
