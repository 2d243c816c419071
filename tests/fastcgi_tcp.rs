//! php-fpm over TCP on a kept connection: a page over 8 KiB arrives in milliseconds, not after a delayed acknowledgement (40 ms or more).

mod common;

use std::time::{Duration, Instant};

use common::php_fpm::PhpFpm;
use common::{client, send, Proxy};

/// A page of `n` bytes.
const PAGE: &str = "<?php echo str_repeat('x', (int) ($_GET['n'] ?? 0));";

/// Connections this process holds open to `port` on 127.0.0.1 (tollgate's
/// side of its kept FastCGI connections), from /proc/net/tcp.
fn established_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2] == remote && f[3] == "01"
        })
        .count()
}

#[tokio::test]
async fn a_20_kb_page_over_a_kept_tcp_connection_to_php_fpm_is_not_held_by_a_delayed_ack() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("page.php"), PAGE).unwrap();
    let fpm = PhpFpm::start(dir.path(), &root, 2, "");
    let proxy = Proxy::start(&format!(
        "upstreams:\n  php: {{ url: \"fastcgi://{}\", root: \"{}\" }}\n\
         routes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        fpm.tcp,
        root.display()
    ))
    .await;
    let c = client();
    let url = proxy.url("/page.php?n=20480");
    // The first opens the connections (a new TCP connection acknowledges
    // promptly by itself); the measured ones reuse them.
    assert_eq!(send(c.get(&url)).await.body.len(), 20480);
    let mut took = Vec::new();
    for _ in 0..21 {
        let started = Instant::now();
        let r = send(c.get(&url)).await;
        took.push(started.elapsed());
        assert_eq!((r.status, r.body.len()), (200, 20480));
    }
    took.sort();
    // A delayed acknowledgement holds each answer 40 ms at least (Linux's
    // minimum delay), so the median of 21 tells the stall from a busy
    // machine's slow request.
    let median = took[took.len() / 2];
    assert!(
        median < Duration::from_millis(20),
        "median {median:?} over a kept connection; all: {took:?}"
    );
    assert!(
        established_to(fpm.tcp.port()) >= 1,
        "the connection to php-fpm was kept"
    );
}
