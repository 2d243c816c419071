//! The bytes a key costs in the key table at its bound once a flood has churned it, counted at the allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate::limiter::{fixed_window::FixedWindow, Algorithm, NANOS_PER_SEC};
use tollgate::store::table::Table;
use tollgate::store::Check;

/// The system allocator, counting the bytes live: a count, unlike RSS, does
/// not depend on what the allocator keeps or hands back.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to `System` unchanged; only a count is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const T0: u64 = 1_767_225_600 * NANOS_PER_SEC;

/// 64 shards of 448 keys (7/8 of 512 buckets, as the default bound's
/// 14,336 are of 16,384) and the 64 overflow slots.
const MAX_KEYS: usize = 64 + 64 * 448;

/// Bytes a key costs in a table at its bound after a flood replaced its
/// keys. Filled once, a key costs its 56-byte bucket and control byte with
/// 1/8 of the buckets empty (~65); but a key forgotten to make room often
/// leaves a tombstone, and a shard whose free buckets have all become
/// tombstones doubles its buckets for the next key (~130, and the shards'
/// small vectors).
const UNDER_A_FLOOD: usize = 140;

/// Live heap bytes per key held after `offered` one-request keys.
fn bytes_per_key(offered: usize) -> usize {
    let algorithm = Algorithm::FixedWindow(FixedWindow {
        limit: 100,
        window: 60 * NANOS_PER_SEC,
    });
    let before = LIVE.load(Ordering::Relaxed);
    let table = Table::with_max_keys(false, MAX_KEYS);
    for i in 0..offered {
        let key = format!(
            "per_client:ip:10.{}.{}.{}",
            i >> 16 & 255,
            i >> 8 & 255,
            i & 255
        );
        let check = Check {
            key: &key,
            overflow: "per_client:*overflow",
            algorithm: &algorithm,
            shadow: false,
        };
        table.check(&[check], T0);
    }
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    let per_key = bytes / table.len();
    println!(
        "{offered} keys offered, {} held: {per_key} B/key",
        table.len()
    );
    per_key
}

#[test]
fn a_flood_of_twice_the_bound_leaves_the_table_at_most_140_bytes_a_key() {
    let per_key = bytes_per_key(2 * MAX_KEYS);
    assert!(per_key <= UNDER_A_FLOOD, "{per_key} B/key");
}
