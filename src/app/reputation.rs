//! The reputation phase: a CrowdSec decision on the client's address (`identity.crowdsec`), enforced before the limiters — a ban refused through the one writer of refusals, a captcha answered with tollgate's own challenge page.
//!
//! Who is spared: an exempt client (`identity.exempt`), and for a captcha
//! a browser that already holds a valid pass (it solved the page). A
//! captcha asked of a client that cannot solve the page (not a browser's
//! GET or HEAD, or no `identity.pass` to sign one) is refused like a ban:
//! CrowdSec's own bouncers fall back the same way.

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use super::{App, Exchange};
use crate::body::Body;
use crate::challenge::{page, prefers_html, safe_return};
use crate::crowdsec::{Held, Remedy};
use crate::identity::Client;
use crate::metrics::Decision;
use crate::problem::{BanDenial, BanSource, Problem};
use crate::request_body::RequestBody;
use crate::router::request_host;

/// The limiter name a CrowdSec refusal carries (access log, problem body).
pub const CROWDSEC: &str = "crowdsec";

impl App {
    /// The answer to a CrowdSec decision on this client, if one applies
    /// (`pass_bits`: the difficulty the request's pass was solved at).
    pub(super) fn reputation(
        &self,
        x: &mut Exchange,
        route: usize,
        client: &Client,
        pass_bits: u8,
        req: &Request<RequestBody>,
    ) -> Option<Response<Body>> {
        let crowdsec = x.snap.crowdsec.clone()?;
        if client.exempt {
            return None;
        }
        let held = crowdsec.check(client.ip, x.now)?;
        // A pass of the no-JavaScript tier (difficulty 0) proves no work:
        // it does not answer a captcha.
        if held.remedy == Remedy::Captcha && client.pass.is_some() && pass_bits > 0 {
            return None;
        }
        crowdsec.applied(held.remedy);
        let snap = x.snap.clone();
        x.trail
            .decide(&snap.routes[route].metrics, Decision::CrowdSec);
        let page_method = req.method() == Method::GET || req.method() == Method::HEAD;
        if held.remedy == Remedy::Captcha && page_method && prefers_html(req.headers()) {
            if let Some(resp) = self.crowdsec_page(x, route, client, req) {
                return Some(resp);
            }
        }
        Some(self.crowdsec_refusal(x, client, held))
    }

    /// Refused as a ban is: 403, `Retry-After` the decision's end.
    fn crowdsec_refusal(&self, x: &mut Exchange, client: &Client, held: Held) -> Response<Body> {
        let ban = BanDenial {
            index: 0,
            limiter: CROWDSEC.into(),
            key: format!("ip:{}", client.ip),
            until: held.until,
            retry_after: held.until.saturating_sub(x.now),
            status: StatusCode::FORBIDDEN,
            source: BanSource::CrowdSec,
        };
        x.trail
            .answer_with(Problem::Banned(Box::new(ban)), None, None)
    }

    /// The proof-of-work page for a captcha decision, at the route's
    /// difficulty (or the default); `None` without `identity.pass`.
    fn crowdsec_page(
        &self,
        x: &mut Exchange,
        route: usize,
        client: &Client,
        req: &Request<RequestBody>,
    ) -> Option<Response<Body>> {
        let snap = x.snap.clone();
        let gate = snap.challenge_gate.as_ref()?;
        let difficulty = snap.config.routes[route]
            .challenge
            .map_or(crate::config::challenge::DEFAULT_DIFFICULTY, |c| {
                c.work_difficulty()
            });
        let host = request_host(req).unwrap_or_default();
        let token = gate.issue(&host, client.ip, difficulty, x.now);
        let back = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let nonce = gate.page_nonce();
        let html = page::render(&token, difficulty, safe_return(back), &nonce);
        x.trail.record.limiter = Some(CROWDSEC.into());
        let mut resp = Response::new(Body::full(Bytes::from(html)));
        *resp.status_mut() = StatusCode::FORBIDDEN;
        page::headers(resp.headers_mut(), &nonce);
        Some(resp)
    }
}
