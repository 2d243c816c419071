//! The gentler challenge: the no-JavaScript tier (`mode: metarefresh`) passed by a client that follows the refresh and keeps cookies, never by one that does not; its pass opens no proof-of-work route; robots.txt, `/.well-known/`, favicon.ico and feeds never challenged; link-preview fetchers let through only from the network their rule names.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::app::{app, from, get, text};
use common::Proxy;
use http::StatusCode;
use tollgate::app::App;

const SECRET: &str = "fedcba9876543210fedcba9876543210-the-new-secret";
const HTML: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
const CLIENT: &str = "203.0.113.9:40000";

fn secret_file(dir: &Path) -> PathBuf {
    let path = dir.join("pass.keys");
    std::fs::write(&path, format!("{SECRET}\n")).unwrap();
    path
}

/// `/easy/` behind the no-JavaScript tier, everything else behind a proof
/// of work of 8 bits (both `always`); `extra` is added to the second's challenge.
fn yaml(keys: &Path, extra: &str) -> String {
    format!(
        r#"
identity: {{ pass: {{ secret_file: "{}" }} }}
routes:
  - name: easy
    match: {{ path_prefix: /easy/ }}
    respond: {{ status: 200, body: "easy page\n" }}
    challenge: {{ mode: metarefresh, when: always }}
  - name: hard
    match: {{ path_prefix: / }}
    respond: {{ status: 200, body: "hard page\n" }}
    challenge: {{ when: always, difficulty: 8{extra} }}
"#,
        keys.display()
    )
}

/// The refresh URL a page names, as a script reading it would take it:
/// the `url=` of its `<meta http-equiv="refresh">`, HTML-unescaped.
fn refresh_url_of(page: &str) -> String {
    let at = page.find("url=").expect("a refresh URL") + 4;
    page[at..].split('"').next().unwrap().replace("&amp;", "&")
}

async fn browse(
    app: &App,
    path: &str,
    cookie: Option<&str>,
) -> (StatusCode, String, http::HeaderMap) {
    let mut headers = vec![("accept", HTML)];
    if let Some(c) = cookie {
        headers.push(("cookie", c));
    }
    let resp = app.handle(get(path, &headers), from(CLIENT)).await;
    let (status, h) = (resp.status(), resp.headers().clone());
    (status, text(resp).await, h)
}

/// Follows the no-JavaScript tier for `path`: the pass cookie (`name=value`).
async fn refresh_pass(app: &App, path: &str) -> String {
    let (status, page, headers) = browse(app, path, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(page.contains("http-equiv=\"refresh\""), "{page}");
    assert!(!page.contains("<script"), "no JavaScript: {page}");
    assert_eq!(headers["cache-control"], "no-store");
    let (status, _, headers) = browse(app, &refresh_url_of(&page), None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], path);
    let set = headers["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

#[tokio::test(start_paused = true)]
async fn a_metarefresh_pass_opens_its_tier_and_no_proof_of_work_route() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&yaml(&secret_file(dir.path()), ""));
    let cookie = refresh_pass(&app, "/easy/a?x=1").await;
    let (status, body, _) = browse(&app, "/easy/b", Some(&cookie)).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "easy page\n"));
    let (status, body, _) = browse(&app, "/wiki", Some(&cookie)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body.contains("name=\"c\""),
        "the proof-of-work page: {body}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refresh_url_holds_for_one_minute_for_its_own_address_block_only() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(&yaml(&secret_file(dir.path()), ""));
    let (_, page, _) = browse(&app, "/easy/", None).await;
    let url = refresh_url_of(&page);
    let elsewhere = app
        .handle(get(&url, &[("accept", HTML)]), from("198.51.100.7:40000"))
        .await;
    assert_eq!(elsewhere.status(), StatusCode::BAD_REQUEST);
    assert!(elsewhere.headers().get("set-cookie").is_none());
    let forged = url.replacen("c=", "c=0", 1);
    assert_eq!(browse(&app, &forged, None).await.0, StatusCode::BAD_REQUEST);
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(browse(&app, &url, None).await.0, StatusCode::BAD_REQUEST);
}

#[tokio::test(start_paused = true)]
async fn robots_well_known_favicon_and_feeds_are_never_challenged_on_an_always_route() {
    let dir = tempfile::tempdir().unwrap();
    let keys = secret_file(dir.path());
    let app = app(&yaml(&keys, ""));
    for path in [
        "/robots.txt",
        "/.well-known/x",
        "/favicon.ico",
        "/feed/",
        "/blog/atom.xml",
    ] {
        let (status, body, _) = browse(&app, path, None).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "hard page\n"),
            "{path}"
        );
    }
    let feed = [("accept", "application/atom+xml, text/html;q=0.9")];
    let resp = app.handle(get("/blog", &feed), from(CLIENT)).await;
    assert_eq!(resp.status(), StatusCode::OK, "a feed by Accept");
    assert_eq!(browse(&app, "/blog", None).await.0, StatusCode::FORBIDDEN);
    // Turned off, they are challenged as any page.
    let strict = common::app::app(&yaml(&keys, ", exempt_public: false"));
    assert_eq!(
        browse(&strict, "/robots.txt", None).await.0,
        StatusCode::FORBIDDEN
    );
}

/// Runs curl (Accept as a browser's) with `args`, off the runtime; its stdout.
async fn curl(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-s", "-H", &format!("Accept: {HTML}")])
            .args(&args)
            .output()
            .expect("curl runs")
    })
    .await
    .unwrap();
    assert!(out.status.success(), "curl: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn curl_with_a_cookie_jar_passes_the_no_javascript_tier_and_without_one_never_does() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(&yaml(&secret_file(dir.path()), "")).await;
    let jar = dir.path().join("jar.txt");
    let jar = jar.to_str().unwrap();
    let code = "\n%{http_code}";
    // Without a jar: the refresh is followed, the cookie is set and not kept.
    let page = curl(&[&proxy.url("/easy/post")]).await;
    let url = proxy.url(&refresh_url_of(&page));
    let bare = curl(&["-L", &url, "-w", code]).await;
    assert!(bare.ends_with("\n403"), "{bare}");
    assert!(
        bare.contains("http-equiv=\"refresh\""),
        "the page again: {bare}"
    );
    // With one: through, and through again on the next request.
    let page = curl(&["-c", jar, "-b", jar, &proxy.url("/easy/post")]).await;
    let url = proxy.url(&refresh_url_of(&page));
    let through = curl(&["-L", "-c", jar, "-b", jar, &url, "-w", code]).await;
    assert_eq!(through, "easy page\n\n200");
    let again = curl(&["-b", jar, &proxy.url("/easy/other"), "-w", code]).await;
    assert_eq!(again, "easy page\n\n200");
}

/// A link-preview fetcher verified by its network: `verify` with `asn`,
/// on an `always` route that refuses crawlers its network refutes.
#[tokio::test(start_paused = true)]
async fn a_link_preview_fetcher_passes_only_from_the_network_its_rule_names() {
    let dir = tempfile::tempdir().unwrap();
    let asn = dir.path().join("asn.mmdb");
    common::geoip::write_asn_db(
        &asn,
        &[("203.0.113.0/24", 64500), ("198.51.100.0/24", 64501)],
    );
    let app = app(&format!(
        r#"
identity:
  geoip: {{ asn_db: "{}" }}
  pass:
    secret_file: "{}"
    crawlers: {{ verify: [{{ user_agent: facebookexternalhit, asn: [64500] }}] }}
routes:
  - name: page
    match: {{ path_prefix: / }}
    respond: {{ status: 200, body: "page\n" }}
    challenge: {{ when: always, unverified_crawlers: refuse }}
"#,
        asn.display(),
        secret_file(dir.path()).display()
    ));
    let preview = |peer: &'static str| {
        let app = app.clone();
        async move {
            let ua = ("user-agent", "facebookexternalhit/1.1");
            let resp = app
                .handle(get("/post/1", &[ua, ("accept", HTML)]), from(peer))
                .await;
            let status = resp.status();
            (status, text(resp).await)
        }
    };
    assert_eq!(
        preview("203.0.113.7:4000").await,
        (StatusCode::OK, "page\n".into())
    );
    let (status, body) = preview("198.51.100.7:4000").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body.contains("names a crawler that this address does not belong to"),
        "{body}"
    );
    // A browser from the fetcher's network is still challenged.
    let (status, body, _) = browse(&app, "/post/1", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("name=\"c\""), "{body}");
}

#[test]
fn a_crawler_verified_by_network_without_the_asn_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "identity:\n  pass:\n    secret_file: \"{}\"\n    crawlers: {{ verify: [{{ user_agent: twitterbot, asn: [AS13414] }}, {{ user_agent: x }}] }}\n",
        secret_file(dir.path()).display()
    );
    let err = tollgate::config::parse(&yaml).unwrap_err().to_string();
    assert!(
        err.contains("identity.pass.crawlers.verify[0].asn"),
        "{err}"
    );
    assert!(err.contains("needs `identity.geoip.asn_db`"), "{err}");
    assert!(err.contains("at least one domain or asn"), "{err}");
}
