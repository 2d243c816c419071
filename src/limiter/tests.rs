//! The enums' forwarding: names, quotas without one request, shape fingerprints.

use super::*;

#[test]
fn a_quota_without_one_request_matches_the_state_without_it() {
    let bucket = Algorithm::TokenBucket(token_bucket::TokenBucket {
        capacity: 5,
        interval: NANOS_PER_SEC,
        refunds: false,
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

/// Records which reader each parameter was read with, answering the least value.
#[derive(Default)]
struct Reads(Vec<(&'static str, Unit)>);

impl Given for Reads {
    fn number(&mut self, name: &'static str, least: u64) -> u64 {
        self.0.push((name, Unit::Count));
        least.max(1)
    }
    fn span(&mut self, name: &'static str) -> Nanos {
        self.0.push((name, Unit::Span));
        NANOS_PER_SEC
    }
    fn rate(&mut self, name: &'static str, _units: u64, _within: &str) -> Nanos {
        self.0.push((name, Unit::PerSecond));
        NANOS_PER_SEC
    }
    fn refuse(&mut self, _name: &'static str, _why: String) {}
}

#[test]
fn each_algorithm_reads_exactly_the_parameters_it_declares_in_their_declared_unit() {
    for kind in Kind::ALL {
        let mut reads = Reads::default();
        kind.build(&mut reads);
        let mut read = reads.0;
        let mut declared = kind.params().to_vec();
        read.sort_by_key(|(name, _)| *name);
        declared.sort_by_key(|(name, _)| *name);
        assert_eq!(read, declared, "{}", kind.name());
    }
}

#[test]
fn a_parameter_name_means_one_unit_in_every_algorithm_that_takes_it() {
    // The raw config reads a parameter before it knows the algorithm.
    for kind in Kind::ALL {
        for &(name, unit) in kind.params() {
            assert_eq!(
                Kind::param(name),
                Some((name, unit)),
                "{} in {}",
                name,
                kind.name()
            );
        }
    }
    assert_eq!(Kind::param("limt"), None);
}
