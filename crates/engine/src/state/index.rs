//! A bucketized open-addressing index from a 64-bit hash to a `u32` entry id.
//!
//! The index stores no keys: callers keep entries in their own slab and pass an
//! equality test, so one entry can be indexed under several keys (both
//! directions of a session). A bucket is one 64-byte cache line holding ten
//! 16-bit tags, ten entry ids and a spill count; lookups compare the ten tags
//! of a bucket together and usually touch that one line and nothing else.
//! Collisions spill linearly into the next bucket; the spill count tells
//! lookups when they may stop, so removals need no tombstones. Buckets are
//! sized for a load of at most 85% and picked by multiply-shift rather than a
//! power-of-two mask, so an index costs about 7.5 bytes per entry whatever
//! its size.

const SLOTS: usize = 10;
/// Buckets per entry of capacity: 85% load at most (1 / (10 * 0.85)).
const LOAD_NUM: usize = 2;
const LOAD_DEN: usize = 17;

/// A hint to the CPU: start loading the cache line holding `r`.
#[inline]
pub fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is only a hint; the pointer comes from a reference.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>((r as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
const EMPTY: u32 = 0;

#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Bucket {
    /// 0 marks a free slot; a live entry's tag is never 0.
    tags: [u16; SLOTS],
    /// How many entries living further on had their home at or before this
    /// bucket and probed past it (saturating: a saturated count is never
    /// decremented).
    spills: u8,
    _pad: [u8; 3],
    /// Entry id + 1; 0 marks a free slot.
    vals: [u32; SLOTS],
}

impl Bucket {
    /// The slots holding `tag`: two vector compares on x86-64.
    #[inline]
    fn matches(&self, tag: u16) -> SlotMask {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_cmpeq_epi16, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi16};
            let p = self.tags.as_ptr().cast::<u8>();
            // SAFETY: SSE2 is part of x86-64. Both unaligned 16-byte loads lie
            // within `tags` (bytes 0-15 and 4-19 of its 20).
            let (first, last) = unsafe {
                let want = _mm_set1_epi16(tag as i16);
                let first = _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_loadu_si128(p.cast()), want)) as u32;
                let last = _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_loadu_si128(p.add(4).cast()), want)) as u32;
                (first, last)
            };
            // Each compare sets two mask bits per tag: slots 0-7, then 2-9.
            SlotMask((first | last << 4) & SlotMask::EVEN)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mut m = 0u32;
            for (i, &t) in self.tags.iter().enumerate() {
                m |= u32::from(t == tag) << (2 * i);
            }
            SlotMask(m)
        }
    }

    /// Free slots have tag 0, which no live entry has.
    #[inline]
    fn free_slot(&self) -> Option<usize> {
        self.matches(0).next()
    }
}

/// A set of a bucket's slots: bit 2i stands for slot i (the layout of the
/// vector compare's byte mask), iterated in slot order.
#[derive(Clone, Copy)]
struct SlotMask(u32);

impl SlotMask {
    const EVEN: u32 = 0x5_5555;
}

impl Iterator for SlotMask {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let slot = self.0.trailing_zeros() as usize / 2;
        self.0 &= self.0 - 1;
        Some(slot)
    }
}

/// A hash's home bucket, and the next one if entries spilled into it, read
/// ahead of a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guess {
    /// The first entry whose tag matches: most likely the one.
    Likely(u32),
    /// No tag matches in the buckets read and no entry spilled past the
    /// last of them: not indexed.
    Absent,
    /// Nothing to say: no tag matches but entries spilled past the buckets
    /// read (or, to callers that skip some entries, only those match).
    Unsure,
}

pub struct FlowIndex {
    buckets: Vec<Bucket>,
    len: usize,
}

#[inline]
fn tag_of(hash: u64) -> u16 {
    // The high bits pick the tag, the low half the bucket; 0 is reserved.
    let t = (hash >> 48) as u16;
    t | u16::from(t == 0)
}

impl FlowIndex {
    /// An index able to hold `capacity` entries at a load of at most 85%.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::try_with_capacity(capacity).expect("flow index memory")
    }

    /// As `with_capacity`, but says so when the memory cannot be had.
    pub fn try_with_capacity(capacity: usize) -> Result<Self, std::collections::TryReserveError> {
        let n = Self::buckets_for(capacity);
        let mut table = Vec::new();
        table.try_reserve_exact(n)?;
        crate::state::memory::advise_huge_pages(&table);
        table.resize(n, Bucket::default());
        Ok(FlowIndex { buckets: table, len: 0 })
    }

    fn buckets_for(capacity: usize) -> usize {
        (capacity.max(1) * LOAD_NUM).div_ceil(LOAD_DEN).max(1)
    }

    /// The `capacity` an index made for `capacity` entries reports.
    pub fn capacity_for(capacity: usize) -> usize {
        Self::capacity_for_buckets(Self::buckets_for(capacity))
    }

    /// Bytes an index for `capacity` entries takes.
    pub fn bytes_for(capacity: usize) -> usize {
        Self::buckets_for(capacity) * core::mem::size_of::<Bucket>()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Entries the index was sized for (its load stays under 85% up to there).
    pub fn capacity(&self) -> usize {
        Self::capacity_for_buckets(self.buckets.len())
    }

    fn capacity_for_buckets(buckets: usize) -> usize {
        buckets * LOAD_DEN / LOAD_NUM
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held by the index itself.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.capacity() * core::mem::size_of::<Bucket>()
    }

    /// Multiply-shift range reduction of the hash's low half (Lemire's
    /// "fastrange"): any bucket count, no division.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        ((u64::from(hash as u32) * self.buckets.len() as u64) >> 32) as usize
    }

    /// `hash`'s home bucket. Multiply-shift always lands below the bucket
    /// count, so the access needs no bounds check.
    #[inline]
    fn home_bucket(&self, hash: u64) -> &Bucket {
        let b = self.home(hash);
        debug_assert!(b < self.buckets.len());
        // SAFETY: (x * n) >> 32 < n for any 32-bit x, and n >= 1 buckets.
        unsafe { self.buckets.get_unchecked(b) }
    }

    #[inline]
    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets.len() {
            0
        } else {
            b + 1
        }
    }

    /// Starts loading the bucket `hash` lives in, so a lookup a little later
    /// finds it in cache.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        prefetch(self.home_bucket(hash));
    }

    /// What `hash`'s home bucket, and the next one when entries spilled
    /// into it, say before the real lookup, to prefetch by. At full load
    /// about one entry in thirteen lives in the bucket after its home; one
    /// bucket on finds nearly all of those, and it is the adjacent line.
    #[inline]
    pub fn guess(&self, hash: u64) -> Guess {
        let tag = tag_of(hash);
        let b = self.home(hash);
        // SAFETY: `home` is below the bucket count (see `home_bucket`).
        let home = unsafe { self.buckets.get_unchecked(b) };
        if let Some(i) = home.matches(tag).next() {
            return Guess::Likely(home.vals[i] - 1);
        }
        if home.spills == 0 {
            return Guess::Absent;
        }
        let next = &self.buckets[self.next(b)];
        match next.matches(tag).next() {
            Some(i) => Guess::Likely(next.vals[i] - 1),
            // Whatever spilled past the home bucket would be here or have
            // spilled on from here.
            None if next.spills == 0 => Guess::Absent,
            None => Guess::Unsure,
        }
    }

    /// Finds the entry indexed under `hash` for which `eq` holds.
    #[inline]
    pub fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = tag_of(hash);
        let mut b = self.home(hash);
        for _ in 0..self.buckets.len() {
            let bucket = &self.buckets[b];
            for i in bucket.matches(tag) {
                let id = bucket.vals[i] - 1;
                if eq(id) {
                    return Some(id);
                }
            }
            if bucket.spills == 0 {
                return None;
            }
            b = self.next(b);
        }
        None
    }

    /// Indexes `id` under `hash`. Fails only when the index is full.
    #[inline(always)]
    pub fn insert(&mut self, hash: u64, id: u32) -> Result<(), TableFull> {
        if self.len >= self.buckets.len() * SLOTS {
            return Err(TableFull);
        }
        let home = self.home(hash);
        let mut b = home;
        loop {
            if let Some(i) = self.buckets[b].free_slot() {
                self.buckets[b].tags[i] = tag_of(hash);
                self.buckets[b].vals[i] = id + 1;
                self.len += 1;
                return Ok(());
            }
            self.buckets[b].spills = self.buckets[b].spills.saturating_add(1);
            b = self.next(b);
            if b == home {
                return Err(TableFull);
            }
        }
    }

    /// Removes `id` indexed under `hash`; returns whether it was there.
    /// An id indexed under two hashes whose tags collide may lose the other
    /// entry first; removing both back to back (as owners of such ids do)
    /// leaves the index exact.
    pub fn remove(&mut self, hash: u64, id: u32) -> bool {
        let tag = tag_of(hash);
        let home = self.home(hash);
        let mut b = home;
        loop {
            if let Some(i) = self.buckets[b].matches(tag).find(|&i| self.buckets[b].vals[i] == id + 1) {
                self.buckets[b].vals[i] = EMPTY;
                self.buckets[b].tags[i] = 0;
                self.len -= 1;
                let mut p = home;
                while p != b {
                    if self.buckets[p].spills != u8::MAX {
                        self.buckets[p].spills -= 1;
                    }
                    p = self.next(p);
                }
                return true;
            }
            if self.buckets[b].spills == 0 {
                return false;
            }
            b = self.next(b);
            if b == home {
                return false;
            }
        }
    }
}

/// The index has no free slot left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFull;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn bucket_is_one_cache_line() {
        assert_eq!(core::mem::size_of::<Bucket>(), 64);
    }

    #[test]
    fn matches_finds_every_slot_holding_the_tag_and_no_other() {
        for pattern in [0u32, 1, 0x200, 0x3ff, 0x155, 0x2aa, 0x101] {
            let mut b = Bucket::default();
            for i in 0..SLOTS {
                b.tags[i] = if pattern >> i & 1 == 1 { 0xbeef } else { 0x1000 + i as u16 };
            }
            // Bytes after the tags must not be read as an eleventh slot.
            b.spills = 0xef;
            b._pad = [0xbe; 3];
            let found: Vec<usize> = b.matches(0xbeef).collect();
            let want: Vec<usize> = (0..SLOTS).filter(|&i| pattern >> i & 1 == 1).collect();
            assert_eq!(found, want, "pattern {pattern:#x}");
        }
    }

    #[test]
    fn colliding_entries_spill_and_removal_keeps_the_rest_findable() {
        let mut t = FlowIndex::with_capacity(64);
        // Same home bucket for all: force spills across buckets.
        let hashes: Vec<u64> = (0..30u64).map(|i| (i << 32) | 3).collect();
        for (id, &h) in hashes.iter().enumerate() {
            t.insert(h, id as u32).unwrap();
        }
        for (id, &h) in hashes.iter().enumerate() {
            assert_eq!(t.find(h, |e| e == id as u32), Some(id as u32));
        }
        for id in (0..30).step_by(2) {
            assert!(t.remove(hashes[id], id as u32));
        }
        for (id, &h) in hashes.iter().enumerate() {
            let found = t.find(h, |e| e == id as u32);
            assert_eq!(found.is_some(), id % 2 == 1, "id {id}");
        }
        assert_eq!(t.len(), 15);
    }

    #[test]
    fn the_home_bucket_and_the_next_guess_present_absent_or_unsure() {
        let mut t = FlowIndex::with_capacity(64);
        // One home bucket (bucket 0), thirty distinct tags: ten in each of
        // buckets 0, 1 and 2.
        let hash = |tag: u64| (tag << 48) | 3;
        for tag in 1..=30u64 {
            t.insert(hash(tag), tag as u32 + 100).unwrap();
        }
        assert_eq!(t.guess(hash(1)), Guess::Likely(101));
        assert_eq!(t.guess(hash(15)), Guess::Likely(115), "spilled one bucket on: found there");
        assert_eq!(t.guess(hash(25)), Guess::Unsure, "two buckets on: the guess cannot tell");
        assert_eq!(t.guess(hash(99)), Guess::Unsure, "absent, but entries spilled past the next bucket too");
        let elsewhere = (7 << 48) | 0xffff_ffff;
        assert_ne!(t.home(elsewhere), t.home(hash(1)));
        assert_eq!(t.guess(elsewhere), Guess::Absent);
        t.insert(elsewhere, 7).unwrap();
        assert_eq!(t.guess(elsewhere), Guess::Likely(7));

        let mut t = FlowIndex::with_capacity(64);
        for tag in 1..=12u64 {
            t.insert(hash(tag), tag as u32).unwrap();
        }
        assert_eq!(t.guess(hash(12)), Guess::Likely(12));
        assert_eq!(t.guess(hash(99)), Guess::Absent, "spilled into the next bucket and no further: not there");
    }

    #[test]
    fn holds_its_whole_capacity_and_finds_every_entry() {
        for capacity in [1, 17, 1000, 100_000] {
            let mut t = FlowIndex::with_capacity(capacity);
            let h = |k: u32| u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
            for k in 0..capacity as u32 {
                t.insert(h(k), k).unwrap();
            }
            for k in 0..capacity as u32 {
                assert_eq!(t.find(h(k), |e| e == k), Some(k), "capacity {capacity}");
            }
            assert!(t.memory_bytes() <= 64 * (capacity * 2).div_ceil(17));
        }
    }

    proptest::proptest! {
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..3, 0u32..200), 1..600)) {
            let mut t = FlowIndex::with_capacity(256);
            let mut model: HashSet<u32> = HashSet::new();
            let h = |k: u32| (u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15)) & 0xffff_ffff_0000_000f;
            for (op, k) in ops {
                match op {
                    0 => if model.insert(k) { t.insert(h(k), k).unwrap(); },
                    1 => { let was = model.remove(&k); proptest::prop_assert_eq!(t.remove(h(k), k), was); }
                    _ => proptest::prop_assert_eq!(t.find(h(k), |e| e == k).is_some(), model.contains(&k)),
                }
            }
            proptest::prop_assert_eq!(t.len(), model.len());
        }
    }
}
