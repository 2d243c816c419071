//! The store contract on Redis, one node and a 3-primary cluster alike: every answer equals the
//! Rust arithmetic's at the instant Redis decided, keys carry their hash tag and expire, bans are
//! shared, and a failing Redis costs at most the timeout before the breaker skips it.
//!
//! Redis decides on its own clock (`TIME`), which a test cannot drive, so the
//! contract runs there on short real windows, and every answer is compared
//! with the in-memory table fed the same checks at the instant Redis reports
//! (`Outcome::at`): the Lua port must give exactly the Rust arithmetic's answers.
//! Each contract is one function of the topology; `node` and `cluster` below
//! run every one of them (the cluster has no replicas: each test starts one).

use std::time::Instant;

use super::common::redis_cluster::Cluster;
use super::common::redis_server::RedisServer;
use super::common::wait_for_window_room;
use super::*;
use tollgate::config::{RedisConfig, RedisTopology};
use tollgate::store::table::Table;
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

/// The Redis the contract runs on: one node, or a 3-primary cluster.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Node,
    Cluster,
}

fn open_redis(topology: RedisTopology, timeout: Duration) -> Store {
    let config = StoreConfig {
        backend: BackendConfig::Redis(RedisConfig {
            topology,
            prefix: "contract:".into(),
            timeout,
        }),
        on_error: OnError::Deny,
        prune_interval: Duration::from_secs(60),
        max_keys: tollgate::config::DEFAULT_MAX_KEYS,
    };
    Store::open(&config, &limiters(), T0).expect("store opens")
}

/// The running Redis of one test.
enum Backing {
    Node(RedisServer),
    Cluster(Cluster),
}

impl Backing {
    fn start(kind: Kind) -> Backing {
        match kind {
            Kind::Node => Backing::Node(RedisServer::start()),
            Kind::Cluster => Backing::Cluster(Cluster::without_replicas()),
        }
    }

    /// A store on it. On a cluster, once the store's probe has read the slot
    /// map, so that every call feeds the breaker of its key's primary.
    async fn open(&self, timeout: Duration) -> Store {
        let topology = match self {
            Backing::Node(server) => RedisTopology::Node(server.url()),
            Backing::Cluster(cluster) => RedisTopology::Cluster(vec![cluster.nodes[0].url()]),
        };
        let store = open_redis(topology, timeout);
        if let Backing::Cluster(_) = self {
            let mapped = common::eventually(Duration::from_secs(10), || async {
                let nodes = store.status().nodes;
                let primaries = nodes.iter().filter(|n| n.role == "primary");
                primaries.filter(|n| n.breaker_open.is_some()).count() == 3
            })
            .await;
            assert!(mapped, "the store never read the cluster's slot map");
        }
        store
    }

    /// The Redis key of a store key's `name` (the store key itself, or its
    /// `!ban:` hash) behind the hash tag this topology gives it.
    fn redis_key(&self, store_key: &str, name: &str) -> String {
        match self {
            Backing::Node(_) => format!("contract:{{contract}}{name}"),
            Backing::Cluster(_) => {
                format!("contract:{{{}}}{name}", tollgate::key::slot_tag(store_key))
            }
        }
    }

    /// One command on the node that holds `args[1]` (a key); its reply as text.
    fn command(&self, args: &[&str]) -> Option<String> {
        let reply = match self {
            Backing::Node(server) => server.command(args)?,
            Backing::Cluster(cluster) => {
                let owner = cluster.owner(cluster.slot(args[1]));
                cluster.node(owner).cli(args)
            }
        };
        Some(reply.trim().trim_start_matches(':').to_string())
    }

    /// Freezes (SIGSTOP) the node that holds `redis_key`; returns the thaw.
    fn freeze(&self, redis_key: &str) -> Box<dyn FnOnce() + '_> {
        match self {
            Backing::Node(server) => {
                server.freeze();
                Box::new(move || server.thaw())
            }
            Backing::Cluster(cluster) => {
                // Found before the freeze: a frozen node answers nobody, `redis-cli` included.
                let node = cluster.node(cluster.owner(cluster.slot(redis_key)));
                node.signal("STOP");
                Box::new(move || node.signal("CONT"))
            }
        }
    }
}

fn key(name: &str) -> String {
    format!("{name}:ip:203.0.113.9")
}

/// The Redis store and its model, the in-memory table.
struct Twin {
    backing: Backing,
    store: Store,
    model: Table,
}

impl Twin {
    async fn start(kind: Kind) -> Twin {
        let backing = Backing::start(kind);
        let store = backing.open(Duration::from_millis(500)).await;
        Twin {
            backing,
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

    async fn hit(&self, name: &str) -> Ruling {
        self.request(&[(name, false)]).await[0].ruling
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

fn retry_after(v: Ruling) -> Duration {
    match v {
        Ruling::Deny { retry_after } => Duration::from_nanos(retry_after),
        other => panic!("expected a denial, got {other:?}"),
    }
}

async fn fixed_window_allows_its_limit_and_recovers_at_the_window_end(kind: Kind) {
    let twin = Twin::start(kind).await;
    wait_for_window_room(Duration::from_secs(1), Duration::from_millis(400));
    for _ in 0..3 {
        assert_eq!(twin.hit("fixed").await, Ruling::Allow);
    }
    let denied = twin.request(&[("fixed", false)]).await[0];
    let window = S;
    assert_eq!(
        denied.ruling,
        Ruling::Deny {
            retry_after: window - denied.at % window
        },
        "Retry-After is the time to the window's end on Redis' clock"
    );
    tokio::time::sleep(retry_after(denied.ruling)).await;
    assert_eq!(twin.hit("fixed").await, Ruling::Allow);
}

async fn sliding_window_recovers_when_the_oldest_admission_leaves(kind: Kind) {
    let twin = Twin::start(kind).await;
    let first = twin.request(&[("sliding", false)]).await[0];
    assert_eq!(first.ruling, Ruling::Allow);
    for _ in 0..2 {
        assert_eq!(twin.hit("sliding").await, Ruling::Allow);
    }
    let denied = twin.request(&[("sliding", false)]).await[0];
    assert_eq!(
        denied.ruling,
        Ruling::Deny {
            retry_after: first.at + S - denied.at
        }
    );
    tokio::time::sleep(retry_after(denied.ruling)).await;
    assert_eq!(twin.hit("sliding").await, Ruling::Allow);
}

async fn token_bucket_refills_one_token_per_interval(kind: Kind) {
    let twin = Twin::start(kind).await;
    for _ in 0..3 {
        assert_eq!(twin.hit("token").await, Ruling::Allow);
    }
    let denied = twin.hit("token").await;
    assert!(retry_after(denied) <= Duration::from_millis(300));
    tokio::time::sleep(retry_after(denied)).await;
    assert_eq!(twin.hit("token").await, Ruling::Allow);
    assert!(
        twin.hit("token").await.is_deny(),
        "one token came back, not two"
    );
}

async fn leaky_bucket_queues_up_to_capacity_then_rejects(kind: Kind) {
    let twin = Twin::start(kind).await;
    assert_eq!(twin.hit("leaky").await, Ruling::Allow);
    assert!(matches!(twin.hit("leaky").await, Ruling::Delay(d) if d <= 300 * MS));
    assert!(matches!(twin.hit("leaky").await, Ruling::Delay(d) if d > 300 * MS && d <= 600 * MS));
    let denied = twin.hit("leaky").await;
    tokio::time::sleep(retry_after(denied)).await;
    assert!(matches!(twin.hit("leaky").await, Ruling::Delay(_)));
}

async fn a_queued_request_that_leaves_gives_its_place_back(kind: Kind) {
    let twin = Twin::start(kind).await;
    twin.hit("leaky").await;
    twin.hit("leaky").await;
    let Ruling::Delay(last) = twin.hit("leaky").await else {
        panic!("the third request waits")
    };
    assert_eq!(twin.remaining("leaky").await, 0);
    // As the app does: the ticket is the check's `now` plus the delay.
    twin.store
        .release(&key("leaky"), &fast("leaky"), T0 + last, T0);
    twin.wait_remaining("leaky", 1).await;
}

async fn concurrency_frees_a_slot_on_release(kind: Kind) {
    let twin = Twin::start(kind).await;
    assert_eq!(twin.hit("conc").await, Ruling::Allow);
    assert_eq!(twin.hit("conc").await, Ruling::Allow);
    assert!(twin.hit("conc").await.is_deny());
    twin.store.release(&key("conc"), &fast("conc"), T0, T0 + S);
    twin.model.release(&key("conc"), &fast("conc"), T0, T0 + S);
    twin.wait_remaining("conc", 1).await;
    assert_eq!(twin.hit("conc").await, Ruling::Allow);
    assert!(twin.hit("conc").await.is_deny());
}

async fn a_refusal_by_one_limiter_is_counted_by_a_fixed_window_but_costs_no_token(kind: Kind) {
    let twin = Twin::start(kind).await;
    wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(2));
    let both = [("one", false), ("token", false)];
    twin.request(&both).await;
    let second = twin.request(&both).await;
    assert!(second[0].ruling.is_deny());
    assert_eq!(second[0].quota.remaining, 0);
    assert_eq!(
        second[1].quota.remaining, 2,
        "the refused request took no token"
    );
    // A shadow limiter reports its denial but lets the request through.
    let shadowed = twin.request(&[("one", true), ("token", false)]).await;
    assert!(shadowed[0].ruling.is_deny());
    assert_eq!(shadowed[1].quota.remaining, 1, "admitted: it took a token");
}

async fn keys_carry_the_prefix_and_hash_tag_and_expire_on_their_own(kind: Kind) {
    let twin = Twin::start(kind).await;
    wait_for_window_room(Duration::from_secs(1), Duration::from_millis(300));
    for name in ["fixed", "sliding", "token", "leaky", "conc"] {
        let redis_key = twin.backing.redis_key(&key(name), &key(name));
        let most = match name {
            "fixed" => 2_000,
            "sliding" => 1_000,
            "token" | "leaky" => 300,
            _ => 600_000,
        };
        // A bucket's key lives 300 ms: on a loaded machine the PTTL can come
        // after it is gone (CI once read -2). Only a key asked for too late
        // to be there is tried again; one missing sooner is a wrong key.
        let mut tries = 0;
        let ms = loop {
            tries += 1;
            let asked = Instant::now();
            twin.hit(name).await;
            let ttl = twin
                .backing
                .command(&["PTTL", &redis_key])
                .unwrap_or_default();
            let ms: i64 = ttl.parse().unwrap_or(-3);
            let late = asked.elapsed() >= Duration::from_millis(most as u64);
            if ms != -2 || !late || tries == 10 {
                break ms;
            }
        };
        assert!(
            ms > 0 && ms <= most,
            "{redis_key}: PTTL {ms} (try {tries}), expected 1..={most}"
        );
    }
}

async fn peek_counts_nothing_and_reset_forgets_the_key(kind: Kind) {
    let twin = Twin::start(kind).await;
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

async fn a_refund_gives_back_exactly_what_the_rust_arithmetic_gives_back(kind: Kind) {
    let twin = Twin::start(kind).await;
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
            assert_eq!(o.ruling, Ruling::Allow, "{name}");
            tickets.push((o.at, o.ticket(&a)));
        }
        let refused = once().await;
        assert!(refused.ruling.is_deny(), "{name} is full");
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
        assert_eq!(o.ruling, Ruling::Allow, "{name}: one unit came back");
        // The newest unit back too (a token bucket's moves nobody): the
        // next check still reads the same in Redis and in the arithmetic.
        let ticket = o.ticket(&a);
        twin.store.refund(&k, &a, ticket, T0).await.unwrap();
        twin.model.refund(&k, &a, ticket, o.at);
        assert_eq!(
            once().await.ruling,
            Ruling::Allow,
            "{name}: the newest came back"
        );
        assert!(once().await.ruling.is_deny(), "{name}: only one");
    }
}

async fn a_token_bucket_ticket_from_before_the_bucket_was_last_full_gives_nothing_back(kind: Kind) {
    // A second to spare: the last steps must come before the new token is paid off.
    let twin = Twin::start(kind).await;
    stale_ticket_contract(&twin.store, 2 * S, 0, Duration::from_millis(2_100)).await;
}

async fn token_bucket_refunds_in_any_order_give_back_exactly_their_tokens(kind: Kind) {
    any_order_contract(&Twin::start(kind).await.store).await;
}

async fn a_ban_is_shared_by_the_fleet_expires_in_redis_and_a_reset_lifts_it(kind: Kind) {
    let twin = Twin::start(kind).await;
    let other = twin.backing.open(Duration::from_millis(500)).await;
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
    let ban_key = twin.backing.redis_key(&k, &format!("!ban:{k}"));
    let reply = twin
        .backing
        .command(&["PTTL", &ban_key])
        .expect("Redis answers");
    let ttl: i64 = reply.parse().unwrap();
    assert!(ttl > 3_590_000 && ttl <= 3_600_000, "PTTL {ttl}");
    assert_eq!(twin.store.active_bans(T0), 1, "this proxy saw it");
    other.reset(std::slice::from_ref(&k)).await.unwrap();
    assert_eq!(
        twin.store.banned(&[k.as_str()], T0).await.unwrap(),
        vec![None]
    );
}

async fn strikes_spread_over_more_than_the_window_never_ban_in_redis(kind: Kind) {
    let twin = Twin::start(kind).await;
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
            store.status().healthy == healthy
        })
        .await,
        "the store never became healthy={healthy}"
    );
}

/// One node only: it restarts the one server on the port the store was
/// given. On a cluster, a Redis that no seed answers at start is the same
/// code path (the whole store's breaker, tripped by the first probe).
async fn a_store_opened_while_redis_is_down_starts_and_recovers_when_redis_comes_up() {
    let mut server = RedisServer::unstarted();
    let started = Instant::now();
    let store = open_redis(RedisTopology::Node(server.url()), Duration::from_millis(50));
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
        Err(e) if e.kind == tollgate::store::StoreFailure::CircuitOpen
    ));
    server.restart();
    wait_healthy(&store, true).await;
    assert_eq!(
        hit_once(&store).await.expect("Redis answers").ruling,
        Ruling::Allow
    );
}

async fn a_frozen_redis_costs_at_most_the_timeout_then_the_breaker_skips_it(kind: Kind) {
    let backing = Backing::start(kind);
    let timeout = Duration::from_millis(100);
    let store = backing.open(timeout).await;
    hit_once(&store).await.expect("Redis answers");
    // On a cluster: the primary holding the key, whose own breaker opens.
    let thaw = backing.freeze(&backing.redis_key(&key("fixed"), &key("fixed")));
    let mut waits = Vec::new();
    for _ in 0..5 {
        let call = Instant::now();
        assert!(hit_once(&store).await.is_err());
        waits.push(call.elapsed());
    }
    thaw();
    // The bound is the timeout plus a loaded machine's scheduling slack (a
    // 200.7 ms call was seen beside a build); a call that waited for Redis
    // itself would take seconds.
    assert!(
        waits
            .iter()
            .all(|w| *w < timeout + Duration::from_millis(400)),
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
    assert!(!store.status().healthy);
    wait_healthy(&store, true).await;
    hit_once(&store).await.expect("Redis answers again");
}

/// One `#[tokio::test]` per contract, on the topology `$kind`.
macro_rules! on {
    ($module:ident, $kind:expr, [$($contract:ident),* $(,)?]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $contract() {
                    super::$contract($kind).await
                }
            )*
        }
    };
}

/// Every contract of this file on the topology `$kind`.
macro_rules! every_contract {
    ($module:ident, $kind:ident) => {
        on!(
            $module,
            super::Kind::$kind,
            [
                fixed_window_allows_its_limit_and_recovers_at_the_window_end,
                sliding_window_recovers_when_the_oldest_admission_leaves,
                token_bucket_refills_one_token_per_interval,
                leaky_bucket_queues_up_to_capacity_then_rejects,
                a_queued_request_that_leaves_gives_its_place_back,
                concurrency_frees_a_slot_on_release,
                a_refusal_by_one_limiter_is_counted_by_a_fixed_window_but_costs_no_token,
                keys_carry_the_prefix_and_hash_tag_and_expire_on_their_own,
                peek_counts_nothing_and_reset_forgets_the_key,
                a_refund_gives_back_exactly_what_the_rust_arithmetic_gives_back,
                a_token_bucket_ticket_from_before_the_bucket_was_last_full_gives_nothing_back,
                token_bucket_refunds_in_any_order_give_back_exactly_their_tokens,
                a_ban_is_shared_by_the_fleet_expires_in_redis_and_a_reset_lifts_it,
                strikes_spread_over_more_than_the_window_never_ban_in_redis,
                a_frozen_redis_costs_at_most_the_timeout_then_the_breaker_skips_it,
            ]
        );
    };
}

every_contract!(node, Node);
every_contract!(cluster, Cluster);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_only_a_store_opened_while_redis_is_down_starts_and_recovers_when_redis_comes_up() {
    a_store_opened_while_redis_is_down_starts_and_recovers_when_redis_comes_up().await
}
