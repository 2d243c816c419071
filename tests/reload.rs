//! Hot reload: every trigger applies, a bad config never does, traffic never notices, counters stay.

mod common;

use common::T0;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client, eventually, pin_yaml, ping_yaml, Proxy, Upstream};
use tollgate::clock::{ManualClock, SystemClock};

/// Exhausts a limit of 1, lets `change` rewrite the config to a limit of
/// 1000, and returns how long it took until a request was admitted again.
/// (Fixed windows count every attempt, the polling ones too, so the new limit
/// must leave room for them.)
async fn limit_raised_by(proxy: &Proxy, change: impl FnOnce()) -> Duration {
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 429);
    let edited = Instant::now();
    change();
    assert!(
        eventually(Duration::from_secs(2), || async {
            common::status(&c, &proxy.url("/ping"), &[]).await == 200
        })
        .await,
        "the new limit was not enforced within 2 s"
    );
    edited.elapsed()
}

async fn watched(yaml: &str) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    Proxy::start_in(
        yaml,
        ManualClock::at(T0),
        dir,
        Some(Duration::from_millis(250)),
    )
    .await
}

#[tokio::test]
async fn editing_the_file_in_place_applies_the_new_limit_within_two_seconds() {
    let proxy = watched(&ping_yaml(1)).await;
    let took = limit_raised_by(&proxy, || proxy.write_config(&ping_yaml(1000))).await;
    eprintln!("reload latency (in-place write, 250 ms poll): {took:?}");
    assert_eq!(proxy.app.snapshot().version, 2);
}

#[tokio::test]
async fn writing_a_temp_file_and_renaming_it_applies_the_new_limit() {
    let proxy = watched(&ping_yaml(1)).await;
    limit_raised_by(&proxy, || {
        let tmp = proxy.dir.path().join(".tollgate.yaml.swp");
        std::fs::write(
            &tmp,
            pin_yaml(&ping_yaml(1000), proxy.addr, proxy.admin, proxy.dir.path()),
        )
        .unwrap();
        std::fs::rename(&tmp, &proxy.config_path).unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_configmap_style_symlink_swap_applies_the_new_limit() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::create_dir(root.join("..v1")).unwrap();
    symlink("..v1", root.join("..data")).unwrap();
    symlink("..data/tollgate.yaml", root.join("tollgate.yaml")).unwrap();
    let proxy = Proxy::start_in(
        &ping_yaml(1),
        ManualClock::at(T0),
        dir,
        Some(Duration::from_millis(250)),
    )
    .await;
    assert!(
        root.join("..v1/tollgate.yaml").exists(),
        "the harness wrote through the symlinks"
    );
    limit_raised_by(&proxy, || {
        std::fs::create_dir(root.join("..v2")).unwrap();
        std::fs::write(
            root.join("..v2/tollgate.yaml"),
            pin_yaml(&ping_yaml(1000), proxy.addr, proxy.admin, &root),
        )
        .unwrap();
        symlink("..v2", root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    })
    .await;
}

#[tokio::test]
async fn every_kind_of_invalid_config_is_rejected_and_the_old_one_keeps_serving() {
    let proxy = Proxy::start_with_clock(&ping_yaml(1), ManualClock::at(T0)).await;
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap();
    let db = proxy.dir.path().join("tollgate.db");
    let pinned = |yaml: &str| pin_yaml(yaml, proxy.addr, proxy.admin, proxy.dir.path());
    let cases: Vec<(&str, String, &str)> = vec![
        ("yaml syntax", "limiters: [\n".into(), "line"),
        ("unknown key", pinned("limiters:\n  strict: { limt: 5, window: 60s }\n"), "unknown key `limt`"),
        ("missing limiter", pinned("routes:\n  - { name: p, match: { path: /ping }, respond: { status: 200 }, limiters: [nope] }\n"), "no limiter named \"nope\""),
        ("missing upstream", pinned("routes:\n  - { name: p, match: { path: /ping }, upstream: nowhere }\n"), "no upstream named \"nowhere\""),
        ("bad CIDR", pinned("identity: { trusted_proxies: [10.0.0.0/33] }\n"), "invalid CIDR"),
        ("unreadable TLS file", pinned("server: { tls: { cert: /nonexistent/cert.pem, key: /nonexistent/key.pem } }\n"), "cannot read /nonexistent/cert.pem"),
        (
            "port in use",
            format!(
                "server: {{ listen: [\"{}\", \"{busy_addr}\"] }}\nadmin: {{ listen: \"{}\" }}\nstore: {{ path: \"{}\" }}\n{}",
                proxy.addr,
                proxy.admin,
                db.display(),
                ping_yaml(5)
            ),
            "cannot listen on",
        ),
        (
            "store backend change",
            pinned(&format!("store: {{ backend: memory }}\n{}", ping_yaml(5))),
            "restart",
        ),
        (
            "store.max_keys change",
            pinned(&format!("store: {{ max_keys: 5000 }}\n{}", ping_yaml(5))),
            "store.max_keys cannot change while running",
        ),
        (
            "log.access_file change",
            pinned(&format!("log: {{ access_file: /tmp/elsewhere.log }}\n{}", ping_yaml(5))),
            "log.access_file cannot change while running",
        ),
        (
            "unreadable error page",
            pinned(&format!("server: {{ error_pages: {{ 404: /nonexistent/404.html }} }}\n{}", ping_yaml(5))),
            "server.error_pages.404",
        ),
    ];
    let cases_len = cases.len();
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    for (what, text, expected) in cases {
        std::fs::write(&proxy.config_path, text).unwrap();
        let (code, body) = proxy.reload().await;
        assert_eq!(code, 422, "{what}: {body}");
        let errors = common::reload_errors(&body).join("\n");
        assert!(
            errors.contains(expected),
            "{what}: expected {expected:?} in {errors}"
        );
        assert_eq!(
            common::status(&c, &proxy.url("/ping"), &[]).await,
            429,
            "{what}: the old limit of 1 still holds"
        );
        let config: serde_json::Value = common::get_json(&c, &proxy.admin_url("/config")).await;
        assert_eq!(config["version"], 1, "{what}");
        assert!(config["last_reload_error"].is_string(), "{what}: {config}");
    }
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(&format!(
            "tollgate_config_reloads_total{{result=\"error\"}} {}",
            cases_len
        )),
        "{metrics}"
    );
    drop(busy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_reloads_under_load_drop_no_request_and_mix_no_configs() {
    let config = |body: &str| {
        format!(
            "limiters:\n  roomy: {{ limit: 1000000, window: 60s }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200, body: \"{body}\" }}, limiters: [roomy] }}\n"
        )
    };
    let proxy = Arc::new(Proxy::start_with_clock(&config("A"), Arc::new(SystemClock)).await);
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (proxy, stop, served) = (proxy.clone(), stop.clone(), served.clone());
            tokio::spawn(async move {
                let c = client();
                let mut bad = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match c.get(proxy.url("/x")).send().await {
                        Ok(r) => {
                            let code = r.status().as_u16();
                            let body = r.text().await.unwrap_or_default();
                            if code != 200 || !(body == "A" || body == "B") {
                                bad.push(format!("{code} {body:?}"));
                            }
                            served.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => bad.push(format!("connection error: {e}")),
                    }
                }
                bad
            })
        })
        .collect();
    let probe = client();
    for i in 0..50 {
        let expected = if i % 2 == 0 { "B" } else { "A" };
        proxy.write_config(&config(expected));
        let (code, body) = proxy.reload().await;
        assert_eq!(code, 200, "{body}");
        // Once the reload answered, every new request is served by the new config.
        let served_now = probe.get(proxy.url("/x")).send().await.unwrap();
        assert_eq!(
            served_now.text().await.unwrap(),
            expected,
            "after reload {i}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let bad = c.await.unwrap();
        assert!(bad.is_empty(), "{bad:?}");
    }
    assert_eq!(proxy.app.snapshot().version, 51);
    assert!(
        served.load(Ordering::Relaxed) > 100,
        "the clients really were hammering"
    );
}

#[tokio::test]
async fn a_request_in_flight_at_the_upstream_during_a_reload_completes() {
    let upstream = Upstream::start().await;
    let yaml = |limit: u32| {
        format!(
            "upstreams:\n  app: {{ url: \"{}\" }}\nlimiters:\n  l: {{ limit: {limit}, window: 60s }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, upstream: app, limiters: [l] }}\n",
            upstream.url()
        )
    };
    let proxy = Proxy::start_with_clock(&yaml(10), ManualClock::at(T0)).await;
    let url = proxy.url("/slow/3000");
    let in_flight =
        tokio::spawn(async move { client().get(url).send().await.unwrap().status().as_u16() });
    upstream.seen.wait_for_in_flight().await;
    proxy.write_config(&yaml(20));
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(
        proxy.app.snapshot().version,
        2,
        "the new config is in force"
    );
    assert_eq!(
        upstream.seen.in_flight.load(Ordering::SeqCst),
        1,
        "the request was still at the upstream when the swap happened"
    );
    assert_eq!(in_flight.await.unwrap(), 200);
}

#[tokio::test]
async fn a_lowered_limit_applies_to_the_current_count_and_a_new_window_starts_afresh() {
    let proxy = Proxy::start_with_clock(&ping_yaml(5), ManualClock::at(T0)).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    }
    proxy.write_config(&ping_yaml(2));
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(
        common::status(&c, &proxy.url("/ping"), &[]).await,
        429,
        "3 used of a new limit of 2"
    );
    proxy.write_config("limiters:\n  strict: { limit: 2, window: 120s }\nroutes:\n  - { name: ping, match: { path: /ping }, respond: { status: 200 }, limiters: [strict] }\n");
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(
        common::status(&c, &proxy.url("/ping"), &[]).await,
        200,
        "a changed window starts afresh"
    );
}

/// `ping` (limit `limit` a minute, on `strict`) and `/mark` behind a
/// 1-second `marker`, pruned every 100 ms. `strict` can be taken off the
/// ping route (`allow_unlimited`): the marker's key going at rest, then
/// away, shows that a prune round ran.
fn with_marker(limit: u32, strict: bool) -> String {
    let (limiter, route_limiters) = if strict {
        (
            format!("  strict: {{ limit: {limit}, window: 60s }}\n"),
            "strict",
        )
    } else {
        (String::new(), "")
    };
    format!(
        "store: {{ prune_interval: 100ms }}\nlimiters:\n{limiter}  marker: {{ limit: 1000, window: 1s }}\nroutes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [{route_limiters}], allow_unlimited: true }}\n  - {{ name: mark, match: {{ path: /mark }}, respond: {{ status: 200 }}, limiters: [marker] }}\n"
    )
}

/// Records a key on `marker`, moves the clock 3 s on (the marker's window
/// ends, `strict`'s minute does not) and waits until a prune round forgot it.
async fn wait_for_a_prune_round(proxy: &Proxy, clock: &ManualClock) {
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/mark"), &[]).await, 200);
    assert_eq!(proxy.app.shared.store.table().count_of("marker"), 1);
    clock.advance(Duration::from_secs(3));
    assert!(
        eventually(Duration::from_secs(5), || async {
            proxy.app.shared.store.table().count_of("marker") == 0
        })
        .await,
        "no prune round ran"
    );
}

#[tokio::test]
async fn a_limiter_removed_by_a_reload_and_restored_still_limits_the_exhausted_client() {
    let clock = ManualClock::at(T0);
    let proxy = Proxy::start_with_clock(&with_marker(2, true), clock.clone()).await;
    let c = client();
    let url = proxy.url("/ping");
    let ping = || common::status(&c, &url, &[]);
    assert_eq!([ping().await, ping().await, ping().await], [200, 200, 429]);
    // The bad edit: `strict` is gone, the route is unlimited.
    proxy.write_config(&with_marker(2, false));
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(ping().await, 200);
    wait_for_a_prune_round(&proxy, &clock).await;
    assert_eq!(proxy.app.shared.store.table().count_of("strict"), 1);
    // Its revert: the exhausted client is still exhausted.
    proxy.write_config(&with_marker(2, true));
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(ping().await, 429, "the restored limiter started afresh");
}

#[tokio::test]
async fn a_removed_limiter_keeps_its_state_for_its_grace_then_loses_it_in_memory_and_on_disk() {
    let clock = ManualClock::at(T0);
    let proxy = Proxy::start_with_clock(&with_marker(5, true), clock.clone()).await;
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    assert_eq!(proxy.app.shared.store.table().count_of("strict"), 1);
    proxy.write_config(&with_marker(5, false));
    assert_eq!(proxy.reload().await.0, 200);
    wait_for_a_prune_round(&proxy, &clock).await;
    assert_eq!(proxy.app.shared.store.table().count_of("strict"), 1);
    // Its grace (twice its 60 s window) ends: the next round forgets it.
    clock.advance(Duration::from_secs(121));
    assert!(
        eventually(Duration::from_secs(5), || async {
            proxy.app.shared.store.table().count_of("strict") == 0
        })
        .await,
        "strict's keys are still in memory"
    );
    proxy.app.shared.store.flush().unwrap();
    let conn = rusqlite::Connection::open(proxy.dir.path().join("tollgate.db")).unwrap();
    let rows: i64 = conn
        .query_row(
            "SELECT count(*) FROM rate_limit_windows WHERE key LIKE 'strict:%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn listeners_follow_the_config_without_a_restart() {
    let proxy = Proxy::start_with_clock(&ping_yaml(100), ManualClock::at(T0)).await;
    let extra = common::free_addr();
    let admin2 = common::free_addr();
    let db = proxy.dir.path().join("tollgate.db");
    let write = |listen: String, admin: std::net::SocketAddr| {
        std::fs::write(
            &proxy.config_path,
            format!("server: {{ listen: [{listen}] }}\nadmin: {{ listen: \"{admin}\" }}\nstore: {{ path: \"{}\" }}\n{}", db.display(), ping_yaml(100)),
        )
        .unwrap();
    };
    let c = client();
    write(format!("\"{}\", \"{extra}\"", proxy.addr), proxy.admin);
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(
        common::status(&c, &format!("http://{extra}/ping"), &[]).await,
        200,
        "the added listener serves"
    );
    assert_eq!(
        common::status(&c, &proxy.url("/ping"), &[]).await,
        200,
        "the old one still does"
    );

    write(format!("\"{}\"", proxy.addr), admin2);
    assert_eq!(proxy.reload().await.0, 200);
    let fresh = client();
    assert!(
        fresh
            .get(format!("http://{extra}/ping"))
            .send()
            .await
            .is_err(),
        "the removed listener is closed"
    );
    assert_eq!(
        common::status(&fresh, &format!("http://{admin2}/healthz"), &[]).await,
        200,
        "the admin API moved"
    );
    assert!(
        fresh.get(proxy.admin_url("/healthz")).send().await.is_err(),
        "the old admin address is closed"
    );
}

/// A proxy whose config names `keys` as `identity.api_keys_file`.
fn with_keys_file(keys: &std::path::Path) -> String {
    format!(
        "identity: {{ api_keys_file: \"{}\" }}\n{}",
        keys.display(),
        ping_yaml(5)
    )
}

/// `POST /reload`, failed if it takes longer than the reload deadline and a margin.
async fn reload_within_the_deadline(proxy: &Proxy) -> (u16, serde_json::Value) {
    let limit = tollgate::reload::RELOAD_DEADLINE + Duration::from_secs(5);
    tokio::time::timeout(limit, proxy.reload())
        .await
        .expect("the reload answered within its deadline")
}

#[tokio::test]
async fn a_fifo_as_the_api_keys_file_is_refused_at_once_and_the_next_good_reload_applies() {
    let proxy = Proxy::start(&ping_yaml(5)).await;
    let fifo = proxy.dir.path().join("keys.fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    proxy.write_config(&with_keys_file(&fifo));
    let (code, body) = reload_within_the_deadline(&proxy).await;
    assert_eq!(code, 422, "{body}");
    let errors = common::reload_errors(&body).join("\n");
    assert!(
        errors.contains("identity.api_keys_file") && errors.contains("FIFO"),
        "{errors}"
    );
    // The good file back: the next reload is not stuck behind the first.
    let keys = proxy.dir.path().join("keys");
    std::fs::write(&keys, "k-1\n").unwrap();
    proxy.write_config(&with_keys_file(&keys));
    let (code, body) = reload_within_the_deadline(&proxy).await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn dev_zero_as_the_api_keys_file_is_refused_without_reading_it() {
    let proxy = Proxy::start(&ping_yaml(5)).await;
    let before = common::rss_kib(std::process::id());
    proxy.write_config(&with_keys_file(std::path::Path::new("/dev/zero")));
    let (code, body) = reload_within_the_deadline(&proxy).await;
    assert_eq!(code, 422, "{body}");
    let errors = common::reload_errors(&body).join("\n");
    assert!(
        errors.contains("identity.api_keys_file: cannot read /dev/zero: it is a device"),
        "{errors}"
    );
    let grew = common::rss_kib(std::process::id()).saturating_sub(before);
    assert!(grew < 64 * 1024, "resident memory grew by {grew} KiB");
}

#[tokio::test]
async fn a_truncated_config_with_no_routes_is_refused_and_the_limits_stay() {
    let proxy = Proxy::start_with_clock(&ping_yaml(1), ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    proxy.write_config("limiters:\n  strict: { limit: 1, window: 60s }\n");
    let (code, body) = proxy.reload().await;
    assert_eq!(code, 422, "{body}");
    let errors = common::reload_errors(&body).join("\n");
    assert!(errors.contains("allow_no_routes"), "{errors}");
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 429);
    // Said on purpose, it applies.
    proxy.write_config("allow_no_routes: true\n");
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 404);
}

#[tokio::test]
async fn a_reload_that_takes_every_limiter_off_a_route_is_refused_unless_the_route_allows_it() {
    let proxy = Proxy::start_with_clock(&ping_yaml(1), ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    let unlimited = |allow: &str| {
        format!("routes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200 }}{allow} }}\n")
    };
    proxy.write_config(&unlimited(""));
    let (code, body) = proxy.reload().await;
    assert_eq!(code, 422, "{body}");
    let errors = common::reload_errors(&body).join("\n");
    assert!(
        errors.contains("routes.ping")
            && errors.contains("strict")
            && errors.contains("allow_unlimited"),
        "{errors}"
    );
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 429);
    proxy.write_config(&unlimited(", allow_unlimited: true"));
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
}
