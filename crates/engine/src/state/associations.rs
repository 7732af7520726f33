//! SCTP associations (seed 001 section 2.3, draft-ietf-tsvwg-natsupp's NAT
//! binding table): no port is translated, so an association is told apart
//! from others by its verification tags. Each record holds the internal,
//! external and remote addresses, the two ports and the two tags: the
//! internal host's own (`int_vtag`, learned from its INIT; every packet
//! towards it carries it: seed 001's "global vtag") and the remote host's
//! (`rem_vtag`, learned from the INIT-ACK; every packet from the internal
//! host carries it: seed 001's "local vtag").
//!
//! One index finds a record by either tag from either side, four keys per
//! association (two until the INIT-ACK): (internal address, ports, tag) for
//! packets from inside, (external address, ports, tag) for packets from
//! outside, each with either tag, since an ABORT or SHUTDOWN-COMPLETE with
//! the T bit carries its sender's own tag. The remote address is not in the
//! keys: a multi-homed remote may use any of its addresses (seed 001 section
//! 4.2.3); lookups prefer the record whose remote address matches (or is
//! tracked) and say when only the tags and ports did.
//!
//! Global addresses beyond the first, when tracked (`[sctp]
//! track_global_addresses`), hang off their record in a list of 8-byte nodes.
//! Idle associations expire on a timer wheel of one-second slots, as
//! sessions do.

use crate::error::EngineError;
use crate::state::hash;
use crate::state::index::FlowIndex;
use crate::state::timers::Wheel;
use crate::trackers::TimeoutClass;

pub const NIL: u32 = u32::MAX;

const WHEEL_SLOTS: u32 = 4096;
const SCTP: u8 = natrix_wire::proto::SCTP;

/// Record flags.
const LIVE: u8 = 0x01;
/// `rem_vtag` is known (the INIT-ACK passed) and indexed.
const REM_KNOWN: u8 = 0x02;
/// The internal host has used `rem_vtag`: it took that INIT-ACK.
const REM_CONFIRMED: u8 = 0x04;
/// Associations in their handshake at once with a second remote tag.
const MAX_ALTERNATES: usize = 4096;

/// Bytes a table of second tags holds: an entry and its control byte
/// per slot, at most 8/7 slots per entry it takes.
fn alternates_bytes(t: &std::collections::HashMap<u32, u32>) -> usize {
    (t.capacity() * 8).div_ceil(7) * 9
}

/// Which tag of which side a lookup goes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// From inside, the internal host's own tag: INITs, T-bit chunks.
    InsideByIntTag = 0,
    /// From inside, the remote's tag: everything else the internal host sends.
    InsideByRemTag = 1,
    /// From outside, the internal host's tag: everything the remote sends.
    OutsideByIntTag = 2,
    /// From outside, the remote's own tag: T-bit chunks.
    OutsideByRemTag = 3,
}

impl Key {
    const ALL: [Key; 4] = [Key::InsideByIntTag, Key::InsideByRemTag, Key::OutsideByIntTag, Key::OutsideByRemTag];

    fn by_rem_tag(self) -> bool {
        matches!(self, Key::InsideByRemTag | Key::OutsideByRemTag)
    }

    fn outside(self) -> bool {
        matches!(self, Key::OutsideByIntTag | Key::OutsideByRemTag)
    }
}

/// An association as callers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Association {
    pub int_addr: u32,
    pub ext_addr: u32,
    pub rem_addr: u32,
    pub int_port: u16,
    pub rem_port: u16,
    pub int_vtag: u32,
    /// 0 until the INIT-ACK (a tag is never 0, RFC 9260 section 3.3.2).
    pub rem_vtag: u32,
    pub state: u8,
    pub class: TimeoutClass,
    pub last_used: u32,
    /// Global addresses tracked beyond `rem_addr`.
    pub globals: u8,
}

/// 40 bytes: seed 001's alias_sctp needs 60 (section 6.6).
#[derive(Clone, Copy)]
#[repr(C)]
struct Record {
    int_addr: u32,
    ext_addr: u32,
    rem_addr: u32,
    int_vtag: u32,
    rem_vtag: u32,
    last_used: u32,
    /// First further global address; NIL if none. In a free record: the next free one.
    globals: u32,
    int_port: u16,
    rem_port: u16,
    /// The second (mod 2^16) the record's wheel entry fires.
    armed: u16,
    state: u8,
    class: TimeoutClass,
    flags: u8,
    global_count: u8,
}

/// A tracked global address: 8 bytes (seed 001's 12 with two pointers).
#[derive(Clone, Copy)]
struct Global {
    addr: u32,
    next: u32,
}

/// What a lookup found: the association, and whether the packet's remote
/// address is its remote address or one it tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub id: u32,
    pub remote_known: bool,
}

/// The table is at capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

pub struct Associations {
    records: Vec<Record>,
    free: u32,
    globals: Vec<Global>,
    free_global: u32,
    index: FlowIndex,
    timers: Wheel<WHEEL_SLOTS>,
    timeouts: [u32; TimeoutClass::COUNT],
    live: usize,
    capacity: usize,
    seed: u64,
    /// Associations whose remote answered with a second tag before the
    /// internal host used the first: that tag, indexed too
    /// (`learn_rem_vtag`).
    alternates: std::collections::HashMap<u32, u32>,
}

impl Associations {
    /// A table for `capacity` associations, expiring each timeout class after
    /// `timeouts` idle seconds. Records grow with use; the index is built
    /// whole (four keys per association, and two for each second remote
    /// tag), as is the table of second tags.
    pub fn new(capacity: u32, seed: u64, timeouts: [u32; TimeoutClass::COUNT]) -> Result<Self, EngineError> {
        let capacity = capacity as usize;
        let keys = Self::index_keys(capacity);
        let index = FlowIndex::try_with_capacity(keys).map_err(|_| EngineError::Memory { table: "sctp association index", bytes: FlowIndex::bytes_for(keys) as u64 })?;
        Ok(Associations {
            records: Vec::new(),
            free: NIL,
            globals: Vec::new(),
            free_global: NIL,
            index,
            timers: Wheel::new(),
            timeouts,
            live: 0,
            capacity,
            seed,
            alternates: std::collections::HashMap::with_capacity(Self::max_alternates(capacity)),
        })
    }

    /// Bytes reserved up front for `capacity` associations: the index, the
    /// wheel and the table of second tags.
    pub fn reserved_bytes(capacity: u32) -> usize {
        let capacity = capacity as usize;
        let alternates = std::collections::HashMap::<u32, u32>::with_capacity(Self::max_alternates(capacity));
        FlowIndex::bytes_for(Self::index_keys(capacity)) + Wheel::<WHEEL_SLOTS>::bytes() + alternates_bytes(&alternates)
    }

    /// Keys the index holds at most: four per association, two more per second remote tag.
    fn index_keys(capacity: usize) -> usize {
        Key::ALL.len() * capacity + 2 * Self::max_alternates(capacity)
    }

    fn max_alternates(capacity: usize) -> usize {
        MAX_ALTERNATES.min(capacity)
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes of records, address nodes, index and wheel as allocated.
    pub fn memory_bytes(&self) -> usize {
        self.records.capacity() * core::mem::size_of::<Record>()
            + self.globals.capacity() * core::mem::size_of::<Global>()
            + self.index.memory_bytes()
            + self.timers.memory_bytes()
            + alternates_bytes(&self.alternates)
    }

    fn hash(&self, key: Key, addr: u32, int_port: u16, rem_port: u16, tag: u32) -> u64 {
        // Each kind of key hashes with its own seed, so a record's keys land apart.
        let seed = self.seed ^ (key as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        hash::five_tuple(seed, SCTP, addr, int_port, tag, rem_port)
    }

    fn hash_of(&self, key: Key, r: &Record) -> u64 {
        let addr = if key.outside() { r.ext_addr } else { r.int_addr };
        let tag = if key.by_rem_tag() { r.rem_vtag } else { r.int_vtag };
        self.hash(key, addr, r.int_port, r.rem_port, tag)
    }

    /// Whether record `id` is found by this key: by its own tags, or by
    /// the remote tag it holds besides (`alternates`).
    fn matches(&self, id: u32, key: Key, addr: u32, int_port: u16, rem_port: u16, tag: u32) -> bool {
        let r = &self.records[id as usize];
        Self::keyed(r, key, addr, int_port, rem_port, tag)
            || (!self.alternates.is_empty()
                && key.by_rem_tag()
                && self.alternates.get(&id) == Some(&tag)
                && Self::keyed(&Record { rem_vtag: tag, ..*r }, key, addr, int_port, rem_port, tag))
    }

    fn keyed(r: &Record, key: Key, addr: u32, int_port: u16, rem_port: u16, tag: u32) -> bool {
        let (a, t) = match key {
            Key::InsideByIntTag => (r.int_addr, r.int_vtag),
            Key::InsideByRemTag => (r.int_addr, r.rem_vtag),
            Key::OutsideByIntTag => (r.ext_addr, r.int_vtag),
            Key::OutsideByRemTag => (r.ext_addr, r.rem_vtag),
        };
        r.flags & LIVE != 0 && (!key.by_rem_tag() || r.flags & REM_KNOWN != 0) && a == addr && t == tag && r.int_port == int_port && r.rem_port == rem_port
    }

    /// The association a packet belongs to: `addr` is the internal address
    /// for keys from inside, the external one for keys from outside; `rem`
    /// the packet's remote address. A record whose remote address matches
    /// (or is tracked) wins over one that only shares tag and ports.
    pub fn find(&self, key: Key, addr: u32, int_port: u16, rem_port: u16, tag: u32, rem: u32) -> Option<Found> {
        let h = self.hash(key, addr, int_port, rem_port, tag);
        let exact = self.index.find(h, |id| self.matches(id, key, addr, int_port, rem_port, tag) && self.knows_remote(id, rem));
        if let Some(id) = exact {
            return Some(Found { id, remote_known: true });
        }
        self.index.find(h, |id| self.matches(id, key, addr, int_port, rem_port, tag)).map(|id| Found { id, remote_known: false })
    }

    /// Whether `rem` is the association's remote address or one it tracks.
    pub fn knows_remote(&self, id: u32, rem: u32) -> bool {
        let r = &self.records[id as usize];
        r.rem_addr == rem || self.globals_of(r).any(|a| a == rem)
    }

    fn globals_of<'a>(&'a self, r: &Record) -> impl Iterator<Item = u32> + 'a {
        let mut next = r.globals;
        std::iter::from_fn(move || {
            let g = self.globals.get(next as usize)?;
            next = g.next;
            Some(g.addr)
        })
    }

    /// Opens an association; `a.rem_vtag` 0 until its INIT-ACK.
    pub fn insert(&mut self, a: &Association) -> Result<u32, Full> {
        if self.live >= self.capacity {
            return Err(Full);
        }
        let rec = Record {
            int_addr: a.int_addr,
            ext_addr: a.ext_addr,
            rem_addr: a.rem_addr,
            int_vtag: a.int_vtag,
            rem_vtag: a.rem_vtag,
            last_used: a.last_used,
            globals: NIL,
            int_port: a.int_port,
            rem_port: a.rem_port,
            armed: 0,
            state: a.state,
            class: a.class,
            // Both tags given (an ASCONF's VTags): the host named the remote's.
            flags: LIVE | if a.rem_vtag != 0 { REM_KNOWN | REM_CONFIRMED } else { 0 },
            global_count: 0,
        };
        let id = self.take_record(rec);
        for key in self.keys_of(id) {
            let h = self.hash_of(key, &self.records[id as usize]);
            if self.index.insert(h, id).is_err() {
                // The index holds four keys per association of capacity: never full first.
                debug_assert!(false, "sctp index full below capacity");
            }
        }
        self.live += 1;
        let due = self.deadline(a.last_used, a.class);
        self.arm(id, due);
        Ok(id)
    }

    fn take_record(&mut self, rec: Record) -> u32 {
        if self.free != NIL {
            let id = self.free;
            self.free = self.records[id as usize].globals;
            self.records[id as usize] = rec;
            return id;
        }
        self.records.push(rec);
        (self.records.len() - 1) as u32
    }

    /// The keys a live record is indexed under.
    fn keys_of(&self, id: u32) -> impl Iterator<Item = Key> {
        let rem_known = self.records[id as usize].flags & REM_KNOWN != 0;
        Key::ALL.into_iter().filter(move |k| rem_known || !k.by_rem_tag())
    }

    /// The INIT-ACK names the remote's tag: the association is found by it
    /// from now on. The internal host takes the first INIT-ACK that
    /// reaches it and discards later ones (RFC 9260 section 5.2.3), and
    /// which one that is natrix cannot tell: the first may have been lost
    /// on its way in (the remote, holding no state, answers the INIT sent
    /// again with a new tag, section 5.1) or only delayed. So until the
    /// host uses one (`confirm_rem_vtag`), a later INIT-ACK's tag is kept
    /// beside the first, the latest of them, and the association is found
    /// by either.
    pub fn learn_rem_vtag(&mut self, id: u32, tag: u32) {
        let r = self.records[id as usize];
        if r.flags & REM_KNOWN == 0 {
            self.records[id as usize].rem_vtag = tag;
            self.records[id as usize].flags |= REM_KNOWN;
            let indexed = self.index_rem_tag(id, tag, true);
            debug_assert!(indexed, "sctp index full below capacity");
            return;
        }
        if r.flags & REM_CONFIRMED != 0 || r.rem_vtag == tag || self.alternates.get(&id) == Some(&tag) {
            return;
        }
        if let Some(older) = self.alternates.remove(&id) {
            self.index_rem_tag(id, older, false);
        }
        // Bounded, and only where the index has room: else the first stands alone.
        if self.alternates.len() < Self::max_alternates(self.capacity) && self.index_rem_tag(id, tag, true) {
            self.alternates.insert(id, tag);
        }
    }

    /// The internal host sent a packet with the remote's tag `used`: the
    /// INIT-ACK it took. The other tag, if natrix held two, is forgotten.
    #[inline]
    pub fn confirm_rem_vtag(&mut self, id: u32, used: u32) {
        if self.records[id as usize].flags & REM_CONFIRMED != 0 {
            return;
        }
        self.records[id as usize].flags |= REM_CONFIRMED;
        let Some(other) = self.alternates.remove(&id) else { return };
        let r = &mut self.records[id as usize];
        if used == other {
            // The later INIT-ACK's: its keys are indexed already.
            let first = std::mem::replace(&mut r.rem_vtag, other);
            self.index_rem_tag(id, first, false);
        } else {
            self.index_rem_tag(id, other, false);
        }
    }

    /// Adds (or removes) association `id`'s keys by remote tag `tag`;
    /// false, nothing added, where the index has no room for both.
    fn index_rem_tag(&mut self, id: u32, tag: u32, add: bool) -> bool {
        let r = Record { rem_vtag: tag, ..self.records[id as usize] };
        let [inside, outside] = [Key::InsideByRemTag, Key::OutsideByRemTag].map(|key| self.hash_of(key, &r));
        if !add {
            self.index.remove(inside, id);
            self.index.remove(outside, id);
            return true;
        }
        if self.index.insert(inside, id).is_err() {
            return false;
        }
        if self.index.insert(outside, id).is_err() {
            self.index.remove(inside, id);
            return false;
        }
        true
    }

    /// Ends an association and returns what it was.
    pub fn remove(&mut self, id: u32) -> Association {
        let a = self.get(id);
        for key in self.keys_of(id) {
            let h = self.hash_of(key, &self.records[id as usize]);
            self.index.remove(h, id);
        }
        if let Some(other) = self.alternates.remove(&id) {
            self.index_rem_tag(id, other, false);
        }
        let mut next = self.records[id as usize].globals;
        while next != NIL {
            let g = next;
            next = self.globals[g as usize].next;
            self.globals[g as usize].next = self.free_global;
            self.free_global = g;
        }
        let r = &mut self.records[id as usize];
        r.flags = 0;
        r.globals = self.free;
        self.free = id;
        self.live -= 1;
        a
    }

    pub fn is_live(&self, id: u32) -> bool {
        self.records.get(id as usize).is_some_and(|r| r.flags & LIVE != 0)
    }

    pub fn get(&self, id: u32) -> Association {
        let r = &self.records[id as usize];
        Association {
            int_addr: r.int_addr,
            ext_addr: r.ext_addr,
            rem_addr: r.rem_addr,
            int_port: r.int_port,
            rem_port: r.rem_port,
            int_vtag: r.int_vtag,
            rem_vtag: r.rem_vtag,
            state: r.state,
            class: r.class,
            last_used: r.last_used,
            globals: r.global_count,
        }
    }

    /// The tracker's state, to change in place.
    pub fn state_mut(&mut self, id: u32) -> &mut u8 {
        &mut self.records[id as usize].state
    }

    /// A packet of association `id` at `now_s` under timeout class `class`.
    pub fn touch(&mut self, id: u32, now_s: u32, class: TimeoutClass) {
        let r = &mut self.records[id as usize];
        r.last_used = now_s;
        let sooner = self.timeouts[class as usize] < self.timeouts[r.class as usize];
        r.class = class;
        if sooner {
            let due = self.deadline(now_s, class);
            if due < self.timers.armed_second(self.records[id as usize].armed) {
                self.arm(id, due);
            }
        }
    }

    /// Tracks one more global address of association `id`, up to `max`;
    /// false when it is full (the address is then not tracked).
    pub fn add_global(&mut self, id: u32, addr: u32, max: u32) -> bool {
        if self.knows_remote(id, addr) {
            return true;
        }
        // The first address is the record's own; `max` counts it.
        if u32::from(self.records[id as usize].global_count) + 1 >= max {
            return false;
        }
        let node = Global { addr, next: self.records[id as usize].globals };
        let g = if self.free_global != NIL {
            let g = self.free_global;
            self.free_global = self.globals[g as usize].next;
            self.globals[g as usize] = node;
            g
        } else {
            self.globals.push(node);
            (self.globals.len() - 1) as u32
        };
        let r = &mut self.records[id as usize];
        r.globals = g;
        r.global_count += 1;
        true
    }

    /// Stops tracking a global address (an ASCONF Delete IP). The record's
    /// own remote address stays: packets still name it.
    pub fn remove_global(&mut self, id: u32, addr: u32) {
        let mut prev = NIL;
        let mut at = self.records[id as usize].globals;
        while at != NIL {
            let next = self.globals[at as usize].next;
            if self.globals[at as usize].addr == addr {
                if prev == NIL {
                    self.records[id as usize].globals = next;
                } else {
                    self.globals[prev as usize].next = next;
                }
                self.globals[at as usize].next = self.free_global;
                self.free_global = at;
                self.records[id as usize].global_count -= 1;
                return;
            }
            prev = at;
            at = next;
        }
    }

    /// Record slots, live or not: where a walk over the table ends.
    pub fn record_slots(&self) -> u32 {
        self.records.len() as u32
    }

    /// Every live association.
    pub fn live_ids(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.records.len() as u32).filter(|&id| self.records[id as usize].flags & LIVE != 0)
    }

    /// The first second at which an association used at `last_used` has
    /// been idle longer than its class's timeout.
    fn deadline(&self, last_used: u32, class: TimeoutClass) -> u32 {
        last_used.saturating_add(self.timeouts[class as usize]).saturating_add(1)
    }

    fn arm(&mut self, id: u32, due: u32) {
        let at = self.timers.arm(id, due);
        self.records[id as usize].armed = at as u16;
    }

    /// Runs the wheel up to `now_s` and appends every association idle past
    /// its timeout to `expired`, each once.
    pub fn expire(&mut self, now_s: u32, expired: &mut Vec<u32>) {
        let mut timers = std::mem::take(&mut self.timers);
        let mask = timers.mask();
        timers.run(now_s, |id, firing| {
            // Stale: the association ended, or was armed again elsewhere.
            let r = self.records.get(id as usize)?;
            if r.flags & LIVE == 0 || !firing.is_current(r.armed, mask) {
                return None;
            }
            let due = self.deadline(r.last_used, r.class);
            if due <= now_s {
                expired.push(id);
                return None;
            }
            self.records[id as usize].armed = firing.rearm_second(due) as u16;
            Some(due)
        });
        self.timers = timers;
        expired.sort_unstable();
        expired.dedup();
    }

    /// New idle timeouts (a reload): associations now due sooner are re-armed.
    pub fn set_timeouts(&mut self, timeouts: [u32; TimeoutClass::COUNT]) {
        let shorter = timeouts.iter().zip(self.timeouts.iter()).any(|(new, old)| new < old);
        self.timeouts = timeouts;
        if shorter {
            let ids: Vec<u32> = self.live_ids().collect();
            for id in ids {
                let r = self.records[id as usize];
                let due = self.deadline(r.last_used, r.class);
                if due < self.timers.armed_second(r.armed) {
                    self.arm(id, due);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: [u32; TimeoutClass::COUNT] = [120, 7440, 240, 60, 15, 300];
    const INT: u32 = 0x6440_000a;
    const EXT: u32 = 0xcb00_7101;
    const REM: u32 = 0xc633_6414;

    fn assoc(int_addr: u32, int_vtag: u32) -> Association {
        Association {
            int_addr,
            ext_addr: EXT,
            rem_addr: REM,
            int_port: 5000,
            rem_port: 38412,
            int_vtag,
            rem_vtag: 0,
            state: 1,
            class: TimeoutClass::SctpInit,
            last_used: 10,
            globals: 0,
        }
    }

    fn expire(t: &mut Associations, now: u32) -> Vec<u32> {
        let mut v = Vec::new();
        t.expire(now, &mut v);
        v
    }

    #[test]
    fn a_record_is_40_bytes_and_an_address_8() {
        assert_eq!(core::mem::size_of::<Record>(), 40);
        assert_eq!(core::mem::size_of::<Global>(), 8);
    }

    #[test]
    fn found_by_either_tag_from_either_side_once_the_init_ack_names_the_second() {
        let mut t = Associations::new(16, 7, TIMEOUTS).unwrap();
        let id = t.insert(&assoc(INT, 0x1111)).unwrap();
        let found = |t: &Associations, key, addr, tag| t.find(key, addr, 5000, 38412, tag, REM).map(|f| f.id);
        assert_eq!(found(&t, Key::InsideByIntTag, INT, 0x1111), Some(id));
        assert_eq!(found(&t, Key::OutsideByIntTag, EXT, 0x1111), Some(id));
        assert_eq!(found(&t, Key::InsideByRemTag, INT, 0), None, "no remote tag before the INIT-ACK, 0 matches nothing");
        assert_eq!(found(&t, Key::OutsideByIntTag, INT, 0x1111), None, "the outside goes by the external address");
        t.learn_rem_vtag(id, 0x2222);
        assert_eq!(found(&t, Key::InsideByRemTag, INT, 0x2222), Some(id));
        assert_eq!(found(&t, Key::OutsideByRemTag, EXT, 0x2222), Some(id));
        assert_eq!(t.find(Key::InsideByRemTag, INT, 5001, 38412, 0x2222, REM), None, "ports are in the key");
        let gone = t.remove(id);
        assert_eq!((gone.int_vtag, gone.rem_vtag), (0x1111, 0x2222));
        for key in Key::ALL {
            let addr = if key.outside() { EXT } else { INT };
            assert_eq!(found(&t, key, addr, 0x1111).or(found(&t, key, addr, 0x2222)), None);
        }
        assert!(t.is_empty());
    }

    /// Two INIT-ACKs before the host answers (the first lost on its way in,
    /// or only delayed): both tags find the association until the host
    /// uses one, then only that one does.
    #[test]
    fn a_second_init_ack_is_kept_beside_the_first_until_the_host_uses_one() {
        let found = |t: &Associations, key, addr, tag| t.find(key, addr, 5000, 38412, tag, REM).map(|f| f.id);
        for used in [0x2222, 0x3333] {
            let mut t = Associations::new(16, 7, TIMEOUTS).unwrap();
            let id = t.insert(&assoc(INT, 0x1111)).unwrap();
            t.learn_rem_vtag(id, 0x2222);
            t.learn_rem_vtag(id, 0x2222);
            t.learn_rem_vtag(id, 0x3333);
            for tag in [0x2222, 0x3333] {
                assert_eq!(found(&t, Key::InsideByRemTag, INT, tag), Some(id));
                assert_eq!(found(&t, Key::OutsideByRemTag, EXT, tag), Some(id));
            }
            t.confirm_rem_vtag(id, used);
            let other = 0x2222 + 0x3333 - used;
            assert_eq!(found(&t, Key::InsideByRemTag, INT, used), Some(id), "the tag the host used");
            assert_eq!(found(&t, Key::OutsideByRemTag, EXT, used), Some(id));
            assert_eq!(found(&t, Key::InsideByRemTag, INT, other), None, "the other is forgotten");
            assert_eq!(found(&t, Key::OutsideByRemTag, EXT, other), None);
            assert_eq!(t.get(id).rem_vtag, used);
            t.learn_rem_vtag(id, 0x4444);
            assert_eq!(found(&t, Key::InsideByRemTag, INT, 0x4444), None, "after the host answered, nothing changes");
            t.remove(id);
            assert_eq!(t.index.len(), 0, "no key left behind");
        }
        // A third before the host answers: the first and the latest are kept.
        let mut t = Associations::new(16, 7, TIMEOUTS).unwrap();
        let id = t.insert(&assoc(INT, 0x1111)).unwrap();
        for tag in [0x2222, 0x3333, 0x5555] {
            t.learn_rem_vtag(id, tag);
        }
        let kept: Vec<u32> = [0x2222, 0x3333, 0x5555].into_iter().filter(|&tag| found(&t, Key::InsideByRemTag, INT, tag).is_some()).collect();
        assert_eq!(kept, [0x2222, 0x5555]);
        t.remove(id);
        assert_eq!(t.index.len(), 0, "removed with its second tag's keys");
    }

    #[test]
    fn two_hosts_behind_one_address_and_port_are_told_apart_by_tag() {
        let mut t = Associations::new(16, 7, TIMEOUTS).unwrap();
        let a = t.insert(&assoc(INT, 0xaaaa)).unwrap();
        let b = t.insert(&assoc(INT + 1, 0xbbbb)).unwrap();
        assert_eq!(t.find(Key::OutsideByIntTag, EXT, 5000, 38412, 0xaaaa, REM).map(|f| f.id), Some(a));
        assert_eq!(t.find(Key::OutsideByIntTag, EXT, 5000, 38412, 0xbbbb, REM).map(|f| f.id), Some(b));
    }

    #[test]
    fn the_remote_address_decides_between_equals_and_is_reported() {
        let mut t = Associations::new(16, 7, TIMEOUTS).unwrap();
        let a = t.insert(&assoc(INT, 0xaaaa)).unwrap();
        let b = t.insert(&Association { rem_addr: REM + 1, ..assoc(INT + 1, 0xaaaa) }).unwrap();
        assert_eq!(t.find(Key::OutsideByIntTag, EXT, 5000, 38412, 0xaaaa, REM), Some(Found { id: a, remote_known: true }));
        assert_eq!(t.find(Key::OutsideByIntTag, EXT, 5000, 38412, 0xaaaa, REM + 1), Some(Found { id: b, remote_known: true }));
        let other = t.find(Key::OutsideByIntTag, EXT, 5000, 38412, 0xaaaa, REM + 9).unwrap();
        assert!(!other.remote_known);
        assert!(t.add_global(a, REM + 9, 25));
        assert_eq!(t.find(Key::OutsideByIntTag, EXT, 5000, 38412, 0xaaaa, REM + 9), Some(Found { id: a, remote_known: true }));
    }

    #[test]
    fn tracked_addresses_stop_at_the_limit_and_go_with_their_association() {
        let mut t = Associations::new(16, 7, TIMEOUTS).unwrap();
        let a = t.insert(&assoc(INT, 1)).unwrap();
        assert!(t.add_global(a, 9, 3) && t.add_global(a, 10, 3));
        assert!(!t.add_global(a, 11, 3), "three with the first");
        assert!(t.add_global(a, 9, 3), "known already");
        assert_eq!(t.get(a).globals, 2);
        t.remove_global(a, 9);
        assert!(!t.knows_remote(a, 9) && t.knows_remote(a, 10) && t.knows_remote(a, REM));
        assert!(t.add_global(a, 11, 3));
        t.remove(a);
        let b = t.insert(&assoc(INT, 2)).unwrap();
        assert_eq!(b, a, "the record is reused");
        assert!(!t.knows_remote(b, 10) && t.get(b).globals == 0);
        assert!(t.add_global(b, 12, 3));
        assert_eq!(t.globals.len(), 2, "the freed nodes are reused");
    }

    #[test]
    fn idle_associations_expire_by_their_class_and_a_touch_postpones() {
        let mut t = Associations::new(16, 7, TIMEOUTS).unwrap();
        let a = t.insert(&assoc(INT, 1)).unwrap();
        let b = t.insert(&Association { class: TimeoutClass::Sctp, ..assoc(INT + 1, 2) }).unwrap();
        assert!(expire(&mut t, 25).is_empty(), "15 s idle is not past sctp_init");
        assert_eq!(expire(&mut t, 26), vec![a]);
        t.remove(a);
        t.touch(b, 100, TimeoutClass::Sctp);
        assert!(expire(&mut t, 400).is_empty());
        t.touch(b, 400, TimeoutClass::SctpInit);
        assert_eq!(expire(&mut t, 416), vec![b], "a shorter class fires sooner");
    }

    #[test]
    fn a_full_table_refuses() {
        let mut t = Associations::new(2, 7, TIMEOUTS).unwrap();
        t.insert(&assoc(INT, 1)).unwrap();
        t.insert(&assoc(INT, 2)).unwrap();
        assert_eq!(t.insert(&assoc(INT, 3)), Err(Full));
    }

    proptest::proptest! {
        /// Against a plain model: any mix of opens, INIT-ACKs and ends leaves
        /// exactly the live associations findable, by every key they have.
        #[test]
        fn behaves_like_a_set_of_associations(ops in proptest::collection::vec((0u8..3, 0u32..6), 1..300)) {
            let mut t = Associations::new(64, 7, TIMEOUTS).unwrap();
            let mut model: std::collections::HashMap<u32, (u32, bool)> = Default::default();
            for (op, tag) in ops {
                let tag = tag + 1;
                match op {
                    0 => if let std::collections::hash_map::Entry::Vacant(e) = model.entry(tag) {
                        e.insert((t.insert(&assoc(INT, tag)).unwrap(), false));
                    },
                    1 => if let Some((id, known)) = model.get_mut(&tag) {
                        t.learn_rem_vtag(*id, tag + 100);
                        *known = true;
                    },
                    _ => if let Some((id, _)) = model.remove(&tag) {
                        t.remove(id);
                    },
                }
                for tag in 1..7u32 {
                    let by_int = t.find(Key::OutsideByIntTag, EXT, 5000, 38412, tag, REM).map(|f| f.id);
                    let by_rem = t.find(Key::InsideByRemTag, INT, 5000, 38412, tag + 100, REM).map(|f| f.id);
                    proptest::prop_assert_eq!(by_int, model.get(&tag).map(|m| m.0));
                    proptest::prop_assert_eq!(by_rem, model.get(&tag).filter(|m| m.1).map(|m| m.0));
                }
                proptest::prop_assert_eq!(t.len(), model.len());
            }
        }
    }
}
