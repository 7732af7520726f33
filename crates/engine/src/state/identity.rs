//! Who a subscriber is. A plain NAPT44 subscriber is its IPv4 address,
//! kept in every record as it is. A DS-Lite subscriber (RFC 6333) is its
//! B4's IPv6 address, and the host behind it is that B4 plus a private IPv4
//! address which other B4s may use too. Those long identities are interned
//! here into 32-bit stand-ins from 240.0.0.0/4 (reserved, never a real
//! source: natrix drops it on the wire as martian), so mapping and session
//! records keep one 32-bit internal address and the IPv4 case runs the code
//! it always did, past one comparison:
//!
//! - a softwire endpoint (B4, inner IPv4) is a stand-in from 240.0.0.0/5,
//!   used as the internal address of its mappings, so two B4s' hosts that
//!   both use 192.0.0.2:5000 get distinct mappings;
//! - a B4 is a stand-in from 248.0.0.0/5, the key of its subscriber record,
//!   so quotas, paired pooling and port blocks hold per B4.

use std::net::Ipv6Addr;

use crate::state::hash;
use crate::state::index::FlowIndex;

const ENDPOINTS: u32 = 0xf000_0000;
const B4S: u32 = 0xf800_0000;
/// Each kind's range: 2^27 stand-ins, less the broadcast address at the top of the B4 range.
const RANGE: u32 = 0x0800_0000;
/// Entries the indexes start with; they double as identities are interned.
const FIRST_INDEX: usize = 16;

/// What an internal address stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    Ipv4(u32),
    Softwire { b4: Ipv6Addr, inner: u32 },
}

/// Whether an internal address is a softwire endpoint's stand-in.
#[inline(always)]
pub fn is_softwire(int_addr: u32) -> bool {
    int_addr & !(RANGE - 1) == ENDPOINTS
}

pub struct Identities {
    b4s: Vec<Ipv6Addr>,
    b4_index: FlowIndex,
    /// (B4 stand-in, inner IPv4) of each endpoint stand-in.
    endpoints: Vec<(u32, u32)>,
    endpoint_index: FlowIndex,
    /// The most endpoints interned: stand-ins are never recycled, so this
    /// bounds what hosts behind B4s (or B4s lying about them) can make
    /// natrix keep.
    max_endpoints: u32,
    seed: u64,
}

impl Identities {
    pub fn new(seed: u64) -> Identities {
        Identities {
            b4s: Vec::new(),
            b4_index: FlowIndex::with_capacity(FIRST_INDEX),
            endpoints: Vec::new(),
            endpoint_index: FlowIndex::with_capacity(FIRST_INDEX),
            max_endpoints: RANGE,
            seed,
        }
    }

    /// Bytes a new `Identities` holds: its two first indexes.
    pub fn reserved_bytes() -> usize {
        2 * FlowIndex::bytes_for(FIRST_INDEX)
    }

    /// Interns at most `n` endpoints (at most the 2^27 of their range).
    pub fn limit_endpoints(&mut self, n: u32) {
        self.max_endpoints = n.min(RANGE);
    }

    /// The subscriber an internal address belongs to: itself, or for a
    /// softwire endpoint its B4's stand-in.
    #[inline(always)]
    pub fn subscriber_key(&self, int_addr: u32) -> u32 {
        if is_softwire(int_addr) {
            self.endpoints[(int_addr - ENDPOINTS) as usize].0
        } else {
            int_addr
        }
    }

    /// The stand-in of host `inner` behind `b4`, made on first use; None
    /// when every stand-in is taken.
    pub fn intern_softwire(&mut self, b4: Ipv6Addr, inner: u32) -> Option<u32> {
        let b4_key = self.intern_b4(b4)?;
        let h = hash::five_tuple(self.seed, 4, b4_key, 0, inner, 0);
        let endpoints = &self.endpoints;
        if let Some(id) = self.endpoint_index.find(h, |i| endpoints[i as usize] == (b4_key, inner)) {
            return Some(ENDPOINTS + id);
        }
        let id = u32::try_from(self.endpoints.len()).ok().filter(|&i| i < self.max_endpoints)?;
        grow_if_full(&mut self.endpoint_index, self.endpoints.len(), |i| self.endpoints[i as usize], |&(b, a)| hash::five_tuple(self.seed, 4, b, 0, a, 0));
        self.endpoint_index.insert(h, id).ok()?;
        self.endpoints.push((b4_key, inner));
        Some(ENDPOINTS + id)
    }

    fn intern_b4(&mut self, b4: Ipv6Addr) -> Option<u32> {
        let h = b4_hash(self.seed, &b4);
        let b4s = &self.b4s;
        if let Some(id) = self.b4_index.find(h, |i| b4s[i as usize] == b4) {
            return Some(B4S + id);
        }
        let id = u32::try_from(self.b4s.len()).ok().filter(|&i| i < RANGE - 1)?;
        let seed = self.seed;
        grow_if_full(&mut self.b4_index, self.b4s.len(), |i| self.b4s[i as usize], |a| b4_hash(seed, a));
        self.b4_index.insert(h, id).ok()?;
        self.b4s.push(b4);
        Some(B4S + id)
    }

    /// Bytes held by the interned identities and their indexes.
    pub fn memory_bytes(&self) -> usize {
        self.b4s.capacity() * std::mem::size_of::<Ipv6Addr>()
            + self.endpoints.capacity() * std::mem::size_of::<(u32, u32)>()
            + self.b4_index.memory_bytes()
            + self.endpoint_index.memory_bytes()
    }

    /// How many B4s have a stand-in.
    pub fn b4_count(&self) -> usize {
        self.b4s.len()
    }

    /// What an internal address (or a subscriber key) stands for.
    pub fn resolve(&self, addr: u32) -> Identity {
        match addr {
            a if is_softwire(a) && ((a - ENDPOINTS) as usize) < self.endpoints.len() => {
                let (b4, inner) = self.endpoints[(a - ENDPOINTS) as usize];
                Identity::Softwire { b4: self.b4s[(b4 - B4S) as usize], inner }
            }
            a if a & !(RANGE - 1) == B4S && ((a - B4S) as usize) < self.b4s.len() => Identity::Softwire { b4: self.b4s[(a - B4S) as usize], inner: 0 },
            a => Identity::Ipv4(a),
        }
    }
}

fn b4_hash(seed: u64, b4: &Ipv6Addr) -> u64 {
    let o = b4.octets();
    let word = |i: usize| u32::from_be_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
    hash::five_tuple(seed, 41, word(0) ^ word(8), 0, word(4) ^ word(12), 0)
}

/// Rebuilds an index twice as large when it is about to be full: interned
/// identities are never dropped, so the index grows with them.
fn grow_if_full<T>(index: &mut FlowIndex, len: usize, item: impl Fn(u32) -> T, hash_of: impl Fn(&T) -> u64) {
    if index.len() < index.capacity() {
        return;
    }
    let mut bigger = FlowIndex::with_capacity(2 * len.max(8));
    for id in 0..len as u32 {
        // Cannot fail: the new index holds twice what the old one did.
        let _ = bigger.insert(hash_of(&item(id)), id);
    }
    *index = bigger;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::frame::is_martian;

    fn b4(n: u16) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, n)
    }

    #[test]
    fn two_b4s_hosts_with_one_private_address_are_two_endpoints_of_two_subscribers() {
        let mut ids = Identities::new(7);
        let a = ids.intern_softwire(b4(1), 0xc000_0002).unwrap();
        let b = ids.intern_softwire(b4(2), 0xc000_0002).unwrap();
        assert_ne!(a, b);
        assert_eq!(ids.intern_softwire(b4(1), 0xc000_0002), Some(a), "interning is stable");
        let c = ids.intern_softwire(b4(1), 0x0a00_0005).unwrap();
        assert_eq!(ids.subscriber_key(a), ids.subscriber_key(c), "one B4, one subscriber");
        assert_ne!(ids.subscriber_key(a), ids.subscriber_key(b));
        assert_eq!(ids.resolve(b), Identity::Softwire { b4: b4(2), inner: 0xc000_0002 });
        for id in [a, b, c, ids.subscriber_key(a)] {
            assert!(is_martian(id), "a stand-in can never arrive on the wire");
        }
    }

    #[test]
    fn endpoints_past_the_limit_are_refused_and_known_ones_still_found() {
        let mut ids = Identities::new(7);
        ids.limit_endpoints(2);
        let a = ids.intern_softwire(b4(1), 1).unwrap();
        ids.intern_softwire(b4(2), 1).unwrap();
        assert_eq!(ids.intern_softwire(b4(3), 1), None);
        assert_eq!(ids.intern_softwire(b4(1), 1), Some(a));
    }

    #[test]
    fn plain_ipv4_subscribers_are_themselves() {
        let ids = Identities::new(7);
        for a in [0x6440_0002u32, 0x0a00_0001, 0xdfff_ffff] {
            assert!(!is_softwire(a));
            assert_eq!(ids.subscriber_key(a), a);
            assert_eq!(ids.resolve(a), Identity::Ipv4(a));
        }
    }

    #[test]
    fn many_identities_outgrow_the_first_index() {
        let mut ids = Identities::new(9);
        let made: Vec<u32> = (0..5000u32).map(|i| ids.intern_softwire(b4((i % 700) as u16), 0x0a00_0000 + i).unwrap()).collect();
        for (i, &id) in made.iter().enumerate() {
            let i = i as u32;
            assert_eq!(ids.intern_softwire(b4((i % 700) as u16), 0x0a00_0000 + i), Some(id));
            assert_eq!(ids.resolve(id), Identity::Softwire { b4: b4((i % 700) as u16), inner: 0x0a00_0000 + i });
        }
    }
}
