//! `tollgate check` has an overall deadline: a config whose listen name the resolver never answers is given up with a clear error, not waited on forever.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::BINARY;

/// Run inside fresh mount and network namespaces (`unshare -mn`): brings
/// loopback up, points `/etc/resolv.conf` (for this process only) at
/// 127.0.0.1 with long resolver timeouts, binds UDP 127.0.0.1:53 and never
/// reads it, then becomes `tollgate check` with that socket still open. Every
/// DNS question is taken and none is answered: a resolver that hangs.
const BLACK_HOLE: &str = r#"
import os, socket, subprocess, sys
resolv, binary, config = sys.argv[1:4]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["mount", "--bind", resolv, "/etc/resolv.conf"], check=True)
hole = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
hole.bind(("127.0.0.1", 53))
os.set_inheritable(hole.fileno(), True)
os.execv(binary, [binary, "check", *sys.argv[4:], "--config", config])
"#;

/// Runs `tollgate check <flags>` on `yaml` under [`BLACK_HOLE`]; `None` when
/// this machine cannot make namespaces (not root), said loudly.
fn check_with_a_hanging_resolver(yaml: &str, flags: &[&str]) -> Option<(i32, String, Duration)> {
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:30 attempts:5\n",
    )
    .unwrap();
    let config = dir.path().join("tollgate.yaml");
    std::fs::write(&config, yaml).unwrap();
    let can = Command::new("unshare").args(["-mn", "true"]).status();
    if !can.is_ok_and(|s| s.success()) {
        let required = std::env::var("TOLLGATE_REQUIRE_MOUNTS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "cannot unshare -mn and TOLLGATE_REQUIRE_MOUNTS=1"
        );
        eprintln!("\n!!! SKIPPED: `unshare -mn` is not permitted here (this test needs root; CI runs it as root).\n");
        return None;
    }
    let started = Instant::now();
    let child = Command::new("unshare")
        .args(["-mn", "python3", "-c", BLACK_HOLE])
        .arg(&resolv)
        .arg(BINARY)
        .arg(&config)
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare runs");
    let pid = child.id();
    // Without a deadline the check would wait 30 s × 5 attempts per question: stop at 20 s.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(Duration::from_secs(20)) else {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("tollgate check still ran 20 s after it started");
    };
    let out = out.unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.code().unwrap_or(-1), text, started.elapsed()))
}

#[test]
fn check_gives_up_at_its_timeout_when_a_listen_name_is_never_resolved() {
    let yaml = "server: { listen: \"never-answered.test:8080\" }\nroutes:\n  - { name: r, match: { path_prefix: / }, respond: { status: 200 } }\n";
    let Some((code, out, took)) = check_with_a_hanging_resolver(yaml, &["--timeout", "1s"]) else {
        return;
    };
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("reading and checking the config took longer than 1s and was given up"),
        "{out}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}: {out}");
}

#[test]
fn check_under_the_same_resolver_is_not_held_up_by_a_config_without_names() {
    let yaml = "server: { listen: \"127.0.0.1:8080\" }\nroutes:\n  - { name: r, match: { path_prefix: / }, respond: { status: 200 } }\n";
    let Some((code, out, _)) = check_with_a_hanging_resolver(yaml, &["--timeout", "5s"]) else {
        return;
    };
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": ok: 1 listener(s)"), "{out}");
}
