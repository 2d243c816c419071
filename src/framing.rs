//! What tollgate accepts as a request at all: one valid Host, a target it can forward, a method it proxies.
//!
//! hyper has already refused what HTTP/1.1 cannot parse (bad Content-Length,
//! unknown Transfer-Encoding, control bytes, obs-fold). These are the checks
//! RFC 9112 §3.2 and §3.2.4 leave to the server, done before identity and
//! routing so no limiter, route or upstream ever sees such a request.

use http::header::HOST;
use http::uri::Authority;
use http::{Method, Request, Version};

use crate::problem::Problem;

/// The methods tollgate refuses whatever the route: CONNECT would make it a
/// tunnel, and TRACE reflects the request (headers included) back to a script.
const REFUSED_METHODS: [Method; 2] = [Method::CONNECT, Method::TRACE];

/// Refuses a request with a missing (HTTP/1.1), repeated or malformed Host, an
/// absolute-form target naming another host than Host, a `*` target, or a
/// method tollgate does not proxy.
pub fn check_request<B>(req: &Request<B>) -> Result<(), Problem> {
    // RFC 8441's extended CONNECT (HTTP/2, `:protocol websocket`) opens a
    // WebSocket, not a tunnel to anywhere: the tunnel module turns it into
    // the HTTP/1.1 handshake for the route's upstream.
    let extended_connect = req.extensions().get::<hyper::ext::Protocol>().is_some();
    if REFUSED_METHODS.contains(req.method()) && !extended_connect {
        return Err(Problem::MethodNotAllowed {
            method: req.method().to_string(),
        });
    }
    let uri = req.uri();
    if uri.authority().is_none() && uri.path() == "*" {
        return Err(if req.method() == Method::OPTIONS {
            Problem::NotImplemented(
                "tollgate does not answer server-wide OPTIONS (a '*' target).".into(),
            )
        } else {
            Problem::BadRequest("A '*' target is only valid with OPTIONS.".into())
        });
    }
    let mut hosts = req.headers().get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Problem::BadRequest("Host is given more than once.".into()));
    }
    let Some(host) = host else {
        // HTTP/2 carries the host in :authority (RFC 9113 §8.3.1), HTTP/1.1
        // in Host; only HTTP/1.0 may have neither. Without one there is no
        // host to route on or to forward.
        if matches!(req.version(), Version::HTTP_11 | Version::HTTP_2) && uri.authority().is_none()
        {
            return Err(Problem::BadRequest(if req.version() == Version::HTTP_2 {
                "An HTTP/2 request needs :authority (or Host).".into()
            } else {
                "An HTTP/1.1 request needs a Host.".into()
            }));
        }
        return Ok(());
    };
    // The usual `name[:port]` is a valid authority as it stands; anything
    // else is parsed (which copies it: one allocation per request saved).
    let host = host.as_bytes();
    if !plain_host(host) {
        match Authority::try_from(host) {
            Ok(a) if !a.as_str().contains('@') && !a.host().is_empty() => {}
            _ => return Err(Problem::BadRequest("Host is not a valid host name.".into())),
        }
    }
    if let Some(target) = uri.authority() {
        // RFC 9112 §3.2.2 says to ignore Host then; a reverse proxy that
        // routes on Host would route on one name and forward another, so
        // disagreeing names are refused instead.
        if !target.as_str().as_bytes().eq_ignore_ascii_case(host) {
            return Err(Problem::BadRequest(
                "The request target names another host than Host.".into(),
            ));
        }
    }
    Ok(())
}

/// A host name or IPv4 address of letters, digits, `-` and `.`, with an
/// optional port of 1 to 5 digits: an authority `Authority` accepts as it
/// stands, with a host and no user info.
fn plain_host(host: &[u8]) -> bool {
    let (name, port) = match host.iter().position(|&b| b == b':') {
        Some(i) => (&host[..i], Some(&host[i + 1..])),
        None => (host, None),
    };
    !name.is_empty()
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && port.is_none_or(|p| (1..=5).contains(&p.len()) && p.iter().all(u8::is_ascii_digit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, target: &str, version: Version, hosts: &[&str]) -> Request<()> {
        let mut b = Request::builder()
            .method(method)
            .uri(target)
            .version(version);
        for h in hosts {
            b = b.header(HOST, *h);
        }
        b.body(()).unwrap()
    }

    fn status(r: Result<(), Problem>) -> u16 {
        r.map_or_else(|p| p.status().as_u16(), |()| 200)
    }

    #[test]
    fn host_must_be_there_once_and_be_a_host() {
        let v11 = Version::HTTP_11;
        assert_eq!(
            status(check_request(&req("GET", "/", v11, &["a.example"]))),
            200
        );
        assert_eq!(
            status(check_request(&req("GET", "/", v11, &["a.example:8080"]))),
            200
        );
        assert_eq!(status(check_request(&req("GET", "/", v11, &[]))), 400);
        assert_eq!(
            status(check_request(&req("GET", "/", v11, &["a", "a"]))),
            400
        );
        assert_eq!(status(check_request(&req("GET", "/", v11, &["u@a"]))), 400);
        assert_eq!(status(check_request(&req("GET", "/", v11, &["a/b"]))), 400);
        assert_eq!(status(check_request(&req("GET", "/", v11, &[""]))), 400);
        assert_eq!(
            status(check_request(&req("GET", "/", Version::HTTP_10, &[]))),
            200
        );
        assert_eq!(
            status(check_request(&req(
                "GET",
                "http://a/",
                Version::HTTP_2,
                &[]
            ))),
            200
        );
    }

    #[test]
    fn an_http2_request_needs_authority_or_host() {
        let v2 = Version::HTTP_2;
        assert_eq!(status(check_request(&req("GET", "/", v2, &[]))), 400);
        assert_eq!(status(check_request(&req("GET", "/", v2, &["a"]))), 200);
        assert_eq!(
            status(check_request(&req("GET", "https://a/", v2, &[]))),
            200
        );
    }

    #[test]
    fn a_plain_host_is_one_the_authority_parser_accepts_as_it_stands() {
        let plain = [
            "example.com",
            "a",
            "127.0.0.1",
            "example.com:8080",
            "x-y.z:1",
            "host:65535",
            "host:99999",
            "-.-",
        ];
        for h in plain {
            assert!(plain_host(h.as_bytes()), "{h}");
            let a = Authority::try_from(h.as_bytes()).expect(h);
            assert!(!a.host().is_empty() && !a.as_str().contains('@'), "{h}");
        }
        let parsed = [
            "",
            ":80",
            "a:",
            "a:123456",
            "[::1]:80",
            "user@host",
            "a b",
            "ä.de",
            "a:8:8",
        ];
        for h in parsed {
            assert!(!plain_host(h.as_bytes()), "{h}");
        }
    }

    #[test]
    fn an_absolute_target_must_name_the_host() {
        let v11 = Version::HTTP_11;
        assert_eq!(
            status(check_request(&req(
                "GET",
                "http://A.example/x",
                v11,
                &["a.example"]
            ))),
            200
        );
        assert_eq!(
            status(check_request(&req(
                "GET",
                "http://b.example/x",
                v11,
                &["a.example"]
            ))),
            400
        );
    }

    #[test]
    fn connect_trace_and_star_targets_are_refused() {
        let v11 = Version::HTTP_11;
        assert_eq!(
            status(check_request(&req(
                "CONNECT",
                "a.example:443",
                v11,
                &["a.example:443"]
            ))),
            405
        );
        assert_eq!(status(check_request(&req("TRACE", "/", v11, &["a"]))), 405);
        assert_eq!(
            status(check_request(&req("OPTIONS", "*", v11, &["a"]))),
            501
        );
        assert_eq!(status(check_request(&req("GET", "*", v11, &["a"]))), 400);
        assert_eq!(
            status(check_request(&req("PROPFIND", "/dav", v11, &["a"]))),
            200
        );
    }
}
