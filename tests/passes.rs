//! Passes on the in-process app: how many one address block earns, the difficulty a pass carries, several pass cookies, and the pass cookie kept from the upstream.

mod common;

use std::path::Path;

use bytes::Bytes;
use common::app::{from, get, text, TokioClock};
use common::{Upstream, T0};
use http::{Request, StatusCode};
use sha2::{Digest, Sha256};
use tollgate::store::Store;
use tollgate::App;

const HTML: &str = "text/html,application/xhtml+xml,*/*;q=0.8";
const SECRET: &str = "0123456789abcdef0123456789abcdef-a-test-secret";

/// An app whose config has `identity.pass` (its secret file written in
/// `dir` and read as a start reads it) with `pass_extra` added, then `rest`.
fn app_with_passes(dir: &Path, pass_extra: &str, rest: &str) -> App {
    let keys = dir.join("pass.keys");
    std::fs::write(&keys, format!("{SECRET}\n")).unwrap();
    let yaml = format!(
        "store: {{ backend: memory }}\nlog: {{ access: false }}\nidentity:\n  pass: {{ secret_file: \"{}\"{pass_extra} }}\n{rest}",
        keys.display()
    );
    let path = dir.join("tollgate.yaml");
    std::fs::write(&path, yaml).unwrap();
    let (config, _) = tollgate::config::load_file_text(&path).unwrap_or_else(|e| panic!("{e}"));
    let store = Store::open(&config.store, &config.stored_limiters(), T0).expect("store");
    App::new(config, store, TokioClock::new(), None)
}

/// A browser's GET of `path` from `peer` with `cookies` (one `Cookie` header each).
async fn browse(
    app: &App,
    path: &str,
    peer: &str,
    cookies: &[&str],
) -> http::Response<tollgate::body::Body> {
    let mut headers = vec![("accept", HTML)];
    headers.extend(cookies.iter().map(|c| ("cookie", *c)));
    app.handle(get(path, &headers), from(peer)).await
}

/// The first nonce that gives the challenge its leading zero bits (its third field).
fn solve(challenge: &str) -> String {
    let bits: u32 = challenge.split('~').nth(2).unwrap().parse().unwrap();
    (0u64..)
        .map(|n| n.to_string())
        .find(|n| {
            let d = Sha256::new()
                .chain_update(challenge.as_bytes())
                .chain_update(n.as_bytes())
                .finalize();
            u32::from_be_bytes([d[0], d[1], d[2], d[3]]).leading_zeros() >= bits
        })
        .unwrap()
}

/// Gets the challenge page of `path` as a browser at `peer`, solves it and
/// posts the solution; the pass cookie (`tollgate_pass=…`).
async fn earn_pass(app: &App, path: &str, peer: &str) -> String {
    let page = text(browse(app, path, peer, &[]).await).await;
    let at = page.find("name=\"c\" value=\"").expect("a challenge page") + 16;
    let challenge = page[at..].split('"').next().unwrap().to_string();
    let form = format!(
        "c={}&n={}&r=%2F",
        challenge.replace('/', "%2F").replace(':', "%3A"),
        solve(&challenge)
    );
    let post = Request::post("/.well-known/tollgate/pass")
        .header("host", "shop.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Bytes::from(form))
        .unwrap();
    let answer = app.handle(post, from(peer)).await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let set = answer.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

/// The id field of a pass cookie (`-` for one that counts as its address).
fn id_of(cookie: &str) -> &str {
    cookie.split('~').nth(1).unwrap()
}

const PER_PASS: &str = "limiters:
  per: { algorithm: fixed_window, limit: 3, window: 60s, key: pass }
routes:
  - { name: all, match: { path_prefix: / }, respond: { status: 200 }, challenge: { when: always, difficulty: 1 }, limiters: [per] }
";

#[tokio::test(start_paused = true)]
async fn twenty_passes_from_one_address_get_no_more_than_five_times_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_passes(dir.path(), "", PER_PASS);
    let peer = "203.0.113.9:40000";
    let mut cookies = Vec::new();
    for _ in 0..20 {
        cookies.push(earn_pass(&app, "/", peer).await);
    }
    let fresh = cookies.iter().filter(|c| id_of(c) != "-").count();
    assert_eq!(fresh, 2, "the block's allowance is 2 new passes per ttl");
    let mut admitted = 0;
    for cookie in &cookies {
        for _ in 0..3 {
            let resp = browse(&app, "/", peer, &[cookie]).await;
            admitted += usize::from(resp.status() == StatusCode::OK);
        }
    }
    // Two passes of their own (3 each), and the address's own 3 for the rest.
    assert_eq!(admitted, 9, "60 requests on 20 passes");
    assert!(
        admitted <= 5 * 3,
        "the documented bound: 5 times the address's quota"
    );
    let refused = app
        .shared
        .metrics
        .counter("tollgate_pass_issue_refused_total", &[])
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(refused, 18);
    // Another block has its own allowance; this one's comes back after a ttl.
    assert_ne!(
        id_of(&earn_pass(&app, "/", "198.51.100.7:40000").await),
        "-"
    );
    tokio::time::advance(std::time::Duration::from_secs(7 * 86_400)).await;
    assert_ne!(id_of(&earn_pass(&app, "/", peer).await), "-");
}

#[tokio::test(start_paused = true)]
async fn the_issue_limit_is_configurable_per_address_block() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_passes(dir.path(), ", issue_limit: 3, ipv4_prefix: 32", PER_PASS);
    let ids = |cookies: &[String]| cookies.iter().filter(|c| id_of(c) != "-").count();
    let mut one = Vec::new();
    for _ in 0..5 {
        one.push(earn_pass(&app, "/", "203.0.113.9:40000").await);
    }
    assert_eq!(ids(&one), 3);
    // With /32 blocks, the neighbour's allowance is its own.
    let neighbour = earn_pass(&app, "/", "203.0.113.10:40000").await;
    assert_ne!(id_of(&neighbour), "-");
}

#[tokio::test(start_paused = true)]
async fn a_pass_solved_at_a_lower_difficulty_does_not_open_a_harder_route() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_passes(
        dir.path(),
        "",
        "routes:
  - { name: easy, match: { path_prefix: /easy }, respond: { status: 200 }, challenge: { when: always, difficulty: 2 } }
  - { name: hard, match: { path_prefix: /hard }, respond: { status: 200 }, challenge: { when: always, difficulty: 10 } }
",
    );
    let peer = "203.0.113.9:40000";
    let easy = earn_pass(&app, "/easy", peer).await;
    assert_eq!(
        browse(&app, "/easy", peer, &[&easy]).await.status(),
        StatusCode::OK
    );
    let hard = browse(&app, "/hard", peer, &[&easy]).await;
    assert_eq!(
        hard.status(),
        StatusCode::FORBIDDEN,
        "an 8-bit pass opens no 24-bit route"
    );
    assert!(
        text(hard).await.contains("name=\"c\""),
        "the harder challenge instead"
    );
    // A pass earned on the harder route opens both.
    let strong = earn_pass(&app, "/hard", peer).await;
    assert_eq!(
        browse(&app, "/hard", peer, &[&strong]).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        browse(&app, "/easy", peer, &[&strong]).await.status(),
        StatusCode::OK
    );
}

const ALWAYS: &str = "routes:
  - { name: all, match: { path_prefix: / }, respond: { status: 200 }, challenge: { when: always, difficulty: 1 } }
";

#[tokio::test(start_paused = true)]
async fn a_bad_pass_cookie_before_the_good_one_does_not_keep_the_browser_challenged() {
    let dir = tempfile::tempdir().unwrap();
    let app = app_with_passes(dir.path(), "", ALWAYS);
    let peer = "203.0.113.9:40000";
    let good = earn_pass(&app, "/", peer).await;
    let planted = "tollgate_pass=planted~by~a~sibling~site";
    let one_header = format!("{planted}; {good}");
    let resp = browse(&app, "/", peer, &[&one_header]).await;
    assert_eq!(resp.status(), StatusCode::OK, "one Cookie header");
    let resp = browse(&app, "/", peer, &[planted, &good]).await;
    assert_eq!(resp.status(), StatusCode::OK, "two Cookie headers (HTTP/2)");
    // Only bad ones: the challenge.
    let resp = browse(&app, "/", peer, &[planted]).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

#[tokio::test(start_paused = true)]
async fn the_pass_cookie_never_reaches_the_upstream_and_every_other_cookie_does() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let routes = format!(
        "upstreams:\n  app: {{ url: \"{}\", connect_timeout: 1h, timeout: 1h }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app, challenge: {{ when: always, difficulty: 1 }} }}\n",
        upstream.url()
    );
    let app = app_with_passes(dir.path(), "", &routes);
    let peer = "203.0.113.9:40000";
    let pass = earn_pass(&app, "/", peer).await;
    let mixed = format!("a=1; {pass}; b=2");
    let resp = browse(&app, "/", peer, &[&mixed, "c=3"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = upstream.seen.last_headers.lock().clone().unwrap();
    let cookies: Vec<&str> = seen
        .get_all("cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(cookies.join("; "), "a=1; b=2; c=3");
    // A request whose only cookie is the pass reaches it with none.
    let resp = browse(&app, "/", peer, &[&pass]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let seen = upstream.seen.last_headers.lock().clone().unwrap();
    assert!(seen.get("cookie").is_none(), "{seen:?}");
}
