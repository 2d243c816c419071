//! The request lifecycle, top to bottom: sanity → identity → route → limiters → respond | proxy → access.
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

use crate::access::{AccessLog, AccessRecord};
use crate::body::Body;
use crate::clock::SharedClock;
use crate::config::{Config, OnError};
use crate::identity::{Client, IdentityError};
use crate::limiter::{Nanos, Verdict};
use crate::metrics::{inc, Decision, Metrics};
use crate::problem::{set_rate_limit_headers, Denial, LimitView, Problem};
use crate::request_id::{RequestId, X_REQUEST_ID};
use crate::router::{normalize, request_host};
use crate::snapshot::{Route, RouteAction, Snapshot};
use crate::store::{AuditRow, Check, Outcome, Store};

/// What the server knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    /// `http` or `https`, for `X-Forwarded-Proto`.
    pub proto: &'static str,
    /// The local port the client connected to, for `X-Forwarded-Port`.
    pub port: u16,
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
    /// Open public connections and their caps.
    pub connections: Arc<crate::connections::Connections>,
    /// What the admin dashboard shows besides the counters: recent rates, limited keys.
    pub activity: crate::dashboard::Activity,
    /// The access log's queue and writer thread.
    pub access: AccessLog,
    /// Upgraded connections (WebSockets) still open; closed at shutdown.
    pub tunnels: crate::tunnel::Tunnels,
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
    /// `count:` units to give back unless the answer counts.
    units: Vec<crate::protect::Unit>,
}

impl App {
    pub fn new(
        config: Config,
        store: Store,
        clock: SharedClock,
        config_path: Option<PathBuf>,
    ) -> App {
        let metrics = Metrics::default();
        store.bind_metrics(&metrics);
        let tls = crate::tls::Terminator::new(config.server.tls.as_ref().map(|t| t.loaded.clone()));
        let snapshot = Snapshot::build(config, 1, None, &metrics);
        let connections = crate::connections::Connections::new(&metrics);
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
                connections,
                activity: Default::default(),
                access: AccessLog::default(),
                tunnels: crate::tunnel::Tunnels::default(),
            }),
        }
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.shared.snapshot.load_full()
    }

    /// Serves one request; every failure becomes a problem+json response,
    /// and every response, whoever made it, one access record.
    pub async fn handle(&self, mut req: Request<Incoming>, conn: ConnInfo) -> Response<Body> {
        let snap = self.snapshot();
        let started = Instant::now();
        let now = self.shared.clock.now();
        let in_flight = self.shared.metrics.in_flight.enter();
        let id = RequestId::for_request(
            req.headers(),
            snap.identity.is_trusted(conn.peer.ip().to_canonical()),
        );
        // The upstream sees the same id the client and the log see.
        req.headers_mut().insert(X_REQUEST_ID, id.header().clone());
        let mut trail = Trail::begin(&snap, &req, conn, now, &id);
        let mut resp = match self.serve(&snap, req, conn, now, started, &mut trail).await {
            Ok(resp) => resp,
            Err(problem) => {
                if matches!(problem, Problem::StoreUnavailable) {
                    trail.record.decision = Decision::StoreError;
                }
                problem.respond(Some(&trail.record.request_id), None)
            }
        };
        resp.headers_mut().insert(X_REQUEST_ID, id.header().clone());
        trail.finish(self, snap, resp, started, in_flight)
    }

    async fn serve(
        &self,
        snap: &Arc<Snapshot>,
        req: Request<Incoming>,
        conn: ConnInfo,
        now: Nanos,
        started: Instant,
        trail: &mut Trail,
    ) -> Result<Response<Body>, Problem> {
        let max_body = snap.config.server.max_request_body;
        crate::framing::check_request(&req)?;
        check_framing(req.headers(), max_body)?;
        let mut req = req;
        // An upgrade (WebSocket) request: the client's side of the tunnel,
        // taken now (an HTTP/2 one is rewritten to the HTTP/1.1 handshake first).
        let client_upgrade = crate::tunnel::client_side(&mut req);
        let client = match snap.identity.resolve(conn.peer, req.headers(), now) {
            Ok(client) => client,
            Err(IdentityError::UnknownApiKey(short)) => {
                trail.record.client = Some(short.clone());
                return Err(Problem::UnknownApiKey(short));
            }
            Err(IdentityError::TooManyUnknownKeys {
                ip_key,
                retry_after,
            }) => {
                trail.record.client = Some(ip_key.clone());
                return Err(Problem::TooManyUnknownKeys {
                    ip_key,
                    retry_after,
                });
            }
        };
        trail.record.client = Some(client.display().to_string());
        trail.record.ip = client.ip;
        let path = normalize(req.uri().path());
        // Building the host string is only worth it when a route asks for one.
        let host = if snap.router.uses_host() {
            request_host(&req)
        } else {
            None
        };
        let index = snap
            .router
            .find(req.method(), host.as_deref(), &path, req.uri().query())
            .ok_or(Problem::NoRoute)?;
        let route = &snap.routes[index];
        trail.route = Some(index);
        trail.record.route = Some(route.name.clone());

        let mut limits = None;
        if client.exempt {
            trail.record.decision = Decision::Exempt;
            tracing::debug!(client = %client.ip, route = %route.name, "exempt client passed without limits");
        } else if !route.limiters.is_empty() {
            let store = &self.shared.store;
            if let Some(ban) =
                crate::protect::banned(store, snap, route, &client, req.headers(), now).await
            {
                inc(&route.metrics.rejected);
                return Err(ban);
            }
            match self.limit(snap, route, &client, req.headers(), now).await {
                Ok(l) => limits = Some(l),
                // `limit` counted it (and answered from the local table for `local`).
                Err(_) if snap.config.store.on_error == OnError::Deny => {
                    inc(&route.metrics.store_error);
                    return Err(Problem::StoreUnavailable);
                }
                Err(_) => {}
            }
        }
        let header_sets = snap.config.routes[index].rate_limit_headers;
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
                set_rate_limit_headers(resp.headers_mut(), &views, l.at, header_sets);
            }
        };

        if let Some(denial) = limits.as_mut().and_then(|l| l.denial.take()) {
            inc(&route.metrics.rejected);
            if let Some(l) = limits.as_mut() {
                let at = self.shared.clock.now();
                let store = &self.shared.store;
                crate::protect::settle(store, snap, &mut l.units, &mut l.views, None, at).await;
            }
            let shape = snap.config.routes[index].reject.as_ref().or_else(|| {
                snap.config
                    .limiters
                    .iter()
                    .find(|l| l.name == denial.limiter)
                    .and_then(|l| l.reject.as_ref())
            });
            trail.rejected(self, snap, &denial, &route.name, now);
            let mut resp = Problem::RateLimited(Box::new(denial))
                .respond(Some(&trail.record.request_id), shape);
            headers_of(&limits, &mut resp);
            return Ok(resp);
        }
        if client.exempt {
            inc(&route.metrics.exempt);
        } else {
            inc(&route.metrics.allowed);
            let shadow_rejected = limits.as_ref().is_some_and(|l| {
                l.views
                    .iter()
                    .any(|(i, o)| snap.limiters[*i].shadow && o.verdict.is_deny())
            });
            trail.record.decision = if shadow_rejected {
                Decision::ShadowRejected
            } else {
                Decision::Allowed
            };
        }

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
                trail.record.upstream = Some(upstream.name.clone());
                // The body is read first, so the upstream's time is its own.
                let metrics = &self.shared.metrics;
                let body = crate::buffering::read_request(metrics, req, &snap.config.server).await;
                let asked = Instant::now();
                let result = match body {
                    Ok(req) => {
                        req.forward(metrics, upstream, &snap.config, *u, &client, conn)
                            .await
                    }
                    Err(e) => Err(e),
                };
                let waited = asked.elapsed();
                snap.upstream_durations[*u].observe(waited);
                trail.record.upstream_ms = Some(waited.as_secs_f64() * 1000.0);
                let resp = match result {
                    Ok((mut resp, connection))
                        if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS
                            && client_upgrade.is_some() =>
                    {
                        // The tunnel holds the concurrency slots and the
                        // server's place for as long as it is open.
                        let slots = limits.as_mut().map(|l| std::mem::take(&mut l.slots));
                        let upstream_side = hyper::upgrade::on(&mut resp);
                        let client_side = client_upgrade.expect("checked above");
                        client_side.answer(&mut resp);
                        self.shared.tunnels.open(
                            client_side,
                            upstream_side,
                            upstream.tunnel_idle_timeout(),
                            (slots, connection),
                        );
                        resp.map(|_| Body::empty())
                    }
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
                    Err(e) if e.is_client_fault() => {
                        tracing::debug!(error = %e, route = %route.name, "the client's request body broke");
                        Problem::from(e).respond(Some(&trail.record.request_id), None)
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
                        Problem::from(e).respond(Some(&trail.record.request_id), None)
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
                        request_id: trail.record.request_id.clone(),
                    });
                }
                resp
            }
        };
        if let Some(l) = limits.as_mut().filter(|l| !l.units.is_empty()) {
            let answer = Some((resp.status(), resp.headers()));
            let at = self.shared.clock.now();
            let store = &self.shared.store;
            crate::protect::settle(store, snap, &mut l.units, &mut l.views, answer, at).await;
        }
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
                    overflow: l.overflow_key(),
                    algorithm: l.algorithm_for(l.value_of(&a.store_key)),
                    shadow: l.shadow,
                }
            })
            .collect();
        let mut shared_store = true;
        let outcomes = match self.shared.store.check(&checks, now).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                let policy = snap.config.store.on_error;
                self.store_failed(route, &e, policy);
                if policy != OnError::Local {
                    return Err(e);
                }
                // Units taken in the local table stay there: a refund
                // would go to the shared store, which never counted them.
                shared_store = false;
                self.shared.store.check_local(&checks, now)
            }
        };
        let at = outcomes.first().map_or(now, |o| o.at);

        let mut denial: Option<Denial> = None;
        let mut delay = 0;
        let mut queued = Release::new(true);
        let mut slots = Release::new(false);
        let mut units = Vec::new();
        let mut refused: Vec<(usize, &str)> = Vec::new();
        let admitted = !outcomes
            .iter()
            .zip(&checks)
            .any(|(o, c)| o.verdict.is_deny() && !c.shadow);
        for ((a, o), c) in applied.iter().zip(&outcomes).zip(&checks) {
            let l = &snap.limiters[a.limiter];
            // What to give back later is where the store counted it.
            let counted_on = if o.overflowed { c.overflow } else { c.key };
            match o.verdict {
                Verdict::Deny { retry_after } if l.shadow => {
                    inc(&l.metrics.would_reject);
                    tracing::info!(limiter = %l.name, key = %client.display(), retry_after_ms = retry_after / 1_000_000, "shadow limiter would reject");
                }
                Verdict::Deny { retry_after } => {
                    inc(&l.metrics.rejected);
                    refused.push((a.limiter, &a.store_key));
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
                        queued.push(self, snap, a.limiter, counted_on, now + wait);
                    }
                }
                Verdict::Allow => inc(&l.metrics.allowed),
            }
            if admitted && matches!(c.algorithm, crate::limiter::Algorithm::Concurrency(_)) {
                slots.push(self, snap, a.limiter, counted_on, now);
            }
            if l.count.is_some() && shared_store && (admitted || c.algorithm.counts_refused()) {
                units.push(crate::protect::Unit {
                    limiter: a.limiter,
                    store_key: a.store_key.clone(),
                    ticket: c.algorithm.ticket(o.at, &o.quota),
                });
            }
        }
        if !refused.is_empty() && shared_store {
            crate::protect::strike(&self.shared.store, snap, &refused, now).await;
        }
        Ok(Limits {
            views: applied.iter().map(|a| a.limiter).zip(outcomes).collect(),
            denial,
            delay,
            queued,
            slots,
            at,
            units,
        })
    }

    /// Counts a failed store call and the `on_error` decision it leads to.
    fn store_failed(&self, _route: &Route, e: &crate::store::StoreError, policy: OnError) {
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

/// The access phase: what the log and the request metrics say about one
/// request, filled in as it goes and emitted once, when the response body
/// has ended (or the client went away).
struct Trail {
    record: AccessRecord,
    /// Index into `Snapshot::routes`, once routed.
    route: Option<usize>,
}

impl Trail {
    fn begin(
        snap: &Snapshot,
        req: &Request<Incoming>,
        conn: ConnInfo,
        now: Nanos,
        id: &RequestId,
    ) -> Trail {
        let h = req.headers();
        Trail {
            record: AccessRecord {
                format: snap.config.log.format,
                time: now,
                request_id: id.as_str().to_string(),
                client: None,
                ip: conn.peer.ip().to_canonical(),
                method: req.method().clone(),
                path: req.uri().path().to_string(),
                version: req.version(),
                route: None,
                status: 0,
                // Until a limiter or an exemption decides otherwise.
                decision: Decision::Error,
                limiter: None,
                retry_after: None,
                upstream: None,
                upstream_ms: None,
                duration_ms: 0.0,
                bytes_out: 0,
                referer: h.get(http::header::REFERER).cloned(),
                user_agent: h.get(http::header::USER_AGENT).cloned(),
            },
            route: None,
        }
    }

    /// A rejection: for the access log, the limiter's episode line and the
    /// dashboard's list of keys limited right now.
    fn rejected(
        &mut self,
        app: &App,
        snap: &Snapshot,
        denial: &Denial,
        route: &Arc<str>,
        now: Nanos,
    ) {
        self.record.decision = Decision::Rejected;
        self.record.limiter = Some(denial.limiter.clone());
        self.record.retry_after = Some(crate::limiter::ceil_secs(denial.retry_after).max(1));
        app.shared
            .activity
            .rejected(&denial.key, &denial.limiter, route, now);
        if let Some(l) = snap.limiters.iter().find(|l| l.name == denial.limiter) {
            l.metrics.episode.rejected(&l.name, &denial.key, now);
        }
    }

    /// Hands the record to the response body, which emits it when it ends.
    fn finish(
        mut self,
        app: &App,
        snap: Arc<Snapshot>,
        resp: Response<Body>,
        started: Instant,
        in_flight: crate::metrics::GaugeGuard,
    ) -> Response<Body> {
        self.record.status = resp.status().as_u16();
        let done = Box::new(Emit {
            shared: app.shared.clone(),
            access: snap.config.log.access,
            snap,
            trail: self,
            started,
            _in_flight: in_flight,
        });
        resp.map(|b| Body::tracked(b, done))
    }
}

/// The end of a request: the body is done, so its duration and size are known.
struct Emit {
    shared: Arc<Shared>,
    snap: Arc<Snapshot>,
    access: bool,
    trail: Trail,
    started: Instant,
    /// The request counts as in flight until its body is done.
    _in_flight: crate::metrics::GaugeGuard,
}

impl crate::body::Done for Emit {
    fn done(self: Box<Self>, bytes_out: u64) {
        let elapsed = self.started.elapsed();
        let mut record = self.trail.record;
        let series = match self.trail.route {
            Some(i) => &self.snap.routes[i].metrics.series,
            None => &self.snap.unrouted,
        };
        series.observe(record.decision, record.status, elapsed);
        if self.access {
            record.duration_ms = elapsed.as_secs_f64() * 1000.0;
            record.bytes_out = bytes_out;
            self.shared.access.send(record);
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
