//! Memory and check time of the CrowdSec decisions held: 100,000 decisions (IPv4 and IPv6 addresses, ranges) applied as the Local API's startup stream delivers them.
//!
//! `cargo bench --bench crowdsec_memory` reports the heap bytes still
//! allocated once the answer itself is dropped (what the table keeps,
//! counted by a wrapper around the binary's allocator, mimalloc), and the
//! time per check of an address; it fails when the table takes more than
//! 30 MB. Under `cargo test --all-targets` it applies 10,000 once as a smoke test.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tollgate::config::CrowdsecConfig;
use tollgate::crowdsec::lapi::{Delta, LapiDecision};
use tollgate::crowdsec::CrowdSec;
use tollgate::metrics::Metrics;

/// mimalloc, as in the binary, counting the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { tollgate::allocator::Mimalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { tollgate::allocator::Mimalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { tollgate::allocator::Mimalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const NOW: u64 = 1_767_225_600 * 1_000_000_000;

/// 90 % IPv4 addresses, 5 % IPv6 addresses, 5 % ranges (/24 and /64), bans and captchas.
fn decisions(n: u32) -> Delta {
    let new = (0..n)
        .map(|i| {
            let (scope, value) = match i % 20 {
                0 => ("Ip", format!("2001:db8:{:x}:{:x}::1", i >> 16, i & 0xffff)),
                1 => (
                    "Range",
                    format!("{}/24", Ipv4Addr::from(0xC000_0000 + (i << 8))),
                ),
                2 => (
                    "Range",
                    format!("2001:db8:{:x}:{:x}::/64", i >> 16, i & 0xffff),
                ),
                _ => ("Ip", Ipv4Addr::from(0x0A00_0000 + i).to_string()),
            };
            LapiDecision {
                id: i64::from(i),
                scope: scope.into(),
                value,
                kind: if i % 7 == 0 { "captcha" } else { "ban" }.into(),
                duration: "3h59m58.123s".into(),
            }
        })
        .collect();
    Delta {
        new,
        deleted: Vec::new(),
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let n: u32 = if full { 100_000 } else { 10_000 };
    let config = CrowdsecConfig {
        url: "http://127.0.0.1:8080".parse().unwrap(),
        api_key_file: "/dev/null".into(),
        api_key: "bench".into(),
        poll_every: Duration::from_secs(10),
        timeout: Duration::from_secs(2),
        max_decisions: 200_000,
        push: None,
    };
    let crowdsec = CrowdSec::new(&config, &Metrics::default());
    // Counted from before the answer exists: what it allocated and gave back nets out.
    let before = LIVE.load(Ordering::Relaxed);
    let delta = decisions(n);
    let started = Instant::now();
    crowdsec.apply(&delta, true, NOW);
    let applied = started.elapsed();
    drop(delta);
    let held = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    assert_eq!(crowdsec.health().held, n as usize);
    let probes: Vec<IpAddr> = (0..1_000_000u32)
        .map(|i| IpAddr::V4(Ipv4Addr::from(0x0A00_0000 + i.wrapping_mul(7919) % (2 * n))))
        .collect();
    let started = Instant::now();
    let found = probes
        .iter()
        .filter(|ip| crowdsec.check(black_box(**ip), NOW).is_some())
        .count();
    let per_check = started.elapsed().as_nanos() as f64 / probes.len() as f64;
    println!(
        "crowdsec: {n} decisions held in {:.1} MB ({:.0} bytes each), applied in {:?}; a check: {per_check:.0} ns ({found} of {} found)",
        held as f64 / 1e6,
        held as f64 / f64::from(n),
        applied,
        probes.len()
    );
    if full && held > 30_000_000 {
        eprintln!("100,000 decisions took more than 30 MB");
        std::process::exit(1);
    }
}
