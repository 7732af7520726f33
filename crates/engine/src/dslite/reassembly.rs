//! Reassembly of fragmented softwire packets before decapsulation (RFC 6333
//! section 6.3: a B4 fragments the outer IPv6 packet, and the AFTR
//! reassembles it). Memory is bounded by the `[fragments]` limits: at most
//! `max_held` fragments and `max_held_bytes` bytes wait at once, each packet
//! for at most `timeouts.fragment`. Overlapping fragments void their packet
//! (RFC 5722).

use std::collections::BTreeMap;
use std::net::Ipv6Addr;

use super::ecn::FragmentMarks;
use crate::drop::DropReason;

/// Largest IPv4 packet a softwire can carry.
const MAX_PACKET: usize = 65_535;

struct Partial {
    started_ns: u64,
    /// The packet so far, grown to the furthest fragment's end.
    data: Vec<u8>,
    /// Byte ranges received, unordered.
    have: Vec<(usize, usize)>,
    /// Known once the last fragment (M clear) arrives.
    total: Option<usize>,
    fragments: u32,
    /// The outer ECN fields of its fragments.
    marks: FragmentMarks,
}

impl Partial {
    fn complete(&self) -> bool {
        let Some(total) = self.total else { return false };
        let mut ranges = self.have.clone();
        ranges.sort_unstable();
        let mut reached = 0;
        for (start, end) in ranges {
            if start > reached {
                return false;
            }
            reached = reached.max(end);
        }
        reached == total
    }
}

/// One fragment of a softwire packet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece<'a> {
    pub b4: Ipv6Addr,
    pub ident: u32,
    /// Byte offset in the inner packet.
    pub offset: usize,
    pub more: bool,
    /// The outer header's ECN field.
    pub ecn: u8,
    pub data: &'a [u8],
}

/// A packet its fragments made whole, and the outer ECN they carried.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reassembled {
    pub packet: Vec<u8>,
    pub marks: FragmentMarks,
}

pub(crate) struct Reassembly {
    partials: BTreeMap<(Ipv6Addr, u32), Partial>,
    held_fragments: u32,
    held_bytes: usize,
    max_fragments: u32,
    max_bytes: usize,
    timeout_ns: u64,
}

impl Reassembly {
    pub fn new(max_fragments: u32, max_bytes: u32, timeout_ns: u64) -> Reassembly {
        Reassembly { partials: BTreeMap::new(), held_fragments: 0, held_bytes: 0, max_fragments, max_bytes: max_bytes as usize, timeout_ns }
    }

    /// A reload's limits: for what arrives from now on.
    pub fn set_limits(&mut self, max_fragments: u32, max_bytes: u32, timeout_ns: u64) {
        (self.max_fragments, self.max_bytes, self.timeout_ns) = (max_fragments, max_bytes as usize, timeout_ns);
    }

    pub fn is_empty(&self) -> bool {
        self.partials.is_empty()
    }

    /// Adds a fragment: Ok(Some(packet)) when it completes one, Ok(None)
    /// while it waits, Err when it cannot be kept (its packet is then
    /// forgotten, so a retransmission starts afresh).
    pub fn add(&mut self, p: Piece, now_ns: u64) -> Result<Option<Reassembled>, DropReason> {
        let end = p.offset + p.data.len();
        let key = (p.b4, p.ident);
        if end > MAX_PACKET || (p.more && !p.data.len().is_multiple_of(8)) || p.data.is_empty() {
            self.forget(key);
            return Err(DropReason::DsliteBadFragment);
        }
        // What the packet's buffer grows by, up to the fragment's end: a
        // lone fragment at offset 65,520 holds 64 KiB, not its 8 bytes.
        let grows = end.saturating_sub(self.partials.get(&key).map_or(0, |part| part.data.len()));
        if self.held_fragments >= self.max_fragments || self.held_bytes + grows > self.max_bytes {
            return Err(DropReason::FragmentBufferFull);
        }
        let part = self.partials.entry(key).or_insert_with(|| Partial {
            started_ns: now_ns,
            data: Vec::new(),
            have: Vec::new(),
            total: None,
            fragments: 0,
            marks: FragmentMarks::default(),
        });
        let overlaps = part.have.iter().any(|&(s, e)| p.offset < e && s < end);
        let beyond_total = part.total.is_some_and(|t| end > t || (!p.more && end != t));
        let before_last = !p.more && part.have.iter().any(|&(_, e)| e > end);
        if overlaps || beyond_total || before_last {
            self.forget(key);
            return Err(DropReason::DsliteBadFragment);
        }
        if part.data.len() < end {
            part.data.resize(end, 0);
        }
        part.data[p.offset..end].copy_from_slice(p.data);
        part.have.push((p.offset, end));
        part.fragments += 1;
        part.marks.add(p.ecn, p.offset);
        if !p.more {
            part.total = Some(end);
        }
        self.held_fragments += 1;
        self.held_bytes += grows;
        if !part.complete() {
            return Ok(None);
        }
        Ok(self.forget(key).map(|p| Reassembled { packet: p.data, marks: p.marks }))
    }

    /// Drops packets that waited longer than the timeout; returns how many.
    pub fn expire(&mut self, now_ns: u64) -> u64 {
        let stale: Vec<_> = self.partials.iter().filter(|(_, p)| now_ns.saturating_sub(p.started_ns) >= self.timeout_ns).map(|(k, _)| *k).collect();
        stale.into_iter().map(|k| self.forget(k).map_or(0, |_| 1)).sum::<u64>()
    }

    /// Drops every packet still waiting (the end of a capture); returns how many.
    pub fn clear(&mut self) -> u64 {
        let n = self.partials.len() as u64;
        self.partials.clear();
        (self.held_fragments, self.held_bytes) = (0, 0);
        n
    }

    fn forget(&mut self, key: (Ipv6Addr, u32)) -> Option<Partial> {
        let p = self.partials.remove(&key)?;
        self.held_fragments -= p.fragments;
        self.held_bytes -= p.data.len();
        Some(p)
    }

    pub fn memory_bytes(&self) -> usize {
        self.partials.values().map(|p| p.data.capacity() + std::mem::size_of::<Partial>()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(ident: u32, offset: usize, more: bool, data: &[u8]) -> Piece<'_> {
        Piece { b4: "2001:db8:100::2".parse().unwrap(), ident, offset, more, ecn: 0, data }
    }

    /// The byte limit counts what a packet's buffer holds: a lone last
    /// fragment far into the packet holds everything before it.
    #[test]
    fn a_fragment_far_into_its_packet_counts_the_buffer_it_needs() {
        let mut r = Reassembly::new(16, 4096, 5_000_000_000);
        assert_eq!(r.add(piece(1, 65_520, false, &[1; 8]), 0), Err(DropReason::FragmentBufferFull));
        assert_eq!(r.add(piece(2, 2048, true, &[1; 8]), 0), Ok(None));
        assert_eq!(r.add(piece(3, 2048, true, &[1; 8]), 0), Err(DropReason::FragmentBufferFull), "2056 held, 2056 more wanted");
        assert_eq!(r.add(piece(2, 0, true, &[2; 2048]), 0), Ok(None), "filling in below costs nothing more");
        assert_eq!(r.expire(5_000_000_000), 1);
        assert_eq!(r.add(piece(3, 2048, true, &[1; 8]), 5_000_000_000), Ok(None), "expiry gives the room back");
    }

    #[test]
    fn fragments_in_any_order_make_the_packet() {
        let mut r = Reassembly::new(16, 1 << 16, 5_000_000_000);
        let packet: Vec<u8> = (0..100u8).collect();
        assert_eq!(r.add(piece(1, 48, false, &packet[48..]), 0), Ok(None));
        assert_eq!(r.add(piece(1, 0, true, &packet[..24]), 1), Ok(None));
        assert_eq!(r.add(piece(1, 24, true, &packet[24..48]), 2).map(|r| r.map(|r| r.packet)), Ok(Some(packet)));
        assert!(r.is_empty());
        assert_eq!((r.held_fragments, r.held_bytes), (0, 0));
    }

    #[test]
    fn limits_set_by_a_reload_hold_for_what_arrives_next() {
        let mut r = Reassembly::new(16, 1 << 16, 5_000_000_000);
        let data = [7u8; 8];
        assert_eq!(r.add(piece(1, 0, true, &data), 0), Ok(None));
        r.set_limits(1, 1 << 16, 1_000_000_000);
        assert_eq!(r.add(piece(2, 0, true, &data), 0), Err(DropReason::FragmentBufferFull));
        assert_eq!(r.expire(1_000_000_000), 1, "the shorter timeout");
        assert_eq!(r.add(piece(2, 0, true, &data), 1_000_000_000), Ok(None));
    }

    #[test]
    fn overlaps_void_the_packet_and_limits_hold() {
        let mut r = Reassembly::new(2, 1 << 16, 5_000_000_000);
        let data = [7u8; 64];
        assert_eq!(r.add(piece(1, 0, true, &data[..16]), 0), Ok(None));
        assert_eq!(r.add(piece(1, 8, true, &data[..16]), 0), Err(DropReason::DsliteBadFragment));
        assert!(r.is_empty(), "RFC 5722: the whole packet goes");
        assert_eq!(r.add(piece(2, 0, true, &data[..8]), 0), Ok(None));
        assert_eq!(r.add(piece(3, 0, true, &data[..8]), 0), Ok(None));
        assert_eq!(r.add(piece(4, 0, true, &data[..8]), 0), Err(DropReason::FragmentBufferFull));
        assert_eq!(r.expire(5_000_000_000), 2);
        assert_eq!(r.add(piece(4, 0, true, &data[..8]), 5_000_000_000), Ok(None));
        assert_eq!(r.add(piece(5, 0, true, &data[..7]), 0), Err(DropReason::DsliteBadFragment), "a middle fragment is a multiple of 8 bytes");
    }
}
