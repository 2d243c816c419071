//! A real PHP backend (`php -S`, php-cli) behind tollgate: what `$_SERVER` says about the client, and that limits stop requests before PHP.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::certs::{self, Ca, Session};
use common::php::PhpServer;
use common::{raw, status_of, Proxy, Reply};
use tollgate::clock::{ManualClock, SystemClock};

/// The app docker-compose.yml serves: it prints the `$_SERVER` fields as JSON.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docker/compose/app/index.php");

/// `php -S` serving [`SCRIPT`]; every request it gets is counted.
fn start_php(dir: &Path) -> PhpServer {
    PhpServer::start(Path::new(SCRIPT), dir, 1)
}

#[tokio::test]
async fn php_sees_the_client_over_https_and_never_a_spoofed_forwarded_for_first() {
    let dir = tempfile::tempdir().unwrap();
    let php = start_php(dir.path());
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["shop.test"]).write(dir.path(), "shop");
    let yaml = format!(
        "server:\n  tls: {{ cert: \"{}\", key: \"{}\" }}\nupstreams:\n  php: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        cert.display(),
        key.display(),
        php.addr
    );
    let proxy = Proxy::start_in(&yaml, Arc::new(SystemClock), dir, None).await;
    let stream = certs::handshake(proxy.addr, "shop.test", ca.client(&[b"h2"]))
        .await
        .unwrap();
    let mut session = Session::start(stream).await;
    let spoof = [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-real-ip", "6.6.6.6"),
        ("x-forwarded-proto", "http"),
    ];
    let r = session.get("shop.test", "/index.php?a=1", &spoof).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let server = r.json();
    assert_eq!(server["REMOTE_ADDR"], "127.0.0.1", "PHP's peer is tollgate");
    assert_eq!(server["HTTP_X_REAL_IP"], "127.0.0.1");
    assert_eq!(server["HTTP_X_FORWARDED_FOR"], "127.0.0.1");
    assert_eq!(server["HTTP_X_FORWARDED_PROTO"], "https");
    assert_eq!(server["HTTP_HOST"], "shop.test");
    assert_eq!(server["REQUEST_URI"], "/index.php?a=1");
    assert_eq!(php.hits().len(), 1);
}

#[tokio::test]
async fn behind_a_trusted_load_balancer_php_gets_the_real_client_and_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let php = start_php(dir.path());
    let yaml = format!(
        "identity: {{ trusted_proxies: [\"127.0.0.1/32\"] }}\nupstreams:\n  php: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php }}\n",
        php.addr
    );
    let proxy = Proxy::start_in(&yaml, Arc::new(SystemClock), dir, None).await;
    let answer = raw(
        proxy.addr,
        b"GET / HTTP/1.1\r\nHost: shop.test\r\nX-Forwarded-For: 6.6.6.6, 198.51.100.7\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let server = Reply::parse(&answer).expect("an HTTP answer").json();
    // The load balancer (127.0.0.1, trusted) says its client was 198.51.100.7;
    // 6.6.6.6 is what that client claimed and nobody vouches for.
    assert_eq!(server["HTTP_X_REAL_IP"], "198.51.100.7");
    assert_eq!(
        server["HTTP_X_FORWARDED_FOR"],
        "6.6.6.6, 198.51.100.7, 127.0.0.1"
    );
    assert_eq!(server["HTTP_X_FORWARDED_PROTO"], "http");
}

#[tokio::test]
async fn the_limit_answers_429_itself_and_php_never_sees_those_requests() {
    let dir = tempfile::tempdir().unwrap();
    let php = start_php(dir.path());
    let yaml = format!(
        "upstreams:\n  php: {{ url: \"http://{}\" }}\nlimiters:\n  strict: {{ algorithm: fixed_window, limit: 3, window: 60s, key: client }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: php, limiters: [strict] }}\n",
        php.addr
    );
    // The clock stands still 20 s into a minute: the window cannot end mid-test.
    let proxy = Proxy::start_in(&yaml, ManualClock::at(common::T0), dir, None).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let answer = raw(
            proxy.addr,
            b"GET /login HTTP/1.1\r\nHost: shop.test\r\nX-Forwarded-For: 10.9.9.9\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        )
        .await;
        statuses.push(status_of(&answer));
        if status_of(&answer) == 429 {
            let lower = answer.to_ascii_lowercase();
            assert!(
                lower.contains("content-type: application/problem+json"),
                "{answer}"
            );
            assert!(lower.contains("retry-after:"), "{answer}");
        }
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(
        php.hits().len(),
        3,
        "the rejected requests never reached PHP"
    );
}
