//! `rediss://`: the Redis store over TLS to a real `redis-server --tls-port`, whose certificate
//! tollgate checks against the roots it trusts; a server it cannot verify is never counted in.

mod common;

use std::path::Path;
use std::time::Duration;

use common::certs::Ca;
use common::redis_cluster::Node;
use common::{free_addr, http, http_with, pin_yaml, Process, BINARY};

/// A redis-server with a plain port (the test reads keys there) and a TLS port (tollgate's).
struct TlsRedis {
    node: Node,
    tls_port: u16,
}

impl TlsRedis {
    /// Serves TLS with a certificate for 127.0.0.1 that `ca` issued.
    fn start(ca: &Ca, dir: &Path) -> TlsRedis {
        let leaf = ca.issue(&["127.0.0.1"]);
        std::fs::write(dir.join("redis.crt"), &leaf.cert_pem).unwrap();
        std::fs::write(dir.join("redis.key"), &leaf.key_pem).unwrap();
        let ca_file = ca.write(dir, "ca.pem");
        let (port, tls_port) = (free_addr().port(), free_addr().port());
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            "redis.crt",
            "--tls-key-file",
            "redis.key",
            "--tls-ca-cert-file",
            &ca_file.display().to_string(),
            // Server authentication only: tollgate presents no client certificate.
            "--tls-auth-clients",
            "no",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(String::from)
        .to_vec();
        TlsRedis {
            node: Node::spawn(&args, dir),
            tls_port,
        }
    }
}

/// A tollgate on `rediss://` to `redis`, trusting only the roots in `roots` (`SSL_CERT_FILE`).
fn tollgate(redis: &TlsRedis, roots: &Path, dir: &Path) -> Process {
    let yaml = format!(
        "store: {{ backend: redis, url: \"rediss://127.0.0.1:{}/0\", prefix: \"tls:\", timeout: 2s, on_error: deny }}\n\
         identity: {{ trusted_proxies: [127.0.0.1/32] }}\n\
         limiters:\n  per_ip: {{ algorithm: fixed_window, limit: 2, window: 3600s, key: ip }}\n\
         routes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200, body: ok }}, limiters: [per_ip] }}\n",
        redis.tls_port
    );
    let (addr, admin) = (free_addr(), free_addr());
    let config = dir.join("tollgate.yaml");
    std::fs::write(&config, pin_yaml(&yaml, addr, admin, dir)).unwrap();
    let mut cmd = std::process::Command::new(BINARY);
    cmd.arg("serve")
        .arg("--config")
        .arg(&config)
        .current_dir(dir)
        .env("SSL_CERT_FILE", roots)
        .env_remove("SSL_CERT_DIR");
    Process::spawn(cmd, addr, admin, dir)
}

fn statuses(p: &Process, ip: &str, n: usize) -> Vec<u16> {
    (0..n)
        .map(|_| {
            http_with(p.addr, "GET", "/", &[("X-Forwarded-For", ip)])
                .unwrap_or_else(|e| panic!("{e}\n{}", p.output()))
                .status
        })
        .collect()
}

#[test]
fn a_redis_whose_certificate_tollgate_trusts_counts_the_limit_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("redis test CA");
    let redis = TlsRedis::start(&ca, dir.path());
    let roots = ca.write(dir.path(), "roots.pem");
    let p = tollgate(&redis, &roots, dir.path());
    assert_eq!(
        statuses(&p, "203.0.113.9", 3),
        [200, 200, 429],
        "{}",
        p.output()
    );
    let key = "tls:{tls}per_ip:ip:203.0.113.9";
    let counted = redis.node.cli(&["HGET", key, "n"]);
    assert!(
        counted.trim().parse::<u64>().unwrap_or(0) >= 2,
        "{key} counted in Redis: {counted:?}"
    );
    let ready = http(p.admin, "GET", "/readyz").unwrap();
    assert_eq!(ready.status, 200, "{ready:?}");
}

#[test]
fn a_redis_whose_certificate_another_ca_issued_is_refused_and_on_error_applies() {
    let dir = tempfile::tempdir().unwrap();
    let redis = TlsRedis::start(&Ca::new("redis test CA"), dir.path());
    let roots = Ca::new("some other CA").write(dir.path(), "roots.pem");
    let p = tollgate(&redis, &roots, dir.path());
    assert_eq!(
        statuses(&p, "203.0.113.9", 3),
        [503, 503, 503],
        "on_error: deny, every time\n{}",
        p.output()
    );
    assert_eq!(
        redis.node.cli(&["DBSIZE"]).trim(),
        "0",
        "nothing reached Redis"
    );
    let not_ready = common::eventually_blocking(Duration::from_secs(5), || {
        http(p.admin, "GET", "/readyz").is_ok_and(|r| r.status == 503)
    });
    assert!(not_ready, "/readyz reports the store down");
}
