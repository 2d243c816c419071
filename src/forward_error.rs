//! The one forwarding error: what failed, on whose side, whether the request may go to another server, and the cause.
//!
//! Every step between a client's body and an upstream's answer fails with
//! this type (reading the body, waiting for a place, picking a server,
//! sending over HTTP, HTTPS or FastCGI), so a new failure is one [`Kind`]:
//! its metric label, its side and its answer (in `problem.rs`) are
//! exhaustive matches that do not compile until it is given each.

use std::error::Error as StdError;
use std::fmt;

use crate::body::BoxError;
use crate::problem::{Origin, Problem};

/// Seconds a client is told to wait after a busy (queue full) answer.
const BUSY_RETRY_AFTER_SECS: u64 = 1;

/// What failed. [`Kind::label`] is the `kind` of `tollgate_upstream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No connection to a server could be made (TCP, TLS, php-fpm's socket).
    Connect,
    /// The server did not answer within the upstream's `timeout`.
    Timeout,
    /// The exchange broke once a connection was made.
    Exchange,
    /// php-fpm refused the request (overloaded, or no multiplexing).
    Refused,
    /// Every server of the upstream is marked down.
    NoLiveServer,
    /// Every server is at `max_conns` and the wait queue is full.
    QueueFull,
    /// No server came free within `queue_timeout`.
    QueueTimeout,
    /// No place among the client connection's upstream exchanges came free in time.
    ShareTimeout,
    /// The request body is over `server.max_request_body`.
    BodyTooLarge { limit: u64 },
    /// The request body stalled or trickled below the minimum rate.
    BodyTimeout,
    /// The client's request body is malformed or cut short.
    ClientBody,
    /// The request body could not be set aside in a temp file.
    BodySpill,
}

impl Kind {
    /// The metric label (the values dashboards and alerts already read).
    pub fn label(self) -> &'static str {
        match self {
            Kind::Connect => "connect",
            Kind::Timeout => "timeout",
            Kind::Exchange => "other",
            Kind::Refused => "refused",
            Kind::NoLiveServer => "no_live_server",
            Kind::QueueFull => "queue_full",
            Kind::QueueTimeout => "queue_timeout",
            Kind::ShareTimeout => "share_timeout",
            Kind::BodyTooLarge { .. } => "body_too_large",
            Kind::BodyTimeout => "body_timeout",
            Kind::ClientBody => "client_body",
            Kind::BodySpill => "body_spill",
        }
    }

    /// Whose side failed: the same origin the access log gives the answer.
    pub fn origin(self) -> Origin {
        match self {
            Kind::Connect
            | Kind::Timeout
            | Kind::Exchange
            | Kind::Refused
            | Kind::NoLiveServer
            | Kind::QueueFull
            | Kind::QueueTimeout
            | Kind::ShareTimeout => Origin::Upstream,
            Kind::BodyTooLarge { .. } | Kind::BodyTimeout | Kind::ClientBody => Origin::Downstream,
            Kind::BodySpill => Origin::Internal,
        }
    }
}

/// A failed forward: its kind, the upstream it was for, whether the request
/// never left (so another server may take it), what happened and why.
#[derive(Debug)]
pub struct ForwardError {
    pub kind: Kind,
    /// The upstream's name; `None` while the body is still being read.
    pub upstream: Option<String>,
    /// The request never reached a server: it may be sent to another one.
    pub retry: bool,
    what: String,
    cause: Option<BoxError>,
}

impl ForwardError {
    /// A failure of `kind`, described for the log by `what`.
    pub fn new(kind: Kind, what: impl Into<String>) -> ForwardError {
        ForwardError {
            kind,
            upstream: None,
            retry: false,
            what: what.into(),
            cause: None,
        }
    }

    /// A body over `server.max_request_body`, found while reading or sending it.
    pub fn body_too_large(limit: u64) -> ForwardError {
        ForwardError::new(
            Kind::BodyTooLarge { limit },
            format!("the request body exceeds {limit} bytes"),
        )
    }

    /// The client's own request body broke: malformed, or cut short when its
    /// connection closed. Whichever upstream it was going to, the answer is
    /// the same 400.
    pub fn client_body(reason: impl fmt::Display) -> ForwardError {
        ForwardError::new(
            Kind::ClientBody,
            format!("the client's request body is malformed or cut short: {reason}"),
        )
    }

    /// The failure happened on the way to `upstream`.
    pub fn on(mut self, upstream: &str) -> ForwardError {
        self.upstream = Some(upstream.to_string());
        self
    }

    /// The error underneath, kept as the source.
    pub fn because(mut self, cause: impl Into<BoxError>) -> ForwardError {
        self.cause = Some(cause.into());
        self
    }

    /// The request came back unsent.
    pub fn unsent(mut self) -> ForwardError {
        self.retry = true;
        self
    }

    pub fn origin(&self) -> Origin {
        self.kind.origin()
    }

    /// Whether the client's own request broke (a malformed or stalled body):
    /// logged quietly and not counted in `tollgate_upstream_errors_total`.
    /// A body over the limit is the client's too, but it has always been
    /// counted there, as an upstream-facing refusal worth watching.
    pub fn is_client_fault(&self) -> bool {
        matches!(self.kind, Kind::BodyTimeout | Kind::ClientBody)
    }

    /// Whether this failure counts against the server's passive health: a
    /// body over our limit is the client's doing, not the server's.
    pub fn counts_against_server(&self) -> bool {
        !matches!(self.kind, Kind::BodyTooLarge { .. })
    }
}

impl fmt::Display for ForwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl StdError for ForwardError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn StdError + 'static))
    }
}

/// The one answer each failure gets (written by `problem.rs` like every other).
impl From<ForwardError> for Problem {
    fn from(e: ForwardError) -> Problem {
        let upstream = e.upstream.unwrap_or_default();
        match e.kind {
            Kind::Connect | Kind::Exchange | Kind::Refused | Kind::NoLiveServer => {
                Problem::UpstreamUnreachable { upstream }
            }
            Kind::Timeout | Kind::ShareTimeout => Problem::UpstreamTimeout { upstream },
            Kind::QueueFull | Kind::QueueTimeout => Problem::UpstreamBusy {
                upstream,
                retry_after: BUSY_RETRY_AFTER_SECS,
            },
            Kind::BodyTooLarge { limit } => Problem::BodyTooLarge { limit },
            Kind::BodyTimeout => Problem::BodyTimeout,
            Kind::ClientBody => {
                Problem::BadRequest("The request body is malformed or ended early.".into())
            }
            Kind::BodySpill => Problem::BodyNotStored,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY_KIND: [Kind; 12] = [
        Kind::Connect,
        Kind::Timeout,
        Kind::Exchange,
        Kind::Refused,
        Kind::NoLiveServer,
        Kind::QueueFull,
        Kind::QueueTimeout,
        Kind::ShareTimeout,
        Kind::BodyTooLarge { limit: 1 },
        Kind::BodyTimeout,
        Kind::ClientBody,
        Kind::BodySpill,
    ];

    #[test]
    fn every_kind_is_answered_from_the_side_it_names() {
        for kind in EVERY_KIND {
            let e = ForwardError::new(kind, "failed").on("app");
            let origin = e.origin();
            assert_eq!(Problem::from(e).origin(), origin, "{kind:?}");
        }
    }

    #[test]
    fn the_cause_is_kept_as_the_source_and_the_upstream_named_in_the_answer() {
        let io = std::io::Error::other("connection reset");
        let e = ForwardError::new(Kind::Exchange, "forwarding to upstream app failed")
            .on("app")
            .because(io);
        assert_eq!(e.source().unwrap().to_string(), "connection reset");
        assert!(!e.retry && !e.is_client_fault() && e.counts_against_server());
        match Problem::from(e) {
            Problem::UpstreamUnreachable { upstream } => assert_eq!(upstream, "app"),
            other => panic!("{other:?}"),
        }
    }
}
