//! Restarts against a real ACME CA (pebble): every stored certificate is in force before the TLS listener accepts, instances sharing the storage never fail a write, and the shared challenge answers are private.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use common::acme::{config, start, status_of, validation, wait_certificate, Scene};
use common::{certs, Proxy};

const NAMES: [&str; 3] = ["r1.test", "r2.test", "r3.test"];

/// Handshakes with `sni`, one after another from now on, until `wanted`
/// have succeeded; how many failed before that (with the first error).
async fn handshakes_until(
    addr: SocketAddr,
    sni: &'static str,
    client: Arc<rustls::ClientConfig>,
    wanted: usize,
) -> (usize, Option<String>) {
    let (mut ok, mut failed, mut first) = (0, 0, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while ok < wanted {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{sni}: {ok} handshakes in 60 s"
        );
        match certs::handshake(addr, sni, client.clone()).await {
            Ok(_) => ok += 1,
            Err(e) => {
                failed += 1;
                first.get_or_insert_with(|| format!("{sni}: {e}"));
            }
        }
    }
    (failed, first)
}

/// Handshakes for every name at once from the moment `proxy`'s TLS port
/// accepts (it is bound before the proxy runs); the failures, summed.
async fn failed_handshakes(
    proxy: &Proxy,
    client: &Arc<rustls::ClientConfig>,
) -> (usize, Vec<String>) {
    let tls = proxy.tls_addr.unwrap();
    let runs: Vec<_> = NAMES
        .iter()
        .map(|n| tokio::spawn(handshakes_until(tls, n, client.clone(), 10)))
        .collect();
    let (mut failed, mut errors) = (0, Vec::new());
    for run in runs {
        let (f, e) = run.await.unwrap();
        failed += f;
        errors.extend(e);
    }
    (failed, errors)
}

/// Once each name's task has had its first look at the storage (its next
/// one is scheduled): no name of `proxy` has failed an order, a save or a
/// read since it started.
async fn no_failure(proxy: &Proxy) {
    for name in NAMES {
        let looked = common::eventually(Duration::from_secs(10), || async {
            status_of(proxy, name).await["next_attempt"].is_string()
        })
        .await;
        assert!(looked, "{}", status_of(proxy, name).await);
        let status = status_of(proxy, name).await;
        assert_eq!(status["failures"], 0, "{status}");
        assert!(status["last_error"].is_null(), "{status}");
    }
}

/// The config of the scene's three names (http-01, validated on the plain listener).
fn three_names(scene: &Scene) -> String {
    config(
        &scene.acme(&NAMES, "http-01", ""),
        &scene.upstream.url(),
        "",
        "",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_restarts_with_three_names_fail_no_handshake_from_the_moment_the_port_accepts() {
    let scene = Scene::new().await;
    let yaml = three_names(&scene);
    let first = start(&yaml, tempfile::tempdir().unwrap()).await;
    let pebble = scene.pebble(&validation(&first, 0));
    for name in NAMES {
        wait_certificate(&first, name, &pebble).await;
    }
    first.stop().await;
    let client = pebble.client().await;
    let orders = pebble.orders();
    let mut failed = 0;
    for restart in 1..=10 {
        let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
        let (f, errors) = failed_handshakes(&proxy, &client).await;
        assert_eq!(f, 0, "restart {restart}: {f} failed handshakes: {errors:?}");
        failed += f;
        no_failure(&proxy).await;
        proxy.stop().await;
    }
    assert_eq!(failed, 0);
    assert_eq!(pebble.orders(), orders, "no restart ordered anything");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_the_storage_never_fail_a_write_and_order_each_name_once() {
    let scene = Scene::new().await;
    let yaml = three_names(&scene);
    let a = start(&yaml, tempfile::tempdir().unwrap()).await;
    let b = start(&yaml, tempfile::tempdir().unwrap()).await;
    // pebble validates on `a`'s port; `b`'s orders are answered from the shared storage.
    let pebble = scene.pebble(&validation(&a, 0));
    for name in NAMES {
        wait_certificate(&a, name, &pebble).await;
        wait_certificate(&b, name, &pebble).await;
    }
    // (Their first attempts failed: pebble starts after them, on their ports.)
    assert_eq!(pebble.orders(), NAMES.len(), "{}", pebble.output());
    let client = pebble.client().await;
    // Both restart at once, three times: six tasks open the storage together.
    let (mut a, mut b) = (a, b);
    for restart in 1..=3 {
        a.stop().await;
        b.stop().await;
        a = start(&yaml, tempfile::tempdir().unwrap()).await;
        b = start(&yaml, tempfile::tempdir().unwrap()).await;
        for proxy in [&a, &b] {
            let (f, errors) = failed_handshakes(proxy, &client).await;
            assert_eq!(f, 0, "restart {restart}: {errors:?}");
        }
        no_failure(&a).await;
        no_failure(&b).await;
    }
    assert_eq!(pebble.orders(), NAMES.len());
}

#[tokio::test]
async fn http_01_answers_shared_through_the_storage_are_in_a_0700_directory() {
    let scene = Scene::new().await;
    let yaml = config(
        &scene.acme(&["p.test"], "http-01", ""),
        &scene.upstream.url(),
        "",
        "",
    );
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    let pebble = scene.pebble(&validation(&proxy, 0));
    wait_certificate(&proxy, "p.test", &pebble).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let challenges = scene.storage().join("challenges");
    assert_eq!(mode(&challenges), 0o700, "{}", challenges.display());
    assert_eq!(mode(&scene.storage()), 0o700);
}
