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
//!
//! Stand-ins are recycled. Mappings and SCTP associations count the
//! endpoint they name (`hold`, `release`); a B4 counts its endpoints. One
//! that nothing counts any more, and that stays so for a grace period
//! (what may still hold its stand-in without counting: held fragments and
//! SYNs, each for at most its own timeout), is forgotten by `reclaim`, which
//! runs once the events that name it have been resolved; a B4 also waits
//! for its subscriber record (port blocks, hold-down of its ports) to go.

use std::collections::VecDeque;
use std::net::Ipv6Addr;

use crate::drop::DropReason;
use crate::dslite::SoftwireCounters;
use crate::state::hash;
use crate::state::index::FlowIndex;

const ENDPOINTS: u32 = 0xf000_0000;
const B4S: u32 = 0xf800_0000;
/// Each kind's range: 2^27 stand-ins, less the broadcast address at the top of the B4 range.
const RANGE: u32 = 0x0800_0000;
/// Entries the indexes start with; they double as identities are interned.
const FIRST_INDEX: usize = 16;
/// The count of a stand-in that is free for reuse.
const FREE: u32 = u32::MAX;

/// What an internal address stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    Ipv4(u32),
    Softwire { b4: Ipv6Addr, inner: u32 },
}

/// A softwire host as its stand-in names it: its B4's key and its inner
/// address. A reply translated to the inner address finds its B4 and the
/// B4's counters by the key, without looking up the stand-in again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    b4_key: u32,
    pub inner: u32,
}

/// Whether an internal address is a softwire endpoint's stand-in.
#[inline(always)]
pub fn is_softwire(int_addr: u32) -> bool {
    int_addr & !(RANGE - 1) == ENDPOINTS
}

pub struct Identities {
    b4s: Vec<Ipv6Addr>,
    b4_index: FlowIndex,
    b4_use: Uses,
    /// Each B4's own counters, started afresh with its stand-in.
    b4_counters: Vec<SoftwireCounters>,
    /// (B4 stand-in, inner IPv4) of each endpoint stand-in.
    endpoints: Vec<(u32, u32)>,
    endpoint_index: FlowIndex,
    endpoint_use: Uses,
    /// The most endpoints interned at once: what hosts behind B4s (or B4s
    /// lying about them) can make natrix keep.
    max_endpoints: u32,
    /// The most endpoints one B4 may have: no more hosts than it may hold
    /// ports, so one B4 making up inner addresses cannot take the others'.
    max_endpoints_per_b4: u32,
    /// The endpoint last found or interned: the packets of one softwire
    /// come in runs, and each of a run names the same (B4, inner address),
    /// whose two hash lookups this spares. Forgotten whenever `reclaim`
    /// frees a stand-in, so a recycled one is never served for the pair it
    /// stood for before. The fast path takes a pair found here as admitted
    /// (`recent_softwire`), so only an admitted B4's pairs may be found or
    /// interned, and a reload that may change who is admitted forgets it
    /// (`forget_recent`).
    last: Option<LastEndpoint>,
    seed: u64,
}

/// (B4, inner address), the stand-in they were last given, and the B4's
/// key (for its counters).
#[derive(Clone, Copy)]
struct LastEndpoint {
    b4: Ipv6Addr,
    inner: u32,
    stand_in: u32,
    b4_key: u32,
}

impl LastEndpoint {
    #[inline(always)]
    fn of(last: Option<LastEndpoint>, b4: Ipv6Addr, inner: u32) -> Option<u32> {
        last.filter(|l| l.inner == inner && l.b4 == b4).map(|l| l.stand_in)
    }
}

/// Who still uses each stand-in of one kind, and which may be reclaimed.
#[derive(Default)]
struct Uses {
    /// Records that name each stand-in (`FREE` once it is reclaimed).
    count: Vec<u32>,
    /// The second each stand-in's count last fell to zero.
    since: Vec<u32>,
    /// (stand-in, second its count fell to zero), oldest first; an entry
    /// whose second is not `since` any more is stale.
    unused: VecDeque<(u32, u32)>,
    free: Vec<u32>,
}

impl Uses {
    /// A new or reused stand-in, unused so far.
    fn take(&mut self, id: u32, now_s: u32) {
        if id as usize == self.count.len() {
            self.count.push(0);
            self.since.push(now_s);
        }
        self.count[id as usize] = 0;
        self.since[id as usize] = now_s;
        self.unused.push_back((id, now_s));
    }

    fn hold(&mut self, id: u32) {
        self.count[id as usize] += 1;
    }

    fn release(&mut self, id: u32, now_s: u32) {
        let c = &mut self.count[id as usize];
        *c -= 1;
        if *c == 0 {
            self.since[id as usize] = now_s;
            self.unused.push_back((id, now_s));
        }
    }

    /// The next stand-in unused for `grace` seconds, if any; taken off the list.
    fn next_unused(&mut self, now_s: u32, grace: u32) -> Option<u32> {
        while let Some(&(id, at)) = self.unused.front() {
            if now_s.wrapping_sub(at) < grace {
                return None;
            }
            self.unused.pop_front();
            if self.count[id as usize] == 0 && self.since[id as usize] == at {
                return Some(id);
            }
        }
        None
    }

    fn is_free(&self, id: u32) -> bool {
        self.count[id as usize] == FREE
    }

    fn live(&self) -> usize {
        self.count.len() - self.free.len()
    }

    fn memory_bytes(&self) -> usize {
        (self.count.capacity() + self.since.capacity() + self.free.capacity()) * 4 + self.unused.capacity() * 8
    }
}

impl Identities {
    pub fn new(seed: u64) -> Identities {
        Identities {
            b4s: Vec::new(),
            b4_index: FlowIndex::with_capacity(FIRST_INDEX),
            b4_use: Uses::default(),
            b4_counters: Vec::new(),
            endpoints: Vec::new(),
            endpoint_index: FlowIndex::with_capacity(FIRST_INDEX),
            endpoint_use: Uses::default(),
            max_endpoints: RANGE,
            max_endpoints_per_b4: RANGE,
            last: None,
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

    /// Interns at most `n` endpoints behind one B4; those it has already stay.
    pub fn limit_endpoints_per_b4(&mut self, n: u32) {
        self.max_endpoints_per_b4 = n.min(RANGE);
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

    /// The stand-in of host `inner` behind `b4` if it is the endpoint last
    /// found or interned.
    #[inline(always)]
    pub fn recent_softwire(&self, b4: Ipv6Addr, inner: u32) -> Option<u32> {
        LastEndpoint::of(self.last, b4, inner)
    }

    /// Forgets the endpoint last found or interned (`recent_softwire`):
    /// the B4s admitted may have changed.
    pub fn forget_recent(&mut self) {
        self.last = None;
    }

    /// The stand-in of host `inner` behind `b4` if it has one; makes none.
    #[inline]
    pub fn find_softwire(&mut self, b4: Ipv6Addr, inner: u32) -> Option<u32> {
        if let Some(stand_in) = LastEndpoint::of(self.last, b4, inner) {
            return Some(stand_in);
        }
        let stand_in = self.find_indexed(b4, inner)?;
        self.remember(b4, inner, stand_in);
        Some(stand_in)
    }

    /// `find_softwire` through the indexes alone.
    fn find_indexed(&self, b4: Ipv6Addr, inner: u32) -> Option<u32> {
        let (b4s, uses) = (&self.b4s, &self.b4_use);
        let b4_id = self.b4_index.find(b4_hash(self.seed, &b4), |i| !uses.is_free(i) && b4s[i as usize] == b4)?;
        let key = (B4S + b4_id, inner);
        let (endpoints, uses) = (&self.endpoints, &self.endpoint_use);
        self.endpoint_index.find(endpoint_hash(self.seed, &key), |i| !uses.is_free(i) && endpoints[i as usize] == key).map(|id| ENDPOINTS + id)
    }

    /// The stand-in of host `inner` behind `b4`, made on first use (at
    /// second `now_s`). Refused when every stand-in is taken
    /// (`SubscriberTableFull`) or the B4 has as many hosts as it may hold
    /// ports (`DsliteB4Hosts`).
    pub fn intern_softwire(&mut self, b4: Ipv6Addr, inner: u32, now_s: u32) -> Result<u32, DropReason> {
        if let Some(stand_in) = LastEndpoint::of(self.last, b4, inner) {
            return Ok(stand_in);
        }
        let stand_in = self.intern_indexed(b4, inner, now_s)?;
        self.remember(b4, inner, stand_in);
        Ok(stand_in)
    }

    /// Makes (`b4`, `inner`) and its stand-in the endpoint last found.
    fn remember(&mut self, b4: Ipv6Addr, inner: u32, stand_in: u32) {
        let b4_key = self.endpoints[(stand_in - ENDPOINTS) as usize].0;
        self.last = Some(LastEndpoint { b4, inner, stand_in, b4_key });
    }

    /// The counters of the B4 of the endpoint last found or interned
    /// (`recent_softwire`), without looking its stand-in up.
    #[inline(always)]
    pub(crate) fn recent_counters_mut(&mut self) -> Option<&mut SoftwireCounters> {
        let last = self.last?;
        self.b4_counters.get_mut((last.b4_key - B4S) as usize)
    }

    /// `intern_softwire` through the indexes alone.
    fn intern_indexed(&mut self, b4: Ipv6Addr, inner: u32, now_s: u32) -> Result<u32, DropReason> {
        let b4_key = self.intern_b4(b4, now_s).ok_or(DropReason::SubscriberTableFull)?;
        let h = endpoint_hash(self.seed, &(b4_key, inner));
        let endpoints = &self.endpoints;
        let uses = &self.endpoint_use;
        if let Some(id) = self.endpoint_index.find(h, |i| !uses.is_free(i) && endpoints[i as usize] == (b4_key, inner)) {
            return Ok(ENDPOINTS + id);
        }
        if self.endpoint_use.live() >= self.max_endpoints as usize {
            return Err(DropReason::SubscriberTableFull);
        }
        if self.b4_use.count[(b4_key - B4S) as usize] >= self.max_endpoints_per_b4 {
            return Err(DropReason::DsliteB4Hosts);
        }
        let seed = self.seed;
        let (endpoints, uses) = (&self.endpoints, &self.endpoint_use);
        grow_if_full(&mut self.endpoint_index, endpoints.len(), |i| (!uses.is_free(i)).then(|| endpoints[i as usize]), |e| endpoint_hash(seed, e));
        let reused = self.endpoint_use.free.pop();
        let id = reused.unwrap_or(self.endpoints.len() as u32);
        if self.endpoint_index.insert(h, id).is_err() {
            self.endpoint_use.free.extend(reused);
            return Err(DropReason::SubscriberTableFull);
        }
        debug_assert!(id < RANGE, "endpoint ids stay below RANGE: endpoint_of relies on it");
        if id as usize == self.endpoints.len() {
            self.endpoints.push((b4_key, inner));
        } else {
            self.endpoints[id as usize] = (b4_key, inner);
        }
        self.endpoint_use.take(id, now_s);
        self.b4_use.hold(b4_key - B4S);
        Ok(ENDPOINTS + id)
    }

    fn intern_b4(&mut self, b4: Ipv6Addr, now_s: u32) -> Option<u32> {
        let h = b4_hash(self.seed, &b4);
        let (b4s, uses) = (&self.b4s, &self.b4_use);
        if let Some(id) = self.b4_index.find(h, |i| !uses.is_free(i) && b4s[i as usize] == b4) {
            return Some(B4S + id);
        }
        let reused = self.b4_use.free.pop();
        let id = match reused {
            Some(id) => id,
            None => u32::try_from(self.b4s.len()).ok().filter(|&i| i < RANGE - 1)?,
        };
        let seed = self.seed;
        let (b4s, uses) = (&self.b4s, &self.b4_use);
        grow_if_full(&mut self.b4_index, b4s.len(), |i| (!uses.is_free(i)).then(|| b4s[i as usize]), |a| b4_hash(seed, a));
        if self.b4_index.insert(h, id).is_err() {
            self.b4_use.free.extend(reused);
            return None;
        }
        if id as usize == self.b4s.len() {
            self.b4s.push(b4);
            self.b4_counters.push(SoftwireCounters::default());
        } else {
            self.b4s[id as usize] = b4;
            self.b4_counters[id as usize] = SoftwireCounters::default();
        }
        self.b4_use.take(id, now_s);
        Some(B4S + id)
    }

    /// The counters of the B4 of softwire endpoint `int_addr` (None for any other address).
    #[inline]
    pub(crate) fn counters_mut(&mut self, int_addr: u32) -> Option<&mut SoftwireCounters> {
        let e = self.endpoint_of(int_addr)?;
        self.endpoint_counters_mut(e)
    }

    /// The counters of the B4 of `e`.
    #[inline]
    pub(crate) fn endpoint_counters_mut(&mut self, e: Endpoint) -> Option<&mut SoftwireCounters> {
        self.b4_counters.get_mut((e.b4_key - B4S) as usize)
    }

    /// The B4 of `e`.
    #[inline]
    pub(crate) fn endpoint_b4(&self, e: Endpoint) -> Option<Ipv6Addr> {
        self.b4s.get((e.b4_key - B4S) as usize).copied()
    }

    /// The counters of a B4 by its address, if it has a stand-in.
    pub(crate) fn counters_of_b4_mut(&mut self, b4: Ipv6Addr) -> Option<&mut SoftwireCounters> {
        let (b4s, uses) = (&self.b4s, &self.b4_use);
        let id = self.b4_index.find(b4_hash(self.seed, &b4), |i| !uses.is_free(i) && b4s[i as usize] == b4)?;
        self.b4_counters.get_mut(id as usize)
    }

    /// The counters of the B4 of `int_addr`, a softwire endpoint or a B4's stand-in.
    pub fn counters_of(&self, int_addr: u32) -> Option<SoftwireCounters> {
        let key = if is_softwire(int_addr) { self.endpoints.get((int_addr - ENDPOINTS) as usize)?.0 } else { int_addr };
        self.b4_counters.get(key.checked_sub(B4S)? as usize).copied()
    }

    /// A record (mapping or SCTP association) now names `int_addr`.
    #[inline]
    pub fn hold(&mut self, int_addr: u32) {
        if is_softwire(int_addr) {
            self.endpoint_use.hold(int_addr - ENDPOINTS);
        }
    }

    /// A record that named `int_addr` is gone (at second `now_s`).
    #[inline]
    pub fn release(&mut self, int_addr: u32, now_s: u32) {
        if is_softwire(int_addr) {
            self.endpoint_use.release(int_addr - ENDPOINTS, now_s);
        }
    }

    /// Forgets the endpoints no record has named for `grace` seconds, then
    /// the B4s left with no endpoint for as long whose subscriber record
    /// is gone too (`subscribed` says whether a B4 stand-in still has one).
    /// Call it once every event naming a stand-in has been resolved.
    pub fn reclaim(&mut self, now_s: u32, grace: u32, subscribed: impl Fn(u32) -> bool) {
        while let Some(id) = self.endpoint_use.next_unused(now_s, grace) {
            // The freed stand-in may be the one remembered, and serve another pair next.
            self.last = None;
            let e = self.endpoints[id as usize];
            self.endpoint_index.remove(endpoint_hash(self.seed, &e), id);
            self.endpoint_use.count[id as usize] = FREE;
            self.endpoint_use.free.push(id);
            self.b4_use.release(e.0 - B4S, now_s);
        }
        let mut kept = Vec::new();
        while let Some(id) = self.b4_use.next_unused(now_s, grace) {
            if subscribed(B4S + id) {
                kept.push(id);
                continue;
            }
            self.b4_index.remove(b4_hash(self.seed, &self.b4s[id as usize]), id);
            self.b4_use.count[id as usize] = FREE;
            self.b4_use.free.push(id);
        }
        // Still a subscriber (port blocks, hold-down): looked at again a grace period on.
        for id in kept {
            self.b4_use.since[id as usize] = now_s;
            self.b4_use.unused.push_back((id, now_s));
        }
    }

    /// Bytes held by the interned identities and their indexes.
    pub fn memory_bytes(&self) -> usize {
        self.b4s.capacity() * std::mem::size_of::<Ipv6Addr>()
            + self.endpoints.capacity() * std::mem::size_of::<(u32, u32)>()
            + self.b4_index.memory_bytes()
            + self.endpoint_index.memory_bytes()
            + self.b4_use.memory_bytes()
            + self.b4_counters.capacity() * std::mem::size_of::<SoftwireCounters>()
            + self.endpoint_use.memory_bytes()
    }

    /// How many B4s have a stand-in.
    pub fn b4_count(&self) -> usize {
        self.b4_use.live()
    }

    /// How many softwire endpoints (B4, inner address) have a stand-in.
    pub fn endpoint_count(&self) -> usize {
        self.endpoint_use.live()
    }

    /// The softwire host whose stand-in `addr` is; None for any other address.
    #[inline]
    pub fn endpoint_of(&self, addr: u32) -> Option<Endpoint> {
        // One bounds check tells: any other address lands at RANGE or past
        // it, and endpoint ids stay below RANGE (`intern_indexed`).
        let &(b4_key, inner) = self.endpoints.get(addr.wrapping_sub(ENDPOINTS) as usize)?;
        Some(Endpoint { b4_key, inner })
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

fn endpoint_hash(seed: u64, &(b4_key, inner): &(u32, u32)) -> u64 {
    hash::five_tuple(seed, 4, b4_key, 0, inner, 0)
}

/// Rebuilds an index twice as large when it is about to be full, with the
/// live ones of the `len` ids (`item` is None for a free one).
fn grow_if_full<T>(index: &mut FlowIndex, len: usize, item: impl Fn(u32) -> Option<T>, hash_of: impl Fn(&T) -> u64) {
    if index.len() < index.capacity() {
        return;
    }
    let mut bigger = FlowIndex::with_capacity(2 * len.max(8));
    for id in 0..len as u32 {
        if let Some(it) = item(id) {
            // Cannot fail: the new index holds twice what the old one did.
            let _ = bigger.insert(hash_of(&it), id);
        }
    }
    *index = bigger;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::frame::is_martian;
    use proptest::prelude::*;

    fn b4(n: u16) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, n)
    }

    #[test]
    fn two_b4s_hosts_with_one_private_address_are_two_endpoints_of_two_subscribers() {
        let mut ids = Identities::new(7);
        let a = ids.intern_softwire(b4(1), 0xc000_0002, 0).unwrap();
        let b = ids.intern_softwire(b4(2), 0xc000_0002, 0).unwrap();
        assert_ne!(a, b);
        assert_eq!(ids.intern_softwire(b4(1), 0xc000_0002, 0), Ok(a), "interning is stable");
        let c = ids.intern_softwire(b4(1), 0x0a00_0005, 0).unwrap();
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
        let a = ids.intern_softwire(b4(1), 1, 0).unwrap();
        ids.intern_softwire(b4(2), 1, 0).unwrap();
        assert_eq!(ids.intern_softwire(b4(3), 1, 0), Err(DropReason::SubscriberTableFull));
        assert_eq!(ids.intern_softwire(b4(1), 1, 0), Ok(a));
    }

    /// One B4 making up inner addresses stops at its own limit; another B4
    /// still gets stand-ins, and the first gets its room back as its
    /// unused ones are reclaimed.
    #[test]
    fn one_b4_gets_no_more_endpoints_than_its_limit() {
        let mut ids = Identities::new(7);
        ids.limit_endpoints(100);
        ids.limit_endpoints_per_b4(3);
        let mine: Vec<u32> = (1..=3).map(|inner| ids.intern_softwire(b4(1), inner, 0).unwrap()).collect();
        assert_eq!(ids.intern_softwire(b4(1), 4, 0), Err(DropReason::DsliteB4Hosts));
        assert_eq!(ids.intern_softwire(b4(1), 2, 0), Ok(mine[1]), "a host it has keeps its stand-in");
        assert!(ids.intern_softwire(b4(2), 4, 0).is_ok(), "another B4 is not held back");
        ids.hold(mine[0]);
        ids.reclaim(10, 5, |_| false);
        assert!(ids.intern_softwire(b4(1), 4, 10).is_ok(), "unused ones reclaimed: room again");
        assert!(ids.intern_softwire(b4(1), 5, 10).is_ok());
        assert_eq!(ids.intern_softwire(b4(1), 6, 10), Err(DropReason::DsliteB4Hosts));
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
        let made: Vec<u32> = (0..5000u32).map(|i| ids.intern_softwire(b4((i % 700) as u16), 0x0a00_0000 + i, 0).unwrap()).collect();
        for (i, &id) in made.iter().enumerate() {
            let i = i as u32;
            assert_eq!(ids.intern_softwire(b4((i % 700) as u16), 0x0a00_0000 + i, 0), Ok(id));
            assert_eq!(ids.resolve(id), Identity::Softwire { b4: b4((i % 700) as u16), inner: 0x0a00_0000 + i });
        }
    }

    #[test]
    fn a_stand_in_is_reclaimed_only_when_nothing_names_it_for_the_grace_period() {
        let mut ids = Identities::new(7);
        ids.limit_endpoints(2);
        let a = ids.intern_softwire(b4(1), 1, 10).unwrap();
        let b = ids.intern_softwire(b4(2), 1, 10).unwrap();
        ids.hold(a);
        ids.reclaim(14, 5, |_| false);
        assert_eq!((ids.endpoint_count(), ids.b4_count()), (2, 2), "within the grace period");
        ids.reclaim(15, 5, |_| false);
        assert_eq!((ids.endpoint_count(), ids.b4_count()), (1, 2), "b, never held, goes; a is held");
        ids.reclaim(19, 5, |_| false);
        assert_eq!(ids.b4_count(), 2, "b's B4 waits a grace period after its last endpoint");
        ids.reclaim(20, 5, |_| false);
        assert_eq!(ids.b4_count(), 1);
        assert_eq!(ids.resolve(a), Identity::Softwire { b4: b4(1), inner: 1 });
        // b's stand-in serves a new pair, and the old pair would get a new one.
        let c = ids.intern_softwire(b4(3), 9, 20).unwrap();
        assert_eq!(c, b, "recycled");
        assert_eq!(ids.resolve(c), Identity::Softwire { b4: b4(3), inner: 9 });
        assert_eq!(ids.intern_softwire(b4(2), 1, 20), Err(DropReason::SubscriberTableFull), "the limit counts live stand-ins");
        // Released, then held again within the grace period: kept.
        ids.release(a, 16);
        ids.hold(a);
        ids.reclaim(30, 5, |_| false);
        assert_eq!(ids.intern_softwire(b4(1), 1, 30), Ok(a));
        // A B4 with a subscriber record (port blocks) outlives its endpoints.
        ids.release(a, 30);
        ids.reclaim(40, 5, |key| key == ids_key_of_b4_1());
        ids.reclaim(46, 5, |key| key == ids_key_of_b4_1());
        assert_eq!((ids.endpoint_count(), ids.b4_count()), (0, 1), "B4 1 kept while subscribed; B4 3 gone");
        assert_eq!(ids.resolve(B4S), Identity::Softwire { b4: b4(1), inner: 0 });
        ids.reclaim(52, 5, |_| false);
        assert_eq!(ids.b4_count(), 0);
    }

    #[test]
    fn a_reclaimed_stand_in_is_not_served_from_the_last_endpoint() {
        let mut ids = Identities::new(7);
        let a = ids.intern_softwire(b4(1), 1, 10).unwrap();
        assert_eq!(ids.find_softwire(b4(1), 1), Some(a), "remembered");
        ids.reclaim(20, 5, |_| false);
        assert_eq!(ids.endpoint_count(), 0);
        assert_eq!(ids.find_softwire(b4(1), 1), None, "freed: not found, though it was the last one");
        let b = ids.intern_softwire(b4(2), 1, 20).unwrap();
        assert_eq!(b, a, "recycled for another pair");
        let c = ids.intern_softwire(b4(1), 1, 20).unwrap();
        assert_ne!(c, b, "the old pair gets a stand-in of its own");
        assert_eq!(ids.find_softwire(b4(2), 1), Some(b));
        assert_eq!(ids.resolve(b), Identity::Softwire { b4: b4(2), inner: 1 });
    }

    #[derive(Debug, Clone)]
    enum Op {
        Intern(u16, u32),
        Find(u16, u32),
        Hold(usize),
        Release(usize),
        Reclaim(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4u16, 0..3u32).prop_map(|(b, i)| Op::Intern(b, i)),
            (0..4u16, 0..3u32).prop_map(|(b, i)| Op::Find(b, i)),
            any::<usize>().prop_map(Op::Hold),
            any::<usize>().prop_map(Op::Release),
            (0..8u32).prop_map(Op::Reclaim),
        ]
    }

    proptest! {
        /// Whatever order packets, records and reclaims come in, what the
        /// last endpoint serves is what the indexes say, and a stand-in
        /// returned for a pair stands for that pair.
        #[test]
        fn the_last_endpoint_never_disagrees_with_the_indexes(ops in proptest::collection::vec(op(), 1..200)) {
            let mut ids = Identities::new(3);
            // Few stand-ins, so they are recycled often.
            ids.limit_endpoints(3);
            let (mut now, mut made, mut held) = (0u32, Vec::new(), Vec::new());
            for op in ops {
                match op {
                    Op::Intern(b, inner) => {
                        let got = ids.intern_softwire(b4(b), inner, now);
                        if let Ok(s) = got {
                            prop_assert_eq!(ids.resolve(s), Identity::Softwire { b4: b4(b), inner });
                            prop_assert_eq!(ids.find_indexed(b4(b), inner), Some(s));
                            made.push(s);
                        }
                    }
                    Op::Find(b, inner) => {
                        let got = ids.find_softwire(b4(b), inner);
                        prop_assert_eq!(got, ids.find_indexed(b4(b), inner));
                        if let Some(s) = got {
                            prop_assert_eq!(ids.resolve(s), Identity::Softwire { b4: b4(b), inner });
                        }
                    }
                    // A record names a stand-in that is live now (one found again).
                    Op::Hold(k) if !made.is_empty() => {
                        let s = made[k % made.len()];
                        if let Identity::Softwire { b4, inner } = ids.resolve(s) {
                            if ids.find_indexed(b4, inner) == Some(s) {
                                ids.hold(s);
                                held.push(s);
                            }
                        }
                    }
                    Op::Release(k) if !held.is_empty() => {
                        let s = held.swap_remove(k % held.len());
                        ids.release(s, now);
                    }
                    Op::Reclaim(dt) => {
                        now += dt;
                        ids.reclaim(now, 2, |_| false);
                    }
                    Op::Hold(_) | Op::Release(_) => {}
                }
            }
        }
    }

    /// B4 1 was interned first: the first B4 stand-in.
    fn ids_key_of_b4_1() -> u32 {
        B4S
    }
}
