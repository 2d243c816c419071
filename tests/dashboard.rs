//! The admin dashboard in a real headless Chromium: chart, limited keys, bans, upstream health, reloads, token, screenshot.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::redis_cluster::Cluster;
use common::{browser, client, free_addr, Proxy, Upstream};
use tollgate::clock::SystemClock;

const TOKEN: &str = "dash-token";

const YAML: &str = "
admin: { token: dash-token }
limiters:
  strict: { limit: 3, window: 1d }
  global: { limit: 100000, window: 1d }
routes:
  - name: ping
    match: { path: /ping }
    respond: { status: 200, body: \"pong\\n\" }
    limiters: [strict]
  - name: hello
    match: { path_prefix: / }
    respond: { status: 200, body: \"hello\\n\" }
    limiters: [global]
";

/// Where the CI keeps the screenshot (printed by .ci/test).
fn screenshot_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard/dashboard.png")
}

async fn dashboard_json(c: &reqwest::Client, proxy: &Proxy) -> serde_json::Value {
    let r = c
        .get(proxy.admin_url("/dashboard.json"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    serde_json::from_str(&r.text().await.unwrap()).unwrap()
}

/// Some traffic until the dashboard has a few samples with a rate in them
/// and the limited key; returns the last data it saw.
async fn traffic_until_charted(c: &reqwest::Client, proxy: &Proxy) -> serde_json::Value {
    let last = std::cell::RefCell::new(serde_json::Value::Null);
    let charted = common::eventually(Duration::from_secs(30), || async {
        for _ in 0..5 {
            common::status(c, &proxy.url("/ping"), &[]).await;
            common::status(c, &proxy.url("/hello"), &[]).await;
        }
        let d = dashboard_json(c, proxy).await;
        let charted = d["times"].as_array().is_some_and(|t| t.len() >= 3)
            && d["routes"].as_array().unwrap().iter().any(|r| {
                r["name"] == "ping"
                    && r["rejections_per_second"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|v| v.as_f64().unwrap() > 0.0)
            });
        let limited = !d["limited"].as_array().unwrap().is_empty();
        *last.borrow_mut() = d;
        charted && limited
    })
    .await;
    let last = last.into_inner();
    assert!(charted, "no chart data after 30 s: {last}");
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_the_chart_and_the_limited_key_in_a_real_browser() {
    let proxy = Proxy::start(YAML).await;
    let c = client();
    let data = traffic_until_charted(&c, &proxy).await;
    let key = data["limited"][0]["key"].as_str().unwrap().to_string();
    assert_eq!(key, "ip:127.0.0.1");
    assert_eq!(data["limited"][0]["limiter"], "strict");

    let url = format!("http://{}/#token={TOKEN}", proxy.admin);
    let dom = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || browser::run(&url, &["--dump-dom"], 5_000))
            .await
            .unwrap()
    };
    // The chart: one solid and one dashed line per route, with a point per sample.
    for class in ["requests", "rejections"] {
        let line = dom
            .split("<polyline")
            .skip(1)
            .find(|l| {
                l.contains(&format!("class=\"{class}\"")) && l.contains("data-route=\"ping\"")
            })
            .unwrap_or_else(|| panic!("no {class} line for ping in:\n{dom}"));
        let points = line
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(points.split(' ').count() >= 2, "{points}");
    }
    // The limited key, in a row of the table, with its limiter.
    let row = dom
        .split("<tr class=\"limited-key\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no limited key row in:\n{dom}"));
    assert!(
        row.contains(&format!("<td>{key}</td>")) && row.contains("<td>strict</td>"),
        "{row}"
    );
    assert!(dom.contains(">serving<"), "status pill: {dom}");
    assert!(
        dom.contains("<form id=\"login\" hidden"),
        "no token form once in: {dom}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_the_page_shows_no_data_and_asks_for_it() {
    let proxy = Proxy::start(YAML).await;
    let c = client();
    for _ in 0..5 {
        common::status(&c, &proxy.url("/ping"), &[]).await;
    }
    // The data needs the token; the page itself holds none.
    let r = c
        .get(proxy.admin_url("/dashboard.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .get(proxy.admin_url("/dashboard.json"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let page = c.get(proxy.admin_url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!page.text().await.unwrap().contains("127.0.0.1"));

    let url = format!("http://{}/", proxy.admin);
    let dom = tokio::task::spawn_blocking(move || browser::run(&url, &["--dump-dom"], 3_000))
        .await
        .unwrap();
    assert!(
        dom.contains("<form id=\"login\">"),
        "the token form shows:\n{dom}"
    );
    assert!(
        dom.contains("<main id=\"main\" hidden"),
        "no data shows:\n{dom}"
    );
    assert!(!dom.contains("ip:127.0.0.1"), "{dom}");
    assert!(dom.contains(">token needed<"), "{dom}");
}

/// The page as Chromium has it after `budget_ms` of the page's own time.
async fn dom_of(proxy: &Proxy, budget_ms: u32) -> String {
    let url = format!("http://{}/#token={TOKEN}", proxy.admin);
    tokio::task::spawn_blocking(move || browser::run(&url, &["--dump-dom"], budget_ms))
        .await
        .unwrap()
}

/// The `<tr>` of `class` (and more attributes) whose cells hold `cell`.
fn row_with<'d>(dom: &'d str, class: &str, cell: &str) -> &'d str {
    dom.split(&format!("<tr class=\"{class}\""))
        .skip(1)
        .map(|r| r.split("</tr>").next().unwrap())
        .find(|r| r.contains(&format!("<td>{cell}</td>")))
        .unwrap_or_else(|| panic!("no {class} row with {cell} in:\n{dom}"))
}

/// Upstream `app` on `up` and the `dead` server (out for an hour once
/// down); `/login` bans at its first refusal.
fn ban_and_dead_server_yaml(up: &Upstream, dead: &str) -> String {
    format!(
        "
admin: {{ token: {TOKEN} }}
upstreams:
  app: {{ servers: [\"{}\", \"{dead}\"], fail_timeout: 1h }}
limiters:
  strict: {{ limit: 3, window: 1d }}
  global: {{ limit: 100000, window: 1d }}
  guard: {{ limit: 1, window: 1d, ban: {{ after: 1, for: 1h }} }}
routes:
  - {{ name: login, match: {{ path: /login }}, respond: {{ status: 200, body: welcome }}, limiters: [guard] }}
  - {{ name: app, match: {{ path_prefix: /app }}, upstream: app }}
  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [strict] }}
  - {{ name: hello, match: {{ path_prefix: / }}, respond: {{ status: 200, body: hello }}, limiters: [global] }}
",
        up.url()
    )
}

/// Sends `/app` until the dead server has been met and marked down.
async fn wait_dead_server_down(c: &reqwest::Client, proxy: &Proxy) {
    let down = common::eventually(Duration::from_secs(10), || async {
        common::status(c, &proxy.url("/app"), &[]).await;
        let u = get_json_auth(c, proxy, "/upstreams").await;
        u["upstreams"][0]["servers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["state"] == "down")
    })
    .await;
    assert!(down, "the dead server is never marked down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_ban_and_a_down_upstream_in_a_real_browser() {
    let up = Upstream::start().await;
    let dead = format!("http://{}", free_addr());
    let proxy = Proxy::start(&ban_and_dead_server_yaml(&up, &dead)).await;
    let c = client();
    // A request that meets the dead server takes it out (passive health) and is retried on the live one.
    wait_dead_server_down(&c, &proxy).await;
    // Allowed, refused (the strike that bans), banned.
    for _ in 0..3 {
        common::status(&c, &proxy.url("/login"), &[]).await;
    }
    traffic_until_charted(&c, &proxy).await;

    let dom = dom_of(&proxy, 5_000).await;
    let ban = row_with(&dom, "ban", "guard:ip:127.0.0.1");
    assert!(ban.contains("<td>guard</td>"), "{ban}");
    assert!(
        ban.contains("<button type=\"button\" class=\"lift\">Lift</button>"),
        "{ban}"
    );
    let left = ban.split("<td class=\"num left\">").nth(1).unwrap();
    assert!(
        left.starts_with("59m ") || left.starts_with("1h 0m"),
        "time left: {ban}"
    );
    assert!(
        dom.contains("<span id=\"banned\" class=\"value bad\">1</span>"),
        "{dom}"
    );
    // Servers are shown as URLs, with their path.
    let server = row_with(
        &dom,
        "upstream-server\" data-state=\"down",
        &format!("{dead}/"),
    );
    assert!(
        server.contains("<td class=\"state bad\">down</td>"),
        "{server}"
    );
    assert!(server.contains("<td>app</td>"), "{server}");
    row_with(
        &dom,
        "upstream-server\" data-state=\"up",
        &format!("{}/", up.url()),
    );
    assert!(dom.contains(">upstream down<"), "status pill: {dom}");
    let app = row_with(&dom, "route-health", "app");
    assert!(app.matches(" ms</td>").count() == 2, "p50 and p99: {app}");

    let shot = screenshot_path();
    {
        let url = format!("http://{}/#token={TOKEN}", proxy.admin);
        let shot = shot.clone();
        tokio::task::spawn_blocking(move || browser::screenshot(&url, &shot, (1000, 1080), 5_000))
            .await
            .unwrap();
    }
    println!("dashboard screenshot: {}", shot.display());
}

async fn get_json_auth(c: &reqwest::Client, proxy: &Proxy, path: &str) -> serde_json::Value {
    let r = c
        .get(proxy.admin_url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    serde_json::from_str(&r.text().await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_reload_shows_its_time_and_its_banner_clears_once_the_file_is_fixed() {
    let proxy = Proxy::start_in(
        YAML,
        Arc::new(SystemClock),
        tempfile::tempdir().unwrap(),
        Some(Duration::from_millis(100)),
    )
    .await;
    let c = client();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // An edit naming a limiter that does not exist: rejected, the old config serves.
    proxy.write_config(&YAML.replace("limiters: [strict]", "limiters: [missing]"));
    let last = std::cell::RefCell::new(serde_json::Value::Null);
    let rejected = common::eventually(Duration::from_secs(10), || async {
        let d = dashboard_json(&c, &proxy).await;
        let seen = d["last_reload"]["result"] == "error" && d["last_reload_error"].is_string();
        *last.borrow_mut() = d;
        seen
    })
    .await;
    assert!(rejected, "no rejected reload: {}", last.borrow());
    let at = last.borrow()["last_reload"]["at"].as_u64().unwrap();
    assert!(at >= started, "{at} < {started}");
    let dom = dom_of(&proxy, 3_000).await;
    assert!(
        dom.contains("<section id=\"reload-error\" class=\"error\">"),
        "{dom}"
    );
    assert!(dom.contains("missing"), "the error shows: {dom}");

    // The file put back as it was: the banner goes, the reload that cleared it shows.
    proxy.write_config(YAML);
    let cleared = common::eventually(Duration::from_secs(10), || async {
        let d = dashboard_json(&c, &proxy).await;
        let seen = d["last_reload"]["result"] == "ok" && d["last_reload_error"].is_null();
        *last.borrow_mut() = d;
        seen
    })
    .await;
    assert!(
        cleared,
        "the rejected reload's error stays: {}",
        last.borrow()
    );
    let dom = dom_of(&proxy, 3_000).await;
    assert!(
        dom.contains("<section id=\"reload-error\" class=\"error\" hidden"),
        "{dom}"
    );
    assert!(
        dom.contains("<span id=\"reload\" class=\"value\">applied "),
        "{dom}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_flags_a_certificate_whose_order_fails_in_a_real_browser() {
    let storage = tempfile::tempdir().unwrap();
    // An ACME CA where nothing listens: every order of shop.test fails.
    let proxy = Proxy::start(&format!(
        "
admin: {{ token: {TOKEN} }}
server:
  tls:
    listen: [\"127.0.0.1:0\"]
    acme: {{ directory: \"https://{}/dir\", domains: [shop.test], storage: \"{}\" }}
routes:
  - {{ name: hello, match: {{ path_prefix: / }}, respond: {{ status: 200, body: hello }} }}
",
        free_addr(),
        storage.path().display()
    ))
    .await;
    let c = client();
    let mut last = serde_json::Value::Null;
    for _ in 0..50 {
        last = dashboard_json(&c, &proxy).await["certificates"][0].clone();
        if last["attention"] == "renewal_failing" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(last["attention"], "renewal_failing", "{last}");
    assert_eq!(last["domain"], "shop.test");
    assert!(
        last["last_error"].as_str().unwrap().contains("ACME CA"),
        "{last}"
    );

    let dom = dom_of(&proxy, 3_000).await;
    let row = row_with(
        &dom,
        "certificate\" data-attention=\"renewal_failing",
        "shop.test",
    );
    assert!(
        row.contains("<td class=\"state bad\">renewal failing</td>"),
        "{row}"
    );
    assert!(row.contains("<td>none yet</td>"), "no certificate: {row}");
    assert!(
        dom.contains(">certificate needs attention<"),
        "status pill: {dom}"
    );
}

/// A Redis Cluster's nodes on the store tile, and a node that goes down
/// flagged on the tile and the status pill, in a real browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_clusters_nodes_and_flags_one_that_goes_down_in_a_real_browser() {
    let mut cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let proxy = Proxy::start(&format!(
        "
admin: {{ token: {TOKEN} }}
store: {{ backend: redis, cluster: [\"{}\"], on_error: local }}
limiters:
  per_ip: {{ limit: 100000, window: 1d, key: ip }}
routes:
  - {{ name: hello, match: {{ path_prefix: / }}, respond: {{ status: 200, body: hello }}, limiters: [per_ip] }}
",
        cluster.nodes[0].url()
    ))
    .await;
    let c = client();
    let nodes_up = |d: &serde_json::Value| {
        let nodes = d["store"]["nodes"].as_array().cloned().unwrap_or_default();
        let up = nodes.iter().filter(|n| n["healthy"] == true).count();
        (up, nodes.len())
    };
    let all_up = common::eventually(Duration::from_secs(10), || async {
        nodes_up(&dashboard_json(&c, &proxy).await) == (6, 6)
    })
    .await;
    assert!(all_up, "{}", dashboard_json(&c, &proxy).await);
    let dom = dom_of(&proxy, 3_000).await;
    assert!(
        dom.contains(">redis · healthy · cluster 6/6 nodes up</span>"),
        "{dom}"
    );
    assert!(dom.contains(">serving<"), "status pill: {dom}");

    // A replica goes away: no failover, every slot still served.
    let primary = cluster.primaries()[0];
    let replica = cluster.replica_of(primary);
    cluster.node_mut(replica).kill();
    let seen = common::eventually(Duration::from_secs(30), || async {
        nodes_up(&dashboard_json(&c, &proxy).await) == (5, 6)
    })
    .await;
    assert!(seen, "{}", dashboard_json(&c, &proxy).await);
    let dom = dom_of(&proxy, 3_000).await;
    assert!(
        dom.contains("<span id=\"store\" class=\"value bad\"")
            && dom.contains(">redis · healthy · cluster 5/6 nodes up</span>"),
        "{dom}"
    );
    assert!(
        dom.contains(&format!("replica 127.0.0.1:{replica} down")),
        "the tile's title names the node: {dom}"
    );
    assert!(dom.contains(">store node down<"), "status pill: {dom}");
}
