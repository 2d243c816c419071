//! `store.max_keys`: a flood of new identities neither grows memory nor frees a limited client; one process per SQLite file.

mod common;
use common::WINDOW_START;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{metric, GaugeWatch, Process};
use tollgate::config::{BackendConfig, KeyPart, LimiterConfig, OnError, SqliteConfig, StoreConfig};
use tollgate::limiter::fixed_window::FixedWindow;
use tollgate::limiter::{Algorithm, Nanos, NANOS_PER_SEC as S};
use tollgate::store::{Check, Store};

const FLOOD_YAML: &str = r#"
store: { max_keys: 1000 }
identity: { trusted_proxies: [127.0.0.1/32] }
limiters:
  strict: { algorithm: sliding_window, limit: 5, window: 1h, key: ip }
  burst: { algorithm: token_bucket, capacity: 10, refill_per_second: 10, key: ip }
routes:
  - name: all
    match: { path_prefix: / }
    respond: { status: 200, body: "ok\n" }
    limiters: [strict, burst]
"#;

const LIMITED: &str = "198.51.100.7";

/// The identity of flood request `i`: distinct for every `i` below 2^24.
fn flood_ip(i: u32) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

async fn get(c: &reqwest::Client, url: &str, ip: &str) -> u16 {
    c.get(url)
        .header("X-Forwarded-For", ip)
        .send()
        .await
        .expect("tollgate answers")
        .status()
        .as_u16()
}

async fn metrics(c: &reqwest::Client, admin: std::net::SocketAddr) -> String {
    common::get_text(c, &format!("http://{admin}/metrics")).await
}

/// Sends one request for each identity in `range` over `lanes` keep-alive connections.
async fn flood(c: &reqwest::Client, url: &str, range: std::ops::Range<u32>, lanes: u32) {
    let tasks: Vec<_> = (0..lanes)
        .map(|lane| {
            let (c, url, range) = (c.clone(), url.to_string(), range.clone());
            tokio::spawn(async move {
                for i in range.filter(|i| i % lanes == lane) {
                    let status = get(&c, &url, &flood_ip(i)).await;
                    assert!(status == 200 || status == 429, "status {status}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// The SQLite file tollgate left is bounded like the table, and kept the
/// limited client's log.
fn assert_sqlite_rows_bounded(db: &std::path::Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let rows: i64 = conn
        .query_row("SELECT count(*) FROM limiter_state", [], |r| r.get(0))
        .unwrap();
    assert!(rows <= 1000, "{rows} rows in limiter_state");
    let limited: i64 = conn
        .query_row(
            "SELECT count(*) FROM limiter_state WHERE key = ?1",
            [format!("strict:ip:{LIMITED}")],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(limited, 1, "the limited client's log was persisted");
}

#[test]
fn a_flood_of_50000_identities_keeps_the_table_bounded_and_the_limited_client_limited() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = Process::serve(FLOOD_YAML, dir.path());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (addr, admin) = (proxy.addr, proxy.admin);
    let url = format!("http://{addr}/");
    let c = common::client();

    runtime.block_on(async {
        let statuses: Vec<u16> = {
            let mut v = Vec::new();
            for _ in 0..6 {
                v.push(get(&c, &url, LIMITED).await);
            }
            v
        };
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    });

    // Watch the gauge for the whole flood, not just at the end.
    let gauge = GaugeWatch::start(&runtime, &c, admin, "tollgate_tracked_keys");

    // Warm up first (table full, connections open, allocator settled), so
    // the RSS comparison sees only what the rest of the flood adds.
    runtime.block_on(flood(&c, &url, 0..5_000, 16));
    let rss_before = proxy.rss_kib();
    runtime.block_on(flood(&c, &url, 5_000..50_000, 16));
    let rss_after = proxy.rss_kib();
    let most = gauge.peak(&runtime);

    let text = runtime.block_on(metrics(&c, admin));
    let tracked = metric(&text, "tollgate_tracked_keys").unwrap();
    let overflow = metric(&text, "tollgate_keys_overflow_total").unwrap();
    let evicted = metric(&text, "tollgate_keys_evicted_total").unwrap();
    let live = metric(&text, "tollgate_keys_evicted_live_total").unwrap();
    eprintln!("RSS {rss_before} KiB -> {rss_after} KiB over 45,000 new identities; gauge peak {most}, overflow {overflow}, evicted {evicted} (live {live})");
    assert!(tracked <= 1000.0, "tracked {tracked}");
    assert!(most <= 1000, "the gauge peaked at {most}");
    assert!(
        most >= 900,
        "the table did fill up ({most}): the bound was reached"
    );
    assert_eq!(metric(&text, "tollgate_max_keys"), Some(1000.0));
    // One request of 5 each: the flood's own keys are the lightest, and
    // room is made by evicting them (the limited client's key never).
    assert!(live > 40_000.0, "light live keys evicted: {live}");
    assert!(evicted >= live, "evicted {evicted} counts the live ones");
    // Measured: bounded, +1 MB; the same flood with no effective bound
    // (max_keys: 1000000) grows RSS by ~17 MB. The gauge above is the exact
    // check; this one catches whatever else might grow per identity.
    assert!(
        rss_after <= rss_before + 8 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );

    let after = runtime.block_on(get(&c, &url, LIMITED));
    assert_eq!(after, 429, "the client limited before the flood still is");

    // The SQLite file is bounded like the table.
    proxy.signal("TERM");
    assert!(proxy.wait_exit(Duration::from_secs(20)).success());
    assert_sqlite_rows_bounded(&dir.path().join("tollgate.db"));
}

// ------------------------------------------------------------- the SQLite file

fn window() -> Algorithm {
    Algorithm::FixedWindow(FixedWindow {
        limit: 3,
        window: 60 * S,
    })
}

fn open(path: &std::path::Path, max_keys: usize, now: Nanos) -> Store {
    let config = StoreConfig {
        backend: BackendConfig::Sqlite(SqliteConfig {
            path: path.to_path_buf(),
            flush_interval: Duration::from_secs(3600),
        }),
        on_error: OnError::Deny,
        prune_interval: Duration::from_secs(3600),
        max_keys,
    };
    let limiters = [LimiterConfig {
        key: vec![KeyPart::Ip],
        ..common::limiter("w", window())
    }];
    Store::open(&config, &limiters, now).expect("store opens")
}

/// One request on `key`; whether it was admitted.
async fn hit(store: &Store, key: &str, now: Nanos) -> bool {
    let a = window();
    let out = store
        .check(
            &[Check {
                key,
                overflow: "w:*overflow",
                algorithm: &a,
                shadow: false,
            }],
            now,
        )
        .await
        .unwrap();
    !out[0].ruling.is_deny()
}

fn distinct_keys(path: &std::path::Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(
        "SELECT count(DISTINCT key) FROM rate_limit_windows",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[tokio::test]
async fn the_sqlite_file_never_holds_more_keys_than_max_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bounded.db");
    let store = open(&path, 200, WINDOW_START);
    for i in 0..5_000u32 {
        hit(&store, &format!("w:ip:{}", flood_ip(i)), WINDOW_START).await;
    }
    store.flush().unwrap();
    assert!(distinct_keys(&path) <= 200, "{}", distinct_keys(&path));

    // A window later the first wave rests; a second wave evicts it, and the
    // writer deletes what was evicted.
    let later = WINDOW_START + 61 * S;
    for i in 10_000..15_000u32 {
        hit(&store, &format!("w:ip:{}", flood_ip(i)), later).await;
    }
    store.flush().unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let old: i64 = conn
        .query_row(
            "SELECT count(*) FROM rate_limit_windows WHERE window_start = '2026-01-01T00:00:00Z'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(distinct_keys(&path) <= 200, "{}", distinct_keys(&path));
    assert!(
        store.key_counters().evicted.load(Ordering::Relaxed) > 0,
        "the first wave was evicted"
    );
    assert_eq!(old, 0, "evicted rows were deleted from the file");
    store.shutdown().expect("everything saved");
    drop(store);

    // Reopened with a smaller bound: it loads no more than that, and the
    // rows it could not hold leave the file with the first write.
    let store = open(&path, 150, later);
    assert!(store.tracked_keys() <= 150, "{}", store.tracked_keys());
    store.flush().unwrap();
    assert!(distinct_keys(&path) <= 150, "{}", distinct_keys(&path));
}

// ------------------------------------------------------------ one process per file

/// `tollgate serve` on a config whose store is the file at `db`: its exit status and output.
fn serve_on(db: &std::path::Path, dir: &std::path::Path) -> (std::process::ExitStatus, String) {
    let yaml = format!(
        "store: {{ path: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }} }}\n",
        db.display()
    );
    let config = dir.join("second.yaml");
    let (a, b) = (common::free_addr(), common::free_addr());
    std::fs::write(&config, common::pin_yaml(&yaml, a, b, dir)).unwrap();
    let args = [
        std::ffi::OsStr::new("serve"),
        std::ffi::OsStr::new("--config"),
        config.as_os_str(),
    ];
    common::process::run_to_exit(&args, Duration::from_secs(20))
}

#[test]
fn a_second_tollgate_on_a_symlink_or_a_hard_link_to_the_file_refuses_to_start_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shared.db");
    let yaml = format!(
        "store: {{ path: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }} }}\n",
        db.display()
    );
    let first = Process::serve(&yaml, dir.path());
    let soft = dir.path().join("soft.db");
    std::os::unix::fs::symlink(&db, &soft).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let hard = elsewhere.path().join("hard.db");
    std::fs::hard_link(&db, &hard).unwrap();
    for link in [&soft, &hard] {
        let (status, out) = serve_on(link, elsewhere.path());
        assert_eq!(status.code(), Some(1), "{}:\n{out}", link.display());
        assert!(
            out.contains("another process is already using the SQLite store")
                && out.contains(&link.display().to_string()),
            "the error names the file:\n{out}"
        );
    }
    let answer = common::http(first.addr, "GET", "/").unwrap();
    assert_eq!(answer.status, 200, "the first keeps serving");
}

#[tokio::test]
async fn a_store_dropped_and_reopened_20_times_while_processes_spawn_always_opens_with_its_counts()
{
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reopened.db");
    // Children forked meanwhile hold copies of the process's descriptors
    // until they exec, as the suite's other tests' children do.
    let spawning = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spawners: Vec<_> = (0..2)
        .map(|_| {
            let spawning = spawning.clone();
            std::thread::spawn(move || {
                while spawning.load(Ordering::Relaxed) {
                    let _ = std::process::Command::new("true").status();
                }
            })
        })
        .collect();
    let key = "w:ip:192.0.2.1";
    let mut rulings = Vec::new();
    for round in 0..20u64 {
        let now = WINDOW_START + round * 1_000_000;
        let store = open(&path, 200, now);
        rulings.push(hit(&store, key, now).await);
        drop(store);
    }
    spawning.store(false, Ordering::Relaxed);
    for s in spawners {
        s.join().unwrap();
    }
    // limit 3 per window: the counts of every earlier round were there.
    let admitted = rulings.iter().filter(|&&allowed| allowed).count();
    assert_eq!(admitted, 3, "{rulings:?}");
}
