//! The pending connection attempts of one worker: fixed-size records in a
//! slab of fixed-size chunks (it grows without moving a record), found by
//! the caller's own endpoints through a `FlowIndex` reserved up front. A
//! record's id is its place in the slab; exactly one timer
//! entry refers to each record in use, so an ended attempt keeps its record
//! (and its id) until that entry fires, and no stale timer entry can ever
//! meet a reused id.

use crate::error::EngineError;
use crate::state::hash;
use crate::state::index::{prefetch, FlowIndex};

/// Frame bytes a record holds: Ethernet (14), IPv4 (20) and TCP with the
/// most options (60), and 34 bytes of IPv4 options. A longer SYN (one
/// carrying more than a little data, TCP Fast Open) is passed on untracked.
pub(super) const COPY_MAX: usize = 128;

/// The caller's own endpoints, as its SYN arrived inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key {
    pub caller: u32,
    pub server: u32,
    pub caller_port: u16,
    pub server_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum State {
    /// Copies and the reset still to come.
    Live,
    /// An answer came (`answered_ns`); still indexed, so a caller's
    /// retransmission that crossed it passes untracked rather than starting
    /// anew. What fell due before the answer is still sent.
    Answered,
    /// The caller was sent the reset at the deadline; still indexed for a
    /// moment, so a retransmission it sent before its stack took the reset
    /// is absorbed rather than tracked anew and forwarded.
    Refused,
    /// Replaced by a new attempt with the same endpoints; no longer indexed.
    Retired,
}

/// One attempt: 192 bytes.
pub(super) struct Attempt {
    pub key: Key,
    pub isn: u32,
    pub state: State,
    /// SYNs sent so far, the caller's first included.
    pub sent: u8,
    /// SYNs to send in all, as configured when the attempt began.
    attempts: u8,
    /// Bytes of data the SYN carries (TCP Fast Open): they take sequence
    /// numbers after the SYN's.
    data_len: u8,
    /// Offset of the IPv4 header and length of `frame`.
    l3: u8,
    len: u8,
    pub first_ns: u64,
    pub interval_ns: u64,
    pub deadline_ns: u64,
    /// When the next copy, or the reset, falls due.
    pub due_ns: u64,
    /// When the answer came; u64::MAX while none has.
    pub answered_ns: u64,
    /// The first SYN as natrix forwarded it.
    frame: [u8; COPY_MAX],
}

impl Attempt {
    /// An attempt that sends `attempts` SYNs in all, `interval_ns` apart
    /// from `first_ns`, before `deadline_ns`.
    pub fn new(key: Key, isn: u32, attempts: u8, first_ns: u64, interval_ns: u64, deadline_ns: u64) -> Attempt {
        Attempt {
            key,
            isn,
            state: State::Live,
            sent: 1,
            attempts,
            data_len: 0,
            l3: 0,
            len: 0,
            first_ns,
            interval_ns,
            deadline_ns,
            due_ns: deadline_ns,
            answered_ns: u64::MAX,
            frame: [0; COPY_MAX],
        }
    }

    /// Keeps `frame` (IPv4 header at `l3`, `data_len` bytes of data) as it
    /// is about to leave, with the TTL decrement the router applies after
    /// this point; false when it does not fit.
    pub fn keep_copy(&mut self, frame: &[u8], l3: usize, data_len: usize) -> bool {
        if frame.len() > COPY_MAX {
            return false;
        }
        self.data_len = data_len as u8;
        self.frame[..frame.len()].copy_from_slice(frame);
        self.len = frame.len() as u8;
        self.l3 = l3 as u8;
        crate::rewrite::decrement_ttl(&mut self.frame[..frame.len()], l3);
        true
    }

    pub fn copy(&self) -> &[u8] {
        &self.frame[..usize::from(self.len)]
    }

    /// Whether by `now_ns` only the caller's first SYN has gone out (a copy
    /// due by then counts as sent, though its timer may not have run yet).
    pub fn first_syn_only(&self, now_ns: u64) -> bool {
        self.sent == 1 && (self.due_ns > now_ns || self.due_ns >= self.deadline_ns)
    }

    /// Whether `n` is in the caller's sent sequence space past its ISN
    /// (SND.UNA < n =< SND.NXT, RFC 9293 section 3.10.7.3): an ACK of the
    /// SYN the caller accepts, or the sequence number of a RST the caller
    /// would send in this attempt.
    pub fn acknowledged_by(&self, n: u32) -> bool {
        n.wrapping_sub(self.isn).wrapping_sub(1) <= u32::from(self.data_len)
    }

    /// Whether a copy of natrix's own is still to go out.
    pub fn copies_left(&self) -> bool {
        self.due_ns < self.deadline_ns
    }

    pub fn l3(&self) -> usize {
        usize::from(self.l3)
    }

    /// The next SYN (the k-th, k = `sent`) falls at first + k x interval
    /// while k < the attempt's `attempts` and that is before the deadline; else the
    /// deadline's reset is next.
    pub fn next_due(&self) -> u64 {
        let next = self.first_ns + u64::from(self.sent) * self.interval_ns;
        if self.sent < self.attempts && next < self.deadline_ns {
            next
        } else {
            self.deadline_ns
        }
    }
}

/// Records per chunk of the slab: 192 KiB.
const CHUNK: usize = 1024;

/// Records in chunks allocated as the table grows, never moved.
#[derive(Default)]
struct Slab {
    chunks: Vec<Vec<Attempt>>,
    len: usize,
}

impl Slab {
    fn push(&mut self, a: Attempt) -> u32 {
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks.last_mut().expect("a chunk with room").push(a);
        self.len += 1;
        (self.len - 1) as u32
    }

    fn bytes(&self) -> usize {
        self.chunks.len() * CHUNK * core::mem::size_of::<Attempt>()
    }
}

impl std::ops::Index<u32> for Slab {
    type Output = Attempt;
    fn index(&self, id: u32) -> &Attempt {
        &self.chunks[id as usize / CHUNK][id as usize % CHUNK]
    }
}

impl std::ops::IndexMut<u32> for Slab {
    fn index_mut(&mut self, id: u32) -> &mut Attempt {
        &mut self.chunks[id as usize / CHUNK][id as usize % CHUNK]
    }
}

pub(super) struct Attempts {
    slab: Slab,
    free: Vec<u32>,
    index: FlowIndex,
    seed: u64,
    /// Records in use (live, answered or retired).
    used: usize,
    live: usize,
}

impl Attempts {
    pub fn new(capacity: usize, seed: u64) -> Result<Attempts, EngineError> {
        let index = FlowIndex::try_with_capacity(capacity)
            .map_err(|_| EngineError::Memory { table: "SYN accelerator's index of pending attempts", bytes: Self::reserved_bytes(capacity) as u64 })?;
        Ok(Attempts { slab: Slab::default(), free: Vec::new(), index, seed, used: 0, live: 0 })
    }

    pub fn reserved_bytes(capacity: usize) -> usize {
        FlowIndex::bytes_for(capacity)
    }

    /// Records the slab may hold for an index of `index_capacity`: twice
    /// that, since ended attempts keep theirs until their timer fires, and
    /// never more than the timers take.
    fn max_records(index_capacity: usize) -> usize {
        (2 * index_capacity).min(super::timers::MAX_IDS)
    }

    /// Bytes the table may grow by under load beyond `reserved_bytes`:
    /// every record the slab may hold, in whole chunks, and their free
    /// list, a vector that grows by doubling.
    pub fn bytes_under_load(capacity: usize) -> usize {
        let records = Self::max_records(FlowIndex::capacity_for(capacity));
        records.next_multiple_of(CHUNK) * core::mem::size_of::<Attempt>() + records.next_power_of_two() * 4
    }

    fn hash(&self, k: &Key) -> u64 {
        hash::five_tuple(self.seed, natrix_wire::proto::TCP, k.caller, k.caller_port, k.server, k.server_port)
    }

    /// The indexed (live or answered) attempt of these endpoints.
    pub fn find(&self, key: &Key) -> Option<u32> {
        if self.index.is_empty() {
            return None;
        }
        self.index.find(self.hash(key), |id| self.slab[id].key == *key)
    }

    pub fn get(&self, id: u32) -> &Attempt {
        &self.slab[id]
    }

    pub fn get_mut(&mut self, id: u32) -> &mut Attempt {
        &mut self.slab[id]
    }

    /// Stores and indexes a live attempt; None when the table is full (the
    /// index at its sized load, or the slab at twice that, or at the 4 M
    /// ids the timers take, with ended records waiting for their timers).
    pub fn insert(&mut self, a: Attempt) -> Option<u32> {
        let capacity = self.index.capacity();
        let full_slab = self.slab.len >= Self::max_records(capacity);
        if self.index.len() >= capacity || (self.free.is_empty() && full_slab) {
            return None;
        }
        let hash = self.hash(&a.key);
        let id = match self.free.pop() {
            Some(id) => {
                self.slab[id] = a;
                id
            }
            None => self.slab.push(a),
        };
        self.index.insert(hash, id).expect("below the index's capacity");
        self.used += 1;
        self.live += 1;
        Some(id)
    }

    /// An answer came for a live attempt at `now_ns`: nothing due after it is sent.
    pub fn answer(&mut self, id: u32, now_ns: u64) {
        let a = &mut self.slab[id];
        a.state = State::Answered;
        a.answered_ns = now_ns;
        self.live -= 1;
    }

    /// Marks a live attempt whose caller was just reset.
    pub fn refuse(&mut self, id: u32) {
        let a = &mut self.slab[id];
        debug_assert!(a.state == State::Live);
        a.state = State::Refused;
        self.live -= 1;
    }

    /// Takes a replaced attempt out of the index; its record waits for its timer.
    pub fn retire(&mut self, id: u32) {
        self.unindex(id);
        self.slab[id].state = State::Retired;
    }

    /// Gives an attempt's record back once its timer has fired.
    pub fn release(&mut self, id: u32) {
        if self.slab[id].state != State::Retired {
            self.unindex(id);
        }
        self.slab[id].state = State::Retired;
        self.free.push(id);
        self.used -= 1;
    }

    fn unindex(&mut self, id: u32) {
        let a = &self.slab[id];
        if a.state == State::Live {
            self.live -= 1;
        }
        let hash = self.hash(&a.key);
        self.index.remove(hash, id);
    }

    /// Starts loading the index line `key` lives in.
    pub fn prefetch_key(&self, key: &Key) {
        self.index.prefetch(self.hash(key));
    }

    /// Starts loading record `id`'s cache lines.
    pub fn prefetch(&self, id: u32) {
        let a = &self.slab[id];
        prefetch(a);
        prefetch(&a.frame[COPY_MAX / 2]);
        prefetch(&a.frame[COPY_MAX - 1]);
    }

    /// Starts loading the index line of record `id` when its timer will end it.
    pub fn prefetch_index_if_ending(&self, id: u32) {
        let a = &self.slab[id];
        if a.state != State::Retired && (a.state == State::Answered || a.due_ns >= a.deadline_ns) {
            self.index.prefetch(self.hash(&a.key));
        }
    }

    /// Attempts being tracked.
    pub fn live(&self) -> usize {
        self.live
    }

    pub fn memory_bytes(&self) -> usize {
        self.slab.bytes() + self.free.capacity() * 4 + self.index.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_192_bytes() {
        assert_eq!(core::mem::size_of::<Attempt>(), 192);
    }

    #[test]
    fn the_schedule_stops_at_the_attempts_or_the_deadline() {
        let key = Key { caller: 1, server: 2, caller_port: 3, server_port: 4 };
        let mut a = Attempt::new(key, 9, 4, 1_000, 500, 2_000 + 1_000);
        let mut dues = Vec::new();
        for _ in 0..6 {
            let d = a.next_due();
            dues.push(d);
            if d == a.deadline_ns {
                break;
            }
            a.sent += 1;
        }
        assert_eq!(dues, [1_500, 2_000, 2_500, 3_000], "copies at 0.5, 1.0, 1.5, the reset at 2.0");
        let mut short = Attempt::new(key, 9, 4, 0, 500, 700);
        assert_eq!(short.next_due(), 500);
        short.sent = 2;
        assert_eq!(short.next_due(), 700, "no copy at or after the deadline");
    }

    #[test]
    fn ended_attempts_keep_their_record_until_released_and_leave_the_index() {
        let mut t = Attempts::new(16, 1).unwrap();
        let key = Key { caller: 10, server: 20, caller_port: 30, server_port: 40 };
        let id = t.insert(Attempt::new(key, 1, 4, 0, 5, 20)).unwrap();
        assert_eq!(t.find(&key), Some(id));
        assert_eq!(t.live(), 1);
        t.retire(id);
        assert_eq!(t.find(&key), None);
        assert_eq!(t.live(), 0);
        let again = t.insert(Attempt::new(key, 2, 4, 0, 5, 20)).unwrap();
        assert_ne!(again, id, "the retired record is still the old timer's");
        t.release(id);
        t.release(again);
        assert_eq!(t.find(&key), None);
        assert_eq!((t.used, t.live), (0, 0));
    }

    /// Attempts ended before their timers fire keep their records: the
    /// slab grows to twice the capacity, then they are released onto the
    /// free list, and `bytes_under_load` covers both.
    #[test]
    fn the_records_grow_no_further_than_bytes_under_load() {
        let capacity = 3000;
        let mut t = Attempts::new(capacity, 1).unwrap();
        let mut ids = Vec::new();
        while let Some(id) = t.insert(Attempt::new(Key { caller: ids.len() as u32, server: 20, caller_port: 30, server_port: 40 }, 1, 4, 0, 5, 20)) {
            t.retire(id);
            ids.push(id);
        }
        assert!(ids.len() >= 2 * capacity, "{} records", ids.len());
        ids.iter().for_each(|&id| t.release(id));
        let grown = t.memory_bytes() - Attempts::reserved_bytes(capacity);
        assert!(grown <= Attempts::bytes_under_load(capacity), "{grown} > {}", Attempts::bytes_under_load(capacity));
        assert!(grown * 10 >= Attempts::bytes_under_load(capacity) * 9, "the bound is close: {grown}");
    }
}
