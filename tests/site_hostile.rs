//! Hostile site configs: catastrophic regexes, huge capture references, a redirect loop, rewrite chains; each refused by `check`, warned about, or answered in bounded work.

mod common;

use common::app::{app, from, get};

const CLIENT: &str = "203.0.113.9:40000";

#[tokio::test(start_paused = true)]
async fn a_catastrophic_regex_is_matched_in_linear_time_against_a_long_path() {
    // Exponential for a backtracking engine; linear here (no backtracking).
    let app = app(r#"
routes:
  - { name: evil, match: { path_regex: '^/(a+)+$' }, respond: { status: 200, body: matched } }
  - { name: evil2, match: { path_regex: '^/(x+x+)+y$' }, respond: { status: 200, body: y } }
  - { name: rest, match: { path_prefix: / }, respond: { status: 404 } }
"#);
    let path = format!("/{}!", "a".repeat(16 * 1024));
    let r = app.handle(get(&path, &[]), from(CLIENT)).await;
    assert_eq!(r.status(), 404);
    let path = format!("/{}", "x".repeat(16 * 1024));
    assert_eq!(
        app.handle(get(&path, &[]), from(CLIENT)).await.status(),
        404
    );
}

#[test]
fn a_regex_bomb_and_unsupported_syntax_are_refused_with_line_and_column() {
    for (pattern, why) in [
        ("a{1000}{1000}", "the most a route may take"),
        (
            "((((((((((a{100}){100}){100}))))))))",
            "the most a route may take",
        ),
        ("(a)\\1", "backreferences"),
        ("(?=a)", "look-around"),
    ] {
        let yaml = format!("routes:\n  - name: r\n    match: {{ path_regex: '{pattern}' }}\n    respond: {{ status: 200 }}\n");
        let e = tollgate::config::parse(&yaml).unwrap_err().to_string();
        assert!(
            e.contains("line 3 column") && e.contains(why),
            "{pattern}: {e}"
        );
    }
    let long = format!(
        "routes:\n  - {{ name: r, match: {{ path_regex: '{}' }}, respond: {{ status: 200 }} }}\n",
        "a".repeat(5000)
    );
    assert!(tollgate::config::parse(&long)
        .unwrap_err()
        .to_string()
        .contains("at most 4096"));
}

#[tokio::test(start_paused = true)]
async fn huge_capture_references_are_refused_or_answered_414() {
    let refs = "$1".repeat(17);
    let yaml = format!("routes:\n  - {{ name: r, match: {{ path_regex: '^/(.*)$' }}, redirect: {{ to: '/{refs}' }} }}\n");
    assert!(tollgate::config::parse(&yaml)
        .unwrap_err()
        .to_string()
        .contains("at most 16"));
    // Sixteen copies of a 4 KiB capture: over the Location bound, refused.
    let refs = "$1".repeat(16);
    let app = app(&format!("routes:\n  - {{ name: r, match: {{ path_regex: '^/(.*)$' }}, redirect: {{ to: '/{refs}' }} }}\n"));
    let path = format!("/{}", "b".repeat(4096));
    assert_eq!(
        app.handle(get(&path, &[]), from(CLIENT)).await.status(),
        414
    );
}

#[test]
fn a_redirect_to_a_path_its_own_route_matches_is_a_warning() {
    let config = tollgate::config::parse(
        "routes:\n  - { name: loop, match: { path_prefix: /old }, redirect: { to: /old/page } }\n  - { name: fine, match: { path: /a }, redirect: { to: /b } }\n",
    )
    .unwrap();
    let warnings: Vec<String> = config.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("routes[0].redirect.to") && warnings[0].contains("loops"),
        "{warnings:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_redirect_loop_is_answered_once_per_request_and_limited_like_any_other() {
    let app = app(r#"
limiters:
  per_ip: { limit: 3, window: 60s, key: ip }
routes:
  - { name: loop, match: { path: /loop }, redirect: { to: /loop }, limiters: [per_ip] }
"#);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(
            app.handle(get("/loop", &[]), from(CLIENT))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(
        statuses,
        [301, 301, 301, 429, 429],
        "a redirect cannot walk around a limit"
    );
}

#[test]
fn regex_routes_are_understood_by_the_shadow_warning_or_said_undecidable() {
    let warnings = |yaml: &str| -> Vec<String> {
        tollgate::config::parse(yaml)
            .unwrap()
            .warnings
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let w = warnings("routes:\n  - { name: re, match: { path_regex: '^/a' }, respond: { status: 200 } }\n  - { name: exact, match: { path: /abc }, respond: { status: 200 } }\n");
    assert!(
        w.iter().any(|w| w.contains("\"exact\" is never reached")),
        "{w:?}"
    );
    let w = warnings("routes:\n  - { name: re, match: { path_regex: '^/blog/\\d+$' }, respond: { status: 200 } }\n  - { name: p, match: { path_prefix: /blog }, respond: { status: 200 } }\n");
    assert!(w.is_empty(), "a narrow regex shadows nothing: {w:?}");
    let w = warnings("routes:\n  - { name: re, match: { path_regex: '^/bl' }, respond: { status: 200 } }\n  - { name: p, match: { path_prefix: /blog }, respond: { status: 200 } }\n");
    assert!(w.iter().any(|w| w.contains("cannot decide")), "{w:?}");
    let w = warnings("routes:\n  - { name: all, match: { path_prefix: / }, respond: { status: 200 } }\n  - { name: re, match: { path_regex: '^/x' }, respond: { status: 200 } }\n");
    assert!(
        w.iter().any(|w| w.contains("\"re\" is never reached")),
        "{w:?}"
    );
}
