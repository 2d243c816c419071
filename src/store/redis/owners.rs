//! On a Redis Cluster: which primary serves each hash slot, and one circuit breaker per primary.
//!
//! One breaker for the whole store would let one dead primary (its slots
//! unserved) send every client to `on_error`, even those whose keys live on
//! healthy primaries. So on a cluster each call feeds the breaker of the
//! primary that serves its key's slot, and a request whose slot group lives on
//! a primary whose breaker is open applies `on_error` at once, while the
//! others keep counting in Redis. The slot map is the one `CLUSTER NODES`
//! showed the store's background probe (every probe interval): a failed
//! primary keeps its slots there until a replica takes them over, and then the
//! slots' new owner, with its own closed breaker, serves them. Lookups take no
//! lock (one `ArcSwap` load).

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::breaker_for_redis;
use super::breaker::Breaker;

/// Hash slots in a Redis Cluster.
pub const SLOTS: usize = 16_384;
/// A slot no primary serves (as far as the last probe saw).
const NOBODY: u16 = u16::MAX;

/// One primary: its address (`host:port`) and its breaker.
#[derive(Debug)]
pub(super) struct Owner {
    pub addr: String,
    pub breaker: Breaker,
}

/// The slot map the last probe saw.
#[derive(Default)]
struct SlotMap {
    /// Per slot, an index into `owners` (or [`NOBODY`]); empty before the first probe.
    slots: Vec<u16>,
    owners: Vec<Arc<Owner>>,
    /// Per owner, whether it serves any slot (a failed primary whose
    /// replica took its slots over is still listed, serving none).
    serving: Vec<bool>,
    /// What the probe read, to tell a changed map from the same one.
    served: Vec<(String, Vec<(u16, u16)>)>,
}

/// The slot owners of a cluster and their breakers (see the module docs).
#[derive(Default)]
pub(super) struct Owners {
    map: ArcSwap<SlotMap>,
}

impl Owners {
    /// The primary serving `key`'s slot; `None` before the first probe read the map,
    /// or when no primary serves it.
    pub fn of(&self, key: &str) -> Option<Arc<Owner>> {
        let map = self.map.load();
        let i = *map.slots.get(usize::from(slot(key.as_bytes())))?;
        map.owners.get(usize::from(i)).cloned()
    }

    /// The primary at `addr`, when the slot map lists it.
    pub fn at(&self, addr: &str) -> Option<Arc<Owner>> {
        let map = self.map.load();
        map.owners.iter().find(|o| o.addr == addr).cloned()
    }

    /// Takes the slot map a probe read: `(primary, its slot ranges)`. A primary
    /// already known keeps its breaker (and so its open or closed state).
    pub fn update(&self, served: &[(String, Vec<(u16, u16)>)]) {
        let old = self.map.load();
        if served.is_empty() || old.served == served {
            // The probe saw nothing, or the same: the last map stays.
            return;
        }
        let known: HashMap<&str, &Arc<Owner>> =
            old.owners.iter().map(|o| (o.addr.as_str(), o)).collect();
        let mut slots = vec![NOBODY; SLOTS];
        let mut owners = Vec::with_capacity(served.len());
        let mut serving = Vec::with_capacity(served.len());
        for (addr, ranges) in served {
            let owner = known.get(addr.as_str()).map_or_else(
                || {
                    Arc::new(Owner {
                        addr: addr.clone(),
                        breaker: breaker_for_redis(),
                    })
                },
                |o| Arc::clone(o),
            );
            let index = owners.len() as u16;
            owners.push(owner);
            serving.push(!ranges.is_empty());
            for &(from, to) in ranges {
                let (from, to) = (usize::from(from), usize::from(to).min(SLOTS - 1));
                if from <= to {
                    slots[from..=to].fill(index);
                }
            }
        }
        self.map.store(Arc::new(SlotMap {
            slots,
            owners,
            serving,
            served: served.to_vec(),
        }));
    }

    /// Every known primary.
    pub fn all(&self) -> Vec<Arc<Owner>> {
        self.map.load().owners.clone()
    }

    /// Whether the breaker of any primary that serves slots is open (one
    /// that serves none decides no request, however dead it is).
    pub fn any_open(&self) -> bool {
        let map = self.map.load();
        map.owners
            .iter()
            .zip(&map.serving)
            .any(|(o, &serving)| serving && o.breaker.is_open())
    }
}

/// The hash slot of a Redis key: CRC16 (XMODEM) of its hash tag, or of the
/// whole key when it has none, modulo 16384 — as Redis Cluster computes it.
pub fn slot(key: &[u8]) -> u16 {
    (crc16(hash_tag(key).unwrap_or(key)) as usize % SLOTS) as u16
}

/// What is between the first `{` and the next `}`, when that is not empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::redis::cluster_routing::Slot;

    #[test]
    fn the_slot_of_a_key_is_the_one_redis_computes() {
        // The check value of CRC16/XMODEM, as the Redis Cluster spec gives it.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        for key in [
            "tollgate:{ip:203.0.113.9}strict:ip:203.0.113.9",
            "no tag at all",
            "{}empty tag hashes the whole key",
            "a{b}{c}",
            "",
        ] {
            assert_eq!(
                Slot::new(slot(key.as_bytes())),
                Some(Slot::for_key(key)),
                "{key}"
            );
        }
    }

    #[test]
    fn a_primary_keeps_its_breaker_when_the_map_is_read_again() {
        let owners = Owners::default();
        assert!(owners.of("k").is_none(), "nothing is known before a probe");
        let k = slot(b"k");
        owners.update(&[
            ("a:1".into(), vec![(0, k)]),
            ("b:2".into(), vec![(k + 1, 16383)]),
        ]);
        let a = owners.of("k").expect("a serves k");
        assert_eq!(a.addr, "a:1");
        a.breaker.trip();
        assert!(owners.any_open());
        owners.update(&[("a:1".into(), vec![(0, 16383)])]);
        assert!(owners.of("k").unwrap().breaker.is_open(), "still open");
        owners.update(&[]);
        assert_eq!(owners.all().len(), 1, "an empty probe keeps the last map");
    }

    #[test]
    fn a_slot_that_moved_is_served_by_its_new_owner_and_its_breaker() {
        let owners = Owners::default();
        let k = slot(b"k");
        owners.update(&[("a:1".into(), vec![(0, 16383)])]);
        owners.of("k").unwrap().breaker.trip();
        owners.update(&[("a:1".into(), vec![]), ("b:2".into(), vec![(k, k)])]);
        let now = owners.of("k").expect("b serves k now");
        assert_eq!(now.addr, "b:2");
        assert!(now.breaker.allows());
        assert!(
            !owners.any_open(),
            "a's breaker is open, but a serves no slot any more"
        );
        assert_ne!(slot(b"another key"), k);
        assert!(owners.of("another key").is_none(), "a slot nobody serves");
    }
}
