//! FastCGI upstreams against a real php-fpm: the CGI environment PHP sees, bodies both ways, redirects, the fix_pathinfo hole, pooling.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::php_fpm::PhpFpm;
use common::php_fpm::EVIL_UPLOAD as EVIL;
use common::{client, send, Proxy, Tap};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Prints what PHP was told about the request, and a hash of the body it read.
const ECHO: &str = r#"<?php
$in = file_get_contents('php://input');
header('Content-Type: application/json');
$out = [];
foreach (['REMOTE_ADDR', 'REMOTE_PORT', 'SCRIPT_NAME', 'SCRIPT_FILENAME', 'PATH_INFO',
          'REQUEST_URI', 'QUERY_STRING', 'REQUEST_METHOD', 'DOCUMENT_ROOT', 'SERVER_NAME',
          'SERVER_PORT', 'SERVER_PROTOCOL', 'GATEWAY_INTERFACE', 'CONTENT_TYPE',
          'CONTENT_LENGTH', 'HTTPS', 'HTTP_X_CUSTOM', 'HTTP_PROXY', 'HTTP_X_REAL_IP',
          'HTTP_X_FORWARDED_FOR', 'HTTP_HOST', 'HTTP_COOKIE', 'PHP_SELF'] as $k) {
    $out[$k] = $_SERVER[$k] ?? null;
}
$out['GET'] = $_GET;
$out['body_len'] = strlen($in);
$out['body_sha256'] = hash('sha256', $in);
echo json_encode($out);
"#;

/// 20 MiB in 64 KiB pieces, flushed as they go; leaves a mark when done.
const BIG: &str = r#"<?php
header('Content-Type: application/octet-stream');
$chunk = str_repeat('0123456789abcdef', 4096);
for ($i = 0; $i < 320; $i++) { echo $chunk; flush(); }
file_put_contents(__DIR__ . '/../big-done', '1');
"#;

const REDIRECT: &str = r#"<?php
setcookie('a', '1');
setcookie('b', '2');
header('Location: /login.php');
echo 'moved';
"#;

/// The document root: scripts, an upload, static and private files.
fn site(dir: &Path) -> PathBuf {
    let root = dir.join("www");
    std::fs::create_dir_all(root.join("uploads")).unwrap();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("index.php"), ECHO).unwrap();
    std::fs::write(root.join("docs/index.php"), ECHO).unwrap();
    std::fs::write(root.join("big.php"), BIG).unwrap();
    std::fs::write(root.join("redirect.php"), REDIRECT).unwrap();
    std::fs::write(root.join("uploads/evil.jpg"), EVIL).unwrap();
    std::fs::write(root.join("style.css"), "body { color: red }").unwrap();
    std::fs::write(root.join("config.inc"), "<?php $password = 'hunter2';").unwrap();
    std::fs::write(root.join(".env"), "DB_PASSWORD=hunter2").unwrap();
    root
}

/// php-fpm as a careless host configures it: `cgi.fix_pathinfo` on (PHP's
/// default) and `.jpg` allowed to run. Only tollgate stands between an
/// upload and code execution here, which is what the tests check.
const CARELESS_POOL: &str =
    "security.limit_extensions = .php .jpg\nphp_admin_value[cgi.fix_pathinfo] = 1";

fn yaml(url: &str, root: &Path, extra: &str) -> String {
    format!(
        "{extra}upstreams:\n  php: {{ url: \"{url}\", root: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        root.display()
    )
}

/// The site on php-fpm's unix socket, the upstream given `keys` besides its URL and root.
fn yaml_with(fpm: &PhpFpm, root: &Path, keys: &str) -> String {
    format!(
        "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\", {keys} }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        fpm.socket.display(),
        root.display()
    )
}

async fn start(extra: &str, tcp: bool) -> (Proxy, PhpFpm, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 3, CARELESS_POOL);
    let url = if tcp {
        format!("fastcgi://{}", fpm.tcp)
    } else {
        format!("fastcgi://{}", fpm.socket.display())
    };
    let proxy = Proxy::start(&yaml(&url, &root, extra)).await;
    (proxy, fpm, dir)
}

#[tokio::test]
async fn php_sees_the_real_client_its_script_path_info_query_method_and_headers() {
    let (proxy, _fpm, dir) = start("", false).await;
    let c = client();
    let r = send(
        c.put(proxy.url("/index.php/a/b?x=1&y=%C3%A9"))
            .header("x-custom", "hello")
            .header("proxy", "http://evil.example:3128")
            .header("x-forwarded-for", "6.6.6.6")
            .header("cookie", "s=1")
            .body("payload"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let s = r.json();
    let root = dir.path().join("www");
    assert_eq!(
        s["REMOTE_ADDR"], "127.0.0.1",
        "the client, not a claimed address"
    );
    assert!(s["REMOTE_PORT"]
        .as_str()
        .is_some_and(|p| p.parse::<u16>().is_ok()));
    assert_eq!(s["SCRIPT_NAME"], "/index.php");
    assert_eq!(
        s["SCRIPT_FILENAME"],
        format!("{}/index.php", root.display())
    );
    assert_eq!(s["PATH_INFO"], "/a/b");
    assert_eq!(s["PHP_SELF"], "/index.php/a/b");
    assert_eq!(s["REQUEST_URI"], "/index.php/a/b?x=1&y=%C3%A9");
    assert_eq!(s["QUERY_STRING"], "x=1&y=%C3%A9");
    assert_eq!(s["GET"]["y"], "é");
    assert_eq!(s["REQUEST_METHOD"], "PUT");
    assert_eq!(s["DOCUMENT_ROOT"], root.display().to_string());
    assert_eq!(s["SERVER_NAME"], "127.0.0.1");
    assert_eq!(s["SERVER_PORT"], proxy.addr.port().to_string());
    assert_eq!(s["SERVER_PROTOCOL"], "HTTP/1.1");
    assert_eq!(s["GATEWAY_INTERFACE"], "CGI/1.1");
    assert_eq!(s["CONTENT_LENGTH"], "7");
    assert_eq!(s["HTTPS"], serde_json::Value::Null);
    assert_eq!(s["HTTP_X_CUSTOM"], "hello");
    assert_eq!(s["HTTP_PROXY"], serde_json::Value::Null, "httpoxy");
    assert_eq!(s["HTTP_X_FORWARDED_FOR"], "127.0.0.1");
    assert_eq!(s["HTTP_X_REAL_IP"], "127.0.0.1");
    assert_eq!(s["HTTP_HOST"], proxy.addr.to_string());
    assert_eq!(s["HTTP_COOKIE"], "s=1");
    assert_eq!(s["body_len"], 7);

    // A directory is its index script.
    let r = send(c.get(proxy.url("/docs/"))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["SCRIPT_NAME"], "/docs/index.php");
    let r = send(c.get(proxy.url("/"))).await;
    assert_eq!(r.json()["SCRIPT_NAME"], "/index.php");
}

#[tokio::test]
async fn behind_a_trusted_load_balancer_remote_addr_is_the_client_it_vouches_for() {
    let (proxy, _fpm, _dir) =
        start("identity:\n  trusted_proxies: [\"127.0.0.1/32\"]\n", true).await;
    let r = send(
        client()
            .get(proxy.url("/index.php"))
            .header("x-forwarded-for", "6.6.6.6, 203.0.113.7"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let s = r.json();
    assert_eq!(
        s["REMOTE_ADDR"], "203.0.113.7",
        "the rightmost untrusted address"
    );
    assert_eq!(
        s["REMOTE_PORT"],
        serde_json::Value::Null,
        "the balancer's port is not the client's"
    );
    assert_eq!(s["HTTP_X_REAL_IP"], "203.0.113.7");
}

#[tokio::test]
async fn a_5_mb_post_body_reaches_php_intact() {
    let (proxy, _fpm, _dir) = start("", true).await;
    let body: Vec<u8> = (0..5 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let expected = hex(&Sha256::digest(&body));
    let r = send(
        client()
            .post(proxy.url("/index.php"))
            .header("content-type", "application/octet-stream")
            .body(body),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let s = r.json();
    assert_eq!(s["body_len"], 5 * 1024 * 1024);
    assert_eq!(s["body_sha256"], expected);
    assert_eq!(s["CONTENT_TYPE"], "application/octet-stream");
}

#[tokio::test]
async fn a_body_without_a_length_is_refused_before_php_runs() {
    let (proxy, _fpm, _dir) = start("", false).await;
    let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(b"POST /index.php HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert_eq!(common::status_of(&out), 411, "{out}");
}

#[tokio::test]
async fn a_302_with_location_and_two_cookies_passes_through() {
    let (proxy, _fpm, _dir) = start("", false).await;
    let r = send(client().get(proxy.url("/redirect.php"))).await;
    assert_eq!(r.status, 302, "{}", r.body);
    assert_eq!(r.headers["location"], "/login.php");
    let cookies: Vec<_> = r.headers.get_all("set-cookie").iter().collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert_eq!(r.body, "moved");
}

#[tokio::test]
async fn an_uploaded_jpg_never_runs_even_when_php_fpm_would_let_it() {
    let (proxy, _fpm, dir) = start("", false).await;
    let c = client();
    let ran = dir.path().join("evil-ran");
    // The classic: php-fpm, told about a missing x.php, would fall back to
    // evil.jpg (fix_pathinfo) and run it (limit_extensions allows .jpg).
    // An encoded slash is refused before routing (server.encoded_separators).
    for (path, status) in [
        ("/uploads/evil.jpg/x.php", 404),
        ("/uploads/evil.jpg/x.php/more", 404),
        ("/uploads/evil.jpg%2Fx.php", 400),
    ] {
        let r = send(c.get(proxy.url(path))).await;
        assert_eq!(r.status, status, "{path}: {}", r.body);
        assert!(!r.body.contains("EVIL RAN"), "{path}");
    }
    // The image itself is a static file: its bytes, never run.
    let r = send(c.get(proxy.url("/uploads/evil.jpg"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "image/jpeg");
    assert_eq!(r.headers["x-content-type-options"], "nosniff");
    assert_eq!(r.body, EVIL);
    assert!(!ran.exists(), "evil.jpg was executed");
}

#[tokio::test]
async fn static_files_are_served_and_source_secrets_and_hidden_files_are_not() {
    let (proxy, _fpm, _dir) = start("", false).await;
    let c = client();
    let r = send(c.get(proxy.url("/style.css"))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/css; charset=utf-8");
    assert_eq!(r.body, "body { color: red }");
    assert_eq!(
        send(c.post(proxy.url("/style.css")).body("x")).await.status,
        405
    );
    for path in [
        "/config.inc",
        "/.env",
        "/missing.php",
        "/uploads/",
        "/../www/config.inc",
        "/INDEX.PHP",
    ] {
        let r = send(c.get(proxy.url(path))).await;
        assert_eq!(r.status, 404, "{path}: {}", r.body);
        assert!(!r.body.contains("hunter2"), "{path}");
    }
}

#[tokio::test]
async fn php_fpm_down_is_a_502() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let url = format!("fastcgi://{}", dir.path().join("nobody.sock").display());
    let proxy = Proxy::start(&yaml(&url, &root, "")).await;
    let r = send(client().get(proxy.url("/index.php"))).await;
    assert_eq!(r.status, 502, "{}", r.body);
}

#[tokio::test]
async fn connections_to_php_fpm_are_kept_and_reused() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 3, "");
    // Counts the connections tollgate opens to php-fpm by relaying them.
    let relay = Tap::start(fpm.tcp).await;
    let proxy = Proxy::start(&yaml(&format!("fastcgi://{}", relay.addr), &root, "")).await;
    let c = client();
    for i in 0..30 {
        let r = send(c.get(proxy.url(&format!("/index.php?i={i}")))).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["GET"]["i"], i.to_string());
    }
    let n = relay.recorded().len();
    // One per worker thread at most; without FCGI_KEEP_CONN it would be 30.
    assert!(n <= 3, "{n} connections for 30 sequential requests");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The real binary, so its RSS is tollgate's alone: a client that stops
/// reading holds php-fpm back (php cannot finish) and tollgate's memory
/// stays flat; then all 20 MiB arrive intact.
#[tokio::test]
async fn a_20_mb_response_streams_without_tollgate_holding_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let url = format!("fastcgi://{}", fpm.socket.display());
    let mut process = common::Process::serve(&yaml(&url, &root, ""), dir.path());
    let warm = common::http(process.addr, "GET", "/index.php").unwrap();
    assert_eq!(warm.status, 200, "{}", warm.body);
    let before = process.rss_kib();

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    let mut s = socket.connect(process.addr).await.unwrap();
    s.write_all(b"GET /big.php HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut first = vec![0u8; 64 * 1024];
    let n = s.read(&mut first).await.unwrap();
    assert!(n > 0);
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    // That php is held back is a negative, so it needs the clock: read as
    // it goes, the whole 20 MiB arrives in a fraction of this wait (the
    // read below prints how long), so a proxy that buffered them would
    // have let php finish well within it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let done = dir.path().join("big-done");
    assert!(
        !done.exists(),
        "php finished while the client read nothing: something buffered 20 MiB"
    );
    let during = process.rss_kib();
    assert!(
        during < before + 10 * 1024,
        "tollgate grew from {before} KiB to {during} KiB"
    );

    let mut rest = Vec::with_capacity(21 << 20);
    rest.extend_from_slice(&first[..n]);
    let reading = std::time::Instant::now();
    s.read_to_end(&mut rest).await.unwrap();
    eprintln!("the rest of the 20 MiB read in {:?}", reading.elapsed());
    let text_end = rest.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let body = common::dechunk(&rest[text_end..]);
    assert_eq!(body.len(), 20 << 20);
    let chunk = b"0123456789abcdef".repeat(4096);
    assert!(body.chunks(chunk.len()).all(|c| c == &chunk[..]));
    assert!(done.exists());
    process.signal("TERM");
    process.wait_exit(Duration::from_secs(10));
}

#[tokio::test]
async fn php_fpm_children_exiting_after_max_requests_cost_no_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    // Every child exits after one request and closes its kept connection;
    // the relay passes the close on a moment later, as a busy network does.
    let fpm = PhpFpm::start(dir.path(), &root, 2, "pm.max_requests = 1");
    // Counts the connections tollgate opens to php-fpm by relaying them.
    let relay = Tap::start(fpm.tcp).await;
    let proxy = Proxy::start(&yaml(&format!("fastcgi://{}", relay.addr), &root, "")).await;
    let c = client();
    for i in 0..20 {
        let r = send(c.get(proxy.url(&format!("/index.php?i={i}")))).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.body);
    }
    assert!(relay.recorded().len() >= 10, "the children really exited");
}

#[tokio::test]
async fn with_a_fallback_a_pretty_url_runs_the_front_controller_with_its_own_request_uri() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, CARELESS_POOL);
    let yaml = yaml_with(&fpm, &root, "fallback: /index.php");
    let proxy = Proxy::start(&yaml).await;
    let c = client();
    let r = send(c.get(proxy.url("/2024/05/hello-world/?replytocom=3"))).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let s = r.json();
    assert_eq!(s["SCRIPT_NAME"], "/index.php");
    assert_eq!(s["REQUEST_URI"], "/2024/05/hello-world/?replytocom=3");
    assert_eq!(s["QUERY_STRING"], "replytocom=3");
    // Never a way around the script check, nor to hidden files.
    assert_eq!(
        send(c.get(proxy.url("/uploads/evil.jpg/x.php")))
            .await
            .status,
        404
    );
    assert_eq!(send(c.get(proxy.url("/missing.php"))).await.status, 404);
    assert_eq!(send(c.get(proxy.url("/.env"))).await.status, 404);
    assert!(!dir.path().join("evil-ran").exists());
}

/// What PHP was told, without what differs between two requests of one client.
fn told(r: &common::Answer) -> serde_json::Value {
    let mut s = r.json();
    s.as_object_mut().unwrap().remove("REMOTE_PORT");
    s
}

#[tokio::test]
async fn a_remembered_script_runs_exactly_as_one_looked_up_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let yaml = yaml_with(&fpm, &root, "fallback: /index.php, script_cache: 1h");
    let proxy = Proxy::start(&yaml).await;
    let c = client();
    let series = |result| {
        format!("tollgate_fastcgi_script_cache_total{{upstream=\"php\",result=\"{result}\"}}")
    };
    for path in [
        "/docs/index.php/a/b?x=1",
        "/2024/05/hello-world/?replytocom=3",
    ] {
        let looked_up = send(c.get(proxy.url(path))).await;
        let hits = proxy.metric(&series("hit")).await.expect("counted");
        let remembered = send(c.get(proxy.url(path))).await;
        assert_eq!(looked_up.status, 200, "{}", looked_up.body);
        assert_eq!(told(&remembered), told(&looked_up), "{path}");
        let after = proxy.metric(&series("hit")).await.expect("counted");
        assert_eq!(after, hits + 1.0, "{path}: the second was not remembered");
    }
}

#[tokio::test]
async fn more_requests_than_php_fpm_children_wait_for_a_connection_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    std::fs::write(root.join("slow.php"), "<?php usleep(200000); echo 'done';").unwrap();
    // A php-fpm child serves one kept connection until it closes: with more
    // connections than children, the extra ones would wait for ever.
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let yaml = yaml_with(&fpm, &root, "max_conns: 2, timeout: 8s");
    let proxy = Proxy::start(&yaml).await;
    let c = client();
    for _round in 0..2 {
        let all: Vec<_> = (0..8)
            .map(|_| {
                let (c, url) = (c.clone(), proxy.url("/slow.php"));
                tokio::spawn(async move { send(c.get(url)).await })
            })
            .collect();
        for t in all {
            let r = t.await.unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(r.body, "done");
        }
    }
}
