//! The site rules' phases: access (the site's, then the route's), basic auth, the route's own answers (redirect, respond), the rewrite and request header rules on the way to the upstream, and the response header rules in one place, whoever answered.
//!
//! Where each sits among the other phases, and why, is docs/SITE.md's
//! "Order": access before anything counts, auth before the limiters (a
//! failed attempt counts only on keys that name its sender), the route's
//! own answer after them (a redirect cannot walk around a limit), and the
//! response rules last, on whatever answer was made.

use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use http::{HeaderValue, Request, Response};

use super::{App, Exchange};
use crate::body::Body;
use crate::identity::Client;
use crate::metrics::SiteAnswer;
use crate::problem::Problem;
use crate::request_body::RequestBody;
use crate::site::{Redirect, RemoteUser, Rewritten};

/// What the auth phase found.
pub(super) enum Authenticated {
    /// The route has no `auth`.
    NotAsked,
    /// A user of the route's file, with the right password.
    User,
    /// No credentials, or wrong ones: 401 after the limit phase.
    Failed,
}

/// The captures of a `path_regex` route whose action names them, with the
/// normalised path they index.
pub(super) struct Captured {
    pub(super) path: String,
    pub(super) locs: regex::CaptureLocations,
}

impl App {
    /// Access: the site's list, then the route's; a refused address gets
    /// 403 before any limiter counts it (no key is created for it).
    pub(super) fn access(
        &self,
        x: &mut Exchange,
        route: usize,
        client: &Client,
    ) -> Result<(), Problem> {
        let config = &x.snap.config;
        let lists = [
            (config.site.access.as_ref(), "site.access"),
            (config.routes[route].site.access.as_ref(), "access"),
        ];
        for (list, rule) in lists {
            if list.is_some_and(|a| !a.allows(client.ip, &client.network)) {
                x.trail.record.rule = Some(rule);
                x.snap.routes[route].metrics.answered(SiteAnswer::Denied);
                return Err(Problem::Denied);
            }
        }
        Ok(())
    }

    /// Auth: the request's `Authorization: Basic` user checked against the
    /// route's users file (a bcrypt check on a blocking thread, unless these
    /// credentials passed before). A user let in reaches the upstream as
    /// `REMOTE_USER` (FastCGI), and its `Authorization` header only with
    /// `forward_authorization`.
    pub(super) async fn authenticate(
        &self,
        x: &Exchange,
        route: usize,
        req: &mut Request<RequestBody>,
    ) -> Authenticated {
        let Some(auth) = &x.snap.config.routes[route].site.auth else {
            return Authenticated::NotAsked;
        };
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(crate::site::auth::credentials);
        let Some((user, password)) = given else {
            return Authenticated::Failed;
        };
        let users = auth.users.clone();
        let ok = if users.remembered(&user, &password) {
            true
        } else {
            let name = user.clone();
            tokio::task::spawn_blocking(move || users.verify(&name, &password))
                .await
                .unwrap_or(false)
        };
        if !ok {
            return Authenticated::Failed;
        }
        if !auth.forward_authorization {
            req.headers_mut().remove(AUTHORIZATION);
        }
        req.extensions_mut().insert(RemoteUser(user));
        Authenticated::User
    }

    /// The 401 a failed auth gets, once its limit phase let it through.
    pub(super) fn unauthenticated(&self, x: &mut Exchange, route: usize) -> Response<Body> {
        let challenge = x.snap.config.routes[route]
            .site
            .auth
            .as_ref()
            .map_or(HeaderValue::from_static("Basic"), |a| a.challenge.clone());
        x.trail.record.rule = Some("auth");
        x.snap.routes[route]
            .metrics
            .answered(SiteAnswer::Unauthenticated);
        x.trail.answer(Problem::Unauthenticated(challenge))
    }

    /// A `redirect:` answer: its `Location` built by [`crate::location`]
    /// from the template, the captures and the request's query.
    pub(super) fn redirect(
        &self,
        x: &mut Exchange,
        route: usize,
        rule: &Redirect,
        query: Option<&str>,
    ) -> Response<Body> {
        x.trail.record.rule = Some("redirect");
        x.snap.routes[route].metrics.answered(SiteAnswer::Redirect);
        let captured = x.captured.as_ref();
        let e = rule.to.expand(
            captured.map_or("", |c| c.path.as_str()),
            captured.map(|c| &c.locs),
            query,
        );
        let location = match &rule.to.origin {
            None => crate::location::local(&e.path, e.query.as_deref()),
            Some(origin) => crate::location::absolute(origin, &e.path, e.query.as_deref()),
        };
        let Some(location) = location else {
            return x.trail.answer(Problem::TargetTooLong);
        };
        let mut resp = Response::new(Body::empty());
        *resp.status_mut() = rule.status;
        let h = resp.headers_mut();
        h.insert(LOCATION, location);
        h.insert(CONTENT_LENGTH, HeaderValue::from(0));
        resp
    }

    /// A `respond:` answer: its body as written, or for an error status
    /// without a body, tollgate's own negotiated page or problem+json.
    pub(super) fn respond(
        &self,
        x: &mut Exchange,
        route: usize,
        status: http::StatusCode,
        body: &bytes::Bytes,
        content_type: &HeaderValue,
    ) -> Response<Body> {
        x.trail.record.rule = Some("respond");
        x.snap.routes[route].metrics.answered(SiteAnswer::Respond);
        if body.is_empty() && (status.is_client_error() || status.is_server_error()) {
            return x.trail.answer(Problem::Responded(status));
        }
        let mut resp = Response::new(Body::full(body.clone()));
        *resp.status_mut() = status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, content_type.clone());
        resp
    }

    /// On the way to the upstream: the site's and the route's request header
    /// rules, then the rewrite (a FastCGI upstream resolves the rewritten
    /// path itself; an HTTP one is sent it as its request target).
    pub(super) fn prepare_upstream(
        &self,
        x: &mut Exchange,
        route: usize,
        fastcgi: bool,
        req: &mut Request<RequestBody>,
    ) -> Result<(), Problem> {
        let config = &x.snap.config;
        let site = &config.routes[route].site;
        for rules in [&config.site.headers, &site.headers] {
            if let Some(r) = rules.as_ref().and_then(|h| h.request.as_ref()) {
                r.apply(req.headers_mut());
            }
        }
        let Some(rewrite) = &site.rewrite else {
            return Ok(());
        };
        let captured = x.captured.as_ref();
        let e = rewrite.to.expand(
            captured.map_or("", |c| c.path.as_str()),
            captured.map(|c| &c.locs),
            req.uri().query(),
        );
        let rewritten = Rewritten {
            path: e.path,
            query: e.query,
            unless_exists: rewrite.unless_exists,
        };
        if rewritten.path.len() > crate::location::MAX_LOCATION {
            return Err(Problem::TargetTooLong);
        }
        x.trail.record.rule = Some("rewrite");
        if fastcgi {
            req.extensions_mut().insert(rewritten);
            return Ok(());
        }
        // The same rules as a requested path: a separator the router would
        // not see is refused, dot segments never climb above the root.
        let separators = config.server.encoded_separators;
        let path = crate::router::request_path(&rewritten.path, separators)
            .map_err(|e| Problem::BadRequest(e.to_string()))?;
        let slash = if rewritten.path.ends_with('/') && path != "/" {
            "/"
        } else {
            ""
        };
        let target = match &rewritten.query {
            Some(q) => format!("{path}{slash}?{q}"),
            None => format!("{path}{slash}"),
        };
        *req.uri_mut() = target
            .parse()
            .map_err(|_| Problem::BadRequest("The rewritten target is not a valid path.".into()))?;
        Ok(())
    }

    /// The response header rules, in one place, on whatever answer the
    /// request got: the site's, then the route's. An upstream's answer gets
    /// every rule; tollgate's own only gains headers it does not carry.
    pub(super) fn response_headers(&self, x: &Exchange, resp: &mut Response<Body>) {
        let config = &x.snap.config;
        let route = x
            .trail
            .route
            .and_then(|i| config.routes[i].site.headers.as_ref());
        for headers in [config.site.headers.as_ref(), route].into_iter().flatten() {
            let Some(rules) = &headers.response else {
                continue;
            };
            if x.upstream_answered {
                rules.apply(resp.headers_mut());
            } else {
                rules.apply_to_own(resp.headers_mut());
            }
        }
    }
}
