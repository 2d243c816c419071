//! Site rules on the in-process app: redirects with captures and the query rules, respond's negotiated errors, access lists, basic auth, header rules, rewrites to an HTTP upstream, and the order they keep with the limiters.

mod common;

use common::app::{app, from, get, text};
use common::Upstream;
use http::StatusCode;

const CLIENT: &str = "203.0.113.9:40000";

fn location(resp: &http::Response<tollgate::body::Body>) -> &str {
    resp.headers()["location"].to_str().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_redirect_fills_numbered_and_named_captures_and_keeps_the_query_unless_it_has_its_own() {
    let app = app(r#"
routes:
  - name: old-links
    match: { path_regex: '^/blog/(\d+)/(?P<slug>[^/]+)$' }
    redirect: { to: '/posts/$1/${slug}' }
  - name: product
    match: { path_regex: '^/p/(\w+)$' }
    redirect: { to: 'https://shop.example/item?id=$1', status: 308, append_query: true }
  - name: gone
    match: { path_regex: '^/old/' }
    redirect: { to: '/new?', status: 302 }
"#);
    let r = app
        .handle(get("/blog/7/hello?ref=x", &[]), from(CLIENT))
        .await;
    assert_eq!(r.status(), StatusCode::MOVED_PERMANENTLY);
    assert_eq!(location(&r), "/posts/7/hello?ref=x");
    let r = app.handle(get("//blog/7/./hello", &[]), from(CLIENT)).await;
    assert_eq!(
        location(&r),
        "/posts/7/hello",
        "captures come from the normalised path"
    );
    let r = app.handle(get("/p/abc?utm=1", &[]), from(CLIENT)).await;
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(location(&r), "https://shop.example/item?id=abc&utm=1");
    let r = app.handle(get("/old/a?b=1", &[]), from(CLIENT)).await;
    assert_eq!((r.status().as_u16(), location(&r)), (302, "/new"));
}

#[tokio::test(start_paused = true)]
async fn a_capture_cannot_send_a_redirect_off_the_site() {
    let app = app(r#"
server: { encoded_separators: decode }
routes:
  - name: all
    match: { path_regex: '^/go(.*)$' }
    redirect: { to: '/$1' }
"#);
    for path in [
        "/go//evil.example/x",
        "/go/%2Fevil.example",
        "/go%5C%5Cevil.example",
    ] {
        let r = app.handle(get(path, &[]), from(CLIENT)).await;
        let loc = location(&r);
        assert!(
            loc.starts_with('/') && !loc.starts_with("//") && !loc.starts_with("/\\"),
            "{path}: {loc}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn respond_without_a_body_answers_the_negotiated_error_and_limiters_still_apply() {
    let app = app(r#"
limiters:
  per_ip: { limit: 1, window: 60s, key: ip }
routes:
  - name: no-xmlrpc
    match: { path: /xmlrpc.php }
    respond: { status: 403 }
    limiters: [per_ip]
"#);
    let r = app.handle(get("/xmlrpc.php", &[]), from(CLIENT)).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert!(text(r).await.contains("route-answer"));
    let r = app
        .handle(get("/xmlrpc.php", &[("accept", "text/html")]), from(CLIENT))
        .await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a respond route is still limited"
    );
    let r = app
        .handle(
            get("/xmlrpc.php", &[("accept", "text/html")]),
            from("198.51.100.1:1"),
        )
        .await;
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
}

#[tokio::test(start_paused = true)]
async fn access_lists_decide_on_the_identified_address_first_match_wins() {
    let app = app(r#"
identity: { trusted_proxies: [10.0.0.0/8] }
access: { deny: [198.51.100.0/24] }
routes:
  - name: staff
    match: { path_prefix: /wp-admin/ }
    access: { allow: [192.0.2.0/24, "2001:db8::/32"], deny: [all] }
    respond: { status: 200, body: staff }
  - name: rest
    match: { path_prefix: / }
    respond: { status: 200, body: ok }
"#);
    let status = |path: &'static str, peer: &'static str, xff: Option<&'static str>| {
        let app = app.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                xff.map(|v| ("x-forwarded-for", v)).into_iter().collect();
            app.handle(get(path, &headers), from(peer))
                .await
                .status()
                .as_u16()
        }
    };
    assert_eq!(status("/wp-admin/", "192.0.2.7:1", None).await, 200);
    assert_eq!(status("/wp-admin/", "[2001:db8::7]:1", None).await, 200);
    assert_eq!(status("/wp-admin/", "203.0.113.1:1", None).await, 403);
    assert_eq!(status("/wp-admin/", "[2001:db9::1]:1", None).await, 403);
    assert_eq!(status("/", "203.0.113.1:1", None).await, 200);
    assert_eq!(
        status("/", "198.51.100.4:1", None).await,
        403,
        "site-wide deny"
    );
    // Behind a trusted proxy, the address it names is the one decided on.
    assert_eq!(
        status("/wp-admin/", "10.0.0.2:1", Some("192.0.2.9")).await,
        200
    );
    assert_eq!(
        status("/wp-admin/", "10.0.0.2:1", Some("203.0.113.1")).await,
        403
    );
    assert_eq!(status("/", "10.0.0.2:1", Some("198.51.100.4")).await, 403);
    // An untrusted peer cannot claim an office address.
    assert_eq!(
        status("/wp-admin/", "203.0.113.1:1", Some("192.0.2.9")).await,
        403
    );
}

#[tokio::test(start_paused = true)]
async fn a_denied_request_creates_no_limiter_key() {
    let app = app(r#"
limiters:
  per_ip: { limit: 5, window: 60s, key: ip }
  everyone: { limit: 5, window: 60s, key: global }
routes:
  - name: staff
    match: { path_prefix: / }
    access: { allow: [192.0.2.0/24], deny: [all] }
    respond: { status: 200, body: ok }
    limiters: [per_ip, everyone]
"#);
    for i in 0..20 {
        let peer = format!("203.0.113.{i}:1");
        let r = app.handle(get("/", &[]), from(&peer)).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
    }
    assert_eq!(
        app.shared.store.tracked_keys(),
        0,
        "no key for a denied address"
    );
    let r = app.handle(get("/", &[]), from("192.0.2.1:1")).await;
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the global quota was not used up"
    );
}

#[tokio::test(start_paused = true)]
async fn header_rules_reach_the_upstream_its_answer_and_tollgates_own_answers() {
    let upstream = Upstream::start().await;
    let app = app(&format!(
        r#"
headers: {{ response: {{ set: {{ X-Frame-Options: SAMEORIGIN }} }} }}
upstreams:
  app: {{ url: "{}" }}
limiters:
  one: {{ limit: 1, window: 60s, key: ip }}
routes:
  - name: site
    match: {{ path_prefix: / }}
    headers:
      request: {{ set: {{ X-Site: tollgate }}, remove: [X-Debug] }}
      response: {{ set: {{ Cache-Control: "max-age=60" }}, add: {{ X-Extra: "1" }}, remove: [X-Upstream-Hop] }}
    limiters: [one]
    upstream: app
"#,
        upstream.url()
    ));
    let r = app
        .handle(get("/", &[("x-debug", "1")]), from(CLIENT))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let h = r.headers().clone();
    assert_eq!(h["x-frame-options"], "SAMEORIGIN");
    assert_eq!(h["cache-control"], "max-age=60");
    assert_eq!(h["x-extra"], "1");
    assert!(!h.contains_key("x-upstream-hop"));
    let seen: serde_json::Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(seen["headers"]["x-site"], "tollgate");
    assert!(seen["headers"].get("x-debug").is_none());
    // tollgate's own answer (a 429) gains the headers it lacks, keeps its own.
    let r = app.handle(get("/", &[]), from(CLIENT)).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["x-frame-options"], "SAMEORIGIN");
    assert_eq!(r.headers()["cache-control"], "no-store");
}

#[tokio::test(start_paused = true)]
async fn a_rewrite_sends_the_upstream_the_new_path_and_query_once() {
    let upstream = Upstream::start().await;
    let app = app(&format!(
        r#"
upstreams:
  app: {{ url: "{}" }}
routes:
  - name: product
    match: {{ path_regex: '^/product/(\w+)$' }}
    rewrite: {{ to: '/index.php?product=$1' }}
    upstream: app
  - name: chain
    match: {{ path_regex: '^/a/(.*)$' }}
    rewrite: {{ to: '/a/a/$1' }}
    upstream: app
  - name: escape
    match: {{ path_regex: '^/x/(.*)$' }}
    rewrite: {{ to: '/safe/../../$1' }}
    upstream: app
"#,
        upstream.url()
    ));
    let uri = |path: &'static str| {
        let app = app.clone();
        async move {
            let r = app.handle(get(path, &[]), from(CLIENT)).await;
            let seen: serde_json::Value = serde_json::from_str(&text(r).await).unwrap();
            seen["uri"].as_str().unwrap().to_string()
        }
    };
    assert_eq!(uri("/product/shoe?utm=1").await, "/index.php?product=shoe");
    assert_eq!(
        uri("/a/b").await,
        "/a/a/b",
        "one pass: the rewritten path is not routed again"
    );
    assert_eq!(
        uri("/x/etc/passwd").await,
        "/etc/passwd",
        "dot segments never climb above the root"
    );
}
