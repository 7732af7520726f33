//! Batches. A lookup in a table much larger than the caches costs a memory
//! round trip (100+ ns) for the index bucket and another for the mapping
//! record; done one packet at a time they serialise. `process_batch` works
//! in stages over the whole batch: it runs the fast path's first step
//! (check, parse, hash) over every frame and starts loading their buckets;
//! then reads each bucket (the first stage's work gave it time to arrive)
//! and starts loading the record it points at, kept as the lookup's hint;
//! then translates the frames. When the bucket says an outbound frame's
//! endpoint is not indexed, the frame most likely opens a flow, and the two
//! random lines that takes (a port map word, the bucket of its external
//! endpoint) are loaded a few frames ahead of it, late enough that the
//! subscriber an earlier frame of the batch opens can be found. The loads of
//! the whole batch overlap, each frame is parsed once, and the clock and
//! the counters move once per batch. The prefetches and what they find are
//! only hints: each is checked before use, so a wrong guess costs a wasted
//! load, never a wrong answer.

use crate::nat44::fast::Candidate;
use crate::nat44::{Engine, Verdict};
use crate::state::index::Guess;
use crate::state::sessions::NIL;
use crate::state::subscribers::NONE;
use crate::Side;

/// Frames prefetched together at most; longer batches are taken in chunks.
pub const MAX_BATCH: usize = 64;
/// How many frames ahead of its opening a likely-new flow's lines are
/// prefetched.
const OPENING_LEAD: usize = 16;

impl Engine {
    /// Prefetch, stage two: the record the candidate's bucket points at,
    /// kept as the lookup's hint; or, when the bucket says the endpoint is
    /// not indexed and `opens` (outbound), what opening its flow touches.
    #[inline]
    fn prefetch_and_hint(&self, c: &mut Candidate, opens: bool) {
        let guess = self.tables.prefetch_record(c.hash());
        c.hint = match guess {
            Guess::Likely(id) => id,
            Guess::Absent | Guess::Unsure => NIL,
        };
        c.absent = guess == Guess::Absent;
        if c.absent && opens {
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
            let opens = side == Side::Inside;
            for c in candidates.iter_mut().take(chunk.len()).flatten() {
                self.prefetch_and_hint(c, opens);
            }
            self.stats.received[side as usize] += chunk.len() as u64;
            for (i, (f, v)) in chunk.iter_mut().zip(out.iter_mut()).enumerate() {
                // A subscriber an earlier frame of this batch opens could not
                // be found in stage two: look again a few frames ahead.
                if let Some(ahead) = candidates.get_mut(i + OPENING_LEAD).and_then(Option::as_mut).filter(|c| opens && c.absent && c.sub == NONE) {
                    self.prefetch_opening(ahead);
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
