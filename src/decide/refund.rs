//! `count:` in the decision: the units taken first and given back unless the answer counts (see `limiter/count.rs` for why).
//!
//! A refund that fails is logged and leaves the safe side: the unit stays counted.

use http::{HeaderMap, StatusCode};

use super::Taken;
use crate::limiter::{Nanos, Ticket};
use crate::metrics::inc;
use crate::snapshot::Snapshot;
use crate::store::Store;

/// A unit a `count:` limiter took for this request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unit {
    /// Position in `Taken::applied` (its limiter and store key).
    pub(super) position: usize,
    /// See [`crate::limiter::Algorithm::ticket`].
    pub(super) ticket: Ticket,
}

/// Gives back every unit whose answer does not count. `answer`: the
/// response's status and headers, or `None` when tollgate refused the
/// request itself (nothing reached the application, so nothing counts).
/// The quotas in `taken` of answered requests are raised accordingly, so
/// the rate-limit headers of this very response show the unit returned.
pub(super) async fn refund(
    store: &Store,
    snap: &Snapshot,
    units: &mut Vec<Unit>,
    taken: &mut Taken,
    answer: Option<(StatusCode, &HeaderMap)>,
    now: Nanos,
) {
    for unit in units.drain(..) {
        let a = &taken.applied[unit.position];
        let l = &snap.limiters[a.limiter];
        let counts = match (&l.count, answer) {
            (Some(rule), Some((status, headers))) => rule.matches(status, headers),
            _ => false,
        };
        if counts {
            continue;
        }
        let algorithm = a.algorithm(snap);
        match store
            .refund(&a.store_key, algorithm, unit.ticket, now)
            .await
        {
            Ok(()) => {
                inc(&l.metrics.not_counted);
                // Only an admitted request's quota reads exactly without its
                // unit; a refused one's already said 0 left, and still does.
                if answer.is_some() {
                    let o = &mut taken.outcomes[unit.position];
                    o.quota = algorithm.quota_without_one(o.quota);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, limiter = %l.name, "giving back a count: unit failed; it stays counted")
            }
        }
    }
}
