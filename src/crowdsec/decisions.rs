//! The CrowdSec decisions held: one hash table keyed by (family, prefix length, network), so an address is checked with at most one probe per prefix length in use, and each decision keeps its expiry.
//!
//! An `Ip` decision is a range of full length (/32, /128). A lookup masks
//! the address to each prefix length that has decisions (IPv4 and IPv6
//! apart; usually a handful: /32, /24, /128, /64) and probes once per
//! length: a bounded number of hash probes whatever the number of
//! decisions, with no tree to walk. One decision is kept per address or
//! range, the strongest (a ban over a captcha, then the later end); a
//! deletion removes it only if it is that decision (by id), so a deleted
//! captcha never lifts a ban on the same range. At most `max` are held:
//! past it new ones are dropped (and counted by the caller).

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::limiter::Nanos;

/// What a decision asks of tollgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Remedy {
    /// The proof-of-work page for a browser without a pass; refused otherwise.
    Captcha = 0,
    /// Refused outright.
    Ban = 1,
}

impl Remedy {
    pub const ALL: [Remedy; 2] = [Remedy::Captcha, Remedy::Ban];

    /// CrowdSec's spelling (`type`), also the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Remedy::Captcha => "captcha",
            Remedy::Ban => "ban",
        }
    }

    pub fn parse(s: &str) -> Option<Remedy> {
        match s {
            "ban" => Some(Remedy::Ban),
            "captcha" => Some(Remedy::Captcha),
            _ => None,
        }
    }
}

/// An address or range: the family, the prefix length, the network's bits (left-aligned in a u128).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct NetKey {
    v6: bool,
    len: u8,
    bits: u128,
}

impl NetKey {
    fn of(net: IpNet) -> NetKey {
        let net = net.trunc();
        match net {
            IpNet::V4(n) => NetKey {
                v6: false,
                len: n.prefix_len(),
                bits: u128::from(u32::from(n.network())) << 96,
            },
            IpNet::V6(n) => NetKey {
                v6: true,
                len: n.prefix_len(),
                bits: u128::from(n.network()),
            },
        }
    }

    /// `ip`'s network of `len` bits (`ip`: IPv4 left-aligned like a key's).
    fn masked(v6: bool, bits: u128, len: u8) -> NetKey {
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(len))
        };
        NetKey {
            v6,
            len,
            bits: bits & mask,
        }
    }
}

/// One decision as held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The Local API's id, to match its deletion.
    pub id: i64,
    pub remedy: Remedy,
    /// When it expires (Unix ns).
    pub until: Nanos,
}

impl Held {
    /// Whether `self` should stand over `other` on the same address.
    fn outranks(&self, other: &Held) -> bool {
        (self.remedy, self.until) > (other.remedy, other.until)
    }
}

/// What adding one decision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Held,
    /// A stronger decision on the same address stays.
    Outranked,
    /// The table is full.
    Dropped,
}

/// The decisions in force.
pub struct DecisionTable {
    entries: HashMap<NetKey, Held>,
    /// Decisions per prefix length, IPv4 (`[0]`, lengths 0..=32) and IPv6 (`[1]`, 0..=128).
    lengths: [[u32; 129]; 2],
    /// The prefix lengths in use, longest first, per family.
    in_use: [Vec<u8>; 2],
    max: usize,
}

impl DecisionTable {
    pub fn new(max: usize) -> DecisionTable {
        DecisionTable {
            entries: HashMap::new(),
            lengths: [[0; 129]; 2],
            in_use: [Vec::new(), Vec::new()],
            max,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Holds one decision on `net` (IPv4-mapped IPv6 is IPv4).
    pub fn add(&mut self, net: IpNet, held: Held) -> Added {
        let key = NetKey::of(canonical_net(net));
        let full = self.entries.len() >= self.max;
        match self.entries.get_mut(&key) {
            Some(old) if held.id == old.id || held.outranks(old) => {
                *old = held;
                Added::Held
            }
            Some(_) => Added::Outranked,
            None if full => Added::Dropped,
            None => {
                self.entries.insert(key, held);
                self.counted(key, true);
                Added::Held
            }
        }
    }

    /// Removes the decision `id` on `net`; `false` when another one (or none) stands there.
    pub fn remove(&mut self, net: IpNet, id: i64) -> bool {
        let key = NetKey::of(canonical_net(net));
        if self.entries.get(&key).is_some_and(|h| h.id == id) {
            self.entries.remove(&key);
            self.counted(key, false);
            return true;
        }
        false
    }

    /// Drops every decision that has expired by `now`; how many.
    pub fn sweep(&mut self, now: Nanos) -> usize {
        let expired: Vec<NetKey> = self
            .entries
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in &expired {
            self.entries.remove(key);
            self.counted(*key, false);
        }
        expired.len()
    }

    /// The strongest decision in force on `ip` at `now`.
    pub fn check(&self, ip: IpAddr, now: Nanos) -> Option<Held> {
        let (v6, bits) = match canonical(ip) {
            IpAddr::V4(v4) => (false, u128::from(u32::from(v4)) << 96),
            IpAddr::V6(v6) => (true, u128::from(v6)),
        };
        let mut found: Option<Held> = None;
        for &len in &self.in_use[usize::from(v6)] {
            let Some(held) = self.entries.get(&NetKey::masked(v6, bits, len)) else {
                continue;
            };
            if held.until > now && found.is_none_or(|f| held.outranks(&f)) {
                found = Some(*held);
            }
        }
        found
    }

    /// Every decision, for a full resync: replaced at once.
    pub fn clear(&mut self) {
        *self = DecisionTable::new(self.max);
    }

    fn counted(&mut self, key: NetKey, added: bool) {
        let family = usize::from(key.v6);
        let n = &mut self.lengths[family][usize::from(key.len)];
        let was = *n;
        if added {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        // The list changes only when a length comes into use or goes out of it.
        if (was == 0) == (*n == 0) {
            return;
        }
        let in_use: Vec<u8> = (0..=128u8)
            .rev()
            .filter(|&l| self.lengths[family][usize::from(l)] > 0)
            .collect();
        self.in_use[family] = in_use;
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `::ffff:198.51.100.0/120` is `198.51.100.0/24`.
fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(n) if n.prefix_len() >= 96 => match n.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, n.prefix_len() - 96).map_or(net, IpNet::V4),
            None => net,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Nanos = 1_000_000_000_000;
    const HOUR: Nanos = 3_600_000_000_000;

    fn held(id: i64, remedy: Remedy, until: Nanos) -> Held {
        Held { id, remedy, until }
    }

    fn net(s: &str) -> IpNet {
        s.parse()
            .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
            .unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_is_found_by_its_own_decision_or_a_range_around_it() {
        let mut t = DecisionTable::new(100);
        t.add(net("203.0.113.7"), held(1, Remedy::Ban, NOW + HOUR));
        t.add(net("198.51.100.0/24"), held(2, Remedy::Captcha, NOW + HOUR));
        t.add(net("2001:db8:1::/48"), held(3, Remedy::Ban, NOW + HOUR));
        assert_eq!(t.check(ip("203.0.113.7"), NOW).map(|h| h.id), Some(1));
        assert_eq!(t.check(ip("203.0.113.8"), NOW), None);
        assert_eq!(
            t.check(ip("198.51.100.200"), NOW).map(|h| h.remedy),
            Some(Remedy::Captcha)
        );
        assert_eq!(
            t.check(ip("::ffff:198.51.100.9"), NOW).map(|h| h.id),
            Some(2)
        );
        assert_eq!(
            t.check(ip("2001:db8:1:ffff::1"), NOW).map(|h| h.id),
            Some(3)
        );
        assert_eq!(t.check(ip("2001:db8:2::1"), NOW), None);
    }

    #[test]
    fn a_ban_outranks_a_captcha_and_an_expired_decision_is_gone() {
        let mut t = DecisionTable::new(100);
        t.add(net("198.51.100.0/24"), held(1, Remedy::Captcha, NOW + HOUR));
        t.add(net("198.51.100.7"), held(2, Remedy::Ban, NOW + 1));
        assert_eq!(
            t.check(ip("198.51.100.7"), NOW).map(|h| h.remedy),
            Some(Remedy::Ban)
        );
        assert_eq!(
            t.check(ip("198.51.100.7"), NOW + 1).map(|h| h.remedy),
            Some(Remedy::Captcha)
        );
        assert_eq!(t.sweep(NOW + 1), 1);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_deletion_lifts_only_the_decision_it_names() {
        let mut t = DecisionTable::new(100);
        t.add(net("203.0.113.7"), held(1, Remedy::Ban, NOW + HOUR));
        assert_eq!(
            t.add(net("203.0.113.7"), held(2, Remedy::Captcha, NOW + 2 * HOUR)),
            Added::Outranked
        );
        assert!(!t.remove(net("203.0.113.7"), 2));
        assert!(t.check(ip("203.0.113.7"), NOW).is_some());
        assert!(t.remove(net("203.0.113.7"), 1));
        assert_eq!(t.check(ip("203.0.113.7"), NOW), None);
        assert!(t.in_use[0].is_empty(), "no length left to probe");
    }

    #[test]
    fn a_full_table_drops_new_decisions_and_keeps_the_ones_it_has() {
        let mut t = DecisionTable::new(2);
        assert_eq!(
            t.add(net("192.0.2.1"), held(1, Remedy::Ban, NOW + HOUR)),
            Added::Held
        );
        assert_eq!(
            t.add(net("192.0.2.2"), held(2, Remedy::Ban, NOW + HOUR)),
            Added::Held
        );
        assert_eq!(
            t.add(net("192.0.2.3"), held(3, Remedy::Ban, NOW + HOUR)),
            Added::Dropped
        );
        assert_eq!(
            t.add(net("192.0.2.1"), held(4, Remedy::Ban, NOW + 2 * HOUR)),
            Added::Held
        );
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_zero_length_range_covers_its_whole_family_only() {
        let mut t = DecisionTable::new(10);
        t.add(net("0.0.0.0/0"), held(1, Remedy::Captcha, NOW + HOUR));
        assert!(t.check(ip("8.8.8.8"), NOW).is_some());
        assert!(t.check(ip("2001:db8::1"), NOW).is_none());
    }
}
