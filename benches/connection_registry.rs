//! Cost of the connection registry on every request: a request's start and end on a connection (`Activity::request` and its guard's drop), with the registry holding many idle connections from many addresses.
//!
//! `cargo bench --bench connection_registry` prints nanoseconds per
//! request (start and end; medians of 5 runs) with 1,000 idle connections
//! from 100 addresses beside the one that serves, twice: under a cap of
//! 10,000 (below half of it nothing is ranked) and under a cap of 1,500
//! (the ranking is kept). For instructions, run the binary under callgrind
//! twice and divide the difference (`ranked` for the second case):
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/…/connection_registry-… 0 [ranked]
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/…/connection_registry-… 100000 [ranked]
//! ```
//!
//! Under `cargo test --all-targets` it runs a few iterations only.

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Instant;

use tollgate::connections::Connections;
use tollgate::metrics::Metrics;

/// A cap with the 1,001 connections below half of it, and one above.
const CAPS: [(&str, usize); 2] = [("unranked", 10_000), ("ranked", 1_500)];

/// ns per request over `n` requests under `cap`.
fn run(n: u64, cap: usize) -> f64 {
    let c = Connections::new(&Metrics::default());
    let idle: Vec<_> = (0..1_000u32)
        .map(|i| {
            let ip = IpAddr::V4((0xc633_6400 + i % 100).into());
            let p = c.admit(ip, cap, None).unwrap();
            drop(p.activity().request());
            p
        })
        .collect();
    let serving = c.admit("192.0.2.1".parse().unwrap(), cap, None).unwrap();
    let activity = serving.activity();
    let t = Instant::now();
    for _ in 0..n {
        drop(black_box(activity.request()));
    }
    let ns = t.elapsed().as_nanos() as f64 / n.max(1) as f64;
    drop(idle);
    ns
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // Under callgrind: `connection_registry <n> [ranked]`.
    if let Some(n) = args.get(1).and_then(|n| n.parse().ok()) {
        let cap = if args.get(2).is_some_and(|a| a == "ranked") {
            CAPS[1].1
        } else {
            CAPS[0].1
        };
        black_box(run(n, cap));
        return;
    }
    let timing = args.iter().any(|a| a == "--bench");
    let n = if timing { 1_000_000 } else { 10 };
    for (name, cap) in CAPS {
        let mut runs: Vec<f64> = (0..5).map(|_| run(n, cap)).collect();
        runs.sort_by(f64::total_cmp);
        if timing {
            println!("{name}: {:.0} ns per request (median of 5)", runs[2]);
        }
    }
}
