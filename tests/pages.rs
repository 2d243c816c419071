//! tollgate's own errors as a browser and as an API client see them: an HTML page when `Accept` prefers one, problem+json otherwise, the operator's pages, and routes that keep to JSON.

mod common;

use common::app::{app, from, get as app_get, text};
use common::{browser, client, free_addr, send, Answer, Proxy};

/// A browser's navigation `Accept` (Chromium's).
const BROWSER: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7";

/// `/limited` allows one request a day (a minute's window could roll over
/// while a loaded machine starts Chromium; `again` is for a test's own
/// route); `/down/…` goes to an upstream nobody listens on; `/api/…` keeps
/// to JSON; nothing else has a route.
fn site(server: &str, limited: &str, routes: &str) -> String {
    format!(
        r#"server: {{ {server} }}
upstreams:
  down: {{ url: "http://{down}", connect_timeout: 2s }}
limiters:
  once: {{ limit: 1, window: 1d }}
  again: {{ limit: 1, window: 1d }}
routes:
  - {{ name: limited, match: {{ path: /limited }}, respond: {{ status: 200, body: ok }}, limiters: [once] {limited} }}
  - {{ name: down, match: {{ path_prefix: /down }}, upstream: down }}
  - {{ name: api, match: {{ path_prefix: /api }}, upstream: down, error_format: json }}
{routes}"#,
        down = free_addr()
    )
}

async fn get(proxy: &Proxy, path: &str, accept: Option<&str>) -> Answer {
    let mut req = client().get(proxy.url(path));
    if let Some(accept) = accept {
        req = req.header("accept", accept);
    }
    send(req).await
}

async fn dom(url: String) -> String {
    tokio::task::spawn_blocking(move || browser::run(&url, &["--dump-dom"], 2_000))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_sees_html_pages_for_a_missing_page_a_rate_limited_page_and_a_down_upstream() {
    let proxy = Proxy::start(&site("", "", "")).await;
    // The one request the day allows: the browser's is the second.
    assert_eq!(get(&proxy, "/limited", None).await.status, 200);

    let cases = [
        (
            "/no/such/page",
            "Not Found",
            "There is nothing at this address.",
        ),
        (
            "/limited",
            "Too Many Requests",
            "Too many requests have come from you. Please wait",
        ),
        ("/down/home", "Bad Gateway", "could not be reached"),
    ];
    for (path, heading, sentence) in cases {
        let page = dom(proxy.url(path)).await;
        assert!(
            page.contains(&format!("<h1>{heading}</h1>")),
            "{path}: no <h1>{heading}</h1> in the DOM:\n{page}"
        );
        assert!(
            page.contains(sentence),
            "{path}: {sentence:?} missing:\n{page}"
        );
        // A JSON body would be shown as text in a <pre>.
        assert!(
            !page.contains("\"type\""),
            "{path}: JSON in the page:\n{page}"
        );
    }
    // What the browser got, as the access log saw it: each page with its status.
    let lines = proxy.access.wait_lines(4).await;
    for (path, status) in [
        ("/no/such/page", " 404 "),
        ("/limited", " 429 "),
        ("/down/home", " 502 "),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(path) && l.contains(status) && l.contains("HeadlessChrome")),
            "no browser request for {path} answered{status}in {lines:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_prefer_html_gets_problem_json_for_the_same_errors() {
    let proxy = Proxy::start(&site("", "", "")).await;
    assert_eq!(get(&proxy, "/limited", None).await.status, 200);
    for accept in [
        None,
        Some("*/*"),
        Some("application/json"),
        Some("text/html;q=0.5, */*"),
    ] {
        for (path, status, kind) in [
            ("/no/such/page", 404, "no-route"),
            ("/limited", 429, "rate-limit-exceeded"),
            ("/down/home", 502, "upstream-unreachable"),
        ] {
            let a = get(&proxy, path, accept).await;
            assert_eq!(a.status, status, "{path} with {accept:?}");
            assert_eq!(
                a.headers["content-type"], "application/problem+json",
                "{path} with {accept:?}"
            );
            assert_eq!(a.json()["type"], kind, "{path} with {accept:?}");
            // The answer depends on Accept: a cache must not serve it to a browser.
            assert_eq!(a.headers["vary"], "accept", "{path} with {accept:?}");
        }
    }
}

/// Its subject is the page, not a socket: on the in-process app with
/// paused time both answers are made in the same virtual second, so their
/// `Retry-After` can be compared exactly.
#[tokio::test(start_paused = true)]
async fn a_page_has_the_same_headers_as_the_json_it_replaces() {
    let app = app(&site("", "", ""));
    let limited = |accept: &'static [(&'static str, &'static str)]| {
        app.handle(app_get("/limited", accept), from("203.0.113.9:40000"))
    };
    assert_eq!(limited(&[]).await.status(), 200);
    let json = limited(&[]).await;
    let page = limited(&[("accept", BROWSER)]).await;
    assert_eq!(page.status(), 429);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let names = |h: &http::HeaderMap| {
        let mut n: Vec<String> = h.keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    };
    assert_eq!(names(page.headers()), names(json.headers()));
    for name in [
        "retry-after",
        "cache-control",
        "ratelimit",
        "x-ratelimit-remaining",
    ] {
        assert_eq!(page.headers()[name], json.headers()[name], "{name}");
    }
    let id = page.headers()["x-request-id"].to_str().unwrap().to_string();
    let wait = page.headers()["retry-after"].to_str().unwrap().to_string();
    let body = text(page).await;
    assert!(body.contains(&format!("request {id}")), "{body}");
    assert!(
        body.contains(&format!("Please wait {wait} seconds")),
        "{body}"
    );
    // Self-contained: nothing in it makes the browser fetch anything.
    for fetches in ["<script", "<link", "<img", "src=", "url("] {
        assert!(!body.contains(fetches), "{fetches} in {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_pages_fill_their_placeholders_and_a_routes_page_wins_over_the_servers() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let not_found = write(
        "404.html",
        "<h1>Lost?</h1><p>{{status}} id={{request_id}}</p>",
    );
    let busy = write(
        "429.html",
        "<p>server page: {{status}} wait {{retry_after}}s ({{limiter}}) {{unknown}}</p>",
    );
    let limited = write(
        "limited-429.html",
        "<p>route page: wait {{retry_after}}s, {{limiter}}</p>",
    );
    let yaml = site(
        &format!(r#"error_pages: {{ 404: "{not_found}", 429: "{busy}" }}"#),
        &format!(r#", error_pages: {{ 429: "{limited}" }}"#),
        "  - { name: other, match: { path: /other }, respond: { status: 200 }, limiters: [again] }\n",
    );
    let proxy = Proxy::start(&yaml).await;

    let lost = get(&proxy, "/nowhere", Some(BROWSER)).await;
    assert_eq!(lost.status, 404);
    assert_eq!(lost.headers["content-type"], "text/html; charset=utf-8");
    let id = lost.headers["x-request-id"].to_str().unwrap();
    assert_eq!(lost.body, format!("<h1>Lost?</h1><p>404 id={id}</p>"));

    // `/limited` has its own 429 page; `/other` gets the server's.
    assert_eq!(get(&proxy, "/limited", None).await.status, 200);
    let route_page = get(&proxy, "/limited", Some(BROWSER)).await;
    assert_eq!(route_page.status, 429);
    let wait = route_page.headers["retry-after"].to_str().unwrap();
    assert_eq!(
        route_page.body,
        format!("<p>route page: wait {wait}s, once</p>")
    );

    assert_eq!(get(&proxy, "/other", None).await.status, 200);
    let server_page = get(&proxy, "/other", Some(BROWSER)).await;
    let wait = server_page.headers["retry-after"].to_str().unwrap();
    assert_eq!(
        server_page.body,
        format!("<p>server page: 429 wait {wait}s (again) {{{{unknown}}}}</p>")
    );

    // A status with no page of the operator's gets the built-in one.
    let down = get(&proxy, "/down/x", Some(BROWSER)).await;
    assert_eq!(down.status, 502);
    assert!(down.body.contains("<h1>Bad Gateway</h1>"), "{}", down.body);

    // And an API client still reads problem+json.
    let api = get(&proxy, "/nowhere", Some("application/json")).await;
    assert_eq!(api.json()["type"], "no-route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_route_forced_to_json_answers_a_browser_with_problem_json() {
    let proxy = Proxy::start(&site("", "", "")).await;
    let api = get(&proxy, "/api/users", Some(BROWSER)).await;
    assert_eq!(api.status, 502);
    assert_eq!(api.headers["content-type"], "application/problem+json");
    assert_eq!(api.json()["type"], "upstream-unreachable");
    // Not negotiated: no `Vary: Accept` (compression's `Accept-Encoding` may be there).
    let vary: Vec<_> = api.headers.get_all("vary").iter().collect();
    assert!(
        !vary
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"accept")),
        "{vary:?}"
    );
    // The same browser on a negotiating route gets a page.
    let page = get(&proxy, "/down/users", Some(BROWSER)).await;
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");

    // `server.error_format: json` keeps every route to JSON unless one says otherwise.
    let all_json = Proxy::start(&site("error_format: json", "", "")).await;
    let lost = get(&all_json, "/nowhere", Some(BROWSER)).await;
    assert_eq!(lost.headers["content-type"], "application/problem+json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fastcgi_404_is_negotiated_and_names_the_request_like_every_other_error() {
    let root = tempfile::tempdir().unwrap();
    // php-fpm is never asked: a path naming no file is answered by tollgate itself.
    let yaml = format!(
        r#"upstreams:
  php: {{ url: "fastcgi://{}", root: "{}" }}
routes:
  - {{ name: site, match: {{ path_prefix: / }}, upstream: php }}
"#,
        free_addr(),
        root.path().display()
    );
    let proxy = Proxy::start(&yaml).await;
    let page = get(&proxy, "/missing.html", Some(BROWSER)).await;
    assert_eq!(page.status, 404);
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");
    assert!(page.body.contains("<h1>Not Found</h1>"), "{}", page.body);
    let json = get(&proxy, "/missing.html", None).await;
    assert_eq!(json.headers["content-type"], "application/problem+json");
    let id = json.headers["x-request-id"].to_str().unwrap();
    assert_eq!(json.json()["request_id"], id);
    assert_eq!(json.json()["type"], "not-found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_the_config_answers_itself_is_not_rewritten_into_a_page() {
    let yaml = "routes:\n  - { name: gone, match: { path: /gone }, respond: { status: 404, body: gone } }\n";
    let proxy = Proxy::start(yaml).await;
    // A `respond` route's answer (like an upstream's own 404) is the site's, not tollgate's error.
    let a = get(&proxy, "/gone", Some(BROWSER)).await;
    assert_eq!(a.status, 404);
    assert_eq!(a.body, "gone");
    assert_eq!(a.headers["content-type"], "text/plain; charset=utf-8");
}
