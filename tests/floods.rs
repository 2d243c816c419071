//! A flood of new identities never costs an innocent: the table stays bounded, the limited stay limited, new clients get keys of their own, and a refused request creates nothing.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{metric, GaugeWatch, Process};

const MAX_KEYS: usize = 1024;

/// Every request carries an IP (trusted `X-Forwarded-For`) and a tenant: two
/// identities, each under its own limiter.
const YAML: &str = r#"
store: { max_keys: 1024 }
identity: { trusted_proxies: [127.0.0.1/32] }
limiters:
  per_ip: { algorithm: fixed_window, limit: 5, window: 1h, key: ip }
  per_tenant: { algorithm: fixed_window, limit: 50, window: 1h, key: "header:X-Tenant" }
routes:
  - name: all
    match: { path_prefix: / }
    respond: { status: 200, body: "ok\n" }
    limiters: [per_ip, per_tenant]
"#;

/// The client at 429 on `per_ip` before the flood.
const LIMITED: &str = "198.51.100.7";
/// Flood requests: each a new IP and a new tenant, so 2 × this many
/// identities, 100 × `max_keys`.
const FLOOD: u32 = 51_200;
const LANES: u32 = 16;
/// New well-behaved clients during the flood, 3 requests each (under both limits).
const INNOCENTS: u32 = 200;

fn flood_ip(i: u32) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

async fn get(c: &reqwest::Client, url: &str, ip: &str, tenant: Option<&str>) -> u16 {
    let mut request = c.get(url).header("X-Forwarded-For", ip);
    if let Some(t) = tenant {
        request = request.header("X-Tenant", t);
    }
    request
        .send()
        .await
        .expect("tollgate answers")
        .status()
        .as_u16()
}

async fn metrics(c: &reqwest::Client, admin: std::net::SocketAddr) -> String {
    common::get_text(c, &format!("http://{admin}/metrics")).await
}

async fn tracked(c: &reqwest::Client, admin: std::net::SocketAddr) -> f64 {
    metric(&metrics(c, admin).await, "tollgate_tracked_keys").expect("the gauge")
}

/// One new client: 3 requests from its own IP with its own tenant; whether all were admitted.
async fn innocent(c: &reqwest::Client, url: &str, j: u32) -> bool {
    let (ip, tenant) = (format!("192.0.2.{j}"), format!("innocent-{j}"));
    let mut admitted = true;
    for _ in 0..3 {
        admitted &= get(c, url, &ip, Some(&tenant)).await == 200;
    }
    admitted
}

/// Sends the flood over [`LANES`] connections; every 200 flood requests a
/// lane serves one innocent client. Returns how many innocents were admitted.
async fn flood_with_innocents(c: &reqwest::Client, url: &str) -> usize {
    let admitted = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..LANES)
        .map(|lane| {
            let (c, url, admitted) = (c.clone(), url.to_string(), admitted.clone());
            tokio::spawn(async move {
                let mut next = lane;
                for (n, i) in (0..FLOOD).filter(|i| i % LANES == lane).enumerate() {
                    let tenant = format!("flood-{i}");
                    let status = get(&c, &url, &flood_ip(i), Some(&tenant)).await;
                    assert!(status == 200 || status == 429, "status {status}");
                    if n % 200 == 199 && next < INNOCENTS {
                        if innocent(&c, &url, next).await {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        next += LANES;
                    }
                }
                assert!(next >= INNOCENTS, "lane {lane} served all its innocents");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

/// 300 requests from the client limited on `per_ip`, each with a new
/// tenant: all refused, and the tracked keys do not grow.
fn refused_attempts_with_new_tenants_make_no_key(
    runtime: &tokio::runtime::Runtime,
    c: &reqwest::Client,
    url: &str,
    admin: std::net::SocketAddr,
) {
    let (before, refused, after) = runtime.block_on(async {
        let before = tracked(c, admin).await;
        let mut refused = 0;
        for t in 0..300 {
            let tenant = format!("walk-{t}");
            refused += usize::from(get(c, url, LIMITED, Some(&tenant)).await == 429);
        }
        (before, refused, tracked(c, admin).await)
    });
    eprintln!("300 refused attempts with new tenants: tracked keys {before} -> {after}");
    assert_eq!(refused, 300);
    assert_eq!(
        after, before,
        "a refused request created keys in per_tenant"
    );
}

/// The SQLite file tollgate left is bounded like the table, and kept the
/// limited client's window.
fn assert_sqlite_file_bounded(db: &std::path::Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let keys: i64 = conn
        .query_row(
            "SELECT count(DISTINCT key) FROM rate_limit_windows",
            [],
            |r| r.get(0),
        )
        .unwrap();
    eprintln!("SQLite file after the flood: {keys} keys");
    assert!(keys as usize <= MAX_KEYS, "{keys} keys in the file");
    let limited: i64 = conn
        .query_row(
            "SELECT count FROM rate_limit_windows WHERE key = ?1",
            [format!("per_ip:ip:{LIMITED}")],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        limited >= 6,
        "the limited client's window was kept ({limited})"
    );
}

#[test]
fn a_flood_of_100_times_max_keys_identities_costs_no_new_client_and_frees_no_limited_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = Process::serve(YAML, dir.path());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (url, admin) = (format!("http://{}/", proxy.addr), proxy.admin);
    let c = common::client();

    // (a) A client limited before the flood.
    let statuses: Vec<u16> = runtime.block_on(async {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(get(&c, &url, LIMITED, None).await);
        }
        v
    });
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);

    // (d) Refused on per_ip, it sends a new tenant per attempt: no key is made.
    refused_attempts_with_new_tenants_make_no_key(&runtime, &c, &url, admin);

    // (b) New clients during the flood, the gauge watched all along.
    let gauge = GaugeWatch::start(&runtime, &c, admin, "tollgate_tracked_keys");
    let admitted = runtime.block_on(flood_with_innocents(&c, &url));
    let most = gauge.peak(&runtime);
    let text = runtime.block_on(metrics(&c, admin));
    let value = |name| metric(&text, name).unwrap_or_else(|| panic!("{name} in /metrics"));
    let (evicted, live, overflow) = (
        value("tollgate_keys_evicted_total"),
        value("tollgate_keys_evicted_live_total"),
        value("tollgate_keys_overflow_total"),
    );
    eprintln!(
        "{} identities against max_keys {MAX_KEYS}: {admitted} of {INNOCENTS} new clients admitted \
         (3 requests each); tracked keys peaked at {most}; evicted {evicted} (live {live}); overflow {overflow}",
        2 * FLOOD
    );
    assert!(
        admitted * 100 >= INNOCENTS as usize * 99,
        "{admitted} of {INNOCENTS} new clients admitted"
    );
    // (c) Memory stays within the bound.
    assert!(most as usize <= MAX_KEYS, "the gauge peaked at {most}");
    assert!(
        most as usize >= MAX_KEYS * 9 / 10,
        "the table did fill ({most})"
    );
    assert!(live > 0.0, "room was made by evicting light live keys");

    // (a) Still limited after the flood.
    let after = runtime.block_on(get(&c, &url, LIMITED, None));
    assert_eq!(after, 429, "the client limited before the flood still is");

    // (c) The SQLite file is bounded like the table.
    proxy.signal("TERM");
    assert!(proxy.wait_exit(Duration::from_secs(20)).success());
    assert_sqlite_file_bounded(&dir.path().join("tollgate.db"));
}

#[test]
fn with_redis_a_request_refused_by_one_limiter_creates_no_key_in_the_others() {
    let redis = RedisServer::start();
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", prefix: \"floods:\" }}\n{}",
        redis.url(),
        YAML.trim_start()
            .trim_start_matches("store: { max_keys: 1024 }\n")
    );
    let dir = tempfile::tempdir().unwrap();
    let proxy = Process::serve(&yaml, dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("http://{}/", proxy.addr);
    let c = common::client();
    let dbsize = || redis.command(&["DBSIZE"]).expect("Redis answers");
    let (statuses, before, refused, after) = runtime.block_on(async {
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(get(&c, &url, LIMITED, None).await);
        }
        let before = dbsize();
        let mut refused = 0;
        for t in 0..300 {
            let tenant = format!("walk-{t}");
            refused += usize::from(get(&c, &url, LIMITED, Some(&tenant)).await == 429);
        }
        (statuses, before, refused, dbsize())
    });
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    eprintln!("300 refused attempts with new tenants: Redis DBSIZE {before} -> {after}");
    assert_eq!(refused, 300);
    assert_eq!(after, before, "a refused request created Redis keys");
}
