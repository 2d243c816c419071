//! `ban:` in the decision: refuse a key banned by a limiter of the route, strike a key a limiter refused.
//!
//! A store failure here never takes a request down: an unreadable ban lets
//! the limiters decide (they apply `on_error`), a lost strike is logged and
//! leaves the safe side (no ban started early).

use http::StatusCode;

use super::Applied;
use crate::limiter::Nanos;
use crate::metrics::inc;
use crate::problem::BanDenial;
use crate::snapshot::Snapshot;
use crate::store::Store;

/// The ban on this request's key by one of the `applied` limiters, if any:
/// refused outright (429 or 403, Retry-After = the ban's end), without
/// counting and without reaching the upstream.
pub(super) async fn banned(
    store: &Store,
    snap: &Snapshot,
    applied: &[Applied],
    now: Nanos,
) -> Option<BanDenial> {
    // Most routes have no `ban:`: nothing is allocated and the store is not asked.
    let keys: Vec<&Applied> = applied
        .iter()
        .filter(|a| snap.limiters[a.limiter].ban.is_some())
        .collect();
    if keys.is_empty() {
        return None;
    }
    let refs: Vec<&str> = keys.iter().map(|a| a.store_key.as_str()).collect();
    let found = match store.banned(&refs, now).await {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!(error = %e, "reading bans failed; the limiters decide");
            return None;
        }
    };
    let (a, ban) = keys
        .iter()
        .zip(found)
        .filter_map(|(a, b)| Some((*a, b?)))
        .max_by_key(|(_, b)| b.remaining)?;
    let l = &snap.limiters[a.limiter];
    inc(&l.metrics.banned);
    let status = l
        .ban
        .as_ref()
        .map_or(StatusCode::TOO_MANY_REQUESTS, |(rule, _)| rule.status);
    Some(BanDenial {
        index: a.limiter,
        limiter: l.name.clone(),
        // The key as the ban is stored (`h:alice` for a `header:` limiter),
        // which is also how `GET /bans` lists it.
        key: l.value_of(&a.store_key).to_string(),
        until: ban.until,
        retry_after: ban.remaining,
        status,
        source: crate::problem::BanSource::Limiter,
    })
}

/// Counts a strike for each refusing limiter with `ban:` (`refused`:
/// positions in `applied`); the strike that reaches `after` starts a ban
/// (`tollgate_bans_total`). This request still gets its ordinary refusal,
/// but told to wait as long as the ban lasts: the time left of the longest
/// ban it started (ns), if it started one. A client that retried after the
/// limiter's own wait would only meet the ban.
pub(super) async fn strike(
    store: &Store,
    snap: &Snapshot,
    applied: &[Applied],
    refused: &[usize],
    now: Nanos,
) -> Option<Nanos> {
    let mut started: Option<Nanos> = None;
    for a in refused.iter().map(|&p| &applied[p]) {
        let l = &snap.limiters[a.limiter];
        let Some((rule, window)) = &l.ban else {
            continue;
        };
        let key = &a.store_key;
        match store.strike(key, rule, *window, now).await {
            Ok(Some(ban)) => {
                inc(&l.metrics.bans_started);
                tracing::warn!(limiter = %l.name, key = %l.value_of(key), seconds = ban.remaining / 1_000_000_000, "key banned after repeated rejections");
                started = started.max(Some(ban.remaining));
                // Other bouncers (the firewall's) act on it too, when pushing is configured.
                if let Some(crowdsec) = &snap.crowdsec {
                    let left = std::time::Duration::from_nanos(ban.remaining);
                    crowdsec.push_ban(&l.name, l.value_of(key), left, now);
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, limiter = %l.name, "counting a strike failed"),
        }
    }
    started
}
