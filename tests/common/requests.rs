//! Talking to a server under test: a reqwest client and its shortcuts, raw bytes, and blocking HTTP/1.1 for tests without a runtime.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A client without connection reuse surprises (a fresh pool per test) that
/// shows what the proxy answered: a redirect is returned, never followed.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A completed response: status, headers, body text, protocol version.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
    pub version: http::Version,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        json(&self.body)
    }

    /// A header's value as a number (`Retry-After`, `X-RateLimit-Remaining`), if it is one.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.headers.get(name)?.to_str().ok()?.parse().ok()
    }
}

/// Sends `req` and reads the whole answer, whatever the status.
pub async fn send(req: reqwest::RequestBuilder) -> Answer {
    let r = req.send().await.unwrap();
    Answer {
        status: r.status().as_u16(),
        headers: r.headers().clone(),
        version: r.version(),
        body: r.text().await.unwrap(),
    }
}

/// A completed response whose body stays bytes (compressed, a byte range).
pub struct RawAnswer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// A header's value as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// GETs `url` with `headers`, keeping the body as the bytes that came.
pub async fn get_raw(url: &str, headers: &[(&str, &str)]) -> RawAnswer {
    let mut req = client().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    RawAnswer {
        status: r.status().as_u16(),
        headers: r.headers().clone(),
        body: r.bytes().await.unwrap().to_vec(),
    }
}

/// `text` as JSON; a test fails showing the text when it is not.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// Sends raw bytes and returns everything read until the server closes or `wait` passes.
pub async fn raw(addr: SocketAddr, request: &[u8], wait: Duration) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of the first response in a raw HTTP/1.1 answer.
pub fn status_of(raw: &str) -> u16 {
    raw.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// One HTTP/1.1 answer read by [`http`].
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        json(&self.body)
    }

    /// Splits a raw HTTP/1.1 answer into its head and its body, undoing
    /// chunked transfer coding when the head says so.
    pub fn parse(raw: &str) -> Option<Reply> {
        let (head, body) = raw.split_once("\r\n\r\n")?;
        let mut reply = Reply {
            status: status_of(head),
            head: head.to_string(),
            body: body.to_string(),
        };
        if reply
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            reply.body = String::from_utf8_lossy(&dechunk(body.as_bytes())).into_owned();
        }
        Some(reply)
    }
}

/// One blocking HTTP/1.1 request on a fresh connection (for tests that drive
/// a child process without a runtime). Fails if nothing listens or answers in 5 s.
pub fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<Reply> {
    http_with(addr, method, path, &[])
}

/// [`http`] with extra request headers.
pub fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Reply> {
    use std::io::{Read, Write};
    let timeout = Duration::from_secs(5);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out).into_owned();
    Reply::parse(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("no HTTP head in {text:?}"),
        )
    })
}

/// The data of a chunked body, up to its last chunk (or as far as it goes).
pub fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..line_end])
            .ok()
            .and_then(|line| usize::from_str_radix(line.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        let data = &body[line_end + 2..];
        if size == 0 || data.len() < size {
            break;
        }
        out.extend_from_slice(&data[..size]);
        body = &data[size..];
        body = body.strip_prefix(b"\r\n").unwrap_or(body);
    }
    out
}

/// Sends `n` GETs to `url` at once and returns their statuses, in completion order.
pub async fn burst(c: &reqwest::Client, url: &str, n: usize) -> Vec<u16> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (c, url) = (c.clone(), url.to_string());
            tokio::spawn(async move { c.get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    let mut statuses = Vec::with_capacity(n);
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// GETs `url` and returns the body as text, whatever the status.
pub async fn get_text(c: &reqwest::Client, url: &str) -> String {
    c.get(url).send().await.unwrap().text().await.unwrap()
}

/// GETs `url` and parses the body as JSON, whatever the status.
pub async fn get_json(c: &reqwest::Client, url: &str) -> serde_json::Value {
    json(&get_text(c, url).await)
}

/// GETs `url` with `headers` and returns the status code.
pub async fn status(c: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = c.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap().status().as_u16()
}

/// The value of the first Prometheus sample whose line starts with `series`:
/// a name (end it with a space to exclude longer names), or a name and the
/// start of its labels.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Reads from `s` until a whole request head (up to its blank line) has
/// arrived; false when the connection ends or fails first.
pub async fn read_head(s: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    true
}

/// A connection to `to` from the loopback address `from` (all of 127/8 is
/// local): a test plays several clients on one machine.
pub async fn connect_from(from: std::net::Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((from, 0))).unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads from `s` until `marker` arrived (true) or the connection closed
/// or 5 s passed (false).
pub async fn read_until(s: &mut TcpStream, marker: &[u8]) -> bool {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !got.windows(marker.len()).any(|w| w == marker) {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .unwrap_or(false)
}
