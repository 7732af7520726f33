//! External address pool and port allocation.
//!
//! Every (pool address, protocol with ports) pair has a port space: a 65,536-bit map in
//! which ports outside the configured range are permanently taken. Port block
//! allocation is a mode of the same allocator: a subscriber first owns a block
//! of consecutive ports and then takes ports inside its blocks. Released ports
//! and blocks wait out the hold-down in a FIFO before they are free again.

use std::collections::VecDeque;

use crate::config::PortSelection;
use crate::state::index::prefetch;
use crate::state::rng::Rng;
use crate::Proto;

const WORDS: usize = 65536 / 64;
const EVEN_BITS: u64 = 0x5555_5555_5555_5555;

/// Which ports of one address and protocol are taken.
struct PortSpace {
    used: Box<[u64; WORDS]>,
    free: u32,
    /// Block mode: owner of each block (subscriber id + 1), 0 when free, HELD during hold-down.
    block_owner: Vec<u32>,
    block_used: Vec<u16>,
    free_blocks: u32,
}

const HELD: u32 = u32::MAX;

impl PortSpace {
    fn new(lo: u16, hi: u16, blocks: usize) -> Self {
        // Word by word: a /16 pool builds 196,608 of these at start.
        let mut used = Box::new([u64::MAX; WORDS]);
        for (w, word) in used.iter_mut().enumerate() {
            let (first, last) = (w as u32 * 64, w as u32 * 64 + 63);
            let (from, to) = (first.max(u32::from(lo)), last.min(u32::from(hi)));
            if from <= to {
                let bits = to - from + 1;
                let free = if bits == 64 { u64::MAX } else { ((1u64 << bits) - 1) << (from - first) };
                *word &= !free;
            }
        }
        PortSpace { used, free: u32::from(hi - lo) + 1, block_owner: vec![0; blocks], block_used: vec![0; blocks], free_blocks: blocks as u32 }
    }

    fn is_free(&self, p: u16) -> bool {
        self.used[usize::from(p) / 64] & (1u64 << (p % 64)) == 0
    }

    fn take(&mut self, p: u16) {
        self.used[usize::from(p) / 64] |= 1u64 << (p % 64);
        self.free -= 1;
    }

    fn put_back(&mut self, p: u16) {
        self.used[usize::from(p) / 64] &= !(1u64 << (p % 64));
        self.free += 1;
    }

    /// First free port in `lo..=hi`, scanning circularly from `start`, whose
    /// low bit equals `parity` when given.
    fn find(&self, start: u16, lo: u16, hi: u16, parity: Option<u16>) -> Option<u16> {
        let span = u32::from(hi - lo) + 1;
        let pmask = match parity {
            Some(0) => EVEN_BITS,
            Some(_) => !EVEN_BITS,
            None => u64::MAX,
        };
        let mut offset = 0u32;
        while offset < span {
            let p = (u32::from(start - lo) + offset) % span + u32::from(lo);
            let word = p as usize / 64;
            let bit = p % 64;
            // Free bits of this word at or after `bit`, within the range and parity.
            let mut avail = !self.used[word] & pmask & (u64::MAX << bit);
            let word_end = (word as u32 + 1) * 64 - 1;
            if word_end > u32::from(hi) {
                avail &= u64::MAX >> (word_end - u32::from(hi));
            }
            if avail != 0 {
                return Some((word as u32 * 64 + avail.trailing_zeros()) as u16);
            }
            let step = (word_end.min(u32::from(hi)) - p) + 1;
            offset += step;
        }
        None
    }
}

/// A port or block whose hold-down ends at `until_s`.
#[derive(Debug, Clone, Copy)]
struct Hold {
    until_s: u32,
    space: u32,
    item: u16,
    is_block: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    /// No free port (or block) on the address.
    Exhausted,
    /// Block mode: the subscriber holds as many blocks as its quota allows.
    BlockQuota,
}

/// Why a port or block another node allocated cannot be taken here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeError {
    /// Outside `nat.ports`.
    OutOfRange,
    /// In use here by another mapping or subscriber.
    Taken,
    /// Block mode: the port lies in a block its subscriber does not hold here.
    NotOwnersBlock,
    /// Not the first port of a block (or blocks are not configured).
    NotABlock,
}

/// A block handed to or taken back from a subscriber, for logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockChange {
    pub addr: u32,
    pub proto: Proto,
    pub first: u16,
    pub last: u16,
}

pub struct Pool {
    /// Every address ever in the pool, by index; indexes never change, so
    /// mappings keep theirs across reloads.
    addrs: Vec<u32>,
    /// The addresses in service, sorted, with their index.
    in_service: Vec<(u32, u32)>,
    /// `in_service`'s lowest address, its span above that (None: empty),
    /// and whether it fills the span: every packet asks `contains`.
    span: Option<(u32, u32, bool)>,
    spaces: Vec<PortSpace>,
    lo: u16,
    hi: u16,
    block_size: u16,
    selection: PortSelection,
    parity: bool,
    hold_down_s: u32,
    holds: VecDeque<Hold>,
    ports_in_use: u64,
}

impl Pool {
    pub fn new(addrs: &[u32], ports: (u16, u16), block_size: u16, selection: PortSelection, parity: bool, hold_down_s: u32) -> Self {
        let (lo, hi) = ports;
        let blocks = if block_size == 0 { 0 } else { (usize::from(hi - lo) + 1) / usize::from(block_size) };
        let spaces = (0..addrs.len() * Proto::WITH_PORTS).map(|_| PortSpace::new(lo, hi, blocks)).collect();
        let mut in_service: Vec<(u32, u32)> = addrs.iter().enumerate().map(|(i, &a)| (a, i as u32)).collect();
        in_service.sort_unstable();
        let mut pool = Pool { addrs: addrs.to_vec(), in_service, span: None, spaces, lo, hi, block_size, selection, parity, hold_down_s, holds: VecDeque::new(), ports_in_use: 0 };
        pool.measure_span();
        pool
    }

    fn measure_span(&mut self) {
        self.span = match (self.in_service.first(), self.in_service.last()) {
            (Some(&(first, _)), Some(&(last, _))) => Some((first, last - first, (last - first) as usize + 1 == self.in_service.len())),
            _ => None,
        };
    }

    /// The addresses in service, sorted.
    pub fn addresses(&self) -> impl Iterator<Item = u32> + '_ {
        self.in_service.iter().map(|&(a, _)| a)
    }

    /// Puts an address into service (a reload that grows the pool).
    pub fn add_address(&mut self, addr: u32) {
        if self.contains(addr) {
            return;
        }
        let blocks = if self.block_size == 0 { 0 } else { (usize::from(self.hi - self.lo) + 1) / usize::from(self.block_size) };
        let index = self.addrs.len() as u32;
        self.addrs.push(addr);
        self.spaces.extend((0..Proto::WITH_PORTS).map(|_| PortSpace::new(self.lo, self.hi, blocks)));
        let at = self.in_service.partition_point(|&(a, _)| a < addr);
        self.in_service.insert(at, (addr, index));
        self.measure_span();
    }

    /// Takes an address out of service; the caller has deleted its mappings.
    pub fn retire_address(&mut self, addr: u32) {
        self.in_service.retain(|&(a, _)| a != addr);
        self.measure_span();
    }

    pub fn set_policy(&mut self, selection: PortSelection, parity: bool, hold_down_s: u32) {
        self.selection = selection;
        self.parity = parity;
        self.hold_down_s = hold_down_s;
    }

    /// Asked of every packet: most are far outside the pool's range, and a
    /// pool without holes needs no search at all.
    #[inline]
    pub fn contains(&self, addr: u32) -> bool {
        let Some((first, span, dense)) = self.span else { return false };
        addr.wrapping_sub(first) <= span && (dense || self.index_of(addr).is_some())
    }

    pub fn index_of(&self, addr: u32) -> Option<u32> {
        self.in_service.binary_search_by_key(&addr, |&(a, _)| a).ok().map(|i| self.in_service[i].1)
    }

    pub fn total_ports(&self) -> u64 {
        self.in_service.len() as u64 * Proto::WITH_PORTS as u64 * (u64::from(self.hi - self.lo) + 1)
    }

    /// Ports held by mappings (or by blocks, in block mode).
    pub fn ports_in_use(&self) -> u64 {
        self.ports_in_use
    }

    pub fn block_size(&self) -> u16 {
        self.block_size
    }

    /// The address at `index` (a mapping's `ext_index`).
    pub fn address(&self, index: u32) -> u32 {
        self.addrs[index as usize]
    }

    fn space(&mut self, addr_idx: u32, proto: Proto) -> &mut PortSpace {
        debug_assert!((proto as usize) < Proto::WITH_PORTS, "{} allocates no ports", proto.name());
        &mut self.spaces[addr_idx as usize * Proto::WITH_PORTS + proto as usize]
    }

    fn has_room(&self, addr_idx: usize, proto: Proto) -> bool {
        if proto as usize >= Proto::WITH_PORTS {
            // SCTP takes no port (seed 001): any address in service will do.
            return true;
        }
        let s = &self.spaces[addr_idx * Proto::WITH_PORTS + proto as usize];
        if self.block_size == 0 {
            s.free > 0
        } else {
            s.free_blocks > 0
        }
    }

    /// Picks the address a new subscriber is paired with (RFC 4787 REQ-2):
    /// a hash of its address spreads subscribers, and probing skips addresses
    /// with no room for the protocol it starts with.
    pub fn choose_address(&self, start_hash: u64, proto: Proto) -> Option<u32> {
        let n = self.in_service.len();
        if n == 0 {
            return None;
        }
        let start = (start_hash % n as u64) as usize;
        (0..n).map(|i| self.in_service[(start + i) % n].1).find(|&i| self.has_room(i as usize, proto))
    }

    /// Marks a port taken for good (static mappings).
    pub fn reserve(&mut self, addr_idx: u32, proto: Proto, port: u16) -> bool {
        let (lo, hi) = (self.lo, self.hi);
        let s = self.space(addr_idx, proto);
        if port < lo || port > hi {
            return true; // outside the dynamic range: never allocated anyway
        }
        if !s.is_free(port) {
            return false;
        }
        s.take(port);
        true
    }

    /// Starts loading the word of the port map that says whether `port` is
    /// free on the address at `addr_idx`: what preserving that port reads.
    #[inline]
    pub fn prefetch_port(&self, addr_idx: u32, proto: Proto, port: u16) {
        if let Some(s) = self.spaces.get(addr_idx as usize * Proto::WITH_PORTS + proto as usize) {
            prefetch(&s.used[usize::from(port) / 64]);
        }
    }

    /// Whether a new mapping in one-at-a-time mode (`alloc_port`) keeps the
    /// subscriber's port when it is free; block mode keeps it only inside
    /// the subscriber's blocks.
    pub fn keeps_wanted_port(&self) -> bool {
        self.preserves() && self.block_size == 0
    }

    fn preserves(&self) -> bool {
        self.selection == PortSelection::Preserve
    }

    /// Allocates a port for one-at-a-time mode: the wanted one when
    /// preserving and free, else one of its parity, else any free port
    /// (parity is a recommendation, RFC 4787 REQ-4; a pool used in full is
    /// RFC 6888 REQ-13's).
    #[inline(always)]
    pub fn alloc_port(&mut self, addr_idx: u32, proto: Proto, want: u16, rng: &mut Rng) -> Result<u16, AllocError> {
        let (lo, hi) = (self.lo, self.hi);
        let parity = self.parity_of(proto, want);
        let preserve = self.preserves();
        let s = self.space(addr_idx, proto);
        let port = if preserve && (lo..=hi).contains(&want) && s.is_free(want) {
            Some(want)
        } else {
            let start = rng.range(u32::from(lo), u32::from(hi)) as u16;
            s.find(start, lo, hi, parity).or_else(|| s.find(start, lo, hi, None))
        };
        let port = port.ok_or(AllocError::Exhausted)?;
        s.take(port);
        self.ports_in_use += 1;
        Ok(port)
    }

    /// Allocates a port inside `range` (a deterministic subscriber's own
    /// ports, RFC 7422): the wanted port when preserving and free, else one
    /// of the same parity, else any free port of the range.
    pub fn alloc_port_in(&mut self, addr_idx: u32, proto: Proto, want: u16, range: (u16, u16), rng: &mut Rng) -> Result<u16, AllocError> {
        let (first, last) = range;
        let parity = self.parity_of(proto, want);
        let preserve = self.preserves() && (first..=last).contains(&want);
        let s = self.space(addr_idx, proto);
        let port = if preserve && s.is_free(want) {
            Some(want)
        } else {
            let start = rng.range(u32::from(first), u32::from(last)) as u16;
            s.find(start, first, last, parity).or_else(|| s.find(start, first, last, None))
        };
        let port = port.ok_or(AllocError::Exhausted)?;
        s.take(port);
        self.ports_in_use += 1;
        Ok(port)
    }

    fn parity_of(&self, proto: Proto, want: u16) -> Option<u16> {
        (self.parity && proto != Proto::Icmp).then_some(want & 1)
    }

    fn block_range(&self, block: u32) -> (u16, u16) {
        let first = u32::from(self.lo) + block * u32::from(self.block_size);
        (first as u16, (first + u32::from(self.block_size) - 1) as u16)
    }

    /// Allocates a port inside the subscriber's blocks: one of the wanted
    /// port's parity there, else in a new block, else (at its quota, or with
    /// no block free) any free port of its blocks. `blocks` lists the
    /// subscriber's blocks as (space, block).
    #[allow(clippy::too_many_arguments)]
    pub fn alloc_in_blocks(
        &mut self,
        addr_idx: u32,
        proto: Proto,
        want: u16,
        owner: u32,
        blocks: &mut Vec<(u32, u32)>,
        max_blocks: usize,
        rng: &mut Rng,
    ) -> Result<(u16, Option<BlockChange>), AllocError> {
        let space_idx = addr_idx * Proto::WITH_PORTS as u32 + proto as u32;
        let parity = self.parity_of(proto, want);
        let preserve = self.preserves();
        if let Some(p) = self.take_in_blocks(space_idx, blocks, want, parity) {
            return Ok((p, None));
        }
        let nblocks = self.spaces[space_idx as usize].block_owner.len() as u32;
        let at_quota = blocks.iter().filter(|(sp, _)| *sp == space_idx).count() >= max_blocks;
        if at_quota || nblocks == 0 || self.spaces[space_idx as usize].free_blocks == 0 {
            let other_parity = parity.and_then(|_| self.take_in_blocks(space_idx, blocks, want, None));
            return match other_parity {
                Some(p) => Ok((p, None)),
                None if at_quota => Err(AllocError::BlockQuota),
                None => Err(AllocError::Exhausted),
            };
        }
        let start = rng.range(0, nblocks - 1);
        let s = &self.spaces[space_idx as usize];
        let b = (0..nblocks).map(|i| (start + i) % nblocks).find(|&b| s.block_owner[b as usize] == 0).ok_or(AllocError::Exhausted)?;
        let (first, last) = self.block_range(b);
        let block_size = u64::from(self.block_size);
        let s = &mut self.spaces[space_idx as usize];
        s.block_owner[b as usize] = owner + 1;
        s.free_blocks -= 1;
        let start = if preserve && (first..=last).contains(&want) { want } else { first };
        let p = s.find(start, first, last, parity).or_else(|| s.find(first, first, last, None)).ok_or(AllocError::Exhausted)?;
        s.take(p);
        s.block_used[b as usize] += 1;
        blocks.push((space_idx, b));
        self.ports_in_use += block_size;
        Ok((p, Some(BlockChange { addr: self.addrs[addr_idx as usize], proto, first, last })))
    }

    /// Takes a free port of `parity` (any with None) in the subscriber's
    /// blocks of `space_idx`, the wanted one first where it lies in one and
    /// natrix preserves ports.
    fn take_in_blocks(&mut self, space_idx: u32, blocks: &[(u32, u32)], want: u16, parity: Option<u16>) -> Option<u16> {
        let preserve = self.preserves();
        for &(sp, b) in blocks.iter().filter(|(sp, _)| *sp == space_idx) {
            let (first, last) = self.block_range(b);
            let s = &mut self.spaces[sp as usize];
            let start = if preserve && (first..=last).contains(&want) { want } else { first };
            if let Some(p) = s.find(start, first, last, parity) {
                s.take(p);
                s.block_used[b as usize] += 1;
                return Some(p);
            }
        }
        None
    }

    /// Gives a port back. `immediate` skips the hold-down (TCP closed by FIN or
    /// RST, RFC 6888 REQ-8's exception). In block mode the port is free again at once
    /// inside its block, and an emptied block is released instead.
    pub fn release(&mut self, addr_idx: u32, proto: Proto, port: u16, now_s: u32, immediate: bool, blocks: &mut Vec<(u32, u32)>) -> Option<BlockChange> {
        let space_idx = addr_idx * Proto::WITH_PORTS as u32 + proto as u32;
        if self.block_size == 0 {
            if immediate || self.hold_down_s == 0 {
                self.spaces[space_idx as usize].put_back(port);
            } else {
                self.holds.push_back(Hold { until_s: now_s + self.hold_down_s, space: space_idx, item: port, is_block: false });
            }
            self.ports_in_use -= 1;
            return None;
        }
        let b = u32::from(port - self.lo) / u32::from(self.block_size);
        let s = &mut self.spaces[space_idx as usize];
        s.put_back(port);
        s.block_used[b as usize] -= 1;
        if s.block_used[b as usize] != 0 {
            return None;
        }
        s.block_owner[b as usize] = HELD;
        blocks.retain(|&(sp, bb)| !(sp == space_idx && bb == b));
        self.holds.push_back(Hold { until_s: now_s + self.hold_down_s, space: space_idx, item: b as u16, is_block: true });
        self.ports_in_use -= u64::from(self.block_size);
        let (first, last) = self.block_range(b);
        Some(BlockChange { addr: self.addrs[addr_idx as usize], proto, first, last })
    }

    /// Takes exactly `port` for a mapping another node made (session
    /// sync): in one-at-a-time mode the port must be free or held down
    /// here (the other node's hold-down ended first: the hold is cut
    /// short); in block mode it must be free inside a block `owner` holds.
    pub fn take_synced_port(&mut self, addr_idx: u32, proto: Proto, port: u16, owner: u32) -> Result<(), TakeError> {
        let space_idx = addr_idx * Proto::WITH_PORTS as u32 + proto as u32;
        if port < self.lo || port > self.hi {
            return Err(TakeError::OutOfRange);
        }
        if let Some(b) = (port - self.lo).checked_div(self.block_size) {
            let b = usize::from(b);
            let s = &mut self.spaces[space_idx as usize];
            if s.block_owner.get(b) != Some(&(owner + 1)) {
                return Err(TakeError::NotOwnersBlock);
            }
            if !s.is_free(port) {
                return Err(TakeError::Taken);
            }
            s.take(port);
            s.block_used[b] += 1;
            return Ok(());
        }
        if self.spaces[space_idx as usize].is_free(port) {
            self.spaces[space_idx as usize].take(port);
        } else if !self.cut_hold(space_idx, port, false) {
            return Err(TakeError::Taken);
        }
        self.ports_in_use += 1;
        Ok(())
    }

    /// Block mode: the first port of the block that holds `port`.
    pub fn block_start(&self, port: u16) -> Option<u16> {
        let b = port.checked_sub(self.lo)?.checked_div(self.block_size)?;
        Some(self.lo + b * self.block_size).filter(|_| port <= self.hi)
    }

    /// Gives `owner` the block starting at `first` that another node gave
    /// it (session sync): free, held down here, or already `owner`'s.
    pub fn take_synced_block(&mut self, addr_idx: u32, proto: Proto, first: u16, owner: u32, blocks: &mut Vec<(u32, u32)>) -> Result<(), TakeError> {
        let space_idx = addr_idx * Proto::WITH_PORTS as u32 + proto as u32;
        if self.block_size == 0 || first < self.lo || !(first - self.lo).is_multiple_of(self.block_size) {
            return Err(TakeError::NotABlock);
        }
        let b = u32::from((first - self.lo) / self.block_size);
        let Some(&current) = self.spaces[space_idx as usize].block_owner.get(b as usize) else { return Err(TakeError::NotABlock) };
        match current {
            c if c == owner + 1 => return Ok(()),
            0 => self.spaces[space_idx as usize].free_blocks -= 1,
            HELD if self.cut_hold(space_idx, b as u16, true) => {}
            _ => return Err(TakeError::Taken),
        }
        self.spaces[space_idx as usize].block_owner[b as usize] = owner + 1;
        blocks.push((space_idx, b));
        self.ports_in_use += u64::from(self.block_size);
        Ok(())
    }

    /// Ends one hold-down early; whether it was there.
    fn cut_hold(&mut self, space: u32, item: u16, is_block: bool) -> bool {
        match self.holds.iter().position(|h| h.space == space && h.item == item && h.is_block == is_block) {
            Some(i) => {
                self.holds.remove(i);
                true
            }
            None => false,
        }
    }

    /// Frees ports and blocks whose hold-down has ended.
    pub fn expire_holds(&mut self, now_s: u32) {
        while let Some(h) = self.holds.front().copied() {
            if h.until_s > now_s {
                break;
            }
            self.holds.pop_front();
            let s = &mut self.spaces[h.space as usize];
            if h.is_block {
                s.block_owner[usize::from(h.item)] = 0;
                s.free_blocks += 1;
            } else {
                s.put_back(h.item);
            }
        }
    }

    /// Bytes of allocator state.
    pub fn memory_bytes(&self) -> usize {
        self.spaces.len() * Self::space_bytes(self.spaces.first().map_or(0, |s| s.block_owner.len())) + self.holds.capacity() * 12
    }

    /// Bytes the port maps of `addresses` pool addresses take, built at start.
    pub fn reserved_bytes(addresses: usize, (lo, hi): (u16, u16), block_size: u16) -> usize {
        let blocks = if block_size == 0 { 0 } else { (usize::from(hi - lo) + 1) / usize::from(block_size) };
        addresses * Proto::WITH_PORTS * Self::space_bytes(blocks)
    }

    /// One address and protocol: the port bitmap and, in block mode, each
    /// block's owner (4 bytes) and use count (2).
    fn space_bytes(blocks: usize) -> usize {
        WORDS * 8 + blocks * 6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(lo: u16, hi: u16, block: u16) -> Pool {
        Pool::new(&[0xcb00_7101], (lo, hi), block, PortSelection::Preserve, true, 120)
    }

    #[test]
    fn contains_exactly_the_addresses_in_service() {
        let base = 0xcb00_7100;
        let mut p = Pool::new(&[base + 3, base + 1, base + 2], (1024, 65535), 0, PortSelection::Preserve, true, 120);
        let inside = |p: &Pool| (base..base + 6).filter(|&a| p.contains(a)).map(|a| a - base).collect::<Vec<_>>();
        assert_eq!(inside(&p), vec![1, 2, 3]);
        p.retire_address(base + 2);
        assert_eq!(inside(&p), vec![1, 3]);
        p.add_address(base + 5);
        assert_eq!(inside(&p), vec![1, 3, 5]);
        assert!(!p.contains(0) && !p.contains(u32::MAX));
    }

    #[test]
    fn a_new_space_has_exactly_its_range_free() {
        for (lo, hi) in [(1024, 65535), (1, 65535), (1000, 1063), (4000, 4000), (63, 64), (5000, 6100)] {
            let s = PortSpace::new(lo, hi, 0);
            let free: Vec<u32> = (0..=65535u32).filter(|&p| s.is_free(p as u16)).collect();
            assert_eq!(free.len() as u32, u32::from(hi - lo) + 1, "{lo}-{hi}");
            assert_eq!((free[0], *free.last().unwrap()), (u32::from(lo), u32::from(hi)));
            assert_eq!(s.free, u32::from(hi - lo) + 1);
        }
    }

    #[test]
    fn preserves_then_keeps_parity() {
        let mut p = pool(1024, 65535, 0);
        let mut rng = Rng::new(1);
        assert_eq!(p.alloc_port(0, Proto::Udp, 5001, &mut rng), Ok(5001));
        let second = p.alloc_port(0, Proto::Udp, 5001, &mut rng).unwrap();
        assert_ne!(second, 5001);
        assert_eq!(second & 1, 1);
        // Low ports are outside the range: mapped into it, parity kept.
        let low = p.alloc_port(0, Proto::Udp, 53, &mut rng).unwrap();
        assert!(low >= 1024 && low & 1 == 1);
    }

    #[test]
    fn exhausts_a_small_range_and_hold_down_returns_ports() {
        let mut p = pool(5000, 5003, 0);
        let mut rng = Rng::new(1);
        let mut got: Vec<u16> = (0..4).map(|i| p.alloc_port(0, Proto::Tcp, 5000 + i, &mut rng).unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, vec![5000, 5001, 5002, 5003]);
        assert_eq!(p.alloc_port(0, Proto::Tcp, 5000, &mut rng), Err(AllocError::Exhausted));
        let mut none = Vec::new();
        p.release(0, Proto::Tcp, 5000, 10, false, &mut none);
        p.expire_holds(129);
        assert_eq!(p.alloc_port(0, Proto::Tcp, 5000, &mut rng), Err(AllocError::Exhausted));
        p.expire_holds(130);
        assert_eq!(p.alloc_port(0, Proto::Tcp, 5000, &mut rng), Ok(5000));
        p.release(0, Proto::Tcp, 5001, 200, true, &mut none);
        assert_eq!(p.alloc_port(0, Proto::Tcp, 5001, &mut rng), Ok(5001));
    }

    #[test]
    fn parity_search_finds_the_only_matching_port() {
        let mut p = pool(5000, 5003, 0);
        let mut rng = Rng::new(3);
        for port in [5000, 5001, 5002] {
            p.alloc_port(0, Proto::Udp, port, &mut rng).unwrap();
        }
        assert_eq!(p.alloc_port(0, Proto::Udp, 7, &mut rng), Ok(5003));
        assert_eq!(p.alloc_port(0, Proto::Udp, 7, &mut rng), Err(AllocError::Exhausted));
    }

    /// Parity is kept while ports of it are free, never at the price of a
    /// refusal while others are (Linux picks even ports for connect()).
    #[test]
    fn a_parity_used_up_gives_a_port_of_the_other() {
        let mut p = pool(5000, 5003, 0);
        let mut rng = Rng::new(3);
        for port in [5000, 5002] {
            assert_eq!(p.alloc_port(0, Proto::Tcp, port, &mut rng), Ok(port));
        }
        let odd = p.alloc_port(0, Proto::Tcp, 6000, &mut rng).unwrap();
        assert_eq!(odd & 1, 1, "{odd}");
    }

    #[test]
    fn in_blocks_a_parity_used_up_takes_a_new_block_then_the_other_parity() {
        let mut p = pool(1024, 65535, 64);
        let mut rng = Rng::new(1);
        for max_blocks in [1, 2] {
            let mut blocks = Vec::new();
            let owner = max_blocks as u32;
            for i in 0..32u16 {
                p.alloc_in_blocks(0, Proto::Tcp, 40000 + 2 * i, owner, &mut blocks, max_blocks, &mut rng).unwrap();
            }
            let (port, change) = p.alloc_in_blocks(0, Proto::Tcp, 50000, owner, &mut blocks, max_blocks, &mut rng).unwrap();
            if max_blocks == 1 {
                assert!(change.is_none() && port & 1 == 1, "at its quota: an odd port of its block, {port}");
            } else {
                assert!(change.is_some() && port & 1 == 0, "below it: a new block, parity kept, {port}");
            }
        }
    }

    #[test]
    fn blocks_are_consecutive_and_released_when_empty() {
        let mut p = pool(1024, 65535, 64);
        let mut rng = Rng::new(1);
        let mut blocks = Vec::new();
        let (port, change) = p.alloc_in_blocks(0, Proto::Udp, 40000, 7, &mut blocks, 4, &mut rng).unwrap();
        let change = change.unwrap();
        assert_eq!(change.last - change.first, 63);
        assert_eq!((change.first - 1024) % 64, 0);
        assert!((change.first..=change.last).contains(&port));
        for i in 0..63u16 {
            let (q, c) = p.alloc_in_blocks(0, Proto::Udp, 40001 + i, 7, &mut blocks, 4, &mut rng).unwrap();
            assert!(c.is_none() && (change.first..=change.last).contains(&q));
        }
        let (_, c) = p.alloc_in_blocks(0, Proto::Udp, 1, 7, &mut blocks, 4, &mut rng).unwrap();
        assert!(c.is_some());
        assert_eq!(blocks.len(), 2);
        assert_eq!(p.release(0, Proto::Udp, port, 5, false, &mut blocks), None);
    }

    #[test]
    fn find_scans_whole_range_circularly() {
        let s = PortSpace::new(10, 200, 0);
        assert_eq!(s.find(150, 10, 200, None), Some(150));
        assert_eq!(s.find(200, 10, 200, Some(0)), Some(200));
        assert_eq!(s.find(199, 10, 200, Some(1)), Some(199));
        let mut t = PortSpace::new(10, 200, 0);
        for p in 100..=200 {
            t.take(p);
        }
        assert_eq!(t.find(150, 10, 200, None), Some(10));
    }
}
