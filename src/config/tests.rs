//! Config tests through `parse`: located messages, defaults, and the files a config names (certificates, CA bundles, API key files).

use std::path::Path;
use std::time::Duration;

use super::*;

const EXAMPLE: &str = include_str!("../../config.example.yaml");

/// Typical mistakes and the exact message `check` prints for each: the
/// expected YAML in words (never a Rust type), the key that is wrong with
/// its line and column, and a did-you-mean for a misspelt name.
#[rustfmt::skip]
const MISTAKES: &[(&str, &str)] = &[
    // A rate written where a number goes.
    ("limiters:\n  per_ip:\n    limit: \"100/min\"\n    window: 60s\n",
     "line 3 column 12: limiters.per_ip.limit: expected a whole number, e.g. `limit: 100`, found the text \"100/min\""),
    // A limiter's settings dedented one level.
    ("limiters:\n  per_ip:\n  limit: 5\n  window: 60s\n",
     "line 3 column 10: limiters.limit: expected a limiter: a mapping of its settings, e.g. `{ limit: 100, window: 1m, key: ip }`, found the number 5 (`limit` is read as the name of a limiter here; if it is a setting, indent it under its limiter)"),
    // A key written as a mapping.
    ("limiters:\n  per_ip:\n    limit: 5\n    window: 60s\n    key: { header: X-User }\n",
     "line 5 column 5: limiters.per_ip.key: expected one value or a list of values, e.g. `ip` or `[ip, route]`, found a mapping"),
    // A number no integer holds.
    ("limiters:\n  per_ip:\n    limit: 100000000000000000000\n    window: 60s\n",
     "line 3 column 12: limiters.per_ip.limit: expected a whole number, e.g. `limit: 100`, found the number 100000000000000000000, which is too large"),
    // Misspelt names: upstream, key part, algorithm, limiter, config key.
    ("upstreams:\n  php: { url: \"fastcgi://127.0.0.1:9000\", root: /srv }\nroutes:\n  - name: site\n    upstream: phpfpm\n",
     "line 5 column 15: routes[0].upstream: no upstream named \"phpfpm\"; did you mean `php`?"),
    ("limiters:\n  a:\n    limit: 5\n    window: 60s\n    key: per_ip\n",
     "line 5 column 10: limiters.a.key: unknown key \"per_ip\" (client, ip, api_key, route, global, pass, asn, country or header:<Name>); did you mean `ip`?"),
    ("limiters:\n  a:\n    algorithm: token-bucket\n    capacity: 5\n    refill_per_second: 1\n",
     "line 3 column 16: limiters.a.algorithm: unknown algorithm \"token-bucket\" (fixed_window, sliding_window, token_bucket, leaky_bucket or concurrency); did you mean `token_bucket`?"),
    ("limiters:\n  per_ip: { limit: 5, window: 60s, key: ip }\nroutes:\n  - name: site\n    respond: { status: 200 }\n    limiters: [per-ip]\n",
     "line 6 column 16: routes[0].limiters[0]: no limiter named \"per-ip\"; did you mean `per_ip`?"),
    ("limiters:\n  a:\n    limt: 5\n    window: 60s\n",
     "line 3 column 5: limiters.a.limt: unknown key `limt`; did you mean `limit`? (keys of a fixed_window limiter: algorithm, limit, window, key, mode, overrides, reject, count, ban, lease)"),
    // The algorithm written after the misspelt key still decides which keys are offered.
    ("limiters:\n  a:\n    capacity: 5\n    refil_per_second: 1\n    algorithm: token_bucket\n",
     "line 4 column 5: limiters.a.refil_per_second: unknown key `refil_per_second`; did you mean `refill_per_second`? (keys of a token_bucket limiter: algorithm, capacity, refill_per_second, key, mode, overrides, reject, count, ban, lease)"),
    // An algorithm no one knows: every key any limiter takes is offered.
    ("limiters:\n  a:\n    algorithm: gcra\n    burst: 5\n",
     "line 4 column 5: limiters.a.burst: unknown key `burst` (keys here: algorithm, limit, window, capacity, refill_per_second, leak_per_second, max_in_flight, key, mode, overrides, reject, count, ban, lease)"),
    // A key no store takes, with every key `store:` has.
    ("store:\n  backend: redis\n  urls: \"redis://cache\"\n",
     "line 3 column 3: store.urls: unknown key `urls`; did you mean `url`? (keys here: backend, path, flush_interval, url, cluster, sentinel, prefix, timeout, on_error, prune_interval, max_keys)"),
    // A backend key's value is read where it stands, before `backend:` is known.
    ("store:\n  timeout: 50\n  backend: redis\n",
     "line 2 column 12: store.timeout: `50` has no unit, write e.g. `50s`; a duration is a whole number and one of the units ms, s, m, h, d, e.g. `60s` or `1m`"),
    // A duration without a unit, pointed at `window`, not at the limiter.
    ("limiters:\n  a:\n    limit: 5\n    window: 15\n",
     "line 4 column 13: limiters.a.window: `15` has no unit, write e.g. `15s`; a duration is a whole number and one of the units ms, s, m, h, d, e.g. `60s` or `1m`"),
    // An unset variable, pointed at its value, not at `store:`.
    ("store:\n  backend: redis\n  url: \"${TOLLGATE_TEST_SURELY_UNSET}\"\n",
     "line 3 column 8: store.url: environment variable TOLLGATE_TEST_SURELY_UNSET is not set"),
    // A single limiter name where a list goes.
    ("limiters:\n  per_ip: { limit: 5, window: 60s, key: ip }\nroutes:\n  - name: site\n    respond: { status: 200 }\n    limiters: per_ip\n",
     "line 6 column 15: routes[0].limiters: expected a list of limiter names, e.g. `limiters: [per_ip]`, found the text \"per_ip\""),
    // YAML 1.2 has no `yes`.
    ("upstreams:\n  app: { url: \"https://a\", insecure_skip_verify: yes }\n",
     "line 2 column 50: upstreams.app.insecure_skip_verify: expected `true` or `false`, e.g. `insecure_skip_verify: true`, found the text \"yes\""),
    ("server:\n  workers: [1]\n",
     "line 2 column 3: server.workers: expected `auto` or a number of threads, e.g. `workers: 4`, found a list"),
    ("routes:\n  - { name: a, respond: { status: 99999 } }\n",
     "line 2 column 35: routes[0].respond.status: expected a whole number, e.g. `status: 429`, found the number 99999, out of range (0 to 65535)"),
    ("routes:\n  a: { respond: { status: 200 } }\n",
     "line 1 column 1: routes: expected a list of routes, e.g. `routes: [{ name: api, match: { path_prefix: /api }, upstream: app }]`, found a mapping"),
    // A limiter with nothing under it is shown at its name, not at the next line.
    ("limiters:\n  strict:\nroutes: []\n",
     "line 2 column 3: limiters.strict: fixed_window needs `limit`"),
];

fn problems(yaml: &str) -> Vec<String> {
    match parse(yaml) {
        Ok(_) => vec![],
        Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
    }
}

#[test]
fn the_example_config_is_valid() {
    let c = parse(EXAMPLE).expect("example config parses");
    assert_eq!(c.routes[0].name, "ping");
    assert!(matches!(c.store.backend, BackendConfig::Sqlite(_)));
}

#[test]
fn an_empty_file_gets_the_documented_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c.server.listen, vec!["0.0.0.0:8080".parse().unwrap()]);
    assert_eq!(c.admin.listen, "127.0.0.1:9901".parse().unwrap());
    assert_eq!(c.server.max_request_body, 10 << 20);
    let BackendConfig::Sqlite(sqlite) = &c.store.backend else {
        panic!("sqlite is the default store");
    };
    assert_eq!(sqlite.flush_interval, Duration::from_millis(100));
    assert_eq!(c.identity.ipv6_prefix, 64);
}

#[test]
fn store_max_keys_has_a_default_and_a_floor() {
    assert_eq!(parse("").unwrap().store.max_keys, DEFAULT_MAX_KEYS);
    let c = parse("store: { max_keys: 5000 }").unwrap();
    assert_eq!(c.store.max_keys, 5000);
    let errs = problems("store: { max_keys: 100 }");
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("store.max_keys"), "{errs:?}");
    assert!(!problems("store: { max_keys: -1 }").is_empty());
}

#[test]
fn a_misspelt_key_is_an_error_with_its_location() {
    let errs = problems("limiters:\n  strict:\n    limt: 5\n    window: 60s\n");
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].contains("unknown key `limt`; did you mean `limit`?"),
        "{errs:?}"
    );
    assert!(errs[0].starts_with("line 3 column 5"), "{errs:?}");
}

#[test]
fn a_route_naming_a_missing_limiter_or_upstream_is_rejected_with_locations() {
    let yaml = "routes:\n  - name: a\n    match: { path: /a }\n    upstream: nowhere\n    limiters: [missing]\n";
    let errs = problems(yaml);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs.iter()
            .any(|e| e.contains("line 4") && e.contains("no upstream named \"nowhere\"")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.contains("line 5") && e.contains("no limiter named \"missing\"")),
        "{errs:?}"
    );
}

#[test]
fn every_error_is_reported_not_just_the_first() {
    let yaml = "identity:\n  trusted_proxies: [10.0.0.0/33]\nlimiters:\n  a: { algorithm: token_bucket, capacity: 0, refill_per_second: -1 }\n  b: { algorithm: fixed_window, limit: 5 }\n";
    let errs = problems(yaml);
    assert!(errs.len() >= 4, "{errs:?}");
    assert!(errs.iter().any(|e| e.contains("invalid CIDR")));
    assert!(errs
        .iter()
        .any(|e| e.contains("fixed_window needs `window`")));
}

#[test]
fn fields_that_do_not_apply_to_the_algorithm_are_errors() {
    let errs = problems("limiters:\n  a: { algorithm: token_bucket, capacity: 5, refill_per_second: 1, limit: 3 }\n");
    assert!(
        errs[0].contains("`limit` does not apply to token_bucket"),
        "{errs:?}"
    );
}

#[test]
fn env_vars_are_expanded_and_an_unset_one_is_named() {
    assert_eq!(
        expand_env("a-${X}-b", |n| (n == "X").then(|| "1".into())),
        Ok("a-1-b".into())
    );
    let err = expand_env("${TOLLGATE_SURELY_UNSET}", |_| None).unwrap_err();
    assert!(err.contains("TOLLGATE_SURELY_UNSET"));
    let errs = problems("admin:\n  token: ${TOLLGATE_TEST_SURELY_UNSET_VAR}\n");
    assert!(
        errs[0].contains("TOLLGATE_TEST_SURELY_UNSET_VAR is not set"),
        "{errs:?}"
    );
}

#[test]
fn sizes_and_durations_parse_in_operator_units() {
    assert_eq!(parse_size("10MiB"), Ok(10 << 20));
    assert_eq!(parse_size("512KiB"), Ok(512 << 10));
    assert_eq!(parse_size("1MB"), Ok(1_000_000));
    assert!(parse_size("10 parsecs").is_err());
    let c = parse("audit: { retention: 7d }\nserver: { shutdown_grace: 500ms }\n").unwrap();
    assert_eq!(c.audit.retention, Duration::from_secs(7 * 86_400));
    assert_eq!(c.server.shutdown_grace, Duration::from_millis(500));
}

#[test]
fn the_admin_api_cannot_share_the_public_port() {
    let errs =
        problems("server: { listen: \"0.0.0.0:8080\" }\nadmin: { listen: \"127.0.0.1:8080\" }\n");
    assert!(
        errs[0].contains("admin API must never be on the public port"),
        "{errs:?}"
    );
}

#[test]
fn a_yaml_syntax_error_has_a_location() {
    let errs = problems("server:\n  listen: [\"0.0.0.0:8080\"\nadmin: {}\n");
    assert_eq!(errs.len(), 1);
    assert!(errs[0].starts_with("line "), "{errs:?}");
}

/// A self-signed pair in `dir`, as (cert, key) paths.
fn tls_pair(dir: &Path, name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![format!("{name}.test")])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c.display().to_string(), k.display().to_string())
}

#[test]
fn tls_listener_options_are_checked_with_their_locations() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = tls_pair(dir.path(), "a");
    let (_, other_key) = tls_pair(dir.path(), "b");
    let table: [(String, &str); 4] = [
        (
            format!("server:\n  tls: {{ cert: {cert}, key: {key}, redirect_plain: true }}\n"),
            "server.tls.redirect_plain: needs server.tls.listen",
        ),
        (
            format!("server:\n  listen: [\"127.0.0.1:8080\"]\n  tls: {{ cert: {cert}, key: {key}, listen: [\"127.0.0.1:8080\"] }}\n"),
            "server.tls.listen[0]: 127.0.0.1:8080 is also in server.listen",
        ),
        (
            format!("server:\n  tls: {{ cert: {cert}, key: {other_key} }}\n"),
            "server.tls.key: ",
        ),
        (
            format!("server:\n  tls:\n    certs:\n      - {{ cert: {cert}, key: {key} }}\n      - {{ cert: {cert}, key: /nonexistent.key }}\n"),
            "server.tls.certs[1].key: cannot read /nonexistent.key",
        ),
    ];
    for (yaml, expected) in table {
        let errs = problems(&yaml);
        assert!(
            errs.iter().any(|e| e.contains(expected)),
            "{expected:?} not in {errs:?}"
        );
    }
    let errs = problems(&format!(
        "server:\n  tls: {{ cert: {cert}, key: {other_key} }}\n"
    ));
    assert!(
        errs[0].contains("does not match the certificate"),
        "{errs:?}"
    );
}

#[test]
fn tls_listen_keeps_server_listen_plain_and_redirect_targets_the_first_tls_port() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = tls_pair(dir.path(), "a");
    let c = parse(&format!(
        "server:\n  listen: [\"127.0.0.1:8080\"]\n  tls: {{ cert: {cert}, key: {key} }}\n"
    ))
    .unwrap();
    assert_eq!(
        c.server.public(),
        vec![("127.0.0.1:8080".parse().unwrap(), Serve::Https)]
    );
    let c = parse(&format!("server:\n  listen: [\"127.0.0.1:8080\"]\n  tls: {{ cert: {cert}, key: {key}, listen: [\"127.0.0.1:8443\"], redirect_plain: true }}\n")).unwrap();
    assert_eq!(
        c.server.public(),
        vec![
            (
                "127.0.0.1:8080".parse().unwrap(),
                Serve::RedirectToHttps { port: 8443 }
            ),
            ("127.0.0.1:8443".parse().unwrap(), Serve::Https),
        ]
    );
}

#[test]
fn a_route_that_only_limits_client_chosen_values_is_a_warning_naming_it() {
    let yaml = "limiters:\n  per_key: { limit: 5, window: 60s, key: api_key }\n  per_tenant: { limit: 5, window: 60s, key: [\"header:X-Tenant\", ip] }\n  per_ip: { limit: 5, window: 60s, key: ip }\nroutes:\n  - name: open\n    match: { path: /a }\n    respond: { status: 200 }\n    limiters: [per_key, per_tenant]\n  - name: held\n    match: { path: /b }\n    respond: { status: 200 }\n    limiters: [per_key, per_ip]\n";
    let c = parse(yaml).unwrap();
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    let w = c.warnings[0].to_string();
    assert!(w.starts_with("line 9 column"), "{w}");
    assert!(
        w.contains("\"open\"") && w.contains("per_key, per_tenant") && w.contains("keyed on `ip`"),
        "{w}"
    );
    // With keys verified, `api_key` holds; the header-keyed one still does not on its own.
    let verified = parse(&format!("identity: {{ api_keys: [k1] }}\n{yaml}")).unwrap();
    assert!(verified.warnings.is_empty(), "{:?}", verified.warnings);
    let unverified_override = parse("limiters:\n  l: { limit: 1, window: 1s, overrides: [{ key: vip, limit: 9 }, { key: 10.0.0.1, limit: 9 }] }\nroutes: [{ name: a, respond: { status: 200 }, limiters: [l] }]\n").unwrap();
    assert_eq!(
        unverified_override.warnings.len(),
        1,
        "{:?}",
        unverified_override.warnings
    );
    assert!(unverified_override.warnings[0]
        .path
        .ends_with("overrides[0].key"));
}

#[test]
fn api_keys_are_read_from_a_file_and_a_bad_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "# partners\nk1\n\nsha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n").unwrap();
    let yaml = format!(
        "identity:\n  api_keys: [k0]\n  api_keys_file: {}\n",
        file.display()
    );
    let c = parse(&yaml).unwrap();
    assert_eq!(c.identity.api_keys.len(), 3);
    assert_eq!(
        c.identity.api_keys[2],
        ApiKeyEntry::parse(
            "sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
        )
        .unwrap()
    );
    std::fs::write(&file, "k1\nsha256:nothex\n").unwrap();
    let errs = problems(&yaml);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].contains("line 2: `sha256:` must be followed by the 64 hex digits"),
        "{errs:?}"
    );
    assert!(
        errs[0].starts_with("line 3 column"),
        "located at identity.api_keys_file: {errs:?}"
    );
    let missing = problems("identity: { api_keys_file: /nonexistent/tollgate-keys }\n");
    assert!(
        missing[0].contains("cannot read /nonexistent/tollgate-keys"),
        "{missing:?}"
    );
    assert!(
        problems("identity: { api_keys: [\"sha256:12\"] }\n")[0].contains("identity.api_keys[0]")
    );
}

#[test]
fn upstream_tls_options_apply_to_https_only_and_a_ca_must_hold_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = tls_pair(dir.path(), "ca");
    let table: [(String, &str); 4] = [
        (format!("upstreams:\n  app: {{ url: \"http://a\", ca: {cert} }}\n"), "upstreams.app.ca: applies to https:// upstreams only"),
        ("upstreams:\n  app: { url: \"http://a\", insecure_skip_verify: true }\n".to_string(), "upstreams.app.insecure_skip_verify: applies to https://"),
        (format!("upstreams:\n  app: {{ url: \"https://a\", ca: {key} }}\n"), "no PEM certificate in it"),
        (format!("upstreams:\n  app: {{ url: \"https://a\", ca: {cert}, insecure_skip_verify: true }}\n"), "contradict"),
    ];
    for (yaml, expected) in table {
        let errs = problems(&yaml);
        assert!(
            errs.iter().any(|e| e.contains(expected)),
            "{expected:?} not in {errs:?}"
        );
    }
    let c = parse(&format!(
        "upstreams:\n  app: {{ url: \"https://a\", ca: {cert} }}\n"
    ))
    .unwrap();
    assert!(matches!(&c.upstreams[0].tls, UpstreamTls::Ca { certs, .. } if certs.len() == 1));
}

#[test]
fn typical_mistakes_get_their_exact_message_at_the_key_that_is_wrong() {
    for &(yaml, expected) in MISTAKES {
        let got = problems(yaml);
        assert_eq!(
            got.first().map(String::as_str),
            Some(expected),
            "{yaml}: {got:?}"
        );
    }
}

#[test]
fn durations_take_exactly_ms_s_m_h_and_d() {
    let window = |w: &str| parse(&format!("limiters:\n  a: {{ limit: 5, window: {w} }}\n"));
    for (written, nanos) in [
        ("500ms", 500_000_000u64),
        ("2s", 2_000_000_000),
        ("1m", 60_000_000_000),
        ("1h", 3_600_000_000_000),
        ("7d", 604_800_000_000_000),
        ("36500d", 3_153_600_000_000_000_000),
    ] {
        let c = window(written).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert_eq!(
            c.limiters[0].algorithm.shape(),
            crate::limiter::Shape {
                kind: crate::limiter::AlgorithmKind::FixedWindow,
                span: nanos
            },
            "{written}"
        );
    }
    for (written, why) in [
        (
            "1M",
            "`M` is not a unit (minutes are `m`, and a month is written `30d`)",
        ),
        ("1y", "`y` is not a unit"),
        ("1000y", "`y` is not a unit"),
        ("\"1 minute\"", "no space between the number and the unit"),
        ("1.5m", "whole numbers only"),
        ("m", "it starts with no number"),
        ("1us", "`us` is not a unit"),
        (
            "36501d",
            "longer than the longest duration tollgate supports, 36500d (100 years)",
        ),
        (
            "99999999999999999999999d",
            "longer than the longest duration",
        ),
    ] {
        let errors = window(written).expect_err(written).to_string();
        assert!(
            errors.contains("limiters.a.window: ") && errors.contains(why),
            "{written}: {errors}"
        );
    }
}

#[test]
fn a_name_with_a_newline_never_reaches_a_line_of_output() {
    let errors = parse("upstreams:\n  \"app\\nforged\": { url: \"http://127.0.0.1:1\" }\nroutes:\n  - name: \"ok\\n127.0.0.1 - GET /admin 200\"\n    respond: { status: 200 }\n")
        .expect_err("names outside [A-Za-z0-9_-] are refused")
        .to_string();
    assert_eq!(
        errors.lines().count(),
        3,
        "a header and one line per problem: {errors}"
    );
    assert!(
        errors.contains("upstreams.app\\nforged: an upstream name uses only letters"),
        "{errors}"
    );
    assert!(
        errors.contains(
            "routes[0].name: route name \"ok\\n127.0.0.1 - GET /admin 200\" may use only letters"
        ),
        "{errors}"
    );
}

#[test]
fn a_missing_fastcgi_root_and_index_are_warnings_at_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display();
    let yaml = |root: &str| {
        format!("upstreams:\n  php:\n    url: \"fastcgi://127.0.0.1:9000\"\n    root: {root}\n")
    };
    let missing = parse(&yaml(&format!("{root}/no-such-dir"))).unwrap();
    assert_eq!(missing.warnings.len(), 1, "{:?}", missing.warnings);
    let w = missing.warnings[0].to_string();
    assert!(
        w.starts_with("line 4 column 11: upstreams.php.root: "),
        "{w}"
    );
    assert!(
        w.contains("No such file or directory")
            && w.contains("every request to this upstream would be a 404"),
        "{w}"
    );
    let no_index = parse(&yaml(&root.to_string())).unwrap();
    assert_eq!(no_index.warnings.len(), 1, "{:?}", no_index.warnings);
    assert_eq!(no_index.warnings[0].path, "upstreams.php.index");
    std::fs::write(dir.path().join("index.php"), "<?php").unwrap();
    assert!(parse(&yaml(&root.to_string())).unwrap().warnings.is_empty());
}

#[test]
fn a_route_says_what_unverified_crawlers_get_and_a_typo_is_located() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("pass.keys");
    std::fs::write(&keys, format!("{}\n", "k".repeat(40))).unwrap();
    let yaml = |value: &str| {
        format!(
            "identity: {{ pass: {{ secret_file: \"{}\" }} }}\nroutes:\n  - {{ name: wiki, match: {{ path_prefix: / }}, respond: {{ status: 200 }}, challenge: {{ unverified_crawlers: {value} }} }}\n",
            keys.display()
        )
    };
    let c = parse(&yaml("refuse")).unwrap();
    let challenge = c.routes[0].challenge.unwrap();
    assert_eq!(challenge.unverified_crawlers, UnverifiedCrawlers::Refuse);
    assert_eq!(challenge.when, ChallengeWhen::OverLimit);
    let c = parse(&yaml("challenge")).unwrap();
    assert_eq!(
        c.routes[0].challenge.unwrap().unverified_crawlers,
        UnverifiedCrawlers::Challenge
    );
    let p = problems(&yaml("block"));
    assert!(
        p.iter()
            .any(|m| m.contains("routes[0].challenge.unverified_crawlers") && m.contains("refuse")),
        "{p:?}"
    );
}

#[test]
fn a_route_behind_basic_auth_cannot_cache_nor_can_one_that_answers_itself() {
    let yaml = r#"
upstreams: { app: { url: "http://127.0.0.1:9" } }
routes:
  - name: staff
    match: { path_prefix: /staff }
    upstream: app
    auth: { basic: { realm: Staff, users_file: /nonexistent/htpasswd } }
    cache: { ttl: 10s }
  - { name: ping, match: { path: /ping }, respond: { status: 200, body: pong }, cache: { ttl: 10s } }
  - { name: page, match: { path_prefix: / }, upstream: app, cache: { ttl: 10s } }
"#;
    let p = problems(yaml);
    let at = |path: &str, word: &str| p.iter().any(|m| m.contains(path) && m.contains(word));
    assert!(at("routes[0].cache", "auth"), "{p:?}");
    assert!(at("routes[1].cache", "respond"), "{p:?}");
    assert!(!p.iter().any(|m| m.contains("routes[2]")), "{p:?}");
}

#[test]
fn a_metarefresh_route_asks_no_difficulty_and_public_files_are_exempt_unless_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("pass.keys");
    std::fs::write(&keys, format!("{}\n", "k".repeat(40))).unwrap();
    let yaml = |value: &str| {
        format!(
            "identity: {{ pass: {{ secret_file: \"{}\" }} }}\nroutes:\n  - {{ name: wiki, match: {{ path_prefix: / }}, respond: {{ status: 200 }}, challenge: {value} }}\n",
            keys.display()
        )
    };
    let c = parse(&yaml("{ mode: metarefresh }")).unwrap();
    let challenge = c.routes[0].challenge.unwrap();
    assert_eq!(challenge.mode, ChallengeMode::MetaRefresh);
    assert_eq!(challenge.difficulty, 0, "any pass opens it");
    assert!(challenge.exempt_public);
    let c = parse(&yaml("{ exempt_public: false }")).unwrap();
    let challenge = c.routes[0].challenge.unwrap();
    assert_eq!(challenge.mode, ChallengeMode::ProofOfWork);
    assert!(!challenge.exempt_public);
    let p = problems(&yaml("{ mode: metarefresh, difficulty: 8 }"));
    assert!(
        p.iter()
            .any(|m| m.contains("routes[0].challenge.difficulty")),
        "{p:?}"
    );
    let p = problems(&yaml("{ mode: cookie }"));
    assert!(
        p.iter()
            .any(|m| m.contains("routes[0].challenge.mode") && m.contains("metarefresh")),
        "{p:?}"
    );
}
