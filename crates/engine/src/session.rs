//! Mappings (the BIB: internal endpoint <-> external endpoint) and sessions
//! (a mapping plus one remote endpoint), each in a slab, each indexed in both
//! directions, with per-timeout-class LRU lists so expiry only ever looks at
//! list heads.

use crate::hash;
use crate::table::{FlowIndex, TableFull};
use crate::trackers::TimeoutClass;
use crate::Proto;

pub const NIL: u32 = u32::MAX;

pub mod mapping_flags {
    /// Configured by the operator: never expires.
    pub const STATIC: u8 = 0x01;
}

#[derive(Debug, Clone, Copy)]
pub struct Mapping {
    pub int_addr: u32,
    pub ext_addr: u32,
    pub int_port: u16,
    pub ext_port: u16,
    pub proto: Proto,
    pub flags: u8,
    pub subscriber: u32,
    pub ext_index: u32,
    pub first_session: u32,
    pub sessions: u32,
}

/// 48 bytes: both directions' keys live here, so one index hit is enough.
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
    lru_prev: u32,
    lru_next: u32,
    sib_prev: u32,
    sib_next: u32,
}

pub struct Tables {
    pub sessions: Vec<Session>,
    pub mappings: Vec<Mapping>,
    free_sessions: Vec<u32>,
    free_mappings: Vec<u32>,
    sess_in: FlowIndex,
    sess_out: FlowIndex,
    map_in: FlowIndex,
    map_out: FlowIndex,
    lru: [(u32, u32); TimeoutClass::COUNT],
    sessions_by_proto: [u32; Proto::COUNT],
    mappings_by_proto: [u32; Proto::COUNT],
    max_sessions: usize,
    seed: u64,
}

impl Tables {
    pub fn new(max_sessions: u32, extra_mappings: usize, seed: u64) -> Self {
        let n = max_sessions as usize;
        let sessions = Vec::with_capacity(n);
        let mappings = Vec::with_capacity(n + extra_mappings);
        crate::memory::advise_huge_pages(&sessions);
        crate::memory::advise_huge_pages(&mappings);
        Tables {
            sessions,
            mappings,
            free_sessions: Vec::new(),
            free_mappings: Vec::new(),
            sess_in: FlowIndex::with_capacity(n),
            sess_out: FlowIndex::with_capacity(n),
            map_in: FlowIndex::with_capacity(n + extra_mappings),
            map_out: FlowIndex::with_capacity(n + extra_mappings),
            lru: [(NIL, NIL); TimeoutClass::COUNT],
            sessions_by_proto: [0; Proto::COUNT],
            mappings_by_proto: [0; Proto::COUNT],
            max_sessions: n,
            seed,
        }
    }

    pub fn session_count(&self) -> usize {
        self.sess_in.len()
    }

    pub fn mapping_count(&self) -> usize {
        self.map_in.len()
    }

    pub fn sessions_by_proto(&self) -> [u32; Proto::COUNT] {
        self.sessions_by_proto
    }

    pub fn mappings_by_proto(&self) -> [u32; Proto::COUNT] {
        self.mappings_by_proto
    }

    pub fn is_full(&self) -> bool {
        self.session_count() >= self.max_sessions
    }

    #[inline]
    pub fn hash_in(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> u64 {
        hash::five_tuple(self.seed, proto as u8, addr, port, rem, rport)
    }

    #[inline]
    pub fn hash_out(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> u64 {
        hash::five_tuple(!self.seed, proto as u8, addr, port, rem, rport)
    }

    /// Prefetch, stage one: the index bucket of a session key.
    #[inline]
    pub fn prefetch_bucket(&self, outbound: bool, hash: u64) {
        if outbound { self.sess_in.prefetch(hash) } else { self.sess_out.prefetch(hash) }
    }

    /// Prefetch, stage two: the session the (by now loaded) bucket points at.
    #[inline]
    pub fn prefetch_session(&self, outbound: bool, hash: u64) {
        let index = if outbound { &self.sess_in } else { &self.sess_out };
        if let Some(id) = index.likely(hash) {
            if let Some(s) = self.sessions.get(id as usize) {
                crate::table::prefetch(s);
            }
        }
    }

    /// Session for an outbound packet: (internal endpoint, remote endpoint).
    #[inline]
    pub fn find_session_in(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<u32> {
        let s = &self.sessions;
        self.sess_in.find(self.hash_in(proto, addr, port, rem, rport), |i| {
            let e = &s[i as usize];
            e.int_addr == addr && e.rem_addr == rem && e.int_port == port && e.rem_port == rport && e.proto == proto
        })
    }

    /// Session for an inbound packet: (external endpoint, remote endpoint).
    #[inline]
    pub fn find_session_out(&self, proto: Proto, addr: u32, port: u16, rem: u32, rport: u16) -> Option<u32> {
        let s = &self.sessions;
        self.sess_out.find(self.hash_out(proto, addr, port, rem, rport), |i| {
            let e = &s[i as usize];
            e.ext_addr == addr && e.rem_addr == rem && e.ext_port == port && e.rem_port == rport && e.proto == proto
        })
    }

    pub fn find_mapping_in(&self, proto: Proto, addr: u32, port: u16) -> Option<u32> {
        let m = &self.mappings;
        self.map_in.find(hash::endpoint(self.seed, proto as u8, addr, port), |i| {
            let e = &m[i as usize];
            e.int_addr == addr && e.int_port == port && e.proto == proto
        })
    }

    pub fn find_mapping_out(&self, proto: Proto, addr: u32, port: u16) -> Option<u32> {
        let m = &self.mappings;
        self.map_out.find(hash::endpoint(!self.seed, proto as u8, addr, port), |i| {
            let e = &m[i as usize];
            e.ext_addr == addr && e.ext_port == port && e.proto == proto
        })
    }

    pub fn insert_mapping(&mut self, m: Mapping) -> Result<u32, TableFull> {
        let id = match self.free_mappings.pop() {
            Some(id) => {
                self.mappings[id as usize] = m;
                id
            }
            None => {
                self.mappings.push(m);
                (self.mappings.len() - 1) as u32
            }
        };
        let hin = hash::endpoint(self.seed, m.proto as u8, m.int_addr, m.int_port);
        let hout = hash::endpoint(!self.seed, m.proto as u8, m.ext_addr, m.ext_port);
        if self.map_in.insert(hin, id).is_err() {
            self.free_mappings.push(id);
            return Err(TableFull);
        }
        if self.map_out.insert(hout, id).is_err() {
            self.map_in.remove(hin, id);
            self.free_mappings.push(id);
            return Err(TableFull);
        }
        self.mappings_by_proto[m.proto as usize] += 1;
        Ok(id)
    }

    pub fn remove_mapping(&mut self, id: u32) {
        let m = self.mappings[id as usize];
        self.map_in.remove(hash::endpoint(self.seed, m.proto as u8, m.int_addr, m.int_port), id);
        self.map_out.remove(hash::endpoint(!self.seed, m.proto as u8, m.ext_addr, m.ext_port), id);
        self.free_mappings.push(id);
        self.mappings_by_proto[m.proto as usize] -= 1;
    }

    /// Adds a session to `mapping` for the remote endpoint.
    pub fn insert_session(&mut self, mapping: u32, rem: u32, rport: u16, state: u8, class: TimeoutClass, now_s: u32) -> Result<u32, TableFull> {
        if self.is_full() {
            return Err(TableFull);
        }
        let m = self.mappings[mapping as usize];
        let s = Session {
            int_addr: m.int_addr,
            ext_addr: m.ext_addr,
            rem_addr: rem,
            int_port: m.int_port,
            ext_port: m.ext_port,
            rem_port: rport,
            proto: m.proto,
            state,
            class,
            mapping,
            last_used: now_s,
            lru_prev: NIL,
            lru_next: NIL,
            sib_prev: NIL,
            sib_next: m.first_session,
        };
        let id = match self.free_sessions.pop() {
            Some(id) => {
                self.sessions[id as usize] = s;
                id
            }
            None => {
                self.sessions.push(s);
                (self.sessions.len() - 1) as u32
            }
        };
        let hin = self.hash_in(m.proto, m.int_addr, m.int_port, rem, rport);
        let hout = self.hash_out(m.proto, m.ext_addr, m.ext_port, rem, rport);
        if self.sess_in.insert(hin, id).is_err() {
            self.free_sessions.push(id);
            return Err(TableFull);
        }
        if self.sess_out.insert(hout, id).is_err() {
            self.sess_in.remove(hin, id);
            self.free_sessions.push(id);
            return Err(TableFull);
        }
        if m.first_session != NIL {
            self.sessions[m.first_session as usize].sib_prev = id;
        }
        let mm = &mut self.mappings[mapping as usize];
        mm.first_session = id;
        mm.sessions += 1;
        self.lru_push_tail(id);
        self.sessions_by_proto[m.proto as usize] += 1;
        Ok(id)
    }

    /// Unlinks and frees a session; returns a copy for the caller's bookkeeping.
    pub fn remove_session(&mut self, id: u32) -> Session {
        let s = self.sessions[id as usize];
        self.sess_in.remove(self.hash_in(s.proto, s.int_addr, s.int_port, s.rem_addr, s.rem_port), id);
        self.sess_out.remove(self.hash_out(s.proto, s.ext_addr, s.ext_port, s.rem_addr, s.rem_port), id);
        self.lru_unlink(id);
        if s.sib_prev != NIL {
            self.sessions[s.sib_prev as usize].sib_next = s.sib_next;
        } else {
            self.mappings[s.mapping as usize].first_session = s.sib_next;
        }
        if s.sib_next != NIL {
            self.sessions[s.sib_next as usize].sib_prev = s.sib_prev;
        }
        self.mappings[s.mapping as usize].sessions -= 1;
        self.free_sessions.push(id);
        self.sessions_by_proto[s.proto as usize] -= 1;
        s
    }

    /// Marks a session used now, in its (possibly new) timeout class.
    #[inline]
    pub fn touch(&mut self, id: u32, now_s: u32, class: TimeoutClass) {
        let s = &self.sessions[id as usize];
        if s.last_used == now_s && s.class == class {
            return; // already at the tail of its list for this second
        }
        self.lru_unlink(id);
        let s = &mut self.sessions[id as usize];
        s.last_used = now_s;
        s.class = class;
        self.lru_push_tail(id);
    }

    /// Changes a session's class without refreshing it (inbound packets when
    /// inbound refresh is off still advance TCP state).
    pub fn reclassify(&mut self, id: u32, class: TimeoutClass) {
        if self.sessions[id as usize].class == class {
            return;
        }
        // Appending keeps this O(1); an entry older than its new neighbours can
        // only expire late (never early), as expiry stops at the first live head.
        self.lru_unlink(id);
        self.sessions[id as usize].class = class;
        self.lru_push_tail(id);
    }

    /// The least recently used session of `class`.
    pub fn oldest(&self, class: TimeoutClass) -> Option<u32> {
        let head = self.lru[class as usize].0;
        (head != NIL).then_some(head)
    }

    /// Every live session: each is in exactly one timeout class's LRU list.
    pub fn live_sessions(&self) -> impl Iterator<Item = u32> + '_ {
        TimeoutClass::ALL.into_iter().flat_map(move |class| {
            let mut next = self.lru[class as usize].0;
            std::iter::from_fn(move || {
                let id = next;
                (id != NIL).then(|| {
                    next = self.sessions[id as usize].lru_next;
                    id
                })
            })
        })
    }

    /// Sessions of a mapping.
    pub fn sessions_of(&self, mapping: u32) -> SessionsOf<'_> {
        SessionsOf { tables: self, next: self.mappings[mapping as usize].first_session }
    }

    fn lru_unlink(&mut self, id: u32) {
        let (prev, next, class) = {
            let s = &self.sessions[id as usize];
            (s.lru_prev, s.lru_next, s.class as usize)
        };
        if prev != NIL {
            self.sessions[prev as usize].lru_next = next;
        } else {
            self.lru[class].0 = next;
        }
        if next != NIL {
            self.sessions[next as usize].lru_prev = prev;
        } else {
            self.lru[class].1 = prev;
        }
    }

    fn lru_push_tail(&mut self, id: u32) {
        let class = self.sessions[id as usize].class as usize;
        let tail = self.lru[class].1;
        {
            let s = &mut self.sessions[id as usize];
            s.lru_prev = tail;
            s.lru_next = NIL;
        }
        if tail != NIL {
            self.sessions[tail as usize].lru_next = id;
        } else {
            self.lru[class].0 = id;
        }
        self.lru[class].1 = id;
    }

    /// Bytes of slabs and indices as allocated.
    pub fn memory_bytes(&self) -> usize {
        self.sessions.capacity() * core::mem::size_of::<Session>()
            + self.mappings.capacity() * core::mem::size_of::<Mapping>()
            + self.sess_in.memory_bytes()
            + self.sess_out.memory_bytes()
            + self.map_in.memory_bytes()
            + self.map_out.memory_bytes()
    }
}

pub struct SessionsOf<'a> {
    tables: &'a Tables,
    next: u32,
}

impl Iterator for SessionsOf<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.next == NIL {
            return None;
        }
        let id = self.next;
        self.next = self.tables.sessions[id as usize].sib_next;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(int_port: u16, ext_port: u16) -> Mapping {
        Mapping {
            int_addr: 0x6440_000a,
            ext_addr: 0xcb00_7101,
            int_port,
            ext_port,
            proto: Proto::Udp,
            flags: 0,
            subscriber: 0,
            ext_index: 0,
            first_session: NIL,
            sessions: 0,
        }
    }

    #[test]
    fn session_is_48_bytes() {
        assert_eq!(core::mem::size_of::<Session>(), 48);
    }

    #[test]
    fn both_directions_find_the_same_session() {
        let mut t = Tables::new(16, 0, 7);
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        let s = t.insert_session(m, 0xc633_6435, 53, 0, TimeoutClass::Udp, 1).unwrap();
        assert_eq!(t.find_session_in(Proto::Udp, 0x6440_000a, 4000, 0xc633_6435, 53), Some(s));
        assert_eq!(t.find_session_out(Proto::Udp, 0xcb00_7101, 5000, 0xc633_6435, 53), Some(s));
        assert_eq!(t.find_session_out(Proto::Tcp, 0xcb00_7101, 5000, 0xc633_6435, 53), None);
        assert_eq!(t.find_mapping_out(Proto::Udp, 0xcb00_7101, 5000), Some(m));
        t.remove_session(s);
        assert_eq!(t.find_session_in(Proto::Udp, 0x6440_000a, 4000, 0xc633_6435, 53), None);
        assert_eq!(t.mappings[m as usize].sessions, 0);
    }

    #[test]
    fn lru_keeps_oldest_at_head_and_siblings_unlink() {
        let mut t = Tables::new(16, 0, 7);
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        let a = t.insert_session(m, 1, 1, 0, TimeoutClass::Udp, 1).unwrap();
        let b = t.insert_session(m, 2, 2, 0, TimeoutClass::Udp, 2).unwrap();
        let c = t.insert_session(m, 3, 3, 0, TimeoutClass::Udp, 3).unwrap();
        assert_eq!(t.oldest(TimeoutClass::Udp), Some(a));
        t.touch(a, 4, TimeoutClass::Udp);
        assert_eq!(t.oldest(TimeoutClass::Udp), Some(b));
        t.remove_session(b);
        let mut sibs: Vec<u32> = t.sessions_of(m).collect();
        sibs.sort_unstable();
        assert_eq!(sibs, vec![a, c]);
        assert_eq!(t.oldest(TimeoutClass::Udp), Some(c));
    }

    #[test]
    fn full_table_refuses() {
        let mut t = Tables::new(2, 0, 7);
        let m = t.insert_mapping(mapping(4000, 5000)).unwrap();
        t.insert_session(m, 1, 1, 0, TimeoutClass::Udp, 1).unwrap();
        t.insert_session(m, 2, 1, 0, TimeoutClass::Udp, 1).unwrap();
        assert!(t.insert_session(m, 3, 1, 0, TimeoutClass::Udp, 1).is_err());
    }
}
