//! Forwarding to an upstream: hop-by-hop headers, X-Forwarded-*, timeouts, a pooled keep-alive client.

use std::error::Error as StdError;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use http_body_util::{LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::{UpstreamConfig, UpstreamTls};
use crate::connections::ConnInfo;
use crate::identity::Client as ClientIdentity;

mod headers;

pub use crate::body::Forwarded;
pub use crate::forward_error::{ForwardError, Kind};
use crate::request_body::RequestBody;
pub use crate::request_body::UpstreamBody;
pub use headers::{
    drop_underscore_names, edge_owned_position, edge_owned_present, set_forwarded_headers,
    strip_hop_by_hop, EDGE_OWNED,
};

/// One configured upstream with its connection pool.
#[derive(Debug)]
pub struct Upstream {
    pub name: String,
    scheme: Scheme,
    authority: Authority,
    /// A path the upstream URL carries (`http://app/base`), prepended; empty for `/`.
    base_path: String,
    timeout: Duration,
    /// https:// upstreams: one hyper-util pool per worker thread (index 0 for
    /// everything else), so a request never uses a connection whose task
    /// lives on another thread. Empty for http:// upstreams.
    clients: Vec<Client<HttpsConnector<HttpConnector>, UpstreamBody>>,
    /// http:// upstreams: idle connections per worker (see `pool`).
    plain: Option<std::sync::Arc<crate::pool::Pool>>,
    /// What the pool was built from, to reuse it when a reload leaves it unchanged.
    config: (Uri, Duration, Duration, UpstreamTls),
    /// fastcgi:// upstreams (php-fpm) take their own path; see `crate::fastcgi`.
    fastcgi: Option<crate::fastcgi::FastCgi>,
}

/// What went wrong connecting: the TLS reason when there is one, else the
/// error's whole source chain (hyper-util's own text is only `client error (Connect)`).
pub(crate) fn connect_reason(e: &hyper_util::client::legacy::Error) -> String {
    if let Some(tls) = crate::tls::upstream_failure(e) {
        return tls;
    }
    let mut reason = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        next = cause.source();
    }
    reason
}

/// https:// upstreams: a hyper-util client per worker and one for
/// everything else, over one TLS connector; none for any other scheme.
fn https_clients(
    config: &UpstreamConfig,
    https: bool,
    workers: usize,
) -> Vec<Client<HttpsConnector<HttpConnector>, UpstreamBody>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(config.connect_timeout));
    connector.set_nodelay(true);
    connector.set_keepalive(Some(Duration::from_secs(60)));
    // The TLS layer takes https:// URLs; http:// ones pass through untouched.
    connector.enforce_http(false);
    let tls = if https {
        crate::tls::upstream_client_config(&config.tls)
    } else {
        // Never used: a plain upstream's pool is never asked for https://.
        crate::tls::upstream_client_config(&UpstreamTls::Ca {
            path: Default::default(),
            certs: Vec::new(),
        })
    };
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    (0..=workers)
        .filter(|_| https)
        .map(|_| {
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .pool_max_idle_per_host(4096)
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .set_host(false)
                .build(connector.clone())
        })
        .collect()
}

impl Upstream {
    /// `workers`: the worker runtimes (`server.workers`); each gets its own connections.
    pub fn new(
        config: &UpstreamConfig,
        metrics: &crate::metrics::Metrics,
        workers: usize,
    ) -> Upstream {
        let https = config.url.scheme() == Some(&Scheme::HTTPS);
        let clients = https_clients(config, https, workers);
        let parts = config.url.clone().into_parts();
        let base_path = parts
            .path_and_query
            .as_ref()
            .map(|p| p.path().trim_end_matches('/').to_string())
            .unwrap_or_default();
        let authority = parts.authority.expect("validated: upstream URL has a host");
        Upstream {
            name: config.name.clone(),
            scheme: parts.scheme.unwrap_or(Scheme::HTTP),
            authority: authority.clone(),
            base_path,
            timeout: config.timeout,
            clients,
            plain: (!https && config.fastcgi.is_none()).then(|| {
                crate::pool::Pool::new(authority.clone(), config.connect_timeout, workers)
            }),
            config: (
                config.url.clone(),
                config.connect_timeout,
                config.timeout,
                config.tls.clone(),
            ),
            fastcgi: config.fastcgi.as_ref().map(|f| {
                crate::fastcgi::FastCgi::new(
                    &config.name,
                    f,
                    config.connect_timeout,
                    config.timeout,
                    metrics,
                    workers,
                )
            }),
        }
    }

    fn client(&self, worker: usize) -> &Client<HttpsConnector<HttpConnector>, UpstreamBody> {
        self.clients.get(worker).unwrap_or(&self.clients[0])
    }

    /// Whether this pool can serve `config` unchanged (a reload keeps it warm).
    pub fn serves(&self, config: &UpstreamConfig) -> bool {
        self.name == config.name
            && self.config.0 == config.url
            && (self.config.1, self.config.2) == (config.connect_timeout, config.timeout)
            && self.config.3 == config.tls
            && match (&self.fastcgi, &config.fastcgi) {
                (Some(f), Some(c)) => f.serves(c),
                (None, None) => true,
                _ => false,
            }
    }

    /// Sends a prepared request to this server. A request that never left
    /// (no connection could be made) comes back in the error, for another server.
    pub async fn send(&self, mut outbound: Box<Outbound>) -> Result<Sent, SendError> {
        // An HTTP/1.0 client may send no Host; the upstream speaks HTTP/1.1,
        // which requires one, so it gets the server's own name (as nginx does).
        if !outbound.parts.headers.contains_key(header::HOST) {
            if let Ok(h) = HeaderValue::from_str(self.authority.as_str()) {
                outbound.parts.headers.insert(header::HOST, h);
            }
        }
        if let Some(fastcgi) = &self.fastcgi {
            // Boxed, as the https arm below: only their requests pay for their futures.
            return Box::pin(self.send_fastcgi(fastcgi, outbound)).await;
        }
        if !self.base_path.is_empty() {
            outbound.target =
                PathAndQuery::try_from(format!("{}{}", self.base_path, outbound.target.as_str()))
                    .unwrap_or_else(|_| PathAndQuery::from_static("/"));
        }
        match &self.plain {
            Some(pool) => self.send_plain(pool, outbound).await,
            None => Box::pin(self.send_pooled(outbound)).await,
        }
    }

    /// php-fpm gets the request as CGI parameters: the client as it connected.
    async fn send_fastcgi(
        &self,
        fastcgi: &crate::fastcgi::FastCgi,
        outbound: Box<Outbound>,
    ) -> Result<Sent, SendError> {
        let Outbound {
            parts, body, kept, ..
        } = *outbound;
        let Kept {
            max_body,
            client_ip,
            peer,
            proto,
            worker,
            ..
        } = kept;
        let answer = fastcgi
            .forward(parts, body, client_ip, peer, proto, worker)
            .await;
        match answer {
            Ok(mut resp) => {
                strip_hop_by_hop(resp.headers_mut());
                Ok((resp.map(Forwarded::Streamed), None))
            }
            Err(e) => Err(SendError::sent(e.into_forward(&self.name, max_body))),
        }
    }

    /// An http:// server, over a connection of our own: a request that
    /// found no connection comes back unsent.
    async fn send_plain(
        &self,
        pool: &std::sync::Arc<crate::pool::Pool>,
        outbound: Box<Outbound>,
    ) -> Result<Sent, SendError> {
        // The request line is in origin form.
        let (upstream_req, kept) = outbound.into_request(Uri::from);
        let upgrade = kept.upgrade.is_some();
        let sent =
            tokio::time::timeout(self.timeout, pool.send(upstream_req, kept.worker, upgrade)).await;
        match sent {
            Err(_) => Err(SendError::sent(self.timed_out())),
            // The request body's own error (the client's, or its limit),
            // whichever client wrote it.
            Ok(Err((source, _))) if client_side(&source, kept.max_body).is_some() => Err(
                SendError::sent(client_side(&source, kept.max_body).expect("checked")),
            ),
            Ok(Err((source, unsent))) => Err(self.pool_failed(source, unsent, kept)),
            Ok(Ok(crate::pool::Answer::Hyper(mut resp, held))) => {
                keep_upgrade(&mut resp, upgrade);
                Ok((
                    resp.map(Forwarded::from),
                    Some(Box::new(held) as crate::body::Guard),
                ))
            }
            Ok(Ok(crate::pool::Answer::Lean(mut resp))) => {
                keep_upgrade(&mut resp, false);
                Ok((resp.map(Forwarded::Lean), None))
            }
        }
    }

    /// A send our own pool could not make: the error, and the request back
    /// (with the client's path, for another server) when it never left.
    fn pool_failed(
        &self,
        source: crate::pool::PoolError,
        unsent: Option<Request<UpstreamBody>>,
        kept: Kept,
    ) -> SendError {
        let kind = match source {
            crate::pool::PoolError::Exchange(_) | crate::pool::PoolError::Lean(_) => Kind::Exchange,
            crate::pool::PoolError::Connect { .. }
            | crate::pool::PoolError::ConnectTimeout { .. }
            | crate::pool::PoolError::Handshake(_) => Kind::Connect,
        };
        let error = ForwardError::new(
            kind,
            format!("forwarding to upstream {} failed: {source}", self.name),
        )
        .on(&self.name)
        .because(source);
        match unsent {
            Some(req) => SendError {
                error: error.unsent(),
                back: Some(Outbound::again(req, kept, &self.base_path)),
            },
            None => SendError::sent(error),
        }
    }

    /// An https:// server, through hyper-util's pool (which keeps a request
    /// it could not send: it never comes back for another server).
    async fn send_pooled(&self, outbound: Box<Outbound>) -> Result<Sent, SendError> {
        let (
            upstream_req,
            Kept {
                max_body,
                upgrade,
                worker,
                ..
            },
        ) = outbound.into_request(|target| {
            let mut uri = http::uri::Parts::default();
            uri.scheme = Some(self.scheme.clone());
            uri.authority = Some(self.authority.clone());
            uri.path_and_query = Some(target);
            Uri::from_parts(uri).expect("scheme, authority and path are set")
        });
        let sent =
            tokio::time::timeout(self.timeout, self.client(worker).request(upstream_req)).await;
        let failed = match sent {
            Ok(Ok(mut resp)) => {
                keep_upgrade(&mut resp, upgrade.is_some());
                return Ok((resp.map(Forwarded::from), None));
            }
            Err(_) => self.timed_out(),
            Ok(Err(e)) => match client_side(&e, max_body) {
                Some(client) => client,
                None if e.is_connect() => ForwardError::new(
                    Kind::Connect,
                    format!(
                        "cannot connect to upstream {}: {}",
                        self.name,
                        connect_reason(&e)
                    ),
                )
                .on(&self.name)
                .because(e),
                None => ForwardError::new(
                    Kind::Exchange,
                    format!("forwarding to upstream {} failed: {e}", self.name),
                )
                .on(&self.name)
                .because(e),
            },
        };
        Err(SendError::sent(failed))
    }

    fn timed_out(&self) -> ForwardError {
        ForwardError::new(
            Kind::Timeout,
            format!(
                "upstream {} did not answer within {:?}",
                self.name, self.timeout
            ),
        )
        .on(&self.name)
    }
}

/// A response head and what must live as long as its body (the connection's way back).
pub type Sent = (Response<Forwarded>, Option<crate::body::Guard>);

/// The client's side of a broken exchange: its body over the limit, or its
/// own body's error (the request body is the client's `Incoming`, so its
/// hyper error shows up as the cause of the one the exchange reports).
fn client_side(e: &(dyn StdError + 'static), max_body: u64) -> Option<ForwardError> {
    if caused_by_body_limit(e) {
        return Some(ForwardError::body_too_large(max_body));
    }
    client_body_error(e).map(ForwardError::client_body)
}

/// A request with its headers rewritten for the upstream, not yet bound to
/// a server. Boxed on its way down: each send's future then holds a
/// pointer, not the request (docs/PERFORMANCE.md, "The request's future").
pub struct Outbound {
    parts: http::request::Parts,
    /// The client's path and query; each server prepends its base path.
    target: PathAndQuery,
    body: UpstreamBody,
    kept: Kept,
}

/// What a send keeps once hyper has the request: what the answer needs, and
/// what builds the request again when it comes back unsent.
struct Kept {
    max_body: u64,
    /// The `Upgrade` header of an upgrade request (kept, unlike other hop-by-hop headers).
    upgrade: Option<HeaderValue>,
    /// For a FastCGI server, which is told the client directly (`REMOTE_ADDR`, …).
    client_ip: IpAddr,
    peer: SocketAddr,
    proto: &'static str,
    /// The worker runtime the request is served on: its connections are used.
    worker: usize,
}

impl Outbound {
    pub fn new(
        req: Request<RequestBody>,
        client: &ClientIdentity,
        conn: &ConnInfo,
        max_body: u64,
    ) -> Box<Outbound> {
        let ConnInfo {
            peer,
            proto,
            port,
            worker,
        } = *conn;
        let (mut parts, body) = req.into_parts();
        let upgrade = crate::tunnel::requested_upgrade(&parts.headers);
        let sent_host = parts.headers.get(header::HOST).cloned();
        let had_host = sent_host.is_some();
        let host = sent_host.or_else(|| {
            parts
                .uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        let listed = strip_hop_by_hop(&mut parts.headers);
        // An HTTP/2 client's cookie fields, as one HTTP/1.1 `Cookie`.
        crate::header_value::join_cookies(&mut parts.headers);
        // Put (back) where an HTTP/2 client's authority stands for it, or
        // where `Connection` named it: nearly every request still has its own.
        if let Some(h) = host.filter(|_| listed || !had_host) {
            parts.headers.insert(header::HOST, h);
        }
        if let Some(u) = &upgrade {
            parts.headers.insert(header::UPGRADE, u.clone());
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
        set_forwarded_headers(&mut parts.headers, client, peer.ip(), proto, port);
        let target = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.version = Version::HTTP_11;
        let limit = usize::try_from(max_body).unwrap_or(usize::MAX);
        Box::new(Outbound {
            parts,
            target,
            body: Limited::new(body, limit),
            kept: Kept {
                max_body,
                upgrade,
                client_ip: client.ip,
                peer,
                proto,
                worker,
            },
        })
    }

    /// A request that came back unsent from a server with `base_path`: the
    /// client's path is its URI without that prefix.
    fn again(req: Request<UpstreamBody>, kept: Kept, base_path: &str) -> Box<Outbound> {
        let (parts, body) = req.into_parts();
        let sent = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let target = PathAndQuery::try_from(sent.strip_prefix(base_path).unwrap_or(sent))
            .unwrap_or_else(|_| PathAndQuery::from_static("/"));
        Box::new(Outbound {
            parts,
            target,
            body,
            kept,
        })
    }

    /// The request as hyper sends it, its target made the URI by `uri`
    /// (origin or absolute form), and what the send keeps.
    fn into_request(
        self: Box<Self>,
        uri: impl FnOnce(PathAndQuery) -> Uri,
    ) -> (Request<UpstreamBody>, Kept) {
        let Outbound {
            mut parts,
            target,
            body,
            kept,
        } = *self;
        parts.uri = uri(target);
        (Request::from_parts(parts, body), kept)
    }

    /// Whether this is an upgrade request (a tunnel once answered 101).
    pub fn is_upgrade(&self) -> bool {
        self.kept.upgrade.is_some()
    }

    pub fn method(&self) -> &http::Method {
        &self.parts.method
    }
}

/// Why a send failed; `back` holds the request when no server has seen it
/// (and then `error.retry` is set).
pub struct SendError {
    pub error: ForwardError,
    pub back: Option<Box<Outbound>>,
}

impl SendError {
    fn sent(error: ForwardError) -> SendError {
        SendError { error, back: None }
    }
}

/// Strips the response's hop-by-hop headers, except the `Upgrade` and
/// `Connection` of a 101 answer to an upgrade request.
///
/// The answer also becomes tollgate's own HTTP/1.1 message: hyper writes a
/// response in the version it carries, so an HTTP/1.0 upstream's version
/// would reach an HTTP/1.1 client and end its keep-alive (as nginx, the
/// upstream's version is a matter between tollgate and the upstream; hyper
/// still answers an HTTP/1.0 client as HTTP/1.0).
fn keep_upgrade<B>(resp: &mut Response<B>, asked: bool) {
    *resp.version_mut() = Version::HTTP_11;
    let upgraded = asked && resp.status() == http::StatusCode::SWITCHING_PROTOCOLS;
    let upgrade = upgraded
        .then(|| resp.headers().get(header::UPGRADE).cloned())
        .flatten();
    strip_hop_by_hop(resp.headers_mut());
    if let Some(u) = upgrade {
        resp.headers_mut().insert(header::UPGRADE, u);
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Warns, loudly, about every upstream whose certificate is not verified;
/// called when tollgate starts and on every reload, so the setting is never forgotten.
pub fn warn_insecure_upstreams(upstreams: &[UpstreamConfig]) {
    for u in upstreams {
        if u.tls == UpstreamTls::InsecureSkipVerify {
            tracing::warn!(
                upstream = %u.name,
                url = %u.url,
                "INSECURE: insecure_skip_verify is set; this upstream's TLS certificate is NOT verified, \
                 so anyone on the network path can impersonate it and read or change its traffic"
            );
        }
    }
}

fn caused_by_body_limit(e: &(dyn StdError + 'static)) -> bool {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The client body's own error, if that is what failed the exchange.
fn client_body_error(e: &(dyn StdError + 'static)) -> Option<String> {
    let mut cur: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<hyper::Error>() {
            if let Some(inner) = err.source().filter(|s| s.is::<hyper::Error>()) {
                return Some(inner.to_string());
            }
        }
        cur = err.source();
    }
    None
}
