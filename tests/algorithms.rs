//! Every algorithm end to end: concurrency slots, shadow mode, overrides, keys (leaky-bucket shaping, which takes time, is tested in virtual time in app_time.rs).

mod common;

use common::T0;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{client, Proxy, Upstream};
use tollgate::clock::ManualClock;

fn upstream_yaml(upstream: &Upstream, limiters: &str, route_limiters: &str) -> String {
    format!(
        "upstreams:\n  app: {{ url: \"{}\", timeout: 5s }}\nlimiters:\n{limiters}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app, limiters: [{route_limiters}] }}\n",
        upstream.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_caps_requests_in_flight_and_frees_slots_when_bodies_end() {
    let upstream = Upstream::start().await;
    let yaml = upstream_yaml(
        &upstream,
        "  pool: { algorithm: concurrency, max_in_flight: 2, key: global }",
        "pool",
    );
    let proxy = Proxy::start(&yaml).await;
    let c = client();
    let mut statuses = common::burst(&c, &proxy.url("/slow/400"), 5).await;
    statuses.sort();
    assert_eq!(statuses, vec![200, 200, 429, 429, 429]);
    assert!(upstream.seen.max_in_flight.load(Ordering::SeqCst) <= 2);
    // Both slots are free again once the responses were read.
    for _ in 0..3 {
        assert_eq!(common::status(&c, &proxy.url("/fast"), &[]).await, 200);
    }
}

#[tokio::test]
async fn a_concurrency_slot_is_freed_when_the_upstream_fails_or_the_client_leaves() {
    let dead = common::free_addr();
    let upstream = Upstream::start().await;
    let yaml = format!(
        "upstreams:\n  dead: {{ url: \"http://{dead}\" }}\n  app: {{ url: \"{}\" }}\nlimiters:\n  one: {{ algorithm: concurrency, max_in_flight: 1, key: global }}\nroutes:\n  - {{ name: dead, match: {{ path_prefix: /dead }}, upstream: dead, limiters: [one] }}\n  - {{ name: app, match: {{ path_prefix: / }}, upstream: app, limiters: [one] }}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(common::status(&c, &proxy.url("/dead"), &[]).await, 502);
    }
    // A client that gives up while its request is at the upstream frees the
    // slot then, not when the upstream would have finished 10 s later.
    let left_at = std::time::Instant::now();
    let gone = tokio::time::timeout(
        Duration::from_millis(200),
        c.get(proxy.url("/slow/10000")).send(),
    )
    .await;
    assert!(gone.is_err());
    assert!(
        common::eventually(Duration::from_secs(5), || async {
            common::status(&client(), &proxy.url("/x"), &[]).await == 200
        })
        .await,
        "the slot stayed taken after the client left"
    );
    assert!(
        left_at.elapsed() < Duration::from_secs(9),
        "freed by the client leaving, not by the upstream ending"
    );
}

#[tokio::test]
async fn shadow_mode_counts_and_reports_but_never_rejects() {
    let yaml = "
limiters:
  trial: { limit: 1, window: 60s, mode: shadow }
routes:
  - { name: r, match: { path: /r }, respond: { status: 200 }, limiters: [trial] }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let c = client();
    for _ in 0..3 {
        let r = c.get(proxy.url("/r")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
    }
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(
            "tollgate_limiter_decisions_total{limiter=\"trial\",result=\"would_reject\"} 2"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_override_gives_one_api_key_its_own_quota() {
    // A key is a client only once it is verified: both are listed.
    let yaml = "
identity: { api_keys: [premium-key, basic-key] }
limiters:
  tier: { limit: 1, window: 60s, key: client, overrides: [{ key: premium-key, limit: 3 }] }
routes:
  - { name: r, match: { path: /r }, respond: { status: 200 }, limiters: [tier] }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let c = client();
    let send = |key: &'static str| c.get(proxy.url("/r")).header("x-client-key", key).send();
    let premium: Vec<u16> = [
        send("premium-key").await.unwrap().status().as_u16(),
        send("premium-key").await.unwrap().status().as_u16(),
        send("premium-key").await.unwrap().status().as_u16(),
        send("premium-key").await.unwrap().status().as_u16(),
    ]
    .to_vec();
    assert_eq!(premium, vec![200, 200, 200, 429]);
    assert_eq!(send("basic-key").await.unwrap().status(), 200);
    let r = send("basic-key").await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-ratelimit-limit"], "1");
}

#[tokio::test]
async fn a_limiter_keyed_on_a_missing_part_does_not_apply() {
    let yaml = "
limiters:
  per_key: { limit: 1, window: 60s, key: api_key }
  per_tenant: { limit: 1, window: 60s, key: \"header:X-Tenant\" }
routes:
  - { name: r, match: { path: /r }, respond: { status: 200 }, limiters: [per_key, per_tenant] }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let c = client();
    for _ in 0..3 {
        let r = c.get(proxy.url("/r")).send().await.unwrap();
        assert_eq!(
            r.status(),
            200,
            "no API key and no tenant: neither limiter applies"
        );
        assert!(!r.headers().contains_key("x-ratelimit-limit"));
    }
    assert_eq!(
        common::status(&c, &proxy.url("/r"), &[("x-tenant", "acme")]).await,
        200
    );
    assert_eq!(
        common::status(&c, &proxy.url("/r"), &[("x-tenant", "acme")]).await,
        429
    );
    assert_eq!(
        common::status(&c, &proxy.url("/r"), &[("x-tenant", "other")]).await,
        200
    );
}

#[tokio::test]
async fn a_token_bucket_rejected_by_another_limiter_keeps_its_tokens() {
    let yaml = "
limiters:
  strict: { limit: 1, window: 60s }
  burst: { algorithm: token_bucket, capacity: 5, refill_per_second: 1 }
routes:
  - { name: r, match: { path: /r }, respond: { status: 200 }, limiters: [strict, burst] }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let c = client();
    let first = c.get(proxy.url("/r")).send().await.unwrap();
    assert_eq!(
        first.headers()["ratelimit-policy"],
        "\"strict\";q=1;w=60, \"burst\";q=5;w=5"
    );
    for _ in 0..3 {
        assert_eq!(common::status(&c, &proxy.url("/r"), &[]).await, 429);
    }
    let status: serde_json::Value =
        common::get_json(&c, &proxy.admin_url("/status?key=127.0.0.1")).await;
    let burst = status["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limiter"] == "burst")
        .unwrap()
        .clone();
    assert_eq!(
        burst["remaining"], 4,
        "only the admitted request paid a token: {status}"
    );
    let strict = status["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limiter"] == "strict")
        .unwrap()
        .clone();
    assert_eq!(strict["remaining"], 0);
}

#[tokio::test]
async fn the_readme_multi_dimension_example_applies_all_four_limits() {
    let upstream = Upstream::start().await;
    let yaml = include_str!("../docs/examples/multi-dimension.yaml")
        .replace("http://127.0.0.1:9000", &upstream.url());
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let c = client();
    let keyed = c
        .get(proxy.url("/api/x"))
        .header("x-client-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(
        keyed.headers()["ratelimit-policy"],
        "\"per_ip\";q=100;w=60, \"per_key\";q=200;w=60, \"per_route\";q=1000;w=1, \"global\";q=10000;w=1"
    );
    assert_eq!(
        keyed.headers()["x-ratelimit-remaining"],
        "99",
        "per_ip is the tightest"
    );
    let anonymous = c.get(proxy.url("/api/x")).send().await.unwrap();
    assert_eq!(
        anonymous.headers()["ratelimit-policy"],
        "\"per_ip\";q=100;w=60, \"per_route\";q=1000;w=1, \"global\";q=10000;w=1"
    );
    for _ in 0..98 {
        assert_eq!(common::status(&c, &proxy.url("/api/x"), &[]).await, 200);
    }
    let limited = c
        .get(proxy.url("/api/x"))
        .header("x-client-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(limited.status(), 429);
    assert_eq!(limited.headers()["x-ratelimit-limit"], "100");
}
