//! The request lifecycle as named phases: admit → identify → route → reputation → limit → dispatch (respond | upstream | FastCGI | tunnel) → settle → log.
//!
//! `App` is a cheap handle that the server clones into every connection. A
//! request loads the current [`Snapshot`] once and finishes on it, whatever
//! a reload does meanwhile.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::request_body::RequestBody;
use arc_swap::ArcSwap;
use http::header::CONTENT_LENGTH;
use http::{HeaderMap, Request, Response};
use parking_lot::Mutex;

use crate::access::AccessLog;
use crate::body::Body;
use crate::buffering::Share;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::decide::{Clearance, Gate, RequestFacts, Verdict};
use crate::identity::{Client, IdentityError};
use crate::limiter::Nanos;
use crate::metrics::{Decision, Metrics};
use crate::problem::Problem;
use crate::request_id::{RequestId, X_REQUEST_ID};
use crate::router::{request_host, request_path};
use crate::snapshot::{RouteAction, Snapshot};
use crate::store::Store;
use crate::tunnel::ClientSide;

pub use crate::connections::ConnInfo;
use challenge::Due;
use trail::Trail;

mod cache;
mod challenge;
mod refuse;
mod reputation;
mod site;
mod trail;
mod upstream;

/// The state every part of the process shares.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    /// Shared with the places a request gives back after it ended (see [`crate::decide::Release`]).
    pub store: Arc<Store>,
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
    pub activity: crate::activity::RouteActivity,
    /// The access log's queue and writer thread.
    pub access: AccessLog,
    /// Upgraded connections (WebSockets) still open; closed at shutdown.
    pub tunnels: crate::tunnel::Tunnels,
    /// PROXY-protocol connections accepted and refused (`server.proxy_protocol`).
    pub proxy_protocol: crate::proxy_protocol::Counters,
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

impl App {
    pub fn new(
        config: Config,
        store: Store,
        clock: SharedClock,
        source: Option<ConfigSource>,
    ) -> App {
        let metrics = Metrics::default();
        store.bind_metrics(&metrics);
        store.configure(&config.limiters);
        let access = AccessLog::stdout(clock.clone());
        if let Some(path) = &config.log.access_file {
            access.to_file(path.clone());
        }
        crate::compression::register(&metrics);
        let snapshot = Snapshot::build(config, 1, None, &metrics);
        let connections = crate::connections::Connections::new(&metrics);
        let proxy_protocol = crate::proxy_protocol::Counters::new(&metrics);
        let (config_path, config_text) = match source {
            Some(s) => (Some(s.path), Some(s.text)),
            None => (None, None),
        };
        App {
            shared: Arc::new(Shared {
                snapshot: ArcSwap::from_pointee(snapshot),
                store: Arc::new(store),
                clock,
                metrics,
                config_path,
                config_text: Mutex::new(config_text),
                last_reload_error: Mutex::new(None),
                started: Instant::now(),
                connections,
                activity: Default::default(),
                access,
                tunnels: crate::tunnel::Tunnels::default(),
                proxy_protocol,
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
    ///
    /// The start (the id, the trail, admit) runs as it is called, and the
    /// future holds what the phases need after it. This future is copied
    /// whole as the request starts, and an `async fn` keeps each argument it
    /// takes by value twice in its state (as passed, and as its local): so
    /// this is not one, and the phases below borrow what they change
    /// (docs/PERFORMANCE.md, "The request's future", has the sizes).
    pub fn handle_on(
        &self,
        req: Request<impl Into<RequestBody>>,
        conn: ConnInfo,
        share: Option<Share>,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        let mut req = req.map(Into::into);
        let snap = self.snapshot();
        let started = Instant::now();
        let shaping_from = tokio::time::Instant::now();
        let now = self.shared.clock.now();
        let in_flight = self.shared.metrics.in_flight.enter();
        let id = RequestId::for_request(
            req.headers(),
            snap.identity.is_trusted(conn.peer.ip().to_canonical()),
        );
        // The upstream sees the same id the client and the log see.
        req.headers_mut().insert(X_REQUEST_ID, id.header().clone());
        let trail = Trail::begin(&snap, &req, conn, now, &id);
        let asked = crate::compression::Asked::of(&req);
        let mut x = Exchange {
            snap,
            conn,
            share,
            now,
            started,
            shaping_from,
            trail,
            captured: None,
            upstream_answered: false,
        };
        let mut admission = self.admit(&x, req);
        // The future owns its handle on the app: it outlives the call (the
        // connection's service starts it as hyper hands the request over,
        // and hyper keeps it, boxed, until the answer is ready).
        let app = self.clone();
        async move {
            // The request stays where admit put it: each phase borrows it.
            let served = match admission {
                Ok(ref mut admitted) => app.serve(&mut x, admitted).await,
                Err(problem) => Err(problem),
            };
            let mut resp = match served {
                Ok(resp) => resp,
                Err(problem) => x.trail.answer(problem),
            };
            // Header rules in one place, on whatever answered (see `app/site.rs`).
            app.response_headers(&x, &mut resp);
            resp.headers_mut().insert(X_REQUEST_ID, id.header().clone());
            // The response filter phase: inside the log's count, so `bytes_out` is what went out.
            let compress = crate::compression::enabled(&x.snap.config, x.trail.route);
            let resp = crate::compression::filter(compress, asked, &app.shared.metrics, resp);
            x.trail.finish(&app, x.snap, resp, started, in_flight)
        }
    }

    /// The phases between the request head and the answer.
    async fn serve(
        &self,
        x: &mut Exchange,
        admitted: &mut Admitted,
    ) -> Result<Response<Body>, Problem> {
        let mut client = self.identify(x, &admitted.req)?;
        // Challenge: the pass a request carries; the pass path answers itself.
        let pass_bits = match self.pass_gate(x, &mut client, admitted).await {
            Ok(bits) => bits,
            Err(resp) => return Ok(resp),
        };
        let route = self.route(x, &client, &admitted.req)?;
        self.pass_for_route(x, route, &mut client, pass_bits);
        // Site rules: a refused address is answered before anything counts it.
        self.access(x, route, &client)?;
        // Reputation: a CrowdSec decision on the client's address.
        if let Some(resp) = self.reputation(x, route, &client, pass_bits, &admitted.req) {
            return Ok(resp);
        }
        // Challenge: a browser without a pass proves itself, now (`always`)
        // or instead of a limiter's refusal (`over_limit`).
        match self.challenge_due(x, route, &client, &admitted.req).await {
            Some(Due::Page) => return Ok(self.challenge(x, route, &client, &admitted.req, None)),
            Some(Due::Refused(problem)) => return Ok(self.challenge_refused(x, route, problem)),
            Some(Due::OverLimit) | None => {}
        }
        // Boxed: a password check's future (its blocking task) stays off
        // the request's state unless the route has `auth`.
        let auth = match x.snap.config.routes[route].site.auth.is_some() {
            true => Box::pin(self.authenticate(x, route, &mut admitted.req)).await,
            false => site::Authenticated::NotAsked,
        };
        let failed = matches!(auth, site::Authenticated::Failed);
        // `hits_free`: a fresh stored page costs the client nothing. Boxed,
        // and asked only on such a route: the others pay one check.
        let free = x.snap.routes[route].cache.as_ref();
        if !failed && free.is_some_and(|c| c.config.hits_free) {
            if let Some(hit) = Box::pin(self.free_hit(x, route, &client, &admitted.req)).await {
                return Ok(hit);
            }
        }
        let headers = admitted.req.headers();
        let mut pass = match self.limit(x, route, &client, headers, failed).await? {
            Admission::Admitted(pass) => pass,
            Admission::Refused(resp) if x.trail.record.decision == Decision::Challenged => {
                return Ok(self.challenge(x, route, &client, &admitted.req, Some(resp)));
            }
            Admission::Refused(resp) => return Ok(resp),
        };
        if failed {
            // Counted on the sender's own keys only; its `count:` sees the 401.
            let mut resp = self.unauthenticated(x, route);
            self.settle(x, &mut pass, &mut resp).await;
            return Ok(resp);
        }
        // Not boxed: the upstream phase borrows the request and sends it on
        // boxed, so its future is about the limit phase's size (measured in
        // docs/PERFORMANCE.md, "The request's future"): a box would cost an
        // allocation and save little.
        let mut resp = self.dispatch(x, route, &client, admitted, &mut pass).await;
        self.settle(x, &mut pass, &mut resp).await;
        Ok(resp)
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
    /// behind trusted proxies), and its network when `identity.geoip` says.
    fn identify(&self, x: &mut Exchange, req: &Request<RequestBody>) -> Result<Client, Problem> {
        match x.snap.identity.resolve(x.conn.peer, req.headers(), x.now) {
            Ok(mut client) => {
                x.trail.record.client = Some(client.shown());
                x.trail.record.ip = client.ip;
                if let Some(networks) = &x.snap.networks {
                    client.network = networks.lookup(client.ip);
                    networks.count(&client.network, x.now);
                    x.trail.record.network = Some(client.network);
                }
                Ok(client)
            }
            Err(IdentityError::UnknownApiKey(short)) => {
                x.trail.record.client = Some(short.as_str().into());
                Err(Problem::UnknownApiKey(short))
            }
            Err(IdentityError::TooManyUnknownKeys {
                ip_key,
                retry_after,
            }) => {
                x.trail.record.client = Some(ip_key.as_str().into());
                Err(Problem::TooManyUnknownKeys {
                    ip_key,
                    retry_after,
                })
            }
        }
    }

    /// Route: which route, on the normalized path (a separator the router
    /// would not see is a 400, or decoded); its index in the snapshot.
    fn route(
        &self,
        x: &mut Exchange,
        client: &Client,
        req: &Request<RequestBody>,
    ) -> Result<usize, Problem> {
        let snap = &x.snap;
        let path = request_path(req.uri().path(), snap.config.server.encoded_separators)
            .map_err(|e| Problem::BadRequest(e.to_string()))?;
        // Building the host string is only worth it when a route asks for one.
        let host = if snap.router.uses_host() {
            request_host(req)
        } else {
            None
        };
        let (index, locs) = snap
            .router
            .find_for(
                req.method(),
                host.as_deref(),
                &path,
                req.uri().query(),
                &client.network,
            )
            .ok_or(Problem::NoRoute)?;
        if let Some(locs) = locs {
            let path = path.into_owned();
            x.captured = Some(site::Captured { path, locs });
        }
        x.trail.route = Some(index);
        x.trail.record.route = Some(snap.routes[index].name.clone());
        Ok(index)
    }

    /// Limit: one decision ([`crate::decide`]) on the route's limiters,
    /// bans and store policy; a refusal is answered here (429 and its
    /// headers), a shaping delay is waited out.
    async fn limit(
        &self,
        x: &mut Exchange,
        index: usize,
        client: &Client,
        headers: &HeaderMap,
        sender_only: bool,
    ) -> Result<Admission, Problem> {
        let facts = RequestFacts {
            route: index,
            client,
            headers,
            now: x.now,
            sender_only,
        };
        let verdict = self.gate().decide(&x.snap, &facts).await;
        x.trail
            .decide(&x.snap.routes[index].metrics, verdict.decision());
        match verdict {
            Verdict::Pass(mut pass) => {
                pass.wait_turn(x.shaping_from).await;
                Ok(Admission::Admitted(pass))
            }
            Verdict::Refuse(refusal) => Ok(Admission::Refused(self.refuse(x, refusal))),
            Verdict::StoreUnavailable => Err(Problem::StoreUnavailable),
        }
    }

    /// Dispatch: the route's own answer, or the upstream's (HTTP, FastCGI,
    /// or a tunnel when it switches protocols).
    async fn dispatch(
        &self,
        x: &mut Exchange,
        index: usize,
        client: &Client,
        admitted: &mut Admitted,
        pass: &mut Clearance,
    ) -> Response<Body> {
        let snap = x.snap.clone();
        match &snap.routes[index].action {
            RouteAction::Respond {
                status,
                body,
                content_type,
            } => self.respond(x, index, *status, body, content_type),
            RouteAction::Redirect(rule) => {
                self.redirect(x, index, rule, admitted.req.uri().query())
            }
            RouteAction::Upstream(u) => match (&snap.routes[index].cache, &snap.cache) {
                (Some(rc), Some(cache)) => {
                    let via = cache::Via {
                        index,
                        upstream: *u,
                        client,
                        rc,
                        cache,
                    };
                    Box::pin(self.through_cache(x, via, admitted, pass)).await
                }
                _ => self.upstream(x, index, *u, client, admitted, pass).await,
            },
        }
    }

    /// Settle: `count:` units are given back unless the answer counts, and
    /// the answer gets the rate-limit headers; what `pass` still holds is
    /// freed when [`serve`](Self::serve) drops it, as it answers. Borrowed,
    /// not moved in and out (see [`handle_on`](Self::handle_on)).
    async fn settle(&self, x: &Exchange, pass: &mut Clearance, resp: &mut Response<Body>) {
        let status = resp.status();
        self.gate()
            .settle(&x.snap, pass, status, resp.headers_mut())
            .await;
    }

    /// What the decision works with.
    fn gate(&self) -> Gate<'_> {
        Gate {
            store: &self.shared.store,
            clock: &self.shared.clock,
            metrics: &self.shared.metrics,
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
    /// tokio's clock when the head was read: a shaping delay counts from it
    /// (tokio's, not `std`'s, so a test on paused time controls the wait).
    shaping_from: tokio::time::Instant,
    trail: Trail,
    /// The route's `path_regex` captures, when its action names them.
    captured: Option<site::Captured>,
    /// The answer is the upstream's (proxied, FastCGI, a static file), not
    /// one tollgate wrote: response header rules apply in full.
    upstream_answered: bool,
}

/// A request past the framing checks, with the client's side of an upgrade.
/// [`handle_on`](App::handle_on) holds it; the phases borrow it, and the one that
/// sends it on takes the request out.
struct Admitted {
    req: Request<RequestBody>,
    upgrade: Option<ClientSide>,
}

impl Admitted {
    /// The request, to send on; an empty one is left in its place.
    fn take_request(&mut self) -> Request<RequestBody> {
        std::mem::replace(&mut self.req, Request::new(RequestBody::Empty))
    }
}

/// What the limit phase decided.
enum Admission {
    /// On to dispatch, with what the limiters took.
    Admitted(Clearance),
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
