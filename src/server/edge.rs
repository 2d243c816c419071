//! What a public connection's request meets before the app: an ACME http-01 validation answered, the redirect to https, HSTS on the app's answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::acme::state::Managed;
use crate::app::{App, ConnInfo};
use crate::body::Body;
use crate::problem::Problem;

/// What the edge itself does on a connection before the app: the redirect
/// of a plain listener, the ACME http-01 answers, HSTS on TLS responses.
pub(super) struct Edge {
    pub(super) redirect_to: Option<u16>,
    pub(super) acme: Arc<Managed>,
    pub(super) hsts: Option<http::HeaderValue>,
}

/// `Strict-Transport-Security` as `server.tls.hsts` says (read once per connection).
pub(super) fn hsts_header(app: &App) -> Option<http::HeaderValue> {
    let snap = app.snapshot();
    let hsts = snap.config.server.tls.as_ref()?.hsts.as_ref()?;
    http::HeaderValue::from_str(&hsts.header_value()).ok()
}

/// One request on a public connection, started as hyper hands it over: an
/// ACME http-01 validation in flight is answered first (before routes,
/// limiters and the redirect: a CA's check must never be refused); with
/// `redirect_to`, a 308 to https (except an ACME challenge); otherwise the
/// app's answer. The future hyper keeps (and moves as it keeps it) is this
/// small one, not the request's own (kilobytes, in its box).
pub(super) fn answer(
    app: &App,
    req: Request<Incoming>,
    conn_info: ConnInfo,
    edge: &Edge,
    share: crate::buffering::Share,
) -> impl Future<Output = Response<Body>> + Send + 'static {
    let hsts = edge.hsts.clone();
    let started = if let Some(token) = req.uri().path().strip_prefix(crate::router::ACME_CHALLENGE)
    {
        let (token, acme) = (token.to_owned(), edge.acme.clone());
        let app = app.clone();
        let hsts = hsts.clone();
        Started::Acme(Box::pin(async move {
            match acme.http_answer_anywhere(&token).await {
                Some(key_authorization) => acme_answer(key_authorization),
                None => with_hsts(app.handle_on(req, conn_info, Some(share)).await, hsts),
            }
        }))
    } else if let Some(port) = edge.redirect_to {
        Started::Answered(https_redirect(app, &req, port))
    } else {
        // Boxed: hyper moves the service's future into its dispatcher,
        // and the whole request lifecycle inline is kilobytes of state
        // copied per request (callgrind: ~8,400 instructions of memcpy
        // per 429); a box moves a pointer.
        Started::App(Box::pin(app.handle_on(req, conn_info, Some(share))))
    };
    async move {
        match started {
            Started::App(request) => with_hsts(request.await, hsts),
            Started::Answered(resp) => resp,
            Started::Acme(check) => check.await,
        }
    }
}

/// How [`answer`] started a request: the app's future, boxed; an answer
/// already written (the redirect to https); or an ACME check first, then
/// the app's answer where the token is not one in flight.
enum Started<F> {
    App(Pin<Box<F>>),
    Answered(Response<Body>),
    Acme(Pin<Box<dyn Future<Output = Response<Body>> + Send>>),
}

/// The app's answer with `Strict-Transport-Security`, where `server.tls.hsts` sets it.
fn with_hsts(mut resp: Response<Body>, hsts: Option<http::HeaderValue>) -> Response<Body> {
    if let Some(hsts) = hsts {
        resp.headers_mut()
            .insert(http::header::STRICT_TRANSPORT_SECURITY, hsts);
    }
    resp
}

/// The key authorization an ACME http-01 validation asks for.
fn acme_answer(key_authorization: String) -> Response<Body> {
    let mut resp = Response::new(Body::full(key_authorization));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/octet-stream"),
    );
    resp
}

/// The 308 to https, or a 400 where the request has no usable `Host`.
fn https_redirect(app: &App, req: &Request<Incoming>, port: u16) -> Response<Body> {
    crate::router::https_redirect(req, port).unwrap_or_else(|| {
        let snap = app.snapshot();
        let accept = req.headers().get(http::header::ACCEPT);
        let negotiation = crate::page::negotiate(accept, &snap.config.server.errors, None);
        Problem::BadRequest("A redirect to https needs a valid Host header.".into()).respond(
            &crate::problem::Answering {
                negotiation,
                ..Default::default()
            },
        )
    })
}
