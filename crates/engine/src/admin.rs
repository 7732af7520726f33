//! What an operator does to a running engine: look at its state, clear one
//! subscriber's state, and apply a reloaded configuration. None of this is
//! on the per-packet path; the dataplane calls it between batches.

use crate::config::EngineConfig;
use std::net::Ipv4Addr;

use crate::error::EngineError;
use crate::nat44::Nat44;
use crate::state::events::Event;
use crate::state::sessions::mapping_flags;
use crate::trackers::TimeoutClass;
use crate::Proto;

/// One session as an operator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionView {
    pub proto: Proto,
    /// The subscriber's address: for a DS-Lite host, its address inside the softwire.
    pub int_addr: u32,
    /// A DS-Lite host's B4 (RFC 6333).
    pub b4: Option<std::net::Ipv6Addr>,
    /// That B4's own counters.
    pub softwire: Option<SoftwireView>,
    pub int_port: u16,
    pub ext_addr: u32,
    pub ext_port: u16,
    pub rem_addr: u32,
    pub rem_port: u16,
    pub established: bool,
    /// Seconds since the session last carried a packet that refreshes it.
    pub idle_s: u32,
    /// Seconds of idleness after which it expires.
    pub timeout_s: u32,
}

/// One mapping (BIB entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingView {
    pub proto: Proto,
    /// The subscriber's address: for a DS-Lite host, its address inside the softwire.
    pub int_addr: u32,
    /// A DS-Lite host's B4 (RFC 6333).
    pub b4: Option<std::net::Ipv6Addr>,
    /// That B4's own counters.
    pub softwire: Option<SoftwireView>,
    pub int_port: u16,
    pub ext_addr: u32,
    pub ext_port: u16,
    pub sessions: u32,
    pub is_static: bool,
}

/// A DS-Lite B4's counters (`dslite::SoftwireCounters`) and its current
/// sessions (all its hosts'), as rows of its hosts carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftwireView {
    pub counters: crate::dslite::SoftwireCounters,
    pub sessions: u32,
}

/// A listing of sessions or mappings (`walk_sessions`, `walk_mappings`)
/// made a part at a time, so that a worker making it for `natrix show`
/// forwards between parts: a table of millions read in one go held a
/// worker far longer than its receive rings last. Not a snapshot: what
/// is made or ended while it walks may or may not be in it. At most
/// `limit` rows.
#[derive(Debug)]
pub struct Walk<T> {
    subscriber: Option<u32>,
    /// Only the rows of DS-Lite hosts behind this B4.
    b4: Option<std::net::Ipv6Addr>,
    /// The next mapping record to look at, then the next SCTP association.
    next: u32,
    next_association: u32,
    limit: usize,
    pub rows: Vec<T>,
}

impl<T> Walk<T> {
    pub fn new(subscriber: Option<u32>, limit: usize) -> Walk<T> {
        Walk { subscriber, b4: None, next: 0, next_association: 0, limit, rows: Vec::new() }
    }

    /// Only the rows of the hosts behind `b4`.
    pub fn behind(mut self, b4: Option<std::net::Ipv6Addr>) -> Walk<T> {
        self.b4 = b4;
        self
    }

    /// Adds a row; false when the walk has its limit.
    fn take(&mut self, row: T) -> bool {
        if self.rows.len() >= self.limit {
            return false;
        }
        self.rows.push(row);
        true
    }
}

/// What `clear_subscriber` removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cleared {
    pub sessions: u64,
    pub mappings: u64,
}

impl Nat44 {
    /// An internal address as an operator knows it: itself, or a DS-Lite
    /// host's inner address, B4 and the B4's counters for its stand-in.
    fn shown(&self, int_addr: u32) -> (u32, Option<std::net::Ipv6Addr>, Option<SoftwireView>) {
        match self.subs.identities().resolve(int_addr) {
            crate::state::identity::Identity::Softwire { b4, inner } => (inner, Some(b4), self.softwire_view(int_addr)),
            crate::state::identity::Identity::Ipv4(a) => (a, None, None),
        }
    }

    fn softwire_view(&self, int_addr: u32) -> Option<SoftwireView> {
        let counters = self.subs.identities().counters_of(int_addr)?;
        let sessions = self.subs.find(int_addr).map_or(0, |s| self.subs.get(s).sessions);
        Some(SoftwireView { counters, sessions })
    }

    /// Live sessions, optionally of one subscriber.
    pub fn session_views(&self, subscriber: Option<u32>) -> Vec<SessionView> {
        let mut w = Walk::new(subscriber, usize::MAX);
        while !self.walk_sessions(&mut w, u32::MAX) {}
        w.rows
    }

    /// Adds to `w` the sessions of more mapping records, until about
    /// `budget` records and sessions have been looked at (a whole
    /// mapping's sessions at a time), then, at the table's end, the SCTP
    /// associations; true once it is done (or has its `limit` of rows).
    pub fn walk_sessions(&self, w: &mut Walk<SessionView>, budget: u32) -> bool {
        let rows = |nat: &Self, m: u32, w: &mut Walk<SessionView>| {
            let mut looked = 0;
            for id in nat.tables.sessions_of(m) {
                looked += 1;
                if !w.take(nat.session_view(nat.tables.session(id))) {
                    return None;
                }
            }
            Some(looked)
        };
        let Some(spent) = self.walk_records(w, budget, rows) else { return true };
        self.walk_associations(w, spent, budget, |(session, _)| session)
    }

    /// The mapping records' part of a walk: hands `rows` each live mapping
    /// `w` asks for, among about `budget` records and the sessions `rows`
    /// says it looked at; what was spent, or None once `w` has its limit.
    fn walk_records<T>(&self, w: &mut Walk<T>, budget: u32, rows: impl Fn(&Self, u32, &mut Walk<T>) -> Option<u32>) -> Option<u32> {
        let (end, mut spent) = (self.tables.record_slots(), 0u32);
        while w.next < end && spent < budget {
            let m = w.next;
            w.next += 1;
            spent += 1;
            if self.wanted(w, m) {
                spent = spent.saturating_add(rows(self, m, w)?);
            }
        }
        Some(spent)
    }

    /// Whether mapping record `m` is live and `w` asks for its rows: its
    /// subscriber's, or those of a host behind its B4.
    fn wanted<T>(&self, w: &Walk<T>, m: u32) -> bool {
        self.tables.is_live_mapping(m) && self.asks_for(w, self.tables.mapping(m).int_addr)
    }

    /// Whether `w` asks for the rows of internal address `int_addr`.
    fn asks_for<T>(&self, w: &Walk<T>, int_addr: u32) -> bool {
        w.subscriber.is_none_or(|a| a == int_addr)
            && w.b4.is_none_or(|b4| matches!(self.subs.identities().resolve(int_addr), crate::state::identity::Identity::Softwire { b4: b, .. } if b == b4))
    }

    /// Past the mapping records, adds the SCTP associations `w` asks for
    /// (each one session and one mapping, `row` picks which), within what
    /// is left of `budget`; true once done.
    fn walk_associations<T>(&self, w: &mut Walk<T>, mut spent: u32, budget: u32, row: impl Fn((SessionView, MappingView)) -> T) -> bool {
        if w.next < self.tables.record_slots() {
            return false;
        }
        let end = self.assocs.record_slots();
        while w.next_association < end && spent < budget {
            let id = w.next_association;
            w.next_association += 1;
            spent += 1;
            if !self.assocs.is_live(id) {
                continue;
            }
            let a = self.assocs.get(id);
            if !self.asks_for(w, a.int_addr) {
                continue;
            }
            if !w.take(row(self.association_view(&a))) {
                return true;
            }
        }
        w.next_association >= end
    }

    fn session_view(&self, s: crate::state::sessions::Session) -> SessionView {
        let (int_addr, b4, softwire) = self.shown(s.int_addr);
        SessionView {
            proto: s.proto,
            int_addr,
            b4,
            softwire,
            int_port: s.int_port,
            ext_addr: s.ext_addr,
            ext_port: s.ext_port,
            rem_addr: s.rem_addr,
            rem_port: s.rem_port,
            established: s.class == TimeoutClass::TcpEstablished,
            idle_s: self.now_s.saturating_sub(s.last_used),
            timeout_s: self.timeout_of(s.class),
        }
    }

    /// An SCTP association as a session and as a mapping: it is one of
    /// each, its port its own.
    fn association_view(&self, a: &crate::state::associations::Association) -> (SessionView, MappingView) {
        let (int_addr, b4, softwire) = self.shown(a.int_addr);
        let session = SessionView {
            proto: Proto::Sctp,
            int_addr,
            b4,
            softwire,
            int_port: a.int_port,
            ext_addr: a.ext_addr,
            ext_port: a.int_port,
            rem_addr: a.rem_addr,
            rem_port: a.rem_port,
            established: crate::trackers::sctp::is_established(a.state),
            idle_s: self.now_s.saturating_sub(a.last_used),
            timeout_s: self.timeout_of(a.class),
        };
        let mapping = MappingView { proto: Proto::Sctp, int_addr, b4, softwire, int_port: a.int_port, ext_addr: a.ext_addr, ext_port: a.int_port, sessions: 1, is_static: false };
        (session, mapping)
    }

    /// Live mappings, optionally of one subscriber.
    pub fn mapping_views(&self, subscriber: Option<u32>) -> Vec<MappingView> {
        let mut w = Walk::new(subscriber, usize::MAX);
        while !self.walk_mappings(&mut w, u32::MAX) {}
        w.rows
    }

    /// `walk_sessions` for mappings.
    pub fn walk_mappings(&self, w: &mut Walk<MappingView>, budget: u32) -> bool {
        let rows = |nat: &Self, m: u32, w: &mut Walk<MappingView>| {
            let sessions = nat.tables.sessions_of(m).count() as u32;
            w.take(nat.mapping_view(m, sessions)).then_some(sessions)
        };
        let Some(spent) = self.walk_records(w, budget, rows) else { return true };
        self.walk_associations(w, spent, budget, |(_, mapping)| mapping)
    }

    fn mapping_view(&self, id: u32, sessions: u32) -> MappingView {
        let m = self.tables.mapping(id);
        let (int_addr, b4, softwire) = self.shown(m.int_addr);
        MappingView {
            proto: m.proto,
            int_addr,
            b4,
            softwire,
            int_port: m.int_port,
            ext_addr: m.ext_addr,
            ext_port: m.ext_port,
            sessions,
            is_static: m.flags & mapping_flags::STATIC != 0,
        }
    }

    /// Removes every session of a subscriber, and with them its dynamic
    /// mappings (logged, and their ports held down as usual); static
    /// mappings stay, being configuration.
    pub fn clear_subscriber(&mut self, addr: u32, sink: &mut dyn FnMut(Event)) -> Cleared {
        let mut w = Walk::new(Some(addr), usize::MAX);
        while !self.walk_subscriber_mappings(&mut w, u32::MAX) {}
        self.clear_mappings(addr, &w.rows, sink)
    }

    /// Adds to `w` the ids of its subscriber's mappings among about
    /// `budget` more mapping records: `clear_subscriber` a part at a time,
    /// as the listings are made. True once at the table's end.
    pub fn walk_subscriber_mappings(&self, w: &mut Walk<u32>, budget: u32) -> bool {
        self.walk_records(w, budget, |_, m, w| w.take(m).then_some(0));
        w.next >= self.tables.record_slots()
    }

    /// Removes the sessions of the mappings `ids` found for subscriber
    /// `addr` (those of them still its own: a walk's may have ended since)
    /// and its SCTP associations, as `clear_subscriber` does.
    pub fn clear_mappings(&mut self, addr: u32, ids: &[u32], sink: &mut dyn FnMut(Event)) -> Cleared {
        let before = self.tables.mapping_count();
        let mut sessions: Vec<u32> =
            ids.iter().filter(|&&m| self.tables.is_live_mapping(m) && self.tables.mapping(m).int_addr == addr).flat_map(|&m| self.tables.sessions_of(m)).collect();
        self.delete_sessions_logged(&mut sessions, sink);
        let assocs = self.end_associations_where(|a| a.int_addr == addr, sink);
        Cleared { sessions: sessions.len() as u64 + assocs, mappings: (before - self.tables.mapping_count()) as u64 + assocs }
    }

    /// Deletes `ids`, handing `sink` the events queued before and those
    /// the deletions make, a chunk at a time: an operator's bulk deletion
    /// (a whole table at a stop) makes more events than the queue holds
    /// between drains, and each is a log record `whois` needs.
    fn delete_sessions_logged(&mut self, ids: &mut [u32], sink: &mut dyn FnMut(Event)) {
        self.drain_events_resolved(&mut *sink);
        // In the order `delete_sessions` keeps: extras before own sessions.
        ids.sort_unstable_by(|a, b| b.cmp(a));
        for chunk in ids.chunks_mut(self.bulk_chunk()) {
            self.delete_sessions(chunk);
            self.drain_events_resolved(&mut *sink);
        }
    }

    /// Sessions (or associations) one chunk of a bulk deletion ends: each
    /// makes at most three events (its session, its mapping, a port
    /// block), and the chunk's must fit the queue's bound.
    fn bulk_chunk(&self) -> usize {
        (self.event_capacity() / 3).max(1)
    }

    /// Ends (and logs, through `sink`) the SCTP associations `which` picks;
    /// returns how many.
    fn end_associations_where(&mut self, which: impl Fn(&crate::state::associations::Association) -> bool, sink: &mut dyn FnMut(Event)) -> u64 {
        let ids: Vec<u32> = self.assocs.live_ids().filter(|&id| which(&self.assocs.get(id))).collect();
        self.drain_events_resolved(&mut *sink);
        for chunk in ids.chunks(self.bulk_chunk()) {
            for &id in chunk {
                self.end_association(id);
            }
            self.drain_events_resolved(&mut *sink);
        }
        ids.len() as u64
    }

    /// Ends every dynamic mapping, logging each deletion through `sink`, as
    /// natrix stops: a log that ends with open mappings would make `whois`
    /// name their subscribers for ports that someone else may hold after a
    /// restart.
    pub fn release_all(&mut self, sink: &mut dyn FnMut(Event)) -> Cleared {
        let before = self.tables.mapping_count();
        let mut ids: Vec<u32> = self.tables.live_sessions().collect();
        self.delete_sessions_logged(&mut ids, sink);
        let assocs = self.end_associations_where(|_| true, sink);
        Cleared { sessions: ids.len() as u64 + assocs, mappings: (before - self.tables.mapping_count()) as u64 + assocs }
    }

    /// Applies a reloaded configuration: policy (timeouts, limits,
    /// filtering, logging, ICMP answers) at once; pool addresses added are
    /// used from now on, and those removed lose their mappings (logged).
    /// Keys that size or partition state need a restart and are refused,
    /// leaving the engine as it was. The deletions' events go to `sink`.
    pub fn reconfigure(&mut self, mut new: EngineConfig, sink: &mut dyn FnMut(Event)) -> Result<(), EngineError> {
        new.shard = self.cfg.shard;
        new.seed = self.cfg.seed;
        if let Some(key) = crate::config::restart_key_changed(&self.cfg, &new) {
            return Err(EngineError::NeedsRestart { key });
        }
        let removed: Vec<u32> = self.cfg.pool.iter().copied().filter(|a| !new.pool.contains(a)).collect();
        for &addr in &removed {
            self.delete_mappings_on(addr, sink);
            self.pool.retire_address(addr);
        }
        for &addr in new.pool.iter().filter(|a| !self.cfg.pool.contains(a)) {
            self.pool.add_address(addr);
        }
        self.pool.set_policy(new.port_selection, new.port_parity, new.hold_down_s);
        self.tables.set_timeouts(new.timeouts.by_class());
        self.assocs.set_timeouts(new.timeouts.by_class());
        self.frags.set_limits(new.max_held_fragments as usize, new.max_held_fragment_bytes as usize, new.timeouts.fragment_ns, self.now_ns);
        self.subs.identities_mut().limit_endpoints_per_b4(new.max_ports_per_subscriber);
        self.cfg = new;
        Ok(())
    }

    fn delete_mappings_on(&mut self, ext_addr: u32, sink: &mut dyn FnMut(Event)) {
        if let Some(st) = self.cfg.statics.iter().find(|st| st.ext_addr == ext_addr) {
            // Validation keeps statics on pool addresses; this is a safety net.
            debug_assert!(false, "static mapping on removed pool address {}", Ipv4Addr::from(st.ext_addr));
        }
        let mut ids: Vec<u32> = self.tables.live_sessions().filter(|&id| self.tables.session(id).ext_addr == ext_addr).collect();
        self.delete_sessions_logged(&mut ids, sink);
        self.end_associations_where(|a| a.ext_addr == ext_addr, sink);
    }
}
