//! The admin dashboard in a real headless Chromium: chart, limited keys, token, screenshot.

mod common;

use std::time::Duration;

use common::{browser, client, Proxy};

const TOKEN: &str = "dash-token";

const YAML: &str = "
admin: { token: dash-token }
limiters:
  strict: { limit: 3, window: 60s }
  global: { limit: 100000, window: 60s }
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

    let shot = screenshot_path();
    {
        let (url, shot) = (url.clone(), shot.clone());
        tokio::task::spawn_blocking(move || browser::screenshot(&url, &shot, (1100, 1000), 5_000))
            .await
            .unwrap();
    }
    println!("dashboard screenshot: {}", shot.display());
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
