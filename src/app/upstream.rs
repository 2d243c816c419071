//! The app's upstream phase: the body read, a place in the connection's share, the forward call, and a failure's answer.

use std::time::Instant;

use http::Response;

use super::{Admitted, App, Exchange};
use crate::balance::Balancer;
use crate::body::Body;
use crate::decide::Clearance;
use crate::forward_error::ForwardError;
use crate::identity::Client;
use crate::metrics::inc;
use crate::problem::{Problem, Unanswered};
use crate::proxy::{Outbound, Sent};
use crate::store::AuditRow;
use crate::tunnel::ClientSide;

impl App {
    /// Forwards to upstream `u` and answers with its response; a failure
    /// becomes a problem tagged with where it came from.
    pub(super) async fn upstream(
        &self,
        x: &mut Exchange,
        index: usize,
        u: usize,
        client: &Client,
        admitted: &mut Admitted,
        pass: &mut Clearance,
    ) -> Response<Body> {
        let snap = x.snap.clone();
        let req = &mut admitted.req;
        if !snap.config.server.underscores_in_headers {
            crate::proxy::drop_underscore_names(req.headers_mut(), &self.shared.metrics);
        }
        let fastcgi = snap.config.upstreams[u].fastcgi.is_some();
        if fastcgi && !crate::compression::enabled(&snap.config, Some(index)) {
            // No precompressed sibling either: the FastCGI static handler
            // reads this. Only there: the first extension allocates the
            // request's map, two allocations an HTTP upstream never reads.
            req.extensions_mut().insert(crate::compression::Off);
        }
        if let Err(problem) = self.prepare_upstream(x, index, fastcgi, req) {
            return x.trail.answer(problem);
        }
        let route = &snap.routes[index];
        let upstream = &snap.upstreams[u];
        let audit = snap.config.audit.enabled.then(|| req.method().clone());
        x.trail.record.upstream = Some(upstream.name.clone());
        // The body is read first, so the upstream's time is its own.
        let metrics = &self.shared.metrics;
        let body = crate::buffering::read_request(metrics, req, &snap.config.server).await;
        let asked = Instant::now();
        let result = match body {
            Ok(()) => {
                let max_body = snap.config.server.max_request_body;
                let req = admitted.take_request();
                let outbound = Outbound::new(req, client, &x.conn, max_body);
                self.forward(x, outbound, u).await
            }
            Err(e) => Err(e),
        };
        let waited = asked.elapsed();
        snap.upstream_durations[u].observe(waited);
        x.trail.record.upstream_ms = Some(waited.as_secs_f64() * 1000.0);
        let upgrade = admitted.upgrade.take();
        let resp = self.forwarded(x, result, upgrade, pass, &route.name, upstream);
        if let Some(method) = audit {
            self.audit(x, method, client, &route.name, resp.status());
        }
        resp
    }

    /// The forward's answer: a 101 opens the tunnel, tollgate's own answer
    /// from a part is written again, an upstream's response streams on
    /// holding its slots and connection, and a failure is a problem.
    fn forwarded(
        &self,
        x: &mut Exchange,
        result: Result<Sent, ForwardError>,
        upgrade: Option<ClientSide>,
        pass: &mut Clearance,
        route: &str,
        upstream: &Balancer,
    ) -> Response<Body> {
        match result {
            Ok((mut resp, connection))
                if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS && upgrade.is_some() =>
            {
                // The tunnel holds the concurrency slots and the
                // server's place for as long as it is open.
                let slots = pass.take_slots();
                let upstream_side = hyper::upgrade::on(&mut resp);
                let client_side = upgrade.expect("checked above");
                client_side.answer(&mut resp);
                x.upstream_answered = true;
                self.shared.tunnels.open(
                    client_side,
                    upstream_side,
                    upstream.tunnel_idle_timeout(),
                    (slots, connection),
                );
                resp.map(|_| Body::empty())
            }
            Ok((mut resp, connection)) => match resp.extensions_mut().remove::<Unanswered>() {
                // tollgate's own answer from a part that did not see the
                // request whole (a FastCGI 404): written again for it, with
                // its id, its `Accept` and the route's pages.
                Some(Unanswered(problem)) => x.trail.answer(problem),
                None => {
                    x.upstream_answered = true;
                    // Both live exactly as long as the body: the slot is
                    // freed and the connection recycled when it is done.
                    let slots = Some(pass.take_slots()).filter(|s| !s.is_empty());
                    let slots = slots.map(|s| Box::new(s) as crate::body::Guard);
                    resp.map(|b| Body::upstream(b, crate::body::join(slots, connection)))
                }
            },
            Err(e) => self.forward_failed(x, route, &upstream.name, e),
        }
    }

    /// Queues the forwarded request's audit row, from the access record:
    /// its client (identity set it) and path are shared, not copied; the
    /// id, a header value there, is written out as the row's text.
    fn audit(
        &self,
        x: &Exchange,
        method: http::Method,
        client: &Client,
        route: &std::sync::Arc<str>,
        status: http::StatusCode,
    ) {
        let record = &x.trail.record;
        self.shared.store.audit(AuditRow {
            time: x.now,
            client: (record.client.clone()).unwrap_or_else(|| client.shown()),
            method,
            path: record.path.clone().unwrap_or_default(),
            route: route.clone(),
            status: status.as_u16(),
            duration: x.started.elapsed(),
            request_id: record.request_id.as_str().into(),
        });
    }

    /// A failed forward's answer: the client's own broken body quietly,
    /// anything else logged and counted by its kind.
    fn forward_failed(
        &self,
        x: &mut Exchange,
        route: &str,
        upstream: &str,
        e: ForwardError,
    ) -> Response<Body> {
        if e.is_client_fault() {
            tracing::debug!(error = %e, route, "the client's request body broke");
        } else {
            tracing::warn!(error = %e, route, "forwarding failed");
            let labels = [("upstream", upstream), ("kind", e.kind.label())];
            inc(&self
                .shared
                .metrics
                .counter("tollgate_upstream_errors_total", &labels));
        }
        x.trail.answer(Problem::from(e))
    }

    /// Takes a place in the connection's share (waiting at most the
    /// upstream's `timeout`), then forwards to upstream `u`; the place is
    /// held until the response body is done. A tunnel takes none: it is not
    /// an exchange, and would hold its place for hours.
    async fn forward(
        &self,
        x: &Exchange,
        outbound: Box<Outbound>,
        u: usize,
    ) -> Result<Sent, ForwardError> {
        let snap = &x.snap;
        let upstream = &snap.upstreams[u];
        let place = match x.share.as_ref().filter(|_| !outbound.is_upgrade()) {
            Some(share) => {
                let timeout = snap.config.upstreams[u].timeout;
                let place = share.take(&self.shared.metrics, timeout, &upstream.name);
                Some(Box::new(place.await?) as crate::body::Guard)
            }
            None => None,
        };
        let (resp, connection) = upstream.forward(outbound).await?;
        Ok((resp, crate::body::join(connection, place)))
    }
}
