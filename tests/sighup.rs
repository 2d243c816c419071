//! SIGHUP reloads the config. In a test binary of its own: the signal reaches the whole process.

mod common;

use common::T0;
use std::time::Duration;

use common::{client, ping_yaml, Proxy};
use tollgate::clock::ManualClock;

#[tokio::test]
async fn sighup_reloads_the_config_in_the_same_process() {
    // Our own handler first, so the signal can never hit the default action.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).unwrap();
    let proxy = Proxy::start_with_clock(&ping_yaml(1), ManualClock::at(T0)).await;
    let c = client();
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 200);
    assert_eq!(common::status(&c, &proxy.url("/ping"), &[]).await, 429);
    proxy.write_config(&ping_yaml(1000));
    let pid = std::process::id();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(hup.recv().await.is_some());
    assert!(
        common::eventually(Duration::from_secs(2), || async {
            common::status(&c, &proxy.url("/ping"), &[]).await == 200
        })
        .await,
        "SIGHUP did not apply the new limit within 2 s"
    );
    assert_eq!(proxy.app.snapshot().version, 2);
    assert_eq!(std::process::id(), pid);
}
