//! Request bodies before the upstream: read whole first (memory, then a temp file), cut off when they trickle (408), and each client connection's fair share of upstream exchanges.
//!
//! As nginx's `proxy_request_buffering on`: a body is read to its end before
//! an upstream connection (or a PHP-FPM worker) is taken, so a client that
//! sends slowly holds only its own connection and at most
//! `server.request_body_buffer` bytes of memory. Past that the body goes to
//! a temp file (unlinked at once, so a crash leaves nothing behind) and is
//! read back from it when forwarded: any size up to `server.max_request_body`
//! is still accepted, as before buffering. Spilling was chosen over refusing
//! with 413 because refusing would have turned every upload between the two
//! sizes away; its cost is disk, at most `max_request_body` per request.
//!
//! Upgrade requests (WebSockets) and bodiless requests pass straight
//! through; there is no per-route opt-out for streaming uploads yet (see
//! docs/RELIABILITY.md).

use std::collections::VecDeque;
use std::io::SeekFrom;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::{BodyConfig, ServerConfig};
use crate::forward_error::{ForwardError, Kind};
use crate::metrics::{inc, Metrics};
use crate::request_body::RequestBody;
use crate::request_body::Spilled;

/// One client connection's places for upstream exchanges (see
/// `server.upstream_requests_per_connection`). The server hands it to the
/// app with each request; a request without one (the app called without
/// sockets) is not capped.
#[derive(Clone)]
pub struct Share(Arc<Semaphore>, usize);

impl Share {
    pub fn new(server: &ServerConfig) -> Share {
        let n = server.bodies.upstream_per_connection;
        Share(Arc::new(Semaphore::new(n)), n)
    }

    /// Waits for a place among the connection's upstream exchanges, at most
    /// `timeout`; the place is held until the permit is dropped.
    pub async fn take(
        &self,
        metrics: &Metrics,
        timeout: Duration,
        upstream: &str,
    ) -> Result<OwnedSemaphorePermit, ForwardError> {
        let Share(places, n) = self;
        if let Ok(p) = places.clone().try_acquire_owned() {
            return Ok(p);
        }
        inc(&metrics.counter("tollgate_upstream_share_waits_total", &[]));
        match tokio::time::timeout(timeout, places.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            // Closed never happens (nobody closes it); treat it as the timeout.
            Ok(Err(_)) | Err(_) => Err(ForwardError::new(
                Kind::ShareTimeout,
                format!("no place among this connection's {n} upstream exchanges came free within {timeout:?} (upstream {upstream})"),
            )
            .on(upstream)),
        }
    }
}

/// What a new client connection gets from the config in force: the
/// longest a write to it may stay blocked, and its share of upstream exchanges.
pub fn per_connection(server: &ServerConfig) -> (Duration, Share) {
    (server.bodies.send_timeout, Share::new(server))
}

/// Reads the body of `req` to its end, in place, unless it has none or is
/// an upgrade (which streams). Only a body to read pays for the reading's
/// future (boxed): most requests have none, and this one is part of every
/// forwarded request's state.
pub async fn read_request(
    metrics: &Metrics,
    req: &mut Request<RequestBody>,
    server: &ServerConfig,
) -> Result<(), ForwardError> {
    if req.body().is_end_stream() {
        *req.body_mut() = RequestBody::Empty;
        return Ok(());
    }
    if crate::tunnel::requested_upgrade(req.headers()).is_some() {
        return Ok(());
    }
    Box::pin(read_into(metrics, req, server)).await
}

/// [`read_request`]'s reading, boxed there: the body read in place.
async fn read_into(
    metrics: &Metrics,
    req: &mut Request<RequestBody>,
    server: &ServerConfig,
) -> Result<(), ForwardError> {
    let declared = req.headers().contains_key(http::header::CONTENT_LENGTH);
    let body = std::mem::replace(req.body_mut(), RequestBody::Empty);
    match read(body, &server.bodies, server.max_request_body, declared).await {
        Ok(body) => {
            if matches!(body, RequestBody::File(_)) {
                inc(&metrics.counter("tollgate_request_bodies_spilled_total", &[]));
            }
            *req.body_mut() = body;
            Ok(())
        }
        Err(e) => {
            if e.kind == Kind::BodyTimeout {
                inc(&metrics.counter("tollgate_request_body_timeouts_total", &[]));
            }
            Err(e)
        }
    }
}

/// Reads a body to its end: in memory up to `config.buffer` bytes, then in a
/// temp file; refused past `max` bytes, or when it trickles (see [`Pace`]).
pub async fn read(
    mut body: RequestBody,
    config: &BodyConfig,
    max: u64,
    declared: bool,
) -> Result<RequestBody, ForwardError> {
    let mut pace = Pace::new(config, Instant::now());
    let mut memory: VecDeque<Bytes> = VecDeque::new();
    let mut file: Option<tokio::fs::File> = None;
    let mut received: u64 = 0;
    loop {
        let next = tokio::time::timeout_at(pace.deadline(Instant::now()), body.frame()).await;
        let frame = match next {
            Err(_) => return Err(body_timeout()),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(ForwardError::client_body(&e).because(e)),
            Ok(Some(Ok(frame))) => frame,
        };
        // Trailers of a request are dropped, as nginx drops them.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        received += data.len() as u64;
        pace.received(data.len() as u64);
        if received > max {
            return Err(ForwardError::body_too_large(max));
        }
        if let Some(f) = file.as_mut() {
            f.write_all(&data).await.map_err(spill_failed)?;
        } else if received as usize > config.buffer {
            let mut f = spill_file().await.map_err(spill_failed)?;
            for chunk in memory.drain(..).chain(std::iter::once(data)) {
                f.write_all(&chunk).await.map_err(spill_failed)?;
            }
            file = Some(f);
        } else {
            memory.push_back(data);
        }
    }
    match file {
        None if received == 0 => Ok(RequestBody::Empty),
        None => Ok(RequestBody::Memory {
            chunks: memory,
            left: received,
            declared,
        }),
        Some(mut f) => {
            f.flush().await.map_err(spill_failed)?;
            f.seek(SeekFrom::Start(0)).await.map_err(spill_failed)?;
            Ok(RequestBody::File(Box::new(Spilled::new(
                f, received, declared,
            ))))
        }
    }
}

fn body_timeout() -> ForwardError {
    ForwardError::new(
        Kind::BodyTimeout,
        "the request body stalled or arrived below the minimum rate",
    )
}

fn spill_failed(e: std::io::Error) -> ForwardError {
    ForwardError::new(
        Kind::BodySpill,
        format!("cannot set the request body aside in a temp file: {e}"),
    )
    .because(e)
}

/// A new temp file for a body, already unlinked: it lives as long as the
/// open handle, so nothing is left on disk however the request ends.
async fn spill_file() -> std::io::Result<tokio::fs::File> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tollgate-body-{}-{n}", std::process::id()));
    let file = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok(tokio::fs::File::from_std(file))
}

/// How long a body may take, as Apache's `mod_reqtimeout` counts it: it
/// starts with `timeout`, each byte received adds `1 / min_rate` s, and no
/// wait for the next piece may be longer than `timeout` either. A client
/// sending 10 bytes a second is cut off after about `timeout`; a slow but
/// real upload (a phone at 50 KB/s) never comes near.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    started: Instant,
    gap: Duration,
    min_rate: u64,
    received: u64,
}

impl Pace {
    pub fn new(config: &BodyConfig, started: Instant) -> Pace {
        Pace {
            started,
            gap: config.timeout,
            min_rate: config.min_rate,
            received: 0,
        }
    }

    pub fn received(&mut self, bytes: u64) {
        self.received += bytes;
    }

    /// When the body is late if nothing more arrives, looking from `now`.
    pub fn deadline(&self, now: Instant) -> Instant {
        let next_piece = now + self.gap;
        if self.min_rate == 0 {
            return next_piece;
        }
        let earned = Duration::from_secs_f64(self.received as f64 / self.min_rate as f64);
        next_piece.min(self.started + self.gap + earned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Problem;

    fn config(timeout_s: u64, min_rate: u64) -> BodyConfig {
        BodyConfig {
            timeout: Duration::from_secs(timeout_s),
            min_rate,
            ..BodyConfig::default()
        }
    }

    #[test]
    fn a_body_that_keeps_up_the_minimum_rate_is_only_held_to_the_gap() {
        let t0 = Instant::now();
        let mut pace = Pace::new(&config(10, 100), t0);
        // 60 s in, 5,000 bytes earned 50 s on top of the 10 s allowance.
        pace.received(5_000);
        let now = t0 + Duration::from_secs(55);
        assert_eq!(pace.deadline(now), t0 + Duration::from_secs(60));
        // Early on the gap is the tighter bound.
        let early = t0 + Duration::from_secs(1);
        assert_eq!(pace.deadline(early), early + Duration::from_secs(10));
    }

    #[test]
    fn a_trickling_body_runs_out_of_allowance_after_the_timeout() {
        let t0 = Instant::now();
        let mut pace = Pace::new(&config(10, 500), t0);
        // 10 bytes a second for 9 s: 90 bytes earned 0.18 s.
        pace.received(90);
        let now = t0 + Duration::from_secs(9);
        assert_eq!(pace.deadline(now), t0 + Duration::from_millis(10_180));
    }

    #[test]
    fn without_a_minimum_rate_only_the_gap_counts() {
        let t0 = Instant::now();
        let pace = Pace::new(&config(10, 0), t0);
        let now = t0 + Duration::from_secs(3_600);
        assert_eq!(pace.deadline(now), now + Duration::from_secs(10));
    }

    #[test]
    fn a_408_closes_the_connection_and_says_why() {
        let resp = Problem::from(body_timeout()).into_response();
        assert_eq!(resp.status(), http::StatusCode::REQUEST_TIMEOUT);
        assert_eq!(resp.headers()[http::header::CONNECTION], "close");
    }
}
