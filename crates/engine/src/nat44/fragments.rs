//! IPv4 fragments translated without reassembly.
//!
//! Only the first fragment carries ports. Once it is translated, the rewrite
//! it received is remembered under (source, destination, protocol, IP ID,
//! arrival side) so the later fragments get the same addresses. Fragments
//! that arrive before their first one wait in a buffer bounded in count and
//! bytes, and are dropped when the fragment timeout passes.
//!
//! A full buffer makes room by dropping its oldest fragment rather than
//! refusing the new one: junk fragments that never get a first (anyone can
//! send them) then only shorten how long a real one may wait, where a
//! refusal would let a trickle of junk, a buffer's worth per timeout, stop
//! every real out-of-order fragment. Each side keeps half the buffer for
//! itself: the victim is taken from the arriving fragment's side once that
//! side holds its half, so a flood from outside cannot push out the
//! subscribers' fragments, nor the other way round.

use std::collections::VecDeque;

use natrix_wire::ipv4;

use crate::drop::DropReason;
use crate::nat44::Nat44;
use crate::pipeline::frame::Ip;
use crate::pipeline::router::Router;
use crate::rewrite::{self, Which, L4};
use crate::state::hash;
use crate::state::index::FlowIndex;
use crate::Side;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragKey {
    pub src: u32,
    pub dst: u32,
    pub ident: u16,
    pub proto: u8,
    pub side: Side,
}

impl FragKey {
    fn hash(&self, seed: u64) -> u64 {
        hash::five_tuple(seed, self.proto, self.src, self.ident, self.dst, self.side as u16)
    }
}

/// The addresses the first fragment left with, and where it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragRewrite {
    pub src: u32,
    pub dst: u32,
    pub out: Side,
}

#[derive(Clone, Copy)]
struct Record {
    key: FragKey,
    rewrite: FragRewrite,
    expires_ns: u64,
}

pub struct Held {
    pub key: FragKey,
    pub arrived_ns: u64,
    pub frame: Vec<u8>,
    pub l3: usize,
}

pub struct Fragments {
    records: Vec<Record>,
    index: FlowIndex,
    /// Record slots in creation order; the oldest is reused when all are taken.
    order: VecDeque<u32>,
    cap: usize,
    /// Held fragments by arrival side, oldest first.
    held: [VecDeque<Held>; 2],
    /// Bytes held by arrival side.
    held_bytes: [usize; 2],
    crowded_out: u64,
    max_held: usize,
    max_held_bytes: usize,
    spare: Vec<Vec<u8>>,
    timeout_ns: u64,
    /// Seeds the index's hash, like every other table's.
    seed: u64,
}

impl Fragments {
    pub fn new(max_records: usize, max_held: usize, max_held_bytes: usize, timeout_ns: u64, seed: u64) -> Self {
        Fragments {
            records: Vec::with_capacity(max_records),
            index: FlowIndex::with_capacity(max_records),
            order: VecDeque::with_capacity(max_records),
            cap: max_records,
            held: [VecDeque::with_capacity(max_held), VecDeque::with_capacity(max_held)],
            held_bytes: [0; 2],
            crowded_out: 0,
            max_held,
            max_held_bytes,
            spare: Vec::new(),
            timeout_ns,
            seed,
        }
    }

    /// A reload's limits, at `now_ns`: for what arrives from now on; what
    /// is held already stays until its first fragment or its time is up,
    /// or, past lower limits, until new fragments push it out.
    /// A record of a first fragment lasts no longer than the new timeout
    /// allows: what it names (a DS-Lite stand-in) is kept that long only.
    pub fn set_limits(&mut self, max_held: usize, max_held_bytes: usize, timeout_ns: u64, now_ns: u64) {
        (self.max_held, self.max_held_bytes, self.timeout_ns) = (max_held, max_held_bytes, timeout_ns);
        let latest = now_ns.saturating_add(timeout_ns);
        for r in &mut self.records {
            r.expires_ns = r.expires_ns.min(latest);
        }
    }

    pub fn lookup(&self, key: &FragKey, now_ns: u64) -> Option<FragRewrite> {
        let r = &self.records;
        self.index.find(key.hash(self.seed), |i| r[i as usize].key == *key && r[i as usize].expires_ns > now_ns).map(|i| r[i as usize].rewrite)
    }

    /// Remembers the first fragment's rewrite.
    pub fn record(&mut self, key: FragKey, rewrite: FragRewrite, now_ns: u64) {
        let rec = Record { key, rewrite, expires_ns: now_ns + self.timeout_ns };
        let r = &self.records;
        if let Some(i) = self.index.find(key.hash(self.seed), |i| r[i as usize].key == key) {
            self.records[i as usize] = rec;
            return;
        }
        let id = if self.records.len() < self.cap {
            self.records.push(rec);
            (self.records.len() - 1) as u32
        } else {
            let Some(old) = self.order.pop_front() else { return };
            let old_key = self.records[old as usize].key;
            self.index.remove(old_key.hash(self.seed), old);
            self.records[old as usize] = rec;
            old
        };
        if self.index.insert(key.hash(self.seed), id).is_ok() {
            self.order.push_back(id);
        }
    }

    /// Keeps a copy of an early fragment, making room by dropping the
    /// oldest ones (see the module's text, and `take_crowded_out`); false
    /// when the fragment alone is more than the buffer holds.
    pub fn hold(&mut self, key: FragKey, frame: &[u8], l3: usize, now_ns: u64) -> bool {
        if self.max_held == 0 || frame.len() > self.max_held_bytes {
            return false;
        }
        while self.held_count() >= self.max_held || self.total_bytes() + frame.len() > self.max_held_bytes {
            let victim = self.victim_side(key.side, frame.len());
            let Some(h) = self.held[victim as usize].pop_front() else { break };
            self.release(victim, h);
            self.crowded_out += 1;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.held_bytes[key.side as usize] += frame.len();
        self.held[key.side as usize].push_back(Held { key, arrived_ns: now_ns, frame: buf, l3 });
        true
    }

    /// How many held fragments were dropped to make room since the last call.
    pub fn take_crowded_out(&mut self) -> u64 {
        std::mem::take(&mut self.crowded_out)
    }

    /// The side whose oldest fragment makes room for one of `len` bytes
    /// arriving on `side`: its own once that side holds its half in count
    /// or would pass it in bytes (or the other holds nothing), else the other's.
    fn victim_side(&self, side: Side, len: usize) -> Side {
        let own = side as usize;
        let at_half = self.held[own].len() * 2 >= self.max_held || (self.held_bytes[own] + len) * 2 > self.max_held_bytes;
        if at_half || self.held[side.other() as usize].is_empty() {
            side
        } else {
            side.other()
        }
    }

    fn release(&mut self, side: Side, h: Held) {
        self.held_bytes[side as usize] -= h.frame.len();
        self.spare.push(h.frame);
    }

    fn total_bytes(&self) -> usize {
        self.held_bytes[0] + self.held_bytes[1]
    }

    /// Removes and hands over every held fragment of `key`, oldest first.
    pub fn take_held(&mut self, key: &FragKey, mut f: impl FnMut(&mut Held)) {
        let side = key.side as usize;
        let mut i = 0;
        while i < self.held[side].len() {
            if self.held[side][i].key == *key {
                if let Some(mut h) = self.held[side].remove(i) {
                    f(&mut h);
                    self.release(key.side, h);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Drops held fragments older than the timeout; returns how many.
    pub fn expire(&mut self, now_ns: u64) -> u64 {
        let mut n = 0;
        for side in [Side::Inside, Side::Outside] {
            while self.held[side as usize].front().is_some_and(|h| h.arrived_ns + self.timeout_ns <= now_ns) {
                if let Some(h) = self.held[side as usize].pop_front() {
                    self.release(side, h);
                    n += 1;
                }
            }
        }
        n
    }

    /// Drops everything still held (end of a replay); returns how many.
    pub fn drop_all_held(&mut self) -> u64 {
        let n = self.held_count() as u64;
        for side in [Side::Inside, Side::Outside] {
            while let Some(h) = self.held[side as usize].pop_front() {
                self.release(side, h);
            }
        }
        n
    }

    pub fn held_count(&self) -> usize {
        self.held[0].len() + self.held[1].len()
    }
}

impl Nat44 {
    /// A later fragment leaves as its first fragment did; before its first
    /// one is seen it waits (None), or is dropped when the buffer is full.
    pub(super) fn later_fragment(&mut self, frame: &mut [u8], ip: &Ip, side: Side) -> Result<Option<Side>, DropReason> {
        let key = FragKey { src: ip.src, dst: ip.dst, ident: ip.ident, proto: ip.proto, side };
        if let Some(rw) = self.frags.lookup(&key, self.now_ns) {
            apply_fragment_rewrite(frame, ip.l3, rw);
            return Ok(Some(rw.out));
        }
        if self.frags.hold(key, frame, ip.l3, self.now_ns) {
            Ok(None)
        } else {
            Err(DropReason::FragmentBufferFull)
        }
    }

    /// Remembers how a translated first fragment left, and releases the
    /// later fragments that waited for it, rewritten the same way.
    pub(super) fn record_first_fragment(&mut self, frame: &[u8], ip: &Ip, arrived: Side, out: Side, router: &mut Router) {
        let now = ipv4::Packet::new_lax(&frame[ip.l3..]).map(|p| (p.src_addr(), p.dst_addr())).unwrap_or((ip.src, ip.dst));
        let key = FragKey { src: ip.src, dst: ip.dst, ident: ip.ident, proto: ip.proto, side: arrived };
        let rw = FragRewrite { src: now.0, dst: now.1, out };
        self.frags.record(key, rw, self.now_ns);
        self.frags.take_held(&key, |h| {
            apply_fragment_rewrite(&mut h.frame, h.l3, rw);
            rewrite::decrement_ttl(&mut h.frame, h.l3);
            router.release(rw.out, &h.frame);
        });
    }
}

fn apply_fragment_rewrite(frame: &mut [u8], l3: usize, rw: FragRewrite) {
    let Ok(p) = ipv4::Packet::new_lax(&frame[l3..]) else { return };
    let (src, dst) = (p.src_addr(), p.dst_addr());
    if src != rw.src {
        rewrite::rewrite(frame, l3, L4::None, Which::Src, rw.src, 0);
    }
    if dst != rw.dst {
        rewrite::rewrite(frame, l3, L4::None, Which::Dst, rw.dst, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn key(side: Side, ident: u16) -> FragKey {
        FragKey { src: 0x0a00_0001, dst: 0xc633_6401, ident, proto: 17, side }
    }

    fn buffer(max_held: usize, max_bytes: usize) -> Fragments {
        Fragments::new(16, max_held, max_bytes, 5 * SEC, 7)
    }

    fn still_held(f: &Fragments, k: FragKey) -> usize {
        f.held[k.side as usize].iter().filter(|h| h.key == k).count()
    }

    #[test]
    fn a_full_buffer_drops_its_oldest_to_hold_the_newest() {
        let mut f = buffer(4, 1 << 20);
        for ident in 0..6 {
            assert!(f.hold(key(Side::Outside, ident), &[0; 100], 14, SEC));
        }
        assert_eq!((f.held_count(), f.take_crowded_out(), f.take_crowded_out()), (4, 2, 0));
        assert_eq!(still_held(&f, key(Side::Outside, 1)), 0, "among the two oldest");
        assert_eq!(still_held(&f, key(Side::Outside, 2)), 1);
        assert_eq!(still_held(&f, key(Side::Outside, 5)), 1);
    }

    #[test]
    fn a_flood_from_one_side_leaves_the_other_sides_half() {
        let mut f = buffer(8, 1 << 20);
        for ident in 0..3 {
            f.hold(key(Side::Inside, ident), &[0; 100], 14, SEC);
        }
        for ident in 0..1000 {
            f.hold(key(Side::Outside, ident), &[0; 100], 14, SEC);
        }
        assert_eq!(f.take_crowded_out(), 1000 - 5);
        for ident in 0..3 {
            assert_eq!(still_held(&f, key(Side::Inside, ident)), 1, "inside fragment {ident}");
        }
    }

    #[test]
    fn a_side_past_its_half_makes_room_for_the_other() {
        let mut f = buffer(8, 1 << 20);
        for ident in 0..8 {
            f.hold(key(Side::Inside, ident), &[0; 100], 14, SEC);
        }
        for ident in 0..4 {
            f.hold(key(Side::Outside, ident), &[0; 100], 14, SEC);
        }
        assert_eq!(f.take_crowded_out(), 4);
        assert_eq!(still_held(&f, key(Side::Inside, 3)), 0, "the inside's four oldest made room");
        assert_eq!(still_held(&f, key(Side::Inside, 4)), 1);
        // Now at its half, the outside makes room from its own.
        f.hold(key(Side::Outside, 9), &[0; 100], 14, SEC);
        assert_eq!(still_held(&f, key(Side::Outside, 0)), 0);
        assert_eq!(still_held(&f, key(Side::Inside, 5)), 1);
    }

    #[test]
    fn the_byte_limit_makes_room_too_and_a_fragment_larger_than_the_buffer_is_refused() {
        let mut f = buffer(100, 1000);
        for ident in 0..3 {
            assert!(f.hold(key(Side::Outside, ident), &[0; 400], 14, SEC));
        }
        assert_eq!((f.held_count(), f.take_crowded_out()), (2, 1));
        assert!(!f.hold(key(Side::Outside, 9), &[0; 1001], 14, SEC));
        assert_eq!((f.held_count(), f.take_crowded_out()), (2, 0), "a refusal drops nothing held");
    }

    #[test]
    fn a_large_fragment_past_its_sides_byte_half_makes_room_from_its_own_side() {
        let mut f = buffer(100, 1000);
        f.hold(key(Side::Inside, 1), &[0; 400], 14, SEC);
        f.hold(key(Side::Outside, 1), &[0; 300], 14, SEC);
        f.hold(key(Side::Outside, 2), &[0; 350], 14, SEC);
        assert_eq!(f.take_crowded_out(), 1);
        assert_eq!(still_held(&f, key(Side::Inside, 1)), 1, "the inside holds less than its half");
        assert_eq!(still_held(&f, key(Side::Outside, 1)), 0);
    }

    #[test]
    fn held_fragments_of_both_sides_time_out() {
        let mut f = buffer(8, 1 << 20);
        f.hold(key(Side::Inside, 1), &[0; 100], 14, SEC);
        f.hold(key(Side::Outside, 1), &[0; 100], 14, 2 * SEC);
        assert_eq!(f.expire(6 * SEC), 1);
        assert_eq!(f.expire(7 * SEC), 1);
        assert_eq!(f.held_count(), 0);
    }
}
