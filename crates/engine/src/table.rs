//! A bucketized open-addressing index from a 64-bit hash to a `u32` entry id.
//!
//! The index stores no keys: callers keep entries in their own slab and pass an
//! equality test, so one entry can be indexed under several keys (both
//! directions of a session). A bucket is one 64-byte cache line holding eight
//! 32-bit tags and eight entry ids; lookups compare the eight tags of a bucket
//! together and usually touch one line. Collisions spill linearly into the next
//! bucket; a per-bucket spill counter tells lookups when they may stop, so
//! removals need no tombstones.

const SLOTS: usize = 8;

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
    tags: [u32; SLOTS],
    /// Entry id + 1; 0 marks a free slot.
    vals: [u32; SLOTS],
}

pub struct FlowIndex {
    buckets: Vec<Bucket>,
    /// How many entries living further on had their home at or before this bucket
    /// and probed past it (saturating: a saturated counter is never decremented).
    spills: Vec<u8>,
    mask: usize,
    len: usize,
}

#[inline]
fn tag_of(hash: u64) -> u32 {
    // The high half picks the tag, the low half the bucket; 0 is reserved.
    ((hash >> 32) as u32) | 1
}

impl FlowIndex {
    /// An index able to hold `capacity` entries at a load of at most 50%.
    pub fn with_capacity(capacity: usize) -> Self {
        let buckets = (capacity.max(SLOTS) * 2 / SLOTS).next_power_of_two();
        let mut table = Vec::with_capacity(buckets);
        crate::memory::advise_huge_pages(&table);
        table.resize(buckets, Bucket::default());
        FlowIndex {
            buckets: table,
            spills: vec![0; buckets],
            mask: buckets - 1,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held by the index itself.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * (core::mem::size_of::<Bucket>() + 1)
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        (hash as usize) & self.mask
    }

    /// Starts loading the bucket `hash` lives in, so a lookup a little later
    /// finds it in cache.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        prefetch(&self.buckets[self.home(hash)]);
    }

    /// The first entry in `hash`'s home bucket whose tag matches: a likely
    /// hit, to prefetch before the real lookup confirms it.
    #[inline]
    pub fn likely(&self, hash: u64) -> Option<u32> {
        let tag = tag_of(hash);
        let bucket = &self.buckets[self.home(hash)];
        (0..SLOTS).find(|&i| bucket.tags[i] == tag && bucket.vals[i] != EMPTY).map(|i| bucket.vals[i] - 1)
    }

    /// Finds the entry indexed under `hash` for which `eq` holds.
    #[inline]
    pub fn find(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = tag_of(hash);
        let mut b = self.home(hash);
        for _ in 0..=self.mask {
            let bucket = &self.buckets[b];
            for i in 0..SLOTS {
                if bucket.tags[i] == tag && bucket.vals[i] != EMPTY && eq(bucket.vals[i] - 1) {
                    return Some(bucket.vals[i] - 1);
                }
            }
            if self.spills[b] == 0 {
                return None;
            }
            b = (b + 1) & self.mask;
        }
        None
    }

    /// Indexes `id` under `hash`. Fails only when the index is full.
    pub fn insert(&mut self, hash: u64, id: u32) -> Result<(), TableFull> {
        if self.len >= self.buckets.len() * SLOTS {
            return Err(TableFull);
        }
        let tag = tag_of(hash);
        let home = self.home(hash);
        let mut b = home;
        loop {
            if let Some(i) = self.buckets[b].vals.iter().position(|&v| v == EMPTY) {
                self.buckets[b].tags[i] = tag;
                self.buckets[b].vals[i] = id + 1;
                self.len += 1;
                return Ok(());
            }
            self.spills[b] = self.spills[b].saturating_add(1);
            b = (b + 1) & self.mask;
            if b == home {
                return Err(TableFull);
            }
        }
    }

    /// Removes `id` indexed under `hash`; returns whether it was there.
    pub fn remove(&mut self, hash: u64, id: u32) -> bool {
        let tag = tag_of(hash);
        let home = self.home(hash);
        let mut b = home;
        loop {
            if let Some(i) = (0..SLOTS).find(|&i| self.buckets[b].vals[i] == id + 1 && self.buckets[b].tags[i] == tag) {
                self.buckets[b].vals[i] = EMPTY;
                self.buckets[b].tags[i] = 0;
                self.len -= 1;
                let mut p = home;
                while p != b {
                    if self.spills[p] != u8::MAX {
                        self.spills[p] -= 1;
                    }
                    p = (p + 1) & self.mask;
                }
                return true;
            }
            if self.spills[b] == 0 {
                return false;
            }
            b = (b + 1) & self.mask;
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
