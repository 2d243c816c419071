//! A path limit holds for every spelling of the limited script that a real PHP stack runs: `php -S`, tollgate's FastCGI to php-fpm, nginx to php-fpm.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::php::PhpServer;
use common::php_fpm::PhpFpm;
use common::{eventually_blocking, free_addr, raw, Proxy, Reply};
use tollgate::clock::SystemClock;

/// Requests the limited script may run: the plain path at its limit.
const LIMIT: usize = 2;

/// The limited script: leaves one line per run next to the document root.
const WP_LOGIN: &str = r#"<?php file_put_contents(__DIR__ . '/../wp-login-ran', "1\n", FILE_APPEND); echo 'WP-LOGIN RAN';"#;

/// The front controller every other path may fall back to.
const INDEX: &str = r#"<?php echo 'INDEX';"#;

/// Every spelling tried once `/wp-login.php` is at its limit. The first
/// group spells a separator (`%2F`, `%5C`, `\`); the rest are the other
/// spellings an attacker reaches for: double encoding, NUL, `;` path
/// parameters, a trailing dot or space, encoded dots, mixed-case escapes.
const SEPARATOR_SPELLINGS: &[&str] = &[
    "/wp-login.php%2fx",
    "/wp-login.php%2Fx",
    "/wp-login.php%2F",
    "/x/..%2fwp-login.php",
    "/x%2F..%2Fwp-login.php",
    "/x%2f%2e%2E%2fwp-login.php",
    "/wp-login.php%5Cx",
    "/x%5c..%5cwp-login.php",
    "/x\\..\\wp-login.php",
    "/wp-login.php\\x",
];

const OTHER_SPELLINGS: &[&str] = &[
    "/wp-login.php%252fx",
    "/x/..%252fwp-login.php",
    "/wp-login.php%00",
    "/wp-login.php%00.jpg",
    "/wp-login.php;x",
    "/wp-login.php;/x",
    "/wp-login.php.",
    "/wp-login.php%20",
    "/wp-login%2ephp",
    "/x/%2e%2E/wp-login.php",
    "/%2E%2e/wp-login.php",
    "/WP-LOGIN.PHP",
];

/// Spellings whose separator the upstream decodes into a `/`.
fn spells_a_slash(path: &str) -> bool {
    path.to_ascii_lowercase().contains("%2f")
}

/// The document root with the limited script and a front controller.
fn site(dir: &Path) -> PathBuf {
    let root = dir.join("www");
    std::fs::create_dir_all(root.join("x")).unwrap();
    std::fs::write(root.join("wp-login.php"), WP_LOGIN).unwrap();
    std::fs::write(root.join("index.php"), INDEX).unwrap();
    root
}

/// How many times the limited script really ran.
fn runs(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("wp-login-ran"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// `/wp-login.php` behind a strict limit (a day: a minute could roll over
/// while a loaded machine answers the spellings), everything else unlimited, on `upstream`.
fn yaml(upstream: &str, server: &str) -> String {
    format!(
        "server: {{ {server} }}\nlimiters:\n  login: {{ limit: {LIMIT}, window: 1d }}\nupstreams:\n  site: {upstream}\nroutes:\n  - {{ name: login, match: {{ path: /wp-login.php }}, upstream: site, limiters: [login] }}\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: site }}\n"
    )
}

/// One request line as the client wrote it (no client library rewrites it).
async fn get(addr: SocketAddr, path: &str) -> Reply {
    let request = format!("GET {path} HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n");
    let answer = raw(addr, request.as_bytes(), Duration::from_secs(10)).await;
    Reply::parse(&answer).unwrap_or_else(|| panic!("{path}: no HTTP answer: {answer:?}"))
}

/// Runs the plain path to its limit, then every spelling; returns each
/// spelling with its answer, after checking the script ran only `LIMIT` times.
async fn exhaust_then_try(proxy: &Proxy, dir: &Path) -> Vec<(&'static str, Reply)> {
    for _ in 0..LIMIT {
        let r = get(proxy.addr, "/wp-login.php").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body, "WP-LOGIN RAN");
    }
    assert_eq!(get(proxy.addr, "/wp-login.php").await.status, 429);
    let mut answers = Vec::new();
    for &path in SEPARATOR_SPELLINGS.iter().chain(OTHER_SPELLINGS) {
        answers.push((path, get(proxy.addr, path).await));
    }
    let table: Vec<String> = answers
        .iter()
        .map(|(p, r)| format!("{p} -> {} {:.40}", r.status, r.body))
        .collect();
    assert_eq!(
        runs(dir),
        LIMIT,
        "the limited script ran past its limit:\n{}",
        table.join("\n")
    );
    for (path, r) in &answers {
        assert!(!r.body.contains("WP-LOGIN RAN"), "{path} ran the script");
    }
    answers
}

/// Under the default, every separator spelling is a 400 problem; the others
/// never run the script (checked in [`exhaust_then_try`]).
fn assert_separators_refused(answers: &[(&str, Reply)]) {
    for (path, r) in answers {
        if SEPARATOR_SPELLINGS.contains(path) {
            assert_eq!(r.status, 400, "{path}: {}", r.body);
            assert_eq!(
                r.header("content-type"),
                Some("application/problem+json"),
                "{path}"
            );
        }
    }
}

/// With `decode`, a spelled `/` lands on the limited route (429) and no
/// other spelling is refused for its separator.
fn assert_slashes_limited(answers: &[(&str, Reply)]) {
    for (path, r) in answers {
        if spells_a_slash(path) && SEPARATOR_SPELLINGS.contains(path) {
            assert_eq!(r.status, 429, "{path}: {}", r.body);
        }
    }
}

/// nginx in front of php-fpm, configured the way the usual PHP guides do:
/// `fastcgi_split_path_info`, `try_files $fastcgi_script_name =404`, and a
/// front controller for everything else. Stopped on drop.
struct Nginx {
    addr: SocketAddr,
    child: std::process::Child,
}

impl Nginx {
    fn start(dir: &Path, root: &Path, php_fpm: SocketAddr) -> Nginx {
        // nginx cannot bind port 0 and report it: a port that was free a moment ago.
        let addr = free_addr();
        let base = dir.join("nginx");
        std::fs::create_dir_all(base.join("tmp")).unwrap();
        let tmp = base.join("tmp");
        let tmp = tmp.display();
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {base}/nginx.pid;\nerror_log {base}/error.log;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};\n\
               server {{\n    listen {addr};\n    root {root};\n    index index.php;\n\
                 location / {{ try_files $uri $uri/ /index.php?$args; }}\n\
                 location ~ [^/]\\.php(/|$) {{\n\
                   fastcgi_split_path_info ^(.+?\\.php)(/.*)$;\n\
                   try_files $fastcgi_script_name =404;\n\
                   fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n\
                   fastcgi_param SCRIPT_NAME $fastcgi_script_name;\n\
                   fastcgi_param PATH_INFO $fastcgi_path_info;\n\
                   fastcgi_param REQUEST_URI $request_uri;\n\
                   fastcgi_param QUERY_STRING $query_string;\n\
                   fastcgi_param REQUEST_METHOD $request_method;\n\
                   fastcgi_pass {php_fpm};\n    }}\n  }}\n}}\n",
            base = base.display(),
            root = root.display(),
        );
        let conf_path = base.join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let spawned = std::process::Command::new("/usr/sbin/nginx")
            .arg("-e")
            .arg(base.join("error.log"))
            .arg("-p")
            .arg(&base)
            .arg("-c")
            .arg(&conf_path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("nginx is not installed: these tests need it (.ci/test installs it; or apt-get install nginx-light)")
            }
            Err(e) => panic!("cannot start nginx: {e}"),
        };
        let listening = eventually_blocking(Duration::from_secs(10), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "nginx exited with {status}:\n{}",
                    std::fs::read_to_string(base.join("error.log")).unwrap_or_default()
                );
            }
            std::net::TcpStream::connect(addr).is_ok()
        });
        assert!(listening, "nginx never listened on {addr}");
        Nginx { addr, child }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// tollgate in front of `php -S` serving the site, with `server` settings.
async fn behind_php_s(server: &str) -> Vec<(&'static str, Reply)> {
    let dir = tempfile::tempdir().unwrap();
    let php = PhpServer::serve_root(&site(dir.path()), dir.path());
    let upstream = format!("{{ url: \"http://{}\" }}", php.addr);
    let path = dir.path().to_path_buf();
    let proxy = Proxy::start_in(&yaml(&upstream, server), Arc::new(SystemClock), dir, None).await;
    exhaust_then_try(&proxy, &path).await
}

/// tollgate's own FastCGI to a real php-fpm, with `server` settings.
async fn behind_fastcgi(server: &str) -> Vec<(&'static str, Reply)> {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let upstream = format!(
        "{{ url: \"fastcgi://{}\", root: \"{}\" }}",
        fpm.tcp,
        root.display()
    );
    let path = dir.path().to_path_buf();
    let proxy = Proxy::start_in(&yaml(&upstream, server), Arc::new(SystemClock), dir, None).await;
    exhaust_then_try(&proxy, &path).await
}

/// tollgate to nginx to a real php-fpm, with `server` settings.
async fn behind_nginx(server: &str) -> Vec<(&'static str, Reply)> {
    let dir = tempfile::tempdir().unwrap();
    let root = site(dir.path());
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let nginx = Nginx::start(dir.path(), &root, fpm.tcp);
    let upstream = format!("{{ url: \"http://{}\" }}", nginx.addr);
    let path = dir.path().to_path_buf();
    let proxy = Proxy::start_in(&yaml(&upstream, server), Arc::new(SystemClock), dir, None).await;
    exhaust_then_try(&proxy, &path).await
}

#[tokio::test]
async fn an_encoded_slash_never_runs_a_limited_script_behind_php_s() {
    assert_separators_refused(&behind_php_s("").await);
}

#[tokio::test]
async fn an_encoded_slash_never_runs_a_limited_script_behind_php_fpm() {
    assert_separators_refused(&behind_fastcgi("").await);
}

#[tokio::test]
async fn an_encoded_slash_never_runs_a_limited_script_behind_nginx_and_php_fpm() {
    assert_separators_refused(&behind_nginx("").await);
}

#[tokio::test]
async fn with_separators_decoded_an_encoded_slash_spends_the_limit_behind_php_s() {
    assert_slashes_limited(&behind_php_s("encoded_separators: decode").await);
}

#[tokio::test]
async fn with_separators_decoded_an_encoded_slash_spends_the_limit_behind_php_fpm() {
    assert_slashes_limited(&behind_fastcgi("encoded_separators: decode").await);
}

#[tokio::test]
async fn with_separators_decoded_an_encoded_slash_spends_the_limit_behind_nginx_and_php_fpm() {
    assert_slashes_limited(&behind_nginx("encoded_separators: decode").await);
}
