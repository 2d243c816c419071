//! Site rules in front of a real php-fpm: a rewrite to a front controller (the CGI parameters PHP sees), rewrites that try to leave the root or run an upload, REMOTE_USER from basic auth, and header rules on PHP's answers.

mod common;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use common::app::{app, from, get, text};
use common::php_fpm::PhpFpm;
use common::php_fpm::EVIL_UPLOAD as EVIL;

/// Prints what PHP was told about the request.
const ECHO: &str = r#"<?php
header('Content-Type: application/json');
$out = [];
foreach (['SCRIPT_NAME', 'SCRIPT_FILENAME', 'PATH_INFO', 'REQUEST_URI', 'QUERY_STRING',
          'REMOTE_USER', 'AUTH_TYPE', 'HTTP_AUTHORIZATION', 'PHP_SELF'] as $k) {
    $out[$k] = $_SERVER[$k] ?? null;
}
$out['GET'] = $_GET;
echo json_encode($out);
"#;

fn site(dir: &Path) -> PathBuf {
    let root = dir.join("www");
    std::fs::create_dir_all(root.join("uploads")).unwrap();
    std::fs::write(root.join("index.php"), ECHO).unwrap();
    std::fs::write(root.join("uploads/evil.jpg"), EVIL).unwrap();
    std::fs::write(root.join("style.css"), "a{}").unwrap();
    std::fs::write(root.join(".env"), "SECRET=1").unwrap();
    std::fs::write(dir.join("outside.php"), EVIL).unwrap();
    root
}

/// php-fpm as a careless host runs it (`.jpg` allowed to run, fix_pathinfo on).
const CARELESS_POOL: &str =
    "security.limit_extensions = .php .jpg\nphp_admin_value[cgi.fix_pathinfo] = 1";

fn start(routes: &str) -> (tollgate::App, PhpFpm, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, CARELESS_POOL);
    let yaml = format!(
        "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\nroutes:\n{routes}",
        fpm.socket.display(),
        root.display()
    );
    (app(&yaml), fpm, dir)
}

async fn json(app: &tollgate::App, path: &str, headers: &[(&str, &str)]) -> serde_json::Value {
    let r = app
        .handle(get(path, headers), from("203.0.113.9:4000"))
        .await;
    assert_eq!(r.status(), 200, "{path}");
    serde_json::from_str(&text(r).await).unwrap()
}

#[tokio::test]
async fn a_rewrite_to_a_front_controller_gives_php_the_new_script_and_query_and_the_original_uri() {
    let (app, _fpm, dir) = start(
        "  - { name: product, match: { path_regex: '^/product/(?P<id>\\w+)$' }, rewrite: { to: '/index.php?product=${id}' }, upstream: php }\n\
         \x20 - { name: site, match: { path_prefix: / }, rewrite: { to: '/index.php', unless_exists: true }, upstream: php }\n",
    );
    let s = json(&app, "/product/shoe?utm=1", &[]).await;
    assert_eq!(s["SCRIPT_NAME"], "/index.php");
    assert_eq!(
        s["SCRIPT_FILENAME"],
        format!("{}/www/index.php", dir.path().display())
    );
    assert_eq!(s["PATH_INFO"], "");
    assert_eq!(s["QUERY_STRING"], "product=shoe");
    assert_eq!(s["GET"]["product"], "shoe");
    assert_eq!(
        s["REQUEST_URI"], "/product/shoe?utm=1",
        "the client's request line"
    );
    // `unless_exists`: a pretty URL reaches the front controller with its query,
    let s = json(&app, "/2024/hello-world/?p=2", &[]).await;
    assert_eq!(
        (s["SCRIPT_NAME"].as_str(), s["QUERY_STRING"].as_str()),
        (Some("/index.php"), Some("p=2"))
    );
    assert_eq!(s["REQUEST_URI"], "/2024/hello-world/?p=2");
    // and a file that exists is served as it is.
    let r = app
        .handle(get("/style.css", &[]), from("203.0.113.9:4000"))
        .await;
    assert_eq!((r.status().as_u16(), text(r).await.as_str()), (200, "a{}"));
}

#[tokio::test]
async fn a_rewritten_path_cannot_leave_the_root_run_an_upload_or_reach_a_hidden_file() {
    let (app, _fpm, dir) = start(
        "  - { name: img, match: { path_regex: '^/img/(.*)$' }, rewrite: { to: '/uploads/$1' }, upstream: php }\n\
         \x20 - { name: up, match: { path_regex: '^/up/(.*)$' }, rewrite: { to: '/../../$1' }, upstream: php }\n\
         \x20 - { name: env, match: { path: /config }, rewrite: { to: '/.env' }, upstream: php }\n",
    );
    for path in [
        "/img/evil.jpg/x.php",
        "/up/outside.php",
        "/up/www/../outside.php",
        "/config",
    ] {
        let r = app.handle(get(path, &[]), from("203.0.113.9:4000")).await;
        assert_eq!(r.status(), 404, "{path}");
        assert!(!text(r).await.contains("SECRET"), "{path}");
    }
    let r = app
        .handle(get("/img/evil.jpg", &[]), from("203.0.113.9:4000"))
        .await;
    assert_eq!(
        r.headers()["content-type"],
        "image/jpeg",
        "an upload is a file, never a script"
    );
    assert!(
        !dir.path().join("evil-ran").exists(),
        "the upload never ran"
    );
}

#[tokio::test]
async fn php_learns_the_basic_auth_user_and_header_rules_shape_its_answers() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("htpasswd");
    std::fs::write(&users, "bob:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\n").unwrap();
    let (app, _fpm, _site) = start(&format!(
        "  - name: admin\n    match: {{ path_prefix: / }}\n    auth: {{ basic: {{ realm: Staff, users_file: \"{}\" }} }}\n    headers: {{ response: {{ set: {{ X-Frame-Options: SAMEORIGIN }}, remove: [X-Powered-By] }} }}\n    upstream: php\n",
        users.display()
    ));
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("bob:password")
    );
    let r = app
        .handle(
            get("/index.php", &[("authorization", &auth)]),
            from("203.0.113.9:4000"),
        )
        .await;
    assert_eq!(r.headers()["x-frame-options"], "SAMEORIGIN");
    assert!(
        !r.headers().contains_key("x-powered-by"),
        "PHP's header removed"
    );
    let s: serde_json::Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(s["REMOTE_USER"], "bob");
    assert_eq!(s["AUTH_TYPE"], "Basic");
    assert!(
        s["HTTP_AUTHORIZATION"].is_null(),
        "the password stays with tollgate"
    );
    let r = app
        .handle(get("/index.php", &[]), from("203.0.113.9:4000"))
        .await;
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["x-frame-options"],
        "SAMEORIGIN",
        "own answers gain them too"
    );
}
