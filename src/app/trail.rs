//! The log phase: what the access log and the request metrics say about one request, emitted once its body has ended.

use std::sync::Arc;
use std::time::Instant;

use crate::request_body::RequestBody;
use http::{HeaderValue, Request, Response};

use super::{App, ConnInfo, Shared};
use crate::access::AccessRecord;
use crate::body::Body;
use crate::config::RejectShape;
use crate::limiter::Nanos;
use crate::metrics::Decision;
use crate::problem::{Answering, Denial, LimitHeaders, Problem};
use crate::request_id::RequestId;
use crate::snapshot::{RouteMetrics, Snapshot};

/// The access phase: what the log and the request metrics say about one
/// request, filled in as it goes and emitted once, when the response body
/// has ended (or the client went away).
pub(super) struct Trail {
    pub(super) record: AccessRecord,
    /// Index into `Snapshot::routes`, once routed.
    pub(super) route: Option<usize>,
    /// The client's `Accept`, read only if tollgate answers an error itself.
    accept: Option<HeaderValue>,
    /// The config the request runs on: its `error_format` and `error_pages`.
    snap: Arc<Snapshot>,
    /// A limiter's refusal will be answered with a challenge page
    /// (`app/challenge.rs`): it is decided `challenged`, not `rejected`.
    pub(super) challenge_refusal: bool,
}

/// The request headers the trail keeps, each the first of its name, read
/// in one pass over the request's headers: three hashed lookups cost more
/// than comparing a request's few names, which are standard headers
/// compared by their tag.
struct Told {
    referer: Option<HeaderValue>,
    user_agent: Option<HeaderValue>,
    accept: Option<HeaderValue>,
}

impl Told {
    fn of(headers: &http::HeaderMap) -> Told {
        use http::header::{ACCEPT, REFERER, USER_AGENT};
        let mut told = Told {
            referer: None,
            user_agent: None,
            accept: None,
        };
        for (name, value) in headers {
            let slot = if name == REFERER {
                &mut told.referer
            } else if name == USER_AGENT {
                &mut told.user_agent
            } else if name == ACCEPT {
                &mut told.accept
            } else {
                continue;
            };
            if slot.is_none() {
                *slot = Some(value.clone());
            }
        }
        told
    }
}

impl Trail {
    pub(super) fn begin(
        snap: &Arc<Snapshot>,
        req: &Request<RequestBody>,
        conn: ConnInfo,
        now: Nanos,
        id: &RequestId,
    ) -> Trail {
        let told = Told::of(req.headers());
        let config = &snap.config;
        Trail {
            record: AccessRecord {
                format: config.log.format,
                time: now,
                request_id: id.clone(),
                client: None,
                ip: conn.peer.ip().to_canonical(),
                method: req.method().clone(),
                path: config.keeps_request_path().then(|| req.uri().path().into()),
                version: req.version(),
                route: None,
                status: 0,
                // Until a limiter or an exemption decides otherwise.
                decision: Decision::Error,
                limiter: None,
                retry_after: None,
                upstream: None,
                upstream_ms: None,
                error_origin: None,
                duration_ms: 0.0,
                bytes_out: 0,
                referer: told.referer,
                user_agent: told.user_agent,
                rule: None,
                network: None,
                refusals: config.log.refusals,
            },
            route: None,
            accept: told.accept,
            snap: snap.clone(),
            challenge_refusal: false,
        }
    }

    /// How the request was decided: the one place that sets the access
    /// record's `decision` (which the duration histogram reads when the
    /// request ends) and counts `tollgate_requests_total` with it.
    pub(super) fn decide(&mut self, metrics: &RouteMetrics, decision: Decision) {
        let decision = match decision {
            Decision::Rejected if self.challenge_refusal => Decision::Challenged,
            d => d,
        };
        self.record.decision = decision;
        metrics.count(decision);
    }

    /// A problem answered locally: the record learns where it came from.
    pub(super) fn answer(&mut self, problem: Problem) -> Response<Body> {
        self.answer_with(problem, None, None)
    }

    /// [`answer`](Self::answer) with a refusal's `reject` page and
    /// rate-limit headers; for a ban, the record learns which limiter
    /// banned and until when.
    pub(super) fn answer_with(
        &mut self,
        problem: Problem,
        shape: Option<&RejectShape>,
        limits: Option<LimitHeaders<'_>>,
    ) -> Response<Body> {
        self.record.error_origin = Some(problem.origin());
        if let Problem::Banned(ban) = &problem {
            self.record.limiter = Some(ban.limiter.clone());
            self.record.retry_after = Some(crate::limiter::ceil_secs(ban.retry_after).max(1));
        }
        let config = &self.snap.config;
        let route = self.route.map(|i| &config.routes[i].errors);
        let negotiation =
            crate::page::negotiate(self.accept.as_ref(), &config.server.errors, route);
        problem.respond(&Answering {
            request_id: Some(self.record.request_id.as_str()),
            shape,
            limits,
            negotiation,
        })
    }

    /// A rejection: for the access log, the limiter's episode line and the
    /// dashboard's list of keys limited right now.
    pub(super) fn rejected(
        &mut self,
        app: &App,
        snap: &Snapshot,
        denial: &Denial,
        route: &Arc<str>,
        now: Nanos,
    ) {
        self.record.limiter = Some(denial.limiter.clone());
        self.record.retry_after = Some(crate::limiter::ceil_secs(denial.retry_after).max(1));
        app.shared
            .activity
            .rejected(&denial.key, &denial.limiter, route, now);
        let l = &snap.limiters[denial.index];
        l.metrics.episode.rejected(&l.name, &denial.key, now);
    }

    /// Hands the record to the response body, which emits it when it ends.
    pub(super) fn finish(
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
