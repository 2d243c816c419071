//! The table's unit tests: atomic checks, changes for the writer, and the bound (eviction order, overflow), on injected time.
use super::*;
use crate::limiter::fixed_window::FixedWindow;
use crate::limiter::NANOS_PER_SEC as S;

fn fixed(limit: u64) -> Algorithm {
    Algorithm::FixedWindow(FixedWindow {
        limit,
        window: 60 * S,
    })
}

#[test]
fn a_denial_by_one_limiter_is_still_counted_by_a_fixed_window_beside_it() {
    let table = Table::new(false);
    let (strict, global) = (fixed(1), fixed(100));
    let now = 6_000 * S;
    let checks = |_: ()| {
        vec![
            Check {
                key: "strict:ip:a",
                overflow: "strict:*overflow",
                algorithm: &strict,
                shadow: false,
            },
            Check {
                key: "global:ip:a",
                overflow: "global:*overflow",
                algorithm: &global,
                shadow: false,
            },
        ]
    };
    let first = table.check(&checks(()), now);
    assert!(first.iter().all(|o| o.ruling == Ruling::Allow));
    let second = table.check(&checks(()), now);
    assert!(second[0].ruling.is_deny());
    assert_eq!(
        second[1].quota.remaining, 98,
        "fixed windows count attempts"
    );
}

#[test]
fn a_request_refused_by_one_limiter_creates_no_key_in_the_others() {
    let table = Table::new(false);
    let (strict, tenant) = (fixed(1), fixed(100));
    let now = 6_000 * S;
    let request = |value: &str| {
        let key = format!("tenant:header:{value}");
        table.check(
            &[
                Check {
                    key: "strict:ip:a",
                    overflow: "strict:*overflow",
                    algorithm: &strict,
                    shadow: false,
                },
                Check {
                    key: &key,
                    overflow: "tenant:*overflow",
                    algorithm: &tenant,
                    shadow: false,
                },
            ],
            now,
        )
    };
    assert!(request("first").iter().all(|o| o.ruling == Ruling::Allow));
    assert_eq!(table.len(), 2);
    for i in 0..100 {
        let out = request(&format!("new-{i}"));
        assert!(out[0].ruling.is_deny());
        assert!(!out[1].overflowed);
        assert_eq!(out[1].quota.remaining, 100, "nothing was counted on it");
    }
    assert_eq!(table.len(), 2, "100 refused requests made no key");
    assert_eq!(table.count_of("tenant"), 1);
    let held = request("first");
    assert_eq!(
        held[1].quota.remaining, 98,
        "a key it already had still counts the refused attempt"
    );
}

#[test]
fn a_shadow_limiter_reports_a_denial_but_does_not_block() {
    let table = Table::new(false);
    let a = fixed(1);
    let now = 6_000 * S;
    let shadow = [Check {
        key: "s:ip:a",
        overflow: "s:*overflow",
        algorithm: &a,
        shadow: true,
    }];
    table.check(&shadow, now);
    let second = table.check(&shadow, now);
    assert!(second[0].ruling.is_deny());
    assert_eq!(second[0].quota.remaining, 0);
}

#[test]
fn a_changed_window_starts_the_key_afresh_but_a_changed_limit_does_not() {
    let table = Table::new(false);
    let now = 6_000 * S;
    let five = fixed(5);
    for _ in 0..3 {
        table.check(
            &[Check {
                key: "l:k",
                overflow: "l:*overflow",
                algorithm: &five,
                shadow: false,
            }],
            now,
        );
    }
    assert_eq!(table.peek("l:k", &fixed(2), now).remaining, 0);
    let longer = Algorithm::FixedWindow(FixedWindow {
        limit: 5,
        window: 120 * S,
    });
    assert_eq!(table.peek("l:k", &longer, now).remaining, 5);
}

#[test]
fn changes_are_handed_to_the_writer_once() {
    let table = Table::new(true);
    let a = fixed(5);
    for _ in 0..3 {
        table.check(
            &[Check {
                key: "l:k",
                overflow: "l:*overflow",
                algorithm: &a,
                shadow: false,
            }],
            60 * S,
        );
    }
    let changes = table.take_changes();
    assert_eq!(changes.len(), 1);
    assert!(table.take_changes().is_empty());
    assert_eq!(table.remove_keys(&["l:k".to_string()]), 1);
    let gone = table.take_changes();
    assert_eq!(gone.len(), 1);
    assert!(gone[0].state.is_none());
}

use crate::limiter::concurrency::Concurrency;
use crate::limiter::leaky_bucket::LeakyBucket;
use crate::limiter::sliding_window::SlidingWindow;
use crate::limiter::token_bucket::TokenBucket;

const T0: Nanos = 1_767_225_600 * S; // a multiple of every window used here

/// `max_keys` for `per_shard` regular keys in every shard.
fn bound(per_shard: usize) -> usize {
    OVERFLOW_SLOTS + per_shard * SHARDS
}

/// `n` distinct store keys of limiter `l` that fall in `key`'s shard.
fn neighbours(table: &Table, key: &str, n: usize) -> Vec<String> {
    let shard = table.shard_of(key);
    (0u32..)
        .map(|i| format!("l:ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .filter(|k| k != key && table.shard_of(k) == shard)
        .take(n)
        .collect()
}

fn hit(table: &Table, key: &str, algorithm: &Algorithm, now: Nanos) -> Outcome {
    let out = table.check(
        &[Check {
            key,
            overflow: "l:*overflow",
            algorithm,
            shadow: false,
        }],
        now,
    );
    out[0]
}

fn evicted(table: &Table) -> u64 {
    table.counters().evicted.load(Ordering::Relaxed)
}

#[test]
fn a_full_shard_forgets_a_key_at_rest_and_keeps_the_limited_one() {
    let table = Table::with_max_keys(false, bound(2));
    let bucket = Algorithm::TokenBucket(TokenBucket {
        capacity: 2,
        interval: S,
        refunds: false,
    });
    let limited = "l:ip:203.0.113.9";
    let [resting, newcomer]: [String; 2] = neighbours(&table, limited, 2).try_into().unwrap();
    for _ in 0..3 {
        hit(&table, limited, &bucket, T0); // drained, full again at T0 + 2s
    }
    hit(&table, &resting, &bucket, T0); // full again at T0 + 1s

    let now = T0 + 1_500_000_000;
    let out = hit(&table, &newcomer, &bucket, now);
    assert!(!out.overflowed, "a slot was freed for the newcomer");
    assert_eq!(evicted(&table), 1);
    assert!(table.holds(limited), "the limited key is never forgotten");
    assert!(!table.holds(&resting), "the key at rest made room");
    assert_eq!(
        table.peek(limited, &bucket, now).remaining,
        1,
        "its count went on: 1.5 tokens back, not a full bucket"
    );
}

#[test]
fn when_nothing_rests_new_keys_share_the_limiters_overflow_counter() {
    let table = Table::with_max_keys(false, bound(1));
    let strict = fixed(1);
    let limited = "l:ip:203.0.113.9";
    hit(&table, limited, &strict, T0);
    assert!(hit(&table, limited, &strict, T0).ruling.is_deny());

    let [a, b]: [String; 2] = neighbours(&table, limited, 2).try_into().unwrap();
    let first = hit(&table, &a, &strict, T0 + S);
    assert!(first.overflowed && first.ruling == Ruling::Allow);
    let second = hit(&table, &b, &strict, T0 + S);
    assert!(
        second.overflowed && second.ruling.is_deny(),
        "b is counted on the counter a used, not on a fresh one"
    );
    assert_eq!(table.counters().overflowed.load(Ordering::Relaxed), 2);
    assert_eq!(evicted(&table), 0);
    assert!(table.holds(limited));
    assert!(hit(&table, limited, &strict, T0 + S).ruling.is_deny());

    // The next window: the limited key is at rest and gives its slot up.
    let out = hit(&table, &a, &strict, T0 + 60 * S);
    assert!(!out.overflowed);
    assert_eq!(evicted(&table), 1);
}

#[test]
fn every_algorithm_rests_only_when_forgetting_it_changes_nothing() {
    let algorithms = [
        (fixed(2), 60 * S),
        (
            Algorithm::SlidingWindow(SlidingWindow {
                limit: 2,
                window: 10 * S,
            }),
            10 * S,
        ),
        (
            Algorithm::TokenBucket(TokenBucket {
                capacity: 2,
                interval: 2 * S,
                refunds: false,
            }),
            2 * S,
        ),
        (
            Algorithm::LeakyBucket(LeakyBucket {
                capacity: 2,
                interval: 3 * S,
            }),
            6 * S,
        ),
    ];
    for (algorithm, rest) in algorithms {
        let table = Table::with_max_keys(false, bound(1));
        // Half its quota used, so never evicted while live: one request of
        // two, or for the leaky bucket (whose quota is its queue) one waiting.
        let used = "l:ip:203.0.113.9";
        let [newcomer]: [String; 1] = neighbours(&table, used, 1).try_into().unwrap();
        hit(&table, used, &algorithm, T0);
        if let Algorithm::LeakyBucket(_) = algorithm {
            hit(&table, used, &algorithm, T0);
        }
        // A full shard sweeps at most once per SWEEP_GAP.
        let before = hit(&table, &newcomer, &algorithm, T0 + rest - SWEEP_GAP);
        assert!(before.overflowed, "{}: not at rest yet", algorithm.name());
        let after = hit(&table, &newcomer, &algorithm, T0 + rest);
        assert!(!after.overflowed, "{}: at rest", algorithm.name());
        assert!(!table.holds(used), "{}", algorithm.name());
    }
}

#[test]
fn a_key_with_a_request_in_flight_is_kept_until_it_is_released() {
    let table = Table::with_max_keys(false, bound(1));
    let one = Algorithm::Concurrency(Concurrency { max_in_flight: 1 });
    let busy = "l:ip:203.0.113.9";
    let [newcomer]: [String; 1] = neighbours(&table, busy, 1).try_into().unwrap();
    hit(&table, busy, &one, T0);
    let out = hit(&table, &newcomer, &one, T0 + 3600 * S);
    assert!(out.overflowed, "in flight for an hour is still in flight");
    table.release("l:*overflow", &one, T0, T0 + 3600 * S);
    table.release(busy, &one, T0, T0 + 3601 * S);
    let out = hit(&table, &newcomer, &one, T0 + 3602 * S);
    assert!(!out.overflowed, "released: nothing in flight, at rest");
}

#[test]
fn a_flood_of_one_request_clients_never_grows_the_table_past_its_bound() {
    let max = bound(2);
    let table = Table::with_max_keys(true, max);
    let strict = fixed(5);
    for _ in 0..6 {
        hit(&table, "l:ip:203.0.113.9", &strict, T0);
    }
    for i in 0..20_000u32 {
        let key = format!("l:ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
        hit(&table, &key, &strict, T0 + u64::from(i) * 1_000_000);
        assert!(table.len() <= max);
    }
    assert!(hit(&table, "l:ip:203.0.113.9", &strict, T0 + 30 * S)
        .ruling
        .is_deny());
    // At 1 of 5 each, the flood's keys are the lightest: it evicts itself.
    assert!(table.counters().evicted_live.load(Ordering::Relaxed) > 19_000);
    assert_eq!(table.counters().overflowed.load(Ordering::Relaxed), 0);
    // A window later the flood is at rest: new keys evict it, one for one.
    for i in 0..1_000u32 {
        let key = format!("l:ip:172.16.{}.{}", i >> 8, i & 255);
        hit(&table, &key, &strict, T0 + 61 * S + u64::from(i));
    }
    assert!(table.len() <= max);
    assert!(evicted(&table) > 0);
    let deleted = table
        .take_changes()
        .into_iter()
        .filter(|c| c.state.is_none())
        .count();
    assert_eq!(
        deleted as u64,
        evicted(&table),
        "every eviction is persisted"
    );
}

#[test]
fn two_limiters_of_one_request_in_one_full_shard_stay_atomic() {
    // One slot per shard: the second new key of a request must not push
    // out the first one, placed a moment before for the same request.
    let table = Table::with_max_keys(false, bound(1));
    let strict = fixed(1);
    let a = "l:ip:203.0.113.9";
    let [b]: [String; 1] = neighbours(&table, a, 1).try_into().unwrap();
    let checks = [
        Check {
            key: a,
            overflow: "l:*overflow",
            algorithm: &strict,
            shadow: false,
        },
        Check {
            key: &b,
            overflow: "m:*overflow",
            algorithm: &strict,
            shadow: false,
        },
    ];
    let out = table.check(&checks, T0);
    assert!(!out[0].overflowed && out[1].overflowed);
    let len = table.len();
    let again = table.check(&checks, T0);
    assert!(again[0].ruling.is_deny());
    assert!(
        !again[1].overflowed && table.len() == len,
        "refused by a: b is counted nowhere"
    );
    assert!(table.len() <= bound(1));
}

/// Fills the shard of `key` (one of `per_shard` slots each) with `key` and
/// its neighbours, hit `uses[i]` times each at `T0` on `fixed(10)`.
fn fill(table: &Table, key: &str, uses: &[u32]) -> Vec<String> {
    let mut keys = vec![key.to_string()];
    keys.extend(neighbours(table, key, uses.len() - 1));
    for (k, &n) in keys.iter().zip(uses) {
        for _ in 0..n {
            hit(table, k, &fixed(10), T0);
        }
    }
    keys
}

fn evicted_live(table: &Table) -> u64 {
    table.counters().evicted_live.load(Ordering::Relaxed)
}

#[test]
fn a_full_shard_with_nothing_at_rest_evicts_its_lightest_live_key_first() {
    let table = Table::with_max_keys(false, bound(3));
    let keys = fill(&table, "l:ip:203.0.113.9", &[3, 1, 4]);
    let [newcomer, second]: [String; 2] = neighbours(&table, &keys[2], 5)[3..]
        .to_vec()
        .try_into()
        .unwrap();
    let out = hit(&table, &newcomer, &fixed(10), T0 + S);
    assert!(!out.overflowed, "a live key made room");
    assert_eq!(evicted_live(&table), 1);
    assert!(!table.holds(&keys[1]), "the one at 1 of 10 went first");
    assert!(table.holds(&keys[0]) && table.holds(&keys[2]));

    // Now the newcomer (1 of 10) is the lightest.
    hit(&table, &second, &fixed(10), T0 + S);
    assert!(!table.holds(&newcomer));
    assert!(table.holds(&keys[0]) && table.holds(&keys[2]));
    assert_eq!(
        table.peek(&keys[2], &fixed(10), T0 + S).remaining,
        6,
        "the heavier keys kept their counts"
    );
}

#[test]
fn a_key_at_half_its_quota_or_limited_is_never_evicted_while_live() {
    let table = Table::with_max_keys(false, bound(2));
    let keys = fill(&table, "l:ip:203.0.113.9", &[5, 11]);
    let [newcomer]: [String; 1] = neighbours(&table, &keys[1], 3)[2..]
        .to_vec()
        .try_into()
        .unwrap();
    let out = hit(&table, &newcomer, &fixed(10), T0 + S);
    assert!(
        out.overflowed,
        "nothing under half: the overflow key counts it"
    );
    assert_eq!(evicted_live(&table), 0);
    assert!(table.holds(&keys[0]) && table.holds(&keys[1]));
    assert!(hit(&table, &keys[1], &fixed(10), T0 + S).ruling.is_deny());
}

#[test]
fn a_key_is_light_exactly_while_less_than_half_its_quota_is_used() {
    let quota = |limit, remaining| Quota {
        limit,
        window: None,
        remaining,
        reset_after: 0,
    };
    let light = |q: Quota| shard::weight(&q) < shard::EVICTABLE_BELOW;
    assert!(light(quota(10, 10)) && light(quota(10, 6)));
    assert!(!light(quota(10, 5)), "half used");
    assert!(light(quota(5, 3)) && !light(quota(5, 2)));
    assert!(light(quota(u64::MAX, u64::MAX / 2 + 1)));
    assert!(!light(quota(u64::MAX, u64::MAX / 2)));
    assert!(!light(quota(1, 0)) && !light(quota(3, 0)), "limited");
    assert!(
        shard::weight(&quota(10, 9)) < shard::weight(&quota(10, 7)),
        "lighter first"
    );
}

/// At a million keys every byte of an entry is a megabyte: a state that
/// grows (a token bucket's refund bookkeeping did once) must be boxed.
#[test]
fn a_table_entry_stays_40_bytes() {
    assert_eq!(std::mem::size_of::<super::shard::ShardEntry>(), 40);
}
