//! The response cache in front of a real php-fpm: PHP counts its own renders; hits, one render for a burst, php-fpm killed, logged-in visitors, cache deception, purge.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::php_fpm::PhpFpm;
use common::{client, send, Answer, Proxy};

/// Logs each render (PHP's own count), sends the headers and status the
/// query asks for, and greets a logged-in session by name.
const PAGE: &str = r#"<?php
file_put_contents(RENDERS, $_SERVER['SCRIPT_NAME'] . "\n", FILE_APPEND | LOCK_EX);
foreach (($_GET['h'] ?? []) as $h) header($h, false);
if (isset($_GET['status'])) http_response_code((int)$_GET['status']);
if (isset($_GET['sleep_ms'])) usleep((int)$_GET['sleep_ms'] * 1000);
header('Content-Type: text/html; charset=utf-8');
$user = null;
if (isset($_COOKIE['PHPSESSID'])) {
    session_cache_limiter('');
    session_start();
    $user = $_SESSION['user'] ?? 'nobody';
}
$n = count(file(RENDERS));
echo "<html><body><p>render $n of {$_SERVER['REQUEST_URI']}</p>";
if ($user !== null) echo '<p>hello ' . htmlspecialchars($user) . '</p>';
echo "</body></html>";
"#;

/// Logs in (a PHP session) as the user named in the query.
const LOGIN: &str = r#"<?php
session_start();
$_SESSION['user'] = $_GET['user'] ?? 'alice';
echo 'logged in';
"#;

/// A private page that sends no cache headers at all (its session's
/// limiter turned off): only tollgate's own rules keep it out of the cache.
const ACCOUNT: &str = r#"<?php
file_put_contents(RENDERS, $_SERVER['SCRIPT_NAME'] . "\n", FILE_APPEND | LOCK_EX);
session_cache_limiter('');
if (isset($_COOKIE['PHPSESSID'])) session_start();
header('Content-Type: text/html; charset=utf-8');
echo 'account of ' . htmlspecialchars($_SESSION['user'] ?? 'anonymous');
"#;

struct Site {
    proxy: Proxy,
    fpm: Option<PhpFpm>,
    renders: PathBuf,
    _dir: tempfile::TempDir,
}

impl Site {
    async fn start(cache: &str) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("www");
        let renders = dir.path().join("renders.log");
        std::fs::write(&renders, "").unwrap();
        let define = format!("<?php define('RENDERS', '{}'); ?>", renders.display());
        for (file, code) in [
            ("page.php", PAGE),
            ("blog/post.php", PAGE),
            ("news/post.php", PAGE),
            ("login.php", LOGIN),
            ("account.php", ACCOUNT),
        ] {
            let path = root.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{define}{code}")).unwrap();
        }
        std::fs::write(root.join("style.css"), "body { color: red }").unwrap();
        let fpm = PhpFpm::start(dir.path(), &root, 4, "");
        let yaml = format!(
            "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\", max_conns: 4 }}\nroutes:\n  - {{ name: site, match: {{ path_prefix: / }}, upstream: php, cache: {cache} }}\n",
            fpm.socket.display(),
            root.display()
        );
        let proxy = Proxy::start(&yaml).await;
        Site {
            proxy,
            fpm: Some(fpm),
            renders,
            _dir: dir,
        }
    }

    /// Renders of `script` PHP counted itself.
    fn renders(&self, script: &str) -> usize {
        let log = std::fs::read_to_string(&self.renders).unwrap();
        log.lines().filter(|l| *l == script).count()
    }

    /// Logs `user` in: the session cookie (`PHPSESSID=…`) to send.
    async fn login(&self, user: &str) -> String {
        let login = self.get(&format!("/login.php?user={user}"), &[]).await;
        let set = login.headers["set-cookie"].to_str().unwrap();
        set.split(';').next().unwrap().to_string()
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = client().get(self.proxy.url(path));
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        send(req).await
    }
}

fn cache_status(a: &Answer) -> &str {
    a.headers
        .get("cache-status")
        .map_or("", |v| v.to_str().unwrap())
}

#[tokio::test]
async fn the_second_get_never_reaches_php() {
    let site = Site::start("{ ttl: 60s }").await;
    let first = site.get("/page.php?x=1", &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(
        cache_status(&first).contains("stored"),
        "{}",
        cache_status(&first)
    );
    let second = site.get("/page.php?x=1", &[]).await;
    assert!(cache_status(&second).starts_with("tollgate; hit"));
    assert_eq!(second.body, first.body);
    assert_eq!(site.renders("/page.php"), 1);
}

/// RFC 9111 on what PHP sends: (the headers PHP sends, stored).
#[tokio::test]
async fn what_php_sends_decides_what_is_stored() {
    let site = Site::start("{}").await;
    let table: &[(&str, bool)] = &[
        ("h[]=Cache-Control:+max-age%3D60", true),
        ("h[]=Cache-Control:+s-maxage%3D60", true),
        ("h[]=Expires:+Thu,+01+Jan+2099+00:00:00+GMT", true),
        ("", false),
        ("h[]=Cache-Control:+max-age%3D60,+private", false),
        ("h[]=Cache-Control:+no-store", false),
        (
            "h[]=Cache-Control:+max-age%3D60&h[]=Set-Cookie:+a%3D1",
            false,
        ),
        ("h[]=Cache-Control:+max-age%3D60&h[]=Vary:+*", false),
        ("h[]=Last-Modified:+Thu,+01+Jan+2015+00:00:00+GMT", false),
        ("h[]=Cache-Control:+max-age%3D60&status=500", false),
    ];
    for (i, (query, stored)) in table.iter().enumerate() {
        let path = format!("/page.php?row={i}&{query}");
        site.get(&path, &[]).await;
        let again = site.get(&path, &[]).await;
        assert_eq!(
            cache_status(&again).contains("hit"),
            *stored,
            "{query}: {}",
            cache_status(&again)
        );
    }
    let stored = table.iter().filter(|(_, s)| *s).count();
    assert_eq!(site.renders("/page.php"), 2 * table.len() - stored);
    let auth = site
        .get(
            "/page.php?row=0&h[]=Cache-Control:+max-age%3D60",
            &[("authorization", "Basic eDp5")],
        )
        .await;
    assert_eq!(
        cache_status(&auth),
        "tollgate; fwd=bypass",
        "Authorization never reads the cache"
    );
}

#[tokio::test]
async fn twenty_concurrent_misses_make_one_php_render() {
    let site = Site::start("{ ttl: 60s }").await;
    let c = client();
    let url = site.proxy.url("/page.php?sleep_ms=300");
    let answers = futures_util::future::join_all((0..20).map(|_| send(c.get(&url)))).await;
    assert!(answers
        .iter()
        .all(|a| a.status == 200 && a.body == answers[0].body));
    assert_eq!(site.renders("/page.php"), 1);
}

#[tokio::test]
async fn with_php_fpm_killed_stored_pages_are_served_within_stale_if_error() {
    let mut site = Site::start("{ ttl: 300ms, stale_if_error: 1h }").await;
    let kept = site.get("/page.php?kept", &[]).await;
    assert_eq!(kept.status, 200);
    drop(site.fpm.take());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let stale = site.get("/page.php?kept", &[]).await;
    assert_eq!(stale.status, 200, "{}", stale.body);
    assert!(
        cache_status(&stale).starts_with("tollgate; fwd=stale; fwd-status=50"),
        "{}",
        cache_status(&stale)
    );
    assert_eq!(stale.body, kept.body);
    let never_stored = site.get("/page.php?new", &[]).await;
    assert!(
        [502, 503].contains(&never_stored.status),
        "{}",
        never_stored.status
    );
}

#[tokio::test]
async fn a_logged_in_visitor_never_sees_nor_poisons_the_anonymous_page() {
    let site = Site::start("{ ttl: 60s }").await;
    let cookie = site.login("alice").await;
    let alice = [("cookie", cookie.as_str())];
    let hers = site.get("/page.php", &alice).await;
    assert!(hers.body.contains("hello alice"));
    assert_eq!(cache_status(&hers), "tollgate; fwd=bypass");
    let anonymous = site.get("/page.php", &[]).await;
    assert!(
        !anonymous.body.contains("alice"),
        "her page was not stored: {}",
        anonymous.body
    );
    assert!(cache_status(&anonymous).contains("stored"));
    let hers_again = site.get("/page.php", &alice).await;
    assert!(
        hers_again.body.contains("hello alice"),
        "never the anonymous copy"
    );
    assert!(cache_status(&site.get("/page.php", &[]).await).contains("hit"));
    assert_eq!(site.renders("/page.php"), 3);
}

#[tokio::test]
async fn a_private_page_under_a_static_looking_path_is_never_stored() {
    let site = Site::start("{ ttl: 60s }").await;
    let cookie = site.login("alice").await;
    let victim = site
        .get("/account.php/style.css", &[("cookie", cookie.as_str())])
        .await;
    assert_eq!(victim.body, "account of alice");
    assert_eq!(cache_status(&victim), "tollgate; fwd=bypass");
    let attacker = site.get("/account.php/style.css", &[]).await;
    assert_eq!(
        attacker.body, "account of anonymous",
        "the victim's page was never stored"
    );
    assert_eq!(site.renders("/account.php"), 2);
    // The real stylesheet is stored for what its headers say, not its name.
    let css = site.get("/style.css", &[]).await;
    assert_eq!(css.body, "body { color: red }");
}

#[tokio::test]
async fn a_purge_by_prefix_makes_php_render_those_pages_again() {
    let site = Site::start("{ ttl: 60s }").await;
    for path in ["/blog/post.php", "/news/post.php"] {
        site.get(path, &[]).await;
        assert!(cache_status(&site.get(path, &[]).await).contains("hit"));
    }
    let c = client();
    let purged = send(c.delete(site.proxy.admin_url("/cache?prefix=/blog/"))).await;
    assert_eq!(purged.status, 200, "{}", purged.body);
    assert_eq!(purged.json()["removed"], 1);
    assert!(cache_status(&site.get("/blog/post.php", &[]).await).contains("fwd=miss"));
    assert!(cache_status(&site.get("/news/post.php", &[]).await).contains("hit"));
    let listed = send(c.get(site.proxy.admin_url("/cache"))).await.json();
    assert_eq!(listed["entries"], 2);
    assert_eq!(listed["routes"][0]["renders_saved"], 3);
    let all = send(c.delete(site.proxy.admin_url("/cache"))).await.json();
    assert_eq!(all["entries"], 0);
}
