//! A fleet past one Redis node: two tollgates on a real Redis Cluster share every limit exactly,
//! spread clients over every primary, and ride out a failover and a slot migration; on Sentinel,
//! they follow the promoted replica without a restart.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis_cluster::{Cluster, Sentinel, MASTER};
use common::{
    concurrent, eventually_blocking, http, http_with, wait_for_window_room, Process, Reply,
};

/// The fleet's Redis timeout in the fault tests; a request may take this
/// plus the machine's slack (2 shared cores running several builds).
const STORE_TIMEOUT: Duration = Duration::from_millis(250);
const SLACK: Duration = Duration::from_secs(1);
/// How often tollgate re-reads Sentinel (the store's probe interval).
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

const PREFIX: &str = "fleet:";

fn cluster_yaml(seeds: &[String], on_error: &str, timeout: &str, rest: &str) -> String {
    let seeds: Vec<String> = seeds.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "store: {{ backend: redis, cluster: [{}], prefix: \"{PREFIX}\", timeout: {timeout}, on_error: {on_error} }}\nidentity: {{ trusted_proxies: [127.0.0.1/32] }}\n{rest}",
        seeds.join(", ")
    )
}

fn get_as(p: &Process, path: &str, ip: &str) -> Reply {
    http_with(p.addr, "GET", path, &[("X-Forwarded-For", ip)])
        .unwrap_or_else(|e| panic!("{path}: {e}\n{}", p.output()))
}

/// The Redis key tollgate gives a store key on a cluster: the client (or the whole value) as hash tag.
fn cluster_key(store_key: &str, tag: &str) -> String {
    format!("{PREFIX}{{{tag}}}{store_key}")
}

#[test]
fn two_tollgates_seeded_with_a_node_owning_none_of_their_slots_admit_exactly_the_limit() {
    let cluster = Cluster::start();
    let slot = cluster.slot(&cluster_key("fw:global", "global"));
    let owner = cluster.owner(slot);
    let seed = *cluster
        .primaries()
        .iter()
        .find(|&&p| p != owner)
        .expect("another primary");
    let yaml = cluster_yaml(
        &[cluster.node(seed).url()],
        "deny",
        // Exactness, not the outage timer: 200 concurrent scripts on a busy machine.
        "5s",
        "limiters:\n  fw: { algorithm: fixed_window, limit: 50, window: 3600s, key: global }\n  sw: { algorithm: sliding_window, limit: 50, window: 3600s, key: global }\n  tb: { algorithm: token_bucket, capacity: 50, refill_per_second: 0.001, key: global }\nroutes:\n  - { name: fw, match: { path: /fw }, respond: { status: 200, body: ok }, limiters: [fw] }\n  - { name: sw, match: { path: /sw }, respond: { status: 200, body: ok }, limiters: [sw] }\n  - { name: tb, match: { path: /tb }, respond: { status: 200, body: ok }, limiters: [tb] }\n",
    );
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Process::serve(&yaml, dir_a.path());
    let b = Process::serve(&yaml, dir_b.path());
    wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(30));
    for path in ["/fw", "/sw", "/tb"] {
        assert_eq!(
            concurrent(&[&a, &b], path, 200),
            50,
            "{path}: 50 of 200 across the fleet, seeded with {seed} while {owner} owns slot {slot}\n{}",
            a.output()
        );
    }
    let on_owner = cluster.keys_on(owner, PREFIX);
    for name in ["fw", "sw", "tb"] {
        let key = cluster_key(&format!("{name}:global"), "global");
        assert!(on_owner.contains(&key), "{key} on {owner}: {on_owner:?}");
    }
    assert!(
        cluster.keys_on(seed, PREFIX).is_empty(),
        "nothing on the seed"
    );
}

const PER_CLIENT: &str = "limiters:\n  per_ip: { algorithm: sliding_window, limit: 5, window: 3600s, key: ip }\n  per_ip_route: { algorithm: fixed_window, limit: 5, window: 3600s, key: [route, ip] }\n  site: { algorithm: sliding_window, limit: 100000, window: 3600s, key: global }\nroutes:\n  - { name: all, match: { path_prefix: / }, respond: { status: 200, body: ok }, limiters: [per_ip, per_ip_route, site] }\n";

#[test]
fn traffic_from_30_clients_leaves_keys_on_all_three_primaries_and_each_client_in_one_slot() {
    let cluster = Cluster::start();
    let yaml = cluster_yaml(&[cluster.nodes[0].url()], "deny", "5s", PER_CLIENT);
    let dir = tempfile::tempdir().unwrap();
    let a = Process::serve(&yaml, dir.path());
    for i in 1..=30 {
        let r = get_as(&a, "/", &format!("198.51.100.{i}"));
        assert_eq!(r.status, 200, "{r:?}\n{}", a.output());
    }
    let primaries = cluster.primaries();
    let mut holding = 0;
    for &p in &primaries {
        let keys = cluster.keys_on(p, PREFIX);
        // Both per-client limiters of a client sit on one primary together.
        for k in keys.iter().filter(|k| k.contains("}per_ip:ip:")) {
            let tag = &k[PREFIX.len() + 1..k.find('}').unwrap()];
            let twin = cluster_key(&format!("per_ip_route:route:all|{tag}"), tag);
            assert!(keys.contains(&twin), "{twin} beside {k} on {p}");
        }
        holding += usize::from(keys.iter().any(|k| k.contains("}per_ip:ip:")));
    }
    assert_eq!(
        holding, 3,
        "clients spread over every primary {primaries:?}"
    );
    // A client over its limit is refused by its own slot; the `global`
    // limiter, in another slot, admitted and recorded it, and gives it back.
    for _ in 0..4 {
        assert_eq!(get_as(&a, "/", "198.51.100.1").status, 200);
    }
    let refused = get_as(&a, "/", "198.51.100.1");
    assert_eq!(refused.status, 429, "{refused:?}");
    let site = cluster_key("site:global", "global");
    let site_owner = cluster.owner(cluster.slot(&site));
    let entries = || -> i64 {
        let n = cluster.node(site_owner).cli(&["LLEN", &site]);
        n.trim().parse::<i64>().unwrap_or(0) - 1 // the first element is the list's shape
    };
    let given_back = eventually_blocking(Duration::from_secs(5), || entries() == 34);
    assert!(
        given_back,
        "the site counts the 34 admitted requests only, not {}",
        entries()
    );
    let ready = http(a.admin, "GET", "/readyz").unwrap().json();
    assert_eq!(ready["store"]["topology"], "cluster", "{ready}");
    let up = ready["store"]["nodes"].as_array().unwrap();
    assert_eq!(up.len(), 6, "{ready}");
    let dashboard = http(a.admin, "GET", "/dashboard.json").unwrap().json();
    assert_eq!(
        dashboard["store"]["nodes"], ready["store"]["nodes"],
        "{dashboard}"
    );
    let metrics = http(a.admin, "GET", "/metrics").unwrap().body;
    assert_eq!(
        metrics.matches("tollgate_store_node_up{").count(),
        6,
        "{metrics}"
    );
}

/// Requests from many clients in a loop until `stop`: the slowest answer
/// and every status that was not 200/429.
struct Traffic {
    stop: Arc<AtomicBool>,
    slowest_ms: Arc<AtomicU64>,
    bad: Arc<Mutex<Vec<u16>>>,
    sent: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(fleet: &[&Process]) -> Traffic {
        let t = Traffic {
            stop: Arc::new(AtomicBool::new(false)),
            slowest_ms: Arc::new(AtomicU64::new(0)),
            bad: Arc::new(Mutex::new(Vec::new())),
            sent: Arc::new(AtomicUsize::new(0)),
            threads: Vec::new(),
        };
        let threads = (0..4)
            .map(|n| {
                let addr = fleet[n % fleet.len()].addr;
                let (stop, slowest, bad, sent) = (
                    t.stop.clone(),
                    t.slowest_ms.clone(),
                    t.bad.clone(),
                    t.sent.clone(),
                );
                std::thread::spawn(move || {
                    let mut i = 0;
                    while !stop.load(Ordering::SeqCst) {
                        i += 1;
                        let ip = format!("203.0.113.{}", (i * 7 + n) % 200 + 1);
                        let started = Instant::now();
                        let r = http_with(addr, "GET", "/", &[("X-Forwarded-For", &ip)]);
                        let took = started.elapsed().as_millis() as u64;
                        slowest.fetch_max(took, Ordering::SeqCst);
                        sent.fetch_add(1, Ordering::SeqCst);
                        match r {
                            Ok(r) if matches!(r.status, 200 | 429) => {}
                            Ok(r) => bad.lock().unwrap().push(r.status),
                            Err(_) => bad.lock().unwrap().push(0),
                        }
                    }
                })
            })
            .collect();
        Traffic { threads, ..t }
    }

    /// Stops; (slowest answer, bad statuses, requests sent).
    fn finish(self) -> (Duration, Vec<u16>, usize) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        let bad = self.bad.lock().unwrap().clone();
        (
            Duration::from_millis(self.slowest_ms.load(Ordering::SeqCst)),
            bad,
            self.sent.load(Ordering::SeqCst),
        )
    }
}

#[test]
fn a_replica_failover_and_a_slot_migration_during_traffic_keep_answers_bounded_and_limits_exact() {
    let cluster = Cluster::start();
    let yaml = cluster_yaml(
        &[cluster.nodes[1].url()],
        "local",
        &format!("{}ms", STORE_TIMEOUT.as_millis()),
        "limiters:\n  per_ip: { algorithm: fixed_window, limit: 1000000, window: 60s, key: ip }\n  five: { algorithm: fixed_window, limit: 5, window: 3600s, key: ip }\nroutes:\n  - { name: five, match: { path: /five }, respond: { status: 200, body: ok }, limiters: [five] }\n  - { name: all, match: { path_prefix: / }, respond: { status: 200, body: ok }, limiters: [per_ip] }\n",
    );
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Process::serve(&yaml, dir_a.path());
    let b = Process::serve(&yaml, dir_b.path());
    let traffic = Traffic::start(&[&a, &b]);
    std::thread::sleep(Duration::from_millis(500));

    // A replica takes over its primary's slots (CLUSTER FAILOVER on the replica).
    let busy = cluster.owner(cluster.slot(&cluster_key("per_ip:ip:203.0.113.8", "ip:203.0.113.8")));
    let replica = cluster.replica_of(busy);
    // A manual failover gives up after 5 s without the primary's agreement
    // (a loaded machine); it is asked again, then forced.
    let promoted = [None, None, Some("FORCE")].iter().any(|force| {
        let mut args = vec!["CLUSTER", "FAILOVER"];
        args.extend(*force);
        assert!(cluster.node(replica).cli(&args).contains("OK"));
        eventually_blocking(Duration::from_secs(10), || {
            cluster.primaries().contains(&replica)
        })
    });
    assert!(
        promoted,
        "{replica} never became primary:\n{}",
        cluster.nodes_text()
    );
    std::thread::sleep(Duration::from_millis(500));

    // A slot in use moves to another primary, keys and all.
    let key = cluster_key("per_ip:ip:203.0.113.15", "ip:203.0.113.15");
    let slot = cluster.slot(&key);
    let from = cluster.owner(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    cluster.migrate_slot(slot, from, to);
    let moved = eventually_blocking(Duration::from_secs(10), || cluster.owner(slot) == to);
    assert!(
        moved,
        "slot {slot} never moved to {to}:\n{}",
        cluster.nodes_text()
    );
    std::thread::sleep(Duration::from_millis(500));

    let (slowest, bad, sent) = traffic.finish();
    eprintln!("failover and migration: {sent} requests, slowest {slowest:?}, failed {bad:?}");
    assert!(
        bad.is_empty(),
        "with on_error: local no request fails: {bad:?}"
    );
    assert!(
        slowest < STORE_TIMEOUT + SLACK,
        "the slowest of {sent} requests took {slowest:?} (store timeout {STORE_TIMEOUT:?})"
    );
    // Afterwards the fleet shares limits exactly again, on the moved slot too.
    let healthy = eventually_blocking(Duration::from_secs(10), || {
        [&a, &b]
            .iter()
            .all(|p| http(p.admin, "GET", "/readyz").is_ok_and(|r| r.status == 200))
    });
    assert!(healthy, "not ready after the faults:\n{}", a.output());
    wait_for_window_room(Duration::from_secs(3600), Duration::from_secs(10));
    for ip in ["203.0.113.15", "192.0.2.77"] {
        let got: Vec<u16> = [&a, &b, &a, &b, &a, &b, &a]
            .iter()
            .map(|p| get_as(p, "/five", ip).status)
            .collect();
        assert_eq!(
            got,
            [200, 200, 200, 200, 200, 429, 429],
            "{ip}: 5 across the fleet"
        );
    }
}

/// Two limiters on the Sentinel `group`'s master: `three` (3 an hour per
/// IP, on `/three`) and a generous one on every other path.
fn sentinel_yaml(group: &Sentinel) -> String {
    let nodes: Vec<String> = group
        .sentinel_urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect();
    format!(
        "store: {{ backend: redis, sentinel: {{ master: {MASTER}, nodes: [{}] }}, prefix: \"{PREFIX}\", timeout: {}ms, on_error: local }}\nidentity: {{ trusted_proxies: [127.0.0.1/32] }}\nlimiters:\n  per_ip: {{ algorithm: fixed_window, limit: 1000000, window: 60s, key: ip }}\n  three: {{ algorithm: sliding_window, limit: 3, window: 3600s, key: ip }}\nroutes:\n  - {{ name: three, match: {{ path: /three }}, respond: {{ status: 200, body: ok }}, limiters: [three] }}\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }}, limiters: [per_ip] }}\n",
        nodes.join(", "),
        STORE_TIMEOUT.as_millis()
    )
}

/// The healthy primary `p`'s `/readyz` names ("" when none).
fn primary_of(p: &Process) -> String {
    let ready = http(p.admin, "GET", "/readyz")
        .map(|r| r.json())
        .unwrap_or_default();
    ready["store"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["role"] == "primary" && n["healthy"] == true)
        .and_then(|n| n["addr"].as_str())
        .unwrap_or("")
        .to_string()
}

#[test]
fn on_sentinel_tollgate_follows_the_promoted_replica_within_one_probe_interval_plus_slack() {
    let mut group = Sentinel::start();
    let yaml = sentinel_yaml(&group);
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Process::serve(&yaml, dir_a.path());
    let b = Process::serve(&yaml, dir_b.path());
    let old = group.primary.addr();
    let found = eventually_blocking(Duration::from_secs(10), || {
        primary_of(&a) == old && primary_of(&b) == old
    });
    assert!(
        found,
        "tollgate never found the primary {old}:\n{}",
        a.output()
    );
    let shared = |ip: &str| -> Vec<u16> {
        [&a, &b, &a, &b]
            .iter()
            .map(|p| get_as(p, "/three", ip).status)
            .collect()
    };
    assert_eq!(
        shared("192.0.2.1"),
        [200, 200, 200, 429],
        "one limit before"
    );

    let traffic = Traffic::start(&[&a, &b]);
    std::thread::sleep(Duration::from_millis(300));
    group.primary.kill();
    let new = group.replica.addr();
    let started = Instant::now();
    let promoted = eventually_blocking(Duration::from_secs(30), || group.named_primary() == new);
    let promoted_after = started.elapsed();
    assert!(promoted, "the sentinels never promoted {new}");
    let followed = eventually_blocking(PROBE_INTERVAL + SLACK + SLACK, || {
        primary_of(&a) == new && primary_of(&b) == new
    });
    let followed_after = started.elapsed();
    let (slowest, bad, sent) = traffic.finish();
    assert!(
        followed,
        "Sentinel named {new} after {promoted_after:?}; tollgate had not followed after {followed_after:?}:\n{}",
        a.output()
    );
    assert!(
        bad.is_empty(),
        "with on_error: local no request fails: {bad:?}"
    );
    assert!(
        slowest < STORE_TIMEOUT + SLACK,
        "the slowest of {sent} requests took {slowest:?}"
    );
    assert_eq!(
        shared("192.0.2.2"),
        [200, 200, 200, 429],
        "one limit on the new primary"
    );
    eprintln!(
        "sentinel promoted {new} {promoted_after:?} after the kill; tollgate followed by {followed_after:?}; {sent} requests, slowest {slowest:?}"
    );
}
