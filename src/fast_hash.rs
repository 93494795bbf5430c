//! Hash maps keyed by oids and addresses, hashed by one multiplication.
//!
//! They are asked on every guarded statement (the registry once per
//! guarded scan: a hundred partitions, a hundred times), where SipHash
//! showed in profiles; nothing hashed here is chosen by a user.

use std::collections::HashMap;

#[derive(Default)]
pub struct MulHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl std::hash::Hasher for MulHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(K);
    }
    fn write_usize(&mut self, n: usize) {
        // Addresses are 8-aligned: their low bits say nothing.
        self.0 = ((n as u64) >> 3).wrapping_mul(K);
    }
}

pub type Map<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<MulHasher>>;
