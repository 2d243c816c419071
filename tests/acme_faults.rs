//! Automatic HTTPS when things go wrong (real pebble): a validation the CA rejects, a storage that cannot be created, a certificate that cannot be saved, damaged certificate files — each reported, backed off, and never at the cost of the names already served.

mod common;

use std::time::Duration;

use common::acme::{
    accept_any, acme_block, config, entry_for, start, status_of, validation, verified_serial,
    wait_certificate, wait_scheduled, with_static_name, Scene,
};
use common::certs::{self, Ca};
use common::pebble::Validation;
use common::Proxy;
use serde_json::Value;

async fn static_name_is_served(proxy: &Proxy, ca: &Ca) {
    let answer = certs::get(
        proxy.tls_addr.unwrap(),
        "static.test",
        ca.client(&[b"http/1.1"]),
        "/",
    )
    .await;
    assert_eq!(
        answer.status, 200,
        "the configured name is served: {}",
        answer.body
    );
}

async fn dashboard_certificate(proxy: &Proxy, domain: &str) -> Value {
    let data = common::get_json(&common::client(), &proxy.admin_url("/dashboard.json")).await;
    entry_for(&data, domain)
}

/// Waits until `domain`'s `last_error` holds `needle`; returns its status.
async fn wait_error(proxy: &Proxy, domain: &str, needle: &str, within: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let status = status_of(proxy, domain).await;
        if status["last_error"]
            .as_str()
            .is_some_and(|e| e.contains(needle))
        {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {needle:?} error for {domain}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_validation_the_ca_rejects_backs_off_for_a_minute_is_counted_and_reported_and_other_names_are_served(
) {
    let scene = Scene::new().await;
    let ca = Ca::new("static CA");
    let acme = scene.acme(&["p.test"], "http-01", "");
    let yaml = with_static_name(&acme, &scene.upstream.url(), scene.work.path(), &ca);
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    // pebble checks http-01 on a port where nothing answers: the CA rejects the validation.
    let nobody = common::free_addr().port();
    let pebble = scene.pebble(&Validation {
        http_port: nobody,
        tls_port: proxy.tls_addr.unwrap().port(),
        validity: 0,
    });
    let failed = wait_error(
        &proxy,
        "p.test",
        "validation of p.test failed",
        Duration::from_secs(60),
    )
    .await;
    // A failed validation is retried after a minute (±20 %) at the soonest:
    // the task schedules that, and sleeps until then.
    let status = wait_scheduled(&proxy, "p.test", Duration::from_secs(40)).await;
    assert_eq!(
        status["failures"], failed["failures"],
        "the schedule follows that failure, no quicker retry came first: {status}"
    );
    assert!(status["serial"].is_null(), "{status}");
    let orders = pebble.orders();
    assert!(orders >= 1, "{}", pebble.output());
    static_name_is_served(&proxy, &ca).await;
    assert!(
        certs::handshake(proxy.tls_addr.unwrap(), "p.test", accept_any())
            .await
            .is_err(),
        "the managed name is not answered with another certificate"
    );
    let metrics = proxy.metrics().await;
    assert!(
        common::metric(&metrics, "tollgate_acme_orders_total{result=\"error\"}").unwrap() >= 1.0
    );
    assert_eq!(
        common::metric(
            &metrics,
            "tollgate_certificate_renewal_failing{domain=\"p.test\"}"
        ),
        Some(1.0)
    );
    let flagged = dashboard_certificate(&proxy, "p.test").await;
    assert_eq!(flagged["attention"], "renewal_failing", "{flagged}");
    assert!(
        flagged["last_error"]
            .as_str()
            .unwrap()
            .contains("validation"),
        "{flagged}"
    );
    // No new order within the back-off: after all of the above, the status
    // shows no new attempt and the same schedule, and pebble no new order.
    let later = status_of(&proxy, "p.test").await;
    for field in ["last_attempt", "next_attempt", "failures"] {
        assert_eq!(later[field], status[field], "{field}: {later}");
    }
    assert_eq!(pebble.orders(), orders, "no new order within the back-off");
}

#[tokio::test]
async fn a_storage_that_cannot_be_created_is_reported_by_its_path_and_serving_goes_on() {
    let scene = Scene::new().await;
    let ca = Ca::new("static CA");
    // A regular file where a directory should be: not even root can create it.
    let blocker = scene.work.path().join("not-a-directory");
    std::fs::write(&blocker, "x").unwrap();
    let storage = blocker.join("acme");
    let acme = acme_block(
        &scene.directory(),
        &scene.directory_ca(),
        &storage,
        &["q.test"],
        "tls-alpn-01",
        "",
    );
    let yaml = with_static_name(&acme, &scene.upstream.url(), scene.work.path(), &ca);
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    let status = wait_error(&proxy, "q.test", "storage", Duration::from_secs(10)).await;
    let error = status["last_error"].as_str().unwrap();
    assert!(
        error.contains(&storage.display().to_string()),
        "the path is named: {error}"
    );
    static_name_is_served(&proxy, &ca).await;
    // Retried with a back-off (2 s ±20 % after the first failure); the process serves on.
    let retried = common::eventually(Duration::from_secs(10), || async {
        status_of(&proxy, "q.test").await["failures"].as_u64() >= Some(2)
    })
    .await;
    let again = status_of(&proxy, "q.test").await;
    assert!(retried, "{again}");
    static_name_is_served(&proxy, &ca).await;
}

#[tokio::test]
async fn a_certificate_that_cannot_be_saved_is_served_from_memory_reported_and_not_ordered_again() {
    let scene = Scene::new().await;
    // The chain's file name is taken by a directory: the save fails (for root too).
    let corner = scene
        .storage()
        .join(tollgate::acme::storage::ca_tag(&scene.directory()));
    std::fs::create_dir_all(corner.join("r.test.crt")).unwrap();
    let acme = scene.acme(&["r.test"], "tls-alpn-01", "");
    let proxy = start(
        &config(&acme, &scene.upstream.url(), "", ""),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let pebble = scene.pebble(&validation(&proxy, 0));
    let client = pebble.client().await;
    let serial = wait_certificate(&proxy, "r.test", &pebble).await;
    assert_eq!(
        verified_serial(proxy.tls_addr.unwrap(), "r.test", client.clone())
            .await
            .unwrap(),
        serial
    );
    let status = wait_error(
        &proxy,
        "r.test",
        "served from memory",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        status["last_error"]
            .as_str()
            .unwrap()
            .contains("r.test.crt"),
        "{status}"
    );
    // Its next look is the renewal, an hour away, not a retry: nothing is ordered before it.
    let scheduled = wait_scheduled(&proxy, "r.test", Duration::from_secs(1800)).await;
    assert_eq!(scheduled["serial"], serial.as_str(), "{scheduled}");
    assert_eq!(
        pebble.orders(),
        1,
        "held in memory, not ordered again: {}",
        pebble.output()
    );
    assert_eq!(
        verified_serial(proxy.tls_addr.unwrap(), "r.test", client)
            .await
            .unwrap(),
        serial
    );
}

/// The names leave the config and come back (two reloads), so their tasks
/// start afresh and read the storage — as after a restart, but on the same
/// ports, where pebble validates.
#[tokio::test]
async fn damaged_certificate_files_are_never_served_and_are_ordered_again() {
    let scene = Scene::new().await;
    let ca = Ca::new("static CA");
    let acme = scene.acme(&["s.test", "t.test"], "tls-alpn-01", "");
    let yaml = with_static_name(&acme, &scene.upstream.url(), scene.work.path(), &ca);
    let proxy = start(&yaml, tempfile::tempdir().unwrap()).await;
    // One-hour certificates: under 14 days, so the dashboard flags them.
    let pebble = scene.pebble(&validation(&proxy, 3600));
    let first_s = wait_certificate(&proxy, "s.test", &pebble).await;
    let first_t = wait_certificate(&proxy, "t.test", &pebble).await;
    let flagged = dashboard_certificate(&proxy, "s.test").await;
    assert_eq!(flagged["attention"], "expiring", "{flagged}");
    assert!(flagged["days_left"].as_f64().unwrap() < 1.0, "{flagged}");
    assert_eq!(pebble.orders(), 2);

    let without = yaml.replace(&format!("    acme: {{ {acme} }}\n"), "");
    assert_ne!(without, yaml);
    proxy.write_config(&without);
    assert_eq!(proxy.reload().await.0, 200);
    let gone = common::eventually(Duration::from_secs(5), || async {
        status_of(&proxy, "s.test").await.is_null() && status_of(&proxy, "t.test").await.is_null()
    })
    .await;
    assert!(gone, "no longer managed");
    let corner = scene
        .storage()
        .join(tollgate::acme::storage::ca_tag(&scene.directory()));
    // s.test: the chain cut in half; t.test: a key that is not the certificate's.
    let chain = std::fs::read_to_string(corner.join("s.test.crt")).unwrap();
    std::fs::write(corner.join("s.test.crt"), &chain[..chain.len() / 2]).unwrap();
    let stranger = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    std::fs::write(corner.join("t.test.key"), stranger.serialize_pem()).unwrap();
    proxy.write_config(&yaml);
    assert_eq!(proxy.reload().await.0, 200);

    let client = pebble.client().await;
    for (domain, old) in [("s.test", &first_s), ("t.test", &first_t)] {
        let serial = wait_certificate(&proxy, domain, &pebble).await;
        assert_ne!(
            &serial, old,
            "{domain}: the damaged one is never put in force"
        );
        let served = verified_serial(proxy.tls_addr.unwrap(), domain, client.clone())
            .await
            .unwrap();
        assert_eq!(served, serial, "{domain}");
    }
    assert_eq!(
        pebble.orders(),
        4,
        "both ordered again: {}",
        pebble.output()
    );
}
