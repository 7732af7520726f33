//! Handshake times learned per destination address (seed 003 section
//! 3.6.2: "as AS addresses are from a limited set only, the TCP hacker may
//! learn the average RTT"), and the interval of 1.5 times one that
//! `interval = "rtt"` sends copies at. Each answer to a first SYN alone is
//! a sample (Karn's rule: after a copy, an answer may be to either SYN),
//! smoothed with RFC 6298's gain of 1/8; the table holds at most
//! `MAX_DESTINATIONS` per worker, and a destination beyond them keeps the
//! default interval.
//!
//! Karn's rule alone would lock a destination out once its path got
//! slower: every answer then comes after a copy, so no sample is ever taken
//! again, and every attempt is reset before its answer. As RFC 6298 section
//! 5 does, each reset at a deadline doubles the destination's interval, up
//! to the default interval (or the learned one where that is longer): the
//! doublings never make natrix slower to give up than the default schedule
//! or the undoubled learned one, whichever is longer. A sample keeps the
//! doublings that still cover 1.5 times it, since the smoothed time moves
//! only an eighth of the way to it (and never adds any).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::{LearnedHandshake, SynAccelConfig};

const MAX_DESTINATIONS: usize = 4096;

/// Doublings of a destination's interval at most: 2^16 times the floor is
/// past any default, and no shift overflows.
const MAX_BACKOFF: u8 = 16;

#[derive(Debug, Clone, Copy)]
struct Smoothed {
    ns: u64,
    samples: u32,
    /// Resets since the last sample: the interval's doublings.
    backoff: u8,
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

/// 1.5 times a handshake time, at least the floor.
fn base_interval(handshake_ns: u64) -> u64 {
    (handshake_ns * 3 / 2).max(SynAccelConfig::MIN_INTERVAL_NS)
}

/// The fewest doublings of `base` that reach `need`.
fn doublings_to_cover(base: u64, need: u64) -> u8 {
    (0..MAX_BACKOFF).find(|&k| base << k >= need).unwrap_or(MAX_BACKOFF)
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
            // The smoothed time moves an eighth of the way: a backed-off
            // interval keeps the doublings that still cover 1.5 x this
            // sample, so a path that became slower is not refused while
            // the average catches up.
            s.backoff = s.backoff.min(doublings_to_cover(base_interval(s.ns), ns * 3 / 2));
        } else if self.by_destination.len() < MAX_DESTINATIONS {
            self.by_destination.insert(destination, Smoothed { ns, samples: 1, backoff: 0 });
        }
    }

    /// An attempt to `destination` went unanswered to its deadline: its
    /// next attempts wait twice as long between SYNs, until a sample.
    pub fn back_off(&mut self, destination: u32) {
        if let Some(s) = self.by_destination.get_mut(&destination) {
            s.backoff = (s.backoff + 1).min(MAX_BACKOFF);
        }
    }

    /// The interval between SYNs to `destination`, once a handshake time
    /// is learned: 1.5 times it (seed 003 section 3.6.2), at least
    /// `MIN_INTERVAL_NS`, doubled per reset since the last sample up to
    /// the larger of the default interval and the undoubled one.
    pub fn interval(&self, destination: u32) -> Option<u64> {
        if self.by_destination.is_empty() {
            return None;
        }
        let s = self.by_destination.get(&destination)?;
        let base = base_interval(s.ns);
        Some((base << s.backoff).min(base.max(SynAccelConfig::DEFAULT_INTERVAL_NS)))
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

    const MS: u64 = 1_000_000;

    #[test]
    fn the_first_sample_is_taken_whole_then_smoothed_by_an_eighth() {
        let mut l = Learned::default();
        assert_eq!(l.interval(7), None);
        l.sample(7, 80 * MS);
        assert_eq!(l.interval(7), Some(120 * MS));
        l.sample(7, 160 * MS);
        assert_eq!(l.interval(7), Some(135 * MS), "1.5 x 90 ms");
        l.sample(7, 10 * MS);
        assert_eq!(l.interval(7), Some(120 * MS), "1.5 x 80 ms");
        assert_eq!(l.all(), [LearnedHandshake { destination: 7, handshake_ns: 80 * MS, samples: 3 }]);
        l.sample(8, MS);
        assert_eq!(l.interval(8), Some(SynAccelConfig::MIN_INTERVAL_NS), "the floor");
    }

    #[test]
    fn each_reset_doubles_the_interval_up_to_the_default_until_a_sample() {
        let mut l = Learned::default();
        l.back_off(7);
        assert_eq!(l.interval(7), None, "nothing learned: the default, unchanged");
        l.sample(7, 20 * MS);
        let doubled: Vec<u64> = (0..7)
            .map(|_| {
                l.back_off(7);
                l.interval(7).unwrap() / MS
            })
            .collect();
        assert_eq!(doubled, [60, 120, 240, 480, 500, 500, 500]);
        l.sample(7, 20 * MS);
        assert_eq!(l.interval(7), Some(30 * MS), "a sample the smoothed time covers ends the backoff");
        // Backed off again; a slower sample moves the average an eighth of
        // the way (67.5 ms): 3 doublings of 101.25 ms still cover 1.5 x
        // 400 ms, up to the default.
        (0..4).for_each(|_| l.back_off(7));
        l.sample(7, 400 * MS);
        assert_eq!(l.interval(7), Some(500 * MS), "the backoff kept while the average catches up");
        l.sample(7, 80 * MS);
        assert_eq!(l.interval(7), Some(2 * 3 * (67_500_000 + (80 * MS - 67_500_000) / 8) / 2), "one doubling still needed for 120 ms");
        l.sample(7, 60 * MS);
        let average = l.all().iter().find(|h| h.destination == 7).unwrap().handshake_ns;
        assert_eq!(l.interval(7), Some(average * 3 / 2), "covered again: 1.5 x the average");
        // A learned interval past the default is never doubled.
        l.sample(9, 400 * MS);
        l.back_off(9);
        assert_eq!(l.interval(9), Some(600 * MS));
        for _ in 0..40 {
            l.back_off(9);
        }
        assert_eq!(l.interval(9), Some(600 * MS));
    }
}
