//! The challenge phase: the pass a request carries becomes its identity, the pass and refresh paths turn a solution into a cookie, and a browser without a pass gets the route's challenge page (`always`, or instead of a limiter's refusal).
//!
//! The pass cookie is tollgate's: it is taken out of the request before
//! anything is forwarded. Issuing a pass with an identity of its own is
//! limited per address block (`identity.pass.issue_limit`, counted in the
//! limiter store); a pass solved at a lower difficulty than a route's is no
//! pass on that route.
//!
//! Who is challenged: a `GET` or `HEAD` from a client whose `Accept`
//! prefers `text/html`, on a route with `challenge:`, that has no valid
//! pass, no verified API key and is not exempt, asking for no public file
//! (robots.txt, `/.well-known/`, favicon.ico, a feed: `challenge::public`).
//! The page is the route's tier: a proof of work, or a meta refresh whose
//! URL sets the pass (`challenge::refresh`). Such a browser sending
//! another method (a form's POST) on an `always` route gets `403` with a
//! page asking to reload: its body could not follow the check's redirect.
//! A user-agent that names a crawler its reverse DNS refutes is challenged
//! or refused whatever it accepts, as the route's `unverified_crawlers`
//! says. Everyone else (curl, API clients, feeds) keeps the usual answers,
//! a refusal included.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, LOCATION, SET_COOKIE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::{Admitted, App, Exchange};
use crate::body::Body;
use crate::challenge::crawler::Crawler;
use crate::challenge::{
    is_public, page, prefers_html, refresh, safe_return, strip_pass_cookies, ChallengeGate,
    Solution, Solved, TokenFault, FORM_LIMIT, PASS_PATH, REFRESH_PATH,
};
use crate::config::{ChallengeMode, ChallengeWhen, UnverifiedCrawlers};
use crate::identity::Client;
use crate::metrics::Decision;
use crate::problem::Problem;
use crate::request_body::RequestBody;
use crate::router::request_host;

/// What the challenge phase decided before the limiters.
#[derive(Debug)]
pub(super) enum Due {
    /// The proof-of-work page, now.
    Page,
    /// Refused now with this problem (`403`).
    Refused(Problem),
    /// The page instead of a limiter's refusal, if one comes (`over_limit`).
    OverLimit,
}

impl Due {
    /// The page for GET and HEAD; any other method is refused with a page
    /// that says to reload, because a form's body cannot follow the
    /// redirect that ends the check.
    fn page_for(method: &Method) -> Due {
        if is_page_method(method) {
            Due::Page
        } else {
            Due::Refused(Problem::PassRequired {
                method: method.to_string(),
            })
        }
    }
}

/// GET and HEAD: what a browser can repeat after the check's redirect
/// (HEAD gets the page's headers without its body).
fn is_page_method(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// A solution or refresh URL that does not hold: `400`, saying why.
fn failed_check(x: &mut Exchange, reason: TokenFault) -> Response<Body> {
    let why = format!(
        "The browser check failed ({}); reload the page for a new one.",
        reason.as_str()
    );
    x.trail.answer(Problem::BadRequest(why))
}

impl App {
    /// The pass the request carries (`Client::pass`, what `key: pass`
    /// counts on) and the difficulty it was solved at (0 without one), and
    /// the pass and refresh paths, answered here: `Err` is their answer.
    /// The request is borrowed, not moved in and out (see
    /// [`App::handle_on`]).
    pub(super) async fn pass_gate(
        &self,
        x: &mut Exchange,
        client: &mut Client,
        admitted: &mut Admitted,
    ) -> Result<u8, Response<Body>> {
        let snap = x.snap.clone();
        let Some(gate) = snap.challenge_gate.as_ref() else {
            return Ok(0);
        };
        let host = request_host(&admitted.req).unwrap_or_default();
        let held = gate.pass_of(admitted.req.headers(), &host, client.ip, x.now);
        strip_pass_cookies(admitted.req.headers_mut());
        let bits = held.as_ref().map_or(0, |h| h.bits);
        // A pass issued past its block's allowance counts as the address.
        client.pass = held.map(|h| h.key.unwrap_or_else(|| client.ip_key.to_string()));
        let path = admitted.req.uri().path();
        if path == REFRESH_PATH {
            return Err(self
                .follow_refresh(x, gate, client, &admitted.req, &host)
                .await);
        }
        if path != PASS_PATH {
            return Ok(bits);
        }
        if admitted.req.method() != Method::POST {
            let method = admitted.req.method().to_string();
            return Err(x.trail.answer(Problem::MethodNotAllowed { method }));
        }
        // The pass path's answer is this gate's own: the body is not needed after.
        let body = std::mem::replace(admitted.req.body_mut(), RequestBody::Empty);
        let body = http_body_util::Limited::new(body, FORM_LIMIT);
        let form = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                let why = format!("A solution is a form of at most {FORM_LIMIT} bytes.");
                return Err(x.trail.answer(Problem::BadRequest(why)));
            }
        };
        let solution = Solution::from_form(&form);
        match gate.solve(&solution, &host, client.ip, x.now) {
            Ok(solved) => Err(self.granted(x, gate, &solved).await),
            Err(reason) => Err(failed_check(x, reason)),
        }
    }

    /// The refresh URL of the no-JavaScript tier, followed: the pass
    /// cookie and a redirect back, or `400` (a stale or copied URL).
    async fn follow_refresh(
        &self,
        x: &mut Exchange,
        gate: &ChallengeGate,
        client: &Client,
        req: &Request<RequestBody>,
        host: &str,
    ) -> Response<Body> {
        if !is_page_method(req.method()) {
            let method = req.method().to_string();
            return x.trail.answer(Problem::MethodNotAllowed { method });
        }
        let query = req.uri().query().unwrap_or("");
        match gate.follow_refresh(query, host, client.ip, x.now) {
            Ok(solved) => self.granted(x, gate, &solved).await,
            Err(reason) => failed_check(x, reason),
        }
    }

    /// The pass `solved` earns, as a `303` back with its cookie.
    async fn granted(
        &self,
        x: &mut Exchange,
        gate: &ChallengeGate,
        solved: &Solved,
    ) -> Response<Body> {
        let fresh = self.may_issue(gate, &solved.prefix, x.now).await;
        let secure = x.conn.proto == "https";
        let granted = gate.grant(solved, fresh, x.now, secure);
        // Not a route: no route counter; the log says the client was let through.
        x.trail.record.decision = Decision::Allowed;
        let mut resp = Response::new(Body::full(Bytes::new()));
        *resp.status_mut() = StatusCode::SEE_OTHER;
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(&granted.cookie) {
            h.insert(SET_COOKIE, v);
        }
        // `back` is a local path already (`safe_return`); one builder all the same.
        if let Some(v) = crate::location::local(&granted.back, None) {
            h.insert(LOCATION, v);
        }
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }

    /// Counts one new pass for the address block `prefix`: whether its
    /// allowance had room. A store that cannot answer gives no room (the
    /// pass then counts as its address, the safe side for quotas, and the
    /// browser still gets through).
    async fn may_issue(
        &self,
        gate: &ChallengeGate,
        prefix: &str,
        now: crate::limiter::Nanos,
    ) -> bool {
        let key = crate::key::for_pass_issue(prefix);
        let overflow = crate::key::StoreKey::overflow(crate::config::ISSUE_LIMITER);
        let check = crate::store::Check {
            key: &key,
            overflow: &overflow,
            algorithm: gate.issue_limit(),
            shadow: false,
        };
        match self.shared.store.check(&[check], now).await {
            Ok(outcomes) => outcomes.first().is_some_and(|o| !o.ruling.is_deny()),
            Err(e) => {
                tracing::warn!(error = %e, "counting a new pass failed; the pass counts as its address");
                false
            }
        }
    }

    /// A pass solved at a lower difficulty than the route's challenge asks
    /// is no pass here: the browser is challenged at the route's difficulty,
    /// and `key: pass` counts it as its address meanwhile.
    pub(super) fn pass_for_route(&self, x: &Exchange, route: usize, client: &mut Client, bits: u8) {
        if client.pass.is_none() {
            return;
        }
        let asked = x.snap.config.routes[route].challenge.map(|c| c.difficulty);
        if asked.is_some_and(|d| d > bits) {
            client.pass = None;
        }
    }

    /// What the challenge phase does with this request before its
    /// limiters (None: nothing, it goes on as any other).
    pub(super) async fn challenge_due(
        &self,
        x: &mut Exchange,
        route: usize,
        client: &Client,
        req: &Request<RequestBody>,
    ) -> Option<Due> {
        let snap = x.snap.clone();
        let gate = snap.challenge_gate.as_ref()?;
        let config = snap.config.routes[route].challenge?;
        if client.exempt || client.key_verified || client.pass.is_some() {
            return None;
        }

        let browser = prefers_html(req.headers());
        let sorts_crawlers = config.unverified_crawlers != UnverifiedCrawlers::AsOthers;
        if !browser && !sorts_crawlers {
            // Not a browser, nothing asked of crawlers: no DNS lookup.
            return None;
        }
        // Boxed: a reverse-DNS check's future (its socket, a 1,500-byte
        // buffer) would otherwise be part of every request's future.
        match Box::pin(gate.crawler(client.ip, &client.network, req.headers(), x.now)).await {
            Crawler::Verified => return None,
            Crawler::Unverified => match config.unverified_crawlers {
                UnverifiedCrawlers::Challenge => return Some(Due::page_for(req.method())),
                UnverifiedCrawlers::Refuse => {
                    return Some(Due::Refused(Problem::UnverifiedCrawler))
                }
                UnverifiedCrawlers::AsOthers => {}
            },
            Crawler::NotClaimed | Crawler::Unknown => {}
        }
        // Feeds and fixed files: a reader of them cannot pass a page (a
        // crawler its DNS refutes was sorted above: it lies, feed or not).
        if !browser || (config.exempt_public && is_public(req.uri().path(), req.headers())) {
            return None;
        }
        match config.when {
            ChallengeWhen::Always => Some(Due::page_for(req.method())),
            // A form over the limit gets the limiter's refusal: it could
            // not be replayed after the page either.
            ChallengeWhen::OverLimit if is_page_method(req.method()) => {
                x.trail.challenge_refusal = true;
                Some(Due::OverLimit)
            }
            ChallengeWhen::OverLimit => None,
        }
    }

    /// A refusal by the challenge gate (a form without a pass, a refuted crawler).
    pub(super) fn challenge_refused(
        &self,
        x: &mut Exchange,
        route: usize,
        problem: Problem,
    ) -> Response<Body> {
        let snap = x.snap.clone();
        x.trail
            .decide(&snap.routes[route].metrics, Decision::Challenged);
        x.trail.answer(problem)
    }

    /// The challenge page: with the refusal's status and rate-limit headers
    /// when it answers one, else `403` (the status browsers and crawlers
    /// know from other edges' challenges; never cached, never indexed).
    pub(super) fn challenge(
        &self,
        x: &mut Exchange,
        route: usize,
        client: &Client,
        req: &Request<RequestBody>,
        refused: Option<Response<Body>>,
    ) -> Response<Body> {
        let snap = x.snap.clone();
        let (Some(gate), Some(config)) = (
            snap.challenge_gate.as_ref(),
            snap.config.routes[route].challenge,
        ) else {
            // `challenge_due` said yes, so both are there; answer as without a challenge.
            return refused.unwrap_or_else(|| x.trail.answer(Problem::NoRoute));
        };
        let host = request_host(req).unwrap_or_default();
        let back = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let (html, nonce) = match config.mode {
            ChallengeMode::ProofOfWork => {
                let token = gate.issue(&host, client.ip, config.difficulty, x.now);
                let nonce = gate.page_nonce();
                let html = page::render(&token, config.difficulty, safe_return(back), &nonce);
                (html, Some(nonce))
            }
            ChallengeMode::MetaRefresh => {
                let url = gate.refresh_url(&host, client.ip, back, x.now);
                (refresh::render(&url), None)
            }
        };
        let mut resp = match refused {
            Some(refusal) => refusal.map(|_| Body::full(Bytes::from(html))),
            None => {
                x.trail
                    .decide(&snap.routes[route].metrics, Decision::Challenged);
                let mut resp = Response::new(Body::full(Bytes::from(html)));
                *resp.status_mut() = StatusCode::FORBIDDEN;
                resp
            }
        };
        match nonce {
            Some(nonce) => page::headers(resp.headers_mut(), &nonce),
            None => refresh::headers(resp.headers_mut()),
        }
        resp
    }
}
