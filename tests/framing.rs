//! Request smuggling and framing over raw sockets: every desync variant a loose backend would fall for.
//!
//! Each case sends exact bytes to a real tollgate whose upstream sits behind
//! a [`Tap`] that records what tollgate wrote. The recorded bytes are then
//! read by a strict RFC 9112 parser: the upstream must only ever see
//! well-framed requests, exactly as many as the client meant, and a request
//! hidden in a body (`/smuggled`) must never come out as a request of its own.

mod common;

use common::bytes::{find, is_tchar};
use common::T0;
use std::time::Duration;

use common::{Proxy, Tap, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::clock::ManualClock;

fn yaml(upstream: &str) -> String {
    format!(
        "upstreams:\n  app: {{ url: \"{upstream}\" }}\n\
         limiters:\n  once: {{ algorithm: fixed_window, limit: 1, window: 60s, key: client }}\n\
         routes:\n  - {{ name: limited, match: {{ path_prefix: /limited }}, upstream: app, limiters: [once] }}\n\
         \x20 - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\n"
    )
}

// ------------------------------------------------------------ the strict reader

/// One request as the upstream received it.
#[derive(Debug)]
struct Seen {
    #[allow(dead_code)] // shown when a case fails
    method: String,
    target: String,
}

/// Reads `bytes` as a sequence of HTTP/1.1 requests, refusing anything a
/// strict parser would: returns the requests and what was left unparsed.
fn strict_requests(mut bytes: &[u8]) -> Result<(Vec<Seen>, usize), String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let Some(end) = find(bytes, b"\r\n\r\n") else {
            return Ok((out, bytes.len()));
        };
        let mut lines = split_crlf(&bytes[..end]);
        let (method, target) = request_line(lines.next().ok_or("empty head")?)?;
        let (length, chunked) = framing(lines)?;
        let rest = &bytes[end + 4..];
        let body = if chunked {
            chunked_body(rest, end + 4)?
        } else if let Some(n) = length {
            if rest.len() < n {
                Body::Short(rest.len() + end + 4)
            } else {
                Body::Done(&rest[n..])
            }
        } else {
            Body::Done(rest)
        };
        match body {
            Body::Short(left) => return Ok((out, left)),
            Body::Done(after) => bytes = after,
        }
        out.push(Seen {
            method: method.to_string(),
            target: target.to_string(),
        });
    }
    Ok((out, 0))
}

/// A request line's method and origin-form target, or why it is refused.
fn request_line(line: &[u8]) -> Result<(&str, &str), String> {
    let line = std::str::from_utf8(line).map_err(|_| "request line is not ASCII")?;
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err(format!("request line {line:?}"));
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(format!("method {method:?}"));
    }
    if !target.starts_with('/') || target.bytes().any(|b| b <= b' ' || b >= 0x7f) {
        return Err(format!("target {target:?} is not origin-form"));
    }
    if version != "HTTP/1.1" {
        return Err(format!("version {version:?}"));
    }
    Ok((method, target))
}

/// The header fields' framing, `(Content-Length, chunked)`, or why they are
/// refused: one Host, each framing field at most once and never both.
fn framing<'a>(fields: impl Iterator<Item = &'a [u8]>) -> Result<(Option<usize>, bool), String> {
    let mut hosts = 0;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    for field in fields {
        let colon = field.iter().position(|&b| b == b':').ok_or("no colon")?;
        let (name, value) = (&field[..colon], &field[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(format!("field name {:?}", String::from_utf8_lossy(name)));
        }
        if value.iter().any(|&b| (b < b' ' && b != b'\t') || b == 0x7f) {
            return Err(format!(
                "control byte in {:?}",
                String::from_utf8_lossy(field)
            ));
        }
        let value = String::from_utf8_lossy(value).trim().to_string();
        match String::from_utf8_lossy(name).to_ascii_lowercase().as_str() {
            "host" => hosts += 1,
            "content-length" => {
                if length.is_some()
                    || value.is_empty()
                    || !value.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(format!("Content-Length {value:?} (or twice)"));
                }
                length = Some(value.parse().map_err(|_| "Content-Length overflows")?);
            }
            "transfer-encoding" => {
                if chunked || !value.eq_ignore_ascii_case("chunked") {
                    return Err(format!("Transfer-Encoding {value:?} (or twice)"));
                }
                chunked = true;
            }
            _ => {}
        }
    }
    if hosts != 1 {
        return Err(format!("{hosts} Host fields"));
    }
    if chunked && length.is_some() {
        return Err("both Content-Length and Transfer-Encoding".into());
    }
    Ok((length, chunked))
}

/// Where a request's body ends.
enum Body<'a> {
    /// Whole: the bytes after it.
    Done(&'a [u8]),
    /// Cut short: how much is left unparsed.
    Short(usize),
}

/// A chunked body at the start of `rest` (after a head of `head_len` bytes),
/// trailer fields and the empty line included.
fn chunked_body(mut rest: &[u8], head_len: usize) -> Result<Body<'_>, String> {
    loop {
        let Some(eol) = find(rest, b"\r\n") else {
            return Ok(Body::Short(rest.len() + head_len));
        };
        let size = std::str::from_utf8(&rest[..eol]).map_err(|_| "chunk size")?;
        let size = size.split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size, 16).map_err(|_| format!("chunk size {size:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            // Trailer fields, then the empty line.
            loop {
                let Some(eol) = find(rest, b"\r\n") else {
                    return Ok(Body::Short(rest.len() + 1));
                };
                let empty = eol == 0;
                rest = &rest[eol + 2..];
                if empty {
                    return Ok(Body::Done(rest));
                }
            }
        }
        if rest.len() < size + 2 {
            return Ok(Body::Short(rest.len() + 1));
        }
        if &rest[size..size + 2] != b"\r\n" {
            return Err("chunk data not followed by CRLF".into());
        }
        rest = &rest[size + 2..];
    }
}

fn split_crlf(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(head);
    std::iter::from_fn(move || {
        let r = rest?;
        match find(r, b"\r\n") {
            Some(i) => {
                rest = Some(&r[i + 2..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

// ------------------------------------------------------------ the client side

/// What the client got back on one connection.
#[derive(Debug)]
struct Conversation {
    /// Final (non-1xx) statuses, in order.
    statuses: Vec<u16>,
    /// Whether any interim 100 Continue was sent.
    continued: bool,
    /// Content types of the final responses, in order.
    types: Vec<String>,
    /// The server closed the connection.
    closed: bool,
}

/// How long [`converse`] waits for a first answer, and for more after it
/// (a pipelined request's answer follows the upstream's round trip).
const FIRST_BYTE: Duration = Duration::from_secs(3);
const QUIET: Duration = Duration::from_secs(1);

/// Sends `bytes`, then reads until the server closes or stays quiet for a while.
async fn converse(addr: std::net::SocketAddr, bytes: &[u8]) -> Conversation {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // A server may refuse mid-send: the rest of the bytes are moot then.
    let _ = s.write_all(bytes).await;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut closed = false;
    loop {
        let quiet = if buf.is_empty() { FIRST_BYTE } else { QUIET };
        match tokio::time::timeout(quiet, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => break,
        }
    }
    read_responses(&buf, closed)
}

fn read_responses(mut bytes: &[u8], closed: bool) -> Conversation {
    let mut a = Conversation {
        statuses: Vec::new(),
        continued: false,
        types: Vec::new(),
        closed,
    };
    while let Some(end) = find(bytes, b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..end]).to_ascii_lowercase();
        bytes = &bytes[end + 4..];
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not a response: {head:?}"));
        if status < 200 {
            a.continued |= status == 100;
            continue;
        }
        let field = |name: &str| {
            head.lines()
                .skip(1)
                .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == name))
                .map(|(_, v)| v.trim().to_string())
        };
        a.statuses.push(status);
        a.types.push(field("content-type").unwrap_or_default());
        if field("transfer-encoding").is_some() {
            // Chunked: skip to the last chunk.
            let end = find(bytes, b"\r\n0\r\n\r\n").map_or(bytes.len(), |i| i + 7);
            bytes = &bytes[end..];
        } else {
            let n: usize = field("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            bytes = &bytes[n.min(bytes.len())..];
        }
    }
    a
}

// ------------------------------------------------------------ the table

enum Expect {
    /// The client gets these final statuses in order, and the upstream sees
    /// exactly `upstream` complete requests.
    Answers {
        statuses: &'static [u16],
        upstream: usize,
    },
    /// Refused before reaching the upstream: one 400, or the connection closed.
    Refused,
}

struct Case {
    name: &'static str,
    send: &'static [u8],
    expect: Expect,
    /// The client cut its body short: the upstream may hold the start of one request.
    partial_ok: bool,
}

const fn case(name: &'static str, send: &'static [u8], expect: Expect) -> Case {
    Case {
        name,
        send,
        expect,
        partial_ok: false,
    }
}

const fn answers(statuses: &'static [u16], upstream: usize) -> Expect {
    Expect::Answers { statuses, upstream }
}

const CASES: &[Case] = &[
    case("a plain GET", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", answers(&[200], 1)),
    case(
        "CL.TE: a request hidden after a zero chunk",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[200], 1),
    ),
    case(
        "TE.CL: a request hidden in a chunk",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n23\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\n",
        answers(&[200], 1),
    ),
    case(
        "Transfer-Encoding: xchunked",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: xchunked\r\n\r\nhello",
        Expect::Refused,
    ),
    case(
        "Transfer-Encoding with a space before its value",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        answers(&[200], 1),
    ),
    case(
        "Transfer-Encoding with a space before the colon",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "Transfer-Encoding: chunked, identity",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "Transfer-Encoding twice, chunked then identity",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "Transfer-Encoding: identity alone",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\nhello",
        Expect::Refused,
    ),
    case(
        "Transfer-Encoding: CHUNKED in capitals",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        answers(&[200], 1),
    ),
    case(
        "a chunked HTTP/1.0 request",
        b"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n23\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\n",
        Expect::Refused,
    ),
    // RFC 9110 §8.6 lets a recipient use the one value: the upstream gets one field.
    case(
        "Content-Length twice with the same value",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        answers(&[200], 1),
    ),
    case(
        "Content-Length as a list of one value",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\nhello",
        Expect::Refused,
    ),
    case(
        "Content-Length twice with different values",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 41\r\n\r\nhelloGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "Content-Length: +5",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello",
        Expect::Refused,
    ),
    case(
        "Content-Length: -1",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "Content-Length in hex",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\nhello",
        Expect::Refused,
    ),
    case(
        "Content-Length past u64",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\nhello",
        Expect::Refused,
    ),
    case(
        "an obs-folded field",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "an obs-folded Transfer-Encoding",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding:\r\n chunked\r\n\r\nhello",
        Expect::Refused,
    ),
    case(
        "bare LF line ends are re-framed with CRLF",
        b"GET / HTTP/1.1\nHost: x\nX-A: b\n\n",
        answers(&[200], 1),
    ),
    case(
        "a bare CR in a field value",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "a NUL in a field value",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "a NUL in a field name",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-\x00A: b\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "a control byte in a field value",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "DEL in a field value",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x7fb\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "a space in a field name",
        b"GET / HTTP/1.1\r\nHost: x\r\nX A: b\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "an empty field name",
        b"GET / HTTP/1.1\r\nHost: x\r\n: b\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "obs-text in a field value passes as sent",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: caf\xe9\r\n\r\n",
        answers(&[200], 1),
    ),
    case(
        "two spaces in the request line",
        b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "a space inside the target",
        b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
        Expect::Refused,
    ),
    case(
        "an absolute-form target naming the Host",
        b"GET http://x/abs HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[200], 1),
    ),
    case(
        "an absolute-form target naming another host than Host",
        b"GET http://evil.example/abs HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[400], 0),
    ),
    case(
        "OPTIONS *",
        b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[501], 0),
    ),
    case(
        "GET with a * target",
        b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[400], 0),
    ),
    case(
        "CONNECT",
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        answers(&[405], 0),
    ),
    case(
        "TRACE",
        b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[405], 0),
    ),
    case(
        "HTTP/1.1 without Host",
        b"GET / HTTP/1.1\r\nX-A: b\r\n\r\n",
        answers(&[400], 0),
    ),
    case(
        "Host twice with the same value",
        b"GET / HTTP/1.1\r\nHost: x\r\nHost: x\r\n\r\n",
        answers(&[400], 0),
    ),
    case(
        "Host twice with different values",
        b"GET / HTTP/1.1\r\nHost: x\r\nHost: evil.example\r\n\r\n",
        answers(&[400], 0),
    ),
    case(
        "a Host that is not a host",
        b"GET / HTTP/1.1\r\nHost: a/b@c\r\n\r\n",
        answers(&[400], 0),
    ),
    case(
        "HTTP/1.0 without keep-alive answers one and closes",
        b"GET / HTTP/1.0\r\n\r\nGET /smuggled HTTP/1.0\r\n\r\n",
        answers(&[200], 1),
    ),
    case(
        "HTTP/1.0 with keep-alive answers both",
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /second HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        answers(&[200, 200], 2),
    ),
    case(
        "pipelined requests after a 429",
        b"GET /limited HTTP/1.1\r\nHost: x\r\n\r\nGET /limited HTTP/1.1\r\nHost: x\r\n\r\nGET /limited HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[200, 429, 429, 200], 2),
    ),
    case(
        "a request hidden in the body of a refused request",
        b"GET /limited HTTP/1.1\r\nHost: x\r\n\r\nPOST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 35\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[200, 429, 200], 2),
    ),
    case(
        "a request hidden in the chunked body of a refused request",
        b"GET /limited HTTP/1.1\r\nHost: x\r\n\r\nPOST /limited HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n23\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n",
        answers(&[200, 429, 200], 2),
    ),
    case(
        "Expect: 100-continue with the body sent at once",
        b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
        answers(&[200], 1),
    ),
    case(
        "a chunk with extensions and trailers",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
        answers(&[200], 1),
    ),
    Case {
        name: "a chunk size that is not hex",
        send: b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        expect: answers(&[400], 0),
        partial_ok: true,
    },
    Case {
        name: "a chunk size past u64",
        send: b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
        expect: answers(&[400], 0),
        partial_ok: true,
    },
];

/// How many cases run at once: each has its own proxy and tap, so they
/// cannot see each other; the bound keeps a loaded machine's scheduler from
/// stretching a reply past [`QUIET`].
const AT_ONCE: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_only_ever_sees_well_framed_requests_and_every_rejection_is_a_400_or_a_close()
{
    let upstream = Upstream::start().await;
    let places = std::sync::Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    let runs: Vec<_> = CASES
        .iter()
        .map(|case| {
            let (places, addr) = (places.clone(), upstream.addr);
            tokio::spawn(async move {
                let _place = places.acquire_owned().await.expect("semaphore open");
                check_case(addr, case).await
            })
        })
        .collect();
    let mut failures = Vec::new();
    for run in runs {
        failures.extend(run.await.expect("case task"));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

/// The upstream's requests as the strict reader sees them, and what it found wrong.
fn upstream_side(tap: &Tap, case: &Case) -> (Vec<Seen>, Vec<String>) {
    let mut requests = Vec::new();
    let mut problems = Vec::new();
    for (i, bytes) in tap.recorded().iter().enumerate() {
        match strict_requests(bytes) {
            Ok((seen, left)) => {
                if left > 0 && !case.partial_ok {
                    problems.push(format!(
                        "upstream connection {i} holds {left} bytes of an unfinished request: {:?}",
                        String::from_utf8_lossy(bytes)
                    ));
                }
                requests.extend(seen);
            }
            Err(e) => problems.push(format!(
                "upstream connection {i} is not well framed ({e}): {:?}",
                String::from_utf8_lossy(bytes)
            )),
        }
    }
    (requests, problems)
}

/// One case on a proxy and tap of its own: what went wrong, if anything.
async fn check_case(upstream: std::net::SocketAddr, case: &'static Case) -> Option<String> {
    let tap = Tap::start(upstream).await;
    let proxy = Proxy::start_with_clock(&yaml(&tap.url()), ManualClock::at(T0)).await;
    let answer = converse(proxy.addr, case.send).await;
    // The proxy may still be writing to the upstream: wait until what the
    // case expects has arrived. Where it expects nothing, a short look
    // is all a test can give absence.
    let wanted = match case.expect {
        Expect::Answers { upstream, .. } => upstream,
        Expect::Refused => 0,
    };
    if wanted == 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    } else {
        let _arrived = common::eventually(Duration::from_secs(2), || async {
            upstream_side(&tap, case).0.len() >= wanted
        })
        .await;
    }
    let (requests, mut problems) = upstream_side(&tap, case);
    if let Some(s) = requests.iter().find(|r| r.target.contains("smuggled")) {
        problems.push(format!("a hidden request reached the upstream: {s:?}"));
    }
    match &case.expect {
        Expect::Answers { statuses, upstream } => {
            if answer.statuses != *statuses {
                problems.push(format!(
                    "client got {:?}, want {statuses:?}",
                    answer.statuses
                ));
            }
            if requests.len() != *upstream {
                problems.push(format!(
                    "upstream saw {} requests, want {upstream}: {requests:?}",
                    requests.len()
                ));
            }
        }
        Expect::Refused => {
            let refused = match answer.statuses[..] {
                [] => answer.closed,
                [400] => answer.closed,
                _ => false,
            };
            if !refused {
                problems.push(format!("not refused: {answer:?}"));
            }
            if !requests.is_empty() {
                problems.push(format!("upstream saw {requests:?}"));
            }
        }
    }
    // Every 4xx/5xx tollgate writes itself is problem+json; hyper's own
    // parse-error 400 has no body at all.
    for (status, kind) in answer.statuses.iter().zip(&answer.types) {
        if *status >= 400 && !kind.is_empty() && kind != "application/problem+json" {
            problems.push(format!("a {status} of type {kind}"));
        }
        if [405, 501, 429].contains(status) && kind.is_empty() {
            problems.push(format!("a {status} without a problem body"));
        }
    }
    drop(proxy);
    (!problems.is_empty()).then(|| format!("{}:\n    {}", case.name, problems.join("\n    ")))
}
