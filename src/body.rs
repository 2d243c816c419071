//! The response body tollgate sends: a small body of its own, or the upstream's, streamed.

use std::any::Any;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;

/// Kept alive as long as the body is (a concurrency slot, for instance):
/// dropped when the last byte went out or the client went away.
pub type Guard = Box<dyn Any + Send + Sync>;

/// Two guards kept alive together, either of which may be absent: what a
/// response body holds (a concurrency slot, a server's place, a connection
/// on its way back, a place in the client connection's share) adds up here.
pub fn join(a: Option<Guard>, b: Option<Guard>) -> Option<Guard> {
    match (a, b) {
        (None, None) => None,
        (Some(g), None) | (None, Some(g)) => Some(g),
        (Some(a), Some(b)) => Some(Box::new((a, b))),
    }
}

/// Told how many body bytes went out, once: when the body ended or was dropped.
pub trait Done: Send + Sync {
    fn done(self: Box<Self>, bytes_out: u64);
}

/// A body that counts what it sends and reports it when it ends.
pub struct Tracked {
    inner: Body,
    bytes: u64,
    done: Option<Box<dyn Done>>,
}

impl Tracked {
    fn finish(&mut self) {
        if let Some(d) = self.done.take() {
            d.done(self.bytes);
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.finish();
    }
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body tollgate produces itself while streaming (a FastCGI response, a file).
pub type Streamed = BoxBody<Bytes, BoxError>;

/// What an upstream answers with: an HTTP upstream's body as hyper reads
/// it, or as the request's task reads it (an answer to a request without a
/// body), or a body another protocol's client streams.
pub enum Forwarded {
    Http(Incoming),
    Lean(crate::lean_client::Body),
    Streamed(Streamed),
}

impl From<Incoming> for Forwarded {
    fn from(b: Incoming) -> Forwarded {
        Forwarded::Http(b)
    }
}

pub enum Body {
    Full(Option<Bytes>),
    Upstream {
        inner: Forwarded,
        _guard: Option<Guard>,
    },
    Tracked(Box<Tracked>),
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        let b = bytes.into();
        Body::Full((!b.is_empty()).then_some(b))
    }

    pub fn empty() -> Body {
        Body::Full(None)
    }

    /// The length of a body held whole in memory (our own answers); `None`
    /// for one that streams, whose size only its headers may tell.
    pub fn held_len(&self) -> Option<u64> {
        match self {
            Body::Full(b) => Some(b.as_ref().map_or(0, |b| b.len() as u64)),
            _ => None,
        }
    }

    /// Wraps `inner` so that `done` learns the bytes sent when it ends or is dropped.
    pub fn tracked(inner: Body, done: Box<dyn Done>) -> Body {
        Body::Tracked(Box::new(Tracked {
            inner,
            bytes: 0,
            done: Some(done),
        }))
    }

    pub fn upstream(inner: impl Into<Forwarded>, guard: Option<Guard>) -> Body {
        Body::Upstream {
            inner: inner.into(),
            _guard: guard,
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Upstream {
                inner: Forwarded::Http(inner),
                ..
            } => Pin::new(inner)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(BoxError::from))),
            Body::Upstream {
                inner: Forwarded::Lean(inner),
                ..
            } => Pin::new(inner).poll_frame(cx),
            Body::Upstream {
                inner: Forwarded::Streamed(inner),
                ..
            } => Pin::new(inner).poll_frame(cx),
            Body::Tracked(t) => {
                let polled = Pin::new(&mut t.inner).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Some(data) = frame.data_ref() {
                            t.bytes += data.len() as u64;
                        }
                    }
                    Poll::Ready(None) | Poll::Ready(Some(Err(_))) => t.finish(),
                    Poll::Pending => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Upstream { inner, .. } => match inner {
                Forwarded::Http(b) => b.is_end_stream(),
                Forwarded::Lean(b) => b.is_end_stream(),
                Forwarded::Streamed(b) => b.is_end_stream(),
            },
            Body::Tracked(t) => t.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Upstream { inner, .. } => match inner {
                Forwarded::Http(b) => b.size_hint(),
                Forwarded::Lean(b) => b.size_hint(),
                Forwarded::Streamed(b) => b.size_hint(),
            },
            Body::Tracked(t) => t.inner.size_hint(),
        }
    }
}

/// What one read of a file hands on.
const FILE_CHUNK: usize = 64 * 1024;

/// `left` bytes of a file, read in 64 KiB pieces as the peer takes them
/// (tokio runs each read on its blocking pool): a static file PHP does not
/// serve, or a request body set aside in a temp file.
pub struct FileChunks {
    file: tokio::fs::File,
    buf: BytesMut,
    left: u64,
}

impl FileChunks {
    /// The next `left` bytes of `file`, from where it is positioned.
    pub fn new(file: tokio::fs::File, left: u64) -> FileChunks {
        FileChunks {
            file,
            buf: BytesMut::new(),
            left,
        }
    }

    /// Bytes still to hand on.
    pub fn left(&self) -> u64 {
        self.left
    }
}

impl http_body::Body for FileChunks {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let want = usize::try_from(this.left).map_or(FILE_CHUNK, |l| l.min(FILE_CHUNK));
        if this.buf.capacity() < want {
            this.buf.reserve(want);
        }
        let n = match tokio_util::io::poll_read_buf(Pin::new(&mut this.file), cx, &mut this.buf) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Ok(0)) => {
                return Poll::Ready(Some(Err(
                    "the file ended before its announced length".into()
                )))
            }
            Poll::Ready(Ok(n)) => n,
        };
        // A file that grew meanwhile sends no more than was announced.
        let n = n.min(usize::try_from(this.left).unwrap_or(usize::MAX));
        this.left -= n as u64;
        let chunk = this.buf.split_to(n).freeze();
        this.buf.clear();
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
