//! Header names with `_` never reach PHP as a variable the edge owns: dropped by default, and edge-owned spellings removed even when kept.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::php::PhpServer;
use common::php_fpm::PhpFpm;
use common::{client, json, send, Proxy};
use tollgate::clock::SystemClock;

/// Answers with every `HTTP_*` variable PHP received, as JSON.
const DUMP: &str = "<?php\n$h = [];\nforeach ($_SERVER as $k => $v) { if (strncmp($k, 'HTTP_', 5) === 0) { $h[$k] = $v; } }\nheader('Content-Type: application/json');\necho json_encode($h, JSON_UNESCAPED_SLASHES);\n";

/// What an untrusted client sends: edge-owned names spelled with `_`, one
/// that would shadow tollgate's own `X-Real-IP`, and a harmless custom one.
const SENT: [(&str, &str); 5] = [
    ("Client_IP", "6.6.6.6"),
    ("X_Original_URL", "/admin"),
    ("True_Client_IP", "6.6.6.6"),
    ("X_Real_IP", "6.6.6.6"),
    ("X_Custom", "kept"),
];

/// The variables the edge-owned spellings would become.
const EDGE_FIELDS: [&str; 3] = [
    "HTTP_CLIENT_IP",
    "HTTP_X_ORIGINAL_URL",
    "HTTP_TRUE_CLIENT_IP",
];

/// The `HTTP_*` variables PHP saw for one request with [`SENT`].
async fn seen_by_php(proxy: &Proxy) -> serde_json::Value {
    let mut req = client().get(proxy.url("/index.php"));
    for (name, value) in SENT {
        req = req.header(name, value);
    }
    let r = send(req).await;
    assert_eq!(r.status, 200, "{}", r.body);
    json(&r.body)
}

fn assert_edge_fields_absent(seen: &serde_json::Value) {
    for field in EDGE_FIELDS {
        assert!(seen.get(field).is_none(), "{field} reached PHP: {seen}");
    }
    assert_eq!(
        seen["HTTP_X_REAL_IP"], "127.0.0.1",
        "X_Real_IP shadowed tollgate's X-Real-IP: {seen}"
    );
}

/// The `tollgate_headers_dropped_total{reason="underscore"}` sample, if any.
async fn dropped(proxy: &Proxy) -> Option<u64> {
    proxy
        .metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_headers_dropped_total{reason=\"underscore\"} "))
        .map(|v| v.trim().parse().unwrap())
}

async fn behind_php_s(dir: tempfile::TempDir, server: &str) -> (Proxy, PhpServer) {
    let script = dir.path().join("dump.php");
    std::fs::write(&script, DUMP).unwrap();
    let php = PhpServer::start(&script, dir.path(), 1);
    let yaml = format!(
        "server: {{ {server} }}\nupstreams:\n  php: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        php.addr
    );
    let proxy = Proxy::start_in(&yaml, Arc::new(SystemClock), dir, None).await;
    (proxy, php)
}

async fn behind_php_fpm(dir: tempfile::TempDir, server: &str) -> (Proxy, PhpFpm) {
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("index.php"), DUMP).unwrap();
    let fpm = PhpFpm::start(dir.path(), &root, 1, "");
    let yaml = fastcgi_yaml(&fpm, &root, server);
    let proxy = Proxy::start_in(&yaml, Arc::new(SystemClock), dir, None).await;
    (proxy, fpm)
}

fn fastcgi_yaml(fpm: &PhpFpm, root: &Path, server: &str) -> String {
    format!(
        "server: {{ {server} }}\nupstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        fpm.tcp,
        root.display()
    )
}

#[tokio::test]
async fn header_names_with_underscores_never_reach_php_behind_php_s_and_are_counted() {
    let (proxy, _php) = behind_php_s(tempfile::tempdir().unwrap(), "").await;
    let seen = seen_by_php(&proxy).await;
    assert_edge_fields_absent(&seen);
    assert!(seen.get("HTTP_X_CUSTOM").is_none(), "{seen}");
    assert_eq!(dropped(&proxy).await, Some(SENT.len() as u64));
}

#[tokio::test]
async fn header_names_with_underscores_never_reach_php_fpm_and_are_counted() {
    let (proxy, _fpm) = behind_php_fpm(tempfile::tempdir().unwrap(), "").await;
    let seen = seen_by_php(&proxy).await;
    assert_edge_fields_absent(&seen);
    assert!(seen.get("HTTP_X_CUSTOM").is_none(), "{seen}");
    assert_eq!(dropped(&proxy).await, Some(SENT.len() as u64));
}

#[tokio::test]
async fn with_underscores_kept_only_names_the_edge_does_not_own_reach_php_behind_php_s() {
    let (proxy, _php) =
        behind_php_s(tempfile::tempdir().unwrap(), "underscores_in_headers: true").await;
    let seen = seen_by_php(&proxy).await;
    assert_edge_fields_absent(&seen);
    assert_eq!(seen["HTTP_X_CUSTOM"], "kept", "{seen}");
    assert_eq!(dropped(&proxy).await, Some(0), "nothing counted when kept");
}

#[tokio::test]
async fn with_underscores_kept_only_names_the_edge_does_not_own_reach_php_fpm() {
    let (proxy, _fpm) =
        behind_php_fpm(tempfile::tempdir().unwrap(), "underscores_in_headers: true").await;
    let seen = seen_by_php(&proxy).await;
    assert_edge_fields_absent(&seen);
    assert_eq!(seen["HTTP_X_CUSTOM"], "kept", "{seen}");
}

#[tokio::test]
async fn a_kept_underscore_name_never_overrides_its_dashed_twin_at_php_fpm() {
    let (proxy, _fpm) =
        behind_php_fpm(tempfile::tempdir().unwrap(), "underscores_in_headers: true").await;
    let r = send(
        client()
            .get(proxy.url("/index.php"))
            .header("X-Custom", "dashed")
            .header("X_Custom", "underscored"),
    )
    .await;
    assert_eq!(json(&r.body)["HTTP_X_CUSTOM"], "dashed", "{}", r.body);
}
