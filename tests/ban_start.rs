//! The answer that starts a ban tells the client how long the ban lasts, not how long the limiter's own wait would be.

mod common;

use common::app::{app, from, get, text};
use http::StatusCode;

const BANNING: &str = "limiters:
  l: { algorithm: fixed_window, limit: 1, window: 60s, key: ip, ban: { after: 2, for: 1h } }
routes:
  - { name: all, match: { path_prefix: / }, respond: { status: 200 }, limiters: [l] }
";

#[tokio::test(start_paused = true)]
async fn the_refusal_that_starts_a_ban_says_retry_after_the_ban_not_the_window() {
    let app = app(BANNING);
    let send = || async { app.handle(get("/", &[]), from("192.0.2.1:40000")).await };
    assert_eq!(send().await.status(), StatusCode::OK);
    // The first refusal is the limiter's: its window ends 40 s from T0.
    let first = send().await;
    assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(first.headers()["retry-after"], "40");
    // The second refusal is the strike that starts the hour's ban.
    let starting = send().await;
    assert_eq!(starting.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        starting.headers()["retry-after"],
        "3600",
        "the answer that starts a ban carries its duration"
    );
    let body: serde_json::Value = serde_json::from_str(&text(starting).await).unwrap();
    assert_eq!(body["retry_after"], 3600, "{body}");
    // Every answer during the ban agrees with the first.
    let banned = send().await;
    assert_eq!(banned.headers()["retry-after"], "3600");
}
