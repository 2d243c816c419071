//! What the script takes for a limiter: each algorithm's own parameters and tag (`Rule::script_params`), packed the one way every algorithm shares.
//!
//! The script's parts are the Lua copies of `src/limiter/*.rs`, one beside
//! each (see `limiter/script.rs`); the contract suite
//! (`tests/store_contract.rs`) holds them to the same answers.

use ::redis::ScriptInvocation;

use super::Holder;
use crate::limiter::{Algorithm, Hold, Ticket};
use crate::store::StoreError;

/// Appends one limiter's 8 arguments to a `check` or `peek` call: the tag,
/// shadow, the member (a concurrency slot's id, else empty), then its five
/// parameters.
pub(super) fn push_check(
    call: &mut ScriptInvocation<'_>,
    algorithm: &Algorithm,
    shadow: bool,
    member: &str,
) -> Result<(), StoreError> {
    let params = algorithm.script_params().map_err(super::too_long)?;
    call.arg(algorithm.kind().script_tag())
        .arg(if shadow { "1" } else { "0" })
        .arg(member);
    for p in params {
        call.arg(p);
    }
    Ok(())
}

/// The 5 arguments of a `refund` call for the unit `ticket` (Redis' clock)
/// took: tag, the shape's span, place, units (1), decision instant; `None`
/// where `count:` does not apply (validation refuses it there).
pub(super) fn refund(algorithm: &Algorithm, ticket: Ticket) -> Option<[String; 5]> {
    if !algorithm.accepts_count() {
        return None;
    }
    Some([
        algorithm.kind().script_tag().into(),
        algorithm.shape().span.to_string(),
        algorithm.refund_place(ticket).to_string(),
        "1".into(),
        ticket.at.to_string(),
    ])
}

/// The 4 arguments of a `release` call: tag, member, the shape's span, the
/// ticket in Redis' clock; `None` when what is held does not belong to this
/// algorithm (a reload changed it): a slot then frees itself with its
/// lease, a place with its turn.
pub(super) fn release(algorithm: &Algorithm, holder: Holder) -> Option<[String; 4]> {
    let (member, at) = match (algorithm.holds(), holder) {
        (Hold::Slot, Holder::Slot(member)) => (member, 0),
        (Hold::Place, Holder::Place(at)) => (String::new(), at),
        (Hold::Nothing, _)
        | (Hold::Slot, Holder::Place(_) | Holder::Local { .. })
        | (Hold::Place, Holder::Slot(_) | Holder::Local { .. }) => return None,
    };
    Some([
        algorithm.kind().script_tag().into(),
        member,
        algorithm.shape().span.to_string(),
        at.to_string(),
    ])
}
