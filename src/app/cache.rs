//! The cache phase of a caching route, between the route's action and the upstream: bypass, hit, stale, one render for concurrent misses, the answer stored.
//!
//! A request that may be stored reaches the upstream without the headers
//! the key leaves out ([`crate::cache::key`]), without its validators,
//! `Range` and `Accept-Encoding` (the cache stores the whole identity body
//! and answers those itself), and with the host and query as keyed. What is
//! stored is the upstream's answer as it came: the request id, the
//! rate-limit headers and any compression are added on the way out, to hits
//! and misses alike.

use std::sync::Arc;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT_ENCODING, HOST, IF_MATCH, IF_MODIFIED_SINCE,
    IF_NONE_MATCH, IF_RANGE, IF_UNMODIFIED_SINCE, RANGE,
};
use http::{Request, Response};

use super::{Admitted, App, Exchange};
use crate::body::Body;
use crate::cache::flight::{self, Joined, Landed};
use crate::cache::key::{self, Key, KeyParts};
use crate::cache::policy::{self, Bypass};
use crate::cache::{Entry, Found, ResponseCache, RouteCache, Standing, CACHE_STATUS};
use crate::compression::Asked;
use crate::decide::Clearance;
use crate::identity::Client;
use crate::metrics::inc;
use crate::proxy::Outbound;
use crate::request_body::RequestBody;

mod keep;

use keep::{keep, KeptAnswer};

/// Where a request on a caching route goes: the route (`index`), its
/// upstream, the client, the route's `cache:` and the shared cache.
#[derive(Clone, Copy)]
pub(super) struct Via<'a> {
    pub index: usize,
    pub upstream: usize,
    pub client: &'a Client,
    pub rc: &'a RouteCache,
    pub cache: &'a Arc<ResponseCache>,
}

/// Where a leading request's answer may be stored, and under what.
struct Kept<'a> {
    cache: &'a ResponseCache,
    rc: &'a RouteCache,
    lookup: &'a CacheLookup,
    uri: &'a http::Uri,
    /// The key the lookup found nothing under (remembered if the answer cannot be stored).
    key: &'a Key,
}

/// What a cacheable request brings to the phase.
struct CacheLookup {
    base: Key,
    /// The query as keyed (and as the upstream gets it).
    query: Option<String>,
    /// The client's own headers (its validators, its `Vary`'d values).
    headers: HeaderMap,
    asked: Asked,
    /// The route's answers may be compressed (their stored forms are served).
    compress: bool,
}

impl App {
    /// Dispatch through the cache.
    pub(super) async fn through_cache(
        &self,
        x: &mut Exchange,
        v: Via<'_>,
        admitted: &mut Admitted,
        pass: &mut Clearance,
    ) -> Response<Body> {
        let Via {
            index,
            client,
            rc,
            cache,
            ..
        } = v;
        if let Some(why) = policy::bypass(admitted.req.method(), admitted.req.headers(), &rc.config)
        {
            return self.bypassed(x, v, admitted, pass, why).await;
        }
        let lookup = lookup(x, index, client, &admitted.req, rc);
        let missing = match cache.find(lookup.base.clone(), &lookup.headers, x.now) {
            Found::Entry(key, e) => match e.standing(x.now) {
                Standing::Fresh => {
                    cache.count_lookup(true);
                    inc(&rc.hit);
                    let status = format!("tollgate; hit; ttl={}", e.ttl(x.now));
                    return answer(&e, &lookup, x, &status);
                }
                Standing::Revalidate => {
                    cache.count_lookup(true);
                    inc(&rc.stale);
                    if e.claim_refresh() {
                        prepare(&mut admitted.req, client, &lookup);
                        let keys = (key.clone(), lookup.base.clone());
                        self.refresh(x, v, admitted.take_request(), keys, e.clone());
                    }
                    let ttl = e.ttl(x.now);
                    let status = format!("tollgate; hit; ttl={ttl}; detail=stale-while-revalidate");
                    return answer(&e, &lookup, x, &status);
                }
                Standing::IfError | Standing::Dead => Found::Entry(key, e),
            },
            nothing_or_unstorable => nothing_or_unstorable,
        };
        cache.count_lookup(false);
        self.miss(x, v, (admitted, pass), lookup, missing).await
    }

    /// A request the cache does not answer: forwarded as it came, marked
    /// `fwd=bypass` (or `fwd=method`); an unsafe method that succeeds
    /// removes the stored answer for its URL (RFC 9111 §4.4).
    async fn bypassed(
        &self,
        x: &mut Exchange,
        v: Via<'_>,
        admitted: &mut Admitted,
        pass: &mut Clearance,
        why: Bypass,
    ) -> Response<Body> {
        let Via {
            index,
            upstream: u,
            client,
            rc,
            cache,
        } = v;
        inc(&rc.bypass);
        let unsafe_method = !admitted.req.method().is_safe();
        let base = unsafe_method.then(|| lookup(x, index, client, &admitted.req, rc).base);
        let mut resp = self.upstream(x, index, u, client, admitted, pass).await;
        let changed = resp.status().is_success() || resp.status().is_redirection();
        if let (Some(base), true) = (base, changed) {
            cache.remove(&base);
        }
        let status = match why {
            Bypass::Method => "tollgate; fwd=method",
            Bypass::Request => "tollgate; fwd=bypass",
        };
        resp.headers_mut()
            .insert(CACHE_STATUS, HeaderValue::from_static(status));
        resp
    }

    /// No fresh answer (`missing`: a stale one, nothing, or a key whose
    /// last answer could not be stored): one request per key asks the
    /// upstream, the others wait for what it stores; a stale answer within
    /// `stale_if_error` stands in when the upstream fails. A key remembered
    /// as not storable is asked at once, without a flight (each render
    /// would be its own anyway), its answer marked `detail=unstorable`.
    async fn miss(
        &self,
        x: &mut Exchange,
        v: Via<'_>,
        (admitted, pass): (&mut Admitted, &mut Clearance),
        lookup: CacheLookup,
        missing: Found,
    ) -> Response<Body> {
        let Via {
            index,
            upstream: u,
            client,
            rc,
            cache,
        } = v;
        let (key, stale, collapse) = match missing {
            Found::Entry(key, e) => (key, Some(e), true),
            Found::Nothing(key) => (key, None, true),
            Found::Unstorable(key) => (key, None, false),
        };
        prepare(&mut admitted.req, client, &lookup);
        let lead = match collapse {
            true => match lead_or_shared(x, cache, rc, &key, &lookup).await {
                Ok(lead) => lead,
                Err(shared) => return shared,
            },
            false => None,
        };
        inc(&rc.miss);
        let uri = admitted.req.uri().clone();
        let resp = self.upstream(x, index, u, client, admitted, pass).await;
        let fwd_status = resp.status().as_u16();
        if resp.status().is_server_error() {
            if let Some(e) = stale.filter(|e| e.usable_on_error(self.shared.clock.now())) {
                inc(&rc.stale);
                let ttl = e.ttl(x.now);
                let status = format!("tollgate; fwd=stale; fwd-status={fwd_status}; ttl={ttl}; detail=stale-if-error");
                return answer(&e, &lookup, x, &status);
            }
        }
        let Some(lead) = lead else {
            let detail: &[u8] = if collapse {
                b""
            } else {
                b"; detail=unstorable"
            };
            return missed(resp, detail);
        };
        let kept = Kept {
            cache,
            rc,
            lookup: &lookup,
            uri: &uri,
            key: &key,
        };
        self.stored_for_all(x, kept, resp, lead).await
    }

    /// The leading request's answer, stored when it may be: then the
    /// stored entry answers it and every request that waited on it;
    /// otherwise it goes on as it came (the waiters ask on their own).
    async fn stored_for_all(
        &self,
        x: &Exchange,
        kept: Kept<'_>,
        resp: Response<Body>,
        lead: flight::Lead,
    ) -> Response<Body> {
        let fwd_status = resp.status().as_u16();
        let now = self.shared.clock.now();
        let Kept {
            cache,
            rc,
            lookup,
            uri,
            key,
        } = kept;
        match keep(
            cache,
            &rc.config,
            &lookup.base,
            uri,
            &lookup.headers,
            resp,
            lookup.compress,
            now,
        )
        .await
        {
            KeptAnswer::Stored(e) => {
                lead.land(Landed::Stored(e.clone()));
                let status = format!(
                    "tollgate; fwd=miss; fwd-status={fwd_status}; stored; ttl={}",
                    e.ttl(now)
                );
                answer(&e, lookup, x, &status)
            }
            KeptAnswer::Passed(resp) => missed(resp, b""),
            KeptAnswer::Unstorable(resp) => {
                // Before the lead lands: a request arriving after its
                // followers are let go finds the marker, not a new flight.
                cache.remember_unstorable(key, now);
                drop(lead);
                missed(resp, b"")
            }
        }
    }

    /// `stale-while-revalidate`: one request in the background refreshes
    /// `stale` (stored under `key`); a failure leaves it as it is, an answer
    /// no longer storable removes it.
    fn refresh(
        &self,
        x: &Exchange,
        v: Via<'_>,
        req: Request<RequestBody>,
        (key, base): (Key, Key),
        stale: Arc<Entry>,
    ) {
        let Via {
            index,
            upstream: u,
            client,
            ..
        } = v;
        let (app, snap) = (self.clone(), x.snap.clone());
        // A GET's body, if it had one, stays with the client's request: the
        // refresh asks without one.
        let mut req = req.map(|_| RequestBody::Empty);
        req.headers_mut().remove(http::header::CONTENT_LENGTH);
        req.headers_mut().remove(http::header::TRANSFER_ENCODING);
        let headers = req.headers().clone();
        let compress = crate::compression::enabled(&snap.config, Some(index));
        let uri = req.uri().clone();
        let max_body = snap.config.server.max_request_body;
        let outbound = Outbound::new(req, client, &x.conn, max_body);
        tokio::spawn(async move {
            let (Some(cache), Some(rc)) = (snap.cache.clone(), snap.routes[index].cache.as_ref())
            else {
                return;
            };
            let sent = snap.upstreams[u].forward(outbound).await;
            let resp = match sent {
                Ok((resp, guard)) if !resp.status().is_server_error() => {
                    resp.map(|b| Body::upstream(b, guard))
                }
                _ => return stale.release_refresh(),
            };
            let now = app.shared.clock.now();
            let kept = keep(
                &cache, &rc.config, &base, &uri, &headers, resp, compress, now,
            )
            .await;
            if !matches!(kept, KeptAnswer::Stored(_)) {
                cache.remove(&key);
            }
        });
    }

    /// `hits_free`: a fresh stored answer, before the limiters count the
    /// request (a banned client is refused by the limit phase all the same).
    pub(super) async fn free_hit(
        &self,
        x: &mut Exchange,
        index: usize,
        client: &Client,
        req: &Request<RequestBody>,
    ) -> Option<Response<Body>> {
        let snap = x.snap.clone();
        let (rc, cache) = (snap.routes[index].cache.as_ref()?, snap.cache.as_ref()?);
        if policy::bypass(req.method(), req.headers(), &rc.config).is_some() {
            return None;
        }
        let lookup = lookup(x, index, client, req, rc);
        let Found::Entry(_, e) = cache.find(lookup.base.clone(), &lookup.headers, x.now) else {
            return None;
        };
        if e.standing(x.now) != Standing::Fresh {
            return None;
        }
        let facts = crate::decide::RequestFacts {
            route: index,
            client,
            headers: req.headers(),
            now: x.now,
            sender_only: false,
        };
        if self.gate().is_banned(&snap, &facts).await {
            return None;
        }
        cache.count_lookup(true);
        inc(&rc.hit);
        x.trail.decide(
            &snap.routes[index].metrics,
            crate::metrics::Decision::Allowed,
        );
        Some(answer(
            &e,
            &lookup,
            x,
            &format!("tollgate; hit; ttl={}", e.ttl(x.now)),
        ))
    }
}

/// The key and the facts the phase reads off a cacheable request.
fn lookup(
    x: &Exchange,
    index: usize,
    client: &Client,
    req: &Request<RequestBody>,
    rc: &RouteCache,
) -> CacheLookup {
    let query = key::query(req.uri().query(), &rc.config);
    let host = req
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .unwrap_or("");
    let parts = KeyParts {
        scheme: x.conn.proto,
        host,
        path: req.uri().path(),
        headers: req.headers(),
        peer_trusted: client.peer_trusted,
    };
    CacheLookup {
        base: Key::base(&parts, query.as_deref()),
        query,
        headers: req.headers().clone(),
        asked: Asked::of(req),
        compress: crate::compression::enabled(&x.snap.config, Some(index)),
    }
}

/// The request as the upstream gets it when its answer may be stored.
fn prepare(req: &mut Request<RequestBody>, client: &Client, lookup: &CacheLookup) {
    let h = req.headers_mut();
    // The names found in one pass over those the request has, then removed:
    // removing an absent name still hashes it, and 11 (25 from an untrusted
    // peer) were asked of every cached request (~1,200 instructions and more,
    // callgrind). Empty, as for nearly every request, it never allocates.
    let dropped: Vec<HeaderName> = h
        .keys()
        .filter(|n| not_for_a_shared_render(n, client.peer_trusted))
        .cloned()
        .collect();
    for name in &dropped {
        h.remove(name);
    }
    // The upstream renders for the host the key names (lowered, without a
    // default port or a trailing dot): put in only where it differs.
    if let Some(sent) = h.get(HOST) {
        let host = lookup.base.host();
        if sent.as_bytes() != host.as_bytes() {
            if let Ok(v) = HeaderValue::from_str(host) {
                h.insert(HOST, v);
            }
        }
    }
    if req.uri().query() != lookup.query.as_deref() {
        let path_and_query = match &lookup.query {
            Some(q) => format!("{}?{q}", req.uri().path()),
            None => req.uri().path().to_string(),
        };
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query = path_and_query.parse().ok();
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
}

/// A request's own validators and range (the stored answer must be the
/// whole representation, whoever asks next), and its codings (compression
/// is applied on the way out, per client).
static PER_CLIENT: [HeaderName; 7] = [
    IF_NONE_MATCH,
    IF_MODIFIED_SINCE,
    IF_MATCH,
    IF_UNMODIFIED_SINCE,
    IF_RANGE,
    RANGE,
    ACCEPT_ENCODING,
];

/// Whether a request field stays out of a render that may be stored for
/// everyone: an unkeyed one, one of [`PER_CLIENT`], or an edge header an
/// untrusted peer sent.
fn not_for_a_shared_render(name: &HeaderName, peer_trusted: bool) -> bool {
    key::UNKEYED.contains(name)
        || PER_CLIENT.contains(name)
        || (!peer_trusted && crate::proxy::edge_owned_position(name).is_some())
}

/// A stored answer for this request, marked `status`.
/// One render for concurrent misses: the lead of `key`'s flight (`None` for
/// a HEAD, forwarded as it is, or a follower whose lead stored nothing), or
/// for a follower the answer the lead's render stored (`Err`).
async fn lead_or_shared(
    x: &Exchange,
    cache: &ResponseCache,
    rc: &RouteCache,
    key: &Key,
    lookup: &CacheLookup,
) -> Result<Option<flight::Lead>, Response<Body>> {
    match (lookup.asked.head, cache.flights.join(key)) {
        (true, _) => Ok(None),
        (false, Joined::Lead(lead)) => Ok(Some(lead)),
        (false, Joined::Follow(rx)) => {
            match flight::wait(rx, cache.settings().lock_timeout).await {
                // Another request's render, shared: no render of its own.
                Some(Landed::Stored(e)) => {
                    inc(&rc.hit);
                    let status = format!("tollgate; fwd=miss; collapsed; ttl={}", e.ttl(x.now));
                    Err(answer(&e, lookup, x, &status))
                }
                _ => Ok(None),
            }
        }
    }
}

fn answer(e: &Entry, lookup: &CacheLookup, x: &Exchange, status: &str) -> Response<Body> {
    let value = HeaderValue::from_str(status).unwrap_or(HeaderValue::from_static("tollgate"));
    e.answer(
        &lookup.headers,
        lookup.asked.accepted,
        lookup.asked.head,
        x.now,
        value,
    )
}

/// The upstream's own answer, not stored: marked a miss with its status
/// and `detail` (`tollgate; fwd=miss; fwd-status=200`). Written as bytes,
/// not through `format!` and a checked value: every pass through the cache pays it.
fn missed(mut resp: Response<Body>, detail: &[u8]) -> Response<Body> {
    let code = resp.status();
    let value = crate::header_value::joined(&[
        b"tollgate; fwd=miss; fwd-status=",
        code.as_str().as_bytes(),
        detail,
    ]);
    if let Some(v) = value {
        resp.headers_mut().insert(CACHE_STATUS, v);
    }
    resp
}
