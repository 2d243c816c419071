//! The request lifecycle as named phases: admit → identify → route → limit → dispatch (respond | upstream | FastCGI | tunnel) → settle → log.
//!
//! `App` is a cheap handle that the server clones into every connection. A
//! request loads the current [`Snapshot`] once and finishes on it, whatever
//! a reload does meanwhile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::request_body::RequestBody;
use arc_swap::ArcSwap;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Request, Response};
use parking_lot::Mutex;

use crate::access::AccessLog;
use crate::body::Body;
use crate::buffering::Share;
use crate::clock::SharedClock;
use crate::config::{ChallengeWhen, Config, OnError};
use crate::identity::{Client, IdentityError};
use crate::limiter::{Nanos, Verdict};
use crate::metrics::{inc, Decision, Metrics};
use crate::problem::{Denial, Problem};
use crate::request_id::{RequestId, X_REQUEST_ID};
use crate::router::{request_host, request_path};
use crate::snapshot::{Route, RouteAction, Snapshot};
use crate::store::{Check, Outcome, Store};
use crate::tunnel::ClientSide;

pub use crate::connections::ConnInfo;
use refuse::rate_limit_headers;
pub use release::Release;
use trail::Trail;

mod challenge;
mod refuse;
mod release;
mod trail;
mod upstream;

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
    /// Open public connections and their caps.
    pub connections: Arc<crate::connections::Connections>,
    /// What the admin dashboard shows besides the counters: recent rates, limited keys.
    pub activity: crate::activity::Activity,
    /// The access log's queue and writer thread.
    pub access: AccessLog,
    /// Upgraded connections (WebSockets) still open; closed at shutdown.
    pub tunnels: crate::tunnel::Tunnels,
}

/// The file a config was read from and the text it held then: reloads read
/// the file again, and the watch compares what it finds against the text.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub text: String,
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
        source: Option<ConfigSource>,
    ) -> App {
        let metrics = Metrics::default();
        store.bind_metrics(&metrics);
        let snapshot = Snapshot::build(config, 1, None, &metrics);
        let connections = crate::connections::Connections::new(&metrics);
        let (config_path, config_text) = match source {
            Some(s) => (Some(s.path), Some(s.text)),
            None => (None, None),
        };
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
    ///
    /// The phases, top to bottom: [`admit`](Self::admit) (framing checks) →
    /// [`identify`](Self::identify) → [`route`](Self::route) →
    /// [`limit`](Self::limit) → [`dispatch`](Self::dispatch) (respond |
    /// upstream | FastCGI | tunnel) → [`settle`](Self::settle) → log (the
    /// access record, when the body ends). Any phase may end the request
    /// with a [`Problem`]; its [`Origin`](crate::problem::Origin) goes into the record.
    pub async fn handle(
        &self,
        req: Request<impl Into<RequestBody>>,
        conn: ConnInfo,
    ) -> Response<Body> {
        self.handle_on(req, conn, None).await
    }

    /// As [`handle`](Self::handle), for a request on a client connection
    /// whose `share` of upstream exchanges it takes a place in.
    pub async fn handle_on(
        &self,
        req: Request<impl Into<RequestBody>>,
        conn: ConnInfo,
        share: Option<Share>,
    ) -> Response<Body> {
        let mut req = req.map(Into::into);
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
        let trail = Trail::begin(&snap, &req, conn, now, &id);
        let mut x = Exchange {
            snap,
            conn,
            share,
            now,
            started,
            trail,
        };
        let mut resp = match self.serve(&mut x, req).await {
            Ok(resp) => resp,
            Err(problem) => x.trail.answer(problem),
        };
        resp.headers_mut().insert(X_REQUEST_ID, id.header().clone());
        x.trail.finish(self, x.snap, resp, started, in_flight)
    }

    /// The phases between the request head and the answer.
    async fn serve(
        &self,
        x: &mut Exchange,
        req: Request<RequestBody>,
    ) -> Result<Response<Body>, Problem> {
        let admitted = self.admit(x, req)?;
        let mut client = self.identify(x, &admitted.req)?;
        // Challenge: the pass a request carries; the pass path answers itself.
        let admitted = match self.pass_gate(x, &mut client, admitted).await {
            Ok(admitted) => admitted,
            Err(resp) => return Ok(resp),
        };
        let route = self.route(x, &admitted.req)?;
        // Challenge: a browser without a pass proves itself, now (`always`)
        // or instead of a limiter's refusal (`over_limit`).
        let due = self.challenge_due(x, route, &client, &admitted.req).await;
        if due == Some(ChallengeWhen::Always) {
            return Ok(self.challenge(x, route, &client, &admitted.req, None));
        }
        let headers = admitted.req.headers();
        let mut limits = match self.limit(x, route, &client, headers).await? {
            Admission::Admitted(limits) => limits,
            Admission::Refused(resp) if x.trail.record.decision == Decision::Challenged => {
                return Ok(self.challenge(x, route, &client, &admitted.req, Some(resp)));
            }
            Admission::Refused(resp) => return Ok(resp),
        };
        let resp = self
            .dispatch(x, route, &client, admitted, &mut limits)
            .await;
        Ok(self.settle(x, route, limits, resp).await)
    }

    /// Admit: framing a proxy must refuse before anything is counted, and a
    /// declared body over the limit. An upgrade (WebSocket) request gives
    /// its client side of the tunnel here (an HTTP/2 one is rewritten to the
    /// HTTP/1.1 handshake first).
    fn admit(&self, x: &Exchange, mut req: Request<RequestBody>) -> Result<Admitted, Problem> {
        crate::framing::check_request(&req)?;
        check_framing(req.headers(), x.snap.config.server.max_request_body)?;
        let upgrade = crate::tunnel::client_side(&mut req);
        Ok(Admitted { req, upgrade })
    }

    /// Identify: who the client is (a verified API key, or the real IP
    /// behind trusted proxies).
    fn identify(&self, x: &mut Exchange, req: &Request<RequestBody>) -> Result<Client, Problem> {
        match x.snap.identity.resolve(x.conn.peer, req.headers(), x.now) {
            Ok(client) => {
                x.trail.record.client = Some(client.display().to_string());
                x.trail.record.ip = client.ip;
                Ok(client)
            }
            Err(IdentityError::UnknownApiKey(short)) => {
                x.trail.record.client = Some(short.clone());
                Err(Problem::UnknownApiKey(short))
            }
            Err(IdentityError::TooManyUnknownKeys {
                ip_key,
                retry_after,
            }) => {
                x.trail.record.client = Some(ip_key.clone());
                Err(Problem::TooManyUnknownKeys {
                    ip_key,
                    retry_after,
                })
            }
        }
    }

    /// Route: which route, on the normalized path (a separator the router
    /// would not see is a 400, or decoded); its index in the snapshot.
    fn route(&self, x: &mut Exchange, req: &Request<RequestBody>) -> Result<usize, Problem> {
        let snap = &x.snap;
        let path = request_path(req.uri().path(), snap.config.server.encoded_separators)
            .map_err(|e| Problem::BadRequest(e.to_string()))?;
        // Building the host string is only worth it when a route asks for one.
        let host = if snap.router.uses_host() {
            request_host(req)
        } else {
            None
        };
        let index = snap
            .router
            .find(req.method(), host.as_deref(), &path, req.uri().query())
            .ok_or(Problem::NoRoute)?;
        x.trail.route = Some(index);
        x.trail.record.route = Some(snap.routes[index].name.clone());
        Ok(index)
    }

    /// Limit: an exempt client passes; a banned key is refused; then every
    /// limiter of the route is checked in one store call. A denial is
    /// answered here (429 and its headers); a shaping delay is waited out.
    async fn limit(
        &self,
        x: &mut Exchange,
        index: usize,
        client: &Client,
        headers: &HeaderMap,
    ) -> Result<Admission, Problem> {
        let snap = x.snap.clone();
        let route = &snap.routes[index];
        let mut limits = None;
        if client.exempt {
            x.trail.decide(&route.metrics, Decision::Exempt);
            tracing::debug!(client = %client.ip, route = %route.name, "exempt client passed without limits");
        } else if !route.limiters.is_empty() {
            let store = &self.shared.store;
            if let Some(ban) =
                crate::protect::banned(store, &snap, route, client, headers, x.now).await
            {
                x.trail.decide(&route.metrics, Decision::Banned);
                let shape = snap.reject_shape(index, ban.index);
                // No limiter was asked: a ban's refusal has no rate-limit headers.
                let resp = x
                    .trail
                    .answer_with(Problem::Banned(Box::new(ban)), shape, None);
                return Ok(Admission::Refused(resp));
            }
            match self
                .check_limiters(&snap, route, client, headers, x.now)
                .await
            {
                Ok(l) => limits = Some(l),
                // `check_limiters` counted it (and answered from the local table for `local`).
                Err(_) if snap.config.store.on_error == OnError::Deny => {
                    x.trail.decide(&route.metrics, Decision::StoreError);
                    return Err(Problem::StoreUnavailable);
                }
                Err(_) => {}
            }
        }

        if let Some(l) = limits.as_mut() {
            if let Some(denial) = l.denial.take() {
                return Ok(Admission::Refused(self.refuse(x, index, l, denial).await));
            }
        }
        if !client.exempt {
            let shadow_rejected = limits.as_ref().is_some_and(|l| {
                l.views
                    .iter()
                    .any(|(i, o)| snap.limiters[*i].shadow && o.verdict.is_deny())
            });
            let decision = if shadow_rejected {
                Decision::ShadowRejected
            } else {
                Decision::Allowed
            };
            x.trail.decide(&route.metrics, decision);
        }

        if let Some(l) = limits.as_mut() {
            if l.delay > 0 {
                // Dropping this future (the client went away) drops `l.queued`,
                // which gives the place in the queue back.
                // From the instant `now` was read, so the time spent checking
                // does not shift the release: releases stay exactly spaced.
                tokio::time::sleep_until((x.started + Duration::from_nanos(l.delay)).into()).await;
                l.queued.disarm();
            }
        }
        Ok(Admission::Admitted(limits))
    }

    /// Dispatch: the route's own answer, or the upstream's (HTTP, FastCGI,
    /// or a tunnel when it switches protocols).
    async fn dispatch(
        &self,
        x: &mut Exchange,
        index: usize,
        client: &Client,
        admitted: Admitted,
        limits: &mut Option<Limits>,
    ) -> Response<Body> {
        let snap = x.snap.clone();
        match &snap.routes[index].action {
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
            RouteAction::Upstream(u) => self.upstream(x, index, *u, client, admitted, limits).await,
        }
    }

    /// Settle: `count:` units are given back unless the answer counts, and
    /// the answer gets the rate-limit headers.
    async fn settle(
        &self,
        x: &Exchange,
        index: usize,
        mut limits: Option<Limits>,
        mut resp: Response<Body>,
    ) -> Response<Body> {
        let snap = &x.snap;
        if let Some(l) = limits.as_mut().filter(|l| !l.units.is_empty()) {
            let answer = Some((resp.status(), resp.headers()));
            let at = self.shared.clock.now();
            let store = &self.shared.store;
            crate::protect::settle(store, snap, &mut l.units, &mut l.views, answer, at).await;
        }
        rate_limit_headers(snap, index, &limits, &mut resp);
        resp
    }

    /// Checks every limiter of the route for this client in one store call.
    async fn check_limiters(
        &self,
        snap: &Arc<Snapshot>,
        route: &Route,
        client: &Client,
        headers: &HeaderMap,
        now: Nanos,
    ) -> Result<Limits, crate::store::StoreError> {
        let applied = applied_limiters(snap, route, client, headers);
        let checks: Vec<Check<'_>> = applied.iter().map(|a| a.check(snap)).collect();
        let (outcomes, shared_store) = self.count(snap, route, &checks, now).await?;
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
                    record_denial(&mut denial, a.limiter, l, o, c, retry_after, client);
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

    /// The store's outcomes for `checks`, and whether the shared store
    /// counted them (`false`: it failed and `on_error: local` counted them here).
    async fn count(
        &self,
        snap: &Snapshot,
        route: &Route,
        checks: &[Check<'_>],
        now: Nanos,
    ) -> Result<(Vec<Outcome>, bool), crate::store::StoreError> {
        match self.shared.store.check(checks, now).await {
            Ok(outcomes) => Ok((outcomes, true)),
            Err(e) => {
                let policy = snap.config.store.on_error;
                self.store_failed(route, &e, policy);
                if policy != OnError::Local {
                    return Err(e);
                }
                // Units taken in the local table stay there: a refund
                // would go to the shared store, which never counted them.
                Ok((self.shared.store.check_local(checks, now), false))
            }
        }
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

/// One request on its way through the phases: what each phase reads, and
/// the record the log gets.
struct Exchange {
    /// Loaded once; the request finishes on it whatever a reload does.
    snap: Arc<Snapshot>,
    conn: ConnInfo,
    /// The client connection's share of upstream exchanges (`None`: not capped).
    share: Option<Share>,
    /// The clock when the head was read: the limiters and the log count from it.
    now: Nanos,
    started: Instant,
    trail: Trail,
}

/// A request past the framing checks, with the client's side of an upgrade.
struct Admitted {
    req: Request<RequestBody>,
    upgrade: Option<ClientSide>,
}

/// What the limit phase decided.
enum Admission {
    /// On to dispatch, with what the limiters took (`None`: no limiter
    /// applied, the client is exempt, or the store failed open).
    Admitted(Option<Limits>),
    /// Answered already: the rejection, with its headers.
    Refused(Response<Body>),
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

/// One limiter of the route that applies to this request, and the store key it counts on.
struct Applied {
    limiter: usize,
    store_key: String,
}

impl Applied {
    fn check<'a>(&'a self, snap: &'a Snapshot) -> Check<'a> {
        let l = &snap.limiters[self.limiter];
        Check {
            key: &self.store_key,
            overflow: l.overflow_key(),
            algorithm: l.algorithm_for(l.value_of(&self.store_key)),
            shadow: l.shadow,
        }
    }
}

/// The route's limiters that have a key for this request (a limiter keyed
/// on a header the request lacks does not apply).
fn applied_limiters(
    snap: &Snapshot,
    route: &Route,
    client: &Client,
    headers: &HeaderMap,
) -> Vec<Applied> {
    route
        .limiters
        .iter()
        .filter_map(|&i| {
            let store_key = snap.limiters[i].request_key(client, &route.name, headers)?;
            Some(Applied {
                limiter: i,
                store_key,
            })
        })
        .collect()
}

/// Adds one enforcing limiter's rejection to the denial: every rejecting
/// limiter is listed, and the one with the longest wait is the one shown.
fn record_denial(
    denial: &mut Option<Denial>,
    index: usize,
    l: &crate::snapshot::Limiter,
    o: &Outcome,
    c: &Check<'_>,
    retry_after: Nanos,
    client: &Client,
) {
    let d = denial.get_or_insert_with(|| Denial {
        index,
        limiter: l.name.clone(),
        quota: o.quota,
        policy: l.describe(c.algorithm),
        retry_after,
        violated: Vec::new(),
        key: client.display().to_string(),
    });
    if retry_after > d.retry_after {
        d.index = index;
        d.limiter = l.name.clone();
        d.quota = o.quota;
        d.policy = l.describe(c.algorithm);
        d.retry_after = retry_after;
    }
    d.violated.push(l.name.clone());
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
