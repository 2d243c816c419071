//! `GET /bans` (paged, filtered by limiter) and `DELETE /bans/{key}`: the bans in force, whatever the store.
//!
//! A page is sorted by store key (`<limiter>:<key value>`) and continues
//! after the last key of the previous one (`?after=`), so a ban that starts
//! or ends between two pages never shifts the others. `since` is the ban's
//! end minus the limiter's `ban.for` (the store keeps only the end); it is
//! `null` for a ban whose limiter a reload removed or changed.

use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::{json_response, query_param};
use crate::app::App;
use crate::body::Body;
use crate::clock::iso8601;
use crate::key;
use crate::limiter::{ceil_secs, Nanos, NANOS_PER_SEC};
use crate::problem::admin_error;
use crate::snapshot::Snapshot;
use crate::store::ban::ActiveBan;

/// Bans per page unless `?limit=` says otherwise.
pub const DEFAULT_LIMIT: usize = 100;
/// The most `?limit=` may ask for.
pub const MAX_LIMIT: usize = 1000;

/// What one `GET /bans` asks for.
#[derive(Debug, PartialEq, Eq)]
struct Page {
    limit: usize,
    after: Option<String>,
    limiter: Option<String>,
}

impl Page {
    fn parse(query: &str) -> Result<Page, String> {
        let limit = match query_param(query, "limit") {
            None => DEFAULT_LIMIT,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                _ => {
                    return Err(format!(
                        "`limit` must be a whole number from 1 to {MAX_LIMIT}."
                    ))
                }
            },
        };
        Ok(Page {
            limit,
            after: query_param(query, "after"),
            limiter: query_param(query, "limiter"),
        })
    }
}

/// `GET /bans?limit=&after=&limiter=`.
pub async fn list(app: &App, snap: &Snapshot, query: &str) -> Response<Body> {
    let page = match Page::parse(query) {
        Ok(p) => p,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, &e),
    };
    let now = app.shared.clock.now();
    let all = match app.shared.store.ban_list(now).await {
        Ok(all) => all,
        Err(e) => return admin_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    };
    let matching: Vec<&ActiveBan> = all
        .iter()
        .filter(|b| {
            page.limiter
                .as_deref()
                .is_none_or(|l| key::limiter_of(&b.key) == l)
        })
        .collect();
    let start = page.after.as_deref().map_or(0, |after| {
        matching.partition_point(|b| b.key.as_str() <= after)
    });
    let end = (start + page.limit).min(matching.len());
    let shown = &matching[start..end];
    let next = (end < matching.len()).then(|| shown.last().map(|b| b.key.clone()));
    json_response(
        StatusCode::OK,
        json!({
            "backend": app.shared.store.backend(),
            "total": matching.len(),
            "bans": shown.iter().map(|b| describe(snap, b)).collect::<Vec<_>>(),
            "next": next.flatten(),
        }),
    )
}

/// One ban as the API and the dashboard show it.
fn describe(snap: &Snapshot, b: &ActiveBan) -> Value {
    let limiter = key::limiter_of(&b.key);
    let duration: Option<Nanos> = snap
        .limiters
        .iter()
        .find(|l| *l.name == *limiter)
        .and_then(|l| l.ban.as_ref())
        .map(|(rule, _)| rule.duration);
    let until = b.ban.until.div_ceil(NANOS_PER_SEC);
    // A ban longer than the limiter's `for` predates a reload that shortened it.
    let since = duration
        .filter(|d| *d >= b.ban.remaining)
        .map(|d| b.ban.until.saturating_sub(d) / NANOS_PER_SEC);
    let mut v = json!({
        "key": b.key,
        "limiter": limiter,
        "value": key::value_of(&b.key),
        "since": since,
        "since_utc": since.map(iso8601),
        "until": until,
        "until_utc": iso8601(until),
        "seconds_left": ceil_secs(b.ban.remaining).max(1),
    });
    // With `identity.geoip`, where a banned address is (its prefix's first address for IPv6).
    if let (Some(networks), Some(net)) = (&snap.networks, key::address_of(key::value_of(&b.key))) {
        let found = networks.lookup(net.addr());
        v["asn"] = json!(found.asn);
        v["country"] = json!(found.country.as_ref().map(|c| c.as_str()));
    }
    v
}

/// `DELETE /bans/{key}`: `raw` is the percent-encoded store key.
pub async fn lift(app: &App, raw: &str) -> Response<Body> {
    let key = percent_encoding::percent_decode_str(raw)
        .decode_utf8_lossy()
        .into_owned();
    let now = app.shared.clock.now();
    match app.shared.store.lift_ban(&key, now).await {
        Ok(true) => {
            tracing::info!(key = %key, "ban lifted through the admin API");
            json_response(StatusCode::OK, json!({"key": key, "lifted": true}))
        }
        Ok(false) => admin_error(
            StatusCode::NOT_FOUND,
            "No ban is in force on this key (GET /bans lists them by their full key, <limiter>:<key value>).",
        ),
        Err(e) => admin_error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_takes_its_limit_cursor_and_limiter_from_the_query() {
        assert_eq!(
            Page::parse("limit=2&after=l%3Aip%3A1.2.3.4&limiter=l"),
            Ok(Page {
                limit: 2,
                after: Some("l:ip:1.2.3.4".into()),
                limiter: Some("l".into()),
            })
        );
        assert_eq!(Page::parse("").map(|p| p.limit), Ok(DEFAULT_LIMIT));
        for bad in ["limit=0", "limit=1001", "limit=-1", "limit=x", "limit="] {
            assert!(Page::parse(bad).is_err(), "{bad}");
        }
    }
}
