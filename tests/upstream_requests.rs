//! Request bodies from the upstream's side: a plain-http upstream reads each body framed as the client framed it, byte-exact, and an upstream that answers before it has read the body gets its answer heard, not a write blocked until the timeout.
//!
//! The upstream is a raw socket that reads requests strictly (RFC 9112: one
//! framing field, chunks decoded by their sizes) and logs, per connection,
//! each request's head fields and body; the client is reqwest, or a raw
//! socket where the client's own framing matters.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::bytes::find;
use common::{eventually, Proxy};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as the upstream read it.
#[derive(Clone, Debug)]
struct Seen {
    line: String,
    /// Field names lowercased, values as sent.
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the upstream does with a request once its head is read.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Reads the body, answers `200` with the body's length, keeps the connection.
    Read,
    /// Answers `413` at once and reads nothing more until the test lets it
    /// (`drain`), keeping the connection open: an upstream that will not
    /// take the body and does not say so by closing.
    Refuse,
    /// Answers `413` with `Connection: close` at once, closes its sending
    /// side and reads what still comes (a lingering close), so the answer is
    /// not lost to a reset.
    RefuseAndClose,
}

#[derive(Default)]
struct Log {
    /// Per accepted connection, the requests it carried.
    conns: Vec<Vec<Seen>>,
    /// Connections that ended: closed by the upstream (`/then-close`, a
    /// `RefuseAndClose`), or by tollgate as a read saw.
    ended: usize,
}

struct RawUpstream {
    addr: SocketAddr,
    log: Arc<Mutex<Log>>,
    /// Lets a `Refuse` connection read again (to its end).
    drain: Arc<tokio::sync::Notify>,
}

impl RawUpstream {
    async fn start(mode: Mode) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Log::default()));
        let drain = Arc::new(tokio::sync::Notify::new());
        let (conns, drained) = (log.clone(), drain.clone());
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let index = {
                    let mut log = conns.lock();
                    log.conns.push(Vec::new());
                    log.conns.len() - 1
                };
                let at = Upstream {
                    index,
                    log: conns.clone(),
                    drain: drained.clone(),
                };
                tokio::spawn(serve(s, at, mode));
            }
        });
        RawUpstream { addr, log, drain }
    }

    fn conns(&self) -> Vec<Vec<Seen>> {
        self.log.lock().conns.clone()
    }
}

/// What one connection's task shares with the test.
struct Upstream {
    index: usize,
    log: Arc<Mutex<Log>>,
    drain: Arc<tokio::sync::Notify>,
}

async fn serve(mut s: TcpStream, at: Upstream, mode: Mode) {
    let Upstream { index, log, drain } = at;
    let mut buf = Vec::new();
    loop {
        let Some((line, fields)) = read_head(&mut s, &mut buf).await else {
            break;
        };
        let mut seen = Seen {
            line,
            fields,
            body: Vec::new(),
        };
        if mode != Mode::Read {
            log.lock().conns[index].push(seen);
            let close = mode == Mode::RefuseAndClose;
            let answer = format!(
                "HTTP/1.1 413 Content Too Large\r\nContent-Length: 7\r\n{}\r\ntoo big",
                if close { "Connection: close\r\n" } else { "" }
            );
            let _ = s.write_all(answer.as_bytes()).await;
            if close {
                let _ = s.shutdown().await;
            } else {
                drain.notified().await;
            }
            // To the end: what is left of the body, then tollgate's close.
            let mut sink = [0u8; 65536];
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            break;
        }
        match read_body(&mut s, &mut buf, &seen.fields).await {
            Ok(body) => seen.body = body,
            Err(e) => panic!("the upstream read a badly framed body: {e}"),
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}",
            seen.body.len().to_string().len(),
            seen.body.len()
        );
        let then_close = seen.line.starts_with("GET /then-close ");
        log.lock().conns[index].push(seen);
        if s.write_all(answer.as_bytes()).await.is_err() || then_close {
            break;
        }
    }
    // Closed before it is counted: a test that waits for the count finds the FIN sent.
    drop(s);
    log.lock().ended += 1;
}

/// One request head, strictly: `None` once tollgate closes the connection.
async fn read_head(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, Vec<(String, String)>)> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8(buf[..end].to_vec()).expect("a head in ASCII");
            buf.drain(..end + 4);
            let mut lines = head.split("\r\n");
            let line = lines.next().unwrap().to_string();
            let fields = lines
                .map(|l| {
                    let (n, v) = l.split_once(':').expect("a field has a colon");
                    assert!(!n.ends_with(' '), "no space before the colon: {l:?}");
                    (n.to_ascii_lowercase(), v.trim().to_string())
                })
                .collect();
            return Some((line, fields));
        }
        let mut chunk = [0u8; 65536];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads `n` more bytes into `buf` than it holds past `from`.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>, want: usize) -> Result<(), String> {
    let mut chunk = [0u8; 65536];
    while buf.len() < want {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return Err(format!("closed with {} of {want} bytes", buf.len())),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Ok(())
}

/// The body as its one framing field frames it (RFC 9112 §6.3): both
/// fields, or a transfer coding other than `chunked`, is an error.
async fn read_body(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    fields: &[(String, String)],
) -> Result<Vec<u8>, String> {
    let length: Vec<_> = fields
        .iter()
        .filter(|(n, _)| n == "content-length")
        .collect();
    let coding: Vec<_> = fields
        .iter()
        .filter(|(n, _)| n == "transfer-encoding")
        .collect();
    match (length.as_slice(), coding.as_slice()) {
        ([], []) => Ok(Vec::new()),
        ([(_, n)], []) => {
            let n: usize = n.parse().map_err(|_| format!("Content-Length {n:?}"))?;
            fill(s, buf, n).await?;
            Ok(buf.drain(..n).collect())
        }
        ([], [(_, c)]) if c == "chunked" => {
            let mut body = Vec::new();
            loop {
                let line_end = loop {
                    if let Some(i) = find(buf, b"\r\n") {
                        break i;
                    }
                    fill(s, buf, buf.len() + 1).await?;
                };
                let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
                let size = usize::from_str_radix(&size_text, 16)
                    .map_err(|_| format!("chunk size {size_text:?}"))?;
                buf.drain(..line_end + 2);
                fill(s, buf, size + 2).await?;
                if &buf[size..size + 2] != b"\r\n" {
                    return Err("a chunk not ended by CRLF".into());
                }
                body.extend(buf.drain(..size));
                buf.drain(..2);
                if size == 0 {
                    // No trailers: the last chunk's CRLF ends the message.
                    return Ok(body);
                }
            }
        }
        _ => Err(format!("framing fields {length:?} {coding:?}")),
    }
}

async fn front(upstream: &RawUpstream) -> Proxy {
    Proxy::start(&format!(
        "upstreams:\n  app: {{ url: \"http://{}\", timeout: 60s }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\nserver: {{ workers: 1 }}\n",
        upstream.addr
    ))
    .await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[tokio::test]
async fn a_body_with_a_length_reaches_the_upstream_byte_exact_under_that_length_and_the_connection_carries_the_next_requests(
) {
    let upstream = RawUpstream::start(Mode::Read).await;
    let proxy = front(&upstream).await;
    let http = client();
    // A small body, one larger than a write's copy, and a GET between them.
    for (i, size) in [1_000, 300_000].into_iter().enumerate() {
        let body = pattern(size);
        let resp = http
            .post(proxy.url(&format!("/up/{i}")))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), size.to_string());
        let get = http.get(proxy.url("/between")).send().await.unwrap();
        assert_eq!(get.status(), 200);
        assert_eq!(get.text().await.unwrap(), "0");
    }
    let conns = upstream.conns();
    assert_eq!(
        conns.len(),
        1,
        "one connection carried every request: {conns:?}"
    );
    let posts: Vec<&Seen> = conns[0]
        .iter()
        .filter(|s| s.line.starts_with("POST"))
        .collect();
    assert_eq!(posts.len(), 2);
    for (seen, size) in posts.iter().zip([1_000, 300_000]) {
        assert_eq!(
            seen.field("content-length"),
            Some(size.to_string().as_str())
        );
        assert_eq!(seen.field("transfer-encoding"), None);
        assert!(
            seen.body == pattern(size),
            "{} arrived byte-exact",
            seen.line
        );
    }
}

#[tokio::test]
async fn a_chunked_body_reaches_the_upstream_chunked_and_whole_and_the_connection_carries_the_next_request(
) {
    let upstream = RawUpstream::start(Mode::Read).await;
    let proxy = front(&upstream).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let head = format!(
        "POST /chunked HTTP/1.1\r\nHost: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        proxy.addr
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(b"5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n")
        .await
        .unwrap();
    let resp = http_get_after(&mut s, &proxy).await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let conns = upstream.conns();
    assert_eq!(conns.len(), 1, "{conns:?}");
    let post = &conns[0][0];
    assert_eq!(post.field("transfer-encoding"), Some("chunked"));
    assert_eq!(post.field("content-length"), None);
    assert_eq!(post.body, b"hello, world");
    assert_eq!(
        conns[0][1].line, "GET /after HTTP/1.1",
        "read as the next request, whole"
    );
}

/// Sends `GET /after` on `s` and reads both answers (the POST's and its).
async fn http_get_after(s: &mut TcpStream, proxy: &Proxy) -> String {
    let get = format!(
        "GET /after HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        proxy.addr
    );
    s.write_all(get.as_bytes()).await.unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).await.unwrap();
    String::from_utf8_lossy(&all).into_owned()
}

/// A body large enough to fill the sockets' buffers between tollgate and
/// an upstream that reads none of it.
const LARGE: usize = 8 * 1024 * 1024;

#[tokio::test]
async fn an_upstream_that_answers_before_reading_the_body_gets_its_answer_heard_and_its_connection_closed(
) {
    let upstream = RawUpstream::start(Mode::Refuse).await;
    let proxy = front(&upstream).await;
    refused_upload(&proxy).await;
    // Read to its end, the connection ends: tollgate closed it.
    upstream.drain.notify_one();
    assert!(
        eventually(Duration::from_secs(10), || async {
            upstream.log.lock().ended == 1
        })
        .await,
        "tollgate closed the connection whose request it left unfinished"
    );
    let resp = client()
        .post(proxy.url("/again"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(
        upstream.conns().len(),
        2,
        "the next request took a new connection"
    );
}

#[tokio::test]
async fn an_upstream_that_answers_early_and_closes_gets_its_answer_to_the_client() {
    let upstream = RawUpstream::start(Mode::RefuseAndClose).await;
    let proxy = front(&upstream).await;
    refused_upload(&proxy).await;
}

/// Sends a `LARGE` body and expects the upstream's early `413`. The client
/// waits 20 s, the upstream timeout is 60 s: a write left blocked on an
/// upstream that reads nothing would end in the client's timeout, not a 413.
async fn refused_upload(proxy: &Proxy) {
    let resp = client()
        .post(proxy.url("/upload"))
        .body(pattern(LARGE))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.text().await.unwrap(), "too big");
}

#[tokio::test]
async fn a_post_after_the_upstream_closed_its_idle_connection_goes_out_on_a_new_one() {
    let upstream = RawUpstream::start(Mode::Read).await;
    let proxy = front(&upstream).await;
    let http = client();
    // The upstream answers, then ends the connection while it is idle:
    // tollgate hears the close before it sends a body on it.
    let first = http.get(proxy.url("/then-close")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.text().await.unwrap(), "0");
    assert!(
        eventually(Duration::from_secs(5), || async {
            upstream.log.lock().ended == 1
        })
        .await
    );
    let resp = http
        .post(proxy.url("/second"))
        .body(pattern(5_000))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "5000");
    let conns = upstream.conns();
    assert_eq!(conns.len(), 2, "{conns:?}");
    assert!(conns[1][0].body == pattern(5_000));
}
