//! Connections to php-fpm (TCP or a unix socket), idle ones kept per worker, and one request/response exchange on them.
//!
//! Like `crate::pool` for HTTP: each worker thread keeps its own bounded
//! list of idle connections (opened with FCGI_KEEP_CONN), so a request
//! takes a connection without contention; one taken from another worker's
//! list moves to this worker's reactor first. A connection goes back only
//! after php-fpm ended the request cleanly (END_REQUEST, status
//! complete) with nothing left unread; anything else closes it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::codec::{self, Record};
use super::FastCgiError;

/// More idle connections than this per worker are closed instead of kept
/// (php-fpm pools are small: more would only hold its children's sockets).
const MAX_IDLE_PER_WORKER: usize = 64;

/// Each read asks for at least this much room; records are at most 64 KiB.
const READ_CHUNK: usize = 64 * 1024;

/// The CGI header block php-fpm sends before the body may not exceed this.
const MAX_HEAD: usize = 64 * 1024;

pub use crate::config::FastCgiAddress as Address;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Whether an idle connection is still usable: php-fpm closes one when
    /// a child exits (`pm.max_requests`, a restart), which shows as EOF.
    fn is_idle_and_open(&self) -> bool {
        let mut probe = [0u8; 1];
        let r = match self {
            Stream::Tcp(s) => s.try_read(&mut probe),
            Stream::Unix(s) => s.try_read(&mut probe),
        };
        matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// The same socket, registered with the reactor of the runtime this
    /// runs on instead of the one that opened or last used it.
    fn rehome(self) -> io::Result<Stream> {
        // `into_std` deregisters from the old reactor (from any thread) and
        // leaves the socket non-blocking, as `from_std` needs.
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(TcpStream::from_std(s.into_std()?)?),
            Stream::Unix(s) => Stream::Unix(UnixStream::from_std(s.into_std()?)?),
        })
    }

    /// Has the answer to the request just written acknowledged as it is
    /// read, not up to 40 ms later. php-fpm leaves Nagle's algorithm on:
    /// once the first write of an answer (its header block) is out, a later
    /// write shorter than a segment waits until that one is acknowledged.
    /// And Linux delays acknowledgements on a connection that alternates
    /// request and answer (its "pingpong" mode), as a kept one does: pages
    /// over ~8 KiB (which php-fpm writes in more than one go) waited ~44 ms.
    /// TCP_QUICKACK leaves that mode, so what is read is acknowledged at
    /// once. It is not sticky: writing the next request enters the mode
    /// again, which is why it is set once per exchange, after the request
    /// went out, and nothing is written until the answer ends. (Setting it
    /// after every read works too, at one call per read; a connection per
    /// request instead costs a connect, a php-fpm accept and a TIME_WAIT.)
    /// A unix socket has no acknowledgements.
    fn ack_the_answer_at_once(&self) {
        if let Stream::Tcp(s) = self {
            // Without it only the delay comes back: never worth failing for.
            let _ = socket2::SockRef::from(s).set_tcp_quickack(true);
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// One connection and the bytes read from it but not parsed yet.
pub struct Conn {
    stream: Stream,
    buf: BytesMut,
}

impl Conn {
    /// The next whole record, or None at EOF.
    fn poll_record(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Record>, FastCgiError>> {
        loop {
            if let Some(r) = codec::parse(&mut self.buf).map_err(FastCgiError::Protocol)? {
                return Poll::Ready(Ok(Some(r)));
            }
            if self.buf.capacity() - self.buf.len() < codec::HEADER_LEN {
                self.buf.reserve(READ_CHUNK);
            }
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut self.stream),
                cx,
                &mut self.buf
            ))
            .map_err(FastCgiError::Io)?;
            if n == 0 {
                return Poll::Ready(Ok(None));
            }
        }
    }

    async fn record(&mut self) -> Result<Option<Record>, FastCgiError> {
        std::future::poll_fn(|cx| self.poll_record(cx)).await
    }
}

pub struct FastCgiPool {
    address: Address,
    connect_timeout: Duration,
    idle: Vec<Mutex<Vec<Conn>>>,
    /// One per request talking to php-fpm (`max_conns`). A php-fpm child
    /// stays bound to a kept connection until it closes, so tollgate must
    /// never hold more connections than php-fpm has children: a request
    /// opens one only while holding a permit and finding no idle one.
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for FastCgiPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastCgiPool")
            .field("address", &self.address)
            .finish()
    }
}

impl FastCgiPool {
    /// One idle list per worker runtime (`workers` of them) and one for the
    /// runtime `run` was called on.
    pub fn new(
        address: Address,
        connect_timeout: Duration,
        max_conns: usize,
        workers: usize,
    ) -> Arc<FastCgiPool> {
        Arc::new(FastCgiPool {
            address,
            connect_timeout,
            permits: Arc::new(Semaphore::new(max_conns.max(1))),
            idle: (0..=workers).map(|_| Mutex::new(Vec::new())).collect(),
        })
    }

    fn slot(&self, worker: usize) -> usize {
        worker.min(self.idle.len() - 1)
    }

    /// An idle connection that is still open: this worker's first, then
    /// another's (each one ties up a php-fpm child, so none may sit unused
    /// while a request waits). Must run on worker `slot`'s runtime.
    fn idle(&self, slot: usize) -> Option<Conn> {
        let n = self.idle.len();
        for i in 0..n {
            let list = &self.idle[(slot + i) % n];
            loop {
                let Some(mut conn) = list.lock().pop() else {
                    break;
                };
                if !(conn.buf.is_empty() && conn.stream.is_idle_and_open()) {
                    continue;
                }
                if i == 0 {
                    return Some(conn);
                }
                // Another worker's socket is registered with that worker's
                // reactor, which would wake it for every read here and have
                // it wake this one: a context switch and an eventfd write
                // per exchange, for as long as the connection lives. Moved
                // once, it goes back to this worker's list after the answer.
                match conn.stream.rehome() {
                    Ok(stream) => {
                        conn.stream = stream;
                        return Some(conn);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "an idle php-fpm connection could not change workers")
                    }
                }
            }
        }
        None
    }

    fn put(&self, slot: usize, conn: Conn) {
        let mut idle = self.idle[slot].lock();
        if idle.len() < MAX_IDLE_PER_WORKER {
            idle.push(conn);
        }
    }

    async fn connect(&self) -> Result<Conn, FastCgiError> {
        let connecting = async {
            match &self.address {
                Address::Tcp(a) => {
                    let s = TcpStream::connect(a.as_str()).await?;
                    // Records go out as separate writes: never wait for an ACK.
                    s.set_nodelay(true)?;
                    Ok(Stream::Tcp(s))
                }
                Address::Unix(p) => Ok(Stream::Unix(UnixStream::connect(p).await?)),
            }
        };
        let stream = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| FastCgiError::ConnectTimeout {
                address: self.address.to_string(),
                timeout: self.connect_timeout,
            })?
            .map_err(|source| FastCgiError::Connect {
                address: self.address.to_string(),
                source,
            })?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
        })
    }

    /// Sends one request (`head`: BEGIN_REQUEST and PARAMS; `body` as STDIN)
    /// and returns php-fpm's CGI header block and the rest of its output.
    /// `replayable`: an idempotent request without a body, which may be
    /// sent again if a kept connection turns out dead before any answer.
    pub async fn exchange(
        self: &Arc<FastCgiPool>,
        head: Bytes,
        mut body: Option<crate::request_body::UpstreamBody>,
        replayable: bool,
        upstream: Arc<str>,
        worker: usize,
    ) -> Result<(Head, ResponseBody), FastCgiError> {
        let slot = self.slot(worker);
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let replayable = replayable && body.is_none();
        loop {
            let (mut conn, reused) = match self.idle(slot) {
                Some(c) => (c, true),
                None => (self.connect().await?, false),
            };
            if !send(&mut conn, &head, &mut body, reused).await? {
                continue;
            }
            conn.stream.ack_the_answer_at_once();
            let (head, rest, ended) = match read_head(&mut conn, &upstream).await {
                Ok(read) => read,
                // The same race, noticed later: the request went out on a
                // dead connection and nothing came back.
                Err((_, false)) if reused && replayable => continue,
                Err((e, _)) => return Err(e),
            };
            let mut body = ResponseBody {
                conn: Some(conn),
                pool: self.clone(),
                slot,
                pending: (!rest.is_empty()).then_some(rest),
                upstream,
                permit: Some(permit),
            };
            if ended {
                // A small answer came whole: the connection is free already.
                body.finish();
            }
            return Ok((head, body));
        }
    }
}

/// Writes one request on `conn`: `head`, then the body as STDIN records and
/// the empty one that ends them. `Ok(false)`: php-fpm had closed this kept
/// connection (a child exited after `pm.max_requests`) before any of it was
/// read, so nothing ran and a new connection can take the request.
async fn send(
    conn: &mut Conn,
    head: &[u8],
    body: &mut Option<crate::request_body::UpstreamBody>,
    reused: bool,
) -> Result<bool, FastCgiError> {
    let empty_stdin = codec::header(codec::STDIN, 0);
    let written = if body.is_none() {
        let mut all = Buf::chain(head, &empty_stdin[..]);
        conn.stream.write_all_buf(&mut all).await
    } else {
        conn.stream.write_all(head).await
    };
    match written {
        Ok(()) => {}
        Err(_) if reused => return Ok(false),
        Err(e) => return Err(FastCgiError::Io(e)),
    }
    if let Some(body) = body.take() {
        send_body(conn, body).await?;
        conn.stream
            .write_all(&empty_stdin)
            .await
            .map_err(FastCgiError::Io)?;
    }
    Ok(true)
}

/// The request body as STDIN records, as it arrives from the client.
async fn send_body(
    conn: &mut Conn,
    mut body: crate::request_body::UpstreamBody,
) -> Result<(), FastCgiError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.is::<LengthLimitError>() {
                FastCgiError::BodyTooLarge
            } else if e.is::<hyper::Error>() {
                // Only a streamed body (an upgrade request) reads the
                // client's connection here; a buffered one was read whole.
                FastCgiError::ClientBody(e)
            } else {
                FastCgiError::BodyFile(e)
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers: CGI has no place for them
        };
        for chunk in data.chunks(codec::MAX_CONTENT) {
            let header = codec::header(codec::STDIN, chunk.len());
            let mut record = Buf::chain(&header[..], chunk);
            conn.stream
                .write_all_buf(&mut record)
                .await
                .map_err(FastCgiError::Io)?;
        }
    }
    Ok(())
}

/// Reads until the CGI header block is complete: (head, the body bytes that
/// came with it, whether END_REQUEST came too). On failure, also says
/// whether anything at all came back.
async fn read_head(
    conn: &mut Conn,
    upstream: &str,
) -> Result<(Head, Bytes, bool), (FastCgiError, bool)> {
    let mut head_bytes = BytesMut::new();
    let mut ended = false;
    let mut received = false;
    loop {
        if let Some(end) = super::response::head_end(&head_bytes) {
            let head = super::response::parse_head(&head_bytes[..end.0]).map_err(|e| (e, true))?;
            return Ok((head, head_bytes.split_off(end.1).freeze(), ended));
        }
        if ended {
            return Err((FastCgiError::NoHead, true));
        }
        if head_bytes.len() > MAX_HEAD {
            return Err((FastCgiError::HeadTooLarge, true));
        }
        let record = match conn.record().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err((FastCgiError::Closed, received)),
            Err(e) => return Err((e, received)),
        };
        received = true;
        match record.kind {
            codec::STDOUT => head_bytes.extend_from_slice(&record.content),
            codec::STDERR => log_stderr(upstream, &record.content),
            codec::END_REQUEST => {
                let (_, status) = codec::end_request(&record.content);
                if status != codec::REQUEST_COMPLETE {
                    return Err((FastCgiError::Refused(status), true));
                }
                ended = true;
            }
            _ => {}
        }
    }
}

/// php-fpm's STDERR (PHP notices and warnings when `log_errors` sends them
/// there), logged one line per record and cut at 1 KiB so a noisy script
/// cannot flood the log with one record.
fn log_stderr(upstream: &str, content: &[u8]) {
    let text = String::from_utf8_lossy(&content[..content.len().min(1024)]);
    tracing::warn!(upstream, stderr = %text.trim_end(), "php-fpm wrote to stderr");
}

pub use super::response::Head;

/// The rest of php-fpm's output after the header block, read as the client
/// takes it: hyper polls this only when it can send more, so a large
/// response is never held whole.
pub struct ResponseBody {
    /// None once END_REQUEST was read (the connection went back) or the
    /// exchange failed (the connection was dropped).
    conn: Option<Conn>,
    pool: Arc<FastCgiPool>,
    slot: usize,
    pending: Option<Bytes>,
    upstream: Arc<str>,
    /// Released once the connection is back in the idle list or closed.
    permit: Option<OwnedSemaphorePermit>,
}

impl ResponseBody {
    /// END_REQUEST was read: the connection can carry the next request.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            if conn.buf.is_empty() {
                self.pool.put(self.slot, conn);
            }
        }
        self.permit = None;
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = FastCgiError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, FastCgiError>>> {
        let this = &mut *self;
        if let Some(b) = this.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(b))));
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let record = match ready!(conn.poll_record(cx)) {
                Ok(Some(r)) => r,
                Ok(None) => {
                    (this.conn, this.permit) = (None, None);
                    return Poll::Ready(Some(Err(FastCgiError::Closed)));
                }
                Err(e) => {
                    (this.conn, this.permit) = (None, None);
                    return Poll::Ready(Some(Err(e)));
                }
            };
            match record.kind {
                codec::STDOUT if !record.content.is_empty() => {
                    return Poll::Ready(Some(Ok(Frame::data(record.content))));
                }
                codec::STDERR => log_stderr(&this.upstream, &record.content),
                codec::END_REQUEST => {
                    let (_, status) = codec::end_request(&record.content);
                    if status == codec::REQUEST_COMPLETE {
                        this.finish();
                    } else {
                        (this.conn, this.permit) = (None, None);
                    }
                    return Poll::Ready(None);
                }
                _ => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none() && self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("upstream", &self.upstream)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A php-fpm that keeps its connections and answers `hi` to every
    /// request; counts the connections it accepted.
    fn responder(path: &std::path::Path) -> Arc<AtomicUsize> {
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || answer_each_request(stream.unwrap()));
            }
        });
        accepted
    }

    fn answer_each_request(mut s: std::os::unix::net::UnixStream) {
        let mut header = [0u8; codec::HEADER_LEN];
        while s.read_exact(&mut header).is_ok() {
            let len = u16::from_be_bytes([header[4], header[5]]) as usize + header[6] as usize;
            let mut content = vec![0u8; len];
            s.read_exact(&mut content).unwrap();
            // An empty STDIN record ends the request.
            if header[1] == codec::STDIN && len == 0 {
                let page = b"Content-Type: text/plain\r\n\r\nhi";
                let mut out = codec::header(codec::STDOUT, page.len()).to_vec();
                out.extend_from_slice(page);
                out.extend_from_slice(&codec::header(codec::END_REQUEST, 8));
                out.extend_from_slice(&[0, 0, 0, 0, codec::REQUEST_COMPLETE, 0, 0, 0]);
                s.write_all(&out).unwrap();
            }
        }
    }

    fn head() -> Bytes {
        let mut out = BytesMut::new();
        codec::begin_request(&mut out, true);
        codec::Params::new(&mut out).finish();
        out.freeze()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// One GET on worker `worker`, run on `runtime`, read to its end; a
    /// hang fails after 10 s.
    fn page(runtime: &tokio::runtime::Runtime, pool: &Arc<FastCgiPool>, worker: usize) -> Bytes {
        runtime.block_on(async {
            let exchange = async {
                let (head, body) = pool
                    .exchange(head(), None, true, "php".into(), worker)
                    .await
                    .unwrap();
                assert_eq!(head.status, 200);
                body.collect().await.unwrap().to_bytes()
            };
            tokio::time::timeout(Duration::from_secs(10), exchange)
                .await
                .expect("the page never came: its socket waits on a reactor nobody drives")
        })
    }

    #[test]
    fn a_connection_another_worker_kept_moves_to_this_workers_reactor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("php-fpm.sock");
        let accepted = responder(&path);
        let pool = FastCgiPool::new(Address::Unix(path), Duration::from_secs(5), 1, 2);
        // Worker 1 opens the connection and keeps it; then its runtime no
        // longer runs, and nothing reads the reactor the socket was
        // registered with (a busy worker's reactor is read late, too).
        let (first, second) = (runtime(), runtime());
        assert_eq!(page(&first, &pool, 1), "hi");
        // Worker 2 takes it, and keeps it.
        assert_eq!(page(&second, &pool, 2), "hi");
        assert_eq!(page(&second, &pool, 2), "hi");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the kept connection was not reused by the other worker"
        );
    }
}
