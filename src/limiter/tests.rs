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
    for kind in AlgorithmKind::ALL {
        assert_eq!(AlgorithmKind::from_name(kind.name()), Some(kind));
    }
    assert_eq!(AlgorithmKind::from_name("gcra"), None);
    // Every name once, in the order of the list, the last after "or".
    let names = AlgorithmKind::ALL.map(AlgorithmKind::name);
    let (last, rest) = names.split_last().expect("algorithms");
    assert_eq!(
        AlgorithmKind::choices(),
        format!("{} or {last}", rest.join(", "))
    );
    assert!(AlgorithmKind::choices().starts_with("fixed_window, sliding_window, "));
}

#[test]
fn shape_fingerprints_are_stable_and_tell_shapes_apart() {
    let shape = |kind, span| Shape { kind, span };
    let a = shape(AlgorithmKind::FixedWindow, 60 * NANOS_PER_SEC);
    assert_eq!(a.fingerprint(), a.fingerprint());
    assert_ne!(
        a.fingerprint(),
        shape(AlgorithmKind::FixedWindow, 120 * NANOS_PER_SEC).fingerprint()
    );
    assert_ne!(
        a.fingerprint(),
        shape(AlgorithmKind::SlidingWindow, 60 * NANOS_PER_SEC).fingerprint()
    );
    let slots = shape(AlgorithmKind::Concurrency, 0);
    assert_ne!(slots.fingerprint(), 0, "0 means unknown");
    // Stored in SQLite files: the digest must not change between builds
    // (FNV-1a of the tag byte and the little-endian parameter).
    assert_eq!(a.fingerprint(), 0x8e4e_208e);
    assert_eq!(slots.fingerprint(), 0x2279_bd40);
}

#[test]
fn no_two_algorithms_share_a_shape_tag_or_a_script_tag() {
    let tags = |tag: fn(AlgorithmKind) -> String| {
        let mut all: Vec<String> = AlgorithmKind::ALL.into_iter().map(tag).collect();
        all.sort();
        all.dedup();
        all.len()
    };
    let shape_tag = |k: AlgorithmKind| on_kind!(k, P => P::SHAPE_TAG).to_string();
    assert_eq!(tags(shape_tag), AlgorithmKind::ALL.len());
    assert_eq!(
        tags(|k| k.script_tag().to_string()),
        AlgorithmKind::ALL.len()
    );
}

/// Records which reader each parameter was read with, answering the least value.
#[derive(Default)]
pub(crate) struct Reads(Vec<(&'static str, Measure)>);

impl Given for Reads {
    fn number(&mut self, name: &'static str, least: u64) -> u64 {
        self.0.push((name, Measure::Count));
        least.max(1)
    }
    fn span(&mut self, name: &'static str) -> Nanos {
        self.0.push((name, Measure::Span));
        NANOS_PER_SEC
    }
    fn rate(&mut self, name: &'static str, _units: u64, _within: &str) -> Nanos {
        self.0.push((name, Measure::PerSecond));
        NANOS_PER_SEC
    }
    fn refuse(&mut self, _name: &'static str, _why: String) {}
}

#[test]
fn each_algorithm_reads_exactly_the_parameters_it_declares_in_their_declared_unit() {
    for kind in AlgorithmKind::ALL {
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
    for kind in AlgorithmKind::ALL {
        for &(name, unit) in kind.params() {
            assert_eq!(
                AlgorithmKind::param(name),
                Some((name, unit)),
                "{} in {}",
                name,
                kind.name()
            );
        }
    }
    assert_eq!(AlgorithmKind::param("limt"), None);
}
