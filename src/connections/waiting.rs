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
///
/// The ranking is kept only from half the cap up: below it no newcomer
/// can need a place, and a request's start and end then touch no lock
/// (benches/connection_registry.rs measures both). When the open
/// connections reach half the last admission's cap, it is built from
/// [`Waiting::open`] in one pass; below a quarter, it is dropped. The gap
/// between the two keeps a count that hovers at one threshold from
/// building it over and over.
#[derive(Default)]
pub(super) struct Waiting {
    next: u64,
    /// Every connection open (a displaced one until it closes), by its
    /// address in memory: what the ranking is built from.
    open: HashMap<usize, Arc<Activity>, foldhash::fast::RandomState>,
    /// Whether `addresses` and `ranked` are kept (mirrored in
    /// `Connections::ranking`, which is read without this lock).
    ranking: bool,
    /// The cap the last connection was admitted under (a reload may change it).
    cap: usize,
    /// While ranking, every address with a connection open (a displaced one
    /// until it closes): about `max_connections` at most.
    /// foldhash, seeded per process, not SipHash: every request's start and
    /// end looks its address up while ranking.
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

    /// A connection admitted: kept among the open ones and, while ranking,
    /// counted for its address and filed.
    pub(super) fn opened(&mut self, activity: &Arc<Activity>) {
        self.open.insert(key(activity), activity.clone());
        if self.ranking {
            self.counted(activity);
        }
    }

    /// Counted for its address, and filed unless something is in progress on it.
    fn counted(&mut self, activity: &Arc<Activity>) {
        self.addresses.entry(activity.ip).or_default().open += 1;
        self.file_idle(activity);
    }

    /// A connection closed: out of the open ones and the waiting, and its
    /// address forgotten with its last connection.
    pub(super) fn closed(&mut self, activity: &Activity) {
        self.open.remove(&key(activity));
        self.unfile(activity);
        if let Some(idle) = self.addresses.get_mut(&activity.ip) {
            idle.open = idle.open.saturating_sub(1);
            if idle.open == 0 {
                // Its last connection was just unfiled: no rank to remove.
                self.addresses.remove(&activity.ip);
            }
        }
    }

    /// Notes the cap a connection is being admitted under (what
    /// [`Waiting::should_stop`] compares with); true when the ranking should
    /// be built first: with the newcomer, half the cap is open.
    pub(super) fn admitting(&mut self, cap: usize) -> bool {
        self.cap = cap;
        !self.ranking && self.open.len() + 1 >= cap.div_ceil(2)
    }

    /// Builds the ranking from every open connection. The caller has set
    /// `Connections::ranking` first (see `Activity::request`).
    pub(super) fn start(&mut self) {
        self.ranking = true;
        let open: Vec<Arc<Activity>> = self.open.values().cloned().collect();
        for activity in &open {
            self.counted(activity);
        }
    }

    /// Whether the ranking should be dropped: under a quarter of the cap is open.
    pub(super) fn should_stop(&self) -> bool {
        self.ranking && self.open.len() < self.cap / 4
    }

    /// Drops the ranking: nothing is filed any more. The caller has cleared
    /// `Connections::ranking`; a request that read it set before waits for
    /// the lock and then finds nothing filed and nothing to file.
    pub(super) fn stop(&mut self) {
        self.ranking = false;
        for idle in self.addresses.values() {
            for activity in idle.waiting.values() {
                activity.filed.store(0, Ordering::Relaxed);
            }
        }
        self.addresses.clear();
        self.ranked.clear();
    }

    /// Files a connection that has nothing in progress, is not filed yet, and
    /// is neither closed nor displaced; nothing is filed while not ranking.
    pub(super) fn file_idle(&mut self, activity: &Arc<Activity>) {
        if self.ranking
            && activity.filed.load(Ordering::Relaxed) == 0
            && activity.busy.load(Ordering::SeqCst) == 0
            && !activity.closed.load(Ordering::Relaxed)
            && !activity.displaced.is_cancelled()
        {
            self.file(activity);
        }
    }

    fn file(&mut self, activity: &Arc<Activity>) {
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
        loop {
            let (_, &ip) = self.ranked.last_key_value()?;
            let ((completed, _), activity) = self.change(ip, |idle| idle.waiting.pop_first())?;
            activity.filed.store(0, Ordering::Relaxed);
            // A request started on it and waits for the lock to unfile it
            // (see `Activity::request`): it is busy, and stays unfiled.
            if activity.busy.load(Ordering::SeqCst) > 0 {
                continue;
            }
            let stage = if completed == 0 {
                Stage::Head
            } else {
                Stage::Between
            };
            return Some((activity, stage));
        }
    }
}

/// A connection's key among the open ones: where its activity lives, unique while it is open.
fn key(activity: &Activity) -> usize {
    std::ptr::from_ref(activity) as usize
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::sync::atomic::Ordering;

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

    fn ranking(c: &Connections) -> bool {
        let flag = c.ranking.load(Ordering::SeqCst);
        assert_eq!(
            flag,
            c.waiting.lock().ranking,
            "the flag mirrors the registry"
        );
        flag
    }

    fn filed(p: &Permit) -> bool {
        p.activity.filed.load(Ordering::Relaxed) != 0
    }

    #[test]
    fn below_half_the_cap_nothing_is_ranked_and_requests_leave_the_registry_alone() {
        let c = Connections::new(&Metrics::default());
        let permits: Vec<Permit> = (0..4).map(|n| c.admit(ip(n), 10, None).unwrap()).collect();
        for p in &permits {
            drop(p.activity().request());
        }
        assert!(!ranking(&c));
        assert!(permits.iter().all(|p| !filed(p)));
        let waiting = c.waiting.lock();
        assert!(waiting.addresses.is_empty() && waiting.ranked.is_empty());
        assert_eq!(
            waiting.open.len(),
            4,
            "every open connection is still known"
        );
    }

    #[test]
    fn at_half_the_cap_the_ranking_is_built_from_every_idle_connection_and_a_busy_one_joins_when_its_request_ends(
    ) {
        let c = Connections::new(&Metrics::default());
        let served = c.admit(ip(1), 8, None).unwrap();
        drop(served.activity().request());
        let busy = c.admit(ip(2), 8, None).unwrap();
        let request = busy.activity().request();
        let silent = c.admit(ip(3), 8, None).unwrap();
        assert!(!ranking(&c));
        // The fourth of eight: half the cap.
        let fourth = c.admit(ip(4), 8, None).unwrap();
        assert!(ranking(&c));
        assert!(filed(&served) && filed(&silent) && filed(&fourth));
        assert!(
            !filed(&busy),
            "a connection with a request in progress is not filed"
        );
        assert_eq!(
            c.waiting.lock().addresses.len(),
            4,
            "every address is counted"
        );
        drop(request);
        assert!(filed(&busy), "filed when its request ended");
        // At the cap the newcomers displace the silent ones first.
        let rest: Vec<Permit> = (5..9).map(|n| c.admit(ip(n), 8, None).unwrap()).collect();
        let newcomer = c.admit(ip(20), 8, None).unwrap();
        assert!(silent.activity.displaced.is_cancelled());
        assert!(
            !served.activity.displaced.is_cancelled() && !busy.activity.displaced.is_cancelled()
        );
        drop((rest, newcomer));
    }

    #[test]
    fn below_a_quarter_of_the_cap_the_ranking_is_dropped_and_at_half_it_is_built_again() {
        let c = Connections::new(&Metrics::default());
        let mut permits: Vec<Permit> = (0..4).map(|n| c.admit(ip(n), 8, None).unwrap()).collect();
        assert!(ranking(&c));
        permits.truncate(2);
        assert!(ranking(&c), "two of eight is not below a quarter");
        permits.truncate(1);
        assert!(!ranking(&c));
        assert!(!filed(&permits[0]), "nothing stays filed");
        {
            let waiting = c.waiting.lock();
            assert!(waiting.addresses.is_empty() && waiting.ranked.is_empty());
        }
        drop(permits[0].activity().request());
        permits.extend((10..13).map(|n| c.admit(ip(n), 8, None).unwrap()));
        assert!(ranking(&c));
        assert!(
            permits.iter().all(filed),
            "the one left open is filed again"
        );
    }

    #[test]
    fn a_cap_lowered_by_a_reload_below_the_open_connections_still_lets_a_newcomer_displace_one() {
        let c = Connections::new(&Metrics::default());
        let idle: Vec<Permit> = (0..10)
            .map(|n| c.admit(ip(n), 100, None).unwrap())
            .collect();
        assert!(!ranking(&c));
        let newcomer = c
            .admit(ip(50), 10, None)
            .expect("an idle connection gives way");
        assert_eq!(
            idle.iter()
                .filter(|p| p.activity.displaced.is_cancelled())
                .count(),
            1
        );
        drop(newcomer);
    }
}
