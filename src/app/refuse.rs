//! The answer to a refusal the decision returned: a ban's or the route's limiters', through the one writer of refusals.

use http::Response;

use super::{App, Exchange};
use crate::body::Body;
use crate::decide::{Reason, Refusal};
use crate::problem::Problem;

impl App {
    /// A refused request's answer (its strikes and refunds are done): the
    /// route's or limiter's `reject` shape; for a limiters' refusal, the log
    /// and the dashboard learn of it and the answer carries the rate-limit
    /// headers (a ban asked no limiter, so it has none).
    pub(super) fn refuse(&self, x: &mut Exchange, refusal: Refusal) -> Response<Body> {
        let Exchange {
            snap, trail, now, ..
        } = x;
        let shape = snap.reject_shape(refusal.route, refusal.limiter);
        let views = refusal.views(snap);
        let headers = refusal.limit_headers(snap, &views);
        let problem = match refusal.reason {
            Reason::Banned(ban) => Problem::Banned(ban),
            Reason::Limited { denial, .. } => {
                let route = &snap.routes[refusal.route].name;
                trail.rejected(self, snap, &denial, route, *now);
                Problem::RateLimited(denial)
            }
        };
        trail.answer_with(problem, shape, headers)
    }
}
