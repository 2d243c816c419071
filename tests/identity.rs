//! Identity over real sockets: who the client is behind proxies, per API key, per IPv6 prefix.

mod common;

use common::T0;
use common::{client, Proxy, Upstream};
use tollgate::clock::ManualClock;

/// One request per minute per `key`, on a route that answers locally; `identity` is YAML.
fn one_per_minute(key: &str, identity: &str) -> String {
    format!(
        "identity: {identity}\nlimiters:\n  once: {{ limit: 1, window: 60s, key: {key} }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200 }}, limiters: [once] }}\n"
    )
}

const TRUSTED: &str = "{ trusted_proxies: [127.0.0.0/8] }";

/// Sends GET `/` with the given headers and returns the status and body.
async fn get(proxy: &Proxy, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = client().get(proxy.url("/"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn detail(body: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    v["detail"].as_str().unwrap_or_default().to_string()
}

/// `key:` + the first 8 hex digits of SHA-256 + `…`, computed here, not by tollgate.
fn shortened(secret: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(secret.as_bytes());
    format!("key:{:02x}{:02x}{:02x}{:02x}…", d[0], d[1], d[2], d[3])
}

#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_does_not_change_the_client() {
    let proxy = Proxy::start_with_clock(&one_per_minute("ip", "{}"), ManualClock::at(T0)).await;
    assert_eq!(get(&proxy, &[("x-forwarded-for", "1.1.1.1")]).await.0, 200);
    let (status, body) = get(&proxy, &[("x-forwarded-for", "2.2.2.2")]).await;
    assert_eq!(status, 429);
    assert!(detail(&body).contains("'ip:127.0.0.1'"), "{body}");
    assert_eq!(get(&proxy, &[("forwarded", "for=3.3.3.3")]).await.0, 429);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_rightmost_untrusted_forwarded_for_address_is_the_client() {
    let proxy = Proxy::start_with_clock(&one_per_minute("ip", TRUSTED), ManualClock::at(T0)).await;
    assert_eq!(
        get(&proxy, &[("x-forwarded-for", "6.6.6.6, 198.51.100.7")])
            .await
            .0,
        200
    );
    // Another chain is another client.
    assert_eq!(
        get(&proxy, &[("x-forwarded-for", "198.51.100.8")]).await.0,
        200
    );
    // A client cannot escape by writing a new address on the left ...
    let (status, body) = get(&proxy, &[("x-forwarded-for", "7.7.7.7, 198.51.100.7")]).await;
    assert_eq!(status, 429);
    assert!(detail(&body).contains("'ip:198.51.100.7'"), "{body}");
    // ... nor is a trusted hop on the right taken for the client.
    assert_eq!(
        get(&proxy, &[("x-forwarded-for", "198.51.100.7, 127.0.0.9")])
            .await
            .0,
        429
    );
    // 6.6.6.6 was never the client, so its quota is untouched.
    assert_eq!(get(&proxy, &[("x-forwarded-for", "6.6.6.6")]).await.0, 200);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_forwarded_header_is_read_the_same_way() {
    let proxy = Proxy::start_with_clock(&one_per_minute("ip", TRUSTED), ManualClock::at(T0)).await;
    assert_eq!(
        get(&proxy, &[("forwarded", "for=6.6.6.6, for=198.51.100.7")])
            .await
            .0,
        200
    );
    assert_eq!(
        get(&proxy, &[("forwarded", "for=198.51.100.8;proto=https")])
            .await
            .0,
        200
    );
    let (status, body) = get(
        &proxy,
        &[("forwarded", "for=7.7.7.7, for=\"198.51.100.7:4711\"")],
    )
    .await;
    assert_eq!(status, 429);
    assert!(detail(&body).contains("'ip:198.51.100.7'"), "{body}");
    assert_eq!(get(&proxy, &[("forwarded", "for=6.6.6.6")]).await.0, 200);
}

#[tokio::test]
async fn requests_with_an_api_key_are_counted_per_key_not_per_ip() {
    let keys = "{ api_keys: [key-alpha, key-beta] }";
    let proxy = Proxy::start_with_clock(&one_per_minute("client", keys), ManualClock::at(T0)).await;
    assert_eq!(get(&proxy, &[("x-client-key", "key-alpha")]).await.0, 200);
    assert_eq!(
        get(&proxy, &[("x-client-key", "key-beta")]).await.0,
        200,
        "same IP, own quota"
    );
    assert_eq!(
        get(&proxy, &[]).await.0,
        200,
        "the bare IP has its own quota"
    );
    assert_eq!(get(&proxy, &[("x-client-key", "key-alpha")]).await.0, 429);
    assert_eq!(get(&proxy, &[("x-client-key", "key-beta")]).await.0, 429);
    assert_eq!(get(&proxy, &[]).await.0, 429);
}

#[tokio::test]
async fn an_unknown_api_key_is_a_401_problem_that_does_not_echo_the_key() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "identity: {{ api_keys: [sk_good_Known1] }}\nupstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n",
        upstream.url()
    );
    let proxy = Proxy::start(&yaml).await;
    let secret = "sk_bad_Unknown9";
    let r = client()
        .get(proxy.url("/x"))
        .header("x-client-key", secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    for (name, value) in r.headers() {
        assert!(
            !value.to_str().unwrap_or("").contains(secret),
            "{name} shows the key"
        );
    }
    let body = r.text().await.unwrap();
    assert!(!body.contains(secret), "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "unknown-api-key");
    assert_eq!(v["status"], 401);
    assert!(
        v["detail"].as_str().unwrap().contains(&shortened(secret)),
        "{body}"
    );
    assert_eq!(
        upstream
            .seen
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );

    let known = client()
        .get(proxy.url("/x"))
        .header("x-client-key", "sk_good_Known1")
        .send()
        .await
        .unwrap();
    assert_eq!(known.status(), 200);
    assert_eq!(
        get(&proxy, &[]).await.0,
        200,
        "no key at all is an IP client, not an unknown key"
    );
}

#[tokio::test]
async fn a_429_shows_the_api_key_shortened_and_admin_status_finds_its_counters_by_the_plain_key() {
    let secret = "sk_live_Status42";
    let keys = format!("{{ api_keys: [{secret}] }}");
    let proxy =
        Proxy::start_with_clock(&one_per_minute("client", &keys), ManualClock::at(T0)).await;
    assert_eq!(get(&proxy, &[("x-client-key", secret)]).await.0, 200);
    let r = client()
        .get(proxy.url("/"))
        .header("x-client-key", secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    for (name, value) in r.headers() {
        assert!(
            !value.to_str().unwrap_or("").contains(secret),
            "{name} shows the key"
        );
    }
    let body = r.text().await.unwrap();
    assert!(!body.contains(secret), "{body}");
    assert_eq!(
        detail(&body),
        format!(
            "Rate limit of 1 requests per 60s exceeded for key '{}'.",
            shortened(secret)
        )
    );

    let status = |key: &str| {
        let url = proxy.admin_url(&format!("/status?key={key}"));
        async move {
            let r = client().get(url).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            v
        }
    };
    let used = status(secret).await;
    let text = used.to_string();
    assert!(!text.contains(secret), "{text}");
    assert!(
        used["key"]
            .as_str()
            .unwrap()
            .starts_with(shortened(secret).trim_end_matches('…')),
        "{text}"
    );
    assert_eq!(used["limiters"][0]["limiter"], "once", "{text}");
    assert_eq!(used["limiters"][0]["remaining"], 0, "{text}");
    // Looking does not count, another key is untouched, and the IP was never charged.
    assert_eq!(status(secret).await["limiters"][0]["remaining"], 0);
    assert_eq!(status("sk_live_Other").await["limiters"][0]["remaining"], 1);
    assert_eq!(status("127.0.0.1").await["limiters"][0]["remaining"], 1);
}

/// With `identity`, `first` and `same` share one quota (shown as `key`), `other` does not.
async fn assert_grouped(identity: &str, first: &str, same: &str, key: &str, other: &str) {
    let proxy = Proxy::start_with_clock(&one_per_minute("ip", identity), ManualClock::at(T0)).await;
    assert_eq!(get(&proxy, &[("x-forwarded-for", first)]).await.0, 200);
    let (status, body) = get(&proxy, &[("x-forwarded-for", same)]).await;
    assert_eq!(status, 429, "{first} and {same} share a quota");
    assert!(detail(&body).contains(&format!("'{key}'")), "{body}");
    assert_eq!(
        get(&proxy, &[("x-forwarded-for", other)]).await.0,
        200,
        "{other} has its own"
    );
}

#[tokio::test]
async fn ipv6_clients_behind_a_trusted_proxy_share_a_quota_per_64() {
    assert_grouped(
        TRUSTED,
        "2001:db8:1:2::5",
        "2001:db8:1:2::9",
        "ip:2001:db8:1:2::/64",
        "2001:db8:1:3::1",
    )
    .await;
}

#[tokio::test]
async fn the_ipv6_prefix_setting_decides_which_addresses_share_a_quota() {
    let identity = "{ trusted_proxies: [127.0.0.0/8], ipv6_prefix: 56 }";
    assert_grouped(
        identity,
        "2001:db8:1:2::5",
        "2001:db8:1:3::1",
        "ip:2001:db8:1::/56",
        "2001:db8:1:100::1",
    )
    .await;
}
