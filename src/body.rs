//! The response body tollgate sends: a small body of its own, or the upstream's, streamed.

use std::any::Any;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;

/// A request body on its way to the upstream, cut off at `server.max_request_body`.
pub type UpstreamBody = http_body_util::Limited<Incoming>;

/// Kept alive as long as the body is (a concurrency slot, for instance):
/// dropped when the last byte went out or the client went away.
pub type Guard = Box<dyn Any + Send + Sync>;

pub enum Body {
    Full(Option<Bytes>),
    Upstream {
        inner: Incoming,
        _guard: Option<Guard>,
    },
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        let b = bytes.into();
        Body::Full((!b.is_empty()).then_some(b))
    }

    pub fn empty() -> Body {
        Body::Full(None)
    }

    pub fn upstream(inner: Incoming, guard: Option<Guard>) -> Body {
        Body::Upstream {
            inner,
            _guard: guard,
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut *self {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Upstream { inner, .. } => Pin::new(inner).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::Upstream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Upstream { inner, .. } => inner.size_hint(),
        }
    }
}
