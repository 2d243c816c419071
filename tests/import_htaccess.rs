//! `tollgate import htaccess` on WordPress's, Drupal's and Joomla's stock files and on a legacy file with every directive: each output passes `check` as it stands and serves the site through a real php-fpm.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::app::{app, from, get, text};
use common::php_fpm::PhpFpm;

/// Prints the script PHP ran and the request line it was told about.
const ECHO: &str = r#"<?php header('Content-Type: application/json');
echo json_encode(['script' => $_SERVER['SCRIPT_NAME'], 'uri' => $_SERVER['REQUEST_URI'], 'query' => $_SERVER['QUERY_STRING']]);"#;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/htaccess")
        .join(name)
}

/// A document root with the scripts the stock rules name.
fn root(dir: &Path) -> PathBuf {
    let root = dir.join("www");
    for d in ["api", "core", "sites/default", "wp-content"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in [
        "index.php",
        "api/index.php",
        "core/install.php",
        "sites/default/settings.php",
        "wp-config.php",
        "cron.php",
    ] {
        std::fs::write(root.join(f), ECHO).unwrap();
    }
    std::fs::write(root.join("style.css"), "a{}").unwrap();
    root
}

/// The import's stdout (the config) and stderr (the findings).
fn import(file: &Path, root: &Path, upstream: &str) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["import", "htaccess"])
        .arg(file)
        .arg("--root")
        .arg(root)
        .args(["--upstream", upstream])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn check(config: &str, dir: &Path) {
    let path = dir.join("imported.yaml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{config}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// php-fpm on `root`, the imported config checked and served in-process.
fn serve(name: &str) -> (tollgate::App, String, PhpFpm, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let www = root(dir.path());
    let fpm = PhpFpm::start(dir.path(), &www, 2, "");
    let (config, findings) = import(
        &fixture(name),
        &www,
        &format!("fastcgi://{}", fpm.socket.display()),
    );
    let users = dir.path().join("htpasswd");
    std::fs::write(&users, "bob:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\n").unwrap();
    let config = config.replace("/etc/tollgate/htpasswd", &users.display().to_string());
    check(&config, dir.path());
    (app(&config), findings, fpm, dir)
}

async fn answer(app: &tollgate::App, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let r = app
        .handle(get(path, headers), from("203.0.113.9:4000"))
        .await;
    let status = r.status().as_u16();
    (status, text(r).await)
}

fn warnings(findings: &str) -> Vec<&str> {
    findings
        .lines()
        .filter(|l| l.contains(": warning: "))
        .collect()
}

#[tokio::test]
async fn wordpress_stock_rules_translate_without_a_warning_and_serve_pretty_permalinks() {
    let (app, findings, _fpm, _dir) = serve("wordpress.htaccess");
    assert!(warnings(&findings).is_empty(), "{findings}");
    let (status, body) = answer(&app, "/2024/05/hello-world/?replytocom=2", &[]).await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#""script":"\/index.php""#) && body.contains("hello-world"),
        "{body}"
    );
    assert_eq!(
        answer(&app, "/style.css", &[]).await,
        (200, "a{}".to_string())
    );
}

#[tokio::test]
async fn drupal_stock_rules_protect_its_files_and_route_to_its_front_controller() {
    let (app, findings, _fpm, _dir) = serve("drupal.htaccess");
    // The one rule left out redirects a pre-8 installer's URL (`/install.php`
    // to `/core/install.php`) with condition back-references (`%1/core/%2`).
    assert_eq!(warnings(&findings).len(), 1, "{findings}");
    assert!(warnings(&findings)[0].contains(":122: "), "{findings}");
    for denied in [
        "/sites/default/settings.php",
        "/autoload.php",
        "/.git/config",
        "/modules/x.module",
        "/db.sql",
    ] {
        assert_eq!(answer(&app, denied, &[]).await.0, 403, "{denied}");
    }
    let (status, body) = answer(&app, "/core/install.php", &[]).await;
    assert!(status == 200 && body.contains("rewrite=ok"), "{body}");
    let (status, body) = answer(&app, "/node/1", &[]).await;
    assert!(
        status == 200 && body.contains(r#""script":"\/index.php""#),
        "{body}"
    );
    let (_, body) = answer(&app, "/", &[]).await;
    assert!(body.contains("index.php"), "{body}");
}

#[tokio::test]
async fn joomla_stock_rules_block_exploit_queries_and_route_the_api() {
    let (app, findings, _fpm, _dir) = serve("joomla.htaccess");
    assert!(warnings(&findings).is_empty(), "{findings}");
    assert_eq!(answer(&app, "/?x=base64_encode(abc)", &[]).await.0, 403);
    assert_eq!(answer(&app, "/?GLOBALS=1", &[]).await.0, 403);
    let (_, body) = answer(&app, "/api/v1/content/articles", &[]).await;
    assert!(body.contains(r#""script":"\/api\/index.php""#), "{body}");
    let (_, body) = answer(&app, "/blog/a-post", &[]).await;
    assert!(body.contains(r#""script":"\/index.php""#), "{body}");
    let r = app
        .handle(get("/style.css", &[]), from("203.0.113.9:4000"))
        .await;
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
}

#[tokio::test]
async fn a_legacy_file_with_every_directive_translates_and_each_rule_holds() {
    let (app, findings, _fpm, _dir) = serve("legacy.htaccess");
    assert!(warnings(&findings).is_empty(), "{findings}");
    let auth = [("authorization", "Basic Ym9iOnBhc3N3b3Jk")];
    assert_eq!(answer(&app, "/", &[]).await.0, 401, "AuthType Basic");
    let r = app
        .handle(get("/blog/7/Hello-World", &auth), from("203.0.113.9:4000"))
        .await;
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["location"].to_str().unwrap()
        ),
        (301, "/posts/7/Hello-World")
    );
    let r = app
        .handle(get("/about-us/team", &auth), from("203.0.113.9:4000"))
        .await;
    assert_eq!(r.headers()["location"], "/about/team");
    let r = app
        .handle(get("/news/12", &auth), from("203.0.113.9:4000"))
        .await;
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["location"].to_str().unwrap()
        ),
        (302, "/blog/12")
    );
    assert_eq!(answer(&app, "/retired.html", &auth).await.0, 410);
    assert_eq!(answer(&app, "/wp-config.php", &auth).await.0, 403);
    assert_eq!(answer(&app, "/backup.sql", &auth).await.0, 403);
    assert_eq!(answer(&app, "/cron.php", &auth).await.0, 403, "Require ip");
    assert_eq!(answer(&app, "/?id=1+union+select+2", &auth).await.0, 403);
    let (_, body) = answer(&app, "/shop/item/shoe?c=red", &auth).await;
    assert!(
        body.contains(r#""query":"route=product&id=shoe&c=red""#),
        "{body}"
    );
    let (_, body) = answer(&app, "/some/page", &auth).await;
    assert!(body.contains(r#""query":"q=some\/page""#), "{body}");
    let r = app
        .handle(get("/style.css", &auth), from("203.0.113.9:4000"))
        .await;
    assert_eq!(r.headers()["cache-control"], "max-age=31536000, public");
    assert_eq!(r.headers()["x-frame-options"], "SAMEORIGIN");
    let r = app.handle(get("/", &auth), from("198.51.100.7:1")).await;
    assert_eq!(r.status(), 403, "Deny from");
    let r = app.handle(get("/x", &auth), from("203.0.113.9:4000")).await;
    assert_eq!(r.status(), 200);
}
