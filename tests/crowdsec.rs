//! CrowdSec both ways against a real Local API (Debian's `crowdsec`, started per test): decisions added and deleted with `cscli` are followed within the poll interval (`Ip` and `Range`, IPv4 and IPv6, ban and captcha), tollgate's own ban shows in `cscli decisions list`, and the API killed mid-traffic blocks no request.

mod common;

use std::time::{Duration, Instant};

use common::crowdsec::{Lapi, MACHINE};
use common::{client, eventually, get_json, Proxy};

/// 127.0.0.1 is a trusted proxy, so a test speaks for any client through `X-Forwarded-For`.
fn yaml(lapi: &Lapi, extra: &str) -> String {
    let (key, password) = lapi.secret_files();
    let pass_keys = lapi.dir.path().join("pass.keys");
    std::fs::write(&pass_keys, "k1 0123456789abcdef0123456789abcdef01234567\n").unwrap();
    format!(
        "log: {{ format: json }}\nidentity:\n  trusted_proxies: [127.0.0.1]\n  pass: {{ secret_file: {} }}\n  crowdsec:\n    url: {}\n    api_key_file: {}\n    poll_every: 100ms\n    push: {{ machine_id: {MACHINE}, password_file: {} }}\n{extra}routes:\n  - {{ name: site, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }}{} }}\n",
        pass_keys.display(),
        lapi.url(),
        key.display(),
        password.display(),
        if extra.is_empty() { "" } else { ", limiters: [login]" },
    )
}

async fn status(proxy: &Proxy, ip: &str, accept: &str) -> u16 {
    let r = client()
        .get(proxy.url("/"))
        .header("x-forwarded-for", ip)
        .header("accept", accept)
        .send()
        .await
        .unwrap();
    r.status().as_u16()
}

/// Waits (at most 10 s: the poll is every 100 ms) until `ip` gets `want`.
async fn becomes(proxy: &Proxy, ip: &str, want: u16) -> bool {
    eventually(Duration::from_secs(10), || async {
        status(proxy, ip, "*/*").await == want
    })
    .await
}

#[tokio::test]
async fn decisions_added_and_deleted_with_cscli_are_followed() {
    let lapi = Lapi::start();
    let proxy = Proxy::start(&yaml(&lapi, "")).await;
    assert_eq!(status(&proxy, "203.0.113.7", "*/*").await, 200);
    lapi.cscli(&[
        "decisions",
        "add",
        "--ip",
        "203.0.113.7",
        "--duration",
        "1h",
    ]);
    lapi.cscli(&[
        "decisions",
        "add",
        "--ip",
        "2001:db8::5",
        "--duration",
        "1h",
    ]);
    lapi.cscli(&[
        "decisions",
        "add",
        "--range",
        "2001:db8:1::/48",
        "--duration",
        "1h",
    ]);
    assert!(
        becomes(&proxy, "203.0.113.7", 403).await,
        "the ban never applied"
    );
    assert_eq!(
        status(&proxy, "203.0.113.8", "*/*").await,
        200,
        "only the banned address"
    );
    assert_eq!(status(&proxy, "2001:db8::5", "*/*").await, 403);
    assert_eq!(
        status(&proxy, "2001:db8:1:ffff::9", "*/*").await,
        403,
        "inside the range"
    );
    // `becomes` asked as often as the ban took to apply: the 403's record is
    // waited for by what it is, not by how many came before it.
    let refused = proxy
        .access
        .wait_record(|r| r["status"] == 403)
        .await
        .expect("a refusal logged");
    assert_eq!(refused["decision"], "crowdsec", "{refused}");
    lapi.cscli(&["decisions", "delete", "--ip", "203.0.113.7"]);
    assert!(
        becomes(&proxy, "203.0.113.7", 200).await,
        "the deletion never applied"
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tollgate_crowdsec_applied_total{type=\"ban\"}"),
        "{metrics}"
    );
    assert_eq!(
        common::metric(&metrics, "tollgate_crowdsec_decisions_held"),
        Some(2.0)
    );
}

#[tokio::test]
async fn a_captcha_decision_gets_the_challenge_page_and_a_solved_one_lets_through() {
    let lapi = Lapi::start();
    let proxy = Proxy::start(&yaml(&lapi, "")).await;
    lapi.cscli(&[
        "decisions",
        "add",
        "--range",
        "198.51.100.0/24",
        "--type",
        "captcha",
        "--duration",
        "1h",
    ]);
    assert!(
        becomes(&proxy, "198.51.100.9", 403).await,
        "a client that cannot solve it is refused"
    );
    let page = browse(&proxy, "198.51.100.9", None).await;
    assert_eq!(page.status, 403);
    let at = page
        .body
        .find("name=\"c\" value=\"")
        .expect("the proof-of-work page")
        + 16;
    let challenge = page.body[at..].split('"').next().unwrap().to_string();
    let form = format!(
        "c={}&n={}&r=%2F&ms=1&via=js",
        challenge.replace('/', "%2F"),
        solve(&challenge)
    );
    let granted = common::send(
        client()
            .post(proxy.url("/.well-known/tollgate/pass"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-forwarded-for", "198.51.100.9")
            .body(form),
    )
    .await;
    assert_eq!(granted.status, 303, "{}", granted.body);
    let cookie = granted.headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        browse(&proxy, "198.51.100.9", Some(&cookie)).await.status,
        200
    );
    assert_eq!(
        browse(&proxy, "198.51.101.9", None).await.status,
        200,
        "outside the range"
    );
}

#[tokio::test]
async fn a_pass_of_the_no_javascript_tier_does_not_answer_a_captcha() {
    let lapi = Lapi::start();
    let easy = "routes:\n  - { name: easy, match: { path_prefix: /easy/ }, respond: { status: 200, body: easy }, challenge: { mode: metarefresh, when: always } }\n";
    let proxy = Proxy::start(&yaml(&lapi, "").replacen("routes:\n", easy, 1)).await;
    let ip = "198.51.100.9";
    let page = browse_path(&proxy, "/easy/", ip, None).await;
    let at = page.body.find("url=").expect("the refresh page") + 4;
    let url = page.body[at..]
        .split('"')
        .next()
        .unwrap()
        .replace("&amp;", "&");
    let granted = browse_path(&proxy, &url, ip, None).await;
    assert_eq!(granted.status, 303, "{}", granted.body);
    let set = granted.headers["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap().to_string();
    assert_eq!(
        browse_path(&proxy, "/easy/", ip, Some(&cookie))
            .await
            .status,
        200
    );
    lapi.cscli(&[
        "decisions",
        "add",
        "--ip",
        ip,
        "--type",
        "captcha",
        "--duration",
        "1h",
    ]);
    assert!(becomes(&proxy, ip, 403).await);
    for path in ["/easy/", "/"] {
        let answer = browse_path(&proxy, path, ip, Some(&cookie)).await;
        assert_eq!(answer.status, 403, "{path}");
        assert!(
            answer.body.contains("name=\"c\""),
            "the proof of work: {}",
            answer.body
        );
    }
}

async fn browse(proxy: &Proxy, ip: &str, cookie: Option<&str>) -> common::Answer {
    browse_path(proxy, "/", ip, cookie).await
}

async fn browse_path(proxy: &Proxy, path: &str, ip: &str, cookie: Option<&str>) -> common::Answer {
    let mut req = client()
        .get(proxy.url(path))
        .header("accept", "text/html")
        .header("x-forwarded-for", ip);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    common::send(req).await
}

/// The first nonce whose SHA-256 with the challenge has its difficulty's zero bits.
fn solve(challenge: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let bits: u32 = challenge.split('~').nth(2).unwrap().parse().unwrap();
    (0u64..)
        .find(|n| {
            let d = Sha256::new()
                .chain_update(challenge)
                .chain_update(n.to_string())
                .finalize();
            u32::from_be_bytes([d[0], d[1], d[2], d[3]]).leading_zeros() >= bits
        })
        .unwrap()
}

#[tokio::test]
async fn tollgates_own_ban_is_pushed_to_the_local_api() {
    let lapi = Lapi::start();
    let login =
        "limiters:\n  login: { limit: 1, window: 60s, key: ip, ban: { after: 1, for: 1h } }\n";
    let proxy = Proxy::start(&yaml(&lapi, login)).await;
    let codes: Vec<u16> =
        futures_util::future::join_all((0..3).map(|_| status(&proxy, "192.0.2.77", "*/*"))).await;
    assert!(codes.contains(&429), "{codes:?}");
    let pushed = eventually(Duration::from_secs(10), || async {
        lapi.decision_values().iter().any(|v| v == "192.0.2.77")
    })
    .await;
    assert!(pushed, "cscli decisions list: {:?}", lapi.decision_values());
    let list = lapi.cscli(&["decisions", "list"]);
    assert!(list.contains("tollgate/login"), "{list}");
    let ok = proxy
        .metric("tollgate_crowdsec_bans_pushed_total{result=\"ok\"}")
        .await;
    assert_eq!(ok, Some(1.0));
}

#[tokio::test]
async fn the_local_api_killed_mid_traffic_blocks_no_request() {
    let mut lapi = Lapi::start();
    let proxy = Proxy::start(&yaml(&lapi, "")).await;
    lapi.cscli(&[
        "decisions",
        "add",
        "--ip",
        "203.0.113.66",
        "--duration",
        "1h",
    ]);
    assert!(becomes(&proxy, "203.0.113.66", 403).await);
    lapi.kill();
    let down = eventually(Duration::from_secs(10), || async {
        proxy.metric("tollgate_crowdsec_up").await == Some(0.0)
    })
    .await;
    assert!(down, "the outage was never noticed");
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(status(&proxy, "203.0.113.67", "*/*").await, 200);
        assert_eq!(
            status(&proxy, "203.0.113.66", "*/*").await,
            403,
            "a held decision still applies"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a request waited on the API"
        );
    }
    let dashboard = get_json(&client(), &proxy.admin_url("/dashboard.json")).await;
    assert_eq!(dashboard["crowdsec"]["up"], false, "{dashboard}");
    lapi.restart();
    let back = eventually(Duration::from_secs(10), || async {
        proxy.metric("tollgate_crowdsec_up").await == Some(1.0)
    })
    .await;
    assert!(back, "the API came back unnoticed");
}
