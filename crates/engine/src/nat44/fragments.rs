//! IPv4 fragments translated without reassembly.
//!
//! Only the first fragment carries ports. Once it is translated, the rewrite
//! it received is remembered under (source, destination, protocol, IP ID,
//! arrival side) so the later fragments get the same addresses. Fragments
//! that arrive before their first one wait in a buffer bounded in count and
//! bytes, and are dropped when the fragment timeout passes.

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
    held: VecDeque<Held>,
    held_bytes: usize,
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
            held: VecDeque::with_capacity(max_held),
            held_bytes: 0,
            max_held,
            max_held_bytes,
            spare: Vec::new(),
            timeout_ns,
            seed,
        }
    }

    /// A reload's limits, at `now_ns`: for what arrives from now on; what
    /// is held already stays until its first fragment or its time is up.
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

    /// Keeps a copy of an early fragment; false when the buffer is at its cap.
    pub fn hold(&mut self, key: FragKey, frame: &[u8], l3: usize, now_ns: u64) -> bool {
        if self.held.len() >= self.max_held || self.held_bytes + frame.len() > self.max_held_bytes {
            return false;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.held_bytes += frame.len();
        self.held.push_back(Held { key, arrived_ns: now_ns, frame: buf, l3 });
        true
    }

    /// Removes and hands over every held fragment of `key`, oldest first.
    pub fn take_held(&mut self, key: &FragKey, mut f: impl FnMut(&mut Held)) {
        if self.held.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].key == *key {
                if let Some(mut h) = self.held.remove(i) {
                    self.held_bytes -= h.frame.len();
                    f(&mut h);
                    self.spare.push(h.frame);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Drops held fragments older than the timeout; returns how many.
    pub fn expire(&mut self, now_ns: u64) -> u64 {
        let mut n = 0;
        while let Some(h) = self.held.front() {
            if h.arrived_ns + self.timeout_ns > now_ns {
                break;
            }
            if let Some(h) = self.held.pop_front() {
                self.held_bytes -= h.frame.len();
                self.spare.push(h.frame);
                n += 1;
            }
        }
        n
    }

    /// Drops everything still held (end of a replay); returns how many.
    pub fn drop_all_held(&mut self) -> u64 {
        let n = self.held.len() as u64;
        while let Some(h) = self.held.pop_front() {
            self.spare.push(h.frame);
        }
        self.held_bytes = 0;
        n
    }

    pub fn held_count(&self) -> usize {
        self.held.len()
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
