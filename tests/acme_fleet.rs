//! Automatic HTTPS for a fleet on one Redis store (real redis-server, real pebble): one order per name for the whole fleet, the certificate shared sealed through Redis, the challenge answered by whichever instance the CA reaches, and the Redis lock's promises.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::acme::{
    config, start, status_of, validation, verified_serial, wait_certificate, wait_scheduled, Scene,
};
use common::certs::Ca;
use common::redis_server::RedisServer;
use tollgate::acme::fleet::Fleet;
use tollgate::config::acme::SharedKey;
use tollgate::store::redis::Redis;

const SECRET: &str = "8c5d1b2f0e9a4c3d7b6a5f4e3d2c1b0a8c5d1b2f0e9a4c3d7b6a5f4e3d2c1b0a";

/// A `store:` section on `redis` and the file `shared_key_file` names, in `scene`.
fn fleet_store(scene: &Scene, redis: &RedisServer) -> (String, String) {
    let key = scene.work.path().join("acme.key");
    std::fs::write(&key, format!("{SECRET}\n")).unwrap();
    let store = format!(
        "store: {{ backend: redis, url: \"{}\", timeout: 2s }}\n",
        redis.url()
    );
    (store, format!(", shared_key_file: \"{}\"", key.display()))
}

/// Every key of the fleet's ACME state in Redis, with its value.
fn acme_records(redis: &RedisServer) -> Vec<(String, Vec<u8>)> {
    let client = ::redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*acme:*").query(&mut con).unwrap();
    keys.into_iter()
        .map(|k| {
            let v: Vec<u8> = ::redis::cmd("GET").arg(&k).query(&mut con).unwrap();
            (k, v)
        })
        .collect()
}

/// An instance's config: its own `storage` directory, trusting `ca` for pebble's HTTPS.
fn fleet_yaml(
    scene: &Scene,
    redis: &RedisServer,
    storage: &str,
    ca: &Path,
    domain: &str,
    challenge: &str,
) -> String {
    let (store, key) = fleet_store(scene, redis);
    let acme = common::acme::acme_block(
        &scene.directory(),
        ca,
        &scene.work.path().join(storage),
        &[domain],
        challenge,
        &key,
    );
    config(&acme, &scene.upstream.url(), "", "") + &store
}

#[tokio::test]
async fn two_tollgates_on_one_redis_with_their_own_storage_order_once_and_serve_the_same_certificate(
) {
    let redis = RedisServer::start();
    let scene = Scene::new().await;
    let ca = scene.directory_ca();
    let yaml = |storage: &str| fleet_yaml(&scene, &redis, storage, &ca, "m.test", "http-01");
    let one = start(&yaml("one"), tempfile::tempdir().unwrap()).await;
    let two = start(&yaml("two"), tempfile::tempdir().unwrap()).await;
    let pebble = scene.pebble(&validation(&one, 0));
    let client = pebble.client().await;
    let serial = wait_certificate(&one, "m.test", &pebble).await;
    assert_eq!(wait_certificate(&two, "m.test", &pebble).await, serial);
    for p in [&one, &two] {
        let served = verified_serial(p.tls_addr.unwrap(), "m.test", client.clone()).await;
        assert_eq!(served.unwrap(), serial);
    }
    // Both have scheduled their next look for the renewal, an hour away: no
    // order is pending on either, so pebble's count is final.
    for p in [&one, &two] {
        wait_scheduled(p, "m.test", Duration::from_secs(1800)).await;
    }
    assert_eq!(pebble.orders(), 1, "{}", pebble.output());
    // Exactly one of them ordered (`last_attempt` is this instance's own order).
    let ordered = [&one, &two].len()
        - [
            status_of(&one, "m.test").await,
            status_of(&two, "m.test").await,
        ]
        .iter()
        .filter(|s| s["last_attempt"].is_null())
        .count();
    assert_eq!(ordered, 1);
    // In Redis: the sealed certificate under the name's hash tag, no lock left, no key in the clear.
    let records = acme_records(&redis);
    let names: Vec<&str> = records.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].starts_with("tollgate:acme:{m.test}:") && names[0].ends_with(":cert"),
        "{names:?}"
    );
    let ttl = redis.command(&["PTTL", names[0]]).unwrap();
    let ttl: i64 = ttl.trim_start_matches(':').parse().unwrap();
    assert!(ttl > 0, "the record expires with the certificate: {ttl}");
    let sealed = &records[0].1;
    assert!(sealed.starts_with(b"tg1"));
    for clear in [&b"PRIVATE KEY"[..], b"BEGIN CERTIFICATE"] {
        assert!(!sealed.windows(clear.len()).any(|w| w == clear));
    }
}

/// `one` trusts the wrong CA for pebble's HTTPS, so it can never order:
/// `two` orders, while pebble validates on `one`'s TLS port — answered with
/// the tls-alpn-01 certificate `two` published through Redis.
#[tokio::test]
async fn the_instance_the_ca_validates_on_answers_another_instances_tls_alpn_01_challenge() {
    let redis = RedisServer::start();
    let scene = Scene::new().await;
    let wrong = Ca::new("not pebble").write(scene.work.path(), "wrong-ca.pem");
    let yaml =
        |storage: &str, ca: &Path| fleet_yaml(&scene, &redis, storage, ca, "n.test", "tls-alpn-01");
    let one = start(&yaml("one", &wrong), tempfile::tempdir().unwrap()).await;
    let two = start(
        &yaml("two", &scene.directory_ca()),
        tempfile::tempdir().unwrap(),
    )
    .await;
    let pebble = scene.pebble(&validation(&one, 0));
    let client = pebble.client().await;
    let serial = wait_certificate(&two, "n.test", &pebble).await;
    assert_eq!(wait_certificate(&one, "n.test", &pebble).await, serial);
    let served = verified_serial(one.tls_addr.unwrap(), "n.test", client.clone()).await;
    assert_eq!(
        served.unwrap(),
        serial,
        "one serves the certificate it never ordered"
    );
    assert_eq!(pebble.orders(), 1, "{}", pebble.output());
    let one_status = status_of(&one, "n.test").await;
    assert!(
        one_status["last_error"].is_null(),
        "picking the certificate up clears the earlier failure: {one_status}"
    );
}

#[tokio::test]
async fn an_instance_restarted_while_redis_is_down_serves_its_local_copy_and_orders_nothing() {
    let mut redis = RedisServer::start();
    let scene = Scene::new().await;
    let ca = scene.directory_ca();
    let yaml = fleet_yaml(&scene, &redis, "one", &ca, "o.test", "tls-alpn-01");
    let one = start(&yaml, tempfile::tempdir().unwrap()).await;
    let pebble = scene.pebble(&validation(&one, 0));
    let serial = wait_certificate(&one, "o.test", &pebble).await;
    one.stop().await;
    redis.stop();
    let again = start(&yaml, tempfile::tempdir().unwrap()).await;
    let client = pebble.client().await;
    let mut served = None;
    for _ in 0..50 {
        served = verified_serial(again.tls_addr.unwrap(), "o.test", client.clone())
            .await
            .ok();
        if served.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        served.as_deref(),
        Some(serial.as_str()),
        "the local copy is served"
    );
    // Its next look is the renewal, an hour away: it decided to order nothing.
    let status = wait_scheduled(&again, "o.test", Duration::from_secs(1800)).await;
    assert_eq!(pebble.orders(), 1, "{}", pebble.output());
    assert!(
        status["last_attempt"].is_null() && status["last_error"].is_null(),
        "{status}"
    );
}

fn fleet(redis: &RedisServer) -> Arc<Fleet> {
    let node = tollgate::config::RedisTopology::Node(redis.url());
    let handle = Redis::open(&node, "tollgate:", Duration::from_secs(2)).unwrap();
    Arc::new(Fleet::new(
        handle,
        SharedKey::parse(SECRET).unwrap(),
        "ca".into(),
    ))
}

#[tokio::test]
async fn a_lock_taken_over_in_redis_is_reported_lost_and_its_holder_never_deletes_the_new_one() {
    let redis = RedisServer::start();
    let fleet = fleet(&redis);
    let lock = fleet.try_lock("l.test").await.unwrap().expect("free");
    assert!(fleet.try_lock("l.test").await.unwrap().is_none(), "held");
    let key = "tollgate:acme:{l.test}:ca:lock";
    assert!(redis.command(&["GET", key]).is_some());
    // Another holder, as after an expiry: the keep-alive (every 10 s) finds it.
    assert_eq!(
        redis.command(&["SET", key, "someone-else"]).as_deref(),
        Some("+OK")
    );
    let lost = lock.lost();
    tokio::time::timeout(Duration::from_secs(15), lost.cancelled())
        .await
        .expect("the holder learns that its lock is gone");
    drop(lock);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        redis.command(&["GET", key]).as_deref(),
        Some("$12"),
        "the other holder's lock is still there (12 bytes)"
    );
    assert_eq!(redis.command(&["DEL", key]).as_deref(), Some(":1"));
    let mine = fleet.try_lock("l.test").await.unwrap().expect("free again");
    drop(mine);
    let released = common::eventually(Duration::from_secs(2), || async {
        redis.command(&["EXISTS", key]).as_deref() == Some(":0")
    })
    .await;
    assert!(released, "released by its holder");
}
