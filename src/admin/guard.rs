//! Who the admin listener answers: the bearer token when one is set, else only loopback Host names.
//!
//! Without a token the admin API is bound to loopback (config enforces it),
//! but a web page in the operator's browser can still reach 127.0.0.1 by
//! DNS rebinding: its own name, re-pointed at 127.0.0.1, is sent as `Host`.
//! Answering only `localhost`, `127.0.0.0/8` and `[::1]` (any port) closes that.

use std::net::{IpAddr, Ipv6Addr};

use http::header::{AUTHORIZATION, HOST};
use http::{Method, Request};

/// Why a request does not get in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A token is set and the request did not carry it.
    Unauthorized,
    /// No token is set and the Host is not a loopback name or address.
    ForeignHost,
}

/// Lets the request in, or says why not. `open` paths (probes) skip the token, not the Host rule.
pub fn admit<B>(req: &Request<B>, token: Option<&str>, open: bool) -> Result<(), Refusal> {
    match token {
        Some(_) if open => Ok(()),
        Some(token) => {
            let given = req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or("");
            if constant_time_eq(given.as_bytes(), token.as_bytes()) {
                Ok(())
            } else {
                Err(Refusal::Unauthorized)
            }
        }
        None => {
            // HTTP/2 carries the authority in the URI, HTTP/1.1 in Host.
            let host = req
                .uri()
                .authority()
                .map(|a| a.as_str())
                .or_else(|| req.headers().get(HOST).and_then(|v| v.to_str().ok()));
            if host.is_some_and(is_loopback_host) {
                Ok(())
            } else {
                Err(Refusal::ForeignHost)
            }
        }
    }
}

/// Whether a call changes state (and so is logged when no token guards it).
pub fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // [v6] or [v6]:port
        Some(rest) => match rest.split_once(']') {
            Some((v6, port))
                if port.is_empty() || port.strip_prefix(':').is_some_and(valid_port) =>
            {
                return v6.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback());
            }
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if valid_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

fn valid_port(port: &str) -> bool {
    !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok()
}

/// Compares in time independent of where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_with_any_port_are_loopback() {
        for host in [
            "localhost",
            "LOCALHOST:9901",
            "127.0.0.1",
            "127.0.0.1:9901",
            "127.8.9.10:1",
            "[::1]",
            "[::1]:9901",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn other_names_and_tricks_are_not_loopback() {
        for host in [
            "evil.example",
            "evil.example:9901",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "10.0.0.1:9901",
            "[::2]:9901",
            "[::1]x",
            "localhost:99999",
            "localhost:",
            "",
            "0.0.0.0:9901",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn a_token_is_needed_everywhere_but_the_probes() {
        let req = |auth: Option<&str>| {
            let mut b = Request::builder()
                .uri("/status")
                .header(HOST, "evil.example");
            if let Some(a) = auth {
                b = b.header(AUTHORIZATION, a);
            }
            b.body(()).unwrap()
        };
        assert_eq!(
            admit(&req(None), Some("t"), false),
            Err(Refusal::Unauthorized)
        );
        assert_eq!(
            admit(&req(Some("Bearer x")), Some("t"), false),
            Err(Refusal::Unauthorized)
        );
        assert_eq!(admit(&req(Some("Bearer t")), Some("t"), false), Ok(()));
        assert_eq!(admit(&req(None), Some("t"), true), Ok(()));
        assert_eq!(admit(&req(None), None, true), Err(Refusal::ForeignHost));
    }

    #[test]
    fn token_comparison_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
