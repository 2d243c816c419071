//! Lingering close over real sockets: an upload refused before its end (413) reaches every client, over plain HTTP/1.1 and TLS, because the rest of the body is read and discarded before the connection closes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::certs::{self, Ca};
use common::{Proxy, Upstream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Clients uploading at once in each test.
const CLIENTS: usize = 50;

/// Each client's body: 8 MiB in 16 KiB chunks, against a 256 KiB limit (more
/// than loopback's socket buffers hold, so the client is still sending when
/// the answer comes).
const CHUNK: usize = 16 * 1024;
const CHUNKS: usize = 512;

/// tollgate in front of `upstream`, refusing bodies over 256 KiB, with `server` appended to `server:`.
fn config(upstream: &Upstream, server: &str) -> String {
    format!(
        "upstreams:\n  app: {{ url: \"{}\" }}\nroutes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}\nserver:\n  max_request_body: 256KiB\n{server}",
        upstream.url()
    )
}

/// What a simple client does (Python's `requests` among them): writes its
/// whole chunked upload, then reads the answer to the end. A reset while it
/// writes is a lost upload: such a client reports the error, not the answer
/// (over TLS, `requests` raised `SSLError` for 24 of 50 such uploads).
/// Returns the answer's status line, or what went wrong.
async fn upload<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> Result<String, String> {
    let chunk = vec![b'u'; CHUNK];
    let head = b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    s.write_all(head).await.map_err(|e| format!("head: {e}"))?;
    for i in 0..CHUNKS {
        let sent = async {
            s.write_all(format!("{CHUNK:x}\r\n").as_bytes()).await?;
            s.write_all(&chunk).await?;
            s.write_all(b"\r\n").await
        };
        sent.await
            .map_err(|e| format!("reset while sending chunk {i}: {e}"))?;
    }
    s.write_all(b"0\r\n\r\n")
        .await
        .map_err(|e| format!("reset while ending the body: {e}"))?;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    let status = text.lines().next().unwrap_or_default().to_string();
    match read {
        Ok(Ok(_)) if !status.is_empty() => Ok(status),
        Ok(Ok(_)) => Err("closed without an answer".into()),
        Ok(Err(e)) => Err(format!("read: {e} (after {status:?})")),
        Err(_) => Err("no answer within 30 s".into()),
    }
}

/// Runs `CLIENTS` uploads at once and returns how many read a 413, and the other outcomes.
async fn count_413s<F, S>(connect: F) -> (usize, Vec<String>)
where
    F: Fn() -> S,
    S: std::future::Future<Output = Result<String, String>> + Send + 'static,
{
    let tasks: Vec<_> = (0..CLIENTS).map(|_| tokio::spawn(connect())).collect();
    let (mut got, mut other) = (0, Vec::new());
    for task in tasks {
        match task.await.unwrap() {
            Ok(status) if status.starts_with("HTTP/1.1 413") => got += 1,
            Ok(status) => other.push(status),
            Err(e) => other.push(e),
        }
    }
    (got, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_plain_uploads_over_the_limit_each_read_their_413() {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&config(&upstream, "")).await;
    let addr = proxy.addr;
    let (got, other) = count_413s(|| async move {
        let s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        upload(s).await
    })
    .await;
    assert_eq!(got, CLIENTS, "others: {other:?}");
    assert_eq!(upstream.accepted(), 0);
    // Each client finished its body and closed: every linger ended at its end of stream.
    let ended = common::eventually(Duration::from_secs(5), || async {
        proxy
            .metric(r#"tollgate_lingering_closes_total{end="eof"}"#)
            .await
            == Some(CLIENTS as f64)
    });
    assert!(ended.await, "{}", proxy.metrics().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_tls_uploads_over_the_limit_each_read_their_413() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(&["up.test"]).write(dir.path(), "up");
    let tls = format!(
        "  tls: {{ cert: \"{}\", key: \"{}\" }}\n",
        cert.display(),
        key.display()
    );
    let proxy = Proxy::start_in(
        &config(&upstream, &tls),
        Arc::new(tollgate::clock::SystemClock),
        dir,
        None,
    )
    .await;
    let (addr, client) = (proxy.addr, ca.client(&[b"http/1.1"]));
    let (got, other) = count_413s(|| {
        let client = client.clone();
        async move {
            let s = certs::handshake(addr, "up.test", client)
                .await
                .map_err(|e| e.to_string())?;
            upload(s).await
        }
    })
    .await;
    assert_eq!(got, CLIENTS, "others: {other:?}");
    assert_eq!(upstream.accepted(), 0);
}
