//! Walking around a limit, tried as an attacker would: invented keys, forged edge headers, PHP spellings of paths, hosts and queries.

mod common;
use common::WINDOW_START;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::php::PhpServer;
use common::{json, raw, status_of, Proxy, Reply, Upstream};
use tollgate::clock::{ManualClock, SystemClock};

/// One request with extra header lines (`Name: value\r\n`…); its status and body (unchunked).
async fn send(proxy: &Proxy, method: &str, target: &str, headers: &str) -> (u16, String) {
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: shop.test\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let answer = raw(proxy.addr, request.as_bytes(), Duration::from_secs(5)).await;
    match Reply::parse(&answer) {
        Some(reply) => (reply.status, reply.body),
        None => (status_of(&answer), String::new()),
    }
}

/// `config.example.yaml` as shipped, with its upstream pointed at `upstream`
/// and its SQLite file left to the harness (a fresh one per test).
fn example_config(upstream: &str) -> String {
    let mut doc: serde_yaml::Value =
        serde_yaml::from_str(include_str!("../config.example.yaml")).unwrap();
    doc["upstreams"]["app"]["url"] = upstream.into();
    if let Some(store) = doc["store"].as_mapping_mut() {
        store.remove("path");
    }
    serde_yaml::to_string(&doc).unwrap()
}

#[tokio::test]
async fn twelve_logins_with_twelve_invented_keys_from_one_ip_admit_at_most_five() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start_with_clock(
        &example_config(&upstream.url()),
        ManualClock::at(WINDOW_START),
    )
    .await;
    let mut statuses = Vec::new();
    for i in 0..12 {
        let key = format!("X-Client-Key: invented-{i}-{}\r\n", i * 7919);
        statuses.push(send(&proxy, "POST", "/login", &key).await.0);
    }
    let admitted = statuses.iter().filter(|s| **s != 429).count();
    assert_eq!(
        admitted, 5,
        "the strict limit of 5 holds whatever key is sent: {statuses:?}"
    );
    assert_eq!(
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        5
    );
}

#[tokio::test]
async fn listed_keys_keep_their_own_counters_and_a_hashed_entry_works() {
    // The config holds only beta's SHA-256, not the secret.
    let beta = {
        use sha2::Digest;
        format!("sha256:{:x}", sha2::Sha256::digest(b"beta"))
    };
    let yaml = format!(
        "identity: {{ api_keys: [alpha, \"{beta}\"], unknown_keys: {{ limit: 3, window: 60s }} }}\nlimiters:\n  two: {{ limit: 2, window: 60s, key: client }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }}, limiters: [two] }}\n"
    );
    let proxy = Proxy::start_with_clock(&yaml, ManualClock::at(WINDOW_START)).await;
    let mut seen = Vec::new();
    for key in ["alpha", "beta", "alpha", "beta", "alpha", "beta"] {
        seen.push(
            send(&proxy, "GET", "/", &format!("X-Client-Key: {key}\r\n"))
                .await
                .0,
        );
    }
    assert_eq!(seen, [200, 200, 200, 200, 429, 429], "one counter per key");
    assert_eq!(
        send(&proxy, "GET", "/", "").await.0,
        200,
        "no key: the IP's own counter"
    );

    // Unknown keys: 401, and after three from this IP in the window, 429.
    let mut unknown = Vec::new();
    for i in 0..5 {
        unknown.push(
            send(&proxy, "GET", "/", &format!("X-Client-Key: guess-{i}\r\n"))
                .await
                .0,
        );
    }
    assert_eq!(
        unknown,
        [401, 401, 401, 429, 429],
        "key probing is limited per IP"
    );
}

#[tokio::test]
async fn an_api_keys_file_is_reloaded_with_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("api_keys");
    std::fs::write(&keys, "# partners\nk1\n").unwrap();
    let yaml = format!(
        "identity: {{ api_keys_file: \"{}\" }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }} }}\n",
        keys.display()
    );
    let proxy = Proxy::start_in(
        &yaml,
        Arc::new(SystemClock),
        dir,
        Some(Duration::from_millis(50)),
    )
    .await;
    let with = |k: &'static str| format!("X-Client-Key: {k}\r\n");
    assert_eq!(send(&proxy, "GET", "/", &with("k1")).await.0, 200);
    assert_eq!(send(&proxy, "GET", "/", &with("k2")).await.0, 401);

    // An edit of the key file alone is a reload, like an edit of the config.
    std::fs::write(&keys, "k2\n").unwrap();
    assert!(
        common::eventually(Duration::from_secs(10), || async {
            send(&proxy, "GET", "/", &with("k2")).await.0 == 200
        })
        .await,
        "the new key file was never applied"
    );
    assert_eq!(
        send(&proxy, "GET", "/", &with("k1")).await.0,
        401,
        "k1 was removed"
    );
}

/// A PHP script that answers with every header PHP received, as JSON.
fn header_dump(dir: &Path) -> PhpServer {
    let script = dir.join("headers.php");
    std::fs::write(
        &script,
        "<?php\n$h = [];\nforeach ($_SERVER as $k => $v) { if (strncmp($k, 'HTTP_', 5) === 0) { $h[$k] = $v; } }\nheader('Content-Type: application/json');\necho json_encode($h, JSON_UNESCAPED_SLASHES);\n",
    )
    .unwrap();
    PhpServer::start(&script, dir, 1)
}

const FORGED: &str = "X-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 1\r\nX-Forwarded-Prefix: /evil\r\nX-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\nClient-IP: 6.6.6.6\r\nTrue-Client-IP: 6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\nX-Cluster-Client-IP: 6.6.6.6\r\nForwarded: for=6.6.6.6;host=evil.example\r\n";

const FORGED_FIELDS: [&str; 8] = [
    "HTTP_X_FORWARDED_PREFIX",
    "HTTP_X_ORIGINAL_URL",
    "HTTP_X_REWRITE_URL",
    "HTTP_CLIENT_IP",
    "HTTP_TRUE_CLIENT_IP",
    "HTTP_CF_CONNECTING_IP",
    "HTTP_X_CLUSTER_CLIENT_IP",
    "HTTP_FORWARDED",
];

#[tokio::test]
async fn an_untrusted_clients_forged_edge_headers_never_reach_php() {
    let dir = tempfile::tempdir().unwrap();
    let php = header_dump(dir.path());
    let yaml = format!(
        "upstreams:\n  php: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        php.addr
    );
    let proxy = Proxy::start_in(&yaml, Arc::new(SystemClock), dir, None).await;
    let (status, body) = send(&proxy, "GET", "/reset-password", FORGED).await;
    assert_eq!(status, 200, "{body}");
    let seen = json(&body);
    assert_eq!(
        seen["HTTP_X_FORWARDED_HOST"], "shop.test",
        "the Host the client used: {seen}"
    );
    assert_eq!(
        seen["HTTP_X_FORWARDED_PORT"],
        proxy.addr.port().to_string(),
        "the port it connected to"
    );
    assert_eq!(seen["HTTP_HOST"], "shop.test");
    assert_eq!(seen["HTTP_X_FORWARDED_FOR"], "127.0.0.1");
    for field in FORGED_FIELDS {
        assert!(seen.get(field).is_none(), "{field} reached PHP: {seen}");
    }
}

#[tokio::test]
async fn a_trusted_proxys_edge_headers_pass_to_php() {
    let dir = tempfile::tempdir().unwrap();
    let php = header_dump(dir.path());
    let yaml = format!(
        "identity: {{ trusted_proxies: [\"127.0.0.1/32\"] }}\nupstreams:\n  php: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        php.addr
    );
    let proxy = Proxy::start_in(&yaml, Arc::new(SystemClock), dir, None).await;
    let (status, body) = send(&proxy, "GET", "/", FORGED).await;
    assert_eq!(status, 200, "{body}");
    let seen = json(&body);
    assert_eq!(seen["HTTP_X_FORWARDED_HOST"], "evil.example");
    assert_eq!(seen["HTTP_X_FORWARDED_PORT"], "1");
    for field in FORGED_FIELDS {
        assert!(
            seen.get(field).is_some(),
            "{field} from a trusted proxy was dropped: {seen}"
        );
    }
}

#[tokio::test]
async fn a_host_route_is_reached_by_every_spelling_of_its_host() {
    let yaml = "limiters:\n  admin_limit: { limit: 100, window: 60s, key: ip }\nroutes:\n  - { name: admin, match: { path_prefix: /, host: admin.example }, respond: { status: 200, body: admin }, limiters: [admin_limit] }\n  - { name: public, match: { path_prefix: / }, respond: { status: 200, body: public } }\n";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(WINDOW_START)).await;
    for host in [
        "admin.example",
        "admin.example.",
        "ADMIN.example:80",
        "Admin.Example.:8080",
    ] {
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = raw(proxy.addr, request.as_bytes(), Duration::from_secs(5)).await;
        assert!(answer.ends_with("admin"), "Host: {host} → {answer}");
    }
    let answer = raw(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: admin.example.evil\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(answer.ends_with("public"), "{answer}");
}

#[tokio::test]
async fn every_php_spelling_of_wp_login_shares_one_counter() {
    let yaml = "limiters:\n  strict: { limit: 4, window: 60s, key: ip }\nroutes:\n  - { name: login, match: { path: /wp-login.php }, respond: { status: 200, body: login }, limiters: [strict] }\n  - { name: rest, match: { path_prefix: / }, respond: { status: 200, body: rest } }\n";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(WINDOW_START)).await;
    let mut seen = Vec::new();
    for path in [
        "/wp-login.php",
        "/wp-login.php/x",
        "//wp-login.php/a/b",
        "/wp-login.php/",
        "/./wp-login.php/%78",
    ] {
        seen.push(send(&proxy, "POST", path, "").await);
    }
    let statuses: Vec<u16> = seen.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429], "{seen:?}");
    let (status, body) = send(&proxy, "POST", "/wp-login.phpx", "").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "rest"),
        "another file, another route"
    );
}

#[tokio::test]
async fn a_query_route_matches_the_spellings_php_decodes() {
    let yaml = "limiters:\n  strict: { limit: 3, window: 60s, key: ip }\nroutes:\n  - { name: login, match: { path: /index.php, query: { action: login } }, respond: { status: 200, body: login }, limiters: [strict] }\n  - { name: rest, match: { path_prefix: / }, respond: { status: 200, body: rest } }\n";
    let proxy = Proxy::start_with_clock(yaml, ManualClock::at(WINDOW_START)).await;
    let mut statuses = Vec::new();
    for target in [
        "/index.php?action=login",
        "/index.php?action=%6Cogin",
        "/index.php/x?a=1&action=login&action=view",
        "//index.php?%61ction=login",
    ] {
        statuses.push(send(&proxy, "POST", target, "").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    for target in [
        "/index.php?action=view",
        "/index.php?action[]=login",
        "/index.php",
    ] {
        let (status, body) = send(&proxy, "POST", target, "").await;
        assert_eq!((status, body.as_str()), (200, "rest"), "{target}");
    }
}
