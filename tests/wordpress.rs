//! A real site end to end: Debian's WordPress on MariaDB and php-fpm, started by the test, served through tollgate with its stock `.htaccess` imported; pretty permalinks, `xmlrpc.php` denied, `/wp-admin/` behind basic auth, the login limited and banned.
//!
//! Every wait is on an event (a socket that accepts, a ping that answers),
//! never on the clock; each server is stopped by its guard, even when an
//! assertion fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{client, eventually_blocking, send, Proxy};

/// The staff's basic auth (bob:password, an apr1 line in the users file).
const STAFF: &str = "Basic Ym9iOnBhc3N3b3Jk";
const ADMIN_PASSWORD: &str = "admin-pass-123";

/// A server process stopped with SIGTERM (and waited for) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let stopped = eventually_blocking(Duration::from_secs(10), || {
            matches!(self.0.try_wait(), Ok(Some(_)))
        });
        if !stopped {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// MariaDB in `dir/db`, with the `wordpress` database and its user.
fn mariadb(dir: &Path) -> Server {
    let sock = dir.join("mysql.sock");
    run(Command::new("mariadb-install-db")
        .args([
            "--no-defaults",
            "--user=root",
            "--skip-test-db",
            "--skip-name-resolve",
        ])
        .args([
            "--auth-root-authentication-method=socket",
            "--innodb-log-file-size=8M",
        ])
        .arg(format!("--datadir={}", dir.join("db").display())));
    let server = Server(
        Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("db").display()))
            .arg(format!("--socket={}", sock.display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .arg(format!("--log-error={}", dir.join("mysqld.err").display()))
            .args([
                "--skip-networking",
                "--user=root",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-log-file-size=8M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd starts"),
    );
    let ping = || {
        Command::new("mariadb-admin")
            .args(["--no-defaults", "-uroot", "-S"])
            .arg(&sock)
            .arg("ping")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    assert!(
        eventually_blocking(Duration::from_secs(30), ping),
        "mariadbd never answered"
    );
    sql(dir, "CREATE DATABASE wordpress CHARACTER SET utf8mb4; CREATE USER 'wp'@'localhost' IDENTIFIED BY 'wp-pass'; GRANT ALL ON wordpress.* TO 'wp'@'localhost';");
    server
}

fn sql(dir: &Path, statements: &str) {
    run(Command::new("mariadb")
        .args(["--no-defaults", "-uroot", "-S"])
        .arg(dir.join("mysql.sock"))
        .args(["-e", statements]));
}

/// A private WordPress tree in `dir/www` (hard links for the core, a copy of
/// wp-content) with a wp-config.php for this database.
fn wordpress(dir: &Path) -> PathBuf {
    let www = dir.join("www");
    let linked = Command::new("cp")
        .args(["-rlL", "/usr/share/wordpress"])
        .arg(&www)
        .status()
        .is_ok_and(|s| s.success());
    if !linked {
        let _ = std::fs::remove_dir_all(&www);
        run(Command::new("cp")
            .args(["-rL", "--preserve=timestamps", "/usr/share/wordpress"])
            .arg(&www));
    }
    std::fs::remove_dir_all(www.join("wp-content")).unwrap();
    run(Command::new("cp")
        .args([
            "-rL",
            "--preserve=timestamps",
            "/usr/share/wordpress/wp-content",
        ])
        .arg(www.join("wp-content")));
    let _ = std::fs::remove_file(www.join("wp-config.php"));
    let config = format!(
        "<?php\ndefine('DB_NAME', 'wordpress'); define('DB_USER', 'wp'); define('DB_PASSWORD', 'wp-pass');\n\
         define('DB_HOST', 'localhost:{}'); define('DB_CHARSET', 'utf8mb4'); define('DB_COLLATE', '');\n\
         foreach (['AUTH_KEY','SECURE_AUTH_KEY','LOGGED_IN_KEY','NONCE_KEY','AUTH_SALT','SECURE_AUTH_SALT','LOGGED_IN_SALT','NONCE_SALT'] as $k) define($k, \"test-$k\");\n\
         $table_prefix = 'wp_';\ndefine('WP_HOME', 'http://' . ($_SERVER['HTTP_HOST'] ?? '127.0.0.1'));\ndefine('WP_SITEURL', WP_HOME);\n\
         define('DISABLE_WP_CRON', true); define('AUTOMATIC_UPDATER_DISABLED', true); define('WP_AUTO_UPDATE_CORE', false);\n\
         define('WP_HTTP_BLOCK_EXTERNAL', true); define('DISALLOW_FILE_MODS', true); define('WP_DEBUG', false);\n\
         if (!defined('ABSPATH')) define('ABSPATH', __DIR__ . '/');\nrequire_once ABSPATH . 'wp-settings.php';\n",
        dir.join("mysql.sock").display()
    );
    std::fs::write(www.join("wp-config.php"), config).unwrap();
    www
}

/// php-fpm with Debian's php.ini and modules (mysqli, xml), on a unix socket.
fn php_fpm(dir: &Path) -> (Server, PathBuf) {
    let sock = dir.join("php-fpm.sock");
    let conf = dir.join("php-fpm.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\npid = {0}/php-fpm.pid\nerror_log = {0}/php-fpm.log\ndaemonize = no\n[wp]\nuser = root\ngroup = root\n\
             listen = {1}\npm = static\npm.max_children = 4\ncatch_workers_output = yes\n\
             php_admin_value[error_log] = {0}/php-error.log\nphp_admin_flag[log_errors] = on\n",
            dir.display(),
            sock.display()
        ),
    )
    .unwrap();
    let server = Server(
        Command::new(common::php_fpm::binary())
            .args(["-F", "-R", "-y"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("php-fpm starts"),
    );
    let up = eventually_blocking(Duration::from_secs(20), || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    assert!(
        up,
        "php-fpm never listened: {}",
        std::fs::read_to_string(dir.join("php-fpm.log")).unwrap_or_default()
    );
    (server, sock)
}

/// The stock .htaccess imported, and the site's own rules above it.
fn config(www: &Path, fpm: &Path, users: &Path) -> String {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/htaccess/wordpress.htaccess");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["import", "htaccess"])
        .arg(&fixture)
        .arg("--root")
        .arg(www)
        .arg("--upstream")
        .arg(format!("fastcgi://{}", fpm.display()))
        .output()
        .unwrap();
    assert!(out.status.success());
    let imported = String::from_utf8(out.stdout).unwrap();
    let own = format!(
        "routes:\n  - {{ name: no-xmlrpc, match: {{ path: /xmlrpc.php }}, respond: {{ status: 403 }} }}\n\
         \x20 - name: staff\n    match: {{ path_prefix: /wp-admin/ }}\n    auth: {{ basic: {{ realm: Staff, users_file: \"{}\" }} }}\n    upstream: php\n\
         \x20 - {{ name: login, match: {{ path: /wp-login.php, methods: [POST] }}, limiters: [failed_logins], upstream: php }}\n",
        users.display()
    );
    let limiters = "identity: { trusted_proxies: [127.0.0.1/32] }\nlimiters:\n  failed_logins: { algorithm: fixed_window, limit: 3, window: 10m, key: ip, count: { status: [200] }, ban: { after: 1, for: 1h } }\n";
    format!("{limiters}{}", imported.replacen("routes:\n", &own, 1))
}

/// Everything the site needs, stopped when dropped (the proxy first).
struct Site {
    proxy: Proxy,
    _fpm: Server,
    _db: Server,
    dir: tempfile::TempDir,
}

async fn start() -> Site {
    let dir = tempfile::tempdir().unwrap();
    let db = mariadb(dir.path());
    let www = wordpress(dir.path());
    let (fpm, sock) = php_fpm(dir.path());
    let users = dir.path().join("htpasswd");
    std::fs::write(&users, "bob:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\n").unwrap();
    let proxy = Proxy::start(&config(&www, &sock, &users)).await;
    Site {
        proxy,
        _fpm: fpm,
        _db: db,
        dir,
    }
}

async fn install(site: &Site) {
    let body = format!(
        "weblog_title=Test+Blog&user_name=admin&admin_password={ADMIN_PASSWORD}&admin_password2={ADMIN_PASSWORD}&admin_email=admin%40example.com&blog_public=0"
    );
    let r = send(
        client()
            .post(site.proxy.url("/wp-admin/install.php?step=2"))
            .header("authorization", STAFF)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body),
    )
    .await;
    assert!(
        r.status == 200 && r.body.contains("Success"),
        "{} {}",
        r.status,
        r.body
    );
    sql(site.dir.path(), "UPDATE wordpress.wp_options SET option_value='/%postname%/' WHERE option_name='permalink_structure'; DELETE FROM wordpress.wp_options WHERE option_name='rewrite_rules';");
}

async fn login(site: &Site, from: &str, password: &str) -> u16 {
    let body = format!("log=admin&pwd={password}");
    let req = client()
        .post(site.proxy.url("/wp-login.php"))
        .header("x-forwarded-for", from)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    send(req).await.status
}

#[tokio::test]
async fn wordpress_behind_tollgate_keeps_its_permalinks_and_its_protections() {
    let t = std::time::Instant::now();
    let site = start().await;
    eprintln!("started in {:?}", t.elapsed());
    install(&site).await;
    eprintln!("installed in {:?}", t.elapsed());
    let c = client();
    let post = send(c.get(site.proxy.url("/hello-world/"))).await;
    assert!(
        post.status == 200 && post.body.contains("Hello world!"),
        "pretty permalink: {}",
        post.status
    );
    let missing = send(c.get(site.proxy.url("/no-such-page/"))).await;
    assert_eq!(
        missing.status, 404,
        "WordPress's own 404, through the front controller"
    );
    let css = send(c.get(site.proxy.url("/wp-includes/css/dashicons.min.css"))).await;
    assert_eq!(css.status, 200);
    let xmlrpc = send(c.post(site.proxy.url("/xmlrpc.php")).body("<methodCall/>")).await;
    assert_eq!(xmlrpc.status, 403, "xmlrpc.php denied");
    let admin = send(c.get(site.proxy.url("/wp-admin/"))).await;
    assert_eq!(admin.status, 401);
    assert!(admin.headers["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("Staff"));
    let admin = send(
        c.get(site.proxy.url("/wp-admin/"))
            .header("authorization", STAFF),
    )
    .await;
    assert_eq!(
        admin.status, 302,
        "past basic auth, WordPress asks for its own login"
    );
    let attempts: Vec<u16> =
        futures_util::future::join_all((0..3).map(|_| login(&site, "203.0.113.9", "wrong"))).await;
    assert_eq!(
        attempts,
        [200, 200, 200],
        "failed logins: WordPress's form again"
    );
    assert_eq!(
        login(&site, "203.0.113.9", "wrong").await,
        429,
        "the fourth is over the limit"
    );
    assert_eq!(
        login(&site, "203.0.113.9", ADMIN_PASSWORD).await,
        429,
        "and then banned, right password or not"
    );
    assert_eq!(
        login(&site, "198.51.100.4", ADMIN_PASSWORD).await,
        302,
        "another client logs in"
    );
}
