//! What operators see, over real sockets: access records, request ids, metrics and shaped rejections.

mod common;

use std::time::Duration;

use common::{free_addr, AccessCapture, Proxy, Upstream};
use serde_json::Value;

const KEY: &str = "s3cret-key-0123456789";
const WRONG_KEY: &str = "wrong-secret-9876543210";

async fn every_kind_yaml(up: &Upstream, slow: &Upstream) -> String {
    let down = free_addr();
    format!(
        r#"
log: {{ format: json }}
server: {{ max_request_body: 1KiB }}
identity:
  api_keys: ["{KEY}"]
upstreams:
  app: {{ url: "{}" }}
  down: {{ url: "http://{down}", connect_timeout: 500ms }}
  slow: {{ url: "{}", timeout: 200ms }}
limiters:
  strict: {{ algorithm: fixed_window, limit: 1, window: 1h, key: client }}
routes:
  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: "pong\n" }}, limiters: [strict] }}
  - {{ name: app, match: {{ path_prefix: /app }}, upstream: app }}
  - {{ name: down, match: {{ path_prefix: /down }}, upstream: down }}
  - {{ name: slow, match: {{ path_prefix: /slow }}, upstream: slow }}
"#,
        up.url(),
        slow.url()
    )
}

/// Finds the one record with `id`, failing if there is none or more than one.
fn one_record<'a>(records: &'a [Value], id: &str) -> &'a Value {
    let found: Vec<&Value> = records.iter().filter(|r| r["request_id"] == id).collect();
    assert_eq!(
        found.len(),
        1,
        "records for {id}: {found:?}\nall: {records:#?}"
    );
    found[0]
}

/// Sends one request; returns its status, its X-Request-Id and its body.
async fn send(req: reqwest::RequestBuilder) -> (u16, String, String) {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let id = r
        .headers()
        .get("x-request-id")
        .expect("every response carries X-Request-Id")
        .to_str()
        .unwrap()
        .to_string();
    (status, id, r.text().await.unwrap())
}

/// One request of each kind of response, in order: upstream 200, respond
/// 200 then 429, 401, 404, 413, 502, 504. Each one's status, id and body.
async fn send_every_kind(c: &reqwest::Client, proxy: &Proxy) -> Vec<(u16, String, String)> {
    let mut sent: Vec<(u16, String, String)> = Vec::new();
    // upstream 200, with a secret in the query that must not be logged
    sent.push(
        send(
            c.get(proxy.url(&format!("/app/x?token={KEY}")))
                .header("x-client-key", KEY),
        )
        .await,
    );
    // respond 200, then 429 (limit 1 per client)
    sent.push(send(c.get(proxy.url("/ping"))).await);
    sent.push(send(c.get(proxy.url("/ping"))).await);
    // 401 unknown key, 404 no route, 413 declared body too large
    sent.push(send(c.get(proxy.url("/app")).header("x-client-key", WRONG_KEY)).await);
    sent.push(send(c.get(proxy.url("/nowhere"))).await);
    sent.push(send(c.post(proxy.url("/app")).body(vec![b'x'; 4096])).await);
    // 502 unreachable upstream, 504 upstream too slow
    sent.push(send(c.get(proxy.url("/down"))).await);
    sent.push(send(c.get(proxy.url("/slow/2000"))).await);
    sent
}

/// Each sent request's one record has its status, every common field, a
/// client (but for 413), its body's length, and an error body that names it.
fn assert_every_record_has_its_fields(records: &[Value], sent: &[(u16, String, String)]) {
    for (status, id, body) in sent {
        let r = one_record(records, id);
        assert_eq!(r["status"], *status, "{r}");
        for field in [
            "ts",
            "ip",
            "method",
            "path",
            "decision",
            "duration_ms",
            "bytes_out",
            "proto",
        ] {
            assert!(!r[field].is_null(), "{field} missing in {r}");
        }
        // A declared body over the limit is refused before the client is identified.
        assert_eq!(r["client"].is_null(), *status == 413, "{r}");
        assert_eq!(r["bytes_out"], body.len(), "{r}");
        if *status >= 400 {
            let problem: Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                problem["request_id"], *id,
                "every error body names the request"
            );
        }
    }
}

#[tokio::test]
async fn every_response_kind_leaves_exactly_one_access_record_with_its_fields() {
    let up = Upstream::start().await;
    let slow = Upstream::start().await;
    let proxy = Proxy::start(&every_kind_yaml(&up, &slow).await).await;
    let log = AccessCapture::attach(&proxy);
    let c = common::client();

    let sent = send_every_kind(&c, &proxy).await;
    let statuses: Vec<u16> = sent.iter().map(|s| s.0).collect();
    assert_eq!(statuses, [200, 200, 429, 401, 404, 413, 502, 504]);
    let records = log.wait_records(sent.len()).await;
    assert_eq!(records.len(), sent.len(), "{records:#?}");

    assert_every_record_has_its_fields(&records, &sent);
    let by_status = |s: u16| one_record(&records, &sent.iter().find(|x| x.0 == s).unwrap().1);

    let ok = one_record(&records, &sent[0].1);
    assert_eq!(ok["route"], "app");
    assert_eq!(ok["decision"], "allowed");
    assert_eq!(ok["upstream"], "app");
    assert!(ok["upstream_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(ok["path"], "/app/x", "the query is not logged");
    assert!(ok["client"].as_str().unwrap().starts_with("key:"));
    assert_eq!(
        ok["ts"].as_str().unwrap().len(),
        "2026-01-01T00:00:00.000Z".len()
    );

    let rejected = by_status(429);
    assert_eq!(rejected["decision"], "rejected");
    assert_eq!(rejected["limiter"], "strict");
    assert!(rejected["retry_after"].as_u64().unwrap() >= 1);
    assert!(rejected["upstream"].is_null());

    for s in [401, 404, 413] {
        assert_eq!(by_status(s)["decision"], "error", "{}", by_status(s));
    }
    assert!(by_status(404)["route"].is_null());
    assert_eq!(by_status(502)["upstream"], "down");
    assert_eq!(by_status(504)["upstream"], "slow");
    assert!(by_status(504)["upstream_ms"].as_f64().unwrap() >= 150.0);
    // Where each problem came from; an answer tollgate did not make has none.
    assert!(ok["error_origin"].is_null(), "{ok}");
    assert!(one_record(&records, &sent[1].1)["error_origin"].is_null());
    for s in [429, 401, 404, 413] {
        assert_eq!(
            by_status(s)["error_origin"],
            "downstream",
            "{}",
            by_status(s)
        );
    }
    for s in [502, 504] {
        assert_eq!(by_status(s)["error_origin"], "upstream", "{}", by_status(s));
    }

    for line in log.lines() {
        assert!(!line.contains(KEY), "a raw API key was logged: {line}");
        assert!(
            !line.contains(WRONG_KEY),
            "a raw API key was logged: {line}"
        );
    }
}

#[tokio::test]
async fn an_access_record_waits_for_the_end_of_a_streamed_body_and_counts_its_bytes() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&format!(
        "upstreams: {{ app: {{ url: \"{}\" }} }}\nroutes: [{{ name: app, match: {{ path_prefix: / }}, upstream: app }}]\n",
        up.url()
    ))
    .await;
    let log = AccessCapture::attach(&proxy);
    let body = common::client()
        .get(proxy.url("/big/300000"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), 300_000);
    let lines = log.wait_lines(1).await;
    assert_eq!(lines.len(), 1);
    // Text, the default: nginx's combined format, then the limiter's fields.
    let line = &lines[0];
    assert!(line.starts_with("127.0.0.1 - ip:127.0.0.1 ["), "{line}");
    assert!(
        line.contains("] \"GET /big/300000 HTTP/1.1\" 200 300000 \"-\" \""),
        "{line}"
    );
    assert!(
        line.contains(
            " route=app decision=allowed limiter=- retry_after=- upstream=app upstream_ms="
        ),
        "{line}"
    );
}

#[tokio::test]
async fn a_stalled_log_writer_neither_blocks_requests_nor_grows_its_queue() {
    let proxy = Proxy::start(
        "log: { format: json }\nroutes: [{ name: ping, match: { path: /ping }, respond: { status: 200 } }]\n",
    )
    .await;
    // A sink that blocks the writer until released: a log on a stuck disk.
    let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    struct Stalled(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl std::io::Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            while self.0.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    proxy
        .app
        .shared
        .access
        .redirect(Box::new(Stalled(stalled.clone())));

    let total = tollgate::access::QUEUE + tollgate::access::BATCH + 600;
    let c = common::client();
    let url = proxy.url("/ping");
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for chunk in 0..32 {
        let (c, url) = (c.clone(), url.clone());
        let n = total / 32 + usize::from(chunk < total % 32);
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..n {
                ok += usize::from(c.get(&url).send().await.unwrap().status() == 200);
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    assert_eq!(
        ok, total,
        "every request was answered while the log was stuck"
    );
    // The queue holds QUEUE records and the writer's batch at most BATCH;
    // all others were dropped, not kept.
    let dropped = proxy.app.shared.access.dropped();
    assert!(
        dropped as usize >= total - tollgate::access::QUEUE - tollgate::access::BATCH,
        "dropped {dropped} of {total} in {:?}",
        started.elapsed()
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains(&format!("tollgate_access_log_dropped_total {dropped}")),
        "{metrics}"
    );

    // Unstuck, the log catches up and new requests are logged again.
    // (Released first: the writer holds the sink while it is stuck in it.)
    stalled.store(false, std::sync::atomic::Ordering::SeqCst);
    let log = AccessCapture::default();
    proxy.app.shared.access.redirect(Box::new(log.clone()));
    // The queue is full when the writer comes back, so a request sent
    // before it drained may still be dropped; soon one is logged.
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            let (_, id, _) = send(c.get(&url)).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            log.lines().iter().any(|l| l.contains(&id))
        })
        .await,
        "the log never caught up"
    );
}

#[tokio::test]
async fn a_trusted_peers_request_id_is_kept_end_to_end_and_an_untrusted_ones_replaced() {
    let up = Upstream::start().await;
    let yaml = |trusted: &str| {
        format!(
            "log: {{ format: json }}\nidentity: {{ trusted_proxies: [{trusted}] }}\nupstreams: {{ app: {{ url: \"{}\" }} }}\nroutes: [{{ name: app, match: {{ path_prefix: / }}, upstream: app }}]\n",
            up.url()
        )
    };
    let proxy = Proxy::start(&yaml("127.0.0.1/32")).await;
    let log = AccessCapture::attach(&proxy);
    let c = common::client();
    let (status, id, _) = send(c.get(proxy.url("/a")).header("x-request-id", "lb-7f3a.1")).await;
    assert_eq!((status, id.as_str()), (200, "lb-7f3a.1"));
    let seen = up.seen.last_headers.lock().clone().unwrap();
    assert_eq!(
        seen["x-request-id"], "lb-7f3a.1",
        "the upstream sees the same id"
    );
    // Malformed, even from a trusted peer: replaced.
    let (_, replaced, _) = send(c.get(proxy.url("/b")).header("x-request-id", "has space")).await;
    assert_ne!(replaced, "has space");
    let records = log.wait_records(2).await;
    one_record(&records, "lb-7f3a.1");
    one_record(&records, &replaced);

    // The audit table has the id too.
    let dir = proxy.stop().await;
    let conn = rusqlite::Connection::open(dir.path().join("tollgate.db")).unwrap();
    let ids: Vec<String> = conn
        .prepare("SELECT request_id FROM api_calls ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ids, vec!["lb-7f3a.1".to_string(), replaced]);

    let proxy = Proxy::start(&yaml("")).await;
    let (_, id, _) = send(
        c.get(proxy.url("/a"))
            .header("x-request-id", "forged-by-client"),
    )
    .await;
    assert_ne!(
        id, "forged-by-client",
        "an untrusted client cannot choose the id"
    );
    let seen = up.seen.last_headers.lock().clone().unwrap();
    assert_eq!(seen["x-request-id"], id.as_str());
}

#[tokio::test]
async fn histograms_and_status_counters_follow_known_traffic() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&format!(
        r#"
identity: {{ exempt: ["10.9.9.9/32"] }}
upstreams: {{ app: {{ url: "{}" }} }}
limiters: {{ three: {{ algorithm: fixed_window, limit: 3, window: 1h, key: client }} }}
routes:
  - {{ name: api, match: {{ path_prefix: /api }}, upstream: app, limiters: [three] }}
"#,
        up.url()
    ))
    .await;
    let c = common::client();
    let statuses = common::burst(&c, &proxy.url("/api/x"), 5).await;
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 3);
    assert_eq!(common::status(&c, &proxy.url("/other"), &[]).await, 404);
    let m = proxy.metrics().await;
    for want in [
        "tollgate_request_duration_seconds_count{route=\"api\",decision=\"allowed\"} 3",
        "tollgate_request_duration_seconds_count{route=\"api\",decision=\"rejected\"} 2",
        "tollgate_request_duration_seconds_bucket{route=\"api\",decision=\"allowed\",le=\"+Inf\"} 3",
        "tollgate_request_duration_seconds_count{route=\"(none)\",decision=\"error\"} 1",
        "tollgate_responses_total{route=\"api\",status=\"200\"} 3",
        "tollgate_responses_total{route=\"api\",status=\"429\"} 2",
        "tollgate_responses_total{route=\"(none)\",status=\"404\"} 1",
        "tollgate_upstream_duration_seconds_count{upstream=\"app\"} 3",
        "tollgate_in_flight_requests 0",
        "# TYPE tollgate_open_connections gauge",
        "tollgate_build_info{version=\"",
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE tollgate_audit_dropped_total counter",
    ] {
        assert!(m.contains(want), "missing {want:?} in\n{m}");
    }
    // `*_total` only on counters.
    for line in m.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split_whitespace().skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        assert_eq!(name.ends_with("_total"), kind == "counter", "{line}");
    }
}

#[tokio::test]
async fn an_exempt_request_is_counted_once_as_exempt() {
    let proxy = Proxy::start(
        r#"
identity: { exempt: ["127.0.0.1/32"] }
limiters: { one: { algorithm: fixed_window, limit: 1, window: 1h, key: client } }
routes: [{ name: ping, match: { path: /ping }, respond: { status: 200 }, limiters: [one] }]
"#,
    )
    .await;
    let log = AccessCapture::attach(&proxy);
    let c = common::client();
    assert_eq!(
        common::burst(&c, &proxy.url("/ping"), 3).await,
        [200, 200, 200]
    );
    let m = proxy.metrics().await;
    assert!(
        m.contains("tollgate_requests_total{route=\"ping\",decision=\"exempt\"} 3"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_requests_total{route=\"ping\",decision=\"allowed\"} 0"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_request_duration_seconds_count{route=\"ping\",decision=\"exempt\"} 3"),
        "{m}"
    );
    let lines = log.wait_lines(3).await;
    assert!(
        lines.iter().all(|l| l.contains("decision=exempt")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn the_metrics_page_passes_promtool_check_metrics() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&format!(
        r#"
upstreams: {{ app: {{ url: "{}" }}, down: {{ url: "http://{}" }} }}
limiters: {{ two: {{ algorithm: fixed_window, limit: 2, window: 1h, key: client }}, trial: {{ algorithm: fixed_window, limit: 1, window: 1h, key: client, mode: shadow }} }}
routes:
  - {{ name: api, match: {{ path_prefix: /api }}, upstream: app, limiters: [two, trial] }}
  - {{ name: down, match: {{ path_prefix: /down }}, upstream: down }}
"#,
        up.url(),
        free_addr()
    ))
    .await;
    let c = common::client();
    common::burst(&c, &proxy.url("/api"), 4).await;
    common::burst(&c, &proxy.url("/down"), 1).await;
    common::burst(&c, &proxy.url("/nope"), 1).await;
    let text = proxy.metrics().await;
    assert!(text.contains("decision=\"shadow_rejected\"} 1"), "{text}");
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (Debian: prometheus)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool:\n{report}\n{text}"
    );
}

#[tokio::test]
async fn a_limiter_can_answer_503_with_an_html_page_and_a_route_choose_its_headers() {
    let proxy = Proxy::start(
        r#"
limiters:
  logins:
    algorithm: fixed_window
    limit: 1
    window: 1h
    key: ip
    reject: { status: 503, body: html }
  api:
    algorithm: fixed_window
    limit: 1
    window: 1h
    key: ip
    reject: { template: "{\"wait\": {{retry_after}}, \"id\": \"{{request_id}}\", \"by\": \"{{limiter}}\"}", content_type: application/json }
routes:
  - { name: wp, match: { path: /wp-login.php }, respond: { status: 200 }, limiters: [logins], rate_limit_headers: none }
  - { name: api, match: { path: /api }, respond: { status: 200 }, limiters: [api], rate_limit_headers: draft }
  - { name: both, match: { path: /both }, respond: { status: 200 }, limiters: [logins], rate_limit_headers: x-ratelimit, reject: { status: 429 } }
"#,
    )
    .await;
    let c = common::client();
    let first = c.get(proxy.url("/wp-login.php")).send().await.unwrap();
    assert!(first.headers().get("x-ratelimit-limit").is_none());
    assert!(first.headers().get("ratelimit").is_none());
    let page = c.get(proxy.url("/wp-login.php")).send().await.unwrap();
    assert_eq!(page.status(), 503);
    assert!(
        page.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let id = page.headers()["x-request-id"].to_str().unwrap().to_string();
    let html = page.text().await.unwrap();
    assert!(
        html.contains("Too many attempts") && html.contains(&id),
        "{html}"
    );

    let ok = c.get(proxy.url("/api")).send().await.unwrap();
    assert!(ok.headers().get("x-ratelimit-limit").is_none());
    assert_eq!(ok.headers()["ratelimit-policy"], "\"api\";q=1;w=3600");
    let shaped = c.get(proxy.url("/api")).send().await.unwrap();
    assert_eq!(shaped.status(), 429);
    assert_eq!(shaped.headers()["content-type"], "application/json");
    let id = shaped.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&shaped.text().await.unwrap()).unwrap();
    assert_eq!(v["id"], id);
    assert_eq!(v["by"], "api");
    assert!(v["wait"].as_u64().unwrap() >= 1);

    // The route's `reject` wins over the limiter's: same limiter, 429 problem+json here.
    let r = c.get(proxy.url("/both")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("ratelimit").is_none());
    assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[test]
fn with_log_format_json_every_line_the_binary_writes_is_one_json_object() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "log: { format: json }\nroutes: [{ name: ping, match: { path: /ping }, respond: { status: 200 } }]\n";
    let mut p = common::Process::serve(yaml, dir.path());
    assert_eq!(common::http(p.addr, "GET", "/ping").unwrap().status, 200);
    // Two problems at once: the rejection used to be a multi-line record.
    let config = dir.path().join("tollgate.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}\nbogus: 1\nlimiters: {{ x: {{ algorithm: nope }} }}\n"),
    )
    .unwrap();
    assert_eq!(
        common::http(p.admin, "POST", "/reload").unwrap().status,
        422
    );
    assert_eq!(common::http(p.addr, "GET", "/ping").unwrap().status, 200);
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(15)).success());
    let out = p.output();
    let records: Vec<Value> = out
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not one JSON line ({e}): {l}\n{out}"))
        })
        .collect();
    assert_eq!(
        records.iter().filter(|r| r["log"] == "access").count(),
        2,
        "{out}"
    );
    let rejected = records
        .iter()
        .find(|r| {
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("reload rejected"))
        })
        .unwrap_or_else(|| panic!("no reload error in\n{out}"));
    assert_eq!(rejected["level"], "ERROR");
}

#[tokio::test]
async fn a_fail_closed_store_error_is_logged_and_counted_as_store_error() {
    let redis = free_addr();
    let proxy = Proxy::start(&format!(
        r#"
log: {{ format: json }}
store: {{ backend: redis, url: "redis://{redis}/0", timeout: 200ms, on_error: deny }}
limiters: {{ l: {{ algorithm: fixed_window, limit: 5, window: 1h, key: client }} }}
routes: [{{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200 }}, limiters: [l] }}]
"#
    ))
    .await;
    let log = AccessCapture::attach(&proxy);
    let (status, id, body) = send(common::client().get(proxy.url("/ping"))).await;
    assert_eq!(status, 503);
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["request_id"], id.as_str());
    let records = log.wait_records(1).await;
    let r = one_record(&records, &id);
    assert_eq!(r["decision"], "store_error");
    assert_eq!(r["error_origin"], "store");
    assert_eq!(r["route"], "ping");
    let m = proxy.metrics().await;
    assert!(
        m.contains("tollgate_requests_total{route=\"ping\",decision=\"store_error\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tollgate_requests_total{route=\"ping\",decision=\"allowed\"} 0"),
        "{m}"
    );
}

#[test]
fn a_reload_that_changes_log_format_is_rejected_and_every_line_keeps_the_running_format() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "log: { format: json }\nroutes: [{ name: ping, match: { path: /ping }, respond: { status: 200 } }]\n";
    let mut p = common::Process::serve(yaml, dir.path());
    let config = dir.path().join("tollgate.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("format: json"), "{text}");
    std::fs::write(&config, text.replace("format: json", "format: text")).unwrap();
    let answer = common::http(p.admin, "POST", "/reload").unwrap();
    assert_eq!(answer.status, 422, "{}", answer.body);
    assert!(
        answer
            .body
            .contains("log.format cannot change while running; restart tollgate to apply it"),
        "{}",
        answer.body
    );
    assert_eq!(common::http(p.addr, "GET", "/ping").unwrap().status, 200);
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(15)).success());
    let out = p.output();
    for line in out.lines() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "not JSON: {line}\n{out}"
        );
    }
    assert!(out.contains("\"log\":\"access\""), "{out}");
}

/// The four ways an https:// upstream's certificate is commonly wrong, each
/// behind a route of its own, all trusted through one `ca:`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_tls_failure_is_logged_with_its_reason() {
    use common::certs::{Ca, TlsUpstream};
    let ours = Ca::new("our CA");
    let unknown = TlsUpstream::start(&Ca::new("someone else").issue(&["localhost"])).await;
    let ca_as_leaf = TlsUpstream::start(&ours.own).await;
    let wrong_name = TlsUpstream::start(&ours.issue(&["other.example"])).await;
    let expired = TlsUpstream::start(&ours.issue_expired(&["localhost"])).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = ours.write(dir.path(), "ca.pem");
    let cases = [
        ("unknown", &unknown, "unknown CA"),
        ("ca_as_leaf", &ca_as_leaf, "CA used as end entity"),
        ("wrong_name", &wrong_name, "name mismatch"),
        ("expired", &expired, "expired"),
    ];
    let mut yaml = String::from("upstreams:\n");
    for (name, up, _) in &cases {
        yaml += &format!(
            "  {name}: {{ url: \"https://localhost:{}\", ca: \"{}\" }}\n",
            up.addr.port(),
            ca.display()
        );
    }
    yaml += "routes:\n";
    for (name, _, _) in &cases {
        yaml += &format!("  - {{ name: {name}, match: {{ path: /{name} }}, upstream: {name} }}\n");
    }
    let out = tokio::task::block_in_place(|| {
        let mut p = common::Process::serve(&yaml, dir.path());
        for (name, _, _) in &cases {
            let r = common::http(p.addr, "GET", &format!("/{name}")).unwrap();
            assert_eq!(r.status, 502, "{name}");
        }
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(15)).success());
        p.output()
    });
    for (name, _, reason) in &cases {
        let line = out
            .lines()
            .find(|l| l.contains("forwarding failed") && l.contains(&format!("upstream {name}:")))
            .unwrap_or_else(|| panic!("no failure logged for {name}:\n{out}"));
        assert!(
            line.contains(reason),
            "{name}: {reason:?} missing from {line}"
        );
    }
}

/// The metric names in the first column of docs/OBSERVABILITY.md's metrics table.
fn documented_metric_families() -> std::collections::BTreeSet<String> {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/OBSERVABILITY.md"
    ))
    .unwrap();
    let section = docs
        .split("\n## Metrics")
        .nth(1)
        .expect("a Metrics section")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .flat_map(|l| {
            let first_cell = l.split(" |").next().unwrap_or_default();
            first_cell
                .split('`')
                .map(|s| s.trim_matches(|c: char| c == ',' || c == ' ').to_string())
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn a_fresh_proxy_exposes_every_documented_metric_family_and_only_those_each_with_a_series() {
    let up = Upstream::start().await;
    // A php-fpm that is never asked: its upstream's own families are exposed from the start.
    let www = tempfile::tempdir().unwrap();
    std::fs::write(www.path().join("index.php"), "<?php").unwrap();
    let yaml = format!(
        r#"
identity: {{ api_keys: ["{KEY}"] }}
upstreams:
  app: {{ url: "{}" }}
  pool: {{ servers: ["{}", "{}"], max_conns: 2, queue: 1 }}
  php: {{ url: "fastcgi://127.0.0.1:9", root: "{}" }}
limiters:
  logins: {{ limit: 5, window: 1m, count: {{ status: [401] }}, ban: {{ after: 2, for: 10m }} }}
routes:
  - {{ name: login, match: {{ path: /login }}, upstream: app, limiters: [logins] }}
  - {{ name: pool, match: {{ path_prefix: /pool }}, upstream: pool }}
  - {{ name: gone, match: {{ path: /gone }}, respond: {{ status: 410 }} }}
"#,
        up.url(),
        up.url(),
        up.url(),
        www.path().display()
    );
    let proxy = Proxy::start(&yaml).await;
    let text = proxy.metrics().await;
    let exposed: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    let documented = documented_metric_families();
    let undocumented: Vec<_> = exposed.difference(&documented).collect();
    let missing: Vec<_> = documented.difference(&exposed).collect();
    assert!(
        undocumented.is_empty() && missing.is_empty(),
        "exposed but not in docs/OBSERVABILITY.md: {undocumented:?}\nin the docs but not exposed: {missing:?}"
    );
    // Before any event, each family has its series at zero (responses get
    // theirs per status code as they are sent).
    // Per name `server.tls.acme` manages (this config has none), and per
    // node of a Redis Sentinel or Cluster (this store is SQLite).
    let without_series_here = [
        "tollgate_certificate_expiry_seconds",
        "tollgate_certificate_renewal_failing",
        "tollgate_store_node_up",
        "tollgate_store_node_breaker_open",
    ];
    for family in exposed
        .iter()
        .filter(|f| *f != "tollgate_responses_total" && !without_series_here.contains(&f.as_str()))
    {
        assert!(
            text.lines()
                .any(|l| !l.starts_with('#') && l.starts_with(family.as_str())),
            "{family} has no series at start:\n{text}"
        );
    }
    assert_eq!(
        common::metric(
            &text,
            "tollgate_upstream_errors_total{upstream=\"app\",kind=\"connect\"}"
        ),
        Some(0.0)
    );
}

/// The keys in the first column of docs/CONFIG.md's tables, as paths into
/// `GET /config` (`limiters.<name>.limit` is `limiters[].limit` there).
fn documented_config_keys() -> std::collections::BTreeSet<String> {
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CONFIG.md")).unwrap();
    let mut keys = std::collections::BTreeSet::new();
    // Only the key tables (headed `| key |`), not the warnings table and the like.
    let mut in_key_table = false;
    for line in docs.lines() {
        if !line.starts_with('|') {
            in_key_table = false;
            continue;
        }
        if line.starts_with("| key |") {
            in_key_table = true;
            continue;
        }
        let Some(row) = line.strip_prefix("| `").filter(|_| in_key_table) else {
            continue;
        };
        let first_cell = row.split(" |").next().unwrap_or_default();
        let mut parent = String::new();
        for key in first_cell.split('`').map(|k| k.trim_matches([',', ' '])) {
            if key.is_empty() {
                continue;
            }
            // `upstreams.<name>.max_fails`, `fail_timeout`: the second shares the first's parent.
            let key = if key.contains('.') {
                parent = key.rsplit_once('.').unwrap().0.to_string();
                key.to_string()
            } else if parent.is_empty() {
                // A top-level key (`allow_no_routes`).
                key.to_string()
            } else {
                format!("{parent}.{key}")
            };
            keys.insert(
                key.replace("limiters.<name>", "limiters[]")
                    .replace("upstreams.<name>", "upstreams[]"),
            );
        }
    }
    keys
}

/// Every path in `value`: `a.b` for maps, `a[].b` into lists of maps.
fn json_paths(value: &Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
    let join = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let path = join(k);
                out.insert(path.clone());
                json_paths(v, &path, out);
            }
        }
        Value::Array(items) if items.iter().any(Value::is_object) => {
            for item in items {
                json_paths(item, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

/// A config that sets every key CONFIG.md documents, with the files it
/// names written in `dir`.
fn every_key_yaml(dir: &std::path::Path) -> String {
    use common::certs::Ca;
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["localhost"]).write(dir, "site");
    let ca_file = ca.write(dir, "ca.pem");
    let root = dir.display();
    std::fs::write(
        dir.join("htpasswd"),
        "bob:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n",
    )
    .unwrap();
    format!(
        r#"
server:
  tls:
    cert: "{}"
    key: "{}"
    listen: ["127.0.0.1:0"]
    acme: {{ directory: "https://127.0.0.1:9/dir", directory_ca: "{root}/none.pem", email: ops@example.com, domains: [example.com], challenge: http-01, storage: "{root}/acme", renew_before: 10d }}
    hsts: {{ max_age: 1d, include_subdomains: true, preload: false }}
log: {{ format: text, access: false }}
cache: {{ max_size: 8MiB }}
identity: {{ api_keys: ["{KEY}"], unknown_keys: {{ limit: 5, window: 1m }} }}
upstreams:
  app: {{ url: "http://127.0.0.1:9", health: {{ path: /health, interval: 5s }} }}
  php: {{ url: "fastcgi://127.0.0.1:9", root: "{root}", index: index.php, fallback: /index.php, max_conns: 3 }}
  secure: {{ url: "https://localhost:9", ca: "{}" }}
limiters:
  fixed: {{ limit: 5, window: 1m, count: {{ status: [401] }}, ban: {{ after: 2, for: 10m }}, reject: {{ status: 503, body: html }} }}
  bucket: {{ algorithm: token_bucket, capacity: 10, refill_per_second: 2 }}
  leaky: {{ algorithm: leaky_bucket, capacity: 10, leak_per_second: 2 }}
  conc: {{ algorithm: concurrency, max_in_flight: 2, overrides: [{{ key: "{KEY}", limit: 5 }}] }}
routes:
  - {{ name: login, match: {{ path: /login, methods: [POST], host: example.com, query: {{ action: login }} }}, upstream: app, limiters: [fixed], reject: {{ status: 429, body: problem }}, rate_limit_headers: draft }}
  - {{ name: ping, match: {{ path_prefix: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [bucket, leaky, conc] }}
  - {{ name: php, match: {{ path_prefix: /php }}, upstream: php, cache: {{ ttl: 10s, query: {{ drop: [fbclid] }} }} }}
  - {{ name: old, match: {{ path_regex: '^/old/(.*)$', query_regex: 'a=1' }}, redirect: {{ to: '/new/$1', status: 308, append_query: true }} }}
  - name: staff
    match: {{ path_prefix: /staff }}
    rewrite: {{ to: /index.php, unless_exists: true, append_query: true }}
    access: {{ allow: [192.0.2.0/24], deny: [all] }}
    auth: {{ basic: {{ realm: Staff, users_file: "{root}/htpasswd", forward_authorization: false }} }}
    headers: {{ request: {{ set: {{ X-A: "1" }} }}, response: {{ add: {{ X-B: "2" }}, remove: [X-Powered-By] }} }}
    upstream: php
access: {{ deny: [198.51.100.0/24] }}
headers: {{ response: {{ set: {{ X-Frame-Options: SAMEORIGIN }} }} }}
"#,
        cert.display(),
        key.display(),
        ca_file.display()
    )
}

#[tokio::test]
async fn get_config_shows_every_key_config_md_lists_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = every_key_yaml(dir.path());
    let proxy = Proxy::start(&yaml).await;
    let c = common::client();
    let body: Value = common::get_json(&c, &proxy.admin_url("/config")).await;
    let text = body.to_string();
    assert!(!text.contains(KEY), "an API key leaked: {text}");
    let mut shown = std::collections::BTreeSet::new();
    json_paths(&body["config"], "", &mut shown);
    let documented = documented_config_keys();
    // What the YAML accepts as a shorthand, and /config shows in its long form.
    let shorthands = ["server.tls.cert", "server.tls.key"];
    let missing: Vec<_> = documented
        .iter()
        .filter(|k| !shorthands.contains(&k.as_str()) && !shown.contains(*k))
        .collect();
    // A shown path is documented when it is a documented key, lies under one
    // (`limiters[].ban.after`), leads to one (`routes[].match`), or names a
    // map entry (`limiters[].name`: the `<name>` of `limiters.<name>`).
    let undocumented: Vec<_> = shown
        .iter()
        .filter(|p| {
            !documented.iter().any(|d| {
                *p == d
                    || p.starts_with(&format!("{d}."))
                    || p.starts_with(&format!("{d}[]"))
                    || d.starts_with(&format!("{p}."))
                    || d.starts_with(&format!("{p}[]"))
            }) && !["limiters[].name", "upstreams[].name"].contains(&p.as_str())
        })
        .collect();
    assert!(
        missing.is_empty() && undocumented.is_empty(),
        "documented but not in GET /config: {missing:?}\nin GET /config but not documented: {undocumented:?}\n{body:#}"
    );
    let config = &body["config"];
    assert_eq!(config["routes"][0]["match"]["query"]["action"], "login");
    assert_eq!(config["routes"][0]["rate_limit_headers"], "draft");
    assert_eq!(config["upstreams"][1]["max_conns"], 3);
    assert_eq!(config["log"]["access"], false);
}

/// A request through a test proxy, for the test below to run on its own.
#[tokio::test]
async fn a_test_proxy_keeps_its_access_log_for_the_test() {
    let up = Upstream::start().await;
    let proxy = Proxy::start(&common::forward_all(&up.url(), "")).await;
    let r = common::client()
        .get(proxy.url("/quiet"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let lines = proxy.access.wait_lines(1).await;
    assert!(lines.iter().any(|l| l.contains("GET /quiet")), "{lines:?}");
}

/// A green test prints no access record: the test binary runs the test above
/// alone, with the output capture off, and its stdout holds none.
#[test]
fn a_green_test_prints_no_access_log() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_test_proxy_keeps_its_access_log_for_the_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TOLLGATE_LOG", "off")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(
        !stdout.contains("GET /quiet"),
        "an access record was printed:\n{stdout}"
    );
}
