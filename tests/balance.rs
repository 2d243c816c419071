//! Several servers per upstream over real sockets: round robin, least_conn, a server killed and back, max_conns with its queue.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{client, eventually, get_json, Proxy, Upstream};

/// One upstream `app` over `servers`, with `extra` keys on it, for every path.
fn balanced(servers: &[&Upstream], extra: &str) -> String {
    let list: Vec<String> = servers.iter().map(|s| format!("\"{}\"", s.url())).collect();
    format!(
        "upstreams:\n  app: {{ servers: [{}]{extra} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        list.join(", ")
    )
}

fn served(u: &Upstream) -> usize {
    u.seen.requests.load(Ordering::SeqCst)
}

/// The `/upstreams` admin answer for server `i` of upstream `app`.
async fn server_state(proxy: &Proxy, i: usize) -> serde_json::Value {
    let v = get_json(&client(), &proxy.admin_url("/upstreams")).await;
    v["upstreams"][0]["servers"][i].clone()
}

#[tokio::test]
async fn round_robin_sends_each_server_its_turn() {
    let (a, b, c) = (
        Upstream::start().await,
        Upstream::start().await,
        Upstream::start().await,
    );
    let proxy = Proxy::start(&balanced(&[&a, &b, &c], ", balance: round_robin")).await;
    let http = client();
    for i in 0..30 {
        let r = http
            .get(proxy.url(&format!("/r/{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!((served(&a), served(&b), served(&c)), (10, 10, 10));
}

#[tokio::test]
async fn least_conn_sends_new_requests_to_the_server_that_is_not_busy() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let proxy = Proxy::start(&balanced(&[&a, &b], ", balance: least_conn")).await;
    let http = client();
    let slow = tokio::spawn({
        let (http, url) = (http.clone(), proxy.url("/slow/2000"));
        async move { http.get(url).send().await.unwrap().status() }
    });
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.seen.in_flight.load(Ordering::SeqCst) + b.seen.in_flight.load(Ordering::SeqCst) == 1
        })
        .await,
        "the slow request reaches a server"
    );
    let (busy, idle) = if a.seen.in_flight.load(Ordering::SeqCst) == 1 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    for i in 0..8 {
        let r = http
            .get(proxy.url(&format!("/r/{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // Round robin would have sent four of these to the busy one.
    assert_eq!(served(busy), 1, "least_conn sent work to the busy server");
    assert_eq!(served(idle), 8);
    assert_eq!(slow.await.unwrap(), 200);
}

#[tokio::test]
async fn a_killed_server_costs_no_more_errors_than_max_fails_and_comes_back_after_fail_timeout() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let b_addr = b.addr;
    let proxy = Proxy::start(&balanced(&[&a, &b], ", max_fails: 1, fail_timeout: 1s")).await;
    let http = client();
    let mut errors = 0;
    for i in 0..60 {
        if i == 20 {
            b.kill();
        }
        // POSTs are never retried, so every failure on the dead server shows.
        let r = http
            .post(proxy.url(&format!("/r/{i}")))
            .body("x")
            .send()
            .await
            .unwrap();
        if r.status().is_server_error() {
            errors += 1;
        }
    }
    assert!(errors <= 1, "{errors} 5xx answers; max_fails is 1");
    let state = server_state(&proxy, 1).await;
    assert_eq!(state["state"], "down", "{state}");
    let before = served(&a);
    assert!(before >= 49, "the live server took the rest: {before}");

    // Back on the same port; after fail_timeout it gets its share again. The
    // proxy's own view says when that is: it shows the server up once
    // fail_timeout has passed. (fail_timeout stays 1 s: the 40 requests after
    // the kill must fit in it, or a slow machine would see a second error.)
    drop(b);
    let b = Upstream::start_on(b_addr).await;
    let back = eventually(Duration::from_secs(10), || async {
        server_state(&proxy, 1).await["state"] == "up"
    })
    .await;
    assert!(back, "{}", server_state(&proxy, 1).await);
    for i in 0..10 {
        let r = http
            .get(proxy.url(&format!("/back/{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    assert!(
        served(&b) >= 4,
        "the revived server got {} of 10",
        served(&b)
    );
    assert_eq!(server_state(&proxy, 1).await["state"], "up");
}

#[tokio::test]
async fn a_get_to_a_dead_server_is_retried_on_the_next_one() {
    let a = Upstream::start().await;
    let dead = Upstream::start().await;
    dead.kill();
    // max_fails: 0 keeps the dead one in rotation, so every second request meets it.
    let proxy = Proxy::start(&balanced(&[&a, &dead], ", max_fails: 0")).await;
    let http = client();
    for i in 0..10 {
        let r = http
            .get(proxy.url(&format!("/r/{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "request {i}");
    }
    assert_eq!(served(&a), 10);
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("tollgate_upstream_retries_total{upstream=\"app\"} 5"),
        "{metrics}"
    );
}

#[tokio::test]
async fn max_conns_queues_the_third_request_and_refuses_the_overflow_with_retry_after() {
    let a = Upstream::start().await;
    let proxy = Proxy::start(&balanced(
        &[&a],
        ", max_conns: 2, queue: 1, queue_timeout: 10s",
    ))
    .await;
    let http = client();
    let slow = |path: &str| {
        let (http, url) = (http.clone(), proxy.url(path));
        tokio::spawn(async move { http.get(url).send().await.unwrap().status() })
    };
    let first = [slow("/slow/1500"), slow("/slow/1500")];
    assert!(
        eventually(Duration::from_secs(5), || async {
            a.seen.in_flight.load(Ordering::SeqCst) == 2
        })
        .await,
        "two requests at the server"
    );
    let queued = slow("/queued");
    assert!(
        eventually(Duration::from_secs(5), || async {
            proxy.app.snapshot().upstreams[0].waiting() == 1
        })
        .await,
        "the third request waits in the queue"
    );
    assert_eq!(
        served(&a),
        2,
        "the queued request must not reach the server yet"
    );

    let r = http.get(proxy.url("/overflow")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(body["type"], "upstream-busy", "{body}");

    for f in first {
        assert_eq!(f.await.unwrap(), 200);
    }
    assert_eq!(queued.await.unwrap(), 200);
    assert_eq!(a.seen.max_in_flight.load(Ordering::SeqCst), 2);
    assert_eq!(served(&a), 3);
}

#[tokio::test]
async fn a_queued_request_gives_up_after_queue_timeout() {
    let a = Upstream::start().await;
    let proxy = Proxy::start(&balanced(
        &[&a],
        ", max_conns: 1, queue: 5, queue_timeout: 300ms",
    ))
    .await;
    let http = client();
    let busy = tokio::spawn({
        let (http, url) = (http.clone(), proxy.url("/slow/3000"));
        async move { http.get(url).send().await.unwrap().status() }
    });
    a.seen.wait_for_in_flight().await;
    let r = http.get(proxy.url("/late")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(served(&a), 1);
    assert_eq!(busy.await.unwrap(), 200);
}

#[tokio::test]
async fn an_active_health_check_takes_a_failing_server_out_and_puts_it_back() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    // The stub answers /big/0 with 200; a killed server fails the check.
    let proxy = Proxy::start(&balanced(
        &[&a, &b],
        ", max_fails: 0, health: { path: /big/0, interval: 100ms }",
    ))
    .await;
    let b_addr = b.addr;
    b.kill();
    assert!(
        eventually(Duration::from_secs(5), || async {
            let snap = proxy.app.snapshot();
            let u = &snap.upstreams[0];
            !u.is_up(&u.servers[1], std::time::Instant::now())
        })
        .await,
        "the check marks b down"
    );
    let http = client();
    for i in 0..6 {
        let r = http
            .post(proxy.url(&format!("/r/{i}")))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            200,
            "a server marked down by its check gets no request"
        );
    }
    drop(b);
    let b = Upstream::start_on(b_addr).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            let snap = proxy.app.snapshot();
            let u = &snap.upstreams[0];
            u.is_up(&u.servers[1], std::time::Instant::now())
        })
        .await,
        "the check puts b back"
    );
    let before = served(&b);
    for i in 0..6 {
        http.get(proxy.url(&format!("/again/{i}")))
            .send()
            .await
            .unwrap();
    }
    // Checks hit b too; at least its three requests arrived.
    assert!(served(&b) >= before + 3);
}
