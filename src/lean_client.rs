//! A request's exchange on a pooled plain-http upstream connection, driven by the request's own task: the request written by `upload`, the answer read with httparse.
//!
//! hyper's client connection is a task of its own: the request goes to it
//! over a channel, the answer comes back over another, and every body frame
//! crosses a third, each hand-over a wake-up. Here the request's task
//! writes the request (a head without a body in one write, a small body
//! in the same write) and reads the answer itself, and the answer's body
//! reads the socket as the client takes it. A request asking for an
//! upgrade keeps hyper's client, whose connection a tunnel then takes over.
//!
//! The answer is read as strictly as hyper reads it (httparse, at most
//! [`MAX_HEADERS`] fields in [`UPSTREAM_READ_BUF`] bytes, no obsolete line
//! folding) and framed by RFC 9112 §6.3. Where an answer's framing is
//! ambiguous (both `Transfer-Encoding` and `Content-Length`), chunked wins,
//! the `Content-Length` is removed before the answer goes on, and the
//! connection is closed after it; a transfer coding other than `chunked`
//! alone is refused; a length written twice goes on once; a connection is
//! never reused when bytes follow the answer that nobody asked for.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Request, Response};
use http_body::{Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use parking_lot::Mutex;

use head::{read_head, Framing, Head};

/// The read buffer of one upstream connection, so the largest body chunk it
/// hands on (hyper's client connections are built with the same bound).
pub const UPSTREAM_READ_BUF: usize = 64 * 1024;

/// A body's error, as `crate::body` names it (that module sits above this one).
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Header fields an answer may carry, as hyper allows.
pub const MAX_HEADERS: usize = 100;

/// What a read asks the socket for at most while no answer is pending: a
/// typical head and a small page arrive in one read.
const FIRST_READ: usize = 8 * 1024;

/// The longest chunk-size line, extensions included, and all trailer fields together.
const MAX_CHUNK_LINE: usize = 4 * 1024;
const MAX_TRAILERS: usize = 16 * 1024;

/// An idle upstream connection: the socket, what was read past the last
/// answer (nothing, or it would not be idle), its place under the cap, and
/// the idle list it goes back to. Boxed once, when it is opened, so that an
/// answer's body holds a pointer to it (every answer tollgate sends, a 429
/// too, is as large as the largest body it may carry).
pub struct Conn {
    io: TcpStream,
    buf: BytesMut,
    /// The request head as written last time, its allocation reused.
    head: Vec<u8>,
    /// The idle list of the worker that opened it, which it goes back to.
    home: Arc<Idle>,
    /// Whether the answer being read lets the connection carry another request.
    reuse: bool,
    /// Held, not read: the connection's place under the cap, freed with it.
    _permit: OwnedSemaphorePermit,
}

#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("writing the request failed: {0}")]
    Write(#[source] io::Error),
    #[error("reading the answer failed: {0}")]
    Read(#[source] io::Error),
    #[error("the upstream closed the connection before its answer was complete")]
    Closed,
    #[error("the upstream's answer is malformed: {0}")]
    Malformed(&'static str),
    #[error("the upstream's answer head is malformed: {0}")]
    Head(#[source] httparse::Error),
    #[error(
        "the upstream's answer head is over {UPSTREAM_READ_BUF} bytes or {MAX_HEADERS} fields"
    )]
    HeadTooLarge,
    /// The request body's own error: the client's, or its limit.
    #[error("the request body failed: {0}")]
    Body(#[source] BoxError),
    #[error("the request body's length is not the one its head announced")]
    BodyLength,
}

impl Conn {
    pub fn new(io: TcpStream, permit: OwnedSemaphorePermit, home: Arc<Idle>) -> Box<Conn> {
        Box::new(Conn {
            io,
            buf: BytesMut::new(),
            head: Vec::new(),
            home,
            reuse: false,
            _permit: permit,
        })
    }

    /// Lets go of buffers a large head or body left big: an idle connection
    /// keeps at most a typical head's worth.
    fn idle(&mut self) {
        if self.buf.capacity() > FIRST_READ {
            self.buf = BytesMut::new();
        }
        if self.head.capacity() > FIRST_READ {
            self.head = Vec::new();
        }
    }

    /// Whether an idle connection can carry a request: not closed by the
    /// upstream, and nothing arrived unasked. A close that reached the
    /// socket has made it readable; only then is it read (no system call
    /// for a connection the reactor has heard nothing of).
    pub async fn usable(&mut self) -> bool {
        let readable = poll_fn(|cx| Poll::Ready(self.io.poll_read_ready(cx).is_ready())).await;
        if !readable {
            return true;
        }
        let mut probe = [0u8; 1];
        matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Writes `req` (origin form) and its body, and reads the answer's
    /// head; its body reads the rest, and hands the connection back to its
    /// idle list when it may carry another request. An answer that comes
    /// while the body is still going out ends the upload (see `upload`).
    /// `Err` says whether the request may go out again on another
    /// connection: the upstream cannot have acted on it, and its body is
    /// untouched.
    pub async fn exchange<B>(
        mut self: Box<Self>,
        req: &mut Request<B>,
    ) -> Result<Response<Body>, (ExchangeError, bool)>
    where
        B: http_body::Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let framing = upload::write_head(&mut self.head, req);
        let (parts, framing, reuse) = match framing {
            // Nearly every request: the head alone, in one write.
            upload::Framing::None => {
                if let Err(e) = self.io.write_all(&self.head).await {
                    return Err((ExchangeError::Write(e), true));
                }
                self.answer_head(req.method(), false).await?
            }
            // Boxed: only a request with a body pays for its future.
            _ => Box::pin(self.upload(req, framing)).await?,
        };
        let left = match framing {
            Framing::Empty => Left::Done,
            Framing::Length(0) => Left::Done,
            Framing::Length(n) => Left::Length(n),
            Framing::Chunked => Left::Chunked(Chunk::Size),
            Framing::Close => Left::Close,
        };
        self.reuse = reuse;
        let mut body = Body {
            conn: Some(self),
            left,
        };
        body.settle();
        Ok(Response::from_parts(parts, body))
    }

    /// Writes the head and the body, and reads what the upstream sends as
    /// they go, then the answer's head. An answer's head that comes before
    /// the body is all written ends the upload; where the request ended is
    /// then the upstream's to know, so the connection is not reused.
    async fn upload<B>(
        &mut self,
        req: &mut Request<B>,
        framing: upload::Framing,
    ) -> Result<Head, (ExchangeError, bool)>
    where
        B: http_body::Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let mut upload = upload::Upload::new(framing);
        loop {
            let uploaded = poll_fn(|cx| {
                upload.poll(
                    cx,
                    &mut self.io,
                    &mut self.head,
                    &mut self.buf,
                    req.body_mut(),
                )
            })
            .await;
            match uploaded {
                Ok(upload::Uploaded::Whole) => break,
                Ok(upload::Uploaded::Heard) => match read_head(&mut self.buf, req.method()) {
                    Ok(Some((parts, framing, _))) => return Ok((parts, framing, false)),
                    Ok(None) => {}
                    Err(e) => return Err((e, false)),
                },
                // A reused connection the upstream closed as the request
                // went out: it may go again if its body was not touched.
                Err(e @ ExchangeError::Write(_)) => return Err((e, !upload.spent)),
                Err(e) => return Err((e, false)),
            }
        }
        self.answer_head(req.method(), upload.spent).await
    }

    /// Reads the answer's head once the request is written. Nothing read
    /// back before a close lets an idempotent request go out again (the
    /// upstream closed an idle connection as it went), if no body went with it.
    async fn answer_head(
        &mut self,
        method: &Method,
        spent: bool,
    ) -> Result<Head, (ExchangeError, bool)> {
        loop {
            if !self.buf.is_empty() {
                match read_head(&mut self.buf, method) {
                    Ok(Some(head)) => return Ok(head),
                    Ok(None) => {}
                    Err(e) => return Err((e, false)),
                }
            }
            let before = self.buf.len();
            self.buf.reserve(FIRST_READ);
            match poll_fn(|cx| {
                tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
            })
            .await
            {
                Ok(0) => {
                    let again = before == 0 && !spent && method.is_idempotent();
                    return Err((ExchangeError::Closed, again));
                }
                Ok(_) => {}
                Err(e) => return Err((ExchangeError::Read(e), false)),
            }
        }
    }
}

/// One worker's idle connections, at most `max`. Each is boxed from its
/// opening to its close: an answer's body holds it by pointer, and handing
/// it on never moves or allocates it again.
pub struct Idle {
    #[allow(clippy::vec_box)]
    conns: Mutex<Vec<Box<Conn>>>,
    max: usize,
}

impl Idle {
    pub fn new(max: usize) -> Arc<Idle> {
        Arc::new(Idle {
            conns: Mutex::new(Vec::new()),
            max,
        })
    }

    /// The connection put back last (the one most likely still open).
    pub fn take(&self) -> Option<Box<Conn>> {
        self.conns.lock().pop()
    }

    /// A connection whose answer was read whole, for the next request; closed when the list is full.
    fn put(&self, mut conn: Box<Conn>) {
        conn.idle();
        let mut conns = self.conns.lock();
        if conns.len() < self.max {
            conns.push(conn);
        }
    }
}

/// What is left of the answer's body to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    Length(u64),
    Chunked(Chunk),
    Close,
    Done,
}

/// Where a chunked body's reader stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes to go.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer fields (dropped) until an empty line,
    /// this many bytes of them read so far.
    Trailers(u32),
}

/// The answer's body: read from the connection as the client takes it.
/// The connection goes back to its pool when the body is read whole and
/// may be reused; dropped early, the connection closes with it.
pub struct Body {
    conn: Option<Box<Conn>>,
    left: Left,
}

impl Body {
    /// Hands the connection back once the body is read whole: for a small
    /// page, with the head's read, as its body is first asked for.
    fn settle(&mut self) {
        if self.left != Left::Done {
            return;
        }
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Bytes after the answer were asked by nobody: not a connection to trust.
        if conn.reuse && conn.buf.is_empty() {
            conn.home.clone().put(conn);
        }
    }

    /// The next piece of the body from what is buffered, if any can be
    /// taken without reading; `Ok(None)` asks for a read.
    fn take(&mut self) -> Result<Option<Bytes>, ExchangeError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        let buf = &mut conn.buf;
        loop {
            match self.left {
                Left::Done => return Ok(None),
                Left::Length(n) | Left::Chunked(Chunk::Data(n)) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = usize::try_from(n).map_or(buf.len(), |n| n.min(buf.len()));
                    let rest = n - take as u64;
                    self.left = match (self.left, rest) {
                        (Left::Length(_), 0) => Left::Done,
                        (Left::Length(_), r) => Left::Length(r),
                        (_, 0) => Left::Chunked(Chunk::DataEnd),
                        (_, r) => Left::Chunked(Chunk::Data(r)),
                    };
                    return Ok(Some(buf.split_to(take).freeze()));
                }
                Left::Close => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(buf.split().freeze()));
                }
                Left::Chunked(Chunk::Size) => {
                    let Some(line) = line(buf, MAX_CHUNK_LINE)? else {
                        return Ok(None);
                    };
                    let size = chunk_size(&line)?;
                    self.left = Left::Chunked(match size {
                        0 => Chunk::Trailers(0),
                        n => Chunk::Data(n),
                    });
                }
                Left::Chunked(Chunk::DataEnd) => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(ExchangeError::Malformed("a chunk longer than its size"));
                    }
                    buf.advance(2);
                    self.left = Left::Chunked(Chunk::Size);
                }
                Left::Chunked(Chunk::Trailers(seen)) => {
                    let Some(field) = line(buf, MAX_TRAILERS.saturating_sub(seen as usize))? else {
                        return Ok(None);
                    };
                    self.left = match field.is_empty() {
                        true => Left::Done,
                        // At most MAX_TRAILERS and a line: it fits.
                        false => Left::Chunked(Chunk::Trailers(seen + field.len() as u32 + 2)),
                    };
                }
            }
        }
    }
}

/// One line ending in CRLF at the start of `buf`, taken off it (without
/// its CRLF); `None` while it is incomplete. A line over `max` bytes, or
/// one with a CR or LF of its own, is an error.
fn line(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, ExchangeError> {
    let Some(end) = buf.iter().take(max + 2).position(|&b| b == b'\n') else {
        return match buf.len() > max {
            true => Err(ExchangeError::Malformed(
                "a chunk line or trailer over its bound",
            )),
            false => Ok(None),
        };
    };
    if end == 0 || buf[end - 1] != b'\r' || buf[..end - 1].contains(&b'\r') {
        return Err(ExchangeError::Malformed("a chunk line not ended by CRLF"));
    }
    let line = buf.split_to(end + 1).freeze();
    Ok(Some(line.slice(..end - 1)))
}

/// A chunk-size line's size: 1 to 16 hex digits, then nothing or extensions
/// (`;` after optional whitespace), which are ignored.
fn chunk_size(line: &[u8]) -> Result<u64, ExchangeError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let after = &line[digits..];
    let extensions = after.is_empty() || after.trim_ascii_start().starts_with(b";");
    let control = after.iter().any(|&b| b.is_ascii_control() && b != b'\t');
    // 16 hex digits fill a u64: no size can overflow.
    if digits == 0 || digits > 16 || !extensions || control {
        return Err(ExchangeError::Malformed("an invalid chunk size"));
    }
    let value = |d: u8| {
        u64::from(if d.is_ascii_digit() {
            d - b'0'
        } else {
            (d | 0x20) - b'a' + 10
        })
    };
    Ok(line[..digits].iter().fold(0, |n, &d| n << 4 | value(d)))
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            match this.take() {
                Ok(Some(data)) => {
                    this.settle();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(None) if this.left == Left::Done => {
                    this.settle();
                    return Poll::Ready(None);
                }
                Ok(None) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            let want = match this.left {
                Left::Length(n) | Left::Chunked(Chunk::Data(n)) => usize::try_from(n)
                    .map_or(UPSTREAM_READ_BUF, |n| {
                        n.clamp(FIRST_READ, UPSTREAM_READ_BUF)
                    }),
                _ => FIRST_READ,
            };
            conn.buf.reserve(want);
            let read = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut conn.io),
                cx,
                &mut conn.buf
            ));
            match read {
                Ok(0) if this.left == Left::Close => {
                    this.left = Left::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(ExchangeError::Closed.into())));
                }
                Ok(_) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(ExchangeError::Read(e).into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == Left::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Left::Done => SizeHint::with_exact(0),
            Left::Length(n) => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

mod head;
mod upload;

#[cfg(test)]
mod tests;
