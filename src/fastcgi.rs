//! FastCGI upstreams (php-fpm): a request becomes a PHP script run with nginx's `fastcgi_params`, a static file, or a 404.
//!
//! Why a codec of our own rather than a crate: the maintained client
//! (`fastcgi-client`) reads the request body from an `AsyncRead`, hands
//! back a response stream that borrows the connection (so it cannot go
//! back to a per-worker pool when the body is done) and ships no pool; the
//! wire format a responder needs is small (see `codec`), and owning it lets
//! the response body be a zero-copy slice of what was read.
//!
//! Layout: `path` decides what a URL names under `root`; `file` serves a
//! static one as nginx does (validators, ranges, precompressed siblings);
//! this file builds the CGI parameters; `client` sends them with the body and streams the
//! answer back; `response` parses php-fpm's CGI header block.

pub mod client;
pub mod codec;
pub mod file;
pub mod path;
pub mod response;
pub mod scripts;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Method, Response};
use http_body::Body as _;
use http_body_util::BodyExt;

use crate::body::{BoxError, Streamed};
use crate::config::FastCgiConfig;
use crate::forward_error::{ForwardError, Kind};
use crate::problem::Problem;
use path::Target;

#[derive(Debug, thiserror::Error)]
pub enum FastCgiError {
    #[error("cannot connect to php-fpm at {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot connect to php-fpm at {address} within {timeout:?}")]
    ConnectTimeout { address: String, timeout: Duration },
    #[error("php-fpm did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the exchange with php-fpm failed: {0}")]
    Io(#[source] io::Error),
    #[error("php-fpm broke the protocol: {0}")]
    Protocol(#[source] codec::CodecError),
    #[error("php-fpm sent an invalid CGI header block: {0}")]
    BadHead(&'static str),
    #[error("php-fpm's CGI header block exceeds 64 KiB")]
    HeadTooLarge,
    #[error("php-fpm ended the request without a CGI header block")]
    NoHead,
    #[error("php-fpm closed the connection before the end of the request")]
    Closed,
    #[error("php-fpm refused the request (FastCGI protocol status {0}: 1 = no multiplexing, 2 = overloaded)")]
    Refused(u8),
    /// The client's connection broke (or framed its body wrongly) mid-body.
    #[error("reading the client's request body failed: {0}")]
    ClientBody(#[source] BoxError),
    /// The temp file a buffered body was set aside in could not be read back.
    #[error("reading the request body back from its temp file failed: {0}")]
    BodyFile(#[source] BoxError),
    #[error("the request body exceeds the limit")]
    BodyTooLarge,
}

impl FastCgiError {
    /// The forwarding error this is on the way to `upstream`, whose bodies
    /// may be `max_body` bytes at most.
    pub fn into_forward(self, upstream: &str, max_body: u64) -> ForwardError {
        let kind = match self {
            FastCgiError::BodyTooLarge => return ForwardError::body_too_large(max_body),
            // The same answer as over HTTP: the client's 400, not a 502.
            FastCgiError::ClientBody(e) => {
                return ForwardError::client_body(&e).on(upstream).because(e)
            }
            FastCgiError::Connect { .. } | FastCgiError::ConnectTimeout { .. } => Kind::Connect,
            FastCgiError::Timeout(_) => Kind::Timeout,
            FastCgiError::Refused(_) => Kind::Refused,
            // A temp file that fails is ours, a 502 as over HTTP.
            FastCgiError::Io(_)
            | FastCgiError::Protocol(_)
            | FastCgiError::BadHead(_)
            | FastCgiError::HeadTooLarge
            | FastCgiError::NoHead
            | FastCgiError::Closed
            | FastCgiError::BodyFile(_) => Kind::Exchange,
        };
        ForwardError::new(
            kind,
            format!("forwarding to FastCGI upstream {upstream} failed: {self}"),
        )
        .on(upstream)
        .because(self)
    }
}

/// One `fastcgi://` upstream: where php-fpm listens and the document root.
#[derive(Debug)]
pub struct FastCgi {
    name: Arc<str>,
    pool: Arc<client::FastCgiPool>,
    config: FastCgiConfig,
    /// `root` as a string without a trailing `/`, the prefix of SCRIPT_FILENAME.
    root: String,
    timeout: Duration,
    /// The scripts paths resolved to, trusted for `script_cache`.
    scripts: Arc<scripts::Scripts>,
}

impl FastCgi {
    pub fn new(
        name: &str,
        config: &FastCgiConfig,
        connect_timeout: Duration,
        timeout: Duration,
        metrics: &crate::metrics::Metrics,
        workers: usize,
    ) -> FastCgi {
        FastCgi {
            name: Arc::from(name),
            pool: client::FastCgiPool::new(
                config.address.clone(),
                connect_timeout,
                config.max_conns,
                workers,
            ),
            config: config.clone(),
            root: config
                .root
                .to_string_lossy()
                .trim_end_matches('/')
                .to_string(),
            timeout,
            scripts: Arc::new(scripts::Scripts::new(name, config.script_cache, metrics)),
        }
    }

    /// Answers a request whose headers tollgate already prepared (hop-by-hop
    /// removed, forwarding headers set): runs its script, serves its static
    /// file, or answers 404 itself.
    pub async fn forward(
        &self,
        parts: http::request::Parts,
        body: crate::request_body::UpstreamBody,
        client_ip: IpAddr,
        peer: SocketAddr,
        proto: &'static str,
        worker: usize,
    ) -> Result<Response<Streamed>, FastCgiError> {
        let (resolved, query) = self.resolve_request(&parts).await;
        match resolved {
            (Target::NotFound, _) => Ok(own(Problem::FileNotFound)),
            (Target::Directory(path), _) => {
                Ok(file::redirect_to_directory(&path, query.as_deref()))
            }
            (Target::Static(_), Some(variant)) => {
                let cache_control = self.config.cache_control.as_deref();
                Ok(file::serve(&parts.method, &parts.headers, variant, cache_control).await)
            }
            (Target::Static(_), None) => Ok(own(Problem::FileNotFound)),
            (Target::Script { script, path_info }, _) => {
                let has_body = !body.is_end_stream();
                if has_body && !parts.headers.contains_key(header::CONTENT_LENGTH) {
                    // PHP reads exactly CONTENT_LENGTH bytes of input; a
                    // chunked body would reach the script empty.
                    return Ok(own(Problem::LengthRequired));
                }
                let cgi = Cgi {
                    root: &self.root,
                    script: &script,
                    path_info: &path_info,
                    query: query.as_deref().unwrap_or(""),
                    client_ip,
                    peer,
                    proto,
                };
                let head = cgi.params(&parts);
                // Already cut off at `max_body` (`Limited`) by the caller.
                let body = has_body.then_some(body);
                let replayable =
                    matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
                let exchange =
                    self.pool
                        .exchange(head, body, replayable, self.name.clone(), worker);
                let (head, body) = tokio::time::timeout(self.timeout, exchange)
                    .await
                    .map_err(|_| FastCgiError::Timeout(self.timeout))??;
                let mut resp = Response::new(Streamed::new(body.map_err(BoxError::from)));
                *resp.status_mut() = head.status;
                *resp.headers_mut() = head.headers;
                Ok(resp)
            }
        }
    }

    /// What the request names under the root, and the QUERY_STRING it runs
    /// with. A `rewrite` names another path (and query) under the same root,
    /// by the same rules; `unless_exists` only when the requested one names
    /// nothing. Stats and symlink checks block: they run off the runtime,
    /// unless the path's script is remembered (`scripts`).
    async fn resolve_request(
        &self,
        parts: &http::request::Parts,
    ) -> ((Target, Option<file::Variant>), Option<String>) {
        let rewritten = parts.extensions.get::<crate::site::Rewritten>();
        let (first, then) = match rewritten {
            None => (parts.uri.path().to_string(), None),
            Some(r) if r.unless_exists => (parts.uri.path().to_string(), Some(r.path.clone())),
            Some(r) => (r.path.clone(), None),
        };
        let now = tokio::time::Instant::now();
        let (target, variant, took_rewrite) = match self.scripts.get(&first, then.as_deref(), now) {
            Some((script, took_rewrite)) => (script, None, took_rewrite),
            None => self.resolve_on_disk(parts, first, then, now).await,
        };
        let query = match (rewritten, took_rewrite) {
            (Some(r), true) => r.query.clone(),
            _ => parts.uri.query().map(str::to_string),
        };
        ((target, variant), query)
    }

    /// `first` (or, naming nothing, `then`) looked up under the root on the
    /// blocking pool: the target, a static file's variant, and whether
    /// `then` gave it. A script is remembered as of `now`, before the
    /// lookup, so it expires no later than it should.
    async fn resolve_on_disk(
        &self,
        parts: &http::request::Parts,
        first: String,
        then: Option<String>,
        now: tokio::time::Instant,
    ) -> (Target, Option<file::Variant>, bool) {
        let config = self.config.clone();
        let scripts = self.scripts.clone();
        let accepted = crate::compression::Accepted::from_headers(&parts.headers);
        let siblings = parts.extensions.get::<crate::compression::Off>().is_none();
        tokio::task::spawn_blocking(move || {
            let fallback = config.fallback.as_deref();
            let mut target = resolve(&config, &first, fallback.filter(|_| then.is_none()));
            let mut took_rewrite = then.is_none();
            if let (Target::NotFound, Some(then)) = (&target, &then) {
                target = resolve(&config, then, fallback);
                took_rewrite = true;
            }
            scripts.keep(&first, then.as_deref(), &target, took_rewrite, now);
            let variant = match &target {
                Target::Static(file) => Some(static_variant(&config, file, accepted, siblings)),
                _ => None,
            };
            (target, variant, took_rewrite)
        })
        .await
        .unwrap_or((Target::NotFound, None, false))
    }

    /// Whether this upstream can serve `config` unchanged (a reload keeps its pool).
    pub fn serves(&self, config: &FastCgiConfig) -> bool {
        self.config == *config
    }
}

/// What `path` names under the root (`fallback`: the script for a path
/// naming nothing); blocking.
fn resolve(config: &FastCgiConfig, path: &str, fallback: Option<&str>) -> Target {
    match path::split(path) {
        Some(split) => path::resolve(&config.root, &config.index, fallback, split),
        None => Target::NotFound,
    }
}

fn own(problem: Problem) -> Response<Streamed> {
    problem.into_response().map(Streamed::new)
}

/// The request as php-fpm is told about it.
struct Cgi<'a> {
    root: &'a str,
    script: &'a str,
    path_info: &'a str,
    /// QUERY_STRING: the request's, or a rewrite's.
    query: &'a str,
    client_ip: IpAddr,
    peer: SocketAddr,
    proto: &'static str,
}

impl Cgi<'_> {
    /// BEGIN_REQUEST and the PARAMS records: what nginx's `fastcgi_params`
    /// and `fastcgi.conf` send, with PATH_INFO split at the script.
    fn params(&self, parts: &http::request::Parts) -> Bytes {
        let mut out = BytesMut::with_capacity(2048);
        codec::begin_request(&mut out, true);
        let mut p = codec::Params::new(&mut out);
        let mut push = |name: &[u8], value: &[u8]| {
            if !p.push(name, value) {
                tracing::warn!(
                    param = %String::from_utf8_lossy(name),
                    "a FastCGI parameter over 64 KiB was not sent"
                );
            }
        };
        self.cgi_params(parts, &mut push);
        http_params(&parts.headers, &mut push);
        p.finish();
        out.freeze()
    }

    /// The CGI variables: the script, the request line, the server and the client.
    fn cgi_params(&self, parts: &http::request::Parts, push: &mut impl FnMut(&[u8], &[u8])) {
        self.script_params(push);
        self.request_params(parts, push);
        self.server_params(parts, push);
    }

    /// Which script runs, and what of the path and query it is given.
    fn script_params(&self, push: &mut impl FnMut(&[u8], &[u8])) {
        push(
            b"SCRIPT_FILENAME",
            format!("{}{}", self.root, self.script).as_bytes(),
        );
        push(b"SCRIPT_NAME", self.script.as_bytes());
        push(b"PATH_INFO", self.path_info.as_bytes());
        if !self.path_info.is_empty() {
            push(
                b"PATH_TRANSLATED",
                format!("{}{}", self.root, self.path_info).as_bytes(),
            );
        }
        push(b"QUERY_STRING", self.query.as_bytes());
    }

    /// The request line, its body's type and length, and the document it asks for.
    fn request_params(&self, parts: &http::request::Parts, push: &mut impl FnMut(&[u8], &[u8])) {
        let header = |name: header::HeaderName| {
            parts
                .headers
                .get(name)
                .map_or(&b""[..], HeaderValue::as_bytes)
        };
        let request_uri = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        push(b"REQUEST_METHOD", parts.method.as_str().as_bytes());
        push(b"CONTENT_TYPE", header(header::CONTENT_TYPE));
        push(b"CONTENT_LENGTH", header(header::CONTENT_LENGTH));
        push(b"REQUEST_URI", request_uri.as_bytes());
        push(
            b"DOCUMENT_URI",
            format!("{}{}", self.script, self.path_info).as_bytes(),
        );
        push(b"DOCUMENT_ROOT", self.root.as_bytes());
        push(
            b"SERVER_PROTOCOL",
            crate::access::proto(parts.version).as_bytes(),
        );
        push(b"REQUEST_SCHEME", self.proto.as_bytes());
        if self.proto == "https" {
            push(b"HTTPS", b"on");
        }
    }

    /// The server (the name and port the client asked for) and the client.
    fn server_params(&self, parts: &http::request::Parts, push: &mut impl FnMut(&[u8], &[u8])) {
        let host = parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<http::uri::Authority>().ok());
        let https = self.proto == "https";
        let port = host
            .as_ref()
            .and_then(|a| a.port_u16())
            .unwrap_or(if https { 443 } else { 80 });
        push(b"GATEWAY_INTERFACE", b"CGI/1.1");
        push(
            b"SERVER_SOFTWARE",
            concat!("tollgate/", env!("CARGO_PKG_VERSION")).as_bytes(),
        );
        push(b"REMOTE_ADDR", self.client_ip.to_string().as_bytes());
        // The port is the client's only when it connected to us itself;
        // behind a load balancer it would be the balancer's.
        if self.peer.ip().to_canonical() == self.client_ip {
            push(b"REMOTE_PORT", self.peer.port().to_string().as_bytes());
        }
        push(
            b"SERVER_NAME",
            host.as_ref().map_or("", |a| a.host()).as_bytes(),
        );
        push(b"SERVER_PORT", port.to_string().as_bytes());
        // php-cgi's cgi.force_redirect wants it; php-fpm ignores it.
        push(b"REDIRECT_STATUS", b"200");
        // `auth.basic` let this user in (Apache and nginx say the same).
        if let Some(user) = parts.extensions.get::<crate::site::RemoteUser>() {
            push(b"REMOTE_USER", user.0.as_bytes());
            push(b"AUTH_TYPE", b"Basic");
        }
    }
}

/// The request headers as `HTTP_*` variables.
fn http_params(headers: &http::HeaderMap, push: &mut impl FnMut(&[u8], &[u8])) {
    let mut name = Vec::with_capacity(64);
    for key in headers.keys() {
        let k = key.as_str();
        // httpoxy: a client's `Proxy` header must not become HTTP_PROXY,
        // which PHP HTTP clients read as their outgoing proxy. Names
        // with `_` were dropped before, unless `underscores_in_headers`
        // keeps them; a kept one never overwrites its dashed twin
        // (`X_Custom` and `X-Custom` are both HTTP_X_CUSTOM): the dashed one wins.
        if k == "proxy"
            || k == "content-type"
            || k == "content-length"
            || has_dashed_twin(headers, k)
        {
            continue;
        }
        name.clear();
        name.extend_from_slice(b"HTTP_");
        name.extend(k.bytes().map(|b| match b {
            b'-' => b'_',
            b => b.to_ascii_uppercase(),
        }));
        let mut values = headers.get_all(key).iter();
        let first = values.next().map_or(&b""[..], HeaderValue::as_bytes);
        match values.next() {
            None => push(&name, first),
            Some(second) => {
                let sep: &[u8] = if key == header::COOKIE { b"; " } else { b", " };
                let mut joined = first.to_vec();
                for v in std::iter::once(second).chain(values) {
                    joined.extend_from_slice(sep);
                    joined.extend_from_slice(v.as_bytes());
                }
                push(&name, &joined);
            }
        }
    }
}

/// Whether `name` has a `_` and the request also has the name with `-` in its place.
fn has_dashed_twin(headers: &http::HeaderMap, name: &str) -> bool {
    name.contains('_') && headers.contains_key(name.replace('_', "-").as_str())
}

/// The file to send for a static target: its precompressed sibling when
/// the type compresses, the route compresses (`siblings`) and the client
/// takes one (blocking: stats files).
fn static_variant(
    config: &FastCgiConfig,
    file: &path::StaticFile,
    accepted: crate::compression::Accepted,
    siblings: bool,
) -> file::Variant {
    let negotiated = siblings && crate::compression::compressible_type(file.content_type);
    let sibling = negotiated
        .then(|| path::precompressed(&config.root, file, accepted.ranked()))
        .flatten();
    match sibling {
        Some((coding, sibling)) => file::Variant {
            file: sibling,
            coding: Some(coding),
            negotiated,
        },
        None => file::Variant {
            file: file.clone(),
            coding: None,
            negotiated,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_body_that_broke_is_the_clients_400_and_a_temp_file_that_failed_is_ours() {
        let broke = FastCgiError::ClientBody("connection closed before message completed".into())
            .into_forward("php", 1024);
        assert_eq!(broke.kind, Kind::ClientBody);
        assert!(broke.is_client_fault());
        let file = FastCgiError::BodyFile("the file ended before its announced length".into())
            .into_forward("php", 1024);
        assert_eq!(file.kind, Kind::Exchange);
        assert!(!file.is_client_fault());
    }

    #[test]
    fn an_http2_clients_cookie_fields_become_one_http_cookie_joined_with_semicolons() {
        let mut headers = http::HeaderMap::new();
        for c in ["session=abc", "theme=dark"] {
            headers.append(header::COOKIE, HeaderValue::from_static(c));
        }
        headers.append("accept", HeaderValue::from_static("text/html"));
        headers.append("accept", HeaderValue::from_static("*/*"));
        let mut params = Vec::new();
        http_params(&headers, &mut |k, v| params.push((k.to_vec(), v.to_vec())));
        let get = |name: &[u8]| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get(b"HTTP_COOKIE").as_deref(),
            Some(&b"session=abc; theme=dark"[..])
        );
        assert_eq!(get(b"HTTP_ACCEPT").as_deref(), Some(&b"text/html, */*"[..]));
    }
}
