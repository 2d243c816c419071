//! Property tests on what a client or an operator controls: the path normalizer, the forwarding-header parsers, the config loader.
//!
//! Cases per property: proptest's default (256), or `PROPTEST_CASES`. The
//! soak: `PROPTEST_CASES=200000 cargo test --release --test properties`.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use tollgate::config::IdentityConfig;
use tollgate::identity::Identity;
use tollgate::router::normalize;

/// Path pieces a client would use to spell one path many ways.
fn path_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "",
        ".",
        "..",
        "%2e",
        "%2E%2e",
        "%2F",
        "%2f",
        "%6C",
        "%6c%6F",
        "login",
        "wp-login.php",
        "a%",
        "%zz",
        "%",
        "%%",
        "%25",
        "%252e",
        "%00",
        "é",
        "%C3%A9",
        ";x=1",
        "a b",
        "~",
        "-_.",
    ])
}

fn identity(trusted: &[&str]) -> Identity {
    Identity::new(
        &IdentityConfig {
            api_key_header: HeaderName::from_static("x-client-key"),
            api_keys: Vec::new(),
            api_keys_file: None,
            unknown_key_limit: 10,
            unknown_key_window: std::time::Duration::from_secs(60),
            trusted_proxies: trusted.iter().map(|n| n.parse().unwrap()).collect(),
            ipv6_prefix: 64,
            exempt: Vec::new(),
            pass: None,
            geoip: None,
            crowdsec: None,
        },
        None,
        &tollgate::metrics::Metrics::default(),
    )
}

/// Forwarding-header elements, valid and near-valid.
fn hop() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "203.0.113.9",
            "127.0.0.1",
            "10.0.0.1",
            "::1",
            "[::1]",
            "[::1]:80",
            "2001:db8::1",
            "\"[2001:db8::1]:4711\"",
            "unknown",
            "_hidden",
            "",
            " ",
            "for=",
            "for=1.2.3.4",
            "for=\"1.2.3.4\"",
            "by=1.2.3.4;for=5.6.7.8",
            "1.2.3.4:99999",
            "1.2.3",
            "256.1.1.1",
            "for=[::1",
            ";;",
            "\"",
            "::ffff:127.0.0.1",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,24}",
    ]
}

proptest! {
    #[test]
    fn normalizing_any_string_never_panics_and_is_idempotent(path in "\\PC{0,64}") {
        let once = normalize(&path).into_owned();
        prop_assert!(once.starts_with('/'), "{once:?}");
        prop_assert_eq!(normalize(&once).into_owned(), once);
    }

    #[test]
    fn normalizing_spellings_of_a_path_is_idempotent(pieces in prop::collection::vec(path_piece(), 0..12), lead in "/{0,3}") {
        let path = format!("{lead}{}", pieces.join("/"));
        let once = normalize(&path).into_owned();
        prop_assert!(once.starts_with('/'), "{once:?}");
        prop_assert!(!once.contains("//"), "{once:?}");
        prop_assert!(once.split('/').all(|s| s != "." && s != ".."), "{once:?}");
        prop_assert_eq!(normalize(&once).into_owned(), once);
    }

    #[test]
    fn forwarding_headers_never_panic_and_an_untrusted_peer_is_always_itself(
        xff in prop::collection::vec(prop::collection::vec(hop(), 0..5), 0..3),
        forwarded in prop::collection::vec(prop::collection::vec(hop(), 0..4), 0..2),
        trusted_peer in any::<bool>(),
    ) {
        let mut headers = HeaderMap::new();
        for list in &xff {
            if let Ok(v) = HeaderValue::from_str(&list.join(", ")) {
                headers.append("x-forwarded-for", v);
            }
        }
        for list in &forwarded {
            if let Ok(v) = HeaderValue::from_str(&list.join(",")) {
                headers.append("forwarded", v);
            }
        }
        let peer: SocketAddr = if trusted_peer { "127.0.0.1:5000" } else { "198.51.100.7:5000" }.parse().unwrap();
        let client = identity(&["127.0.0.0/8", "10.0.0.0/8"]).resolve(peer, &headers, 0).unwrap();
        if !trusted_peer {
            prop_assert_eq!(client.ip, peer.ip());
        }
        // Whatever the headers say, the client is an address someone named:
        // the peer, or one written in a header.
        let named = |ip: IpAddr| {
            let text = format!("{xff:?}{forwarded:?}");
            text.contains(&ip.to_string()) || ip == peer.ip()
        };
        prop_assert!(named(client.ip), "{} from {xff:?} {forwarded:?}", client.ip);
    }

    #[test]
    fn the_query_matcher_never_panics_and_finds_a_pair_in_any_company(
        before in "[a-z0-9=&%+.\\[\\] ]{0,40}",
        after in "[a-z0-9=&%+.\\[\\] ]{0,40}",
        noise in "\\PC{0,64}",
    ) {
        let _ = tollgate::router::query_has(&noise, "action", "login");
        // `action=login` as its own pair is found whatever surrounds it.
        let q = format!("{before}&action=login&{after}");
        prop_assert!(tollgate::router::query_has(&q, "action", "login"), "{}", q);
    }

    #[test]
    fn any_text_given_as_config_is_an_answer_never_a_panic(text in "\\PC{0,256}") {
        let _ = tollgate::config::parse(&text);
    }

    #[test]
    fn the_example_config_with_bytes_cut_or_inserted_is_an_answer_never_a_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), prop::option::of("[\\[\\]{}:,\\-\" \n#&*!|>a-z0-9]{1,3}")), 1..6),
    ) {
        let mut text = include_str!("../config.example.yaml").to_string();
        for (at, insert) in edits {
            let mut i = at.index(text.len().max(1));
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            match insert {
                Some(s) => text.insert_str(i, &s),
                None => {
                    let mut end = (i + 1).min(text.len());
                    while !text.is_char_boundary(end) {
                        end += 1;
                    }
                    text.replace_range(i..end, "");
                }
            }
        }
        if let Err(e) = tollgate::config::parse(&text) {
            prop_assert!(!e.problems.is_empty());
        }
    }

    #[test]
    fn nesting_of_any_depth_is_answered(depth in 0usize..20_000, map in any::<bool>()) {
        let (open, close) = if map { ("{a: ", "}") } else { ("[", "]") };
        let text = format!("routes: {}{}", open.repeat(depth), close.repeat(depth));
        let _ = tollgate::config::parse(&text);
    }
}
