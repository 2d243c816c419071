//! What a token bucket with `count:` keeps so that a refund gives back exactly its token's unpaid part, never more.
//!
//! Places. Debt is repaid oldest first: the tokens owed form a queue, and a
//! token is paid off at its *place*, the instant the queue reaches its end.
//! A refund removes what is unpaid of its token, and every token behind it
//! moves up by that much. So a token's place is `tat` right after it was
//! taken, less what refunds of tokens *ahead* of it have given back since.
//!
//! Tickets are written in refund-free coordinates: a token's ticket place is
//! `tat` after it was taken plus [`Refunds::total`] then (what every refund
//! of this debt had given back by that time, all of it of tokens ahead of
//! it). Each refund leaves a *hole* at its token's ticket place, of the
//! size it gave back; a token's place now is its ticket place less the
//! holes ahead of it ([`Refunds::ahead_of`]). Holes of tokens behind it do
//! not count: that is what makes the answer exact whatever order the
//! answers come back in.
//!
//! Bounded: a hole that every token still owing is behind (its place has
//! passed) is folded into `base`; past [`MAX_HOLES`] the hole furthest ahead
//! is folded too, so it then counts for a few tokens ahead of it as well —
//! they read their place as earlier than it is and give back less, never
//! more. The newest token's refund (nothing was taken after it) moves nobody
//! and leaves no hole.

use super::Nanos;

/// Holes kept before the one furthest ahead is folded into `base`. The same
/// bound is written in `token_bucket.lua`.
pub const MAX_HOLES: usize = 8;

/// The refund bookkeeping of one debt: from the admission that found the
/// bucket full until it is full again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Refunds {
    /// The admission that found the bucket full and started this debt:
    /// tokens taken before it were paid off and give nothing back.
    pub since: Nanos,
    /// Everything refunds have taken off `tat` during this debt, in
    /// nanoseconds: folded (`base`) and in holes.
    pub total: Nanos,
    /// Refunds not folded yet: (ticket place, nanoseconds given back), by place.
    pub holes: Vec<(Nanos, Nanos)>,
}

impl Refunds {
    pub fn starting(since: Nanos) -> Refunds {
        Refunds {
            since,
            ..Refunds::default()
        }
    }

    /// What every token still owing is behind.
    fn base(&self) -> Nanos {
        let in_holes: Nanos = self.holes.iter().map(|h| h.1).sum();
        self.total.saturating_sub(in_holes)
    }

    /// How far refunds moved a token ticketed at `place`: the base and the
    /// holes ahead of it.
    pub fn ahead_of(&self, place: Nanos) -> Nanos {
        let holes: Nanos = self
            .holes
            .iter()
            .take_while(|h| h.0 < place)
            .map(|h| h.1)
            .sum();
        self.base().saturating_add(holes)
    }

    /// Folds the holes whose place has passed at `now`: the tokens ahead of
    /// them are paid off, so every token still owing is behind them.
    pub fn fold(&mut self, now: Nanos) {
        let mut base = self.base();
        let passed = self
            .holes
            .iter()
            .take_while(|&&(place, size)| {
                let passed = place.saturating_sub(base.saturating_add(size)) <= now;
                base = base.saturating_add(size);
                passed
            })
            .count();
        self.holes.drain(..passed);
    }

    /// A refund gave back `size` for the token ticketed at `place`; the
    /// newest token's leaves no hole.
    pub fn add(&mut self, place: Nanos, size: Nanos, newest: bool) {
        // The newest token has nothing behind it: no place to move.
        if size == 0 || newest {
            return;
        }
        self.total = self.total.saturating_add(size);
        let at = self.holes.partition_point(|h| h.0 < place);
        self.holes.insert(at, (place, size));
        if self.holes.len() > MAX_HOLES {
            // Folded into the base: it now counts for the few tokens ahead
            // of it too, which then give back less, never more.
            self.holes.remove(0);
        }
    }

    /// As stored: since, total, then each hole's place and size.
    pub fn words(&self, out: &mut Vec<u64>) {
        out.extend([self.since, self.total]);
        for &(place, size) in &self.holes {
            out.extend([place, size]);
        }
    }

    pub fn from_words(words: &[u64]) -> Option<Refunds> {
        let [since, total, holes @ ..] = words else {
            return None;
        };
        Some(Refunds {
            since: *since,
            total: *total,
            holes: holes.chunks_exact(2).map(|h| (h[0], h[1])).collect(),
        })
    }
}
