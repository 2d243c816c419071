//! Limiter places a request holds and gives back when it is dropped: queued leaky-bucket places and concurrency slots.

use std::sync::Arc;

use super::Gate;
use crate::clock::SharedClock;
use crate::limiter::Nanos;
use crate::snapshot::Snapshot;
use crate::store::Store;

/// Gives limiter places back when dropped: queued leaky-bucket places (only
/// if the request left before its turn) or concurrency slots (always).
/// Empty (and free: no handle is cloned) unless a place was taken.
#[derive(Default)]
pub struct Release {
    /// The store, clock and snapshot the places were taken on; it may be
    /// dropped after the request (with a tunnel, hours after).
    on: Option<(Arc<Store>, SharedClock, Arc<Snapshot>)>,
    only_before_ticket: bool,
    items: Vec<(usize, String, Nanos)>,
}

impl Release {
    pub(super) fn new(only_before_ticket: bool) -> Release {
        Release {
            on: None,
            only_before_ticket,
            items: Vec::new(),
        }
    }

    pub(super) fn push(
        &mut self,
        gate: &Gate<'_>,
        snap: &Arc<Snapshot>,
        limiter: usize,
        store_key: &str,
        ticket: Nanos,
    ) {
        if self.on.is_none() {
            self.on = Some((gate.store.clone(), gate.clock.clone(), snap.clone()));
        }
        self.items.push((limiter, store_key.to_string(), ticket));
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The request got its turn: nothing to give back.
    pub(super) fn disarm(&mut self) {
        self.items.clear();
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let Some((store, clock, snap)) = &self.on else {
            return;
        };
        if self.items.is_empty() {
            return;
        }
        let now = clock.now();
        for (limiter, store_key, ticket) in self.items.drain(..) {
            if self.only_before_ticket && now >= ticket {
                continue;
            }
            let l = &snap.limiters[limiter];
            let algorithm = l.algorithm_for(l.value_of(&store_key));
            store.release(&store_key, algorithm, ticket, now);
        }
    }
}
