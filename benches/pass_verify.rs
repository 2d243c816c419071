//! Cost of the challenge gate's per-request work: checking a pass cookie, refusing a forged solution, issuing a challenge.
//!
//! `cargo bench --bench pass_verify` prints nanoseconds per call (medians of
//! 5 runs). For instructions, which do not depend on how busy the machine
//! is, run the binary under callgrind twice and divide the difference:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/…/pass_verify-… verify 0
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/…/pass_verify-… verify 100000
//! ```
//!
//! (`verify`, `forged` or `issue`; the second total minus the first, over
//! 100,000). Under `cargo test --all-targets` it runs a few iterations only.

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use tollgate::challenge::{token, ChallengeGate, Solution};
use tollgate::config::{PassConfig, PassKey, PassKeys};
use tollgate::metrics::Metrics;

const NOW: u64 = 1_767_225_600 * 1_000_000_000;
const HOST: &str = "wiki.example";

fn gate() -> ChallengeGate {
    let config = PassConfig {
        secret_file: "/dev/null".into(),
        keys: Arc::new(PassKeys(vec![
            PassKey::new(b"0123456789abcdef0123456789abcdef-old"),
            PassKey::new(b"fedcba9876543210fedcba9876543210-new"),
        ])),
        ttl: Duration::from_secs(7 * 86_400),
        ipv4_prefix: 24,
        ipv6_prefix: 64,
        issue_limit: 2,
        crawlers: Default::default(),
    };
    ChallengeGate::new(&config, &Metrics::default()).expect("keys")
}

/// A real pass cookie for `ip`, earned by solving a challenge of 4 bits.
fn pass_cookie(g: &ChallengeGate, ip: IpAddr) -> HeaderMap {
    let c = g.issue(HOST, ip, 4, NOW);
    let nonce = (0u64..)
        .find(|n| {
            let d = Sha256::new()
                .chain_update(c.as_bytes())
                .chain_update(n.to_string().as_bytes())
                .finalize();
            token::leading_zero_bits(&d) >= 4
        })
        .unwrap();
    let s = Solution {
        challenge: c,
        nonce: nonce.to_string(),
        back: "/".into(),
        solve_ms: None,
        via: "js".into(),
    };
    let granted = g.redeem(&s, HOST, ip, NOW, false).expect("solved");
    let mut h = HeaderMap::new();
    let value = granted.cookie.split(';').next().unwrap().to_string();
    h.insert(http::header::COOKIE, HeaderValue::from_str(&value).unwrap());
    h
}

fn run(what: &str, n: u64, g: &ChallengeGate) {
    let ip: IpAddr = "203.0.113.9".parse().unwrap();
    let cookie = pass_cookie(g, ip);
    let challenge = g.issue(HOST, ip, 16, NOW);
    let forged = Solution {
        challenge,
        nonce: "12345".into(),
        back: "/".into(),
        solve_ms: None,
        via: "js".into(),
    };
    for _ in 0..n {
        match what {
            "verify" => {
                assert!(black_box(g.pass_of(&cookie, HOST, ip, NOW)).is_some());
            }
            "forged" => {
                let _ = black_box(g.redeem(&forged, HOST, ip, NOW, false));
            }
            _ => {
                black_box(g.issue(HOST, ip, 16, NOW));
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let g = gate();
    // Under callgrind: `pass_verify <what> <n>`.
    if let (Some(what), Some(n)) = (args.get(1), args.get(2).and_then(|n| n.parse().ok())) {
        run(what, n, &g);
        return;
    }
    let timing = args.iter().any(|a| a == "--bench");
    let n = if timing { 200_000 } else { 10 };
    for what in ["verify", "forged", "issue"] {
        let mut runs: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                run(what, n, &g);
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect();
        runs.sort_by(f64::total_cmp);
        if timing {
            println!("{what}: {:.0} ns per call (median of 5)", runs[2]);
        }
    }
}
