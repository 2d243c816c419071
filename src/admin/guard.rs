//! Who the admin listener answers: the bearer token when one is set, else only loopback Host names; and no state-changing call from another site's page.
//!
//! Without a token the admin API is bound to loopback (config enforces it),
//! but a web page in the operator's browser can still reach 127.0.0.1 by
//! DNS rebinding: its own name, re-pointed at 127.0.0.1, is sent as `Host`.
//! Answering only `localhost`, `127.0.0.0/8` and `[::1]` (any port) closes that.
//!
//! Nor does the Host rule stop cross-site request forgery: a page elsewhere
//! can make the browser send `POST http://127.0.0.1:9901/reload` (a form, or
//! `fetch` with `mode: "no-cors"`: a "simple" request, sent without asking),
//! with `Host: 127.0.0.1:9901`. Browsers say where such a request comes from
//! (`Sec-Fetch-Site`, and `Origin` on every `POST` and `DELETE`), so a call
//! that changes state is refused unless it comes from the admin listener's
//! own pages (the dashboard) or from no page at all (curl, `tollgate
//! reload`, scripts send neither header): see [`from_another_site`].

use std::net::{IpAddr, Ipv6Addr};

use http::header::{AUTHORIZATION, HOST, ORIGIN};
use http::{Method, Request};

/// Why a request does not get in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRefusal {
    /// A token is set and the request did not carry it.
    Unauthorized,
    /// No token is set and the Host is not a loopback name or address.
    ForeignHost,
    /// A state-changing call sent by a page of another origin.
    CrossSite,
}

/// Lets the request in, or says why not. `open` paths (probes) skip the token, not the Host rule.
pub fn admit<B>(req: &Request<B>, token: Option<&str>, open: bool) -> Result<(), AdminRefusal> {
    if changes_state(req.method()) && from_another_site(req) {
        return Err(AdminRefusal::CrossSite);
    }
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
                Err(AdminRefusal::Unauthorized)
            }
        }
        None => {
            if authority(req).is_some_and(is_loopback_host) {
                Ok(())
            } else {
                Err(AdminRefusal::ForeignHost)
            }
        }
    }
}

/// The host the request was sent to: HTTP/2 carries it in the URI, HTTP/1.1 in Host.
fn authority<B>(req: &Request<B>) -> Option<&str> {
    req.uri()
        .authority()
        .map(|a| a.as_str())
        .or_else(|| req.headers().get(HOST).and_then(|v| v.to_str().ok()))
}

/// Whether a browser sent this request for a page of another origin.
/// `Sec-Fetch-Site` (every current browser) must be `same-origin`, or `none`
/// (the operator's own action: the address bar, a bookmark); `same-site` is
/// refused too, since another port of localhost is the same site. `Origin`
/// (sent on every `POST` and `DELETE`, also by browsers without
/// `Sec-Fetch-*`) must be the admin listener's own, `http://` + its Host;
/// `null` (a sandboxed frame, a `data:` page) never is. A request with
/// neither header comes from no page (curl, `tollgate reload`) and passes:
/// a page cannot remove them.
pub fn from_another_site<B>(req: &Request<B>) -> bool {
    let headers = req.headers();
    let site = headers.get("sec-fetch-site").map(|v| v.as_bytes());
    if site.is_some_and(|s| s != b"same-origin" && s != b"none") {
        return true;
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return false;
    };
    let own = authority(req).map(|host| format!("http://{host}"));
    !own.is_some_and(|own| origin.as_bytes().eq_ignore_ascii_case(own.as_bytes()))
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
            Err(AdminRefusal::Unauthorized)
        );
        assert_eq!(
            admit(&req(Some("Bearer x")), Some("t"), false),
            Err(AdminRefusal::Unauthorized)
        );
        assert_eq!(admit(&req(Some("Bearer t")), Some("t"), false), Ok(()));
        assert_eq!(admit(&req(None), Some("t"), true), Ok(()));
        assert_eq!(
            admit(&req(None), None, true),
            Err(AdminRefusal::ForeignHost)
        );
    }

    /// A request as Chromium sends it: `POST` to the admin listener with
    /// `Host: 127.0.0.1:9901`, and these `Sec-Fetch-Site` and `Origin`.
    fn post(site: Option<&str>, origin: Option<&str>) -> Request<()> {
        let mut b = Request::builder()
            .method(Method::POST)
            .uri("/reload")
            .header(HOST, "127.0.0.1:9901");
        if let Some(s) = site {
            b = b.header("sec-fetch-site", s);
        }
        if let Some(o) = origin {
            b = b.header(ORIGIN, o);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn a_post_from_another_sites_page_is_refused_with_or_without_a_token() {
        for (site, origin) in [
            (Some("cross-site"), Some("http://evil.example")),
            // Another port of localhost: the same site, another origin.
            (Some("same-site"), Some("http://localhost:3000")),
            // A browser without Sec-Fetch-* still sends Origin on a POST.
            (None, Some("http://evil.example")),
            (None, Some("null")),
            (None, Some("http://127.0.0.1:9902")),
            (Some("cross-site"), None),
        ] {
            let req = post(site, origin);
            assert!(from_another_site(&req), "{site:?} {origin:?}");
            assert_eq!(admit(&req, None, false), Err(AdminRefusal::CrossSite));
            assert_eq!(admit(&req, Some("t"), false), Err(AdminRefusal::CrossSite));
        }
    }

    #[test]
    fn the_dashboard_and_clients_without_a_page_are_let_in() {
        for (site, origin) in [
            // The dashboard's own DELETE /bans/{key}, as Chromium sends it.
            (Some("same-origin"), Some("http://127.0.0.1:9901")),
            (Some("same-origin"), Some("HTTP://127.0.0.1:9901")),
            (Some("none"), None),
            // curl, `tollgate reload`, a script: no page, no such header.
            (None, None),
        ] {
            assert_eq!(
                admit(&post(site, origin), None, false),
                Ok(()),
                "{site:?} {origin:?}"
            );
        }
        // Reading is not guarded: a page cannot read a cross-origin answer anyway.
        let mut get = post(Some("cross-site"), Some("http://evil.example"));
        *get.method_mut() = Method::GET;
        assert_eq!(admit(&get, None, false), Ok(()));
    }

    #[test]
    fn token_comparison_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
