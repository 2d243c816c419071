//! The enums' forwarding: names, quotas without one request, shape fingerprints.

use super::*;

#[test]
fn a_quota_without_one_request_matches_the_state_without_it() {
    let bucket = Algorithm::TokenBucket(token_bucket::TokenBucket {
        capacity: 5,
        interval: NANOS_PER_SEC,
    });
    let window = Algorithm::FixedWindow(fixed_window::FixedWindow {
        limit: 5,
        window: 60 * NANOS_PER_SEC,
    });
    let now = 6_000 * NANOS_PER_SEC;
    for a in [bucket, window] {
        let (mut with, mut without) = (a.fresh_state(), a.fresh_state());
        for _ in 0..2 {
            a.record(&mut with, now, true);
            a.record(&mut without, now, true);
        }
        a.record(&mut with, now, true);
        assert_eq!(
            a.quota_without_one(a.quota(&with, now)).remaining,
            a.quota(&without, now).remaining,
            "{}",
            a.name()
        );
    }
}

#[test]
fn every_algorithm_name_reads_back_as_its_kind() {
    for kind in Kind::ALL {
        assert_eq!(Kind::from_name(kind.name()), Some(kind));
    }
    assert_eq!(Kind::from_name("gcra"), None);
    assert_eq!(
        Kind::choices(),
        "fixed_window, sliding_window, token_bucket, leaky_bucket or concurrency"
    );
}

#[test]
fn shape_fingerprints_are_stable_and_tell_shapes_apart() {
    let a = Shape::FixedWindow {
        window: 60 * NANOS_PER_SEC,
    };
    assert_eq!(a.fingerprint(), a.fingerprint());
    assert_ne!(
        a.fingerprint(),
        Shape::FixedWindow {
            window: 120 * NANOS_PER_SEC
        }
        .fingerprint()
    );
    assert_ne!(
        a.fingerprint(),
        Shape::SlidingWindow {
            window: 60 * NANOS_PER_SEC
        }
        .fingerprint()
    );
    assert_ne!(Shape::Concurrency.fingerprint(), 0, "0 means unknown");
    // Stored in SQLite files: the digest must not change between builds
    // (FNV-1a of the tag byte and the little-endian parameter).
    assert_eq!(a.fingerprint(), 0x8e4e_208e);
    assert_eq!(Shape::Concurrency.fingerprint(), 0x2279_bd40);
}
