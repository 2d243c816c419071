//! The timers of one client connection: first byte, request head and idle ([`watch`]), and the send timeout ([`Watched`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Activity, Connections, H2_PREFACE};
use crate::metrics::{inc, Counter};

/// Waits until the connection should be closed: `Silent` when the client sent
/// nothing within `header` of connecting, `SlowHead` when a request head
/// started arriving `header` ago and is not complete, `Idle` when no request
/// ran or started for `idle`. Between requests only `idle` applies: a
/// kept-alive connection may wait that long for its next request.
///
/// After the first byte, the timer is lazy: nothing wakes it when a request
/// starts or ends; it sleeps at most `header` at a time and reads the
/// connection's state when it wakes. A head that starts at `t` began after
/// the last wake, so that wake's sleep ends by `t + header`, and from there
/// the timer sleeps exactly to the head's deadline: a stalled head is still
/// cut at `header`, idleness at `idle`. A wake-up per request (a `Notify`
/// when each head started) re-polled the whole connection, a read that
/// could only say "not yet" included, and reset a timer: ~1,700
/// instructions per request (callgrind). An idle connection now wakes every
/// `header` (10 s by default) instead, and never more often than every
/// [`LAZY_STEP_MIN`]: with a header timeout below it a stalled head is cut
/// up to that much late (with 0, an idle connection's timer woke on every
/// timer tick: ~3 % of a core per connection, measured).
pub async fn watch(activity: &Activity, header: Duration, idle: Duration) -> Closing {
    tokio::select! {
        _ = tokio::time::sleep(header) => {
            if !activity.read_any() {
                return Closing::Silent;
            }
        }
        _ = activity.first_byte.notified() => {}
    }
    loop {
        let wait = match activity.head_for() {
            Some(head_for) if head_for >= header => return Closing::SlowHead,
            Some(head_for) => header - head_for,
            None => {
                let idle_for = activity.idle_for();
                if idle_for >= idle {
                    return Closing::Idle;
                }
                idle - idle_for
            }
        };
        tokio::time::sleep(wait.min(header.max(LAZY_STEP_MIN))).await;
    }
}

/// The shortest sleep of [`watch`]'s lazy timer.
const LAZY_STEP_MIN: Duration = Duration::from_millis(100);

/// Why [`watch`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    Silent,
    SlowHead,
    Idle,
}

/// The client side of a connection, noting when its first byte arrives and
/// failing it when a write stays blocked past `server.send_timeout` (nginx's
/// `send_timeout`): a client that stops reading is closed, and the response
/// body it was being sent (with the upstream connection behind it) dropped.
///
/// While a write is blocked, hyper stops pulling the response body, so what
/// a slow reader holds stays bounded (see `server::H2_SEND_BUF` and the
/// per-connection figure there, about 160 KiB); this timer bounds for how long.
pub struct Watched<I> {
    inner: I,
    activity: Arc<Activity>,
    send: Option<SendTimer>,
}

/// How long a write may stay blocked, and since when it has been.
struct SendTimer {
    timeout: Duration,
    /// Armed by the first write that cannot proceed, disarmed by the next that does.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    closed: Counter,
}

impl<I> Watched<I> {
    pub fn new(inner: I, activity: Arc<Activity>) -> Watched<I> {
        Watched {
            inner,
            activity,
            send: None,
        }
    }

    /// Fails the connection when a write stays blocked for `timeout`.
    pub fn send_timeout(mut self, timeout: Duration, connections: &Connections) -> Watched<I> {
        self.send = Some(SendTimer {
            timeout,
            stalled: None,
            closed: connections.closed_send_timeout.clone(),
        });
        self
    }

    /// Passes `polled` on, arming the send timer while writes block and
    /// turning a block that outlived it into an error.
    fn pace<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        let Some(timer) = self.send.as_mut() else {
            return polled;
        };
        if polled.is_ready() {
            timer.stalled = None;
            return polled;
        }
        let timeout = timer.timeout;
        let sleep = timer
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        inc(&timer.closed);
        timer.stalled = None;
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client read nothing within send_timeout",
        )))
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            if !self.activity.read_any() && !self.activity.read_any.swap(true, Ordering::Relaxed) {
                // A client that opens HTTP/2 and waits (a browser's preconnect)
                // is idle, not slow: its preface is no request head.
                if buf.filled()[before..].starts_with(H2_PREFACE) {
                    self.activity.set_multiplexed();
                }
                self.activity.first_byte.notify_one();
            }
            self.activity.bytes_read();
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.pace(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.pace(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.pace(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.pace(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
