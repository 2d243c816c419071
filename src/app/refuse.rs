//! The answer to a refusal by a route's limiters, and the rate-limit headers every limited answer carries.

use http::Response;

use super::{App, Exchange, Limits};
use crate::body::Body;
use crate::metrics::Decision;
use crate::problem::{Denial, LimitHeaders, LimitView, Problem};
use crate::snapshot::Snapshot;

impl App {
    /// A refusal by the route's limiters: `count:` units go back (nothing
    /// reached the application), the log and the dashboard learn of it, and
    /// the answer carries the rate-limit headers.
    pub(super) async fn refuse(
        &self,
        x: &mut Exchange,
        index: usize,
        l: &mut Limits,
        denial: Denial,
    ) -> Response<Body> {
        let snap = x.snap.clone();
        let route = &snap.routes[index];
        x.trail.decide(&route.metrics, Decision::Rejected);
        let at = self.shared.clock.now();
        let store = &self.shared.store;
        crate::protect::settle(store, &snap, &mut l.units, &mut l.views, None, at).await;
        let shape = snap.reject_shape(index, denial.index);
        x.trail.rejected(self, &snap, &denial, &route.name, x.now);
        let views = limit_views(&snap, l);
        let headers = limit_headers(&snap, index, l, &views);
        x.trail
            .answer_with(Problem::RateLimited(Box::new(denial)), shape, Some(headers))
    }
}

/// The rate-limit headers route `index` sends on an answer that is not a
/// refusal (a refusal's are written with its body, see `Trail::answer_with`).
pub(super) fn rate_limit_headers(
    snap: &Snapshot,
    index: usize,
    limits: &Option<Limits>,
    resp: &mut Response<Body>,
) {
    if let Some(l) = limits {
        let views = limit_views(snap, l);
        limit_headers(snap, index, l, &views).write(resp.headers_mut());
    }
}

/// Each limiter's name and quota after this request.
fn limit_views<'a>(snap: &'a Snapshot, l: &Limits) -> Vec<LimitView<'a>> {
    l.views
        .iter()
        .map(|(i, o)| LimitView {
            name: &snap.limiters[*i].name,
            quota: o.quota,
        })
        .collect()
}

/// What route `index`'s rate-limit headers are written from.
fn limit_headers<'a>(
    snap: &'a Snapshot,
    index: usize,
    l: &Limits,
    views: &'a [LimitView<'a>],
) -> LimitHeaders<'a> {
    LimitHeaders {
        views,
        at: l.at,
        sets: snap.config.routes[index].rate_limit_headers,
        cache: &snap.routes[index].policy,
    }
}
