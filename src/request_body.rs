//! A request body as it goes to the upstream: none, read whole into memory, set aside in a temp file, or streamed as it arrives.
//!
//! The type lives apart from `buffering` (which reads bodies and
//! sits above the balancer) so the forwarding modules below can name it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;

use crate::body::{BoxError, FileChunks};

/// A request body on its way to the upstream, cut off at `server.max_request_body`.
pub type UpstreamBody = http_body_util::Limited<RequestBody>;

/// A request body as it goes to the upstream.
pub enum RequestBody {
    /// No body at all.
    Empty,
    /// Read whole, held in memory. `declared`: the client sent a
    /// Content-Length, so the upstream gets one too; a chunked body stays
    /// chunked (the framing the client chose passes on unchanged).
    Memory {
        chunks: VecDeque<Bytes>,
        left: u64,
        declared: bool,
    },
    /// Read whole, set aside in a temp file, read back while forwarding.
    File(Box<Spilled>),
    /// Passed through as it arrives (upgrade requests).
    Streaming(Incoming),
}

/// A body in a temp file, at its start.
pub struct Spilled {
    chunks: FileChunks,
    declared: bool,
}

/// A body already whole (a request built in memory, as tests of the app
/// without sockets do): it keeps a Content-Length.
impl From<Bytes> for RequestBody {
    fn from(bytes: Bytes) -> RequestBody {
        if bytes.is_empty() {
            return RequestBody::Empty;
        }
        RequestBody::Memory {
            left: bytes.len() as u64,
            chunks: VecDeque::from([bytes]),
            declared: true,
        }
    }
}

impl From<Incoming> for RequestBody {
    fn from(body: Incoming) -> RequestBody {
        RequestBody::Streaming(body)
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Memory { chunks, left, .. } => Poll::Ready(chunks.pop_front().map(|c| {
                *left -= c.len() as u64;
                Ok(Frame::data(c))
            })),
            RequestBody::File(spilled) => Pin::new(&mut spilled.chunks).poll_frame(cx),
            RequestBody::Streaming(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(BoxError::from))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Empty => true,
            RequestBody::Memory { left, .. } => *left == 0,
            RequestBody::File(spilled) => spilled.chunks.left() == 0,
            RequestBody::Streaming(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::Memory { left, declared, .. } => known(*left, *declared),
            RequestBody::File(spilled) => known(spilled.chunks.left(), spilled.declared),
            RequestBody::Streaming(body) => body.size_hint(),
        }
    }
}

/// An exact hint makes hyper send Content-Length; an open one, chunked.
fn known(left: u64, declared: bool) -> SizeHint {
    if declared {
        SizeHint::with_exact(left)
    } else {
        SizeHint::default()
    }
}

impl Spilled {
    /// A body of `left` bytes in `file`, positioned at its start.
    pub fn new(file: tokio::fs::File, left: u64, declared: bool) -> Spilled {
        Spilled {
            chunks: FileChunks::new(file, left),
            declared,
        }
    }
}
