//! Storing an upstream's answer: whether it may be, its body read whole (up to `cache.max_entry_size`), the entry made and put under its key.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, Uri};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;

use crate::body::{Body, BoxError};
use crate::cache::key::Key;
use crate::cache::{policy, Entry, ResponseCache};
use crate::config::cache::RouteCacheConfig;
use crate::limiter::Nanos;

/// What became of an answer.
pub(super) enum KeptAnswer {
    Stored(Arc<Entry>),
    /// Not stored: the answer, its body whole as it came.
    Passed(Response<Body>),
    /// The upstream's answer, not storable by its status and headers
    /// (RFC 9111, the route's rules), and no server error: the answer as
    /// it came. The key's next answer is likely the same, so it is
    /// remembered a while. (A failing upstream is not: its next answer may
    /// be storable, and meanwhile one request at a time asks it.)
    Unstorable(Response<Body>),
}

/// Stores `resp` (the upstream's answer to the request keyed `base`, whose
/// headers were `request`) if the route and RFC 9111 allow. tollgate's
/// own answers (a problem, a page) are never stored: only a body that came
/// from the upstream.
#[allow(clippy::too_many_arguments)]
pub(super) async fn keep(
    cache: &ResponseCache,
    rc: &RouteCacheConfig,
    base: &Key,
    uri: &Uri,
    request: &HeaderMap,
    resp: Response<Body>,
    compress: bool,
    now: Nanos,
) -> KeptAnswer {
    let from_upstream = matches!(resp.body(), Body::Upstream { .. });
    let freshness = policy::freshness(uri, resp.status(), resp.headers(), rc, now);
    let (Some(freshness), Some(vary), true) =
        (freshness, policy::vary(resp.headers()), from_upstream)
    else {
        return match from_upstream && !resp.status().is_server_error() {
            true => KeptAnswer::Unstorable(resp),
            false => KeptAnswer::Passed(resp),
        };
    };
    let (parts, body) = resp.into_parts();
    let max = cache.settings().max_entry_size;
    let body = match whole(body, max).await {
        Ok(bytes) => bytes,
        Err(resumed) => return KeptAnswer::Passed(Response::from_parts(parts, resumed)),
    };
    let key_len = base.len();
    let entry = Arc::new(Entry::new(
        parts.status,
        parts.headers,
        body,
        now,
        freshness,
        compress,
        key_len,
    ));
    match cache.store(base, &vary, request, entry.clone()) {
        Some(_) => KeptAnswer::Stored(entry),
        None => KeptAnswer::Passed(Response::from_parts(
            http::response::Parts::clone_head(&entry),
            Body::full(entry.body.clone()),
        )),
    }
}

/// The head of a stored answer, for one the cache would not take after all.
trait CloneHead {
    fn clone_head(e: &Entry) -> http::response::Parts;
}

impl CloneHead for http::response::Parts {
    fn clone_head(e: &Entry) -> http::response::Parts {
        let mut r = Response::new(());
        *r.status_mut() = e.status;
        *r.headers_mut() = e.headers.clone();
        r.into_parts().0
    }
}

/// The body whole, if it ends within `max` bytes; else (or when it breaks)
/// a body that gives what was read, then the rest (or the error).
async fn whole(mut body: Body, max: u64) -> Result<Bytes, Body> {
    let mut read = BytesMut::new();
    loop {
        match body.frame().await {
            None => return Ok(read.freeze()),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
                if read.len() as u64 > max {
                    return Err(Resumed::body(read.freeze(), Ok(body)));
                }
            }
            Some(Err(e)) => return Err(Resumed::body(read.freeze(), Err(Some(e)))),
        }
    }
}

/// What was read ahead, then the rest of the body (or the error it broke with).
struct Resumed {
    read: Option<Bytes>,
    rest: Result<Body, Option<BoxError>>,
}

impl Resumed {
    fn body(read: Bytes, rest: Result<Body, Option<BoxError>>) -> Body {
        let resumed = Resumed {
            read: (!read.is_empty()).then_some(read),
            rest,
        };
        let boxed = http_body_util::combinators::BoxBody::new(resumed);
        Body::upstream(crate::body::Forwarded::Streamed(boxed), None)
    }
}

impl http_body::Body for Resumed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(read) = self.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        match &mut self.rest {
            Ok(body) => Pin::new(body).poll_frame(cx),
            Err(e) => Poll::Ready(e.take().map(Err)),
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
