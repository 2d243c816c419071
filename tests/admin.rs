//! The admin API over real sockets: status and reset, health, metrics, effective config, token, reload.

mod common;

use common::T0;
use common::{client, send, Proxy};
use tollgate::clock::ManualClock;

/// `ping` has two fixed windows and a token bucket; `strict` runs out first.
const THREE_LIMITERS: &str = "
limiters:
  strict: { limit: 3, window: 60s }
  global: { limit: 10, window: 60s }
  burst: { algorithm: token_bucket, capacity: 5, refill_per_second: 1 }
routes:
  - name: ping
    match: { path: /ping }
    respond: { status: 200, body: \"pong\\n\" }
    limiters: [strict, global, burst]
";

fn limit_two(body: &str) -> String {
    format!(
        "
limiters:
  strict: {{ limit: 2, window: 60s }}
routes:
  - name: ping
    match: {{ path: /ping }}
    respond: {{ status: 200, body: \"{body}\" }}
    limiters: [strict]
"
    )
}

async fn ping(c: &reqwest::Client, proxy: &Proxy) -> u16 {
    common::status(c, &proxy.url("/ping"), &[]).await
}

async fn admin_get(c: &reqwest::Client, proxy: &Proxy, path: &str) -> (u16, serde_json::Value) {
    let answer = send(c.get(proxy.admin_url(path))).await;
    (answer.status, answer.json())
}

/// The limiter named `name` in a `/status` answer.
fn limiter<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["limiters"]
        .as_array()
        .unwrap_or_else(|| panic!("no limiters in {status}"))
        .iter()
        .find(|l| l["limiter"] == name)
        .unwrap_or_else(|| panic!("no limiter {name} in {status}"))
}

#[tokio::test]
async fn status_shows_every_limiter_without_counting_and_delete_resets_the_client() {
    let proxy = Proxy::start_with_clock(THREE_LIMITERS, ManualClock::at(T0)).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(ping(&c, &proxy).await, 200);
    }
    assert_eq!(ping(&c, &proxy).await, 429);

    let (code, status) = admin_get(&c, &proxy, "/status?key=127.0.0.1").await;
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["key"], "ip:127.0.0.1");
    assert_eq!(status["limiters"].as_array().unwrap().len(), 3, "{status}");
    let strict = limiter(&status, "strict");
    assert_eq!(strict["algorithm"], "fixed_window");
    assert_eq!(strict["limit"], 3);
    assert_eq!(strict["remaining"], 0);
    assert_eq!(strict["window_seconds"], 60);
    assert_eq!(strict["reset_after_seconds"], 40);
    assert_eq!(strict["reset"], 1_767_225_660u64);
    let global = limiter(&status, "global");
    assert_eq!(
        (global["limit"].as_u64(), global["remaining"].as_u64()),
        (Some(10), Some(6)),
        "every attempt counts in a fixed window: {status}"
    );
    assert_eq!(global["reset"], 1_767_225_660u64);
    let burst = limiter(&status, "burst");
    assert_eq!(burst["algorithm"], "token_bucket");
    assert_eq!(
        (burst["limit"].as_u64(), burst["remaining"].as_u64()),
        (Some(5), Some(2)),
        "a rejected request takes no token: {status}"
    );

    let (_, again) = admin_get(&c, &proxy, "/status?key=127.0.0.1").await;
    assert_eq!(again, status, "looking at the state must not count");

    let r = send(c.delete(proxy.admin_url("/status?key=127.0.0.1"))).await;
    assert_eq!(r.status, 200);
    let reset = r.json();
    assert_eq!(reset["key"], "ip:127.0.0.1");
    assert_eq!(reset["reset"], 3, "{reset}");
    assert_eq!(
        ping(&c, &proxy).await,
        200,
        "the limited client is let in again after a reset"
    );
    let (_, after) = admin_get(&c, &proxy, "/status?key=127.0.0.1").await;
    assert_eq!(limiter(&after, "strict")["remaining"], 2, "{after}");
    assert_eq!(limiter(&after, "global")["remaining"], 9, "{after}");
}

#[tokio::test]
async fn status_without_a_key_is_a_400_problem() {
    let proxy = Proxy::start_with_clock(THREE_LIMITERS, ManualClock::at(T0)).await;
    let r = client()
        .get(proxy.admin_url("/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn health_readiness_and_metrics_report_what_was_sent() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let c = client();

    let (code, health) = admin_get(&c, &proxy, "/healthz").await;
    assert_eq!(code, 200, "{health}");
    let (code, ready) = admin_get(&c, &proxy, "/readyz").await;
    assert_eq!(code, 200, "{ready}");
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["store"]["backend"], "sqlite");

    for expected in [200, 200, 429, 429, 429] {
        assert_eq!(ping(&c, &proxy).await, expected);
    }
    let r = c.get(proxy.admin_url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text().await.unwrap();
    for line in [
        "# TYPE tollgate_requests_total counter",
        "tollgate_requests_total{route=\"ping\",decision=\"allowed\"} 2",
        "tollgate_requests_total{route=\"ping\",decision=\"rejected\"} 3",
        "# TYPE tollgate_limiter_decisions_total counter",
        "tollgate_limiter_decisions_total{limiter=\"strict\",result=\"allowed\"} 2",
        "tollgate_limiter_decisions_total{limiter=\"strict\",result=\"rejected\"} 3",
        "tollgate_config_version 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // Every sample line is `name{labels} value` or `name value`, with a numeric value.
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let value = l.rsplit(' ').next().unwrap();
        assert!(
            value.parse::<f64>().is_ok(),
            "not a Prometheus sample: {l:?}"
        );
    }
}

#[tokio::test]
async fn the_effective_config_has_its_version_and_no_secret() {
    let yaml = "
admin: { token: adm1n-t0ken-secret }
store: { backend: redis, url: \"redis://:redis-pw-secret@127.0.0.1:6379/0\" }
identity: { api_keys: [client-key-secret] }
limiters:
  strict: { limit: 2, window: 60s, overrides: [{ key: vip-key-secret, limit: 50 }] }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200 }, limiters: [strict] }
";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(T0)).await;
    let c = client();
    // The client key is used once, so it is known to the process.
    let r = c
        .get(proxy.url("/ping"))
        .header("X-Client-Key", "client-key-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(proxy.admin_url("/config"))
        .bearer_auth("adm1n-t0ken-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    for secret in [
        "adm1n-t0ken-secret",
        "redis-pw-secret",
        "client-key-secret",
        "vip-key-secret",
    ] {
        assert!(!text.contains(secret), "{secret} leaked in {text}");
    }
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["version"], 1);
    assert_eq!(body["last_reload_error"], serde_json::Value::Null);
    assert_eq!(body["config"]["admin"]["token"], "[redacted]");
    assert_eq!(
        body["config"]["identity"]["api_keys"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(body["config"]["limiters"][0]["name"], "strict");
    assert_eq!(
        body["config"]["routes"][0]["limiters"],
        serde_json::json!(["strict"])
    );

    // A Redis store is not served by this build, so its URL is checked on the value the endpoint renders.
    let redis = tollgate::config::parse(
        "store: { backend: redis, url: \"redis://user:redis-pw-secret@10.0.0.1:6379/0\" }\n",
    )
    .unwrap();
    let shown = tollgate::admin::effective_config(&redis).to_string();
    assert!(!shown.contains("redis-pw-secret"), "{shown}");
    assert!(
        shown.contains("10.0.0.1:6379/0"),
        "the host stays visible: {shown}"
    );
}

#[tokio::test]
async fn with_a_token_admin_calls_need_it_but_probes_stay_open() {
    let yaml = format!("admin: {{ token: s3cret-admin }}\n{}", limit_two("pong"));
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    let c = client();
    let calls = [
        (reqwest::Method::GET, "/status?key=127.0.0.1"),
        (reqwest::Method::DELETE, "/status?key=127.0.0.1"),
        (reqwest::Method::GET, "/metrics"),
        (reqwest::Method::GET, "/config"),
        (reqwest::Method::POST, "/reload"),
    ];
    for (method, path) in &calls {
        let none = c
            .request(method.clone(), proxy.admin_url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(none.status(), 401, "{method} {path} without a token");
        assert_eq!(none.headers()["www-authenticate"], "Bearer");
        let wrong = c
            .request(method.clone(), proxy.admin_url(path))
            .bearer_auth("s3cret-admiN")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401, "{method} {path} with a wrong token");
        let basic = c
            .request(method.clone(), proxy.admin_url(path))
            .header("authorization", "Basic s3cret-admin")
            .send()
            .await
            .unwrap();
        assert_eq!(basic.status(), 401, "{method} {path} with another scheme");
    }
    assert_eq!(
        proxy.app.snapshot().version,
        1,
        "an unauthenticated reload did nothing"
    );
    for (method, path) in &calls {
        let ok = c
            .request(method.clone(), proxy.admin_url(path))
            .bearer_auth("s3cret-admin")
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200, "{method} {path} with the token");
    }
    for path in ["/healthz", "/readyz"] {
        let r = c.get(proxy.admin_url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} is open to probes without a token");
    }
}

#[tokio::test]
async fn reload_applies_a_changed_limit_to_the_running_counters() {
    let proxy = Proxy::start_with_clock(
        &limit_two("pong").replace("limit: 2", "limit: 5"),
        ManualClock::at(T0),
    )
    .await;
    let c = client();
    assert_eq!(ping(&c, &proxy).await, 200);

    proxy.write_config(&limit_two("pong"));
    let (code, body) = proxy.reload().await;
    assert_eq!(
        (code, body),
        (
            200,
            serde_json::json!({"result": "ok", "version": 2, "warnings": []})
        )
    );

    let r = c.get(proxy.url("/ping")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-ratelimit-limit"],
        "2",
        "the new limit is in force"
    );
    assert_eq!(
        r.headers()["x-ratelimit-remaining"],
        "0",
        "the request before the reload still counts"
    );
    assert_eq!(ping(&c, &proxy).await, 429);
    let (_, config) = admin_get(&c, &proxy, "/config").await;
    assert_eq!(config["version"], 2);
}

#[tokio::test]
async fn a_reload_with_a_misspelt_strict_flag_is_refused_and_changes_nothing() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    proxy.write_config(&limit_two("pong").replace("limit: 2", "limit: 5"));
    let answer = send(client().post(proxy.admin_url("/reload?strict=yes"))).await;
    assert_eq!(answer.status, 400);
    let (_, config) = admin_get(&client(), &proxy, "/config").await;
    assert_eq!(config["version"], 1, "nothing was reloaded");
}

#[tokio::test]
async fn reload_with_missing_names_answers_422_with_every_error_and_keeps_old_limits() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(ping(&c, &proxy).await, 200);

    proxy.write_config(
        "
limiters:
  strict: { limit: 100, window: 60s }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200 }, limiters: [strict, missing] }
  - { name: app, match: { path_prefix: /app }, upstream: nowhere }
",
    );
    let (code, body) = proxy.reload().await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["result"], "error");
    assert_eq!(body["version"], 1);
    let errors = common::reload_errors(&body);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no limiter named \"missing\"") && e.contains(": line ")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("no upstream named \"nowhere\"") && e.contains(": line ")),
        "{errors:?}"
    );

    assert_eq!(
        ping(&c, &proxy).await,
        200,
        "the old limit of 2 still applies"
    );
    assert_eq!(
        ping(&c, &proxy).await,
        429,
        "the rejected limit of 100 never applied"
    );
    let (_, config) = admin_get(&c, &proxy, "/config").await;
    assert_eq!(config["version"], 1);
    let last = config["last_reload_error"]
        .as_str()
        .unwrap_or_else(|| panic!("no last_reload_error in {config}"));
    assert!(last.contains("no limiter named \"missing\""), "{last}");
    assert!(last.contains("no upstream named \"nowhere\""), "{last}");

    // A good reload clears the error.
    proxy.write_config(&limit_two("pong again"));
    assert_eq!(proxy.reload().await.0, 200);
    let (_, config) = admin_get(&c, &proxy, "/config").await;
    assert_eq!(
        config["last_reload_error"],
        serde_json::Value::Null,
        "{config}"
    );
}

#[tokio::test]
async fn reload_with_a_yaml_syntax_error_answers_422_with_its_location_and_keeps_old_limits() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(ping(&c, &proxy).await, 200);

    // Not through `write_config`: that parses the YAML to pin the listeners.
    std::fs::write(
        &proxy.config_path,
        "limiters:\n  strict: { limit: 100, window: 60s\nroutes: [\n",
    )
    .unwrap();
    let (code, body) = proxy.reload().await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["version"], 1);
    let errors = common::reload_errors(&body);
    assert!(!errors.is_empty());
    assert!(errors.iter().all(|e| e.contains("line ")), "{errors:?}");

    assert_eq!(ping(&c, &proxy).await, 200);
    assert_eq!(
        ping(&c, &proxy).await,
        429,
        "the old limit of 2 still applies"
    );
    let (_, config) = admin_get(&c, &proxy, "/config").await;
    assert!(
        config["last_reload_error"]
            .as_str()
            .is_some_and(|e| e.contains("line ")),
        "{config}"
    );
}

#[tokio::test]
async fn counters_survive_a_reload_and_a_higher_limit_admits_at_once() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let c = client();
    for expected in [200, 200, 429] {
        assert_eq!(ping(&c, &proxy).await, expected);
    }

    proxy.write_config(&limit_two("a different body"));
    assert_eq!(
        proxy.reload().await,
        (
            200,
            serde_json::json!({"result": "ok", "version": 2, "warnings": []})
        )
    );
    let r = c.get(proxy.url("/ping")).send().await.unwrap();
    assert_eq!(
        r.status(),
        429,
        "an unrelated change does not reset the counter"
    );

    proxy.write_config(&limit_two("a different body").replace("limit: 2", "limit: 10"));
    assert_eq!(
        proxy.reload().await,
        (
            200,
            serde_json::json!({"result": "ok", "version": 3, "warnings": []})
        )
    );
    let r = c.get(proxy.url("/ping")).send().await.unwrap();
    assert_eq!(r.status(), 200, "the higher limit admits at once");
    assert_eq!(r.headers()["x-ratelimit-limit"], "10");
    assert_eq!(
        r.headers()["x-ratelimit-remaining"],
        "5",
        "four attempts before, this one the fifth"
    );
    assert_eq!(r.text().await.unwrap(), "a different body");
}

#[tokio::test]
async fn the_admin_api_is_never_served_on_the_public_port() {
    for (public, admin) in [
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        ("0.0.0.0:8080", "127.0.0.1:8080"),
        ("127.0.0.1:8080", "0.0.0.0:8080"),
    ] {
        let yaml =
            format!("server: {{ listen: \"{public}\" }}\nadmin: {{ listen: \"{admin}\" }}\n");
        let err =
            tollgate::config::parse(&yaml).expect_err("admin on the public port must be rejected");
        let text = err.to_string();
        assert!(text.contains("admin.listen"), "{text}");
        assert!(text.contains("must never be on the public port"), "{text}");
        assert!(text.contains("line 2"), "{text}");
    }
    tollgate::config::parse(
        "server: { listen: \"127.0.0.1:8080\" }\nadmin: { listen: \"127.0.0.1:8081\" }\n",
    )
    .expect("distinct ports are fine");

    // Over the sockets: admin paths on the public port are just unrouted paths.
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let c = client();
    for path in ["/metrics", "/status?key=127.0.0.1", "/config"] {
        let r = c.get(proxy.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path} on the public port");
        assert!(!r.text().await.unwrap().contains("tollgate_requests_total"));
    }
    let r = c.post(proxy.url("/reload")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(proxy.app.snapshot().version, 1);
}

/// One admin call over a raw socket with the given Host (and bearer token).
async fn with_host(
    proxy: &Proxy,
    method: &str,
    path: &str,
    host: &str,
    token: Option<&str>,
) -> u16 {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let answer = common::raw(
        proxy.admin,
        request.as_bytes(),
        std::time::Duration::from_secs(5),
    )
    .await;
    common::status_of(&answer)
}

#[tokio::test]
async fn without_a_token_the_admin_api_refuses_a_foreign_host_but_answers_loopback_names() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let port = proxy.admin.port();
    // A page on evil.example re-pointed at 127.0.0.1 (DNS rebinding) sends its own name.
    for (method, path) in [
        ("GET", "/status?key=127.0.0.1"),
        ("DELETE", "/status?key=127.0.0.1"),
        ("GET", "/metrics"),
        ("GET", "/config"),
        ("POST", "/reload"),
        ("GET", "/healthz"),
    ] {
        for host in [
            "evil.example",
            &format!("evil.example:{port}"),
            "localhost.evil.example",
        ] {
            assert_eq!(
                with_host(&proxy, method, path, host, None).await,
                403,
                "{method} {path} with Host: {host}"
            );
        }
    }
    assert_eq!(
        proxy.app.snapshot().version,
        1,
        "the refused reload did not run"
    );
    for host in [
        format!("localhost:{port}"),
        "LOCALHOST".to_string(),
        format!("127.0.0.1:{port}"),
        "127.0.0.9".to_string(),
        format!("[::1]:{port}"),
    ] {
        assert_eq!(
            with_host(&proxy, "GET", "/metrics", &host, None).await,
            200,
            "{host}"
        );
    }
}

#[tokio::test]
async fn with_a_token_the_host_does_not_matter_but_the_token_does() {
    let yaml = format!("admin: {{ token: s3cret }}\n{}", limit_two("pong"));
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(T0)).await;
    assert_eq!(
        with_host(&proxy, "GET", "/metrics", "evil.example", None).await,
        401
    );
    assert_eq!(
        with_host(&proxy, "GET", "/metrics", "evil.example", Some("s3cret")).await,
        200
    );
    assert_eq!(
        with_host(&proxy, "GET", "/metrics", "localhost", None).await,
        401
    );
}

#[tokio::test]
async fn a_reload_that_exposes_the_admin_without_a_token_is_rejected_and_the_old_config_serves() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(ping(&c, &proxy).await, 200);
    // Written directly: the harness would pin admin.listen back to loopback.
    let exposed = common::pin_yaml(
        &limit_two("changed"),
        proxy.addr,
        proxy.admin,
        proxy.dir.path(),
    )
    .replace(
        &format!("127.0.0.1:{}", proxy.admin.port()),
        &format!("0.0.0.0:{}", proxy.admin.port()),
    );
    assert!(exposed.contains("0.0.0.0:"), "{exposed}");
    std::fs::write(&proxy.config_path, exposed).unwrap();
    let (status, body) = proxy.reload().await;
    assert_eq!(status, 422, "{body}");
    let errors = body["errors"].to_string();
    assert!(
        errors.contains("admin.listen") && errors.contains("admin.token"),
        "{errors}"
    );
    assert_eq!(proxy.app.snapshot().version, 1);
    // The old config still serves: same body, same counter (one left of two).
    let r = c.get(proxy.url("/ping")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "pong");
    assert_eq!(ping(&c, &proxy).await, 429);
}

#[tokio::test]
async fn a_token_file_is_read_at_reload_so_a_rotated_secret_applies() {
    let proxy = Proxy::start_with_clock(&limit_two("pong"), ManualClock::at(T0)).await;
    let c = client();
    let secret = proxy.dir.path().join("admin_token");
    std::fs::write(&secret, "first\n").unwrap();
    let yaml = format!(
        "admin: {{ token_file: \"{}\" }}\n{}",
        secret.display(),
        limit_two("pong")
    );
    proxy.write_config(&yaml);
    let (status, body) = proxy.reload().await;
    assert_eq!(status, 200, "{body}");
    let get = |token: &'static str| c.get(proxy.admin_url("/config")).bearer_auth(token).send();
    assert_eq!(get("first").await.unwrap().status(), 200);
    std::fs::write(&secret, "second\n").unwrap();
    let r = c
        .post(proxy.admin_url("/reload"))
        .bearer_auth("first")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(get("first").await.unwrap().status(), 401);
    assert_eq!(get("second").await.unwrap().status(), 200);
    // An emptied secret is a rejected reload; the token in force stays.
    std::fs::write(&secret, "").unwrap();
    let r = c
        .post(proxy.admin_url("/reload"))
        .bearer_auth("second")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("admin.token_file"));
    assert_eq!(get("second").await.unwrap().status(), 200);
}

#[test]
fn a_state_changing_call_without_a_token_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = common::Process::serve(&limit_two("pong"), dir.path());
    assert_eq!(
        common::http(proxy.admin, "GET", "/status?key=10.0.0.1")
            .unwrap()
            .status,
        200
    );
    assert!(
        !proxy.output().contains("without a token changes state"),
        "a read is not logged"
    );
    assert_eq!(
        common::http(proxy.admin, "DELETE", "/status?key=10.0.0.1")
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        common::http(proxy.admin, "POST", "/reload").unwrap().status,
        200
    );
    let logged = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.contains("admin call without a token changes state"))
            .map(str::to_string)
            .collect()
    };
    let both = common::eventually_blocking(std::time::Duration::from_secs(5), || {
        logged(&proxy.output()).len() == 2
    });
    let out = proxy.output();
    assert!(both, "not logged:\n{out}");
    let lines = logged(&out);
    assert!(
        lines[0].contains("DELETE") && lines[0].contains("/status"),
        "{out}"
    );
    assert!(
        lines[1].contains("POST") && lines[1].contains("/reload"),
        "{out}"
    );
}

/// `a` bans a user name for an hour after one refusal; `b` bans the IP for ten minutes.
const TWO_BANS: &str = "
admin: { token: ban-token }
limiters:
  a: { limit: 1, window: 60s, key: \"header:X-User\", ban: { after: 1, for: 1h } }
  b: { limit: 1, window: 60s, key: ip, ban: { after: 1, for: 10m } }
routes:
  - { name: users, match: { path: /users }, respond: { status: 200, body: ok }, limiters: [a] }
  - { name: ips, match: { path: /ips }, respond: { status: 200, body: ok }, limiters: [b] }
";

async fn bans_page(c: &reqwest::Client, proxy: &Proxy, query: &str) -> (u16, serde_json::Value) {
    let answer = send(
        c.get(proxy.admin_url(&format!("/bans{query}")))
            .bearer_auth("ban-token"),
    )
    .await;
    (answer.status, answer.json())
}

fn keys(page: &serde_json::Value) -> Vec<&str> {
    page["bans"]
        .as_array()
        .unwrap_or_else(|| panic!("no bans in {page}"))
        .iter()
        .map(|b| b["key"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn bans_are_listed_paged_filtered_by_limiter_and_lifted_with_the_token() {
    let proxy = Proxy::start_with_clock(TWO_BANS, ManualClock::at(T0)).await;
    let c = client();
    let get =
        |path: &str, user: &str| send(c.get(proxy.url(path)).header("x-user", user.to_string()));
    // Allowed, then refused (the strike that bans).
    for user in ["u3", "u1", "u2"] {
        assert_eq!(get("/users", user).await.status, 200);
        assert_eq!(get("/users", user).await.status, 429);
    }
    assert_eq!(get("/ips", "-").await.status, 200);
    assert_eq!(get("/ips", "-").await.status, 429);
    assert_eq!(get("/users", "u1").await.json()["type"], "client-banned");

    let (status, all) = bans_page(&c, &proxy, "").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(
        keys(&all),
        ["a:h:u1", "a:h:u2", "a:h:u3", "b:ip:127.0.0.1"],
        "sorted by key: {all}"
    );
    assert_eq!(all["total"], 4);
    assert_eq!(all["next"], serde_json::Value::Null);
    let t0 = T0 / 1_000_000_000;
    let first = &all["bans"][0];
    assert_eq!(first["limiter"], "a");
    assert_eq!(first["value"], "h:u1");
    assert_eq!(first["since"], t0);
    assert_eq!(first["until"], t0 + 3600);
    assert_eq!(first["until_utc"], "2026-01-01T01:00:20Z");
    assert_eq!(first["seconds_left"], 3600);
    assert_eq!(all["bans"][3]["seconds_left"], 600);

    // Two at a time: the second page starts after the first page's last key.
    let (_, one) = bans_page(&c, &proxy, "?limit=2").await;
    assert_eq!(keys(&one), ["a:h:u1", "a:h:u2"]);
    assert_eq!(one["next"], "a:h:u2");
    let (_, two) = bans_page(&c, &proxy, "?limit=2&after=a%3Ah%3Au2").await;
    assert_eq!(keys(&two), ["a:h:u3", "b:ip:127.0.0.1"]);
    assert_eq!(two["next"], serde_json::Value::Null);
    let (_, only_b) = bans_page(&c, &proxy, "?limiter=b").await;
    assert_eq!(keys(&only_b), ["b:ip:127.0.0.1"]);
    assert_eq!(only_b["total"], 1);
    let (status, bad) = bans_page(&c, &proxy, "?limit=0").await;
    assert_eq!(status, 400, "{bad}");

    // Lifting needs the token, then the ban is gone and the key is no longer refused as banned.
    let lift = proxy.admin_url("/bans/a%3Ah%3Au1");
    assert_eq!(send(c.delete(&lift)).await.status, 401);
    let lifted = send(c.delete(&lift).bearer_auth("ban-token")).await;
    assert_eq!(lifted.status, 200);
    assert_eq!(lifted.json()["key"], "a:h:u1");
    assert_eq!(
        send(c.delete(&lift).bearer_auth("ban-token")).await.status,
        404,
        "no ban left to lift"
    );
    let (_, after) = bans_page(&c, &proxy, "").await;
    assert_eq!(keys(&after), ["a:h:u2", "a:h:u3", "b:ip:127.0.0.1"]);
    assert_ne!(get("/users", "u1").await.json()["type"], "client-banned");
    assert_eq!(get("/users", "u2").await.json()["type"], "client-banned");
}
