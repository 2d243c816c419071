//! The request lifecycle, top to bottom: sanity → identity → route → limiters → respond | proxy.
//!
//! `App` is a cheap handle that the server clones into every connection. A
//! request loads the current [`Snapshot`] once and finishes on it, whatever
//! a reload does meanwhile.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use parking_lot::Mutex;

use crate::body::Body;
use crate::clock::SharedClock;
use crate::config::{Config, OnError};
use crate::identity::Client;
use crate::limiter::{Nanos, Verdict};
use crate::metrics::{inc, Metrics};
use crate::problem::{set_rate_limit_headers, Denial, LimitView, Problem};
use crate::router::{normalize, request_host};
use crate::snapshot::{Route, RouteAction, Snapshot};
use crate::store::{AuditRow, Check, Outcome, Store};

/// What the server knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    /// `http` or `https`, for `X-Forwarded-Proto`.
    pub proto: &'static str,
}

/// The state every part of the process shares.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub store: Store,
    pub clock: SharedClock,
    pub metrics: Metrics,
    /// The file reloads read, if the config came from one.
    pub config_path: Option<PathBuf>,
    /// The text the config in force was built from; the file watch compares against it.
    pub config_text: Mutex<Option<String>>,
    /// The last reload's error, shown by `GET /config` until a reload succeeds.
    pub last_reload_error: Mutex<Option<String>>,
    pub started: Instant,
    /// The listeners in service while `run` runs; reloads rebind through it.
    pub listeners: Mutex<Option<crate::server::ListenerSet>>,
    /// TLS termination; reloads swap its certificates.
    pub tls: crate::tls::Terminator,
}

#[derive(Clone)]
pub struct App {
    pub shared: Arc<Shared>,
}

/// The limiters' answer for one request.
struct Limits {
    views: Vec<(usize, Outcome)>,
    denial: Option<Denial>,
    /// The longest shaping delay among the limiters.
    delay: Nanos,
    /// Leaky-bucket places to give back if the client leaves while queued.
    queued: Release,
    /// Concurrency slots to free when the response is done.
    slots: Release,
    /// The store's clock at the decision (Redis' for a fleet): headers count from it.
    at: Nanos,
}

impl App {
    pub fn new(
        config: Config,
        store: Store,
        clock: SharedClock,
        config_path: Option<PathBuf>,
    ) -> App {
        let metrics = Metrics::default();
        let tls = crate::tls::Terminator::new(config.server.tls.as_ref().map(|t| t.loaded.clone()));
        let snapshot = Snapshot::build(config, 1, None, &metrics);
        let config_text = config_path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok());
        App {
            shared: Arc::new(Shared {
                snapshot: ArcSwap::from_pointee(snapshot),
                store,
                clock,
                metrics,
                config_path,
                config_text: Mutex::new(config_text),
                last_reload_error: Mutex::new(None),
                started: Instant::now(),
                listeners: Mutex::new(None),
                tls,
            }),
        }
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    /// Serves one request; every failure becomes a problem+json response.
    pub async fn handle(&self, req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let snap = self.snapshot();
        let started = Instant::now();
        let now = self.shared.clock.now();
        match self.serve(&snap, req, conn, now, started).await {
            Ok(resp) => resp,
            Err(problem) => problem.into_response(),
        }
    }

    async fn serve(
        &self,
        snap: &Arc<Snapshot>,
        req: Request<Incoming>,
        conn: ConnInfo,
        now: Nanos,
        started: Instant,
    ) -> Result<Response<Body>, Problem> {
        let max_body = snap.config.server.max_request_body;
        check_framing(req.headers(), max_body)?;
        let client = snap.identity.resolve(conn.peer, req.headers()).map_err(
            |crate::identity::IdentityError::UnknownApiKey(short)| Problem::UnknownApiKey(short),
        )?;
        let path = normalize(req.uri().path());
        // Building the host string is only worth it when a route asks for one.
        let host = if snap.router.uses_host() {
            request_host(&req)
        } else {
            None
        };
        let index = snap
            .router
            .find(req.method(), host.as_deref(), &path)
            .ok_or(Problem::NoRoute)?;
        let route = &snap.routes[index];

        let mut limits = None;
        if client.exempt {
            inc(&route.metrics.exempt);
            tracing::info!(client = %client.ip, route = %route.name, "exempt client passed without limits");
        } else if !route.limiters.is_empty() {
            match self.limit(snap, route, &client, req.headers(), now).await {
                Ok(l) => limits = Some(l),
                // `limit` counted it (and answered from the local table for `local`).
                Err(_) if snap.config.store.on_error == OnError::Deny => {
                    return Err(Problem::StoreUnavailable);
                }
                Err(_) => {}
            }
        }
        let headers_of = |limits: &Option<Limits>, resp: &mut Response<Body>| {
            if let Some(l) = limits {
                let views: Vec<LimitView<'_>> = l
                    .views
                    .iter()
                    .map(|(i, o)| LimitView {
                        name: &snap.limiters[*i].name,
                        quota: o.quota,
                    })
                    .collect();
                set_rate_limit_headers(resp.headers_mut(), &views, l.at);
            }
        };

        if let Some(denial) = limits.as_mut().and_then(|l| l.denial.take()) {
            inc(&route.metrics.rejected);
            let mut resp = Problem::RateLimited(Box::new(denial)).into_response();
            headers_of(&limits, &mut resp);
            return Ok(resp);
        }
        inc(&route.metrics.allowed);

        if let Some(l) = limits.as_mut() {
            if l.delay > 0 {
                // Dropping this future (the client went away) drops `l.queued`,
                // which gives the place in the queue back.
                // From the instant `now` was read, so the time spent checking
                // does not shift the release: releases stay exactly spaced.
                tokio::time::sleep_until((started + Duration::from_nanos(l.delay)).into()).await;
                l.queued.disarm();
            }
        }

        let mut resp = match &route.action {
            RouteAction::Respond {
                status,
                body,
                content_type,
            } => {
                let mut resp = Response::new(Body::full(body.clone()));
                *resp.status_mut() = *status;
                resp.headers_mut()
                    .insert(CONTENT_TYPE, content_type.clone());
                resp
            }
            RouteAction::Upstream(u) => {
                let upstream = &snap.upstreams[*u];
                let audit = snap
                    .config
                    .audit
                    .enabled
                    .then(|| (req.method().clone(), req.uri().path().to_string()));
                let result = upstream
                    .forward(req, &client, conn.peer, conn.proto, max_body)
                    .await;
                let resp = match result {
                    Ok((resp, connection)) => {
                        // Both live exactly as long as the body: the slot is
                        // freed and the connection recycled when it is done.
                        let slots = limits
                            .as_mut()
                            .map(|l| std::mem::take(&mut l.slots))
                            .filter(|s| !s.is_empty());
                        let guard: Option<crate::body::Guard> = match (slots, connection) {
                            (None, None) => None,
                            (Some(s), None) => Some(Box::new(s)),
                            (None, Some(c)) => Some(c),
                            (Some(s), Some(c)) => Some(Box::new((s, c))),
                        };
                        resp.map(|b| Body::upstream(b, guard))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, route = %route.name, "forwarding failed");
                        self.shared
                            .metrics
                            .counter(
                                "tollgate_upstream_errors_total",
                                &[("upstream", &upstream.name), ("kind", e.kind())],
                            )
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Problem::from(e).into_response()
                    }
                };
                if let Some((method, req_path)) = audit {
                    self.shared.store.audit(AuditRow {
                        time: now,
                        client: client.display().to_string(),
                        method,
                        path: req_path,
                        route: route.name.clone(),
                        status: resp.status().as_u16(),
                        duration: started.elapsed(),
                    });
                }
                resp
            }
        };
        headers_of(&limits, &mut resp);
        Ok(resp)
    }

    /// Checks every limiter of the route for this client in one store call.
    async fn limit(
        &self,
        snap: &Arc<Snapshot>,
        route: &Route,
        client: &Client,
        headers: &HeaderMap,
        now: Nanos,
    ) -> Result<Limits, crate::store::StoreError> {
        struct Applied {
            limiter: usize,
            store_key: String,
        }
        let applied: Vec<Applied> = route
            .limiters
            .iter()
            .filter_map(|&i| {
                let store_key = snap.limiters[i].request_key(client, &route.name, headers)?;
                Some(Applied {
                    limiter: i,
                    store_key,
                })
            })
            .collect();
        let checks: Vec<Check<'_>> = applied
            .iter()
            .map(|a| {
                let l = &snap.limiters[a.limiter];
                Check {
                    key: &a.store_key,
                    algorithm: l.algorithm_for(l.value_of(&a.store_key)),
                    shadow: l.shadow,
                }
            })
            .collect();
        let outcomes = match self.shared.store.check(&checks, now).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                let policy = snap.config.store.on_error;
                self.store_failed(route, &e, policy);
                if policy != OnError::Local {
                    return Err(e);
                }
                self.shared.store.check_local(&checks, now)
            }
        };
        let at = outcomes.first().map_or(now, |o| o.at);

        let mut denial: Option<Denial> = None;
        let mut delay = 0;
        let mut queued = Release::new(true);
        let mut slots = Release::new(false);
        let admitted = !outcomes
            .iter()
            .zip(&checks)
            .any(|(o, c)| o.verdict.is_deny() && !c.shadow);
        for ((a, o), c) in applied.iter().zip(&outcomes).zip(&checks) {
            let l = &snap.limiters[a.limiter];
            match o.verdict {
                Verdict::Deny { retry_after } if l.shadow => {
                    inc(&l.metrics.would_reject);
                    tracing::info!(limiter = %l.name, key = %client.display(), retry_after_ms = retry_after / 1_000_000, "shadow limiter would reject");
                }
                Verdict::Deny { retry_after } => {
                    inc(&l.metrics.rejected);
                    let d = denial.get_or_insert_with(|| Denial {
                        limiter: l.name.clone(),
                        quota: o.quota,
                        policy: l.describe(c.algorithm),
                        retry_after,
                        violated: Vec::new(),
                        key: client.display().to_string(),
                    });
                    if retry_after > d.retry_after {
                        d.limiter = l.name.clone();
                        d.quota = o.quota;
                        d.policy = l.describe(c.algorithm);
                        d.retry_after = retry_after;
                    }
                    d.violated.push(l.name.clone());
                }
                Verdict::Delay(wait) => {
                    inc(&l.metrics.delayed);
                    delay = delay.max(wait);
                    if admitted {
                        queued.push(self, snap, a.limiter, &a.store_key, now + wait);
                    }
                }
                Verdict::Allow => inc(&l.metrics.allowed),
            }
            if admitted && matches!(c.algorithm, crate::limiter::Algorithm::Concurrency(_)) {
                slots.push(self, snap, a.limiter, &a.store_key, now);
            }
        }
        Ok(Limits {
            views: applied.iter().map(|a| a.limiter).zip(outcomes).collect(),
            denial,
            delay,
            queued,
            slots,
            at,
        })
    }

    /// Counts a failed store call and the `on_error` decision it leads to.
    fn store_failed(&self, route: &Route, e: &crate::store::StoreError, policy: OnError) {
        inc(&route.metrics.store_error);
        let metrics = &self.shared.metrics;
        let labels = [
            ("backend", self.shared.store.backend()),
            ("policy", policy.as_str()),
        ];
        inc(&metrics.counter("tollgate_store_errors_total", &labels));
        inc(&metrics.counter("tollgate_store_fallback_total", &labels[1..]));
        if matches!(e, crate::store::StoreError::CircuitOpen) {
            // The breaker logged when it opened; one line per request would flood.
            tracing::debug!(error = %e, ?policy, "store skipped; applying on_error");
        } else {
            tracing::warn!(error = %e, ?policy, "store failed; applying on_error");
        }
    }
}

/// A declared body over the limit is refused before a byte of it is read.
/// (A request with both Content-Length and Transfer-Encoding never gets here
/// with both: hyper keeps Transfer-Encoding, drops Content-Length and closes
/// the connection after the response, as RFC 9112 §6.3 allows, so nothing
/// can be smuggled behind the body.)
fn check_framing(headers: &HeaderMap, max_body: u64) -> Result<(), Problem> {
    if let Some(cl) = headers.get(CONTENT_LENGTH) {
        let len: u64 = cl
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| Problem::BadRequest("Content-Length is not a number.".into()))?;
        if len > max_body {
            return Err(Problem::BodyTooLarge { limit: max_body });
        }
    }
    Ok(())
}

/// Gives limiter places back when dropped: queued leaky-bucket places (only
/// if the request left before its turn) or concurrency slots (always).
/// Empty (and free: no handle is cloned) unless a place was taken.
#[derive(Default)]
pub struct Release {
    app: Option<App>,
    snap: Option<Arc<Snapshot>>,
    only_before_ticket: bool,
    items: Vec<(usize, String, Nanos)>,
}

impl Release {
    fn new(only_before_ticket: bool) -> Release {
        Release {
            app: None,
            snap: None,
            only_before_ticket,
            items: Vec::new(),
        }
    }

    fn push(
        &mut self,
        app: &App,
        snap: &Arc<Snapshot>,
        limiter: usize,
        store_key: &str,
        ticket: Nanos,
    ) {
        if self.app.is_none() {
            self.app = Some(app.clone());
            self.snap = Some(snap.clone());
        }
        self.items.push((limiter, store_key.to_string(), ticket));
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The request got its turn: nothing to give back.
    fn disarm(&mut self) {
        self.items.clear();
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let (Some(app), Some(snap)) = (&self.app, &self.snap) else {
            return;
        };
        if self.items.is_empty() {
            return;
        }
        let now = app.shared.clock.now();
        for (limiter, store_key, ticket) in self.items.drain(..) {
            if self.only_before_ticket && now >= ticket {
                continue;
            }
            let l = &snap.limiters[limiter];
            let algorithm = l.algorithm_for(l.value_of(&store_key));
            app.shared.store.release(&store_key, algorithm, ticket, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn a_declared_body_over_the_limit_is_refused_before_reading_it() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("101"));
        assert!(matches!(
            check_framing(&h, 100),
            Err(Problem::BodyTooLarge { limit: 100 })
        ));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("100"));
        assert!(check_framing(&h, 100).is_ok());
    }
}
