//! Networks as identities: limiter keys `asn` and `country`, route matches on them, the bucket of an address without an entry, the databases swapped while running, and the ASN and country in the access log and `GET /bans` — on databases the tests write themselves.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::app::{app, from, get, text};
use common::geoip::{write_asn_db, write_country_db};
use common::{client, eventually, get_json, Proxy};
use tollgate::App;

const ASNS: &[(&str, u32)] = &[
    ("203.0.113.0/24", 64500),
    ("2001:db8::/32", 64500),
    ("198.51.100.0/24", 64501),
];
const COUNTRIES: &[(&str, &str)] = &[("203.0.113.0/24", "DE"), ("198.51.100.0/24", "FR")];

/// Both databases in `dir`: their paths.
fn databases(dir: &Path) -> (PathBuf, PathBuf) {
    let (asn, country) = (dir.join("asn.mmdb"), dir.join("country.mmdb"));
    write_asn_db(&asn, ASNS);
    write_country_db(&country, COUNTRIES);
    (asn, country)
}

fn geoip(dir: &Path) -> String {
    let (asn, country) = databases(dir);
    format!(
        "identity:\n  geoip: {{ asn_db: {}, country_db: {} }}\n",
        asn.display(),
        country.display()
    )
}

async fn status(app: &App, path: &str, ip: &str) -> u16 {
    let peer = if ip.contains(':') {
        format!("[{ip}]:4000")
    } else {
        format!("{ip}:4000")
    };
    app.handle(get(path, &[]), from(&peer))
        .await
        .status()
        .as_u16()
}

#[tokio::test(start_paused = true)]
async fn an_asn_limiter_counts_every_address_of_the_network_together() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&format!(
        "{}limiters:\n  per_network: {{ limit: 2, window: 60s, key: asn }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, respond: {{ status: 200 }}, limiters: [per_network] }}\n",
        geoip(dir.path())
    ));
    assert_eq!(status(&app, "/", "203.0.113.1").await, 200);
    assert_eq!(status(&app, "/", "203.0.113.2").await, 200);
    assert_eq!(
        status(&app, "/", "2001:db8:ffff::9").await,
        429,
        "same AS over IPv6"
    );
    assert_eq!(status(&app, "/", "198.51.100.1").await, 200, "another AS");
    // Addresses without an entry share one bucket.
    assert_eq!(status(&app, "/", "192.0.2.1").await, 200);
    assert_eq!(status(&app, "/", "192.0.2.2").await, 200);
    assert_eq!(status(&app, "/", "192.0.2.3").await, 429);
}

#[tokio::test(start_paused = true)]
async fn a_network_key_composes_with_the_route() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&format!(
        "{}limiters:\n  per_network: {{ limit: 1, window: 60s, key: [country, route] }}\nroutes:\n  - {{ name: a, match: {{ path_prefix: /a }}, respond: {{ status: 200 }}, limiters: [per_network] }}\n  - {{ name: b, match: {{ path_prefix: /b }}, respond: {{ status: 200 }}, limiters: [per_network] }}\n",
        geoip(dir.path())
    ));
    assert_eq!(status(&app, "/a", "203.0.113.1").await, 200);
    assert_eq!(
        status(&app, "/b", "203.0.113.2").await,
        200,
        "its own count per route"
    );
    assert_eq!(
        status(&app, "/a", "203.0.113.3").await,
        429,
        "one count per country"
    );
    assert_eq!(
        status(&app, "/a", "198.51.100.1").await,
        200,
        "another country"
    );
}

#[tokio::test(start_paused = true)]
async fn a_route_matches_on_the_clients_country_or_network() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&format!(
        "{}routes:\n  - {{ name: de, match: {{ path_prefix: /, country: [de] }}, respond: {{ status: 200, body: de }} }}\n  - {{ name: net, match: {{ path_prefix: /, asn: [AS64501] }}, respond: {{ status: 200, body: net }} }}\n  - {{ name: rest, match: {{ path_prefix: / }}, respond: {{ status: 200, body: rest }} }}\n",
        geoip(dir.path())
    ));
    let body = |ip: &'static str| {
        let app = app.clone();
        async move { text(app.handle(get("/", &[]), from(&format!("{ip}:4000"))).await).await }
    };
    assert_eq!(body("203.0.113.7").await, "de");
    assert_eq!(body("198.51.100.7").await, "net");
    assert_eq!(body("192.0.2.7").await, "rest", "no entry matches no list");
}

#[tokio::test(start_paused = true)]
async fn access_rules_allow_and_deny_by_network_and_country() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&format!(
        "{}access: {{ deny: [country:FR] }}\nroutes:\n  - {{ name: staff, match: {{ path_prefix: /admin }}, access: {{ allow: [asn:64500, 192.0.2.9], deny: [all] }}, respond: {{ status: 200 }} }}\n  - {{ name: rest, match: {{ path_prefix: / }}, respond: {{ status: 200 }} }}\n",
        geoip(dir.path())
    ));
    assert_eq!(status(&app, "/admin", "203.0.113.7").await, 200, "its AS");
    assert_eq!(
        status(&app, "/admin", "2001:db8::7").await,
        200,
        "its AS, IPv6"
    );
    assert_eq!(
        status(&app, "/admin", "192.0.2.9").await,
        200,
        "its address"
    );
    assert_eq!(
        status(&app, "/admin", "192.0.2.10").await,
        403,
        "no entry: no AS"
    );
    assert_eq!(
        status(&app, "/", "198.51.100.7").await,
        403,
        "the site denies FR"
    );
    assert_eq!(status(&app, "/", "203.0.113.7").await, 200);
    assert_eq!(
        status(&app, "/", "192.0.2.10").await,
        200,
        "no country: not FR"
    );
}

#[test]
fn a_network_key_or_match_without_its_database_is_refused() {
    let keyed = "limiters:\n  l: { limit: 1, window: 1s, key: asn }\nroutes:\n  - { name: r, match: { path_prefix: / }, respond: { status: 200 }, limiters: [l] }\n";
    let err = tollgate::config::parse(keyed).unwrap_err().to_string();
    assert!(err.contains("`asn` needs `identity.geoip.asn_db`"), "{err}");
    let matched = "routes:\n  - { name: r, match: { path_prefix: /, country: [XX1] }, respond: { status: 200 } }\n";
    let err = tollgate::config::parse(matched).unwrap_err().to_string();
    assert!(err.contains("not a two-letter country code"), "{err}");
    assert!(err.contains("needs `identity.geoip.country_db`"), "{err}");
    let access = "access: { deny: [country:FR] }\nroutes:\n  - { name: r, match: { path_prefix: / }, access: { allow: [asn:64500], deny: [all] }, respond: { status: 200 } }\n";
    let err = tollgate::config::parse(access).unwrap_err().to_string();
    assert!(
        err.contains("`country:` entry needs `identity.geoip.country_db`"),
        "{err}"
    );
    assert!(
        err.contains("`asn:` entry needs `identity.geoip.asn_db`"),
        "{err}"
    );
    let broken = "identity:\n  geoip: { asn_db: /dev/null }\n";
    let err = tollgate::config::parse(broken).unwrap_err().to_string();
    assert!(err.contains("identity.geoip.asn_db"), "{err}");
}

#[tokio::test]
async fn a_database_replaced_while_running_is_used_without_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let asn = dir.path().join("asn.mmdb");
    write_asn_db(&asn, &[("127.0.0.0/8", 64500)]);
    let proxy = Proxy::start(&format!(
        "identity:\n  geoip: {{ asn_db: {}, check_every: 50ms }}\nroutes:\n  - {{ name: new, match: {{ path_prefix: /, asn: [64999] }}, respond: {{ status: 200, body: new }} }}\n  - {{ name: old, match: {{ path_prefix: / }}, respond: {{ status: 200, body: old }} }}\n",
        asn.display()
    ))
    .await;
    let body = || async {
        client()
            .get(proxy.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    assert_eq!(body().await, "old");
    write_asn_db(&asn, &[("127.0.0.0/8", 64999)]);
    let swapped = eventually(Duration::from_secs(10), || async { body().await == "new" }).await;
    assert!(swapped, "the new database never answered");
    let reloads = proxy
        .metric("tollgate_geoip_reloads_total{db=\"asn\",result=\"ok\"}")
        .await;
    assert_eq!(reloads, Some(1.0));
    // A broken file leaves the one in force.
    std::fs::write(&asn, b"not a database").unwrap();
    let refused = eventually(Duration::from_secs(10), || async {
        proxy
            .metric("tollgate_geoip_reloads_total{db=\"asn\",result=\"error\"}")
            .await
            == Some(1.0)
    })
    .await;
    assert!(refused);
    assert_eq!(body().await, "new");
}

#[tokio::test]
async fn the_access_log_and_the_ban_list_carry_the_asn_and_country() {
    let dir = tempfile::tempdir().unwrap();
    let (asn, country) = (dir.path().join("asn.mmdb"), dir.path().join("country.mmdb"));
    write_asn_db(&asn, &[("127.0.0.0/8", 64500)]);
    write_country_db(&country, &[("127.0.0.0/8", "DE")]);
    let proxy = Proxy::start(&format!(
        "log: {{ format: json }}\nidentity:\n  geoip: {{ asn_db: {}, country_db: {} }}\nlimiters:\n  strict: {{ limit: 1, window: 60s, key: ip, ban: {{ after: 1, for: 1h }} }}\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200 }}, limiters: [strict] }}\n",
        asn.display(),
        country.display()
    ))
    .await;
    let c = client();
    for _ in 0..3 {
        c.get(proxy.url("/")).send().await.unwrap();
    }
    let bans = get_json(&c, &proxy.admin_url("/bans")).await;
    assert_eq!(bans["bans"][0]["value"], "ip:127.0.0.1", "{bans}");
    assert_eq!(bans["bans"][0]["asn"], 64500);
    assert_eq!(bans["bans"][0]["country"], "DE");
    let records = proxy.access.wait_records(3).await;
    assert_eq!(records[0]["asn"], 64500, "{records:?}");
    assert_eq!(records[0]["country"], "DE");
}
