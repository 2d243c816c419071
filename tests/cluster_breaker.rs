//! One circuit breaker per Redis Cluster primary: when a primary dies with no replica to take its
//! slots, only the clients whose keys it served apply `on_error`; every other client keeps
//! counting in Redis, and no request waits past `store.timeout`. When a replica takes the slots
//! over, those clients count in Redis again, on the new primary, and `/readyz` is ready again.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::redis_cluster::Cluster;
use common::{eventually_blocking, http, http_with, Process, Reply};

const PREFIX: &str = "brk:";
/// The store's bound on a request's wait for Redis.
const TIMEOUT: Duration = Duration::from_millis(250);
/// What a loaded 2-core machine (several builds at once) adds to that bound.
const SLACK: Duration = Duration::from_millis(750);
/// How long traffic runs after the kill.
const AFTER_KILL: Duration = Duration::from_secs(4);

fn yaml(seeds: &[String]) -> String {
    let seeds: Vec<String> = seeds.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "store: {{ backend: redis, cluster: [{}], prefix: \"{PREFIX}\", timeout: {}ms, on_error: deny }}\n\
         identity: {{ trusted_proxies: [127.0.0.1/32] }}\n\
         limiters:\n  per_ip: {{ algorithm: fixed_window, limit: 100000, window: 3600s, key: ip }}\n\
         routes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }}, limiters: [per_ip] }}\n",
        seeds.join(", "),
        TIMEOUT.as_millis()
    )
}

/// The Redis key of a client's counter: its address is the hash tag.
fn redis_key(ip: &str) -> String {
    format!("{PREFIX}{{ip:{ip}}}per_ip:ip:{ip}")
}

/// 45 clients, by the primary serving their counter's slot.
fn clients_by_primary(cluster: &Cluster) -> BTreeMap<u16, Vec<String>> {
    let mut by: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for i in 1..=45 {
        let ip = format!("198.51.100.{i}");
        let owner = cluster.owner(cluster.slot(&redis_key(&ip)));
        by.entry(owner).or_default().push(ip);
    }
    by
}

/// How many requests of this window Redis counted for the client (the fixed window's `n`).
fn counted(cluster: &Cluster, port: u16, ip: &str) -> u64 {
    let n = cluster.node(port).cli(&["HGET", &redis_key(ip), "n"]);
    n.trim().parse().unwrap_or(0)
}

/// The connections a node has accepted since it started (`INFO stats`),
/// the one this question is asked on included.
fn connections_accepted(cluster: &Cluster, port: u16) -> u64 {
    let stats = cluster.node(port).cli(&["INFO", "stats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats counts connections")
}

fn get_as(p: &Process, ip: &str) -> (Reply, Duration) {
    let started = Instant::now();
    let r = http_with(p.addr, "GET", "/", &[("X-Forwarded-For", ip)])
        .unwrap_or_else(|e| panic!("{ip}: {e}\n{}", p.output()));
    (r, started.elapsed())
}

/// Each primary's breaker as `/readyz` shows it, by port.
fn breakers(p: &Process) -> (u16, BTreeMap<u16, String>) {
    let r = http(p.admin, "GET", "/readyz").unwrap();
    let ready = r.json();
    let mut by = BTreeMap::new();
    for n in ready["store"]["nodes"].as_array().into_iter().flatten() {
        if n["role"] != "primary" {
            continue;
        }
        let port = n["addr"].as_str().unwrap().rsplit(':').next().unwrap();
        let state = n["breaker"].as_str().unwrap_or("none").to_string();
        by.insert(port.parse().unwrap(), state);
    }
    (r.status, by)
}

/// Waits until the probe has read every primary's slots: three breakers, all closed.
fn wait_every_breaker_closed(p: &Process) {
    let mapped = eventually_blocking(Duration::from_secs(10), || {
        let (_, by) = breakers(p);
        by.len() == 3 && by.values().all(|s| s == "closed")
    });
    assert!(
        mapped,
        "the probe read every primary's slots: {:?}",
        breakers(p)
    );
}

/// What [`traffic_after_kill`] saw.
#[derive(Default)]
struct AfterKill {
    rounds: u64,
    /// Answers to the dead primary's clients (all 503 `store-unavailable`).
    refused: usize,
    /// Of those, the answers that took 50 ms or more (calls that went to
    /// the dead primary before its breaker opened).
    waited: usize,
    slowest_other: Duration,
    slowest_victim: Duration,
    last_round_victim: Duration,
}

/// Rounds of one request per client for [`AFTER_KILL`] after `killed`: the
/// dead `victim`'s clients are refused, every other client is served.
fn traffic_after_kill(
    p: &Process,
    clients: &BTreeMap<u16, Vec<String>>,
    victim: u16,
    killed: Instant,
) -> AfterKill {
    let mut seen = AfterKill::default();
    while killed.elapsed() < AFTER_KILL {
        seen.rounds += 1;
        seen.last_round_victim = Duration::ZERO;
        for (&port, ips) in clients {
            for ip in ips {
                let (r, took) = get_as(p, ip);
                if port == victim {
                    assert_eq!(r.status, 503, "{ip} on the dead {port}: {r:?}");
                    assert!(r.body.contains("store-unavailable"), "{r:?}");
                    seen.refused += 1;
                    seen.waited += usize::from(took >= Duration::from_millis(50));
                    seen.slowest_victim = seen.slowest_victim.max(took);
                    seen.last_round_victim = seen.last_round_victim.max(took);
                } else {
                    assert_eq!(
                        r.status,
                        200,
                        "{ip} on the live {port}: {r:?}\n{}",
                        p.output()
                    );
                    seen.slowest_other = seen.slowest_other.max(took);
                }
            }
        }
    }
    seen
}

/// `/readyz` and `/metrics` show `victim`'s breaker open and only it, and
/// the fallback counted exactly the `refused` answers.
fn assert_only_the_victims_breaker_open(
    p: &Process,
    clients: &BTreeMap<u16, Vec<String>>,
    victim: u16,
    refused: usize,
) {
    let (status, by) = breakers(p);
    assert_eq!(status, 503, "a primary's breaker is open: not ready");
    for (port, state) in &by {
        let want = if *port == victim { "open" } else { "closed" };
        assert_eq!(state, want, "{port}: {by:?}");
    }
    let metrics = http(p.admin, "GET", "/metrics").unwrap().body;
    for &port in clients.keys() {
        let series = format!("tollgate_store_node_breaker_open{{node=\"127.0.0.1:{port}\"}}");
        let want = f64::from(u8::from(port == victim));
        assert_eq!(common::metric(&metrics, &series), Some(want), "{metrics}");
    }
    assert_eq!(
        common::metric(&metrics, "tollgate_store_fallback_total{policy=\"deny\"}"),
        Some(refused as f64),
        "every refusal, and only those, was the fallback's"
    );
}

/// One request per client, each counted once in Redis on its primary.
fn each_client_counts_once_on_its_primary(
    p: &Process,
    cluster: &Cluster,
    clients: &BTreeMap<u16, Vec<String>>,
) {
    for (&port, ips) in clients {
        for ip in ips {
            assert_eq!(get_as(p, ip).0.status, 200, "{}", p.output());
            assert_eq!(counted(cluster, port, ip), 1, "{ip} counted on {port}");
        }
    }
}

/// Rounds of one request per client until one of the dead `victim`'s
/// clients is served again (within 30 s of `killed`): when that was, the
/// slowest answer, and how many live primaries' clients got `on_error`.
fn traffic_until_back(
    p: &Process,
    clients: &BTreeMap<u16, Vec<String>>,
    victim: u16,
    killed: Instant,
) -> (Option<Duration>, Duration, usize) {
    let mut slowest = Duration::ZERO;
    let mut back = None;
    // While the client re-reads the slot map, a live primary's client may
    // get `on_error` too (a live client was refused once in six runs, with both
    // tests of this file running at once); counted and reported.
    let mut live_refused = 0;
    while killed.elapsed() < Duration::from_secs(30) && back.is_none() {
        for (&port, ips) in clients {
            for ip in ips {
                let (r, took) = get_as(p, ip);
                slowest = slowest.max(took);
                if port != victim {
                    assert!(
                        matches!(r.status, 200 | 503),
                        "{ip} on the live {port}: {r:?}"
                    );
                    live_refused += usize::from(r.status == 503);
                } else if r.status == 200 && back.is_none() {
                    back = Some(killed.elapsed());
                }
            }
        }
    }
    (back, slowest, live_refused)
}

#[test]
fn a_dead_primary_sends_only_its_own_clients_to_on_error_and_the_others_keep_counting_in_redis() {
    let mut cluster = Cluster::without_replicas();
    let seeds: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let dir = tempfile::tempdir().unwrap();
    let p = Process::serve(&yaml(&seeds), dir.path());
    let clients = clients_by_primary(&cluster);
    assert_eq!(
        clients.len(),
        3,
        "45 clients spread over 3 primaries: {clients:?}"
    );
    each_client_counts_once_on_its_primary(&p, &cluster, &clients);
    wait_every_breaker_closed(&p);

    let victim = *clients.keys().next().unwrap();
    let live: Vec<u16> = clients.keys().copied().filter(|&p| p != victim).collect();
    let accepted: Vec<u64> = live
        .iter()
        .map(|&p| connections_accepted(&cluster, p))
        .collect();
    cluster.node_mut(victim).kill();
    let killed = Instant::now();
    let AfterKill {
        rounds,
        refused,
        waited,
        slowest_other,
        slowest_victim,
        last_round_victim,
    } = traffic_after_kill(&p, &clients, victim, killed);
    eprintln!(
        "rounds after the kill: {rounds}; {refused} refused, {waited} of them after 50 ms or more; \
         slowest answer: {slowest_victim:?} to a client of the dead primary, \
         {slowest_other:?} to the others; slowest in the last round on the dead primary: {last_round_victim:?}"
    );
    assert!(
        slowest_victim <= TIMEOUT + SLACK && slowest_other <= TIMEOUT + SLACK,
        "no request waits past the timeout: {slowest_victim:?}, {slowest_other:?}"
    );
    // Timing alone cannot tell a call that waited on the dead primary from a
    // loaded machine pausing the test (CI once saw one 0.37 s answer in the
    // last round): the log can. Every call that reached Redis and failed
    // logs "store failed"; one refused by the open breaker does not.
    // Requests go one at a time, so exactly the threshold's calls fail
    // before it opens, and none after.
    let log = p.output();
    let reached = log.matches("store failed; applying on_error").count();
    assert_eq!(
        reached, 3,
        "three calls reach the dead primary and open its breaker; every later one is refused \
         without a call ({waited} answers took 50 ms or more; slowest in the last round: \
         {last_round_victim:?})\n{log}"
    );
    // Every second the probe pings the dead primary on a connection of its
    // own, and the live primaries' connections are left alone. (Pinged
    // through the cluster connection, each ping made the client drop and
    // reopen every connection: about 10 new ones a second on each live
    // primary.) The one new connection expected is the one `accepted` was
    // read on; one more is slack for a reconnect of the client's own.
    for (&port, before) in live.iter().zip(&accepted) {
        let new = connections_accepted(&cluster, port) - before;
        assert!(
            new <= 2,
            "{port} accepted {new} connections while {victim} was down ({:?})",
            killed.elapsed()
        );
    }
    for (&port, ips) in clients.iter().filter(|(&port, _)| port != victim) {
        for ip in ips {
            assert_eq!(
                counted(&cluster, port, ip),
                1 + rounds,
                "{ip}: every request counted in Redis on {port}"
            );
        }
    }

    assert_only_the_victims_breaker_open(&p, &clients, victim, refused);
}

#[test]
fn when_a_replica_takes_a_dead_primarys_slots_its_clients_count_in_redis_again_and_readyz_recovers()
{
    let mut cluster = Cluster::with_replicas_serving_partially();
    let seeds: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let dir = tempfile::tempdir().unwrap();
    let p = Process::serve(&yaml(&seeds), dir.path());
    let clients = clients_by_primary(&cluster);
    wait_every_breaker_closed(&p);
    let victim = *clients.keys().next().unwrap();
    let replica = cluster.replica_of(victim);
    let mine = &clients[&victim];
    cluster.node_mut(victim).kill();
    let killed = Instant::now();
    // Its clients fail until its own breaker opens.
    let opened = eventually_blocking(Duration::from_secs(10), || {
        assert_eq!(get_as(&p, &mine[0]).0.status, 503);
        breakers(&p).1.get(&victim).map(String::as_str) == Some("open")
    });
    assert!(
        opened,
        "the dead primary's breaker opened: {:?}",
        breakers(&p)
    );
    // In two runs on this machine the replica of a killed primary was not
    // promoted on its own within 30 s; an operator's forced failover takes the
    // slots over without the dead primary (what is under test is tollgate following).
    let forced = cluster.node(replica).cli(&["CLUSTER", "FAILOVER", "FORCE"]);
    assert_eq!(forced.trim(), "OK", "{forced}");
    let (back, slowest, live_refused) = traffic_until_back(&p, &clients, victim, killed);
    let Some(back) = back else {
        panic!(
            "the dead primary's clients never counted in Redis again\n{}\n{:?}\n{}",
            cluster.nodes_text(),
            breakers(&p),
            p.output()
        );
    };
    eprintln!("the dead primary's clients counted in Redis again {back:?} after the kill; slowest answer {slowest:?}; {live_refused} answers to the live primaries' clients were on_error meanwhile");
    assert!(
        slowest <= TIMEOUT + SLACK,
        "no request waits past the timeout: {slowest:?}"
    );
    let before = counted(&cluster, replica, &mine[0]);
    assert_eq!(get_as(&p, &mine[0]).0.status, 200);
    assert_eq!(
        counted(&cluster, replica, &mine[0]),
        before + 1,
        "{} counted on the promoted replica {replica}",
        mine[0]
    );
    let ready = eventually_blocking(Duration::from_secs(5), || {
        let (status, by) = breakers(&p);
        status == 200 && by.get(&replica).map(String::as_str) == Some("closed")
    });
    assert!(
        ready,
        "ready again, the promoted replica's breaker closed: {:?}",
        breakers(&p)
    );
    assert_eq!(
        breakers(&p).1.get(&victim).map(String::as_str),
        Some("open"),
        "the dead primary's breaker is still open, but it serves no slot"
    );
}
