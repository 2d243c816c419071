//! The one store error: what failed ([`StoreFailure`]), in which backend, why (its cause), and what it means in words.
//!
//! One value for every backend, as pingora's `Error` is for every proxy
//! failure: the app asks `kind` (a circuit breaker open is not counted as a
//! new failure) and shows the words; a backend builds it where it fails,
//! with the facts it has there (a path, a count, a duration).

use std::borrow::Cow;
use std::fmt;

/// What failed, whichever backend it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailure {
    /// The store could not be opened at start.
    Open,
    /// The store's file is not one of ours; it is left alone.
    Corrupt,
    /// Another process holds the store.
    InUse,
    /// What was counted could not be made durable before exit.
    NotSaved,
    /// The backend's worker has stopped, or could not start.
    Stopped,
    /// The backend answered with an error, or the connection failed.
    Failed,
    /// No answer within `store.timeout`.
    Timeout,
    /// Skipped: the circuit breaker is open after repeated failures.
    CircuitOpen,
    /// A window or rate too long for the backend's arithmetic.
    TooLong,
    /// An answer that is not what was asked for.
    BadReply,
    /// No server to ask yet (Sentinel has named no primary).
    NoServer,
}

/// A store call that failed.
#[derive(Debug)]
pub struct StoreError {
    pub kind: StoreFailure,
    /// The backend that failed, as `store.backend` spells it.
    pub backend: &'static str,
    /// What failed, in words, with the facts of the place it failed.
    context: Cow<'static, str>,
    pub cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    pub fn new(
        kind: StoreFailure,
        backend: &'static str,
        context: impl Into<Cow<'static, str>>,
    ) -> StoreError {
        StoreError {
            kind,
            backend,
            context: context.into(),
            cause: None,
        }
    }

    /// The same error, caused by `cause` (its words are already in the context).
    pub fn because(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        self.cause = Some(Box::new(cause));
        self
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}
