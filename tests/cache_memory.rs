//! What the response cache really allocates against its own accounting: filled far past `cache.max_size` with 1M small answers, or with a few large ones, the heap it holds stays within `max_size` + 10 %.
//!
//! A counting global allocator measures every byte the process holds
//! before and after filling (entries, their header maps and bodies, keys,
//! the map's tables and its ghost queue), so what is checked is real
//! allocation, not the cache's estimate of it. Allocator overhead (size
//! classes, fragmentation, pages not returned) is not counted: that is
//! mimalloc's business, not the cache's accounting.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use tollgate::cache::key::Key;
use tollgate::cache::policy::Freshness;
use tollgate::cache::{Entry, ResponseCache};
use tollgate::config::cache::CacheConfig;
use tollgate::metrics::Metrics;

struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: u64 = 1 << 20;

fn cache(max_size: u64) -> ResponseCache {
    let config = CacheConfig {
        max_size,
        max_entry_size: max_size / 4,
        lock_timeout: std::time::Duration::from_secs(5),
    };
    ResponseCache::new(&config, &Metrics::default())
}

/// A PHP page's usual headers.
fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        "content-type",
        HeaderValue::from_static("text/html; charset=UTF-8"),
    );
    h.insert("cache-control", HeaderValue::from_static("max-age=60"));
    h.insert(
        "date",
        HeaderValue::from_static("Thu, 01 Jan 2026 00:00:20 GMT"),
    );
    h.insert("x-powered-by", HeaderValue::from_static("PHP/8.2.36"));
    h
}

fn fill(c: &ResponseCache, n: usize, body_len: usize) {
    let freshness = Freshness {
        fresh_for: 60_000_000_000,
        stale_while_revalidate: 0,
        stale_if_error: 0,
        initial_age: 0,
    };
    for i in 0..n {
        let key = Key(format!("https://shop.example/product.php?id={i}").into_boxed_str());
        let body = Bytes::from(vec![b'x'; body_len]);
        let e = Entry::new(
            StatusCode::OK,
            headers(),
            body,
            0,
            freshness,
            false,
            key.len(),
        );
        c.store(&key, &[], &HeaderMap::new(), Arc::new(e));
    }
}

/// Fills a cache of `max_size` with `n` answers of `body_len` bytes; the
/// heap it then holds, and its accounting.
fn held_after(max_size: u64, n: usize, body_len: usize) -> (u64, u64) {
    let before = HELD.load(Ordering::Relaxed);
    let c = cache(max_size);
    fill(&c, n, body_len);
    let held = HELD.load(Ordering::Relaxed).saturating_sub(before) as u64;
    let accounted = c.weight();
    drop(c);
    (held, accounted)
}

#[test]
fn cache_memory_stays_within_max_size() {
    // One test, so no other test's allocations run in between.
    let max = 64 * MIB;
    let (held, accounted) = held_after(max, 1_000_000, 200);
    println!("1M small answers: held {held} B, accounted {accounted} B, max {max} B");
    assert!(accounted <= max);
    assert!(held <= max + max / 10, "held {held} B for max_size {max} B");
    assert!(
        held >= max / 2,
        "the accounting charges far more than is held: {held} B"
    );

    let (held, accounted) = held_after(max, 40, 8 * MIB as usize);
    println!("40 large answers: held {held} B, accounted {accounted} B, max {max} B");
    assert!(accounted <= max);
    assert!(held <= max + max / 10, "held {held} B for max_size {max} B");
}
