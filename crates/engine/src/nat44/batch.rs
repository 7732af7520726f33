//! Batches. A lookup in a table much larger than the caches costs a memory
//! round trip (100+ ns) for the index bucket and another for the mapping
//! record; done one packet at a time they serialise. The pipeline's batch
//! path works in stages over the whole batch, and these are NAPT44's: the
//! fast path's first step (check, parse, hash) over every frame, starting
//! to load their buckets; then each bucket is read (the first stage's work
//! gave it time to arrive) and the record it points at starts loading, kept
//! as the lookup's hint. When the bucket says an outbound frame's endpoint
//! is not indexed, the frame most likely opens a flow, and the two random
//! lines that takes (a port map word, the bucket of its external endpoint)
//! are loaded a few frames ahead of it, late enough that the subscriber an
//! earlier frame of the batch opens can be found. The prefetches and what
//! they find are only hints: each is checked before use, so a wrong guess
//! costs a wasted load, never a wrong answer.

use crate::nat44::fast::Candidate;
use crate::nat44::Nat44;
use crate::pipeline::frame_buf::FrameBuf;
use crate::state::index::Guess;
use crate::state::sessions::NIL;
use crate::state::subscribers::NONE;
use crate::Side;

/// Frames prefetched together at most; longer batches are taken in chunks.
pub const MAX_BATCH: usize = 64;
/// How many frames ahead of its opening a likely-new flow's lines are
/// prefetched.
const OPENING_LEAD: usize = 16;

impl Nat44 {
    /// Stages one and two for `chunk`, all arrived on `side`: each frame's
    /// candidate (None: the full path's) in `candidates`, its bucket and
    /// record on their way to the cache.
    #[inline]
    pub(crate) fn prepare_batch<F: FrameBuf>(&self, chunk: &mut [F], side: Side, candidates: &mut [Option<Candidate>; MAX_BATCH]) {
        self.candidates_of(chunk, side, candidates);
        let opens = side == Side::Inside;
        for c in candidates.iter_mut().take(chunk.len()).flatten() {
            self.prefetch_and_hint(c, opens);
        }
    }

    /// Before frame `i` of a batch is decided: a subscriber an earlier frame
    /// of the batch opened could not be found in stage two, so a likely-new
    /// flow a few frames ahead is looked at again.
    #[inline(always)]
    pub(crate) fn prefetch_ahead(&self, candidates: &mut [Option<Candidate>; MAX_BATCH], i: usize, side: Side) {
        if side != Side::Inside {
            return;
        }
        if let Some(ahead) = candidates.get_mut(i + OPENING_LEAD).and_then(Option::as_mut).filter(|c| c.absent && c.sub == NONE) {
            self.prefetch_opening(ahead);
        }
    }

    /// Prefetch, stage two: the record the candidate's bucket points at,
    /// kept as the lookup's hint; or, when the bucket says the endpoint is
    /// not indexed and `opens` (outbound), what opening its flow touches.
    #[inline]
    pub(crate) fn prefetch_and_hint(&self, c: &mut Candidate, opens: bool) {
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
    fn candidates_of<F: FrameBuf>(&self, chunk: &mut [F], side: Side, candidates: &mut [Option<Candidate>; MAX_BATCH]) {
        for (c, f) in candidates.iter_mut().zip(chunk.iter_mut()) {
            *c = self.candidate(f.frame(), side);
            if let Some(c) = c {
                self.tables.prefetch_bucket(c.hash());
            }
        }
    }
}
