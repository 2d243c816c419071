//! Memory per tracked key: resident bytes a full key table costs, per algorithm and key shape.
//!
//! `cargo bench --bench keys_memory` fills a table with 1M (and 917,504)
//! distinct keys and reports the process' `VmRSS` growth divided by the keys
//! held, each case in a fresh child process so one case's freed memory does
//! not flatter the next: right after filling, and again after `mi_collect`
//! (what the table keeps once the smaller tables its growth left behind are
//! handed back). Layouts and the allocator (mimalloc, as in the
//! binary) are the same in every profile, so `--profile dev` measures the
//! same bytes faster. Each case also reports the time per check: in the
//! cases that offer twice what fits, every key past the bound is placed by
//! evicting the lightest live one (a flood of one-request clients). Under `cargo test --all-targets` it runs 10,000 keys
//! once as a smoke test.

use tollgate::limiter::{
    fixed_window::FixedWindow, sliding_window::SlidingWindow, token_bucket::TokenBucket, Algorithm,
    NANOS_PER_SEC,
};
use tollgate::store::table::Table;
use tollgate::store::Check;

#[global_allocator]
static GLOBAL: tollgate::allocator::Mimalloc = tollgate::allocator::Mimalloc;

const T0: u64 = 1_767_225_600 * NANOS_PER_SEC;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn algorithm(name: &str) -> Algorithm {
    match name {
        "fixed_window" => Algorithm::FixedWindow(FixedWindow {
            limit: 100,
            window: 60 * NANOS_PER_SEC,
        }),
        "token_bucket" => Algorithm::TokenBucket(TokenBucket {
            capacity: 20,
            interval: NANOS_PER_SEC / 2,
            refunds: false,
        }),
        "sliding_window" => Algorithm::SlidingWindow(SlidingWindow {
            limit: 100,
            window: 60 * NANOS_PER_SEC,
        }),
        other => panic!("unknown algorithm {other}"),
    }
}

/// A store key as a request builds it: an IPv4 client or a verified API key.
fn key(shape: &str, i: u64) -> String {
    match shape {
        "ip" => format!(
            "per_client:ip:10.{}.{}.{}",
            i >> 16 & 255,
            i >> 8 & 255,
            i & 255
        ),
        _ => format!(
            "per_client:key:{:032x}",
            i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ),
    }
}

/// One case, in this process: offer `offered` keys to a table bounded at `max_keys`.
fn case(name: &str, shape: &str, offered: u64, max_keys: usize) {
    let a = algorithm(name);
    let table = Table::with_max_keys(false, max_keys);
    let before = rss_kib();
    let started = std::time::Instant::now();
    for i in 0..offered {
        let k = key(shape, i);
        table.check(
            &[Check {
                key: &k,
                overflow: "per_client:*overflow",
                algorithm: &a,
                shadow: false,
            }],
            T0,
        );
    }
    let per_check = started.elapsed().as_nanos() as f64 / offered as f64;
    let after = rss_kib();
    // What the table keeps once the allocator has handed back the tables
    // its growth left behind (mimalloc purges them after a delay; the
    // proxy's workers collect after each prune).
    // SAFETY: mi_collect walks this thread's own heap, the only one here.
    unsafe { libmimalloc_sys::mi_collect(true) };
    let settled = rss_kib();
    let held = table.len();
    let per_key = |rss: u64| (rss.saturating_sub(before) * 1024) as f64 / held.max(1) as f64;
    let evicted = table
        .counters()
        .evicted
        .load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{name:<15} {shape:<4} offered {offered:>9} max_keys {max_keys:>9} held {held:>9}  RSS {before:>7} -> {after:>7} KiB {:>4} B/key, collected {settled:>7} KiB {:>4} B/key; {per_check:>5.0} ns/check, {evicted} evicted",
        per_key(after).round(),
        per_key(settled).round(),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let p = &args[i + 1..i + 5];
        case(&p[0], &p[1], p[2].parse().unwrap(), p[3].parse().unwrap());
        return;
    }
    let full = args.iter().any(|a| a == "--bench");
    let million: u64 = if full { 1_000_000 } else { 10_000 };
    // 64 shards × 14,336 keys: the most whose shards stay in 16,384 buckets.
    let fitted: u64 = if full { 917_504 } else { 9_000 };
    let roomy = |n: u64| (n * 2) as usize;
    let mut cases: Vec<(&str, &str, u64, usize)> = vec![];
    for name in ["fixed_window", "token_bucket", "sliding_window"] {
        cases.push((name, "ip", million, roomy(million)));
    }
    cases.push(("fixed_window", "key", million, roomy(million)));
    cases.push(("fixed_window", "ip", fitted, roomy(fitted)));
    // The bound itself: twice as many keys offered as fit.
    cases.push(("fixed_window", "ip", 2 * million, million as usize));
    cases.push(("fixed_window", "ip", 2 * million, fitted as usize + 64));
    // As the binary does (src/main.rs): no transparent huge pages, here
    // for the children, which inherit the setting from their first page on.
    // SAFETY: sets a flag on this process; allocates nothing.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
    let me = std::env::current_exe().unwrap();
    for (name, shape, offered, max_keys) in cases {
        let status = std::process::Command::new(&me)
            .args(["--case", name, shape])
            .arg(offered.to_string())
            .arg(max_keys.to_string())
            .status()
            .expect("the bench re-runs itself");
        assert!(status.success());
    }
    if !full {
        println!("(smoke run: `cargo bench --bench keys_memory` measures 1M keys)");
    }
}
