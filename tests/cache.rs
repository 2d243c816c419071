//! The response cache on the in-process app, in virtual time: what is stored and for how long, hits, stale serving, one render for concurrent misses, bypass, poisoning, and the order with limits.

mod common;

use std::time::Duration;

use common::app::{app, from, get, text};
use common::origin::{Origin, Script};
use http::{Response, StatusCode};
use tokio::time::advance;
use tollgate::body::Body;

const CLIENT: &str = "192.0.2.1:40000";

fn site(origin: &Origin, cache: &str, extra: &str) -> tollgate::App {
    app(&format!(
        "{extra}upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: app, cache: {cache} }}\n",
        origin.url()
    ))
}

async fn fetch(app: &tollgate::App, path: &str, headers: &[(&str, &str)]) -> Response<Body> {
    app.handle(get(path, headers), from(CLIENT)).await
}

fn status_of(resp: &Response<Body>) -> String {
    resp.headers()
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The second request's `Cache-Status` for an answer not stored: the
/// upstream's answer goes on, a miss with its status, and the key is
/// remembered as not storable (unless the answer failed), so the second
/// asks the upstream without waiting on a render.
fn unstored(status: u16) -> String {
    let detail = if status >= 500 {
        ""
    } else {
        "; detail=unstorable"
    };
    format!("tollgate; fwd=miss; fwd-status={status}{detail}")
}

/// RFC 9111 as a shared cache with heuristics off, then the route's rules:
/// (upstream headers, status, route ttl, second request is a hit).
#[tokio::test(start_paused = true)]
async fn what_an_http_upstream_answers_decides_what_is_stored() {
    let origin = Origin::start().await;
    type Row = (
        &'static [(&'static str, &'static str)],
        u16,
        &'static str,
        bool,
    );
    let table: &[Row] = &[
        (&[("cache-control", "max-age=60")], 200, "{}", true),
        (&[("cache-control", "s-maxage=60")], 200, "{}", true),
        (
            &[("expires", "Thu, 01 Jan 2099 00:00:00 GMT")],
            200,
            "{}",
            true,
        ),
        (&[], 200, "{}", false),
        (&[], 200, "{ ttl: 10s }", true),
        (
            &[("last-modified", "Thu, 01 Jan 2015 00:00:00 GMT")],
            200,
            "{}",
            false,
        ),
        (
            &[("cache-control", "max-age=60, private")],
            200,
            "{ ttl: 10s }",
            false,
        ),
        (&[("cache-control", "no-store")], 200, "{ ttl: 10s }", false),
        (
            &[("cache-control", "max-age=60"), ("set-cookie", "s=1")],
            200,
            "{}",
            false,
        ),
        (
            &[("cache-control", "max-age=60"), ("vary", "*")],
            200,
            "{}",
            false,
        ),
        (&[], 404, "{ ttl: 10s }", true),
        (&[], 500, "{ ttl: 10s }", false),
        (&[("cache-control", "max-age=60")], 302, "{}", false),
        (
            &[("cache-control", "max-age=60")],
            302,
            "{ statuses: [302] }",
            true,
        ),
    ];
    for (i, (headers, status, cache, hit)) in table.iter().enumerate() {
        let app = site(&origin, cache, "");
        let path = format!("/t{i}");
        let mut script = Script::ok(headers);
        script.status = *status;
        origin.script(&path, script);
        let first = fetch(&app, &path, &[]).await;
        assert_eq!(first.status().as_u16(), *status, "row {i}");
        text(first).await;
        let second = fetch(&app, &path, &[]).await;
        let cs = status_of(&second);
        assert_eq!(
            cs.contains("; hit"),
            *hit,
            "row {i}: {headers:?} {status} {cache}: {cs}"
        );
        assert!(*hit || cs == unstored(*status), "row {i}: {cs}");
        assert_eq!(origin.renders(&path), if *hit { 1 } else { 2 }, "row {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn authorization_never_reads_nor_fills_the_cache() {
    let origin = Origin::start().await;
    origin.script("/", Script::ok(&[("cache-control", "public, max-age=60")]));
    let app = site(&origin, "{}", "");
    let auth = [("authorization", "Basic YWxpY2U6c2VjcmV0")];
    assert_eq!(
        status_of(&fetch(&app, "/", &auth).await),
        "tollgate; fwd=bypass"
    );
    let anonymous = fetch(&app, "/", &[]).await;
    assert!(
        status_of(&anonymous).contains("fwd=miss"),
        "the authorized answer was not stored"
    );
    assert_eq!(
        status_of(&fetch(&app, "/", &auth).await),
        "tollgate; fwd=bypass"
    );
    assert_eq!(origin.renders("/"), 3);
}

#[tokio::test(start_paused = true)]
async fn a_hit_carries_age_and_cache_status_and_never_reaches_the_upstream() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 60s }", "");
    let miss = fetch(&app, "/page", &[]).await;
    assert_eq!(
        status_of(&miss),
        "tollgate; fwd=miss; fwd-status=200; stored; ttl=60"
    );
    assert!(text(miss).await.starts_with("render 1"));
    advance(Duration::from_secs(7)).await;
    let hit = fetch(&app, "/page", &[]).await;
    assert_eq!(hit.status(), StatusCode::OK);
    assert_eq!(status_of(&hit), "tollgate; hit; ttl=53");
    assert_eq!(hit.headers()["age"], "7");
    assert!(hit.headers().contains_key("x-request-id"));
    assert!(text(hit).await.starts_with("render 1"));
    assert_eq!(origin.renders("/page"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_route_without_cache_pays_nothing_and_says_nothing() {
    let origin = Origin::start().await;
    origin.script("/", Script::ok(&[("cache-control", "max-age=60")]));
    let app = app(&format!(
        "upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: app }}\n",
        origin.url()
    ));
    for _ in 0..2 {
        let resp = fetch(&app, "/", &[]).await;
        assert!(!resp.headers().contains_key("cache-status"));
    }
    assert_eq!(origin.renders("/"), 2);
}

#[tokio::test(start_paused = true)]
async fn twenty_concurrent_misses_make_one_render() {
    let origin = Origin::start().await;
    let mut slow = Script::ok(&[]);
    slow.delay = Duration::from_millis(300);
    origin.script("/slow", slow);
    let app = site(&origin, "{ ttl: 60s }", "");
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let resp = fetch(&app, "/slow", &[]).await;
                (status_of(&resp), text(resp).await)
            })
        })
        .collect();
    let mut collapsed = 0;
    for t in tasks {
        let (cs, body) = t.await.unwrap();
        assert!(body.starts_with("render 1 of"), "{body}");
        collapsed += usize::from(cs.contains("collapsed"));
    }
    assert_eq!(origin.renders("/slow"), 1);
    assert_eq!(collapsed, 19);
}

#[tokio::test(start_paused = true)]
async fn concurrent_misses_for_an_uncacheable_page_each_go_to_the_upstream() {
    let origin = Origin::start().await;
    let mut private = Script::ok(&[("cache-control", "private")]);
    private.delay = Duration::from_millis(300);
    origin.script("/me", private);
    let app = site(&origin, "{ ttl: 60s }", "");
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { text(fetch(&app, "/me", &[]).await).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for t in tasks {
        bodies.push(t.await.unwrap());
    }
    bodies.sort();
    bodies.dedup();
    assert_eq!(
        bodies.len(),
        5,
        "each waiter got its own render: {bodies:?}"
    );
    assert_eq!(origin.renders("/me"), 5);
}

#[tokio::test(start_paused = true)]
async fn after_an_unstorable_answer_misses_ask_at_once_until_it_is_forgotten() {
    let origin = Origin::start().await;
    let mut private = Script::ok(&[("cache-control", "private")]);
    private.delay = Duration::from_millis(300);
    origin.script("/me", private);
    let app = site(&origin, "{ ttl: 60s }", "");
    let first = fetch(&app, "/me", &[]).await;
    assert_eq!(status_of(&first), "tollgate; fwd=miss; fwd-status=200");
    text(first).await;
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { status_of(&fetch(&app, "/me", &[]).await) })
        })
        .collect();
    for t in tasks {
        let status = t.await.unwrap();
        assert_eq!(
            status,
            "tollgate; fwd=miss; fwd-status=200; detail=unstorable"
        );
    }
    // One render's time, not two: none waited on another's render.
    let took = started.elapsed();
    assert!(took < Duration::from_millis(600), "{took:?}");
    assert_eq!(origin.renders("/me"), 6);
    // Forgotten after 10 s: a page that became storable is stored again.
    origin.script("/me", Script::ok(&[("cache-control", "max-age=60")]));
    advance(Duration::from_secs(10)).await;
    let again = fetch(&app, "/me", &[]).await;
    assert!(
        status_of(&again).contains("; stored;"),
        "{}",
        status_of(&again)
    );
}

#[tokio::test(start_paused = true)]
async fn stale_while_revalidate_answers_at_once_and_refreshes_once() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 10s, stale_while_revalidate: 60s }", "");
    text(fetch(&app, "/", &[]).await).await;
    advance(Duration::from_secs(12)).await;
    for _ in 0..5 {
        let stale = fetch(&app, "/", &[]).await;
        assert_eq!(
            status_of(&stale),
            "tollgate; hit; ttl=-2; detail=stale-while-revalidate"
        );
        assert!(text(stale).await.starts_with("render 1"));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        origin.renders("/"),
        2,
        "one background refresh for five stale answers"
    );
    let fresh = fetch(&app, "/", &[]).await;
    assert!(status_of(&fresh).starts_with("tollgate; hit; ttl="));
    assert!(text(fresh).await.starts_with("render 2"));
}

#[tokio::test(start_paused = true)]
async fn stale_if_error_serves_the_stored_page_while_the_upstream_is_down() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 10s, stale_if_error: 1h }", "");
    text(fetch(&app, "/kept", &[]).await).await;
    origin.kill();
    advance(Duration::from_secs(60)).await;
    let stale = fetch(&app, "/kept", &[]).await;
    assert_eq!(stale.status(), StatusCode::OK);
    assert!(
        status_of(&stale).starts_with("tollgate; fwd=stale; fwd-status=502; ttl=-50"),
        "{}",
        status_of(&stale)
    );
    assert!(text(stale).await.starts_with("render 1"));
    let never_stored = fetch(&app, "/other", &[]).await;
    assert_eq!(never_stored.status(), StatusCode::BAD_GATEWAY);
    advance(Duration::from_secs(3600)).await;
    let too_old = fetch(&app, "/kept", &[]).await;
    assert_eq!(
        too_old.status(),
        StatusCode::BAD_GATEWAY,
        "past stale_if_error"
    );
}

#[tokio::test(start_paused = true)]
async fn a_logged_in_visitor_neither_sees_nor_fills_the_anonymous_copy() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 60s }", "");
    let logged_in = [("cookie", "_ga=1; wordpress_logged_in_abc=admin%7C1")];
    let first = fetch(&app, "/", &logged_in).await;
    assert_eq!(status_of(&first), "tollgate; fwd=bypass");
    let anonymous = fetch(&app, "/", &[("cookie", "_ga=1")]).await;
    assert!(
        status_of(&anonymous).contains("fwd=miss"),
        "the logged-in page was not stored"
    );
    assert!(text(anonymous).await.starts_with("render 2"));
    let again = fetch(&app, "/", &logged_in).await;
    assert_eq!(status_of(&again), "tollgate; fwd=bypass");
    assert!(
        text(again).await.starts_with("render 3"),
        "never the anonymous copy"
    );
    let php = fetch(&app, "/", &[("cookie", "PHPSESSID=s1")]).await;
    assert_eq!(
        status_of(&php),
        "tollgate; fwd=bypass",
        "a PHP session bypasses by default"
    );
}

/// A reload as `reload.rs` does it, without the file: the new config's
/// snapshot built on the old one and swapped in.
fn reload(app: &tollgate::App, yaml: &str) {
    let yaml = format!("log: {{ access: false }}\nstore: {{ backend: memory }}\n{yaml}");
    let config = tollgate::config::parse(&yaml).unwrap();
    let old = app.snapshot();
    let new = tollgate::snapshot::Snapshot::build(
        config,
        old.version + 1,
        Some(&old),
        &app.shared.metrics,
    );
    app.shared.snapshot.store(std::sync::Arc::new(new));
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_cache_and_a_new_max_size_resizes_it() {
    let origin = Origin::start().await;
    let yaml = |max: &str| {
        format!(
            "cache: {{ max_size: {max} }}\nupstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: app, cache: {{ ttl: 1h }} }}\n",
            origin.url()
        )
    };
    let app = app(&yaml("64MiB"));
    text(fetch(&app, "/home", &[]).await).await;
    reload(&app, &yaml("64MiB"));
    assert!(
        status_of(&fetch(&app, "/home", &[]).await).contains("hit"),
        "unchanged: kept"
    );
    reload(&app, &yaml("2MiB"));
    let cache = app.snapshot().cache.clone().unwrap();
    assert_eq!(cache.capacity(), 2 << 20);
    assert!(
        status_of(&fetch(&app, "/home", &[]).await).contains("hit"),
        "resized: the hot page kept"
    );
    assert_eq!(origin.renders("/home"), 1);
    let without = format!(
        "upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: app }}\n",
        origin.url()
    );
    reload(&app, &without);
    assert!(app.snapshot().cache.is_none());
    assert!(!fetch(&app, "/home", &[])
        .await
        .headers()
        .contains_key("cache-status"));
}
