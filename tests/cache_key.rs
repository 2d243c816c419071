//! What the cache keys on and what it refuses to be fooled by: unkeyed headers, the query, `Vary`, validators, encodings, and the order with limits; on the in-process app in virtual time.

mod common;

use common::app::{app, from, get, text};
use common::origin::{Origin, Script};
use http::{Response, StatusCode};
use tollgate::body::Body;

const CLIENT: &str = "192.0.2.1:40000";

fn site(origin: &Origin, cache: &str, extra: &str) -> tollgate::App {
    app(&format!(
        "{extra}upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: app, cache: {cache}{} }}\n",
        origin.url(),
        if extra.contains("limiters:") { ", limiters: [one]" } else { "" }
    ))
}

async fn fetch(app: &tollgate::App, path: &str, headers: &[(&str, &str)]) -> Response<Body> {
    app.handle(get(path, headers), from(CLIENT)).await
}

fn cache_status(resp: &Response<Body>) -> String {
    resp.headers()
        .get("cache-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn unkeyed_headers_never_reach_the_upstream_of_a_page_that_is_stored() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 60s }", "");
    let poison = [
        ("x-forwarded-host", "evil.example"),
        ("x-original-url", "/admin"),
        ("x-rewrite-url", "/admin"),
        ("x-http-method-override", "DELETE"),
        ("x-forwarded-scheme", "nothttps"),
        ("forwarded", "host=evil.example"),
    ];
    let first = fetch(&app, "/", &poison).await;
    assert!(cache_status(&first).contains("stored"));
    let seen = origin.seen("/");
    for (name, value) in poison {
        // tollgate sets its own `X-Forwarded-Host` (the Host it keyed on).
        let reached = seen.get_all(name).iter().any(|v| v == value);
        assert!(!reached, "{name}: {value} reached the upstream");
    }
    let victim = fetch(&app, "/", &[]).await;
    assert!(cache_status(&victim).contains("hit"));
    assert_eq!(origin.renders("/"), 1);
}

#[tokio::test(start_paused = true)]
async fn the_host_is_keyed_normalised_and_sent_as_keyed() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 60s }", "");
    let first = app
        .handle(get("/", &[]).tap_host("Shop.Example.:80"), from(CLIENT))
        .await;
    assert!(cache_status(&first).contains("stored"));
    assert_eq!(origin.seen("/")["host"], "shop.example");
    assert!(cache_status(&fetch(&app, "/", &[]).await).contains("hit"));
    let other = app
        .handle(get("/", &[]).tap_host("other.example"), from(CLIENT))
        .await;
    assert!(
        cache_status(&other).contains("fwd=miss"),
        "another host, another page"
    );
}

/// `Request::tap_host`: the same request with another `Host`.
trait TapHost {
    fn tap_host(self, host: &str) -> Self;
}

impl TapHost for http::Request<bytes::Bytes> {
    fn tap_host(mut self, host: &str) -> Self {
        self.headers_mut().insert("host", host.parse().unwrap());
        self
    }
}

#[tokio::test(start_paused = true)]
async fn dropped_query_parameters_share_one_entry_and_never_reach_the_upstream() {
    let origin = Origin::start().await;
    let app = site(
        &origin,
        "{ ttl: 60s, query: { sort: true, drop: [\"utm_*\", fbclid] } }",
        "",
    );
    let first = fetch(&app, "/post?b=2&utm_source=x&a=1", &[]).await;
    assert!(text(first).await.starts_with("render 1 of /post?a=1&b=2"));
    let same = fetch(&app, "/post?a=1&fbclid=zz&b=2", &[]).await;
    assert!(cache_status(&same).contains("hit"));
    let other = fetch(&app, "/post?a=2&b=2", &[]).await;
    assert!(cache_status(&other).contains("fwd=miss"));
    assert_eq!(origin.renders("/post"), 2);
}

#[tokio::test(start_paused = true)]
async fn answers_that_vary_are_kept_apart_by_the_headers_they_name() {
    let origin = Origin::start().await;
    origin.script("/", Script::ok(&[("vary", "Accept-Language")]));
    let app = site(&origin, "{ ttl: 60s }", "");
    let de = [("accept-language", "de")];
    let fr = [("accept-language", "fr")];
    assert!(text(fetch(&app, "/", &de).await)
        .await
        .starts_with("render 1"));
    assert!(text(fetch(&app, "/", &fr).await)
        .await
        .starts_with("render 2"));
    assert!(text(fetch(&app, "/", &de).await)
        .await
        .starts_with("render 1"));
    assert!(text(fetch(&app, "/", &fr).await)
        .await
        .starts_with("render 2"));
    assert_eq!(origin.renders("/"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stored_etag_answers_a_conditional_request_with_304() {
    let origin = Origin::start().await;
    origin.script(
        "/",
        Script::ok(&[("etag", "\"v1\""), ("cache-control", "max-age=60")]),
    );
    let app = site(&origin, "{}", "");
    let first = fetch(&app, "/", &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(
        first.status(),
        StatusCode::NOT_MODIFIED,
        "a miss is answered from what it stored"
    );
    assert!(
        !origin.seen("/").contains_key("if-none-match"),
        "the upstream rendered the page whole"
    );
    let hit = fetch(&app, "/", &[("if-none-match", "W/\"v0\", \"v1\"")]).await;
    assert_eq!(hit.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(hit.headers()["etag"], "\"v1\"");
    assert!(cache_status(&hit).contains("hit"));
    assert_eq!(
        fetch(&app, "/", &[("if-none-match", "\"v0\"")])
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(origin.renders("/"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_compressed_form_is_stored_once_and_served_to_whoever_accepts_it() {
    let origin = Origin::start().await;
    let mut page = Script::ok(&[]);
    page.filler = "<p>hello, cached world</p>".repeat(100);
    origin.script("/", page);
    let app = site(&origin, "{ ttl: 60s }", "");
    let gz = fetch(&app, "/", &[("accept-encoding", "gzip")]).await;
    assert_eq!(gz.headers()["content-encoding"], "gzip");
    assert!(
        !origin.seen("/").contains_key("accept-encoding"),
        "the cache stores the identity body"
    );
    let br = fetch(&app, "/", &[("accept-encoding", "br, gzip")]).await;
    assert_eq!(br.headers()["content-encoding"], "br");
    assert!(cache_status(&br).contains("hit"));
    let plain = fetch(&app, "/", &[]).await;
    assert!(!plain.headers().contains_key("content-encoding"));
    assert!(plain.headers()["vary"]
        .to_str()
        .unwrap()
        .contains("Accept-Encoding"));
    assert!(text(plain).await.starts_with("render 1"));
    assert_eq!(origin.renders("/"), 1);
}

const ONE_PER_MINUTE: &str =
    "limiters:\n  one: { algorithm: fixed_window, limit: 1, window: 60s, key: ip }\n";

#[tokio::test(start_paused = true)]
async fn a_client_over_its_limit_is_refused_a_cached_page_too() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 60s }", ONE_PER_MINUTE);
    assert_eq!(fetch(&app, "/", &[]).await.status(), StatusCode::OK);
    let refused = fetch(&app, "/", &[]).await;
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a cache does not lift a limit"
    );
    let other = app.handle(get("/", &[]), from("192.0.2.2:40000")).await;
    assert!(cache_status(&other).contains("hit"));
    assert_eq!(origin.renders("/"), 1);
}

#[tokio::test(start_paused = true)]
async fn with_hits_free_a_stored_page_does_not_count_against_the_limit() {
    let origin = Origin::start().await;
    let app = site(&origin, "{ ttl: 60s, hits_free: true }", ONE_PER_MINUTE);
    assert_eq!(fetch(&app, "/", &[]).await.status(), StatusCode::OK);
    for _ in 0..3 {
        let hit = fetch(&app, "/", &[]).await;
        assert_eq!(hit.status(), StatusCode::OK);
        assert!(cache_status(&hit).contains("hit"));
    }
    let miss = fetch(&app, "/uncached", &[]).await;
    assert_eq!(
        miss.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a miss still counts"
    );
}

#[tokio::test(start_paused = true)]
async fn a_banned_client_gets_no_free_hit() {
    let origin = Origin::start().await;
    let limiter = "limiters:\n  one: { algorithm: fixed_window, limit: 1, window: 60s, key: ip, ban: { after: 1, for: 1h } }\n";
    let app = site(&origin, "{ ttl: 60s, hits_free: true }", limiter);
    assert_eq!(fetch(&app, "/", &[]).await.status(), StatusCode::OK);
    // Over the limit on another page: the refusal starts the ban.
    assert_eq!(
        fetch(&app, "/other", &[]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let banned = fetch(&app, "/", &[]).await;
    assert_eq!(
        banned.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "bans come before the cache"
    );
    let other = app.handle(get("/", &[]), from("192.0.2.2:40000")).await;
    assert!(cache_status(&other).contains("hit"));
}
