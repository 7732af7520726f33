//! Per-subscriber state: the paired external address, port and session
//! counts against quotas, the new-mapping rate window and, in block mode, the
//! blocks the subscriber owns. Subscribers are found by the internal address
//! of a mapping; `Identities` says whose that is (an IPv4 subscriber's own
//! address, or a softwire endpoint of a DS-Lite B4).

use crate::error::EngineError;
use crate::state::hash;
use crate::state::identity::Identities;
use crate::state::index::FlowIndex;
use crate::Proto;

pub const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Default)]
pub struct Subscriber {
    /// The subscriber's key: its IPv4 address, or its B4's stand-in.
    pub addr: u32,
    /// Pool address index every mapping of this subscriber uses (RFC 4787 REQ-2).
    pub paired: u32,
    pub ports: [u32; Proto::COUNT],
    pub mappings: u32,
    pub sessions: u32,
    pub rate_window_s: u32,
    pub rate_count: u32,
    /// Block mode: (port space, block) pairs owned.
    pub blocks: Vec<(u32, u32)>,
    in_use: bool,
}

impl Subscriber {
    pub fn ports_total(&self) -> u32 {
        self.ports.iter().sum()
    }

    /// Counts one new mapping against a one-second window; false when over `limit`.
    pub fn admit_new_mapping(&mut self, now_s: u32, limit: u32) -> bool {
        if limit == 0 {
            return true;
        }
        if self.rate_window_s != now_s {
            self.rate_window_s = now_s;
            self.rate_count = 0;
        }
        if self.rate_count >= limit {
            return false;
        }
        self.rate_count += 1;
        true
    }
}

pub struct Subscribers {
    slab: Vec<Subscriber>,
    free: Vec<u32>,
    index: FlowIndex,
    ids: Identities,
    seed: u64,
    capacity: u32,
}

impl Subscribers {
    pub fn new(capacity: u32, seed: u64) -> Result<Self, EngineError> {
        let index = FlowIndex::try_with_capacity(capacity as usize).map_err(|_| EngineError::Memory { table: "subscriber index", bytes: Self::reserved_bytes(capacity) as u64 })?;
        Ok(Subscribers { slab: Vec::new(), free: Vec::new(), index, ids: Identities::new(seed), seed, capacity })
    }

    /// Bytes reserved up front for `capacity` subscribers (their records
    /// grow with use).
    pub fn reserved_bytes(capacity: u32) -> usize {
        FlowIndex::bytes_for(capacity as usize) + Identities::reserved_bytes()
    }

    /// The subscriber holding internal address `int_addr`.
    pub fn find(&self, int_addr: u32) -> Option<u32> {
        let key = self.ids.subscriber_key(int_addr);
        let slab = &self.slab;
        self.index.find(hash::address(self.seed, key), |id| slab[id as usize].addr == key)
    }

    /// Who the internal addresses of mappings are.
    pub fn identities(&self) -> &Identities {
        &self.ids
    }

    pub fn identities_mut(&mut self) -> &mut Identities {
        &mut self.ids
    }

    /// Recycles the softwire stand-ins nothing names (`Identities::reclaim`):
    /// a B4's waits while it still has a subscriber record.
    pub fn reclaim_stand_ins(&mut self, now_s: u32, grace: u32) {
        let (slab, index, seed) = (&self.slab, &self.index, self.seed);
        self.ids.reclaim(now_s, grace, |key| index.find(hash::address(seed, key), |id| slab[id as usize].addr == key).is_some());
    }

    /// Returns the subscriber's id, creating it; None when the table is full.
    pub fn find_or_create(&mut self, addr: u32) -> Option<u32> {
        self.find_or_create_hinted(addr, NONE)
    }

    /// `find_or_create` given `hint`, an id a caller found earlier (NONE:
    /// none): taken without a lookup if it still belongs to `addr`.
    #[inline(always)]
    pub fn find_or_create_hinted(&mut self, int_addr: u32, hint: u32) -> Option<u32> {
        let addr = self.ids.subscriber_key(int_addr);
        if self.slab.get(hint as usize).is_some_and(|s| s.in_use && s.addr == addr) {
            return Some(hint);
        }
        if let Some(id) = self.find(int_addr) {
            return Some(id);
        }
        if self.index.len() >= self.capacity as usize {
            return None;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slab.push(Subscriber::default());
                (self.slab.len() - 1) as u32
            }
        };
        let blocks = std::mem::take(&mut self.slab[id as usize].blocks);
        self.slab[id as usize] = Subscriber { addr, paired: NONE, blocks, in_use: true, ..Default::default() };
        self.index.insert(hash::address(self.seed, addr), id).ok()?;
        Some(id)
    }

    pub fn get(&self, id: u32) -> &Subscriber {
        &self.slab[id as usize]
    }

    pub fn get_mut(&mut self, id: u32) -> &mut Subscriber {
        &mut self.slab[id as usize]
    }

    /// Forgets a subscriber that holds nothing any more.
    pub fn release_if_idle(&mut self, id: u32) {
        let s = &self.slab[id as usize];
        if s.in_use && s.mappings == 0 && s.sessions == 0 && s.blocks.is_empty() {
            let addr = s.addr;
            self.index.remove(hash::address(self.seed, addr), id);
            self.slab[id as usize].in_use = false;
            self.slab[id as usize].blocks.clear();
            self.free.push(id);
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &Subscriber)> {
        self.slab.iter().enumerate().filter(|(_, s)| s.in_use).map(|(i, s)| (i as u32, s))
    }

    pub fn memory_bytes(&self) -> usize {
        self.slab.capacity() * core::mem::size_of::<Subscriber>() + self.index.memory_bytes() + self.ids.memory_bytes()
    }
}

#[cfg(test)]
mod softwire_tests {
    use super::*;

    #[test]
    fn a_b4s_hosts_share_one_subscriber_and_two_b4s_are_two() {
        let mut subs = Subscribers::new(8, 3).unwrap();
        let b4 = |n| std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, n);
        let one = subs.identities_mut().intern_softwire(b4(1), 0xc000_0002, 0).unwrap();
        let two = subs.identities_mut().intern_softwire(b4(1), 0xc000_0003, 0).unwrap();
        let other = subs.identities_mut().intern_softwire(b4(2), 0xc000_0002, 0).unwrap();
        let a = subs.find_or_create(one).unwrap();
        assert_eq!(subs.find_or_create(two), Some(a), "two hosts behind one B4 are one subscriber");
        assert_eq!(subs.find(two), Some(a));
        let b = subs.find_or_create(other).unwrap();
        assert_ne!(a, b);
        let plain = subs.find_or_create(0xc000_0002).unwrap();
        assert!(plain != a && plain != b, "a plain IPv4 subscriber with the same address is a third");
        assert_eq!(subs.len(), 3);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_is_taken_only_while_it_belongs_to_the_address() {
        let mut subs = Subscribers::new(4, 7).unwrap();
        let a = subs.find_or_create(0x6440_0001).unwrap();
        assert_eq!(subs.find_or_create_hinted(0x6440_0001, a), Some(a));
        assert_eq!(subs.find_or_create_hinted(0x6440_0001, NONE), Some(a), "no hint: the index answers");
        // The subscriber leaves and its slot goes to another address.
        subs.release_if_idle(a);
        let b = subs.find_or_create(0x6440_0002).unwrap();
        assert_eq!(b, a, "the slot is reused");
        let again = subs.find_or_create_hinted(0x6440_0001, a).unwrap();
        assert_ne!(again, b, "a stale hint names another subscriber's slot");
        assert_eq!(subs.get(again).addr, 0x6440_0001);
        assert_eq!(subs.get(b).addr, 0x6440_0002);
        assert_eq!(subs.find_or_create_hinted(0x6440_0003, 99), subs.find(0x6440_0003), "a hint past the slab is ignored");
        assert_eq!(subs.len(), 3);
    }
}
