//! Config for slow and large bodies: request body buffering, the minimum body and read rates, and HTTP/2's fair share of upstream exchanges.
//!
//! The raw keys sit flat in `server:` (as nginx's `client_body_*` and
//! `send_timeout` do); this module turns them into one [`BodyConfig`].

use std::time::Duration;

use super::raw::RawServer;
use super::{dur, Validator};

/// How request bodies are read and how slow a client may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyConfig {
    /// Bytes of a request body held in memory; the rest goes to a temp file.
    pub buffer: usize,
    /// The longest wait for the next piece of a request body, and the
    /// allowance a body starts with.
    pub timeout: Duration,
    /// Bytes per second a body must keep up once its allowance is spent
    /// (each byte adds `1 / min_rate` s to it); 0 = only `timeout` applies.
    pub min_rate: u64,
    /// The longest a write to the client may stay blocked.
    pub send_timeout: Duration,
    /// Upstream exchanges one client connection may have in flight at once
    /// (HTTP/2 streams beyond it wait for a place).
    pub upstream_per_connection: usize,
    /// How long the rest of a body answered early is read and discarded
    /// before the connection closes.
    pub lingering: LingeringConfig,
}

/// `server.lingering_time` and `server.lingering_timeout` (nginx's names and
/// defaults): after an answer sent before its request's body ended (413,
/// 429, 401 …), the rest of the body is read and thrown away, so the client
/// can finish sending and read the answer instead of meeting a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LingeringConfig {
    /// The longest a connection lingers in all; `0s`: it never does.
    pub time: Duration,
    /// The longest wait for the client's next bytes while lingering.
    pub timeout: Duration,
}

impl Default for BodyConfig {
    fn default() -> BodyConfig {
        BodyConfig {
            buffer: 64 * 1024,
            timeout: Duration::from_secs(20),
            min_rate: 500,
            send_timeout: Duration::from_secs(60),
            upstream_per_connection: 16,
            lingering: LingeringConfig {
                time: Duration::from_secs(30),
                timeout: Duration::from_secs(5),
            },
        }
    }
}

impl Validator<'_> {
    pub(super) fn bodies(&mut self, raw: &RawServer) -> BodyConfig {
        let d = BodyConfig::default();
        let buffer = match raw.request_body_buffer {
            Some(s) if s.0 == 0 => {
                self.err("server.request_body_buffer", "must be at least 1 byte");
                d.buffer
            }
            Some(s) => usize::try_from(s.0).unwrap_or(usize::MAX),
            None => d.buffer,
        };
        let timeout = dur(raw.request_body_timeout, d.timeout);
        if timeout.is_zero() {
            self.err("server.request_body_timeout", "must be longer than 0s");
        }
        let send_timeout = dur(raw.send_timeout, d.send_timeout);
        if send_timeout.is_zero() {
            self.err("server.send_timeout", "must be longer than 0s");
        }
        let upstream_per_connection = self
            .count(
                "server.upstream_requests_per_connection",
                raw.upstream_requests_per_connection,
            )
            .unwrap_or(d.upstream_per_connection);
        let lingering = LingeringConfig {
            time: dur(raw.lingering_time, d.lingering.time),
            timeout: dur(raw.lingering_timeout, d.lingering.timeout),
        };
        if lingering.timeout.is_zero() {
            self.err(
                "server.lingering_timeout",
                "must be longer than 0s (to turn lingering off, set lingering_time: 0s)",
            );
        }
        BodyConfig {
            buffer,
            timeout,
            min_rate: raw.request_body_min_rate.map_or(d.min_rate, |s| s.0),
            send_timeout,
            upstream_per_connection,
            lingering,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_keys_default_to_a_64_kib_buffer_20s_500_bytes_per_second_60s_and_16() {
        let c = crate::config::parse("{}").unwrap();
        assert_eq!(c.server.bodies, BodyConfig::default());
        let c = crate::config::parse(
            "server: { request_body_buffer: 1KiB, request_body_timeout: 2s, request_body_min_rate: 0, send_timeout: 3s, upstream_requests_per_connection: 2 }",
        )
        .unwrap();
        assert_eq!(
            c.server.bodies,
            BodyConfig {
                buffer: 1024,
                timeout: Duration::from_secs(2),
                min_rate: 0,
                send_timeout: Duration::from_secs(3),
                upstream_per_connection: 2,
                ..BodyConfig::default()
            }
        );
    }

    #[test]
    fn lingering_defaults_to_nginx_30s_and_5s_and_0s_turns_it_off() {
        let d = BodyConfig::default().lingering;
        assert_eq!((d.time.as_secs(), d.timeout.as_secs()), (30, 5));
        let c =
            crate::config::parse("server: { lingering_time: 0s, lingering_timeout: 1s }").unwrap();
        assert_eq!(
            c.server.bodies.lingering,
            LingeringConfig {
                time: Duration::ZERO,
                timeout: Duration::from_secs(1),
            }
        );
        let e = crate::config::parse("server: { lingering_timeout: 0s }").unwrap_err();
        assert!(e.to_string().contains("server.lingering_timeout"), "{e}");
    }

    #[test]
    fn zero_buffers_timeouts_and_shares_are_config_errors_with_their_paths() {
        let e = crate::config::parse(
            "server: { request_body_buffer: 0, request_body_timeout: 0s, send_timeout: 0s, upstream_requests_per_connection: 0 }",
        )
        .unwrap_err();
        let paths: Vec<&str> = e.problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "server.request_body_buffer",
                "server.request_body_timeout",
                "server.send_timeout",
                "server.upstream_requests_per_connection"
            ]
        );
    }
}
