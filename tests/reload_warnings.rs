//! `tollgate reload` prints every warning of the config it made the running process take, and `--strict` refuses a config with any (the old one stays, exit 1).

mod common;

use std::process::Command;

use common::{Proxy, BINARY};

/// A site whose login route sits below a catch-all: valid, with one warning.
const SHADOWED_LOGIN: &str = "limiters:
  per_ip: { limit: 100, window: 60s, key: ip }
  login: { limit: 5, window: 15m, key: ip }
routes:
  - { name: site, match: { path_prefix: / }, respond: { status: 200 }, limiters: [per_ip] }
  - { name: wp_login, match: { path: /wp-login.php }, respond: { status: 200 }, limiters: [login] }
";

const CLEAN: &str =
    "routes:\n  - { name: site, match: { path_prefix: / }, respond: { status: 200 } }\n";

/// `tollgate reload [flags] -c <the proxy's config file>`: exit code, stdout, stderr.
fn reload(proxy: &Proxy, flags: &[&str]) -> (i32, String, String) {
    let out = Command::new(BINARY)
        .arg("reload")
        .args(flags)
        .arg("-c")
        .arg(&proxy.config_path)
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .expect("the tollgate binary runs");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_prints_the_warning_of_the_config_it_applied() {
    let proxy = Proxy::start(CLEAN).await;
    proxy.write_config(SHADOWED_LOGIN);
    let (code, out, err) = reload(&proxy, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out, "reloaded: config version 2, with 1 warning\n");
    assert!(
        err.starts_with("warning: ")
            && err.contains("routes[1].name: route \"wp_login\" is never reached"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_strict_refuses_a_config_with_a_warning_and_the_old_one_stays() {
    let proxy = Proxy::start(CLEAN).await;
    proxy.write_config(SHADOWED_LOGIN);
    let (code, out, err) = reload(&proxy, &["--strict"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.starts_with("reload rejected; config version 1 stays in force:"),
        "{err}"
    );
    assert!(
        err.contains("warning (strict: not applied): ")
            && err.contains("route \"wp_login\" is never reached"),
        "{err}"
    );
    assert_eq!(proxy.app.snapshot().version, 1);
    assert_eq!(proxy.app.snapshot().config.routes.len(), 1);
    // A config without warnings passes the strict reload.
    proxy.write_config(&CLEAN.replace("status: 200", "status: 204"));
    let (code, out, err) = reload(&proxy, &["--strict"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "reloaded: config version 2\n"),
        "{err}"
    );
}
