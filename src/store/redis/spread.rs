//! A request whose limiters span a cluster's slots: decided slot group by slot group, and what admitted groups took is given back when another group refuses.
//!
//! Redis runs one script on one slot only. The keys of one client share a
//! slot (see [`crate::key::slot_tag`]), so most requests are one group and
//! one atomic call, exactly as on one node. When they are not (a limiter
//! keyed on `route` or `global` beside a per-client one), every group is
//! checked and recorded atomically on its own, all groups at once (one
//! `store.timeout` bounds the request), and the request is admitted only if
//! no group refused. When one refused, each group that admitted gives back
//! what it took, from a background task:
//!
//! - **never over-admits**: a request is admitted only after every group
//!   recorded its unit, atomically within the group, against the limit;
//! - **may briefly under-admit**: between a group's record and its refund
//!   (one round trip), the unit of a request that ends up refused still
//!   counts, so a concurrent request on that key may be refused; a refund
//!   that fails (Redis down) leaves the unit counted until its window,
//!   refill or lease ends. A leaky-bucket place let through at once, and a
//!   fixed-window unit in a window its key already counted in (on one node
//!   every attempt there counts too), are not given back.

use std::collections::HashMap;

use ::redis::cluster_routing::Slot;

use super::{args, Holder, Redis};
use crate::limiter::{Hold, Ruling};
use crate::store::{Check, Outcome, StoreError};

/// Positions of `keys` by slot, in the order slots first appear.
pub(super) fn slot_groups(keys: &[String]) -> Vec<Vec<usize>> {
    let mut at: HashMap<Slot, usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let g = *at.entry(Slot::for_key(k)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// Every group at once; the outcomes in the order of `checks`.
pub(super) async fn check_groups(
    redis: &Redis,
    checks: &[Check<'_>],
    keys: &[String],
    members: &[String],
    groups: &[Vec<usize>],
) -> Result<Vec<Outcome>, StoreError> {
    let calls = groups
        .iter()
        .map(|g| redis.check_group(checks, keys, members, g));
    let replies = futures_util::future::join_all(calls).await;
    let mut outcomes: Vec<Option<Outcome>> = vec![None; checks.len()];
    let mut failure = None;
    let mut took = Vec::new();
    for (group, reply) in groups.iter().zip(replies) {
        match reply {
            Ok(found) => {
                let refused = group
                    .iter()
                    .zip(&found)
                    .any(|(&i, o)| o.ruling.is_deny() && !checks[i].shadow);
                if !refused {
                    took.push(group);
                }
                for (&i, o) in group.iter().zip(found) {
                    outcomes[i] = Some(o);
                }
            }
            Err(e) => failure = Some(e),
        }
    }
    let refused = took.len() < groups.len();
    if refused {
        for &i in took.iter().copied().flatten() {
            if let Some(o) = &outcomes[i] {
                give_back(redis, &checks[i], &keys[i], &members[i], o);
            }
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(outcomes.into_iter().flatten().collect())
}

/// Undoes what one check recorded for a request that another slot refused.
fn give_back(redis: &Redis, check: &Check<'_>, key: &str, member: &str, o: &Outcome) {
    let algorithm = check.algorithm;
    let release = |holder| args::release(algorithm, holder).map(|a| ("release", a.to_vec()));
    let undo = match (algorithm.holds(), o.ruling) {
        // Where a refused attempt would have counted anyway, it stays counted.
        (Hold::Nothing, _) if !algorithm.undo_when_refused(&o.quota) => None,
        (Hold::Nothing, _) => {
            args::refund(algorithm, o.ticket(algorithm)).map(|a| ("refund", a.to_vec()))
        }
        (Hold::Place, Ruling::Delay(d)) => release(Holder::Place(o.at + d)),
        // Let through at once: no place in the queue to give back.
        (Hold::Place, Ruling::Allow | Ruling::Deny { .. }) => None,
        (Hold::Slot, _) => release(Holder::Slot(member.to_string())),
    };
    if let Some((mode, args)) = undo {
        redis.send_in_background(mode, key.to_string(), args);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_one_tag_form_one_group_and_other_tags_their_own() {
        let keys: Vec<String> = [
            "t:{ip:1.2.3.4}a:ip:1.2.3.4",
            "t:{global}b:global",
            "t:{ip:1.2.3.4}c:ip:1.2.3.4|route:x",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(slot_groups(&keys), vec![vec![0, 2], vec![1]]);
        let one_node: Vec<String> = ["t:{t}a:ip:1", "t:{t}b:global"].map(String::from).to_vec();
        assert_eq!(slot_groups(&one_node), vec![vec![0, 1]]);
    }
}
