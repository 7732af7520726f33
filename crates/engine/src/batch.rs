//! Batches. A lookup in a table much larger than the caches costs a memory
//! round trip (100+ ns) for the index bucket and another for the mapping
//! record; done one packet at a time they serialise. `process_batch` hashes
//! every frame of a batch once, starts loading all their buckets, then (by
//! the time those have arrived) the records they point at, and only then
//! translates the frames, handing each its hash: the loads of the whole
//! batch overlap, and the clock moves once per batch. The prefetches are
//! only hints: a wrong guess costs a wasted load, never a wrong answer.

use natrix_wire::{ethernet, get_u16_at, get_u32_at, proto};

use crate::engine::{Engine, Verdict};
use crate::{Proto, Side};

/// Frames prefetched together at most; longer batches are taken in chunks.
pub const MAX_BATCH: usize = 64;

impl Engine {
    /// Translates `frames`, all arrived on `side` at `now_ns`, in place;
    /// `verdicts[i]` says what became of `frames[i]`. The same verdicts as
    /// `process` frame by frame, in fewer nanoseconds.
    pub fn process_batch<F: AsMut<[u8]>>(&mut self, frames: &mut [F], side: Side, now_ns: u64, verdicts: &mut [Verdict]) {
        assert_eq!(frames.len(), verdicts.len(), "process_batch: one verdict per frame");
        self.advance(now_ns);
        for (chunk, out) in frames.chunks_mut(MAX_BATCH).zip(verdicts.chunks_mut(MAX_BATCH)) {
            let mut hashes = [None; MAX_BATCH];
            for (h, f) in hashes.iter_mut().zip(chunk.iter_mut()) {
                *h = self.lookup_hash(f.as_mut(), side);
                if let Some(h) = *h {
                    self.tables.prefetch_bucket(h);
                }
            }
            for &h in hashes.iter().take(chunk.len()).flatten() {
                self.tables.prefetch_record(h);
            }
            for ((f, v), &h) in chunk.iter_mut().zip(out.iter_mut()).zip(hashes.iter()) {
                *v = self.process_now(f.as_mut(), side, h);
            }
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
