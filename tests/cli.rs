//! The `tollgate` binary's command line: --version, help, check, config discovery, healthcheck, reload.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{free_addr, Process, Proxy, BINARY};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml");

fn tollgate(args: &[&str]) -> Command {
    let mut cmd = Command::new(BINARY);
    cmd.args(args).env_remove("TOLLGATE_CONFIG");
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("the tollgate binary runs");
    (
        status.code().expect("exited, not killed"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Runs `tollgate check --config <file with yaml>`.
fn check(yaml: &str) -> (i32, String, String) {
    check_with(yaml, &[])
}

/// Runs `tollgate check <flags> --config <file with yaml>`.
fn check_with(yaml: &str, flags: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut args = vec!["check"];
    args.extend(flags);
    args.extend(["--config", path.to_str().unwrap()]);
    run(tollgate(&args).current_dir(dir.path()))
}

/// The error lines of a failed check (each starts with the file name).
fn error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.trim_start()
                .starts_with(|c: char| c == '/' || c.is_alphanumeric())
                && l.contains(": line ")
        })
        .collect()
}

#[test]
fn version_prints_the_crate_version() {
    let (code, out, _) = run(&mut tollgate(&["--version"]));
    assert_eq!(code, 0);
    // `tollgate 0.1.0`, then where it was built from (commit and date in a
    // release build, "(built from source)" in a plain `cargo build`).
    let line = out.trim();
    let expected = format!("tollgate {} (", env!("CARGO_PKG_VERSION"));
    assert!(line.starts_with(&expected), "{line:?}");
    assert!(line.ends_with(')') && !line.contains('\n'), "{line:?}");
}

#[test]
fn check_accepts_the_example_config_and_prints_a_summary() {
    let (code, out, err) = run(&mut tollgate(&["check", "--config", EXAMPLE]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("config.example.yaml: ok"), "{out}");
    for part in [
        "5 route(s)",
        "4 limiter(s)",
        "1 upstream(s)",
        "admin on 127.0.0.1:9901",
    ] {
        assert!(out.contains(part), "{part:?} missing from {out}");
    }
}

#[test]
fn check_reports_a_missing_limiter_with_its_line_and_column() {
    let (code, out, err) = check(
        "limiters:
  strict: { limit: 5, window: 60s }
routes:
  - name: ping
    match: { path: /ping }
    respond: { status: 200 }
    limiters: [strict, missing]
",
    );
    assert_eq!(code, 1, "{out}");
    assert!(err.contains("bad.yaml: 1 error"), "{err}");
    assert!(
        err.contains("line 7 column 24") && err.contains("no limiter named \"missing\""),
        "{err}"
    );
}

#[test]
fn check_reports_a_misspelt_key_with_its_line_and_column() {
    let (code, _, err) = check("limiters:\n  strict: { limt: 5, window: 60s }\n");
    assert_eq!(code, 1);
    assert!(err.contains("line 2 column 13"), "{err}");
    assert!(err.contains("unknown key `limt`"), "{err}");
    assert!(
        err.contains("`limit`"),
        "the message offers the right spelling: {err}"
    );
}

#[test]
fn check_refuses_a_sqlite_store_with_a_redis_url_and_names_the_backend_it_belongs_to() {
    let (code, _, err) =
        check("allow_no_routes: true\nstore:\n  backend: sqlite\n  url: redis://cache:6379/0\n");
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("line 4"), "located at the key: {err}");
    assert!(
        err.contains("`url` belongs to `backend: redis`, and this store is `backend: sqlite`"),
        "{err}"
    );
}

#[test]
fn check_names_an_unset_environment_variable() {
    let var = "TOLLGATE_TEST_SURELY_UNSET_VAR";
    let (code, _, err) = {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, format!("admin:\n  token: ${{{var}}}\n")).unwrap();
        run(tollgate(&["check", "--config", path.to_str().unwrap()]).env_remove(var))
    };
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("environment variable {var} is not set")),
        "{err}"
    );
    assert!(err.contains("line 2"), "{err}");

    // The same file passes once the variable is set.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.yaml");
    std::fs::write(
        &path,
        format!("admin:\n  token: ${{{var}}}\nallow_no_routes: true\n"),
    )
    .unwrap();
    let (code, out, err) =
        run(tollgate(&["check", "--config", path.to_str().unwrap()]).env(var, "t0ken"));
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("t0ken"),
        "the summary does not print secrets: {out}"
    );
}

#[test]
fn check_prints_every_semantic_error_not_just_the_first() {
    let (code, _, err) = check(
        "server:
  listen: \"127.0.0.1:70000\"
limiters:
  strict: { limit: 0, window: 60s }
  odd: { algorithm: sideways, limit: 1, window: 1s }
routes:
  - { name: a, match: { path: /a }, upstream: nowhere, limiters: [strict, missing] }
  - { name: b, match: { path: /b }, respond: { status: 200 }, limiters: [nope] }
",
    );
    assert_eq!(code, 1);
    let lines = error_lines(&err);
    assert!(
        lines.len() >= 6,
        "expected every error, got {}:\n{err}",
        lines.len()
    );
    assert!(
        err.contains(&format!("bad.yaml: {} errors", lines.len())),
        "the count matches: {err}"
    );
    for (line, what) in [
        ("line 2", "server.listen"),
        ("line 4", "limiters.strict"),
        ("line 5", "sideways"),
        ("line 7", "no upstream named \"nowhere\""),
        ("line 7", "no limiter named \"missing\""),
        ("line 8", "no limiter named \"nope\""),
    ] {
        assert!(
            lines.iter().any(|l| l.contains(line) && l.contains(what)),
            "no {what:?} at {line} in:\n{err}"
        );
    }
}

#[test]
fn serve_without_any_config_fails_with_a_clear_message() {
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = tollgate(&["serve"]);
    cmd.current_dir(empty.path());
    let (code, _, err) = run(&mut cmd);
    assert_ne!(code, 0);
    assert!(err.contains("no config"), "{err}");
    assert!(
        err.contains("--config")
            && err.contains("tollgate.yaml")
            && err.contains("TOLLGATE_CONFIG"),
        "{err}"
    );
    // No default SQLite file was created next to nothing.
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0);
}

#[test]
fn serve_uses_tollgate_config_when_there_is_no_local_file() {
    let cwd = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let (addr, admin) = (free_addr(), free_addr());
    let config = elsewhere.path().join("from-env.yaml");
    let yaml = "routes:\n  - { name: ping, match: { path: /ping }, respond: { status: 200, body: \"from env\" } }\n";
    std::fs::write(
        &config,
        common::pin_yaml(yaml, addr, admin, elsewhere.path()),
    )
    .unwrap();
    let mut cmd = Command::new(BINARY);
    cmd.arg("serve")
        .current_dir(cwd.path())
        .env("TOLLGATE_CONFIG", &config);
    let mut p = Process::spawn(cmd, addr, admin, elsewhere.path());
    let r = common::http(addr, "GET", "/ping").unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "from env"));
    let shown = common::http(admin, "GET", "/config").unwrap().json();
    assert_eq!(Path::new(shown["path"].as_str().unwrap()), config);
    p.signal("TERM");
    assert!(
        p.wait_exit(Duration::from_secs(15)).success(),
        "{}",
        p.output()
    );
}

#[test]
fn tollgate_config_comes_before_a_local_tollgate_yaml() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(
        cwd.path().join("tollgate.yaml"),
        "limiters: { a: { limit: 1, window: 1s } }\nallow_no_routes: true\n",
    )
    .unwrap();
    let other = cwd.path().join("other.yaml");
    std::fs::write(
        &other,
        "limiters: { a: { limit: 1, window: 1s }, b: { limit: 1, window: 1s } }\nallow_no_routes: true\n",
    )
    .unwrap();
    let mut cmd = tollgate(&["check"]);
    cmd.current_dir(cwd.path()).env("TOLLGATE_CONFIG", &other);
    let (code, out, err) = run(&mut cmd);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("other.yaml: ok") && out.contains("2 limiter(s)"),
        "{out}"
    );

    let mut cmd = tollgate(&["check"]);
    cmd.current_dir(cwd.path());
    let (code, out, err) = run(&mut cmd);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("tollgate.yaml: ok") && out.contains("1 limiter(s)"),
        "{out}"
    );
}

#[test]
fn dash_c_is_short_for_config() {
    let (code, out, err) = run(&mut tollgate(&["check", "-c", EXAMPLE]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("config.example.yaml: ok"), "{out}");
    let (code, out, err) = run(&mut tollgate(&["-c", EXAMPLE, "check"]));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("config.example.yaml: ok"), "{out}");
}

#[test]
fn help_names_the_environment_variables_and_the_signals() {
    let (code, out, err) = run(&mut tollgate(&["--help"]));
    assert_eq!(code, 0, "{err}");
    for word in [
        "-c, --config",
        "TOLLGATE_CONFIG",
        "TOLLGATE_LOG",
        "SIGHUP",
        "SIGTERM",
        "SIGINT",
        "reload",
    ] {
        assert!(out.contains(word), "{word:?} missing from --help:\n{out}");
    }
}

#[test]
fn help_answers_with_or_without_a_command_and_to_its_own_help() {
    for args in [
        &["help"][..],
        &["help", "reload"],
        &["help", "--help"],
        &["reload", "--help"],
    ] {
        let (code, out, err) = run(&mut tollgate(args));
        assert_eq!(code, 0, "tollgate {args:?}: {err}");
        assert!(out.contains("Usage: tollgate"), "tollgate {args:?}: {out}");
    }
    let (code, _, err) = run(&mut tollgate(&["help", "nonsense"]));
    assert_ne!(code, 0);
    assert!(err.contains("nonsense"), "{err}");
}

#[test]
fn reload_makes_the_running_process_take_the_edited_config_or_reports_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = |limit: u32| {
        format!(
            "admin: {{ token: rel0ad-t0ken }}\n{}",
            common::ping_yaml(limit)
        )
    };
    let mut p = Process::serve(&yaml(1), dir.path());
    let config = dir.path().join("tollgate.yaml");
    let pinned = std::fs::read_to_string(&config).unwrap();
    let config_arg = config.to_str().unwrap();
    // The running process would pick an edit up on its own within 250 ms;
    // the check below holds either way, `reload` answers once it is in force.
    std::fs::write(&config, pinned.replace("limit: 1", "limit: 3")).unwrap();
    let (code, out, err) = run(&mut tollgate(&["reload", "-c", config_arg]));
    assert_eq!(code, 0, "{out}{err}\n{pinned}");
    assert!(out.starts_with("reloaded: config version"), "{out}");
    for _ in 0..3 {
        assert_eq!(common::http(p.addr, "GET", "/ping").unwrap().status, 200);
    }
    assert_eq!(common::http(p.addr, "GET", "/ping").unwrap().status, 429);

    std::fs::write(
        &config,
        pinned.replace("window: 60s", "window: 60s, bogus: 1"),
    )
    .unwrap();
    let (code, out, err) = run(&mut tollgate(&["reload", "-c", config_arg]));
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.starts_with("reload rejected;"), "{err}");
    assert!(err.contains("line"), "{err}");
    p.signal("TERM");
    assert!(p.wait_exit(Duration::from_secs(15)).success());
}

#[test]
fn reload_without_a_running_process_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let admin = free_addr();
    let config = dir.path().join("tollgate.yaml");
    std::fs::write(&config, format!("admin: {{ listen: \"{admin}\" }}\n")).unwrap();
    let (code, _, err) = run(&mut tollgate(&["reload", "-c", config.to_str().unwrap()]));
    assert_eq!(code, 1);
    assert!(err.contains(&admin.to_string()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_exits_0_against_a_running_proxy_and_non_zero_against_a_closed_port() {
    let proxy = Proxy::start("").await;
    let up = format!("http://{}/healthz", proxy.admin);
    let down = format!("http://{}/healthz", common::free_addr());
    let probe = |url: String| {
        tokio::task::spawn_blocking(move || run(&mut tollgate(&["healthcheck", "--url", &url])))
    };
    let (code, out, err) = probe(up).await.unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let (code, _, err) = probe(down).await.unwrap();
    assert_ne!(code, 0);
    assert!(err.contains("cannot connect"), "{err}");
    // A reachable server that is not healthy fails too: the public port has no /healthz route.
    let (code, out, _) = probe(proxy.url("/healthz")).await.unwrap();
    assert_ne!(code, 0, "{out}");
}

#[test]
fn check_never_prints_a_redis_password() {
    let (code, out, err) =
        check("store: { backend: redis, url: \"redis://:hunter2@127.0.0.1:6379/0\" }\nallow_no_routes: true\n");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("redis"), "{out}");
    assert!(
        !out.contains("hunter2") && !err.contains("hunter2"),
        "{out}{err}"
    );
}

#[test]
fn check_rejects_an_exposed_admin_without_a_token_and_accepts_one_with_a_token() {
    let (code, _, err) = check("admin: { listen: \"0.0.0.0:9901\" }\n");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("admin.listen") && err.contains("needs admin.token or admin.token_file"),
        "{err}"
    );
    let path = write_temp(
        "admin: { listen: \"0.0.0.0:9901\", token: \"${TOLLGATE_TEST_ADMIN_TOKEN}\" }\nallow_no_routes: true\n",
    );
    let (code, out, err) = run(tollgate(&["check", "--config", path.to_str().unwrap()])
        .env("TOLLGATE_TEST_ADMIN_TOKEN", "t0ken"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("t0ken"), "{out}");
}

/// A file with `text` that lives as long as the test process.
fn write_temp(text: &str) -> std::path::PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let path = dir.join("tollgate.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn serve_refuses_to_start_with_an_exposed_admin_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (public, admin) = (free_addr(), free_addr());
    let path = dir.path().join("tollgate.yaml");
    let yaml = format!(
        "server: {{ listen: \"{public}\" }}\nadmin: {{ listen: \"0.0.0.0:{}\" }}\n",
        admin.port()
    );
    std::fs::write(&path, yaml).unwrap();
    let err_log = dir.path().join("stderr");
    let mut child = tollgate(&["serve", "--config", path.to_str().unwrap()])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_log).unwrap())
        .spawn()
        .unwrap();
    // A tollgate that wrongly starts would serve forever: a bounded wait, then kill.
    let mut status = None;
    let exited = common::eventually_blocking(Duration::from_secs(20), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
    }
    let err = std::fs::read_to_string(&err_log).unwrap();
    let status = status.unwrap_or_else(|| panic!("tollgate started with an exposed admin: {err}"));
    assert!(!status.success());
    assert!(
        err.contains("admin.listen") && err.contains("admin.token"),
        "{err}"
    );
    assert!(
        std::net::TcpStream::connect(public).is_err(),
        "nothing was served"
    );
}

#[test]
fn healthcheck_reads_only_the_admin_address_so_a_rejected_edit_keeps_the_container_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = Process::serve(
        "limiters:\n  strict: { limit: 5, window: 60s }\nroutes:\n  - name: ping\n    match: { path: /ping }\n    respond: { status: 200, body: \"pong\\n\" }\n    limiters: [strict]\n",
        dir.path(),
    );
    let config = dir.path().join("tollgate.yaml");
    let probe = || {
        run(
            tollgate(&["healthcheck", "--config", config.to_str().unwrap()])
                .current_dir(dir.path()),
        )
    };
    let (code, out, err) = probe();
    assert_eq!(code, 0, "{out}{err}");
    // An edit the running proxy must reject: a typo, a missing limiter and an unset variable.
    let valid = std::fs::read_to_string(&config).unwrap();
    let broken = valid
        .replace("limit: 5", "limt: 5")
        .replace("- strict", "- nowhere")
        + "identity:\n  api_key_header: ${TOLLGATE_TEST_SURELY_UNSET}\n";
    std::fs::write(&config, &broken).unwrap();
    let (code, _, err) = run(&mut tollgate(&[
        "check",
        "--config",
        config.to_str().unwrap(),
    ]));
    assert_eq!(code, 1, "the edit is invalid: {err}");
    let (code, out, err) = probe();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // Not even YAML any more: the admin block is still found.
    std::fs::write(&config, format!("{broken}\n  - [unclosed\n")).unwrap();
    let (code, out, err) = probe();
    assert_eq!(code, 0, "{out}{err}");
    // And a stopped proxy is unhealthy.
    proxy.signal("TERM");
    proxy.wait_exit(Duration::from_secs(15));
    let (code, _, _) = probe();
    assert_ne!(code, 0);
}

#[test]
fn check_explains_typical_mistakes_in_yaml_terms_at_the_key_that_is_wrong() {
    for (yaml, expected) in [
        (
            "limiters:\n  per_ip:\n    limit: \"100/min\"\n    window: 60s\n",
            "bad.yaml: line 3 column 12: limiters.per_ip.limit: expected a whole number, e.g. `limit: 100`, found the text \"100/min\"",
        ),
        (
            "limiters:\n  per_ip:\n  limit: 5\n  window: 60s\n",
            "bad.yaml: line 3 column 10: limiters.limit: expected a limiter: a mapping of its settings, e.g. `{ limit: 100, window: 1m, key: ip }`, found the number 5 (`limit` is read as the name of a limiter here; if it is a setting, indent it under its limiter)",
        ),
        (
            "upstreams:\n  php: { url: \"fastcgi://127.0.0.1:9000\", root: /srv }\nroutes:\n  - name: site\n    upstream: phpfpm\n",
            "bad.yaml: line 5 column 15: routes[0].upstream: no upstream named \"phpfpm\"; did you mean `php`?",
        ),
        (
            "limiters:\n  a:\n    limit: 5\n    window: 1M\n",
            "bad.yaml: line 4 column 13: limiters.a.window: `1M`: `M` is not a unit (minutes are `m`, and a month is written `30d`); a duration is a whole number and one of the units ms, s, m, h, d, e.g. `60s` or `1m`",
        ),
    ] {
        let (code, out, err) = check(yaml);
        assert_eq!(code, 1, "{yaml}\n{out}");
        assert_eq!(error_lines(&err).len(), 1, "{err}");
        assert!(error_lines(&err)[0].ends_with(expected), "{yaml}\n  expected …{expected}\n  got {err}");
    }
}

/// A catch-all route above the login route: the config runs, and the login limit never does.
const SHADOWED_LOGIN: &str = "limiters:
  per_ip: { limit: 100, window: 60s, key: ip }
  login: { limit: 5, window: 15m, key: ip }
routes:
  - name: site
    match: { path_prefix: / }
    respond: { status: 200 }
    limiters: [per_ip]
  - name: wp_login
    match: { path: /wp-login.php, methods: [POST] }
    respond: { status: 200 }
    limiters: [login]
";

#[test]
fn check_warns_about_a_login_route_a_catch_all_shadows_and_strict_makes_it_fail() {
    let (code, out, err) = check(SHADOWED_LOGIN);
    assert_eq!(code, 0, "a warning is not an error: {err}");
    assert!(out.contains("bad.yaml: ok"), "{out}");
    assert!(
        err.contains("bad.yaml: warning: line 9 column 11: routes[1].name: route \"wp_login\" is never reached: route \"site\" (routes[0]) comes first"),
        "{err}"
    );
    assert!(err.contains("move \"wp_login\" above \"site\""), "{err}");

    let (code, out, err) = check_with(SHADOWED_LOGIN, &["--strict"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("routes[1].name: route \"wp_login\" is never reached"),
        "{err}"
    );
    assert!(
        err.contains("bad.yaml: 1 warning and --strict: not ok"),
        "{err}"
    );
    assert!(!out.contains("ok:"), "no summary: {out}");

    // Put in order, the same routes pass --strict.
    let ordered = "limiters:
  per_ip: { limit: 100, window: 60s, key: ip }
  login: { limit: 5, window: 15m, key: ip }
routes:
  - { name: wp_login, match: { path: /wp-login.php, methods: [POST] }, respond: { status: 200 }, limiters: [login] }
  - { name: site, match: { path_prefix: / }, respond: { status: 200 }, limiters: [per_ip] }
";
    let (code, _, err) = check_with(ordered, &["--strict"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn check_warns_about_a_fastcgi_root_that_does_not_exist() {
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("index.php"), "<?php echo 'hi';").unwrap();
    let yaml = |root: &str| {
        format!(
            "upstreams:\n  php:\n    url: \"fastcgi://127.0.0.1:9000\"\n    root: {root}\nroutes:\n  - {{ name: site, upstream: php }}\n"
        )
    };
    let typo = format!("{}/htdcos", site.path().display());
    let (code, _, err) = check(&yaml(&typo));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(&format!("bad.yaml: warning: line 4 column 11: upstreams.php.root: {typo}: No such file or directory")),
        "{err}"
    );
    assert!(
        err.contains("every request to this upstream would be a 404"),
        "{err}"
    );
    let (code, _, _) = check_with(&yaml(&typo), &["--strict"]);
    assert_eq!(code, 1);

    let (code, _, err) = check_with(&yaml(&site.path().display().to_string()), &["--strict"]);
    assert_eq!(code, 0, "the real root is fine: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reports_the_warnings_check_prints() {
    let proxy = Proxy::start(
        "routes:\n  - { name: site, match: { path_prefix: / }, respond: { status: 200 } }\n",
    )
    .await;
    proxy.write_config(SHADOWED_LOGIN);
    let (code, body) = proxy.reload().await;
    assert_eq!(code, 200, "{body}");
    let warnings: Vec<&str> = body["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings in {body}"))
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    assert_eq!(warnings.len(), 1, "{body}");
    assert!(
        warnings[0].contains("routes[1].name: route \"wp_login\" is never reached"),
        "{body}"
    );
}

#[test]
fn check_refuses_a_config_with_no_routes_unless_it_says_so() {
    let (code, _, err) = check("limiters:\n  strict: { limit: 5, window: 60s }\n");
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("routes") && err.contains("allow_no_routes: true"),
        "{err}"
    );
    let (code, out, err) = check("allow_no_routes: true\n");
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn check_refuses_a_fifo_as_the_api_keys_file_at_once_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("keys.fifo");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let config = dir.path().join("tollgate.yaml");
    std::fs::write(
        &config,
        format!(
            "identity: {{ api_keys_file: \"{}\" }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200 }} }}\n",
            fifo.display()
        ),
    )
    .unwrap();
    // Before, the open waited for a writer that never came.
    let (status, out) = common::run_to_exit(
        &["check".as_ref(), "--config".as_ref(), config.as_os_str()],
        Duration::from_secs(10),
    );
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "identity.api_keys_file: cannot read {}: it is a FIFO",
            fifo.display()
        )),
        "{out}"
    );
}
