//! `log.refusals`: a flood of refusals is one record and one summary line per client and window under `first`, every refusal under `each`.

mod common;

use std::time::Duration;

use common::app::{app, from, get};
use common::AccessCapture;
use http::StatusCode;
use tollgate::app::App;

fn limited(refusals: &str) -> String {
    format!(
        "log: {{ format: json, refusals: {refusals} }}
limiters:
  once: {{ limit: 1, window: 60s, key: ip }}
routes:
  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200 }}, limiters: [once] }}
"
    )
}

/// `n` requests from one client; the statuses they got.
async fn flood(app: &App, peer: &str, n: usize) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(app.handle(get("/", &[]), from(peer)).await.status());
    }
    statuses
}

/// Every line written so far, as JSON.
fn written(app: &App, capture: &AccessCapture) -> Vec<serde_json::Value> {
    assert!(app.shared.access.flush(Duration::from_secs(5)));
    capture
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn under_first_a_flood_is_one_refusal_record_then_one_summary_counting_all_of_them() {
    let app = app(&limited("first"));
    let capture = AccessCapture::default();
    app.shared.access.redirect(Box::new(capture.clone()));
    let statuses = flood(&app, "192.0.2.1:40000", 51).await;
    assert_eq!(statuses[0], StatusCode::OK);
    assert!(statuses[1..]
        .iter()
        .all(|s| *s == StatusCode::TOO_MANY_REQUESTS));
    // Another client refused once: its record, and no summary.
    flood(&app, "192.0.2.2:40000", 2).await;
    // The window ends with the limiter's: the next minute's request is allowed,
    // and its record follows the summary of the window before it.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(flood(&app, "192.0.2.1:40000", 1).await, [StatusCode::OK]);

    let lines = written(&app, &capture);
    let kinds: Vec<(&str, u64)> = lines
        .iter()
        .map(|l| (l["log"].as_str().unwrap(), l["status"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("access", 200),
            ("access", 429),
            ("access", 200),
            ("access", 429),
            ("refusals", 429),
            ("access", 200)
        ],
        "{lines:#?}"
    );
    let summary = &lines[4];
    assert_eq!(summary["client"], "ip:192.0.2.1");
    assert_eq!(summary["limiter"], "once");
    assert_eq!(summary["refusals"], 50);
    assert_eq!(app.shared.access.refusals_folded(), 49);
    assert_eq!(app.shared.access.refusal_windows(), 0);
}

#[tokio::test(start_paused = true)]
async fn under_each_the_default_every_refusal_is_a_record() {
    let app = app(&limited("each"));
    let capture = AccessCapture::default();
    app.shared.access.redirect(Box::new(capture.clone()));
    flood(&app, "192.0.2.1:40000", 51).await;
    let lines = written(&app, &capture);
    assert_eq!(lines.len(), 51);
    assert!(lines.iter().all(|l| l["log"] == "access"));
    assert_eq!(app.shared.access.refusals_folded(), 0);
}

#[test]
fn an_unknown_refusals_value_is_refused_with_its_key_named() {
    let err = tollgate::config::parse(&limited("some"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("log.refusals"), "{err}");
    assert!(err.contains("each or first"), "{err}");
}
