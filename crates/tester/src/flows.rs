//! Connections and the orders they are used in. RFC 9693 section 4 keeps
//! a stateful NAT's connections countable by restricting the port ranges:
//! every 4-tuple the tester uses is one of a fixed set, enumerated once
//! without repetition in the preliminary phase (which creates them) and
//! then drawn at random, with repetition, in the real test phase, so every
//! frame there belongs to an existing connection. The ports vary
//! pseudorandomly from frame to frame as RFC 4814 section 4.5 asks: source
//! ports from 1024 up, destination ports inside 1-49151.

/// The set of 4-tuples: connection `i` comes from subscriber `i % A` to
/// destination port `(i / A) % D`, with source port `i / (A * D)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSpace {
    /// The first simulated subscriber address; they count up from it.
    pub first_subscriber: u32,
    pub subscribers: u32,
    pub first_sport: u16,
    /// The simulated server every connection goes to.
    pub server: u32,
    pub first_dport: u16,
    pub dports: u32,
}

/// A connection's addresses as the subscriber sends them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub src: u32,
    pub sport: u16,
    pub dst: u32,
    pub dport: u16,
}

/// Source ports per subscriber: RFC 4814's 1024-65535.
const SPORTS: u32 = 65536 - 1024;

impl FlowSpace {
    /// How many connections the space holds.
    pub fn capacity(&self) -> u64 {
        u64::from(self.subscribers) * u64::from(self.dports) * u64::from(SPORTS - u32::from(self.first_sport - 1024))
    }

    pub fn tuple(&self, conn: u32) -> Tuple {
        let (a, d) = (self.subscribers, self.dports);
        Tuple { src: self.first_subscriber + conn % a, sport: self.first_sport + ((conn / a) / d) as u16, dst: self.server, dport: self.first_dport + ((conn / a) % d) as u16 }
    }

    /// Whether `addr` is one of the simulated subscribers.
    pub fn is_subscriber(&self, addr: u32) -> bool {
        addr.wrapping_sub(self.first_subscriber) < self.subscribers
    }
}

/// splitmix64: a small, fast, seedable generator; the tester needs
/// reproducible pseudorandom numbers, not cryptographic ones.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (Lemire's multiply-shift; the bias is below 2^-32
    /// for the n a tester uses).
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// A pseudorandom permutation of `0..n`: an invertible mix of `bits`-bit
/// integers, applied again while it lands at or above n (cycle walking),
/// so every index comes out exactly once (RFC 9693's enumeration without
/// repetition).
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    bits: u32,
    keys: [u64; 3],
}

impl Permutation {
    pub fn new(n: u64, seed: u64) -> Permutation {
        let bits = (u64::BITS - n.saturating_sub(1).leading_zeros()).max(2);
        let mut rng = Rng::new(seed);
        Permutation { n, bits, keys: [rng.next_u64() | 1, rng.next_u64(), rng.next_u64() | 1] }
    }

    fn mix(&self, x: u64) -> u64 {
        let mask = u64::MAX >> (u64::BITS - self.bits);
        let shift = self.bits.div_ceil(2);
        let mut x = x.wrapping_mul(self.keys[0]).wrapping_add(self.keys[1]) & mask;
        x ^= x >> shift;
        x = x.wrapping_mul(self.keys[2]) & mask;
        x ^= x >> shift;
        x = x.wrapping_mul(self.keys[0]) & mask;
        x ^ x >> shift
    }

    /// The `i`-th element, for `i < n`.
    pub fn get(&self, i: u64) -> u64 {
        let mut x = self.mix(i);
        while x >= self.n {
            x = self.mix(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn space() -> FlowSpace {
        FlowSpace { first_subscriber: 0x6440_0101, subscribers: 16, first_sport: 1024, server: 0xc633_6415, first_dport: 5001, dports: 64 }
    }

    #[test]
    fn connections_are_distinct_tuples_within_the_rfc_4814_ranges() {
        let s = space();
        let tuples: HashSet<_> = (0..100_000).map(|i| s.tuple(i)).collect();
        assert_eq!(tuples.len(), 100_000);
        for t in &tuples {
            assert!(s.is_subscriber(t.src));
            assert!(t.sport >= 1024 && (1..=49151).contains(&t.dport));
        }
    }

    #[test]
    fn a_space_holds_every_source_port_of_every_subscriber_and_destination() {
        assert_eq!(space().capacity(), 16 * 64 * 64512);
        let last = space().tuple((space().capacity() - 1) as u32);
        assert_eq!(last.sport, 65535);
    }

    #[test]
    fn a_permutation_yields_every_index_once_and_out_of_order() {
        for n in [1u64, 2, 3, 1000, 65_537] {
            let p = Permutation::new(n, 7);
            let seen: HashSet<u64> = (0..n).map(|i| p.get(i)).collect();
            assert_eq!(seen.len() as u64, n);
            assert!(seen.iter().all(|&x| x < n));
        }
        let p = Permutation::new(1000, 7);
        assert!((0..1000).filter(|&i| p.get(i) == i).count() < 20);
    }

    #[test]
    fn draws_below_n_cover_the_range_evenly() {
        let mut r = Rng::new(1);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)), "{counts:?}");
    }
}
