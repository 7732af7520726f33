//! Batch prefetching. A lookup in a table much larger than the caches costs
//! a memory round trip (100+ ns) for the index bucket and another for the
//! mapping record; done one packet at a time they serialise. A caller holding
//! a batch of frames calls `prefetch_batch` before processing them: it hashes
//! every frame once, starts loading all their buckets, then (by the time
//! those have arrived) the records they point at, so the loads of the whole
//! batch overlap. Only hints: a wrong guess costs a wasted load, never a
//! wrong answer.

use natrix_wire::{ethernet, get_u16_at, get_u32_at, proto};

use crate::engine::Engine;
use crate::{Proto, Side};

/// Frames prefetched together at most; longer batches are taken in chunks.
pub const MAX_BATCH: usize = 64;

impl Engine {
    /// Starts loading the table lines `frames` will need on `side`.
    pub fn prefetch_batch<'a>(&self, frames: impl IntoIterator<Item = &'a [u8]>, side: Side) {
        let mut hashes = [0u64; MAX_BATCH];
        let mut n = 0;
        for frame in frames {
            if let Some(h) = self.lookup_hash(frame, side) {
                self.tables.prefetch_bucket(h);
                hashes[n] = h;
                n += 1;
                if n == MAX_BATCH {
                    self.prefetch_records(&hashes[..n]);
                    n = 0;
                }
            }
        }
        self.prefetch_records(&hashes[..n]);
    }

    fn prefetch_records(&self, hashes: &[u64]) {
        for &h in hashes {
            self.tables.prefetch_record(h);
        }
    }

    /// The hash the fast path will look the frame's mapping up by, from a
    /// quick parse that trusts the headers (process() checks them).
    fn lookup_hash(&self, frame: &[u8], side: Side) -> Option<u64> {
        const L3: usize = ethernet::HEADER_LEN;
        if frame.len() < L3 + 20 + 8 || get_u16_at(frame, 12) != ethernet::ETHERTYPE_IPV4 {
            return None;
        }
        let (vihl, frag) = (frame[L3], get_u16_at(frame, L3 + 6));
        if vihl >> 4 != 4 || frag & 0x1fff != 0 {
            return None;
        }
        let l4 = L3 + usize::from(vihl & 0x0f) * 4;
        if frame.len() < l4 + 8 {
            return None;
        }
        let (p, sport, dport) = match frame[L3 + 9] {
            proto::TCP => (Proto::Tcp, get_u16_at(frame, l4), get_u16_at(frame, l4 + 2)),
            proto::UDP => (Proto::Udp, get_u16_at(frame, l4), get_u16_at(frame, l4 + 2)),
            proto::ICMP => (Proto::Icmp, get_u16_at(frame, l4 + 4), get_u16_at(frame, l4 + 4)),
            _ => return None,
        };
        Some(match side {
            Side::Inside => self.tables.hash_in(p, get_u32_at(frame, L3 + 12), sport),
            Side::Outside => self.tables.hash_out(p, get_u32_at(frame, L3 + 16), dport),
        })
    }
}
