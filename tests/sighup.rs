//! SIGHUP reloads the config. In a test binary of its own: the signal reaches the whole process.

mod common;

use std::time::{Duration, Instant};

use common::{client, Proxy};
use tollgate::clock::ManualClock;

const T0: u64 = 1_767_225_620 * 1_000_000_000;

fn ping(limit: u32) -> String {
    format!(
        "limiters:\n  strict: {{ limit: {limit}, window: 60s }}\nroutes:\n  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [strict] }}\n"
    )
}

#[tokio::test]
async fn sighup_reloads_the_config_in_the_same_process() {
    // Our own handler first, so the signal can never hit the default action.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).unwrap();
    let proxy = Proxy::start_with_clock(&ping(1), ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 429);
    proxy.write_config(&ping(1000));
    let pid = std::process::id();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(hup.recv().await.is_some());
    let deadline = Instant::now() + Duration::from_secs(2);
    while common::status(&c, &proxy.url("/ping"), &[]).await != 200 {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not apply the new limit within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(proxy.app.snapshot().version, 2);
    assert_eq!(std::process::id(), pid);
}
