//! `ban:` and `count:` on the request path: refuse a banned key, strike a refused one, settle counted units.
//!
//! The request lifecycle in `app.rs` calls in three places:
//! 1. [`banned`] before the limiters: a key banned by any limiter of the
//!    route is refused outright (429 or 403, Retry-After = the ban's end),
//!    without counting and without reaching the upstream.
//! 2. [`strike`] after the limiters refused: each refusing limiter with
//!    `ban:` counts a strike; the strike that reaches `after` starts a ban
//!    (`tollgate_bans_total`). This request still gets its ordinary 429.
//! 3. [`settle`] when the answer is known: each `count:` limiter's unit is
//!    given back unless the answer counts (see `limiter/count.rs` for why a
//!    unit is taken first and refunded after).
//!
//! A store failure here never takes a request down: an unreadable ban lets
//! the limiters decide (they apply `on_error`), a lost strike or refund is
//! logged and leaves the safe side (no ban started early; a unit stays counted).

use http::{HeaderMap, StatusCode};

use crate::identity::Client;
use crate::limiter::Nanos;
use crate::metrics::inc;
use crate::problem::BanDenial;
use crate::snapshot::{Route, Snapshot};
use crate::store::{Outcome, Store};

/// A unit a `count:` limiter took for this request, to give back unless the answer counts.
#[derive(Debug, Clone)]
pub struct Unit {
    pub limiter: usize,
    pub store_key: String,
    /// See [`crate::limiter::Algorithm::ticket`].
    pub ticket: Nanos,
}

/// The ban of a client banned by a limiter of `route`, if any.
pub async fn banned(
    store: &Store,
    snap: &Snapshot,
    route: &Route,
    client: &Client,
    headers: &HeaderMap,
    now: Nanos,
) -> Option<BanDenial> {
    let mut keys: Vec<(usize, String)> = Vec::new();
    for &i in &route.limiters {
        let l = &snap.limiters[i];
        if l.ban.is_some() {
            if let Some(k) = l.request_key(client, &route.name, headers) {
                keys.push((i, k));
            }
        }
    }
    if keys.is_empty() {
        return None;
    }
    let refs: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let found = match store.banned(&refs, now).await {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(error = %e, "reading bans failed; the limiters decide");
            return None;
        }
    };
    let (i, store_key, ban) = keys
        .iter()
        .zip(found)
        .filter_map(|((i, k), b)| Some((*i, k, b?)))
        .max_by_key(|(_, _, b)| b.remaining)?;
    let l = &snap.limiters[i];
    inc(&l.metrics.banned);
    let status = l
        .ban
        .as_ref()
        .map_or(StatusCode::TOO_MANY_REQUESTS, |(rule, _)| rule.status);
    Some(BanDenial {
        index: i,
        limiter: l.name.clone(),
        // The key as the ban is stored (`h:alice` for a `header:` limiter),
        // which is also how `GET /bans` lists it.
        key: l.value_of(store_key).to_string(),
        until: ban.until,
        retry_after: ban.remaining,
        status,
    })
}

/// Counts a strike for each refusing limiter with `ban:` (`refused`: limiter, store key).
pub async fn strike(store: &Store, snap: &Snapshot, refused: &[(usize, &str)], now: Nanos) {
    for &(i, key) in refused {
        let l = &snap.limiters[i];
        let Some((rule, window)) = &l.ban else {
            continue;
        };
        match store.strike(key, rule, *window, now).await {
            Ok(Some(ban)) => {
                inc(&l.metrics.bans_started);
                tracing::warn!(limiter = %l.name, key = %l.value_of(key), seconds = ban.remaining / 1_000_000_000, "key banned after repeated rejections");
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, limiter = %l.name, "counting a strike failed"),
        }
    }
}

/// Gives back every unit whose answer does not count. `answer`: the
/// response's status and headers, or `None` when tollgate refused the
/// request itself (nothing reached the application, so nothing counts).
/// The quotas in `views` of answered requests are raised accordingly, so
/// the rate-limit headers of this very response show the unit returned.
pub async fn settle(
    store: &Store,
    snap: &Snapshot,
    units: &mut Vec<Unit>,
    views: &mut [(usize, Outcome)],
    answer: Option<(StatusCode, &HeaderMap)>,
    now: Nanos,
) {
    for unit in units.drain(..) {
        let l = &snap.limiters[unit.limiter];
        let counts = match (&l.count, answer) {
            (Some(rule), Some((status, headers))) => rule.matches(status, headers),
            _ => false,
        };
        if counts {
            continue;
        }
        let algorithm = l.algorithm_for(l.value_of(&unit.store_key));
        match store
            .refund(&unit.store_key, algorithm, unit.ticket, now)
            .await
        {
            Ok(()) => {
                inc(&l.metrics.not_counted);
                // Only an admitted request's quota reads exactly without its
                // unit; a refused one's already said 0 left, and still does.
                if answer.is_some() {
                    if let Some((_, o)) = views.iter_mut().find(|(i, _)| *i == unit.limiter) {
                        o.quota = algorithm.quota_without_one(o.quota);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, limiter = %l.name, "giving back a count: unit failed; it stays counted")
            }
        }
    }
}
