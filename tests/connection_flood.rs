//! At `server.max_connections`, a flood of new connections from other addresses displaces its own connections, never a kept-alive client that behaves.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{connect_from, eventually, read_until, Proxy};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const CAP: usize = 50;
/// New connections per round: more than the cap, so between two requests
/// of the client every other place at the cap has changed hands.
const FLOOD_PER_ROUND: usize = 60;
const ROUNDS: usize = 50;

/// One request on `s`: whether `pong` came back (false: closed, or 5 s passed).
async fn ask(s: &mut TcpStream) -> bool {
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .is_ok()
        && read_until(s, b"pong").await
}

/// `n` flood connections from 127.0.0.2–6 in turn: every third completes
/// a request and stays open between requests, the others never send a byte.
async fn flood(to: SocketAddr, n: usize, held: &mut Vec<TcpStream>) {
    for i in 0..n {
        let mut s = connect_from(Ipv4Addr::new(127, 0, 0, 2 + (i % 5) as u8), to).await;
        if i % 3 == 0 {
            ask(&mut s).await;
        }
        held.push(s);
    }
}

fn displaced(proxy: &Proxy) -> u64 {
    ["no_request", "idle"]
        .iter()
        .map(|state| {
            let c = proxy
                .app
                .shared
                .metrics
                .counter("tollgate_connections_displaced_total", &[("state", state)]);
            c.load(Ordering::Relaxed)
        })
        .sum()
}

/// Every round, the client's request goes while the round's flood arrives;
/// the next starts only once the flood has taken `FLOOD_PER_ROUND` places
/// (the displacement counter says so): the verdict waits on events, never
/// on how fast the machine opens connections. With the client idle the
/// whole time its places changed hands, the old rule (the connection
/// waiting longest goes first) displaced it every round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_client_gets_every_answer_while_a_flood_turns_the_cap_over() {
    let proxy = Proxy::start(&format!(
        "routes:\n  - {{ name: rest, match: {{ path_prefix: / }}, respond: {{ status: 200, body: pong }} }}\nserver: {{ max_connections: {CAP}, request_header_timeout: 60s, idle_timeout: 120s }}\n"
    ))
    .await;
    let to = proxy.addr;
    let mut client = connect_from(Ipv4Addr::LOCALHOST, to).await;
    assert!(ask(&mut client).await, "the client's first request");
    let mut held = Vec::new();
    flood(to, CAP - 1, &mut held).await;
    let full = eventually(Duration::from_secs(10), || async {
        proxy.app.shared.connections.open() == CAP
    })
    .await;
    assert!(full, "the cap never filled");
    let mut answered = 0;
    for round in 0..ROUNDS {
        let before = displaced(&proxy);
        let (ok, ()) = tokio::join!(ask(&mut client), flood(to, FLOOD_PER_ROUND, &mut held));
        if ok {
            answered += 1;
        } else {
            // Displaced: a new connection for the next round, as a browser would.
            client = connect_from(Ipv4Addr::LOCALHOST, to).await;
            assert!(ask(&mut client).await, "round {round}: a new connection");
        }
        let turned_over = eventually(Duration::from_secs(10), || async {
            displaced(&proxy) >= before + FLOOD_PER_ROUND as u64
        })
        .await;
        assert!(
            turned_over,
            "round {round}: the flood took {} places",
            displaced(&proxy) - before
        );
    }
    eprintln!(
        "{answered} of {ROUNDS} answered; {} connections displaced",
        displaced(&proxy)
    );
    assert_eq!(answered, ROUNDS, "the kept-alive client was displaced");
}
