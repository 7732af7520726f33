//! Handshake times learned per destination address (seed 003 section
//! 3.6.2: "as AS addresses are from a limited set only, the TCP hacker may
//! learn the average RTT"). Each answer to a first SYN is a sample,
//! smoothed with RFC 6298's gain of 1/8; the table holds at most
//! `MAX_DESTINATIONS` per worker, and a destination beyond them keeps the
//! default interval.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::LearnedHandshake;

const MAX_DESTINATIONS: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Smoothed {
    ns: u64,
    samples: u32,
}

/// Destination addresses are few and chosen by the operator's
/// configuration, not by outsiders: a multiplicative hash is enough.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = (u64::from(v) ^ self.0).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    }
}

#[derive(Default)]
pub(super) struct Learned {
    by_destination: HashMap<u32, Smoothed, BuildHasherDefault<AddressHasher>>,
}

impl Learned {
    pub fn sample(&mut self, destination: u32, ns: u64) {
        if let Some(s) = self.by_destination.get_mut(&destination) {
            // srtt += (sample - srtt) / 8
            s.ns = (s.ns as i128 + (i128::from(ns) - s.ns as i128) / 8) as u64;
            s.samples = s.samples.saturating_add(1);
        } else if self.by_destination.len() < MAX_DESTINATIONS {
            self.by_destination.insert(destination, Smoothed { ns, samples: 1 });
        }
    }

    /// The learned handshake time of `destination`, if any.
    pub fn get(&self, destination: u32) -> Option<u64> {
        if self.by_destination.is_empty() {
            return None;
        }
        self.by_destination.get(&destination).map(|s| s.ns)
    }

    /// Every learned destination, by address.
    pub fn all(&self) -> Vec<LearnedHandshake> {
        let mut v: Vec<LearnedHandshake> = self.by_destination.iter().map(|(&destination, s)| LearnedHandshake { destination, handshake_ns: s.ns, samples: s.samples }).collect();
        v.sort_unstable_by_key(|l| l.destination);
        v
    }

    pub fn memory_bytes(&self) -> usize {
        self.by_destination.capacity() * (core::mem::size_of::<(u32, Smoothed)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_sample_is_taken_whole_then_smoothed_by_an_eighth() {
        let mut l = Learned::default();
        assert_eq!(l.get(7), None);
        l.sample(7, 80_000_000);
        assert_eq!(l.get(7), Some(80_000_000));
        l.sample(7, 160_000_000);
        assert_eq!(l.get(7), Some(90_000_000));
        l.sample(7, 10_000_000);
        assert_eq!(l.get(7), Some(80_000_000));
        assert_eq!(l.all(), [LearnedHandshake { destination: 7, handshake_ns: 80_000_000, samples: 3 }]);
    }
}
