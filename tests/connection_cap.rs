//! At `server.max_connections`, a new connection makes room: idle connections are displaced, busy ones never.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{connect_from, eventually, read_until, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// An upstream that holds every request until `release` is sent, then
/// answers each with `200 held`; `seen` counts the requests it holds.
struct HeldUpstream {
    addr: SocketAddr,
    seen: Arc<AtomicUsize>,
    release: watch::Sender<bool>,
}

impl HeldUpstream {
    async fn start() -> HeldUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let (release, released) = watch::channel(false);
        let counter = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (counter, mut released) = (counter.clone(), released.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    let _ = released.wait_for(|r| *r).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nheld")
                        .await;
                });
            }
        });
        HeldUpstream {
            addr,
            seen,
            release,
        }
    }
}

/// An idle connection from `from`: every third one finishes a request first
/// and stays open between requests, the others send nothing at all.
async fn idle_connection(from: Ipv4Addr, to: SocketAddr, n: usize) -> TcpStream {
    let mut s = connect_from(from, to).await;
    if n.is_multiple_of(3)
        && s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .is_ok()
    {
        read_until(&mut s, b"pong").await;
    }
    s
}

/// One full request on a new connection from 127.0.0.1: answered with 200?
async fn probe(to: SocketAddr) -> bool {
    let mut s = connect_from(Ipv4Addr::LOCALHOST, to).await;
    if s.write_all(b"GET /probe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    read_until(&mut s, b"pong").await
}

/// The five flood addresses, 127.0.0.2 to 127.0.0.6, in turn.
fn flood_address(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 2 + (n % 5) as u8)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_many_addresses_at_the_cap_make_room_for_probes_but_never_for_a_request_in_flight(
) {
    let held = HeldUpstream::start().await;
    let proxy = Proxy::start(&format!(
        "upstreams:\n  held: {{ url: \"http://{}\" }}\nroutes:\n  - {{ name: held, match: {{ path: /held }}, upstream: held }}\n  - {{ name: rest, match: {{ path_prefix: / }}, respond: {{ status: 200, body: pong }} }}\nserver: {{ max_connections: 50, request_header_timeout: 30s, idle_timeout: 60s }}\n",
        held.addr
    ))
    .await;
    // Ten connections with a request in flight at a slow upstream.
    let mut in_flight = Vec::new();
    for _ in 0..10 {
        let mut s = connect_from(Ipv4Addr::LOCALHOST, proxy.addr).await;
        s.write_all(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        in_flight.push(s);
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            held.seen.load(Ordering::SeqCst) == 10
        })
        .await,
        "the held requests never reached the upstream"
    );
    // Six times the cap in idle connections from five other addresses.
    let mut flood = Vec::new();
    for n in 0..300 {
        flood.push(idle_connection(flood_address(n), proxy.addr, n).await);
    }
    // Probes, each while five more idle connections arrive.
    let mut served = 0;
    let probes = 200;
    for round in 0..probes {
        let more = async {
            let mut opened = Vec::new();
            for n in 0..5 {
                opened.push(idle_connection(flood_address(round + n), proxy.addr, 1).await);
            }
            opened
        };
        let (ok, opened) = tokio::join!(probe(proxy.addr), more);
        served += usize::from(ok);
        flood.extend(opened);
    }
    eprintln!(
        "{served} of {probes} probes served with {} idle connections opened against max_connections: 50",
        flood.len()
    );
    assert!(
        served * 100 >= probes * 99,
        "only {served} of {probes} probes were served"
    );
    // Every request in flight is still answered.
    held.release.send(true).unwrap();
    for (i, s) in in_flight.iter_mut().enumerate() {
        assert!(
            read_until(s, b"held").await,
            "the request in flight on connection {i} was cut off"
        );
    }
    let metrics = proxy.metrics().await;
    let displaced = common::metric(
        &metrics,
        "tollgate_connections_displaced_total{state=\"no_request\"}",
    )
    .unwrap_or(0.0);
    assert!(
        displaced >= 300.0,
        "only {displaced} connections were displaced\n{metrics}"
    );
}
