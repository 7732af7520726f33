//! Batches. A lookup in a table much larger than the caches costs a memory
//! round trip (100+ ns) for the index bucket and another for the mapping
//! record; done one packet at a time they serialise. `process_batch` runs
//! the fast path's first step (check, parse, hash) over every frame of a
//! batch and starts loading their buckets, then translates the frames, each
//! time starting to load the record a frame a few places further on will
//! need (its bucket has arrived by then and says where it is; the lookup
//! starts from that record). When the bucket says an outbound frame's
//! endpoint is not indexed, the frame most likely opens a flow, and the two
//! random lines that takes (a port map word, the bucket of its external
//! endpoint) are loaded instead. The loads of the whole batch overlap, each
//! frame is parsed once, and the clock and the counters move once per batch.
//! The prefetches and what they find are only hints: each is checked before
//! use, so a wrong guess costs a wasted load, never a wrong answer.

use crate::engine::{Engine, Verdict};
use crate::fast::Candidate;
use crate::session::NIL;
use crate::table::Guess;
use crate::Side;

/// Frames prefetched together at most; longer batches are taken in chunks.
pub const MAX_BATCH: usize = 64;
/// How many frames ahead of its translation a frame's record is prefetched.
const RECORD_LEAD: usize = 16;

impl Engine {
    /// Prefetch, stage two: the record the candidate's bucket points at,
    /// kept as the lookup's hint; when the bucket says the endpoint is not
    /// indexed, an outbound candidate is most likely a new flow, and what
    /// opening it touches is prefetched instead.
    #[inline]
    fn prefetch_and_hint(&self, c: &mut Candidate, side: Side) {
        let guess = self.tables.prefetch_record(c.hash());
        c.hint = match guess {
            Guess::Likely(id) => id,
            Guess::Absent | Guess::Unsure => NIL,
        };
        if guess == Guess::Absent && side == Side::Inside {
            self.prefetch_opening(c);
        }
    }

    /// Prefetch, stage one: checks, parses and hashes each frame of `chunk`
    /// into `candidates` and starts loading its index bucket. A function of
    /// its own, so that its loop has the registers to itself and writes each
    /// candidate straight into its slot.
    #[inline(never)]
    fn candidates_of<F: AsMut<[u8]>>(&self, chunk: &mut [F], side: Side, candidates: &mut [Option<Candidate>; MAX_BATCH]) {
        for (c, f) in candidates.iter_mut().zip(chunk.iter_mut()) {
            *c = self.candidate(f.as_mut(), side);
            if let Some(c) = c {
                self.tables.prefetch_bucket(c.hash());
            }
        }
    }

    /// Translates `frames`, all arrived on `side` at `now_ns`, in place;
    /// `verdicts[i]` says what became of `frames[i]`. The same verdicts as
    /// `process` frame by frame, in fewer nanoseconds.
    pub fn process_batch<F: AsMut<[u8]>>(&mut self, frames: &mut [F], side: Side, now_ns: u64, verdicts: &mut [Verdict]) {
        assert_eq!(frames.len(), verdicts.len(), "process_batch: one verdict per frame");
        self.advance(now_ns);
        for (chunk, out) in frames.chunks_mut(MAX_BATCH).zip(verdicts.chunks_mut(MAX_BATCH)) {
            let mut candidates: [Option<Candidate>; MAX_BATCH] = [None; MAX_BATCH];
            self.candidates_of(chunk, side, &mut candidates);
            // Each record is prefetched a few frames ahead of its use: late
            // enough that its bucket has arrived to say where it is, early
            // enough that it arrives before the frame is translated.
            for c in candidates.iter_mut().take(chunk.len().min(RECORD_LEAD)).flatten() {
                self.prefetch_and_hint(c, side);
            }
            self.stats.received[side as usize] += chunk.len() as u64;
            for (i, (f, v)) in chunk.iter_mut().zip(out.iter_mut()).enumerate() {
                if let Some(ahead) = candidates.get_mut(i + RECORD_LEAD).and_then(Option::as_mut) {
                    self.prefetch_and_hint(ahead, side);
                }
                let frame = f.as_mut();
                *v = match &candidates[i] {
                    Some(c) => self.decide(frame, side, c),
                    None => self.full_path(frame, side),
                };
            }
        }
    }
}
