//! Every kind of 429 tollgate writes carries the same headers: a limiter's (window, concurrency, full queue, its own page), a ban's, and an IP's probing of unknown keys; as problem+json for an API client and as a page for a browser.

mod common;

use std::time::Duration;

use common::{eventually, metric, send, Answer, Proxy, Upstream};

/// One route per kind of refusal; the upstream holds `/slow/<ms>` open so a
/// concurrency slot stays taken.
fn config(upstream: &Upstream) -> String {
    format!(
        r#"identity:
  api_keys: [alpha]
  unknown_keys: {{ limit: 1, window: 1d }}
upstreams:
  app: {{ url: "{}", timeout: 60s }}
limiters:
  strict: {{ limit: 1, window: 1d }}
  paged: {{ limit: 1, window: 1d, reject: {{ body: html }} }}
  guard: {{ limit: 1, window: 1d, ban: {{ after: 1, for: 1h }} }}
  pool: {{ algorithm: concurrency, max_in_flight: 1, key: global }}
  queue: {{ algorithm: leaky_bucket, capacity: 1, leak_per_second: 0.05, key: global }}
routes:
  - {{ name: strict, match: {{ path: /strict }}, respond: {{ status: 200, body: ok }}, limiters: [strict] }}
  - {{ name: paged, match: {{ path: /paged }}, respond: {{ status: 200, body: ok }}, limiters: [paged] }}
  - {{ name: guarded, match: {{ path: /guarded }}, respond: {{ status: 200, body: ok }}, limiters: [guard] }}
  - {{ name: queue, match: {{ path: /queue }}, respond: {{ status: 200, body: ok }}, limiters: [queue] }}
  - {{ name: pool, match: {{ path_prefix: /slow }}, upstream: app, limiters: [pool] }}
"#,
        upstream.url()
    )
}

/// A browser's navigation `Accept` (Chromium's).
const BROWSER: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";

/// A client that sends `accept` (if any) with every request.
fn client(accept: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(accept) = accept {
        headers.insert("accept", accept.parse().unwrap());
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// The headers every refusal carries, whatever refused it.
const COMMON: [&str; 4] = [
    "retry-after",
    "cache-control",
    "content-type",
    "x-request-id",
];

/// The rate-limit headers a refusal by a route's limiters adds.
const LIMITS: [&str; 5] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-policy",
    "ratelimit",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_429_carries_the_same_common_headers() {
    every_kind_of_429(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_429_a_browser_gets_is_a_page_with_the_same_headers() {
    every_kind_of_429(Some(BROWSER)).await;
}

/// Asks for each kind of 429 with `accept`: the headers are the same set
/// whether the body is problem+json or a page.
async fn every_kind_of_429(accept: Option<&str>) {
    let browser = accept.is_some();
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream)).await;
    let c = client(accept);
    let get = |path: &str| send(c.get(proxy.url(path)));

    assert_eq!(get("/strict").await.status, 200);
    let limited = get("/strict").await;

    assert_eq!(get("/paged").await.status, 200);
    let paged = get("/paged").await;

    // The first refusal strikes and starts the ban; the next is the ban's.
    assert_eq!(get("/guarded").await.status, 200);
    assert_eq!(get("/guarded").await.status, 429);
    let banned = get("/guarded").await;

    // One request holds the only slot at the upstream.
    let held = tokio::spawn(send(c.get(proxy.url("/slow/60000"))));
    upstream.seen.wait_for_in_flight().await;
    let concurrency = get("/slow/0").await;

    // One request goes at once, the next waits its turn (20 s at 0.05/s): the queue is full.
    assert_eq!(get("/queue").await.status, 200);
    let queued = tokio::spawn(send(c.get(proxy.url("/queue"))));
    let waiting = eventually(Duration::from_secs(5), || async {
        let text = proxy.metrics().await;
        metric(
            &text,
            "tollgate_limiter_decisions_total{limiter=\"queue\",result=\"delayed\"}",
        ) == Some(1.0)
    })
    .await;
    assert!(waiting, "the second request never queued");
    let queue_full = get("/queue").await;

    // The first unknown key is a 401; one more from the same IP is a 429.
    let unknown = |key: &'static str| send(c.get(proxy.url("/strict")).header("x-client-key", key));
    assert_eq!(unknown("nope-1").await.status, 401);
    let probing = unknown("nope-2").await;

    let kinds: [(&str, &Answer, &str, bool); 6] = [
        ("rate limit", &limited, "rate-limit-exceeded", true),
        ("a limiter's page", &paged, "", true),
        ("ban", &banned, "client-banned", false),
        ("concurrency", &concurrency, "rate-limit-exceeded", true),
        ("queue full", &queue_full, "rate-limit-exceeded", true),
        ("unknown keys", &probing, "unknown-api-keys-exceeded", false),
    ];
    for (kind, answer, problem, by_limiters) in kinds {
        assert_refusal(kind, answer, problem, by_limiters, browser);
    }
    held.abort();
    queued.abort();
}

/// `answer`, a refusal of `kind`: a 429 with the common headers, the
/// limiters' headers when `by_limiters`, and a page (a limiter's own, or
/// for a `browser`) or else the `problem` as problem+json.
fn assert_refusal(kind: &str, answer: &Answer, problem: &str, by_limiters: bool, browser: bool) {
    assert_eq!(answer.status, 429, "{kind}: {}", answer.body);
    for name in COMMON {
        assert!(
            answer.headers.contains_key(name),
            "{kind} lacks {name}: {:?}",
            answer.headers
        );
    }
    let retry: u64 = answer.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1, "{kind}: Retry-After {retry}");
    assert_eq!(answer.headers["cache-control"], "no-store", "{kind}");
    for name in LIMITS {
        assert_eq!(
            answer.headers.contains_key(name),
            by_limiters,
            "{kind}: {name}"
        );
    }
    let id = answer.headers["x-request-id"].to_str().unwrap();
    // Negotiated answers say so to caches; a limiter's own page is the same for everyone.
    // (`Accept-Encoding` is compression's own, on every compressible answer.)
    let vary: Vec<_> = answer.headers.get_all("vary").iter().collect();
    assert_eq!(
        vary.iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"accept")),
        !problem.is_empty(),
        "{kind}: {vary:?}"
    );
    if problem.is_empty() || browser {
        assert_eq!(
            answer.headers["content-type"], "text/html; charset=utf-8",
            "{kind}"
        );
        assert!(
            answer.body.contains(id),
            "{kind}: the page names the request"
        );
        assert!(
            answer.body.contains("Please wait"),
            "{kind}: the page says when to retry: {}",
            answer.body
        );
    } else {
        assert_eq!(
            answer.headers["content-type"], "application/problem+json",
            "{kind}"
        );
        let body = answer.json();
        assert_eq!(body["type"], problem, "{kind}");
        assert_eq!(body["request_id"], id, "{kind}");
    }
}
