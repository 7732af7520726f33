//! Mappings (the BIB: internal endpoint <-> external endpoint) and their
//! sessions (a mapping plus one remote endpoint), laid out for tens of
//! millions of flows in little memory and few cache lines.
//!
//! Most mappings carry exactly one session (a TCP connection, a DNS query),
//! so a mapping's first session lives inside its 32-byte record, the "own"
//! session. One index serves everything: each mapping is indexed under its
//! internal and its external endpoint, so a packet in either direction finds
//! the record, and with it the session, in two cache lines (bucket, record).
//! A mapping's further sessions (endpoint-independent mappings used towards
//! several remotes) are "extras" in their own slab, indexed under their
//! 5-tuples in both directions. When the own session ends while extras live,
//! one extra moves in, so a mapping has extras only while its own session
//! lives: index entries never exceed two per mapping plus two per extra.
//!
//! Expiry is a timer wheel of one-second slots rather than LRU lists: a
//! refresh only writes the session's own `last_used`, never a neighbour's
//! line. Each live session has one wheel entry; when it fires, the session is
//! expired if its idle time has passed, or re-armed for when it will.

use crate::error::EngineError;
use crate::state::hash;
use crate::state::index::{prefetch, FlowIndex, Guess, TableFull};
use crate::state::timers::Wheel;
use crate::trackers::TimeoutClass;
use crate::Proto;

pub const NIL: u32 = u32::MAX;

pub mod mapping_flags {
    /// Configured by the operator: never expires.
    pub const STATIC: u8 = 0x01;
}

/// Record flags beyond the public ones.
const LIVE: u8 = 0x40;
const OWN: u8 = 0x80;
const PUBLIC_FLAGS: u8 = mapping_flags::STATIC;

/// Session ids: a mapping's own session has the mapping's id; an extra has
/// this bit set over its slot in the extras slab.
const EXTRA: u32 = 1 << 31;

/// One-second slots; a timer further away waits in the last slot and is
/// re-armed when that fires.
const WHEEL_SLOTS: u32 = 4096;

/// A mapping as callers see it.
#[derive(Debug, Clone, Copy)]
pub struct Mapping {
    pub int_addr: u32,
    pub ext_addr: u32,
    pub int_port: u16,
    pub ext_port: u16,
    pub proto: Proto,
    pub flags: u8,
}

/// A session as callers see it.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    pub int_addr: u32,
    pub ext_addr: u32,
    pub rem_addr: u32,
    pub int_port: u16,
    pub ext_port: u16,
    pub rem_port: u16,
    pub proto: Proto,
    /// Tracker state (TCP flags seen).
    pub state: u8,
    pub class: TimeoutClass,
    pub mapping: u32,
    /// Coarse seconds of the last refresh.
    pub last_used: u32,
}

/// A mapping and its own session: 32 bytes, aligned so it never straddles
/// two cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Record {
    int_addr: u32,
    ext_addr: u32,
    rem_addr: u32,
    /// First extra session; NIL if none. In a free record: the next free one.
    extras: u32,
    last_used: u32,
    int_port: u16,
    ext_port: u16,
    rem_port: u16,
    /// The second (mod 2^16) the own session's wheel entry fires.
    armed: u16,
    proto: Proto,
    flags: u8,
    state: u8,
    class: TimeoutClass,
}

/// A further session of a mapping.
#[derive(Clone, Copy)]
struct Extra {
    mapping: u32,
    rem_addr: u32,
    last_used: u32,
    /// The mapping's extras list; in a free extra, `next` is the next free one.
    next: u32,
    prev: u32,
    /// On the list's head: the extras in the list, so that a mapping's
    /// sessions are counted without walking them (`session_count_of`).
    count: u32,
    rem_port: u16,
    armed: u16,
    state: u8,
    class: TimeoutClass,
    live: bool,
}

/// Which endpoint of a mapping a lookup goes by: the internal one for
/// outbound packets, the external one for inbound.
#[derive(Clone, Copy)]
enum By {
    Internal,
    External,
}

/// The two ends of a mapping, as a rewrite needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    pub int_addr: u32,
    pub int_port: u16,
    pub ext_addr: u32,
    pub ext_port: u16,
}

impl Endpoints {
    #[inline]
    fn of(r: &Record) -> Self {
        Endpoints { int_addr: r.int_addr, int_port: r.int_port, ext_addr: r.ext_addr, ext_port: r.ext_port }
    }
}

/// What one lookup found: the mapping of the endpoint, and the session with
/// the remote if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub mapping: u32,
    pub session: Option<u32>,
}

pub struct Tables {
    records: Vec<Record>,
    free_record: u32,
    extras: Vec<Extra>,
    free_extra: u32,
    index: FlowIndex,
    timers: Wheel<WHEEL_SLOTS>,
    timeouts: [u32; TimeoutClass::COUNT],
    sessions: usize,
    mappings: usize,
    sessions_by_proto: [u32; Proto::COUNT],
    mappings_by_proto: [u32; Proto::COUNT],
    max_sessions: usize,
    max_mappings: usize,
    seed: u64,
}

impl Tables {
    /// Tables for `max_sessions` sessions and as many mappings, plus
    /// `extra_mappings` that may hold no session (static ones), expiring
    /// each timeout class after `timeouts` idle seconds.
    pub fn new(max_sessions: u32, extra_mappings: usize, seed: u64, timeouts: [u32; TimeoutClass::COUNT]) -> Result<Self, EngineError> {
        let n = max_sessions as usize;
        let max_mappings = n + extra_mappings;
        let mut records = Vec::new();
        records.try_reserve_exact(max_mappings).map_err(|_| EngineError::Memory { table: "session table", bytes: Self::records_bytes(max_mappings) as u64 })?;
        crate::state::memory::advise_huge_pages(&records);
        let index_bytes = FlowIndex::bytes_for(2 * max_mappings);
        let index = FlowIndex::try_with_capacity(2 * max_mappings).map_err(|_| EngineError::Memory { table: "session index", bytes: index_bytes as u64 })?;
        Ok(Tables {
            records,
            free_record: NIL,
            extras: Vec::new(),
            free_extra: NIL,
            index,
            timers: Wheel::new(),
            timeouts,
            sessions: 0,
            mappings: 0,
            sessions_by_proto: [0; Proto::COUNT],
            mappings_by_proto: [0; Proto::COUNT],
            max_sessions: n,
            max_mappings,
            seed,
        })
    }

    /// Bytes reserved up front for `max_sessions` sessions and
    /// `extra_mappings` more mappings: the records and the index.
    pub fn reserved_bytes(max_sessions: u32, extra_mappings: usize) -> usize {
        let max_mappings = max_sessions as usize + extra_mappings;
        Self::records_bytes(max_mappings) + FlowIndex::bytes_for(2 * max_mappings) + Wheel::<WHEEL_SLOTS>::bytes()
    }

    fn records_bytes(max_mappings: usize) -> usize {
        max_mappings * core::mem::size_of::<Record>()
    }

    pub fn session_count(&self) -> usize {
        self.sessions
    }

    pub fn mapping_count(&self) -> usize {
        self.mappings
    }

    pub fn sessions_by_proto(&self) -> [u32; Proto::COUNT] {
        self.sessions_by_proto
    }

    pub fn mappings_by_proto(&self) -> [u32; Proto::COUNT] {
        self.mappings_by_proto
    }

    pub fn is_full(&self) -> bool {
        self.sessions >= self.max_sessions
    }

    /// Hash of an internal endpoint: what outbound packets look up.
    #[inline]
    pub fn hash_in(&self, proto: Proto, addr: u32, port: u16) -> u64 {
        hash::endpoint(self.seed_of(By::Internal), proto as u8, addr, port)
    }

    /// Hash of an external endpoint: what inbound packets look up.
    #[inline]
    pub fn hash_out(&self, proto: Proto, addr: u32, port: u16) -> u64 {
        hash::endpoint(self.seed_of(By::External), proto as u8, addr, port)
    }

    /// The two directions hash with different seeds, so a mapping's two
    /// index entries land apart.
    #[inline]
    fn seed_of(&self, by: By) -> u64 {
        match by {
            By::Internal => self.seed,
            By::External => !self.seed,
        }
    }

    #[inline]
    fn extra_hash(&self, by: By, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> u64 {
        hash::five_tuple(self.seed_of(by), proto as u8, addr, port, rem, rport)
    }

    /// Prefetch, stage one: the index bucket of an endpoint hash.
    #[inline]
    pub fn prefetch_bucket(&self, hash: u64) {
        self.index.prefetch(hash);
    }

    /// Prefetch, stage two: the mapping record the (by now loaded) bucket
    /// points at. The guess is returned: a likely record's id is a hint for
    /// the lookup that follows (`lookup_in_hinted`), which then need not
    /// search the bucket again, and an absent endpoint most likely opens a
    /// new mapping.
    #[inline]
    pub fn prefetch_record(&self, hash: u64) -> Guess {
        match self.index.guess(hash) {
            Guess::Likely(id) if id & EXTRA == 0 => {
                if let Some(r) = self.records.get(id as usize) {
                    prefetch(r);
                }
                Guess::Likely(id)
            }
            // An extra's tag: the mapping, if any, is further on (in this
            // bucket behind the tag collision, or a later one).
            Guess::Likely(_) => Guess::Unsure,
            other => other,
        }
    }

    /// Mapping of an internal endpoint, and its session with the remote.
    #[inline]
    pub fn lookup_in(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<Found> {
        self.lookup_at(By::Internal, self.hash_in(proto, addr, port), proto, addr, port, rem, rport)
    }

    /// Mapping of an external endpoint, and its session with the remote.
    #[inline]
    pub fn lookup_out(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<Found> {
        self.lookup_at(By::External, self.hash_out(proto, addr, port), proto, addr, port, rem, rport)
    }

    /// `lookup_in` given the internal endpoint's `hash_in`, as a batch
    /// computes it once for prefetching and lookup, and `hint`, the record
    /// `prefetch_record` guessed (NIL: none).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn lookup_in_hinted(&self, hint: u32, hash: u64, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<Found> {
        self.lookup_hinted(By::Internal, hint, hash, proto, addr, port, rem, rport)
    }

    /// `lookup_out` given the external endpoint's `hash_out` and a hint.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn lookup_out_hinted(&self, hint: u32, hash: u64, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<Found> {
        self.lookup_hinted(By::External, hint, hash, proto, addr, port, rem, rport)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn lookup_hinted(&self, by: By, hint: u32, hash: u64, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<Found> {
        let (mapping, r) = match self.hinted(by, hint, proto, addr, port) {
            Some(hit) => hit,
            None => {
                let mapping = self.mapping_at(by, hash, proto, addr, port)?;
                (mapping, &self.records[mapping as usize])
            }
        };
        let session = self.session_of(mapping, r, rem, rport, || self.extra_hash(by, proto, addr, port, rem, rport));
        Some(Found { mapping, session })
    }

    /// The hinted record, if it is the live mapping of the endpoint. Endpoints
    /// are unique among live mappings, so this is the one the index would
    /// find; the hint may be stale (the table changed since), never wrong.
    #[inline]
    fn hinted(&self, by: By, hint: u32, proto: Proto, addr: u32, port: u16) -> Option<(u32, &Record)> {
        let r = self.records.get(hint as usize)?;
        (r.flags & LIVE != 0 && Self::keyed(r, by, proto, addr, port)).then_some((hint, r))
    }

    #[inline]
    fn keyed(r: &Record, by: By, proto: Proto, addr: u32, port: u16) -> bool {
        let (a, p) = match by {
            By::Internal => (r.int_addr, r.int_port),
            By::External => (r.ext_addr, r.ext_port),
        };
        a == addr && p == port && r.proto == proto
    }

    /// Session for an outbound packet: (internal endpoint, remote endpoint).
    #[inline]
    pub fn find_session_in(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<u32> {
        self.lookup_in(proto, addr, port, rem, rport)?.session
    }

    /// Session for an inbound packet: (external endpoint, remote endpoint).
    #[inline]
    pub fn find_session_out(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<u32> {
        self.lookup_out(proto, addr, port, rem, rport)?.session
    }

    #[inline]
    pub fn find_mapping_in(&self, proto: Proto, addr: u32, port: u16) -> Option<u32> {
        self.mapping_at(By::Internal, self.hash_in(proto, addr, port), proto, addr, port)
    }

    #[inline]
    pub fn find_mapping_out(&self, proto: Proto, addr: u32, port: u16) -> Option<u32> {
        self.mapping_at(By::External, self.hash_out(proto, addr, port), proto, addr, port)
    }

    /// The mapping of endpoint (`proto`, `addr`, `port`) on side `by`,
    /// indexed under `hash`, and its session with the remote.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn lookup_at(&self, by: By, hash: u64, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<Found> {
        self.lookup_hinted(by, NIL, hash, proto, addr, port, rem, rport)
    }

    #[inline]
    fn mapping_at(&self, by: By, hash: u64, proto: Proto, addr: u32, port: u16) -> Option<u32> {
        let r = &self.records;
        self.index.find(hash, |id| id & EXTRA == 0 && Self::keyed(&r[id as usize], by, proto, addr, port))
    }

    #[inline(always)]
    fn session_of(&self, mapping: u32, r: &Record, rem: u32, rport: u16, extra_hash: impl FnOnce() -> u64) -> Option<u32> {
        if r.flags & OWN == 0 {
            return None;
        }
        if r.rem_addr == rem && r.rem_port == rport {
            return Some(mapping);
        }
        if r.extras == NIL {
            return None;
        }
        self.extra_session(mapping, extra_hash(), rem, rport)
    }

    /// The mapping's further session with the remote: the uncommon case, kept
    /// out of line so the common one stays small where it is inlined.
    #[inline(never)]
    fn extra_session(&self, mapping: u32, hash: u64, rem: u32, rport: u16) -> Option<u32> {
        let extras = &self.extras;
        self.index.find(hash, |id| {
            id & EXTRA != 0 && {
                let x = &extras[(id & !EXTRA) as usize];
                x.mapping == mapping && x.rem_addr == rem && x.rem_port == rport
            }
        })
    }

    pub fn mapping(&self, id: u32) -> Mapping {
        let r = &self.records[id as usize];
        Mapping { int_addr: r.int_addr, ext_addr: r.ext_addr, int_port: r.int_port, ext_port: r.ext_port, proto: r.proto, flags: r.flags & PUBLIC_FLAGS }
    }

    pub fn session(&self, id: u32) -> Session {
        if id & EXTRA == 0 {
            let r = &self.records[id as usize];
            return Session {
                int_addr: r.int_addr,
                ext_addr: r.ext_addr,
                rem_addr: r.rem_addr,
                int_port: r.int_port,
                ext_port: r.ext_port,
                rem_port: r.rem_port,
                proto: r.proto,
                state: r.state,
                class: r.class,
                mapping: id,
                last_used: r.last_used,
            };
        }
        let x = &self.extras[(id & !EXTRA) as usize];
        let r = &self.records[x.mapping as usize];
        Session {
            int_addr: r.int_addr,
            ext_addr: r.ext_addr,
            rem_addr: x.rem_addr,
            int_port: r.int_port,
            ext_port: r.ext_port,
            rem_port: x.rem_port,
            proto: r.proto,
            state: x.state,
            class: x.class,
            mapping: x.mapping,
            last_used: x.last_used,
        }
    }

    /// Whether `id` names a session that is still there.
    pub fn is_live(&self, id: u32) -> bool {
        if id & EXTRA == 0 {
            self.records.get(id as usize).is_some_and(|r| r.flags & (LIVE | OWN) == LIVE | OWN)
        } else {
            self.extras.get((id & !EXTRA) as usize).is_some_and(|x| x.live)
        }
    }

    /// The tracker state of a session, to update in place.
    #[inline]
    pub fn state_mut(&mut self, id: u32) -> &mut u8 {
        if id & EXTRA == 0 {
            &mut self.records[id as usize].state
        } else {
            &mut self.extras[(id & !EXTRA) as usize].state
        }
    }

    pub fn has_sessions(&self, mapping: u32) -> bool {
        self.records[mapping as usize].flags & OWN != 0
    }

    pub fn insert_mapping(&mut self, m: Mapping) -> Result<u32, TableFull> {
        self.insert_mapping_hashed(m, self.hash_in(m.proto, m.int_addr, m.int_port))
    }

    /// `insert_mapping` given the internal endpoint's `hash_in`, which the
    /// packet that opens the mapping has had computed for its lookup.
    #[inline(always)]
    pub fn insert_mapping_hashed(&mut self, m: Mapping, hin: u64) -> Result<u32, TableFull> {
        debug_assert_eq!(hin, self.hash_in(m.proto, m.int_addr, m.int_port));
        if self.mappings >= self.max_mappings {
            return Err(TableFull);
        }
        let rec = Record {
            int_addr: m.int_addr,
            ext_addr: m.ext_addr,
            rem_addr: 0,
            extras: NIL,
            last_used: 0,
            int_port: m.int_port,
            ext_port: m.ext_port,
            rem_port: 0,
            armed: 0,
            proto: m.proto,
            flags: (m.flags & PUBLIC_FLAGS) | LIVE,
            state: 0,
            class: TimeoutClass::Udp,
        };
        let id = if self.free_record != NIL {
            let id = self.free_record;
            self.free_record = self.records[id as usize].extras;
            self.records[id as usize] = rec;
            id
        } else {
            self.records.push(rec);
            (self.records.len() - 1) as u32
        };
        let hout = self.hash_out(m.proto, m.ext_addr, m.ext_port);
        if let Err(full) = self.index_both(hin, hout, id) {
            self.free_record_slot(id);
            return Err(full);
        }
        self.mappings += 1;
        self.mappings_by_proto[m.proto as usize] += 1;
        Ok(id)
    }

    /// Indexes `id` under both its hashes (internal and external side), or
    /// under neither.
    fn index_both(&mut self, hin: u64, hout: u64, id: u32) -> Result<(), TableFull> {
        self.index.insert(hin, id)?;
        self.index.insert(hout, id).inspect_err(|_| {
            self.index.remove(hin, id);
        })
    }

    fn free_record_slot(&mut self, id: u32) {
        let r = &mut self.records[id as usize];
        r.flags = 0;
        r.extras = self.free_record;
        self.free_record = id;
    }

    /// Removes a mapping that has no session left.
    pub fn remove_mapping(&mut self, id: u32) {
        let r = self.records[id as usize];
        debug_assert!(r.flags & OWN == 0 && r.extras == NIL, "mapping removed with sessions");
        self.index.remove(self.hash_in(r.proto, r.int_addr, r.int_port), id);
        self.index.remove(self.hash_out(r.proto, r.ext_addr, r.ext_port), id);
        self.free_record_slot(id);
        self.mappings -= 1;
        self.mappings_by_proto[r.proto as usize] -= 1;
    }

    /// Adds a session to `mapping` for the remote endpoint.
    #[inline(always)]
    pub fn insert_session(&mut self, mapping: u32, rem: u32, rport: u16, state: u8, class: TimeoutClass, now_s: u32) -> Result<u32, TableFull> {
        if self.is_full() {
            return Err(TableFull);
        }
        let r = self.records[mapping as usize];
        let id = if r.flags & OWN == 0 {
            let rec = &mut self.records[mapping as usize];
            rec.rem_addr = rem;
            rec.rem_port = rport;
            rec.state = state;
            rec.class = class;
            rec.last_used = now_s;
            rec.flags |= OWN;
            mapping
        } else {
            self.insert_extra(mapping, &r, rem, rport, state, class, now_s)?
        };
        self.arm(id, self.deadline(now_s, class));
        self.sessions += 1;
        self.sessions_by_proto[r.proto as usize] += 1;
        Ok(id)
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_extra(&mut self, mapping: u32, r: &Record, rem: u32, rport: u16, state: u8, class: TimeoutClass, now_s: u32) -> Result<u32, TableFull> {
        let count = if r.extras == NIL { 1 } else { self.extras[r.extras as usize].count + 1 };
        let x = Extra { mapping, rem_addr: rem, last_used: now_s, next: r.extras, prev: NIL, count, rem_port: rport, armed: 0, state, class, live: true };
        let slot = if self.free_extra != NIL {
            let slot = self.free_extra;
            self.free_extra = self.extras[slot as usize].next;
            self.extras[slot as usize] = x;
            slot
        } else {
            if self.extras.len() as u32 >= EXTRA - 1 {
                return Err(TableFull);
            }
            self.extras.push(x);
            (self.extras.len() - 1) as u32
        };
        let id = slot | EXTRA;
        let hin = self.extra_hash(By::Internal, r.proto, r.int_addr, r.int_port, rem, rport);
        let hout = self.extra_hash(By::External, r.proto, r.ext_addr, r.ext_port, rem, rport);
        if let Err(full) = self.index_both(hin, hout, id) {
            self.free_extra_slot(slot);
            return Err(full);
        }
        if r.extras != NIL {
            self.extras[r.extras as usize].prev = slot;
        }
        self.records[mapping as usize].extras = slot;
        Ok(id)
    }

    fn free_extra_slot(&mut self, slot: u32) {
        let x = &mut self.extras[slot as usize];
        x.live = false;
        x.next = self.free_extra;
        self.free_extra = slot;
    }

    /// Unlinks and frees a session; returns a copy for the caller's bookkeeping.
    pub fn remove_session(&mut self, id: u32) -> Session {
        let s = self.session(id);
        if id & EXTRA == 0 {
            self.records[id as usize].flags &= !OWN;
            if self.records[id as usize].extras != NIL {
                self.promote_extra(id);
            }
        } else {
            self.remove_extra(id & !EXTRA);
        }
        self.sessions -= 1;
        self.sessions_by_proto[s.proto as usize] -= 1;
        s
    }

    fn remove_extra(&mut self, slot: u32) {
        let x = self.extras[slot as usize];
        let r = self.records[x.mapping as usize];
        self.index.remove(self.extra_hash(By::Internal, r.proto, r.int_addr, r.int_port, x.rem_addr, x.rem_port), slot | EXTRA);
        self.index.remove(self.extra_hash(By::External, r.proto, r.ext_addr, r.ext_port, x.rem_addr, x.rem_port), slot | EXTRA);
        if x.prev != NIL {
            self.extras[x.prev as usize].next = x.next;
            self.extras[r.extras as usize].count -= 1;
        } else {
            self.records[x.mapping as usize].extras = x.next;
        }
        if x.next != NIL {
            self.extras[x.next as usize].prev = x.prev;
            if x.prev == NIL {
                self.extras[x.next as usize].count = x.count - 1;
            }
        }
        self.free_extra_slot(slot);
    }

    /// The own session ended while extras live: the first extra becomes the
    /// own session, so lookups keep finding extras only behind a live own.
    fn promote_extra(&mut self, mapping: u32) {
        let slot = self.records[mapping as usize].extras;
        let x = self.extras[slot as usize];
        self.remove_extra(slot);
        let r = &mut self.records[mapping as usize];
        r.rem_addr = x.rem_addr;
        r.rem_port = x.rem_port;
        r.state = x.state;
        r.class = x.class;
        r.last_used = x.last_used;
        r.flags |= OWN;
        self.arm(mapping, self.deadline(x.last_used, x.class));
    }

    /// Marks a session used now, in its (possibly new) timeout class.
    #[inline]
    pub fn touch(&mut self, id: u32, now_s: u32, class: TimeoutClass) {
        self.on_packet(id, now_s, true, |_, _, _| class);
    }

    /// One packet of session `id`, in one visit to its record: `advance`
    /// turns the tracker state (given the protocol and the timeout class)
    /// into the new state and returns the new class; the session is
    /// refreshed to `now_s` if `refresh` (inbound packets with inbound
    /// refresh off only reclassify it). Returns the endpoints to rewrite to.
    /// Inlined always: the batch loop with DS-Lite or a middlebox function
    /// configured grew past where the compiler inlines it, and the call
    /// cost an established packet there about 15 instructions (callgrind).
    #[inline(always)]
    pub fn on_packet(&mut self, id: u32, now_s: u32, refresh: bool, advance: impl FnOnce(Proto, &mut u8, TimeoutClass) -> TimeoutClass) -> Endpoints {
        let (old, new, ends) = if id & EXTRA == 0 {
            let r = &mut self.records[id as usize];
            let old = r.class;
            let new = advance(r.proto, &mut r.state, old);
            r.class = new;
            if refresh {
                r.last_used = now_s;
            }
            (old, new, Endpoints::of(r))
        } else {
            let x = &mut self.extras[(id & !EXTRA) as usize];
            let r = &self.records[x.mapping as usize];
            let old = x.class;
            let new = advance(r.proto, &mut x.state, old);
            x.class = new;
            if refresh {
                x.last_used = now_s;
            }
            (old, new, Endpoints::of(r))
        };
        if new != old {
            self.rearm_if_sooner(id);
        }
        ends
    }

    /// The two ends of session `id`'s mapping.
    pub fn endpoints(&self, id: u32) -> Endpoints {
        let mapping = if id & EXTRA == 0 { id } else { self.extras[(id & !EXTRA) as usize].mapping };
        Endpoints::of(&self.records[mapping as usize])
    }

    #[inline]
    fn timer_of(&self, id: u32) -> (u32, TimeoutClass) {
        if id & EXTRA == 0 {
            let r = &self.records[id as usize];
            (r.last_used, r.class)
        } else {
            let x = &self.extras[(id & !EXTRA) as usize];
            (x.last_used, x.class)
        }
    }

    #[inline]
    fn armed_of(&self, id: u32) -> u16 {
        if id & EXTRA == 0 {
            self.records[id as usize].armed
        } else {
            self.extras[(id & !EXTRA) as usize].armed
        }
    }

    /// The first second at which a session used at `last_used` has been idle
    /// longer than its class's timeout.
    #[inline]
    fn deadline(&self, last_used: u32, class: TimeoutClass) -> u32 {
        last_used.saturating_add(self.timeouts[class as usize]).saturating_add(1)
    }

    /// A shorter timeout than the one armed for: fire sooner.
    fn rearm_if_sooner(&mut self, id: u32) {
        let (last_used, class) = self.timer_of(id);
        let due = self.deadline(last_used, class);
        if due < self.timers.armed_second(self.armed_of(id)) {
            self.arm(id, due);
        }
    }

    /// Queues `id` on the wheel for second `due`, or as close to it as the
    /// wheel reaches.
    #[inline(always)]
    fn arm(&mut self, id: u32, due: u32) {
        let at = self.timers.arm(id, due);
        self.set_armed(id, at);
    }

    #[inline(always)]
    fn set_armed(&mut self, id: u32, at: u32) {
        if id & EXTRA == 0 {
            self.records[id as usize].armed = at as u16;
        } else {
            self.extras[(id & !EXTRA) as usize].armed = at as u16;
        }
    }

    /// Runs the wheel up to `now_s` and appends to `expired` every session
    /// idle past its timeout, each once, extras before own sessions (so an
    /// own session's end promotes only an extra that is staying).
    pub fn expire(&mut self, now_s: u32, expired: &mut Vec<u32>) {
        let start = expired.len();
        let mut timers = std::mem::take(&mut self.timers);
        let mask = timers.mask();
        timers.run(now_s, |id, firing| {
            // Stale: the session ended, or was armed again for another
            // second (a copy left by a re-arm, or by a same-slot duplicate
            // that the first copy already re-armed).
            if !self.is_live(id) || !firing.is_current(self.armed_of(id), mask) {
                return None;
            }
            let (last_used, class) = self.timer_of(id);
            let due = self.deadline(last_used, class);
            if due <= now_s {
                expired.push(id);
                return None;
            }
            self.set_armed(id, firing.rearm_second(due));
            Some(due)
        });
        self.timers = timers;
        let mut found = expired.split_off(start);
        found.sort_unstable_by(|a, b| b.cmp(a));
        found.dedup();
        expired.append(&mut found);
    }

    /// New idle timeouts (a reload): sessions now due sooner are re-armed.
    pub fn set_timeouts(&mut self, timeouts: [u32; TimeoutClass::COUNT]) {
        let shorter = timeouts.iter().zip(self.timeouts.iter()).any(|(new, old)| new < old);
        self.timeouts = timeouts;
        if shorter {
            let ids: Vec<u32> = self.live_sessions().collect();
            for id in ids {
                self.rearm_if_sooner(id);
            }
        }
    }

    /// Every live session.
    pub fn live_sessions(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.records.len() as u32).filter(|&m| self.records[m as usize].flags & LIVE != 0).flat_map(move |m| self.sessions_of(m))
    }

    /// Whether record `id` is a live mapping.
    pub fn is_live_mapping(&self, id: u32) -> bool {
        self.records.get(id as usize).is_some_and(|r| r.flags & LIVE != 0)
    }

    /// Record slots, live or not: where a walk over the table ends.
    pub fn record_slots(&self) -> u32 {
        self.records.len() as u32
    }

    /// How many sessions a mapping has, without walking them.
    pub fn session_count_of(&self, mapping: u32) -> usize {
        let r = &self.records[mapping as usize];
        let extras = if r.extras == NIL { 0 } else { self.extras[r.extras as usize].count as usize };
        usize::from(r.flags & OWN != 0) + extras
    }

    /// Sessions of a mapping.
    pub fn sessions_of(&self, mapping: u32) -> SessionsOf<'_> {
        let r = &self.records[mapping as usize];
        let own = r.flags & OWN != 0;
        SessionsOf { tables: self, own: own.then_some(mapping), next: if own { r.extras } else { NIL } }
    }

    /// Bytes of slabs, index and wheel as allocated.
    pub fn memory_bytes(&self) -> usize {
        self.records.capacity() * core::mem::size_of::<Record>() + self.extras.capacity() * core::mem::size_of::<Extra>() + self.index.memory_bytes() + self.timers.memory_bytes()
    }
}

pub struct SessionsOf<'a> {
    tables: &'a Tables,
    own: Option<u32>,
    next: u32,
}

impl Iterator for SessionsOf<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if let Some(own) = self.own.take() {
            return Some(own);
        }
        if self.next == NIL {
            return None;
        }
        let slot = self.next;
        self.next = self.tables.extras[slot as usize].next;
        Some(slot | EXTRA)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: [u32; TimeoutClass::COUNT] = [120, 7440, 240, 60, 15, 300];

    fn mapping(int_port: u16, ext_port: u16) -> Mapping {
        Mapping { int_addr: 0x6440_000a, ext_addr: 0xcb00_7101, int_port, ext_port, proto: Proto::Udp, flags: 0 }
    }

    fn expire(t: &mut Tables, now: u32) -> Vec<u32> {
        let mut v = Vec::new();
        t.expire(now, &mut v);
        v
    }

    #[test]
    fn record_is_half_a_cache_line() {
        assert_eq!(core::mem::size_of::<Record>(), 32);
        assert_eq!(core::mem::align_of::<Record>(), 32);
        assert_eq!(core::mem::size_of::<Extra>(), 32);
    }

    #[test]
    fn both_directions_find_the_same_session() {
        let mut t = Tables::new(16, 0, 7, TIMEOUTS).unwrap();
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        let s = t.insert_session(m, 0xc633_6435, 53, 0, TimeoutClass::Udp, 1).unwrap();
        assert_eq!(t.find_session_in(Proto::Udp, 0x6440_000a, 4000, 0xc633_6435, 53), Some(s));
        assert_eq!(t.find_session_out(Proto::Udp, 0xcb00_7101, 5000, 0xc633_6435, 53), Some(s));
        assert_eq!(t.find_session_out(Proto::Tcp, 0xcb00_7101, 5000, 0xc633_6435, 53), None);
        assert_eq!(t.find_mapping_out(Proto::Udp, 0xcb00_7101, 5000), Some(m));
        assert_eq!(t.lookup_out(Proto::Udp, 0xcb00_7101, 5000, 1, 1), Some(Found { mapping: m, session: None }));
        t.remove_session(s);
        assert_eq!(t.find_session_in(Proto::Udp, 0x6440_000a, 4000, 0xc633_6435, 53), None);
        assert!(!t.has_sessions(m));
    }

    #[test]
    fn a_stale_hint_is_checked_never_trusted() {
        let mut t = Tables::new(16, 0, 7, TIMEOUTS).unwrap();
        let (int, ext, rem) = (0x6440_000a, 0xcb00_7101, 0xc633_6435);
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        t.insert_session(m, rem, 53, 0, TimeoutClass::Udp, 1).unwrap();
        let (hin, hout) = (t.hash_in(Proto::Udp, int, 4000), t.hash_out(Proto::Udp, ext, 5000));
        let Guess::Likely(hint) = t.prefetch_record(hin) else { panic!("the prefetch finds the record") };
        assert_eq!(hint, m, "the prefetch guesses the record it loads");
        assert_eq!(t.lookup_in_hinted(hint, hin, Proto::Udp, int, 4000, rem, 53), Some(Found { mapping: m, session: Some(m) }));
        assert_eq!(t.prefetch_record(hout), Guess::Likely(m));
        assert_eq!(t.lookup_out_hinted(m, hout, Proto::Udp, ext, 5000, rem, 53), Some(Found { mapping: m, session: Some(m) }));
        // The record is freed and reused by another endpoint before the
        // hinted lookup runs: the hint now names the wrong mapping.
        t.remove_session(m);
        t.remove_mapping(m);
        assert_eq!(t.lookup_in_hinted(hint, hin, Proto::Udp, int, 4000, rem, 53), None, "a freed record is not live");
        let other = t.insert_mapping(mapping(4001, 5001)).unwrap();
        assert_eq!(other, hint, "the freed record is reused");
        assert_eq!(t.lookup_in_hinted(hint, hin, Proto::Udp, int, 4000, rem, 53), None);
        let again = t.insert_mapping(mapping(4000, 5000)).unwrap();
        assert_eq!(t.lookup_in_hinted(hint, hin, Proto::Udp, int, 4000, rem, 53), Some(Found { mapping: again, session: None }), "the index answers when the hint misses");
        assert_eq!(t.lookup_in_hinted(NIL, hin, Proto::Udp, int, 4000, rem, 53), Some(Found { mapping: again, session: None }));
    }

    #[test]
    fn extras_are_found_both_ways_and_one_moves_in_when_the_own_session_ends() {
        let mut t = Tables::new(16, 0, 7, TIMEOUTS).unwrap();
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        let a = t.insert_session(m, 1, 1, 0, TimeoutClass::Udp, 1).unwrap();
        let b = t.insert_session(m, 2, 2, 0, TimeoutClass::Udp, 2).unwrap();
        let c = t.insert_session(m, 3, 3, 0, TimeoutClass::Udp, 3).unwrap();
        assert_eq!(a, m);
        assert_eq!(t.find_session_in(Proto::Udp, 0x6440_000a, 4000, 2, 2), Some(b));
        assert_eq!(t.find_session_out(Proto::Udp, 0xcb00_7101, 5000, 3, 3), Some(c));
        assert_eq!(t.session_count(), 3);
        t.remove_session(a);
        let own = t.find_session_in(Proto::Udp, 0x6440_000a, 4000, 3, 3).unwrap();
        assert_eq!(own, m, "the first extra (newest) moved into the record");
        assert_eq!(t.session(own).last_used, 3);
        assert_eq!(t.find_session_out(Proto::Udp, 0xcb00_7101, 5000, 2, 2), Some(b));
        let mut sibs: Vec<u32> = t.sessions_of(m).collect();
        sibs.sort_unstable();
        assert_eq!(sibs, vec![m, b]);
        assert_eq!(t.live_sessions().count(), 2);
    }

    #[test]
    fn sessions_expire_the_second_after_their_timeout_and_refresh_postpones() {
        let mut t = Tables::new(16, 0, 7, TIMEOUTS).unwrap();
        let m1 = t.insert_mapping(mapping(4000, 5000)).unwrap();
        let m2 = t.insert_mapping(mapping(4001, 5001)).unwrap();
        let a = t.insert_session(m1, 1, 1, 0, TimeoutClass::Udp, 10).unwrap();
        let b = t.insert_session(m2, 2, 2, 0, TimeoutClass::Udp, 10).unwrap();
        t.touch(b, 100, TimeoutClass::Udp);
        assert!(expire(&mut t, 130).is_empty(), "120 s idle is not past the timeout");
        assert_eq!(expire(&mut t, 131), vec![a]);
        t.remove_session(a);
        assert!(expire(&mut t, 220).is_empty());
        assert_eq!(expire(&mut t, 221), vec![b]);
    }

    #[test]
    fn a_shorter_class_fires_sooner_and_long_timeouts_outlast_the_wheel() {
        let mut t = Tables::new(16, 0, 7, TIMEOUTS).unwrap();
        let m1 = t.insert_mapping(mapping(4000, 5000)).unwrap();
        let m2 = t.insert_mapping(mapping(4001, 5001)).unwrap();
        let a = t.insert_session(m1, 1, 1, 0, TimeoutClass::TcpEstablished, 0).unwrap();
        let b = t.insert_session(m2, 2, 2, 0, TimeoutClass::TcpEstablished, 0).unwrap();
        let ends = t.on_packet(a, 0, false, |_, _, _| TimeoutClass::TcpTransitory);
        assert_eq!((ends.int_port, ends.ext_port), (4000, 5000));
        assert!(expire(&mut t, 240).is_empty());
        assert_eq!(expire(&mut t, 241), vec![a]);
        t.remove_session(a);
        for now in (242..7441).step_by(97) {
            assert!(expire(&mut t, now).is_empty(), "at {now}");
        }
        assert!(expire(&mut t, 7440).is_empty());
        assert_eq!(expire(&mut t, 7441), vec![b]);
    }

    #[test]
    fn a_clock_jump_expires_everything_due_once() {
        let mut t = Tables::new(64, 0, 7, TIMEOUTS).unwrap();
        let mut ids = Vec::new();
        for i in 0..20u16 {
            let m = t.insert_mapping(mapping(4000 + i, 5000 + i)).unwrap();
            ids.push(t.insert_session(m, 9, 9, 0, TimeoutClass::Udp, u32::from(i)).unwrap());
            ids.push(t.insert_session(m, 8, 8, 0, TimeoutClass::Udp, u32::from(i)).unwrap());
        }
        let mut got = expire(&mut t, 1_000_000);
        got.sort_unstable();
        ids.sort_unstable();
        assert_eq!(got, ids);
    }

    #[test]
    fn shorter_timeouts_on_reload_apply_to_live_sessions() {
        let mut t = Tables::new(16, 0, 7, TIMEOUTS).unwrap();
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        let a = t.insert_session(m, 1, 1, 0, TimeoutClass::Udp, 0).unwrap();
        t.set_timeouts([30, 7440, 240, 60, 15, 300]);
        assert!(expire(&mut t, 30).is_empty());
        assert_eq!(expire(&mut t, 31), vec![a]);
    }

    #[test]
    fn full_table_refuses() {
        let mut t = Tables::new(2, 0, 7, TIMEOUTS).unwrap();
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        t.insert_session(m, 1, 1, 0, TimeoutClass::Udp, 1).unwrap();
        t.insert_session(m, 2, 1, 0, TimeoutClass::Udp, 1).unwrap();
        assert!(t.insert_session(m, 3, 1, 0, TimeoutClass::Udp, 1).is_err());
    }

    proptest::proptest! {
        /// Against a plain model: any mix of inserts and removals leaves
        /// exactly the live sessions findable, both ways.
        #[test]
        fn behaves_like_a_set_of_sessions(ops in proptest::collection::vec((0u8..3, 0u16..6, 0u32..5), 1..300)) {
            let mut t = Tables::new(64, 0, 7, TIMEOUTS).unwrap();
            let mut model = std::collections::HashSet::new();
            for (op, port, rem) in ops {
                match op {
                    0 | 1 => if model.insert((port, rem)) {
                        let mid = t.find_mapping_in(Proto::Udp, 0x6440_000a, 4000 + port)
                            .unwrap_or_else(|| t.insert_mapping(mapping(4000 + port, 5000 + port)).unwrap());
                        t.insert_session(mid, rem, 7, 0, TimeoutClass::Udp, 1).unwrap();
                    },
                    _ => if model.remove(&(port, rem)) {
                        let s = t.find_session_in(Proto::Udp, 0x6440_000a, 4000 + port, rem, 7).unwrap();
                        let gone = t.remove_session(s);
                        proptest::prop_assert_eq!((gone.rem_addr, gone.int_port), (rem, 4000 + port));
                        if !t.has_sessions(gone.mapping) { t.remove_mapping(gone.mapping); }
                    },
                }
                for port in 0..6u16 {
                    for rem in 0..5u32 {
                        let inn = t.find_session_in(Proto::Udp, 0x6440_000a, 4000 + port, rem, 7);
                        let out = t.find_session_out(Proto::Udp, 0xcb00_7101, 5000 + port, rem, 7);
                        proptest::prop_assert_eq!(inn.is_some(), model.contains(&(port, rem)));
                        proptest::prop_assert_eq!(inn, out);
                        if let Some(s) = inn {
                            proptest::prop_assert_eq!(t.session(s).rem_addr, rem);
                        }
                    }
                }
                for port in 0..6u16 {
                    if let Some(mid) = t.find_mapping_in(Proto::Udp, 0x6440_000a, 4000 + port) {
                        proptest::prop_assert_eq!(t.session_count_of(mid), t.sessions_of(mid).count());
                        proptest::prop_assert_eq!(t.session_count_of(mid), model.iter().filter(|m| m.0 == port).count());
                    }
                }
                proptest::prop_assert_eq!(t.session_count(), model.len());
                proptest::prop_assert_eq!(t.live_sessions().count(), model.len());
            }
        }
    }
}
