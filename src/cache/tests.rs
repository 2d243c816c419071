//! The map's behaviour: scans, purges, resizes, `Vary`.

use super::*;
use crate::cache::policy::Freshness;
use http::StatusCode;

const S: Nanos = 1_000_000_000;

fn cache(max_size: u64) -> ResponseCache {
    let config = CacheConfig {
        max_size,
        max_entry_size: max_size / 4,
        lock_timeout: std::time::Duration::from_secs(5),
    };
    ResponseCache::new(&config, &Metrics::default())
}

fn entry(body_len: usize, key_len: usize) -> Arc<Entry> {
    let freshness = Freshness {
        fresh_for: 60 * S,
        stale_while_revalidate: 0,
        stale_if_error: 0,
        initial_age: 0,
    };
    let body = bytes::Bytes::from(vec![b'x'; body_len]);
    Arc::new(Entry::new(
        StatusCode::OK,
        HeaderMap::new(),
        body,
        0,
        freshness,
        false,
        key_len,
    ))
}

fn key(path: &str) -> Key {
    Key(format!("http://shop.example{path}").into_boxed_str())
}

fn put(c: &ResponseCache, path: &str, body_len: usize) {
    let k = key(path);
    c.store(&k, &[], &HeaderMap::new(), entry(body_len, k.len()));
}

fn has(c: &ResponseCache, path: &str) -> bool {
    matches!(c.find(key(path), &HeaderMap::new(), S), Found::Entry(..))
}

#[test]
fn a_one_off_scan_of_100k_urls_keeps_the_hot_pages() {
    let c = cache(8 << 20);
    let hot: Vec<String> = (0..200).map(|i| format!("/hot/{i}")).collect();
    for p in &hot {
        put(&c, p, 4096);
    }
    for p in &hot {
        assert!(has(&c, p));
    }
    for i in 0..100_000 {
        put(&c, &format!("/scan/{i}"), 4096);
        // The home page and its neighbours keep being asked for meanwhile.
        if i % 50 == 0 {
            for p in &hot[..20] {
                has(&c, p);
            }
        }
    }
    let kept = hot.iter().filter(|p| has(&c, p)).count();
    assert!(
        kept >= 190,
        "only {kept} of 200 hot pages survived the scan"
    );
    assert!(c.weight() <= 8 << 20);
    assert!(c.evictions.load(Ordering::Relaxed) > 90_000);
}

#[test]
fn a_purge_removes_a_path_prefix_on_any_host_or_one_host() {
    let c = cache(8 << 20);
    for p in ["/blog/a", "/blog/b?x=1", "/shop/c"] {
        put(&c, p, 10);
    }
    let other = Key("http://other.example/blog/a".into());
    c.store(&other, &[], &HeaderMap::new(), entry(10, other.len()));
    assert_eq!(c.purge(Some("/blog/"), Some("Shop.Example")), 2);
    assert!(has(&c, "/shop/c") && !has(&c, "/blog/a"));
    assert!(c.contains(&other.0));
    assert_eq!(c.purge(Some("/blog/"), None), 1);
    assert_eq!(c.purge(None, None), 1);
    assert!(c.is_empty());
}

#[test]
fn shrinking_keeps_the_pages_asked_for_and_growing_keeps_everything() {
    let c = cache(8 << 20);
    for i in 0..1000 {
        put(&c, &format!("/p/{i}"), 4096);
    }
    let hot: Vec<String> = (0..50).map(|i| format!("/p/{i}")).collect();
    for _ in 0..3 {
        for p in &hot {
            has(&c, p);
        }
    }
    c.reconfigure(&CacheConfig {
        max_size: 16 << 20,
        max_entry_size: 1 << 20,
        lock_timeout: std::time::Duration::from_secs(5),
    });
    assert_eq!(c.len(), 1000, "growing drops nothing");
    c.reconfigure(&CacheConfig {
        max_size: 1 << 20,
        max_entry_size: 1 << 18,
        lock_timeout: std::time::Duration::from_secs(5),
    });
    assert!(c.weight() <= 1 << 20);
    let kept = hot.iter().filter(|p| has(&c, p)).count();
    assert!(
        kept >= 45,
        "only {kept} of 50 hot pages survived the shrink"
    );
}

#[test]
fn answers_that_vary_are_found_by_the_request_headers_they_vary_by() {
    let c = cache(8 << 20);
    let base = key("/");
    let lang = HeaderName::from_static("accept-language");
    let mut de = HeaderMap::new();
    de.insert(&lang, "de".parse().unwrap());
    let mut fr = HeaderMap::new();
    fr.insert(&lang, "fr".parse().unwrap());
    c.store(
        &base,
        std::slice::from_ref(&lang),
        &de,
        entry(1, base.len()),
    );
    assert!(matches!(c.find(base.clone(), &de, S), Found::Entry(..)));
    assert!(matches!(c.find(base.clone(), &fr, S), Found::Nothing(_)));
    let Found::Nothing(k) = c.find(base.clone(), &fr, S) else {
        unreachable!()
    };
    assert_ne!(k, base, "the key an answer for fr would go under holds fr");
}

#[test]
fn an_entry_past_every_window_is_gone() {
    let c = cache(8 << 20);
    put(&c, "/", 10);
    assert!(matches!(
        c.find(key("/"), &HeaderMap::new(), 59 * S),
        Found::Entry(..)
    ));
    assert!(matches!(
        c.find(key("/"), &HeaderMap::new(), 61 * S),
        Found::Nothing(_)
    ));
    assert!(c.is_empty());
}

#[test]
fn an_unstorable_answer_is_remembered_for_a_while_and_never_over_a_stored_one() {
    let c = cache(8 << 20);
    let found = |path: &str, now: Nanos| c.find(key(path), &HeaderMap::new(), now);
    c.remember_unstorable(&key("/me"), S);
    assert!(matches!(found("/me", S), Found::Unstorable(_)));
    assert!(matches!(
        found("/me", S + UNSTORABLE_FOR - 1),
        Found::Unstorable(_)
    ));
    // Expired: the key leads a render again, and the marker is gone.
    assert!(matches!(
        found("/me", S + UNSTORABLE_FOR),
        Found::Nothing(_)
    ));
    assert!(!c.contains(&key("/me").0));
    // A stored answer (a stale one a failed refresh falls back on) stays.
    put(&c, "/page", 100);
    c.remember_unstorable(&key("/page"), S);
    assert!(has(&c, "/page"));
}
