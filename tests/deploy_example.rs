//! The Kubernetes example (deploy/kubernetes) limits as its config says: its replicas, each running the ConfigMap's config, give a client its limit once, not once per replica.

mod common;

use std::path::Path;

use common::redis_server::RedisServer;
use common::{concurrent, Process};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes");

fn manifest(name: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(Path::new(DEPLOY).join(name)).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The ConfigMap's config as pod `dir` would run it here: the Secret's files
/// in `dir`, `${REDIS_PASSWORD}` as the pod's environment has it, a Redis
/// URL pointed at `redis`, and a SQLite file (were the store SQLite) on the
/// pod's own emptyDir.
fn pod_config(dir: &Path, redis: &RedisServer) -> String {
    let mut text = manifest("configmap.yaml")["data"]["tollgate.yaml"]
        .as_str()
        .unwrap()
        .to_string();
    let secret = manifest("secret.yaml");
    for (name, value) in secret["stringData"].as_mapping().unwrap() {
        let (name, value) = (name.as_str().unwrap(), value.as_str().unwrap());
        std::fs::write(dir.join(name), value).unwrap();
        text = text.replace(
            &format!("/run/secrets/tollgate/{name}"),
            &dir.join(name).display().to_string(),
        );
    }
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let store = &mut config["store"];
    if store["backend"].as_str() == Some("redis") {
        // The pod's own Redis would ask for the Secret's password; this one asks for none.
        store["url"] = redis.url().into();
    } else {
        store["path"] = dir.join("tollgate.db").display().to_string().into();
    }
    serde_yaml::to_string(&config).unwrap()
}

#[test]
fn the_example_deployments_replicas_give_a_client_its_limit_once() {
    let replicas = manifest("deployment.yaml")["spec"]["replicas"]
        .as_u64()
        .unwrap() as usize;
    let redis = RedisServer::start();
    let dirs: Vec<_> = (0..replicas)
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let pods: Vec<Process> = dirs
        .iter()
        .map(|d| Process::serve(&pod_config(d.path(), &redis), d.path()))
        .collect();
    // `/ping` is limited by `strict`, 5 a minute per client: 12 requests at
    // once from one client, spread over every replica.
    let admitted = concurrent(&pods.iter().collect::<Vec<_>>(), "/ping", 12);
    assert_eq!(
        admitted, 5,
        "{replicas} replicas admitted {admitted} of 12 against a limit of 5"
    );
}
