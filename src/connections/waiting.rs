//! Who gives way at `server.max_connections`: the connections with no request in progress, per client address, ranked so a newcomer displaces a flood's connection before a client that behaves.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Activity;

/// What a connection with nothing in progress is waiting for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Its first complete request head (it may have sent part of one).
    Head = 0,
    /// Its next request, after at least one finished.
    Between = 1,
}

/// The connections with no request in progress, per client address (IPv6
/// by its /64), and the addresses ranked by which gives up a connection
/// first. Each connection is filed with a sequence number taken when it
/// was filed, at accept (waiting for its first head) or when its last
/// request ended (waiting for the next). Every change to a connection's
/// place here is made under the one lock, so a connection is displaced at
/// most once, and never after it started a request or closed.
///
/// Why the address comes first, before "never completed a request": with
/// the cap full of a flood's connections idle between requests, a
/// newcomer waiting for its first head would otherwise be the one the next
/// newcomer displaces, before it had a chance to send its request (a test
/// measured 26 of 200 probes served that way); counted per address, the
/// flood's own connections go first. Its limit: a flood spread over as
/// many addresses as the cap, each connection completing requests, cannot
/// be told from clients (see docs/RELIABILITY.md).
#[derive(Default)]
pub(super) struct Waiting {
    next: u64,
    /// Every address with a connection open (a displaced one until it
    /// closes): about `max_connections` at most.
    /// foldhash, seeded per process, not SipHash: every request's start and
    /// end looks its address up (see benches/connection_registry.rs).
    addresses: HashMap<IpAddr, Idle, foldhash::fast::RandomState>,
    /// One entry per address with a connection in `Idle::waiting`, by its
    /// [`rank`]; the last gives up a connection first.
    ranked: BTreeMap<u128, IpAddr>,
}

/// One address's open connections, and those with no request in progress.
#[derive(Default)]
struct Idle {
    /// Its connections open, busy or not: the entry goes with the last.
    open: usize,
    /// With nothing in progress, by (requests completed, sequence number):
    /// those that never completed a request first, then the fewest
    /// completed, then the one waiting longest.
    waiting: BTreeMap<(u64, u64), Arc<Activity>>,
}

/// Where an address stands among those a newcomer may take a place from;
/// the greatest gives up a connection first: the most connections with
/// nothing in progress, then (as many) the fewest requests completed on
/// the one it gives up first (none: never completed a request), then the
/// one filed earliest. Packed in one integer, unique by the sequence
/// number: the ranking is updated at every request's start and end, and
/// comparing a struct of four fields there cost a third of that path
/// (callgrind, benches/connection_registry.rs).
fn rank(idle: &Idle) -> Option<u128> {
    let (&(completed, seq), _) = idle.waiting.first_key_value()?;
    let held = u32::try_from(idle.waiting.len()).unwrap_or(u32::MAX);
    let fewer = u32::MAX - u32::try_from(completed).unwrap_or(u32::MAX);
    Some(u128::from(held) << 96 | u128::from(fewer) << 64 | u128::from(u64::MAX - seq))
}

impl Waiting {
    /// Changes `ip`'s connections with `f`, keeping its rank in step.
    fn change<T>(&mut self, ip: IpAddr, f: impl FnOnce(&mut Idle) -> T) -> T {
        let idle = self.addresses.entry(ip).or_default();
        if let Some(rank) = rank(idle) {
            self.ranked.remove(&rank);
        }
        let out = f(idle);
        if let Some(rank) = rank(idle) {
            self.ranked.insert(rank, ip);
        }
        out
    }

    /// A connection admitted: counted for its address, and filed.
    pub(super) fn opened(&mut self, activity: &Arc<Activity>) {
        self.addresses.entry(activity.ip).or_default().open += 1;
        self.file(activity);
    }

    /// A connection closed: out of the waiting, and its address forgotten
    /// with its last connection.
    pub(super) fn closed(&mut self, activity: &Activity) {
        self.unfile(activity);
        if let Some(idle) = self.addresses.get_mut(&activity.ip) {
            idle.open = idle.open.saturating_sub(1);
            if idle.open == 0 {
                // Its last connection was just unfiled: no rank to remove.
                self.addresses.remove(&activity.ip);
            }
        }
    }

    pub(super) fn file(&mut self, activity: &Arc<Activity>) {
        self.next += 1;
        let seq = self.next;
        let completed = activity.completed.load(Ordering::Relaxed);
        let a = activity.clone();
        self.change(activity.ip, |idle| idle.waiting.insert((completed, seq), a));
        activity.filed.store(seq, Ordering::Relaxed);
    }

    pub(super) fn unfile(&mut self, activity: &Activity) {
        let seq = activity.filed.swap(0, Ordering::Relaxed);
        if seq == 0 {
            return;
        }
        // `completed` changes only while a connection is not filed.
        let completed = activity.completed.load(Ordering::Relaxed);
        self.change(activity.ip, |idle| idle.waiting.remove(&(completed, seq)));
    }

    /// Takes the connection to displace: from the highest [`rank`]ed
    /// address, one that never completed a request first, then the one
    /// with the fewest requests completed, then the one waiting longest.
    pub(super) fn victim(&mut self) -> Option<(Arc<Activity>, Stage)> {
        let (_, &ip) = self.ranked.last_key_value()?;
        let ((completed, _), activity) = self.change(ip, |idle| idle.waiting.pop_first())?;
        activity.filed.store(0, Ordering::Relaxed);
        let stage = if completed == 0 {
            Stage::Head
        } else {
            Stage::Between
        };
        Some((activity, stage))
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::super::{Connections, Permit};
    use crate::metrics::Metrics;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4((0xc633_6400 + n).into()) // 198.51.100.0 + n
    }

    fn displaced(p: &Permit) -> bool {
        p.activity.displaced.is_cancelled()
    }

    /// `n` requests completed on `p`, which is then idle between requests.
    fn served(p: &Permit, n: usize) {
        for _ in 0..n {
            drop(p.activity().request());
        }
    }

    #[test]
    fn the_address_holding_the_most_gives_way_first_and_its_silent_connections_before_its_served_one(
    ) {
        let c = Connections::new(&Metrics::default());
        let cap = 4;
        let client = c.admit(ip(1), cap, None).unwrap();
        served(&client, 3);
        let flood: Vec<Permit> = (0..3).map(|_| c.admit(ip(2), cap, None).unwrap()).collect();
        served(&flood[0], 1);
        let _n1 = c.admit(ip(3), cap, None).unwrap();
        assert!(displaced(&flood[1]), "the flood's oldest silent connection");
        let _n2 = c.admit(ip(4), cap, None).unwrap();
        assert!(displaced(&flood[2]));
        assert!(!displaced(&flood[0]) && !displaced(&client));
    }

    #[test]
    fn a_client_holding_one_served_connection_is_displaced_last() {
        let c = Connections::new(&Metrics::default());
        let cap = 3;
        let client = c.admit(ip(1), cap, None).unwrap();
        served(&client, 2);
        // One served connection from another address, with fewer requests completed.
        let other = c.admit(ip(2), cap, None).unwrap();
        served(&other, 1);
        let mut newcomers = Vec::new();
        for n in 0..100 {
            newcomers.push(c.admit(ip(10 + n), cap, None).unwrap());
            newcomers.retain(|p| !displaced(p));
        }
        assert!(
            !displaced(&client) && !displaced(&other),
            "newcomers give way to each other"
        );
        // With the newcomers busy, `other` (fewer requests) goes before `client`.
        let _busy: Vec<_> = newcomers.iter().map(|p| p.activity().request()).collect();
        let _a = c.admit(ip(500), cap, None).unwrap();
        assert!(displaced(&other) && !displaced(&client));
        let _b = c.admit(ip(501), cap, None).unwrap();
        assert!(displaced(&_a), "the newcomer that never sent a request");
        assert!(!displaced(&client));
    }

    #[test]
    fn an_address_is_forgotten_with_its_last_connection() {
        let c = Connections::new(&Metrics::default());
        let permits: Vec<Permit> = (0..10)
            .map(|n| c.admit(ip(n % 3), 5, None).unwrap())
            .collect();
        served(&permits[9], 1);
        assert!(c.waiting.lock().addresses.len() <= 3);
        drop(permits);
        let waiting = c.waiting.lock();
        assert!(waiting.addresses.is_empty() && waiting.ranked.is_empty());
    }
}
