//! What the table files a key under: a keyed 128-bit hash of the store key, not the key text.
//!
//! At a million clients the key strings (`per_key:key:<32 hex>`, 48 bytes
//! each with the allocator's rounding) cost almost as much as the buckets
//! that point at them. The table keeps two 64-bit SipHash-1-3 values of the
//! key instead, both under one random per-process key, one with a trailing
//! `0` byte and one with a `1` (two outputs of one keyed function on two
//! distinct inputs, so the halves are independent). Two distinct keys share
//! a slot only if both halves collide: for n keys about n² / 2¹²⁹, about
//! 1.5 × 10⁻²⁷ at a million keys, and without the process's random key a
//! client cannot search for a collision offline (the reason the hash is
//! keyed at all). Were it ever to happen, two clients would share one counter:
//! stricter for both, never an admission beyond a limit.
//!
//! The text is still needed where a key leaves the process: the SQLite
//! writer gets it with every change (the request that changed the key has
//! it), and finds the rows of keys memory forgot in the file itself.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};

/// A store key as the table files it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash {
    /// Hashes the key within its shard.
    low: u64,
    /// Chooses the shard (independent of `low`, so a shard's keys still spread over its buckets).
    high: u64,
}

impl KeyHash {
    /// The shard of `shards` this key lives in.
    pub fn shard(self, shards: usize) -> usize {
        (self.high % shards as u64) as usize
    }
}

impl Hash for KeyHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.low);
    }
}

/// Turns store keys into [`KeyHash`]es with this process's random key.
#[derive(Debug, Default)]
pub struct KeyHasher(RandomState);

impl KeyHasher {
    pub fn hash(&self, key: &str) -> KeyHash {
        // The key is absorbed once; each half finishes its own copy of
        // that state with its domain byte (half the rounds of two passes).
        let mut keyed = self.0.build_hasher();
        keyed.write(key.as_bytes());
        let half = |mut h: DefaultHasher, domain: u8| {
            h.write_u8(domain);
            h.finish()
        };
        KeyHash {
            low: half(keyed.clone(), 0),
            high: half(keyed, 1),
        }
    }
}

/// The map's hasher: a [`KeyHash`] is already a keyed hash, so it is used as is.
#[derive(Debug, Default, Clone, Copy)]
pub struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    /// Only [`KeyHash`] is hashed with this; anything else still gets a usable (if weak) hash.
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
}

pub type BuildPassThrough = BuildHasherDefault<PassThrough>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_hashes_alike_and_two_keys_apart() {
        let h = KeyHasher::default();
        assert_eq!(h.hash("l:ip:203.0.113.9"), h.hash("l:ip:203.0.113.9"));
        assert_ne!(h.hash("l:ip:203.0.113.9"), h.hash("l:ip:203.0.113.8"));
        let k = h.hash("l:key:3f2a");
        assert_ne!(k.low, k.high, "the halves are two hashes, not one twice");
    }

    #[test]
    fn two_processes_hash_a_key_differently() {
        let (a, b) = (KeyHasher::default(), KeyHasher::default());
        assert_ne!(a.hash("l:ip:203.0.113.9"), b.hash("l:ip:203.0.113.9"));
    }
}
