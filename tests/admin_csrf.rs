//! The admin API refuses state-changing calls sent by another site's page (cross-site request forgery), with or without a token, while the dashboard, curl and `tollgate reload` keep working: the headers a browser sends, and a real Chromium page.

mod common;

use std::time::Duration;

use common::{browser, client, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const SITE: &str =
    "routes:\n  - { name: site, match: { path_prefix: / }, respond: { status: 200 } }\n";

/// Reloads that were applied so far.
async fn reloads(proxy: &Proxy) -> f64 {
    proxy
        .metric(r#"tollgate_config_reloads_total{result="ok"}"#)
        .await
        .unwrap_or(0.0)
}

/// `POST /reload` with these headers: the status.
async fn post_reload(proxy: &Proxy, headers: &[(&str, &str)]) -> u16 {
    let mut req = client().post(proxy.admin_url("/reload"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_with_a_browsers_cross_site_headers_is_refused_and_one_without_a_page_is_not() {
    let proxy = Proxy::start(SITE).await;
    // What Chromium sends for `fetch(…, {method: "POST", mode: "no-cors"})` from another site.
    let from_elsewhere = [
        ("origin", "http://evil.example"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-mode", "no-cors"),
        ("sec-fetch-dest", "empty"),
    ];
    assert_eq!(post_reload(&proxy, &from_elsewhere).await, 403);
    // An older browser without Sec-Fetch-*: its Origin is enough.
    assert_eq!(
        post_reload(&proxy, &[("origin", "http://localhost:3000")]).await,
        403
    );
    let reset = client()
        .delete(proxy.admin_url("/status?key=127.0.0.1"))
        .header("origin", "null")
        .send()
        .await
        .unwrap();
    assert_eq!(reset.status(), 403);
    assert_eq!(reloads(&proxy).await, 0.0);
    assert_eq!(proxy.app.snapshot().version, 1);

    // curl, scripts and `tollgate reload` send no page headers; the dashboard sends its own origin.
    assert_eq!(post_reload(&proxy, &[]).await, 200);
    let own = format!("http://{}", proxy.admin);
    let same_origin = [("origin", own.as_str()), ("sec-fetch-site", "same-origin")];
    assert_eq!(post_reload(&proxy, &same_origin).await, 200);
    assert_eq!(reloads(&proxy).await, 2.0);
}

/// Serves `page` as HTML to every request on a port of its own; returns the port.
async fn serve_page(page: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = s.read(&mut head).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

/// Another site's page: a `no-cors` fetch and a form posted into a hidden
/// frame, both at the admin listener's `POST /reload`. Each writes down
/// that it got an answer, so the test knows the requests were sent.
const ATTACK: &str = r#"<!doctype html>
<html><body>
<pre id="log"></pre>
<iframe name="sink" id="sink"></iframe>
<form id="f" method="POST" action="ADMIN/reload" target="sink"></form>
<script>
function note(s) { document.getElementById('log').textContent += s + '\n'; }
fetch('ADMIN/reload', { method: 'POST', mode: 'no-cors' })
  .then(function () { note('fetch answered'); }, function (e) { note('fetch failed ' + e); });
var posted = false;
document.getElementById('sink').onload = function () { if (posted) note('form answered'); };
posted = true;
document.getElementById('f').submit();
</script>
</body></html>
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_site_in_chromium_cannot_make_the_admin_api_reload() {
    let proxy = Proxy::start(SITE).await;
    let page = ATTACK.replace("ADMIN", &format!("http://{}", proxy.admin));
    // Served as localhost: another site than the admin listener's 127.0.0.1.
    let url = format!("http://localhost:{}/", serve_page(page).await);
    let dom = tokio::task::spawn_blocking(move || browser::run(&url, &["--dump-dom"], 3_000))
        .await
        .unwrap();
    assert!(
        dom.contains("fetch answered") && dom.contains("form answered"),
        "the page's requests never reached the admin listener:\n{dom}"
    );
    assert_eq!(reloads(&proxy).await, 0.0, "{dom}");
    assert_eq!(proxy.app.snapshot().version, 1);
    // The listener still reloads for a caller without a page.
    assert_eq!(post_reload(&proxy, &[]).await, 200);
    assert_eq!(reloads(&proxy).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboards_own_state_changing_calls_still_work_in_chromium() {
    let proxy = Proxy::start(SITE).await;
    let mut b = common::cdp::Browser::launch(&[]).await;
    b.navigate(&format!("http://{}/", proxy.admin)).await;
    b.text_with("tollgate", Duration::from_secs(30)).await;
    // What the dashboard's Lift button does (DELETE /bans/{key}), and a reload, from its own origin.
    b.eval(
        "Promise.all([fetch('/reload', {method: 'POST'}), fetch('/bans/nobody', {method: 'DELETE'})])
           .then(function (r) { document.body.innerText = 'statuses ' + r[0].status + ' ' + r[1].status; })",
    )
    .await;
    let text = b.text_with("statuses", Duration::from_secs(30)).await;
    assert_eq!(text.trim(), "statuses 200 404");
    assert_eq!(reloads(&proxy).await, 1.0);
}
