//! `auth.basic`: htpasswd users (bcrypt, apr1, {SHA}), 401s with the realm, failed attempts feeding `count:`/`ban:` on the sender's key only, the Authorization header kept from the upstream, and a users file picked up when it changes.

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::app::{app, from, get, text};
use common::{Proxy, Upstream};
use http::StatusCode;

const CLIENT: &str = "203.0.113.9:40000";

/// An htpasswd file with one user of each kind: ann (bcrypt), bob (apr1),
/// cid ({SHA}); every password is `password`, but ann's is `s3cret`.
fn users_file(dir: &std::path::Path) -> std::path::PathBuf {
    let bcrypt = bcrypt::hash_with_salt("s3cret", 4, [7u8; 16])
        .unwrap()
        .format_for_version(bcrypt::Version::TwoY);
    let path = dir.join("htpasswd");
    std::fs::write(
        &path,
        format!("ann:{bcrypt}\nbob:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\ncid:{{SHA}}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n"),
    )
    .unwrap();
    path
}

fn basic(user: &str, password: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {b64}")
}

fn staff_yaml(users: &std::path::Path, upstream: &str, extra: &str) -> String {
    format!(
        r#"
upstreams:
  app: {{ url: "{upstream}" }}
limiters:
  attempts: {{ algorithm: fixed_window, limit: 3, window: 60s, key: ip, count: {{ status: [401] }}, ban: {{ after: 1, for: 1h }} }}
  everyone: {{ limit: 3, window: 60s, key: global }}
routes:
  - name: staff
    match: {{ path_prefix: / }}
    auth: {{ basic: {{ realm: Staff, users_file: "{}"{extra} }} }}
    limiters: [attempts, everyone]
    upstream: app
"#,
        users.display()
    )
}

#[tokio::test(start_paused = true)]
async fn bcrypt_apr1_and_sha_users_get_in_and_a_wrong_password_gets_the_realm() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let app = app(&staff_yaml(&users_file(dir.path()), &upstream.url(), ""));
    for (i, (user, pw)) in [("ann", "s3cret"), ("bob", "password"), ("cid", "password")]
        .iter()
        .enumerate()
    {
        let auth = basic(user, pw);
        let peer = format!("192.0.2.{i}:1");
        let r = app
            .handle(get("/", &[("authorization", &auth)]), from(&peer))
            .await;
        assert_eq!(r.status(), StatusCode::OK, "{user}");
        let seen: serde_json::Value = serde_json::from_str(&text(r).await).unwrap();
        assert!(
            seen["headers"].get("authorization").is_none(),
            "not forwarded unless asked"
        );
    }
    let auth = basic("ann", "wrong");
    let r = app
        .handle(get("/", &[("authorization", &auth)]), from(CLIENT))
        .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.headers()["www-authenticate"],
        r#"Basic realm="Staff", charset="UTF-8""#
    );
    let r = app.handle(get("/", &[]), from("198.51.100.1:1")).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "no credentials");
}

#[tokio::test(start_paused = true)]
async fn failed_attempts_feed_count_and_ban_on_the_senders_key_and_never_a_shared_one() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let app = app(&staff_yaml(&users_file(dir.path()), &upstream.url(), ""));
    let wrong = basic("bob", "guess");
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = app
            .handle(get("/", &[("authorization", &wrong)]), from(CLIENT))
            .await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(&statuses[..3], &[401, 401, 401]);
    assert_eq!(statuses[3], 429, "the fourth failure is over the limit");
    assert!(
        statuses[4..].iter().all(|&s| s == 429),
        "then banned: {statuses:?}"
    );
    // The banned sender is refused even with the right password.
    let right = basic("bob", "password");
    let r = app
        .handle(get("/", &[("authorization", &right)]), from(CLIENT))
        .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Six failures used none of the `global` quota (3) the staff share.
    for peer in ["192.0.2.1:1", "192.0.2.2:1", "192.0.2.3:1"] {
        let r = app
            .handle(get("/", &[("authorization", &right)]), from(peer))
            .await;
        assert_eq!(r.status(), StatusCode::OK, "{peer}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_authorization_header_is_forwarded_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start().await;
    let yaml = staff_yaml(
        &users_file(dir.path()),
        &upstream.url(),
        ", forward_authorization: true",
    );
    let app = app(&yaml);
    let auth = basic("bob", "password");
    let r = app
        .handle(get("/", &[("authorization", &auth)]), from(CLIENT))
        .await;
    let seen: serde_json::Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(seen["headers"]["authorization"], auth.as_str());
}

#[tokio::test]
async fn a_changed_users_file_is_picked_up_without_a_restart() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let users = users_file(dir.path());
    // Without limiters: the polls below would otherwise get this client banned.
    let yaml = staff_yaml(&users, &upstream.url(), "")
        .replace("limiters: [attempts, everyone]", "allow_unlimited: true");
    let proxy = Proxy::start_in(
        &yaml,
        std::sync::Arc::new(tollgate::clock::SystemClock),
        tempfile::tempdir().unwrap(),
        Some(Duration::from_millis(20)),
    )
    .await;
    let client = reqwest::Client::new();
    let status = |user: &'static str, pw: &'static str| {
        let req = client
            .get(proxy.url("/"))
            .header("authorization", basic(user, pw));
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status("dan", "n3w").await, 401);
    std::fs::write(&users, "dan:{SHA}".to_string() + &sha1_b64("n3w") + "\n").unwrap();
    let picked = common::eventually(Duration::from_secs(10), || async {
        status("dan", "n3w").await == 200
    })
    .await;
    assert!(
        picked,
        "the new user never got in: {:?}",
        proxy.app.shared.last_reload_error.lock()
    );
    assert_eq!(
        status("bob", "password").await,
        401,
        "the old users are gone"
    );
}

fn sha1_b64(password: &str) -> String {
    use sha1::Digest as _;
    base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(password.as_bytes()))
}
