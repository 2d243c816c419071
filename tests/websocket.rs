//! WebSockets through tollgate over real sockets: echo both ways, limited at the handshake, slots held for the tunnel's life, idle timeout, shutdown.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{client, eventually, get_json, Proxy, WsEcho};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

type Ws = WebSocketStream<TcpStream>;

/// `/ws` goes to the echo upstream with `limiters` on the route; `extra` is
/// appended to the upstream's keys and `tail` to the document.
fn config(echo: &WsEcho, extra: &str, limiters: &str, tail: &str) -> String {
    format!(
        "upstreams:\n  ws: {{ url: \"{}\"{extra} }}\n{limiters}routes:\n  - {{ name: ws, match: {{ path_prefix: /ws }}, upstream: ws, limiters: [{}] }}\n{tail}",
        echo.url(),
        if limiters.is_empty() { "" } else { "one" },
    )
}

/// A WebSocket handshake through the proxy: the socket, or the HTTP status that refused it.
async fn connect(proxy: &Proxy) -> Result<Ws, u16> {
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let url = format!("ws://{}/ws/chat", proxy.addr);
    match tokio_tungstenite::client_async(url, stream).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.status(), 101);
            Ok(ws)
        }
        Err(WsError::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("handshake failed: {e}"),
    }
}

async fn echo_once(ws: &mut Ws, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("an echo within 5 s")
        .expect("the tunnel is open")
        .unwrap();
    assert_eq!(back, Message::text(text));
}

#[tokio::test]
async fn a_websocket_echo_passes_through_tollgate_both_ways() {
    let echo = WsEcho::start().await;
    let proxy = Proxy::start(&config(&echo, "", "", "")).await;
    let mut ws = connect(&proxy).await.unwrap();
    echo_once(&mut ws, "hello").await;
    let big = "x".repeat(200_000);
    echo_once(&mut ws, &big).await;
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::binary(vec![0u8, 1, 2, 255])
    );
    ws.close(None).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || async {
            echo.closed.load(Ordering::SeqCst) == 1
        })
        .await,
        "the upstream sees the close"
    );
    assert_eq!(echo.opened.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_handshake_over_the_limit_gets_429_and_never_reaches_the_upstream() {
    let echo = WsEcho::start().await;
    let limiters = "limiters:\n  one: { limit: 2, window: 1h }\n";
    let proxy = Proxy::start(&config(&echo, "", limiters, "")).await;
    let mut first = connect(&proxy).await.unwrap();
    let mut second = connect(&proxy).await.unwrap();
    assert_eq!(connect(&proxy).await.err(), Some(429));
    // A limit is counted per handshake, never per message.
    for i in 0..10 {
        echo_once(&mut first, &format!("m{i}")).await;
    }
    echo_once(&mut second, "still open").await;
    assert_eq!(echo.opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_tunnel_holds_its_concurrency_slot_and_server_place_until_it_closes() {
    let echo = WsEcho::start().await;
    let limiters = "limiters:\n  one: { algorithm: concurrency, max_in_flight: 1, key: global }\n";
    let proxy = Proxy::start(&config(&echo, "", limiters, "")).await;
    let mut ws = connect(&proxy).await.unwrap();
    echo_once(&mut ws, "a").await;
    // Long after the handshake, the open tunnel still holds the only slot.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(connect(&proxy).await.err(), Some(429));
    let state = get_json(&client(), &proxy.admin_url("/upstreams")).await;
    assert_eq!(
        state["upstreams"][0]["servers"][0]["in_flight"], 1,
        "{state}"
    );
    let metrics = proxy.metrics().await;
    assert!(metrics.contains("tollgate_tunnels_open 1\n"), "{metrics}");

    ws.close(None).await.unwrap();
    drop(ws);
    let again = std::cell::RefCell::new(None);
    let reconnected = eventually(Duration::from_secs(5), || async {
        match connect(&proxy).await {
            Ok(ws) => {
                *again.borrow_mut() = Some(ws);
                true
            }
            Err(429) => false,
            Err(s) => panic!("unexpected {s}"),
        }
    })
    .await;
    assert!(reconnected, "the slot came back when the tunnel closed");
    let mut again = again.into_inner().expect("connected");
    echo_once(&mut again, "b").await;
}

#[tokio::test]
async fn a_silent_tunnel_is_closed_after_tunnel_idle_timeout() {
    let echo = WsEcho::start().await;
    let proxy = Proxy::start(&config(&echo, ", tunnel_idle_timeout: 300ms", "", "")).await;
    let mut ws = connect(&proxy).await.unwrap();
    echo_once(&mut ws, "a").await;
    let end = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("closed well within 5 s");
    assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
    assert!(
        eventually(Duration::from_secs(5), || async {
            echo.closed.load(Ordering::SeqCst) == 1
        })
        .await,
        "the upstream side closes too"
    );
}

#[tokio::test]
async fn shutdown_closes_an_open_tunnel_after_the_grace_period() {
    let echo = WsEcho::start().await;
    let tail = "server: { shutdown_grace: 500ms }\n";
    let mut proxy = Proxy::start(&config(&echo, "", "", tail)).await;
    let mut ws = connect(&proxy).await.unwrap();
    echo_once(&mut ws, "a").await;
    let started = std::time::Instant::now();
    let done = proxy.begin_shutdown();
    // Still open during the grace period.
    echo_once(&mut ws, "during grace").await;
    tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .expect("shutdown finishes")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400));
    let end = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("the tunnel is closed");
    assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
}

#[tokio::test]
async fn a_websocket_over_http2_extended_connect_reaches_an_http1_upstream() {
    use http_body_util::Empty;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio_tungstenite::tungstenite::protocol::Role;

    let echo = WsEcho::start().await;
    let limiters = "limiters:\n  one: { limit: 1, window: 1h }\n";
    let tail = "  - { name: ping, match: { path: /ping }, respond: { status: 200 } }\n";
    let proxy = Proxy::start(&config(&echo, "", limiters, tail)).await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake::<_, _, Empty<bytes::Bytes>>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    // One plain exchange first, so the server's SETTINGS (with
    // ENABLE_CONNECT_PROTOCOL) have arrived before the CONNECT.
    let ping = http::Request::get(format!("http://{}/ping", proxy.addr))
        .body(Empty::new())
        .unwrap();
    assert_eq!(sender.send_request(ping).await.unwrap().status(), 200);

    let connect = |sender: &mut hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>| {
        let mut req = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(format!("http://{}/ws/chat", proxy.addr))
            .header("sec-websocket-version", "13")
            .body(Empty::new())
            .unwrap();
        req.extensions_mut()
            .insert(hyper::ext::Protocol::from_static("websocket"));
        sender.send_request(req)
    };
    let resp = connect(&mut sender).await.unwrap();
    assert_eq!(resp.status(), 200);
    let upgraded = hyper::upgrade::on(resp).await.unwrap();
    let mut ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    ws.send(Message::text("over h2")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("over h2"));
    // The same limit as a GET handshake: the second one is refused.
    let second = connect(&mut sender).await.unwrap();
    assert_eq!(second.status(), 429);
    assert_eq!(echo.opened.load(Ordering::SeqCst), 1);
}
