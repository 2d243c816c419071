//! Brute-force protection in front of a real PHP login form (`php -S`): only failed logins count (`count:`), repeat offenders are banned (`ban:`), bans survive a restart.

mod common;

use common::T0;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::php::PhpServer;
use common::{client, get_json, send, Answer, Proxy};
use tollgate::clock::ManualClock;
use tollgate::limiter::NANOS_PER_SEC as S;

const LOGIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/login.php");

fn config(php: &PhpServer, count: &str, ban: &str) -> String {
    format!(
        "upstreams:\n  php: {{ url: \"http://{}\" }}\nlimiters:\n  failed_logins:\n    limit: 5\n    window: 15m\n    key: ip\n    count: {count}\n{ban}routes:\n  - {{ name: login, match: {{ path: /login.php }}, upstream: php, limiters: [failed_logins] }}\n",
        php.addr
    )
}

async fn login(c: &reqwest::Client, proxy: &Proxy, password: &str, query: &str) -> Answer {
    send(
        c.post(proxy.url(&format!("/login.php{query}")))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("user=alice&password={password}")),
    )
    .await
}

/// What `GET /status?key=127.0.0.1` says about the limiter.
async fn status_of(c: &reqwest::Client, proxy: &Proxy) -> serde_json::Value {
    let v = get_json(c, &proxy.admin_url("/status?key=127.0.0.1")).await;
    v["limiters"][0].clone()
}

fn failed(php: &PhpServer) -> usize {
    php.hits().iter().filter(|h| *h == "failed").count()
}

fn start_php(dir: &Path) -> PhpServer {
    PhpServer::start(Path::new(LOGIN), dir, 4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_failed_logins_count_and_the_sixth_failure_is_refused_before_php() {
    let php_dir = tempfile::tempdir().unwrap();
    let php = start_php(php_dir.path());
    let clock = ManualClock::at(T0);
    let proxy = Proxy::start_with_clock(&config(&php, "{ status: [401, 403] }", ""), clock).await;
    let c = client();

    // Ten right and five wrong, interleaved: right, right, wrong, …
    let mut wrong = 0;
    for i in 0..15 {
        if i % 3 == 2 {
            let a = login(&c, &proxy, "wrong", "").await;
            assert_eq!(a.status, 401, "failure {wrong} reaches PHP");
            wrong += 1;
            assert_eq!(
                a.number("x-ratelimit-remaining"),
                Some(5 - wrong),
                "a failure counts"
            );
        } else {
            let a = login(&c, &proxy, "right", "").await;
            assert_eq!(a.status, 200, "login {i}");
            assert_eq!(a.json()["login"], "ok");
            assert_eq!(
                a.number("x-ratelimit-remaining"),
                Some(5 - wrong),
                "a success is given back"
            );
        }
    }
    assert_eq!(wrong, 5);
    let s = status_of(&c, &proxy).await;
    assert_eq!(s["remaining"], 0, "only the five failures counted: {s}");
    assert_eq!(php.hits().len(), 15);

    let sixth = login(&c, &proxy, "wrong", "").await;
    assert_eq!(sixth.status, 429, "the sixth failure is refused");
    assert_eq!(sixth.number("x-ratelimit-remaining"), Some(0));
    assert_eq!(sixth.json()["type"], "rate-limit-exceeded");
    assert_eq!(sixth.json()["limiter"], "failed_logins");
    assert_eq!(failed(&php), 5, "and never reached PHP");
    assert_eq!(
        status_of(&c, &proxy).await["remaining"],
        0,
        "a refused attempt does not eat into the next window either"
    );

    let metrics = proxy.metrics().await;
    // The ten successes, and the refused sixth attempt (it never got an answer).
    assert!(
        metrics.contains(
            "tollgate_limiter_decisions_total{limiter=\"failed_logins\",result=\"not_counted\"} 11"
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_wrong_passwords_never_get_more_than_the_limit_to_php() {
    let php_dir = tempfile::tempdir().unwrap();
    let php = start_php(php_dir.path());
    let proxy = Proxy::start_with_clock(
        &config(&php, "{ status: [401, 403] }", ""),
        ManualClock::at(T0),
    )
    .await;
    let c = client();
    // Twenty at once, each failure taking PHP 100 ms: none has been
    // answered when the others are checked, so only taking the unit before
    // forwarding keeps them out.
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let c = c.clone();
            let url = proxy.url("/login.php");
            tokio::spawn(async move {
                c.post(url)
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body("user=alice&password=guess")
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 401).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        15,
        "{statuses:?}"
    );
    assert_eq!(failed(&php), 5, "exactly the limit reached PHP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_set_by_the_app_decides_what_counts() {
    let php_dir = tempfile::tempdir().unwrap();
    let php = start_php(php_dir.path());
    let proxy = Proxy::start_with_clock(
        &config(&php, "{ header: X-Login-Failed }", ""),
        ManualClock::at(T0),
    )
    .await;
    let c = client();
    for _ in 0..6 {
        // `X-Login-Failed: 0` on success: not counted.
        assert_eq!(
            login(&c, &proxy, "right", "?style=header").await.status,
            200
        );
    }
    for i in 0..5 {
        let a = login(&c, &proxy, "wrong", "?style=header").await;
        assert_eq!(
            a.status, 200,
            "failure {i}: the app answers 200 with the header"
        );
    }
    assert_eq!(
        login(&c, &proxy, "wrong", "?style=header").await.status,
        429
    );
    assert_eq!(failed(&php), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_outlasts_the_window_survives_a_restart_and_delete_status_lifts_it() {
    let php_dir = tempfile::tempdir().unwrap();
    let php = start_php(php_dir.path());
    let yaml = config(
        &php,
        "{ status: [401, 403] }",
        "    ban: { after: 2, for: 1h }\n",
    );
    let clock = ManualClock::at(T0);
    let proxy = Proxy::start_in(&yaml, clock.clone(), tempfile::tempdir().unwrap(), None).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(login(&c, &proxy, "wrong", "").await.status, 401);
    }
    // Two refusals within the window: the second starts a one-hour ban.
    assert_eq!(login(&c, &proxy, "wrong", "").await.status, 429);
    assert_eq!(login(&c, &proxy, "wrong", "").await.status, 429);
    let banned = login(&c, &proxy, "right", "").await;
    assert_eq!(banned.status, 429);
    assert_eq!(banned.json()["type"], "client-banned", "{}", banned.body);
    assert_eq!(banned.number("retry-after"), Some(3600));
    let ban_end = T0 / S + 3600;
    assert_eq!(banned.json()["banned_until"], ban_end);
    let s = status_of(&c, &proxy).await;
    assert_eq!(s["ban"]["banned"], true, "{s}");
    assert_eq!(s["ban"]["until"], ban_end);

    // The limiter's window ends; the ban does not.
    clock.advance(Duration::from_secs(20 * 60));
    let later = login(&c, &proxy, "right", "").await;
    assert_eq!(later.json()["type"], "client-banned");
    assert_eq!(later.number("retry-after"), Some(3600 - 20 * 60));
    let hits_before_restart = php.hits().len();

    // A restart on the same SQLite file keeps the ban.
    let dir = proxy.stop().await;
    let proxy = Proxy::start_in(&yaml, clock.clone(), dir, None).await;
    let after_restart = login(&c, &proxy, "right", "").await;
    assert_eq!(after_restart.status, 429);
    assert_eq!(after_restart.json()["type"], "client-banned");
    assert_eq!(after_restart.json()["banned_until"], ban_end);
    assert_eq!(
        php.hits().len(),
        hits_before_restart,
        "banned requests never reach PHP"
    );
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("tollgate_active_bans 1"), "{metrics}");

    // DELETE /status lifts it at once.
    let reset = c
        .delete(proxy.admin_url("/status?key=127.0.0.1"))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 200);
    assert_eq!(login(&c, &proxy, "right", "").await.status, 200);
    assert_eq!(status_of(&c, &proxy).await["ban"]["banned"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_redis_counts_failures_together_and_shares_a_ban() {
    use common::redis_server::RedisServer;
    use tollgate::clock::SystemClock;

    let redis = RedisServer::start();
    let php_dir = tempfile::tempdir().unwrap();
    let php = start_php(php_dir.path());
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", prefix: \"login:\", timeout: 500ms, on_error: deny }}\n{}",
        redis.url(),
        config(
            &php,
            "{ status: [401, 403] }",
            "    ban: { after: 2, for: 1h, status: 403 }\n"
        )
    );
    // Redis decides on its own clock: keep clear of a 15-minute boundary.
    common::wait_for_window_room(Duration::from_secs(15 * 60), Duration::from_secs(30));
    let a = Proxy::start_with_clock(&yaml, Arc::new(SystemClock)).await;
    let b = Proxy::start_with_clock(&yaml, Arc::new(SystemClock)).await;
    let c = client();
    for i in 0..5 {
        let proxy = if i % 2 == 0 { &a } else { &b };
        assert_eq!(login(&c, proxy, "right", "").await.status, 200);
        assert_eq!(
            login(&c, proxy, "wrong", "").await.status,
            401,
            "failure {i}"
        );
    }
    // Five failures through two proxies: the limit is reached for both.
    assert_eq!(login(&c, &a, "wrong", "").await.status, 429);
    assert_eq!(login(&c, &b, "wrong", "").await.status, 429);
    assert_eq!(failed(&php), 5);
    // The second refusal (on b) banned the key for the whole fleet, with 403.
    let on_a = login(&c, &a, "right", "").await;
    assert_eq!(on_a.status, 403, "{}", on_a.body);
    assert_eq!(on_a.json()["type"], "client-banned");
    let retry = on_a.number("retry-after").expect("Retry-After");
    assert!((3590..=3600).contains(&retry), "{retry}");
    assert_eq!(status_of(&c, &a).await["ban"]["banned"], true);

    // Every proxy lists the fleet's bans from Redis, and any of them lifts one for all.
    let listed = get_json(&c, &a.admin_url("/bans")).await;
    assert_eq!(listed["backend"], "redis");
    assert_eq!(listed["total"], 1, "{listed}");
    let key = listed["bans"][0]["key"].as_str().unwrap().to_string();
    assert_eq!(key, "failed_logins:ip:127.0.0.1");
    assert!((3590..=3600).contains(&listed["bans"][0]["seconds_left"].as_u64().unwrap()));
    let lifted = c
        .delete(b.admin_url(&format!("/bans/{key}")))
        .send()
        .await
        .unwrap();
    assert_eq!(lifted.status(), 200);
    assert_eq!(get_json(&c, &a.admin_url("/bans")).await["total"], 0);
    let after_lift = login(&c, &a, "right", "").await;
    assert_eq!(
        after_lift.json()["type"],
        "rate-limit-exceeded",
        "no longer banned; the limiter's own count stays: {}",
        after_lift.body
    );

    let reset = c
        .delete(b.admin_url("/status?key=127.0.0.1"))
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 200);
    assert_eq!(
        login(&c, &a, "right", "").await.status,
        200,
        "lifted everywhere"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_banned_request_is_decision_banned_in_the_access_log_the_histogram_and_the_counters() {
    let php_dir = tempfile::tempdir().unwrap();
    let php = start_php(php_dir.path());
    let yaml = format!(
        "log: {{ format: json }}\n{}",
        config(
            &php,
            "{ status: [401, 403] }",
            "    ban: { after: 1, for: 1h }\n"
        )
    );
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let access = common::AccessCapture::attach(&proxy);
    let c = client();
    for _ in 0..5 {
        assert_eq!(login(&c, &proxy, "wrong", "").await.status, 401);
    }
    // The sixth failure is refused by the limiter and starts the ban.
    let refused = login(&c, &proxy, "wrong", "").await;
    assert_eq!(refused.json()["type"], "rate-limit-exceeded");
    let banned = login(&c, &proxy, "right", "").await;
    assert_eq!(banned.status, 429);
    assert_eq!(banned.json()["type"], "client-banned", "{}", banned.body);

    let records = access.wait_records(7).await;
    let last = &records[6];
    assert_eq!(last["decision"], "banned", "{last}");
    assert_eq!(last["limiter"], "failed_logins", "{last}");
    assert_eq!(last["retry_after"], 3600, "{last}");
    assert_eq!(records[5]["decision"], "rejected", "{}", records[5]);

    let route = "route=\"login\"";
    let metrics = proxy.metrics().await;
    for line in [
        format!("tollgate_requests_total{{{route},decision=\"banned\"}} 1"),
        format!("tollgate_requests_total{{{route},decision=\"rejected\"}} 1"),
        format!("tollgate_request_duration_seconds_count{{{route},decision=\"banned\"}} 1"),
        format!("tollgate_request_duration_seconds_count{{{route},decision=\"rejected\"}} 1"),
        format!("tollgate_request_duration_seconds_count{{{route},decision=\"error\"}} 0"),
    ] {
        assert!(
            metrics.contains(&format!("{line}\n")),
            "no `{line}` in:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_429_of_a_ban_on_a_header_names_the_header_key_as_stored() {
    let proxy = Proxy::start_with_clock(
        "
limiters:
  per_user: { limit: 1, window: 15m, key: \"header:X-Username\", ban: { after: 1, for: 1h } }
routes:
  - { name: login, match: { path: /login }, respond: { status: 200, body: ok }, limiters: [per_user] }
",
        ManualClock::at(T0),
    )
    .await;
    let c = client();
    let as_alice = || common::send(c.post(proxy.url("/login")).header("x-username", "alice"));
    assert_eq!(as_alice().await.status, 200);
    assert_eq!(as_alice().await.json()["type"], "rate-limit-exceeded");
    let banned = as_alice().await;
    let body = banned.json();
    assert_eq!(banned.status, 429);
    assert_eq!(body["type"], "client-banned", "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("Key 'h:alice' is banned until"),
        "the banned key, not the client's IP: {detail}"
    );
    // The same key `GET /bans` lists and `DELETE /bans/{key}` takes.
    let bans = get_json(&c, &proxy.admin_url("/bans")).await;
    assert_eq!(bans["bans"][0]["key"], "per_user:h:alice", "{bans}");
    assert_eq!(bans["bans"][0]["value"], "h:alice", "{bans}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_banned_client_gets_the_limiters_html_page_with_the_bans_status() {
    let php_dir = tempfile::tempdir().unwrap();
    let php = start_php(php_dir.path());
    let yaml = config(
        &php,
        "{ status: [401, 403] }",
        "    ban: { after: 1, for: 1h, status: 403 }\n    reject: { body: html }\n",
    );
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(login(&c, &proxy, "wrong", "").await.status, 401);
    }
    assert_eq!(login(&c, &proxy, "wrong", "").await.status, 429);
    let resp = c
        .post(proxy.url("/login.php"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("user=alice&password=right")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403, "the ban's status");
    assert_eq!(resp.headers()["retry-after"], "3600");
    assert_eq!(
        resp.headers()["content-type"],
        "text/html; charset=utf-8",
        "the limiter's reject page, not problem+json"
    );
    let page = resp.text().await.unwrap();
    assert!(page.contains("<html") && page.contains("3600"), "{page}");
    assert_eq!(failed(&php), 5, "the banned attempt never reached PHP");
}
