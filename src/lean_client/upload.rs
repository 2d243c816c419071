//! A request as it goes out on a lean connection: its head, then its body (as long as the upstream has not answered yet).
//!
//! The body's framing is the one hyper's client chose: the client's own
//! `Content-Length` when it sent one (a body read whole has exactly that
//! length), an exact length as `Content-Length` when the body knows it, and
//! chunked otherwise. While the body goes out, the socket is read too: an
//! upstream that answers early (a 413 before the upload ends) and stops
//! reading gets its answer read, not a write blocked until the timeout. The
//! body is then left where it stopped, and the connection is closed after
//! the answer: where the request ended is something only the upstream knows.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{header, Request};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::{BoxError, ExchangeError};

/// Body pieces up to this size are copied behind what is waiting to go out
/// (the head, the chunk lines), so a small body leaves in the head's write;
/// larger ones are written from their own buffer.
const COPIED: usize = 16 * 1024;

/// How the request's body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body: nothing after the head.
    None,
    /// This many bytes, as the `Content-Length` sent says.
    Length(u64),
    Chunked,
}

/// Method, target, `HTTP/1.1`, the fields, the body's framing, an empty
/// line: what hyper's client writes. Returns how the body is framed.
pub(super) fn write_head<B: http_body::Body>(out: &mut Vec<u8>, req: &Request<B>) -> Framing {
    out.clear();
    out.extend_from_slice(req.method().as_str().as_bytes());
    out.push(b' ');
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in req.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let body = req.body();
    let declared = || {
        let length = req.headers().get(header::CONTENT_LENGTH)?;
        super::head::digits(length.as_bytes())
    };
    let framing = if body.is_end_stream() {
        Framing::None
    } else if let Some(n) = declared() {
        Framing::Length(n)
    } else if let Some(n) = body.size_hint().exact() {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
        Framing::Length(n)
    } else {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Framing::Chunked
    };
    out.extend_from_slice(b"\r\n");
    framing
}

/// A request with a body on its way out: what is waiting to be written,
/// and where its body stands. (A request without one is its head alone,
/// written in one write.)
pub(super) struct Upload {
    framing: Framing,
    /// Written from `at` on: the head, chunk lines, small body pieces.
    at: usize,
    /// A large body piece, written after `out` and before `after`.
    piece: Bytes,
    /// The CRLF after a large chunk's data.
    after: &'static [u8],
    /// What the body may still give (`Framing::Length`).
    left: u64,
    /// The body's first pieces have joined the head in `out`.
    joined: bool,
    /// The body has ended and its end (the last chunk) is queued.
    ended: bool,
    /// Some of the body was taken from the request: it cannot go out again.
    pub(super) spent: bool,
}

/// Where an upload stopped.
pub(super) enum Uploaded {
    /// All of it is written; the answer is to be read.
    Whole,
    /// Bytes arrived before the body was all written: an early answer, or
    /// the start of one (or an interim `100 Continue`). The upload goes
    /// on from here when it is not a whole answer head yet.
    Heard,
}

impl Upload {
    pub(super) fn new(framing: Framing) -> Upload {
        Upload {
            framing,
            at: 0,
            piece: Bytes::new(),
            after: b"",
            left: match framing {
                Framing::Length(n) => n,
                _ => 0,
            },
            joined: false,
            ended: false,
            spent: false,
        }
    }

    /// Writes `out` (the head first) and the body, reading the socket
    /// into `buf` as it goes, and stops when bytes arrive.
    pub(super) fn poll<B>(
        &mut self,
        cx: &mut Context<'_>,
        io: &mut TcpStream,
        out: &mut Vec<u8>,
        buf: &mut BytesMut,
        body: &mut B,
    ) -> Poll<Result<Uploaded, ExchangeError>>
    where
        B: http_body::Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        loop {
            if heard(cx, io, buf)? {
                return Poll::Ready(Ok(Uploaded::Heard));
            }
            if !self.joined {
                // A small body leaves with its head, in one write.
                self.joined = true;
                std::task::ready!(self.fill(cx, out, body))?;
            }
            if self.at < out.len() {
                let n = std::task::ready!(Pin::new(&mut *io).poll_write(cx, &out[self.at..]))
                    .map_err(ExchangeError::Write)?;
                self.at += n;
                continue;
            }
            if !self.piece.is_empty() {
                let n = std::task::ready!(Pin::new(&mut *io).poll_write(cx, &self.piece))
                    .map_err(ExchangeError::Write)?;
                self.piece.advance(n);
                continue;
            }
            if !self.after.is_empty() {
                let n = std::task::ready!(Pin::new(&mut *io).poll_write(cx, self.after))
                    .map_err(ExchangeError::Write)?;
                self.after = &self.after[n..];
                continue;
            }
            if self.ended {
                return Poll::Ready(Ok(Uploaded::Whole));
            }
            out.clear();
            self.at = 0;
            std::task::ready!(self.fill(cx, out, body))?;
        }
    }

    /// Takes the body's next pieces behind what `out` holds (or into
    /// `piece`), with their chunk lines; small pieces are gathered while the
    /// body has them ready.
    fn fill<B>(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<u8>,
        body: &mut B,
    ) -> Poll<Result<(), ExchangeError>>
    where
        B: http_body::Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        while out.len() < COPIED {
            let frame = match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending if !out.is_empty() => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
                Poll::Ready(frame) => frame,
            };
            let Some(frame) = frame else {
                if self.framing == Framing::Chunked {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                if self.left != 0 {
                    return Poll::Ready(Err(ExchangeError::BodyLength));
                }
                self.ended = true;
                return Poll::Ready(Ok(()));
            };
            self.spent = true;
            let frame = frame.map_err(|e| ExchangeError::Body(e.into()))?;
            // Trailers are not sent on: as nginx, a request's end is its last chunk.
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if data.is_empty() {
                continue;
            }
            let chunked = self.framing == Framing::Chunked;
            if !chunked {
                // More than the Content-Length sent: the rest would be read
                // as the next request.
                let n = data.len() as u64;
                if n > self.left {
                    return Poll::Ready(Err(ExchangeError::BodyLength));
                }
                self.left -= n;
            }
            if chunked {
                let mut line = [0u8; 18];
                out.extend_from_slice(hex(data.len(), &mut line));
            }
            if data.len() <= COPIED {
                out.extend_from_slice(&data);
                if chunked {
                    out.extend_from_slice(b"\r\n");
                }
            } else {
                self.piece = data;
                self.after = if chunked { b"\r\n" } else { b"" };
                return Poll::Ready(Ok(()));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Reads what the upstream sent while the body goes out: true when bytes
/// arrived. A close before an answer is an error: the request can no
/// longer be answered.
fn heard(
    cx: &mut Context<'_>,
    io: &mut TcpStream,
    buf: &mut BytesMut,
) -> Result<bool, ExchangeError> {
    buf.reserve(super::FIRST_READ);
    match tokio_util::io::poll_read_buf(Pin::new(io), cx, buf) {
        Poll::Pending => Ok(false),
        Poll::Ready(Ok(0)) => Err(ExchangeError::Closed),
        Poll::Ready(Ok(_)) => Ok(true),
        Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Poll::Ready(Err(e)) => Err(ExchangeError::Read(e)),
    }
}

/// `n` as a chunk-size line: hex digits and CRLF.
fn hex(n: usize, line: &mut [u8; 18]) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut at = 16;
    let mut n = n;
    loop {
        at -= 1;
        line[at] = DIGITS[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    line[16] = b'\r';
    line[17] = b'\n';
    &line[at..]
}
