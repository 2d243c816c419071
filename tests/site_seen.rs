//! What site rules leave to be seen: `/metrics` and `/dashboard.json` count their answers by kind, and the access log names the rule that answered.

mod common;

use common::{client, Proxy};

const YAML: &str = r#"
log: { access: true, format: json }
routes:
  - { name: old, match: { path_regex: '^/old/(.*)$' }, redirect: { to: '/new/$1' } }
  - { name: gone, match: { path: /xmlrpc.php }, respond: { status: 403 } }
  - { name: staff, match: { path_prefix: /admin }, access: { allow: [192.0.2.0/24], deny: [all] }, respond: { status: 200 } }
  - { name: rest, match: { path_prefix: / }, respond: { status: 200, body: ok } }
"#;

#[tokio::test]
async fn answers_are_counted_by_rule_kind_and_logged_with_their_rule() {
    let proxy = Proxy::start(YAML).await;
    let c = client();
    for path in ["/old/a", "/old/b", "/xmlrpc.php", "/admin", "/"] {
        c.get(proxy.url(path)).send().await.unwrap();
    }
    let metrics = proxy.metrics().await;
    for series in [
        r#"tollgate_site_answers_total{route="old",kind="redirect"} 2"#,
        r#"tollgate_site_answers_total{route="gone",kind="respond"} 1"#,
        r#"tollgate_site_answers_total{route="staff",kind="denied"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} in:\n{metrics}");
    }
    assert!(
        !metrics.contains(r#"route="rest",kind="denied""#),
        "no series for a rule the route does not have"
    );
    let body = c
        .get(proxy.admin_url("/dashboard.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let d: serde_json::Value = serde_json::from_str(&body).unwrap();
    let old = d["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "old")
        .unwrap();
    assert_eq!(old["site_answers"]["redirect"], 2);
    let records = proxy.access.wait_records(5).await;
    let rules: Vec<Option<&str>> = records.iter().map(|r| r["rule"].as_str()).collect();
    assert_eq!(
        rules,
        [
            Some("redirect"),
            Some("redirect"),
            Some("respond"),
            Some("access"),
            Some("respond")
        ]
    );
}
