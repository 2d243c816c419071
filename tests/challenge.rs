//! Browsers pass, scraper fleets don't: the proof-of-work challenge in real Chromium, the pass as an identity, and every way a solution or a pass is refused.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cdp::Browser;
use common::{client, metric, send, Proxy, Upstream, T0};
use sha2::{Digest, Sha256};
use tollgate::clock::ManualClock;

const OLD: &str = "0123456789abcdef0123456789abcdef-the-old-secret";
const NEW: &str = "fedcba9876543210fedcba9876543210-the-new-secret";
const HTML: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

fn secret_file(dir: &Path, secrets: &[&str]) -> PathBuf {
    let path = dir.join("pass.keys");
    std::fs::write(&path, secrets.join("\n") + "\n").unwrap();
    path
}

/// One upstream route with `challenge` (`when`, `difficulty` written as
/// given) and a limiter `per` of `limit` requests a minute keyed on `key`;
/// 127.0.0.1 is a trusted proxy, so tests pick client addresses with X-Forwarded-For.
fn yaml(keys: &Path, upstream: &Upstream, challenge: &str, key: &str, limit: u32) -> String {
    format!(
        r#"
store: {{ backend: memory }}
log: {{ format: json }}
identity:
  trusted_proxies: [127.0.0.1/32]
  api_keys: [partner-key]
  pass: {{ secret_file: "{}" }}
upstreams: {{ app: {{ url: "{}" }} }}
limiters:
  per: {{ limit: {limit}, window: 1m, key: {key} }}
routes:
  - name: wiki
    match: {{ path_prefix: / }}
    upstream: app
    challenge: {challenge}
    limiters: [per]
"#,
        keys.display(),
        upstream.url()
    )
}

/// The challenge a page carries (its `c` field).
fn challenge_of(page: &str) -> String {
    let at = page.find("name=\"c\" value=\"").expect("a challenge field") + 16;
    page[at..].split('"').next().unwrap().to_string()
}

/// The difficulty a challenge asks for (its third field).
fn bits_of(challenge: &str) -> u32 {
    challenge.split('~').nth(2).unwrap().parse().unwrap()
}

/// What the page's worker does: the first nonce that gives enough zero bits.
fn solve(challenge: &str) -> String {
    (0u64..)
        .map(|n| n.to_string())
        .find(|n| solves(challenge, n))
        .unwrap()
}

/// Whether `nonce` meets `challenge`'s difficulty: the page's own test.
fn solves(challenge: &str, nonce: &str) -> bool {
    let d = Sha256::new()
        .chain_update(challenge.as_bytes())
        .chain_update(nonce.as_bytes())
        .finalize();
    let word = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
    word.leading_zeros() >= bits_of(challenge)
}

/// A browser-looking GET from `ip` (through the trusted proxy) with `cookie`.
async fn browse(proxy: &Proxy, path: &str, ip: &str, cookie: Option<&str>) -> common::Answer {
    let mut req = client()
        .get(proxy.url(path))
        .header("accept", HTML)
        .header("x-forwarded-for", ip);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    send(req).await
}

/// Posts a solution from `ip`; the answer.
async fn post(proxy: &Proxy, challenge: &str, nonce: &str, back: &str, ip: &str) -> common::Answer {
    let form = format!(
        "c={}&n={nonce}&r={}&ms=250&via=js",
        challenge.replace('/', "%2F"),
        back.replace('/', "%2F")
            .replace('?', "%3F")
            .replace('=', "%3D")
    );
    send(
        client()
            .post(proxy.url("/.well-known/tollgate/pass"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-forwarded-for", ip)
            .body(form),
    )
    .await
}

/// Gets a challenge as a browser at `ip`, solves it, and returns the pass cookie (`name=value`).
async fn pass_for(proxy: &Proxy, ip: &str) -> String {
    let page = browse(proxy, "/wiki/Main_Page", ip, None).await;
    assert_eq!(page.status, 403, "{}", page.body);
    let c = challenge_of(&page.body);
    let answer = post(proxy, &c, &solve(&c), "/wiki/Main_Page", ip).await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    let set = answer.headers["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

async fn count(proxy: &Proxy, series: &str) -> f64 {
    proxy.metric(series).await.unwrap_or(-1.0)
}

// ---- real Chromium -------------------------------------------------------

/// Opens `origin` + a page in Chromium, waits until the upstream's answer
/// shows, and returns the solve time the page reported (ms) and the browser.
async fn solve_in_chromium(proxy: &Proxy, origin: &str, extra: &[&str]) -> (f64, Browser) {
    let mut b = Browser::launch(extra).await;
    let started = Instant::now();
    b.navigate(&format!("{origin}/wiki/Main_Page?x=1")).await;
    // The upstream echoes the request: the original path, and no pass (the
    // browser holds it, below, but it is tollgate's, never forwarded).
    let text = b
        .text_with("\"uri\":\"/wiki/Main_Page?x=1\"", Duration::from_secs(90))
        .await;
    assert!(!text.contains("tollgate_pass="), "{text}");
    let wall = started.elapsed();
    let cookies = b.cookies().await;
    let pass = cookies
        .iter()
        .find(|c| c["name"] == "tollgate_pass")
        .expect("the pass cookie");
    assert_eq!(pass["httpOnly"], true);
    assert_eq!(pass["sameSite"], "Lax");
    assert_eq!(pass["secure"], false, "plain HTTP: no Secure flag");
    let sum = count(proxy, "tollgate_challenge_solve_seconds_sum").await;
    eprintln!(
        "solved at the default difficulty in {:.0} ms (page's report); {:.0} ms from navigation to the page",
        sum * 1000.0,
        wall.as_millis()
    );
    (sum * 1000.0, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_solves_the_challenge_and_lands_on_the_page_it_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let proxy = Proxy::start(&yaml(&keys, &upstream, "{ when: always }", "pass", 100)).await;
    let origin = format!("http://{}", proxy.addr);
    let (ms, mut b) = solve_in_chromium(&proxy, &origin, &[]).await;
    assert!(ms > 0.0);
    // 127.0.0.1 is a secure context: WebCrypto did the hashing.
    assert_eq!(
        count(&proxy, "tollgate_challenges_solved_total{via=\"subtle\"}").await,
        1.0
    );
    // Later pages pass without a new challenge.
    b.navigate(&format!("{origin}/wiki/Other_Page")).await;
    b.text_with("\"uri\":\"/wiki/Other_Page\"", Duration::from_secs(30))
        .await;
    assert_eq!(count(&proxy, "tollgate_challenges_issued_total").await, 1.0);
    assert!(count(&proxy, "tollgate_passes_verified_total").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_plain_http_origin_the_page_hashes_with_its_own_sha256() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let proxy = Proxy::start(&yaml(&keys, &upstream, "{ when: always }", "pass", 100)).await;
    // Not localhost, not HTTPS: no crypto.subtle in the page.
    let origin = format!("http://test.example:{}", proxy.addr.port());
    let rule = "--host-resolver-rules=MAP test.example 127.0.0.1";
    let (_, _b) = solve_in_chromium(&proxy, &origin, &[rule]).await;
    assert_eq!(
        count(&proxy, "tollgate_challenges_solved_total{via=\"js\"}").await,
        1.0
    );
}

// ---- who gets what -------------------------------------------------------

#[tokio::test]
async fn a_browser_gets_the_page_and_never_the_upstream_while_other_clients_get_the_usual_answers()
{
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let proxy = Proxy::start(&yaml(&keys, &upstream, "{ when: over_limit }", "ip", 1)).await;
    let ip = "203.0.113.9";
    assert_eq!(browse(&proxy, "/a", ip, None).await.status, 200);
    // Over the limit: a browser (curl saying it accepts HTML) gets the page with the refusal's headers.
    let page = browse(&proxy, "/a", ip, None).await;
    assert_eq!(page.status, 429);
    assert!(page.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(page.number("retry-after").unwrap() >= 1);
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert!(page.body.contains("new Worker(") && page.body.contains("<noscript>"));
    assert!(!page.body.contains("\"uri\""), "upstream content leaked");
    // A client that does not ask for HTML keeps the problem+json.
    let plain = send(client().get(proxy.url("/a")).header("x-forwarded-for", ip)).await;
    assert_eq!(plain.status, 429);
    assert_eq!(plain.headers["content-type"], "application/problem+json");
    // A verified API key is never challenged (it is its own client here, but
    // the limiter keys on the IP: it is refused the plain way).
    let keyed = send(
        client()
            .get(proxy.url("/a"))
            .header("accept", HTML)
            .header("x-client-key", "partner-key")
            .header("x-forwarded-for", ip),
    )
    .await;
    assert_eq!(keyed.status, 429);
    // Its 429 is the negotiated error page a browser gets, never the challenge.
    assert!(
        !keyed.body.contains("new Worker("),
        "a verified key was challenged"
    );
    assert_eq!(
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    let records = proxy.access.wait_records(4).await;
    assert_eq!(records[1]["decision"], "challenged", "{records:?}");
    assert_eq!(records[2]["decision"], "rejected");
    assert_eq!(
        count(
            &proxy,
            "tollgate_requests_total{route=\"wiki\",decision=\"challenged\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn a_solution_earns_a_pass_that_later_requests_pass_with() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let proxy = Proxy::start(&yaml(
        &keys,
        &upstream,
        "{ when: always, difficulty: 8 }",
        "pass",
        100,
    ))
    .await;
    let ip = "203.0.113.9";
    let page = browse(&proxy, "/wiki/Main_Page?x=1", ip, None).await;
    let c = challenge_of(&page.body);
    let answer = post(&proxy, &c, &solve(&c), "/wiki/Main_Page?x=1", ip).await;
    assert_eq!(answer.status, 303);
    assert_eq!(answer.headers["location"], "/wiki/Main_Page?x=1");
    let set = answer.headers["set-cookie"].to_str().unwrap();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Lax") && !set.contains("Secure"));
    let cookie = set.split(';').next().unwrap();
    // Another address of the same /24 keeps the pass.
    let later = browse(&proxy, "/wiki/Main_Page?x=1", "203.0.113.77", Some(cookie)).await;
    assert_eq!(later.status, 200);
    assert!(later.body.contains("\"uri\":\"/wiki/Main_Page?x=1\""));
    // Somewhere else entirely: no open redirect.
    let away = post(&proxy, &c, &solve(&c), "//evil.example/x", ip).await;
    assert_eq!(away.headers["location"], "/");
}

#[tokio::test]
async fn solutions_for_another_challenge_address_or_time_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let clock = ManualClock::at(T0);
    let yaml = yaml(
        &keys,
        &upstream,
        "{ when: always, difficulty: 8 }",
        "pass",
        100,
    );
    let proxy = Proxy::start_with_clock(&yaml, clock.clone()).await;
    let ip = "203.0.113.9";
    let c = challenge_of(&browse(&proxy, "/", ip, None).await.body);
    let other = challenge_of(&browse(&proxy, "/", ip, None).await.body);
    let nonce = solve(&c);
    // The nonce of one challenge does not solve another (unless by a 1-in-256
    // chance, when the server is right to take it).
    if !solves(&other, &nonce) {
        assert_eq!(post(&proxy, &other, &nonce, "/", ip).await.status, 400);
        assert_eq!(
            count(
                &proxy,
                "tollgate_challenges_failed_total{reason=\"unsolved\"}"
            )
            .await,
            1.0
        );
    }
    let elsewhere = post(&proxy, &c, &nonce, "/", "198.51.100.9").await;
    assert_eq!(elsewhere.status, 400);
    assert!(
        elsewhere.body.contains("other_prefix"),
        "{}",
        elsewhere.body
    );
    let easier = c.replacen("~8~", "~1~", 1);
    assert_eq!(
        post(&proxy, &easier, &solve(&easier), "/", ip).await.status,
        400
    );
    assert_eq!(
        count(
            &proxy,
            "tollgate_challenges_failed_total{reason=\"forged\"}"
        )
        .await,
        1.0
    );
    clock.advance(Duration::from_secs(601));
    let late = post(&proxy, &c, &nonce, "/", ip).await;
    assert_eq!(late.status, 400);
    assert_eq!(
        count(
            &proxy,
            "tollgate_challenges_failed_total{reason=\"expired\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        count(&proxy, "tollgate_challenges_solved_total{via=\"js\"}").await,
        0.0
    );
}

#[tokio::test]
async fn tampered_expired_or_removed_key_passes_count_as_no_pass() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[OLD]);
    let clock = ManualClock::at(T0);
    let text = yaml(
        &keys,
        &upstream,
        "{ when: always, difficulty: 8 }",
        "pass",
        100,
    );
    let proxy = Proxy::start_with_clock(&text, clock.clone()).await;
    let ip = "203.0.113.9";
    let cookie = pass_for(&proxy, ip).await;
    assert_eq!(browse(&proxy, "/", ip, Some(&cookie)).await.status, 200);
    // Another id under the same MAC: forged, so challenged again.
    let tampered = {
        let mut fields: Vec<String> = cookie.split('~').map(String::from).collect();
        fields[1] = "0".repeat(32);
        fields.join("~")
    };
    assert_eq!(browse(&proxy, "/", ip, Some(&tampered)).await.status, 403);
    assert_eq!(
        count(&proxy, "tollgate_passes_rejected_total{reason=\"forged\"}").await,
        1.0
    );
    // From another address block.
    assert_eq!(
        browse(&proxy, "/", "198.51.100.9", Some(&cookie))
            .await
            .status,
        403
    );
    assert_eq!(
        count(
            &proxy,
            "tollgate_passes_rejected_total{reason=\"other_prefix\"}"
        )
        .await,
        1.0
    );
    // A rotation keeps it; removing its key refuses it.
    secret_file(dir.path(), &[OLD, NEW]);
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(browse(&proxy, "/", ip, Some(&cookie)).await.status, 200);
    secret_file(dir.path(), &[NEW]);
    assert_eq!(proxy.reload().await.0, 200);
    assert_eq!(browse(&proxy, "/", ip, Some(&cookie)).await.status, 403);
    assert_eq!(
        count(
            &proxy,
            "tollgate_passes_rejected_total{reason=\"unknown_key\"}"
        )
        .await,
        1.0
    );
    // A new pass, a week and a second later: expired.
    let fresh = pass_for(&proxy, ip).await;
    clock.advance(Duration::from_secs(7 * 86_400 + 1));
    assert_eq!(browse(&proxy, "/", ip, Some(&fresh)).await.status, 403);
    assert_eq!(
        count(&proxy, "tollgate_passes_rejected_total{reason=\"expired\"}").await,
        1.0
    );
}

#[tokio::test]
async fn two_tollgates_with_one_secret_accept_each_others_passes() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[OLD, NEW]);
    let text = yaml(
        &keys,
        &upstream,
        "{ when: always, difficulty: 8 }",
        "pass",
        100,
    );
    let a = Proxy::start(&text).await;
    let b = Proxy::start(&text).await;
    let ip = "203.0.113.9";
    let page = browse(&a, "/", ip, None).await;
    let c = challenge_of(&page.body);
    // Solved on b from a's challenge, used on a with b's pass.
    let answer = post(&b, &c, &solve(&c), "/", ip).await;
    assert_eq!(answer.status, 303);
    let set = answer.headers["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap();
    assert_eq!(browse(&a, "/", ip, Some(cookie)).await.status, 200);
    assert_eq!(browse(&b, "/", ip, Some(cookie)).await.status, 200);
}

#[tokio::test]
async fn two_browsers_behind_one_address_each_get_their_own_counter() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let text = yaml(
        &keys,
        &upstream,
        "{ when: over_limit, difficulty: 8 }",
        "pass",
        2,
    );
    let proxy = Proxy::start(&text).await;
    let nat = "203.0.113.9";
    // Without a pass, everyone behind the address shares its counter.
    assert_eq!(browse(&proxy, "/", nat, None).await.status, 200);
    assert_eq!(browse(&proxy, "/", nat, None).await.status, 200);
    let page = browse(&proxy, "/", nat, None).await;
    assert_eq!(page.status, 429, "the shared counter is used up");
    // Two browsers solve a challenge each: two passes, two counters of 2.
    let mut cookies = Vec::new();
    for _ in 0..2 {
        let c = challenge_of(&browse(&proxy, "/", nat, None).await.body);
        let answer = post(&proxy, &c, &solve(&c), "/", nat).await;
        let set = answer.headers["set-cookie"].to_str().unwrap();
        cookies.push(set.split(';').next().unwrap().to_string());
    }
    assert_ne!(cookies[0], cookies[1]);
    for cookie in &cookies {
        for _ in 0..2 {
            assert_eq!(browse(&proxy, "/", nat, Some(cookie)).await.status, 200);
        }
        // Over its own limit, a browser with a pass is refused plainly: solving again would not help.
        let over = browse(&proxy, "/", nat, Some(cookie)).await;
        assert_eq!(over.status, 429);
        assert!(
            !over.body.contains("new Worker("),
            "a browser with a pass was challenged again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unsolved_challenges_and_forged_solutions_leaves_no_state() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let text = yaml(&keys, &upstream, "{ when: always }", "ip", 1_000_000);
    let proxy = Arc::new(Proxy::start(&text).await);
    let ip = "203.0.113.9";
    let sample = challenge_of(&browse(&proxy, "/", ip, None).await.body);
    let keys_before = count(&proxy, "tollgate_tracked_keys ").await;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let proxy = proxy.clone();
        let sample = sample.clone();
        tasks.push(tokio::spawn(async move {
            let c = client();
            for i in 0..1250 {
                let addr = format!("198.51.{}.{}", worker, i % 250);
                let page = c
                    .get(proxy.url("/"))
                    .header("accept", HTML)
                    .header("x-forwarded-for", &addr)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(page.status(), 403);
                let form = format!("c={}&n={i}&r=%2F", sample.replace('/', "%2F"));
                let forged = c
                    .post(proxy.url("/.well-known/tollgate/pass"))
                    .header("x-forwarded-for", &addr)
                    .body(form)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(forged.status(), 400);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        count(&proxy, "tollgate_challenges_issued_total").await,
        10_001.0
    );
    let m = proxy.metrics().await;
    let refused: f64 = m
        .lines()
        .filter(|l| l.starts_with("tollgate_challenges_failed_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(refused, 10_000.0);
    // Challenges are issued without storing anything: no limiter key was added for them.
    assert_eq!(metric(&m, "tollgate_tracked_keys "), Some(keys_before));
    assert_eq!(
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

// ---- verified crawlers ---------------------------------------------------

const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

async fn as_crawler(proxy: &Proxy, ip: &str) -> u16 {
    send(
        client()
            .get(proxy.url("/"))
            .header("accept", HTML)
            .header("user-agent", GOOGLEBOT)
            .header("x-forwarded-for", ip),
    )
    .await
    .status
}

/// A DNS where 203.0.113.9 is a real Googlebot (its PTR name resolves back
/// to it) and 198.51.100.8 claims to be one: a PTR record is whatever the
/// address owner writes, and this one lies (its name resolves elsewhere).
fn googlebot_dns() -> common::dnsmasq::Dnsmasq {
    common::dnsmasq::Dnsmasq::start(
        &[
            ("203.0.113.9", "crawl-203-0-113-9.googlebot.com"),
            ("198.51.100.8", "crawl-fake.googlebot.com"),
        ],
        &[
            ("crawl-203-0-113-9.googlebot.com", "203.0.113.9"),
            ("crawl-fake.googlebot.com", "203.0.113.50"),
        ],
    )
}

/// Crawlers verified through `resolver`; unverified ones challenged over
/// the limit on `/`, refused on `/feed`.
fn refuting_yaml(keys: &Path, upstream: &Upstream, resolver: std::net::SocketAddr) -> String {
    let challenge = "{ when: over_limit, unverified_crawlers: challenge }";
    yaml(keys, upstream, challenge, "ip", 100)
        .replace(
            "  pass: {",
            &format!(
                "  pass: {{ crawlers: {{ resolver: \"{resolver}\", verify: [{{ user_agent: googlebot, domains: [googlebot.com] }}] }}, "
            ),
        )
        .replace(
            "routes:\n",
            "routes:\n  - { name: feeds, match: { path_prefix: /feed }, upstream: app, challenge: { unverified_crawlers: refuse }, limiters: [per] }\n",
        )
}

#[tokio::test]
async fn a_crawler_is_let_through_only_where_forward_confirmed_reverse_dns_says_so() {
    let dns = googlebot_dns();
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let text = yaml(&keys, &upstream, "{ when: always }", "ip", 100).replace(
        "  pass: {",
        &format!(
            "  pass: {{ crawlers: {{ resolver: \"{}\", cidrs: [192.0.2.0/24], verify: [{{ user_agent: googlebot, domains: [googlebot.com, google.com] }}] }}, ",
            dns.addr
        ),
    );
    let proxy = Proxy::start(&text).await;
    assert_eq!(as_crawler(&proxy, "203.0.113.9").await, 200);
    assert_eq!(as_crawler(&proxy, "203.0.113.9").await, 200);
    assert_eq!(
        count(
            &proxy,
            "tollgate_crawler_checks_total{result=\"confirmed\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        count(&proxy, "tollgate_crawler_checks_total{result=\"cached\"}").await,
        1.0
    );
    // The same user-agent elsewhere: no PTR, or a PTR the forward lookup does not confirm.
    assert_eq!(as_crawler(&proxy, "198.51.100.7").await, 403);
    assert_eq!(as_crawler(&proxy, "198.51.100.8").await, 403);
    assert_eq!(
        count(&proxy, "tollgate_crawler_checks_total{result=\"refused\"}").await,
        2.0
    );
    // An allowed range needs no lookup.
    assert_eq!(as_crawler(&proxy, "192.0.2.4").await, 200);
    assert_eq!(
        count(&proxy, "tollgate_crawler_checks_total{result=\"cidr\"}").await,
        1.0
    );
}

/// A crawler user-agent from `ip` that does not say it accepts HTML, with `method`.
async fn claiming_googlebot(proxy: &Proxy, method: &str, path: &str, ip: &str) -> common::Answer {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    send(
        client()
            .request(method, proxy.url(path))
            .header("accept", "*/*")
            .header("user-agent", GOOGLEBOT)
            .header("x-forwarded-for", ip),
    )
    .await
}

#[tokio::test]
async fn a_crawler_the_dns_refutes_is_challenged_or_refused_as_the_route_says() {
    let dns = googlebot_dns();
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let proxy = Proxy::start(&refuting_yaml(&keys, &upstream, dns.addr)).await;
    let forwarded = || {
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
    };

    // The real crawler, confirmed by its DNS, is let through on both routes.
    assert_eq!(
        claiming_googlebot(&proxy, "GET", "/", "203.0.113.9")
            .await
            .status,
        200
    );
    assert_eq!(
        claiming_googlebot(&proxy, "GET", "/feed", "203.0.113.9")
            .await
            .status,
        200
    );
    assert_eq!(forwarded(), 2);

    // A scraper dressed as Googlebot gets the page at once, though it is
    // under the limit and does not ask for HTML.
    let page = claiming_googlebot(&proxy, "GET", "/", "198.51.100.8").await;
    assert_eq!(page.status, 403);
    assert!(page.body.contains("new Worker("), "{}", page.body);
    // Its form is refused: it could not pass the check.
    let form = claiming_googlebot(&proxy, "POST", "/", "198.51.100.8").await;
    assert_eq!(form.status, 403);
    assert_eq!(form.headers["content-type"], "application/problem+json");
    assert!(form.body.contains("pass-required"), "{}", form.body);
    // Where the route says `refuse`: 403 problem+json, no page.
    let refused = claiming_googlebot(&proxy, "GET", "/feed", "198.51.100.8").await;
    assert_eq!(refused.status, 403);
    assert!(
        refused.body.contains("unverified-crawler"),
        "{}",
        refused.body
    );
    assert_eq!(
        forwarded(),
        2,
        "nothing of the fake crawler reached the upstream"
    );

    // The same address without the crawler's name is any other client:
    // under the limit, forwarded.
    let plain = send(
        client()
            .get(proxy.url("/"))
            .header("x-forwarded-for", "198.51.100.8"),
    )
    .await;
    assert_eq!(plain.status, 200);
    assert_eq!(forwarded(), 3);
    let records = proxy.access.wait_records(6).await;
    for r in &records[2..5] {
        assert_eq!(r["decision"], "challenged", "{records:?}");
    }
}

// ---- methods other than GET ----------------------------------------------

#[tokio::test]
async fn a_browser_without_a_pass_gets_no_form_through_an_always_route_and_head_gets_the_page_head()
{
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let keys = secret_file(dir.path(), &[NEW]);
    let proxy = Proxy::start(&yaml(&keys, &upstream, "{ when: always }", "ip", 100)).await;
    let ip = "203.0.113.9";
    let form = |cookie: Option<String>| {
        let mut req = client()
            .post(proxy.url("/wiki/Special:Search"))
            .header("accept", HTML)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("x-forwarded-for", ip)
            .body("search=tollgate");
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        send(req)
    };
    // A browser's POST without a pass: a page that says to reload, never the upstream.
    let refused = form(None).await;
    assert_eq!(refused.status, 403);
    assert!(refused.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(
        refused.body.contains("Load the page again"),
        "{}",
        refused.body
    );
    assert!(
        !refused.body.contains("new Worker("),
        "not the solving page: its redirect would lose the form"
    );
    // HEAD: the page's status and headers.
    let head = send(
        client()
            .head(proxy.url("/wiki/Main_Page"))
            .header("accept", HTML)
            .header("x-forwarded-for", ip),
    )
    .await;
    assert_eq!(head.status, 403);
    assert!(head.headers.contains_key("content-security-policy"));
    assert_eq!(head.body, "");
    let seen = || {
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    assert_eq!(seen(), 0);
    // With a pass the form goes through; a client that does not ask for
    // HTML (an API client, curl) was never challenged and is not now.
    let cookie = pass_for(&proxy, ip).await;
    assert_eq!(form(Some(cookie)).await.status, 200);
    let api = send(
        client()
            .post(proxy.url("/api/items"))
            .header("x-forwarded-for", ip)
            .body("{}"),
    )
    .await;
    assert_eq!(api.status, 200);
    assert_eq!(seen(), 2);
}
