//! What the PCP server may do to NAPT44's state, and nothing more: PCP
//! mappings are made, held and ended through these operations, so they are
//! ordinary mappings (same allocator, quotas, logging, hold-down).

use crate::config::{prefix_contains, PortSelection};
use crate::drop::DropReason;
use crate::nat44::Nat44;
use crate::state::events::EventKind;
use crate::state::sessions::{mapping_flags, Mapping, Session};
use crate::state::subscribers::NONE;
use crate::trackers::{tcp, Direction, TimeoutClass};
use crate::Proto;

/// A remote peer a PCP MAP mapping accepts (FILTER option, RFC 6887
/// section 13.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FilterRule {
    pub addr: u32,
    pub prefix_len: u8,
    /// 0: any port.
    pub port: u16,
}

impl FilterRule {
    pub fn matches(&self, addr: u32, port: u16) -> bool {
        prefix_contains(self.addr, self.prefix_len, addr) && (self.port == 0 || self.port == port)
    }
}

/// NAT operations the PCP server works through.
pub(crate) trait NatOps {
    fn now_s(&self) -> u32;
    fn find_mapping(&self, proto: Proto, int: u32, iport: u16) -> Option<u32>;
    fn mapping(&self, mid: u32) -> Mapping;
    fn find_session(&self, proto: Proto, int: u32, iport: u16, rem: u32, rport: u16) -> Option<u32>;
    fn session(&self, sid: u32) -> Session;
    /// The shortest idle timeout of any session class.
    fn shortest_timeout(&self) -> u32;
    fn is_deterministic(&self) -> bool;
    /// Keeps a session alive as if it had just carried a packet.
    fn touch(&mut self, sid: u32);
    /// A new mapping for an internal endpoint, as traffic would get it.
    fn create_mapping(&mut self, proto: Proto, int: u32, iport: u16) -> Result<u32, DropReason>;
    /// A new mapping whose external port is `want` if the allocator can give it.
    fn create_mapping_at(&mut self, proto: Proto, int: u32, iport: u16, want: u16) -> Result<u32, DropReason>;
    fn create_session(&mut self, mid: u32, rem: u32, rport: u16) -> Result<u32, DropReason>;
    /// The keep-alive session of a held mapping (remote 0.0.0.0:0).
    fn keepalive(&mut self, mid: u32) -> Result<u32, DropReason>;
    /// Ends a keep-alive session: its mapping goes too unless traffic sessions remain.
    fn release_keepalive(&mut self, sid: u32);
    /// Removes a mapping just made, as if it never was: no hold-down, not counted.
    fn undo_mapping(&mut self, mid: u32);
    /// A subscriber holding nothing yet starts on pool address `addr` if it is one.
    fn suggest_address(&mut self, int: u32, addr: u32);
    /// Who may use a held mapping: Some(rules) (empty: anyone), None: no longer held.
    fn set_filters(&mut self, proto: Proto, int: u32, iport: u16, rules: Option<Vec<FilterRule>>);
    /// Where the NAT event queue stands, to undo a request's events from there.
    fn events_mark(&self) -> usize;
    /// Drops the mapping and block records logged since `mark`.
    fn discard_mapping_events_since(&mut self, mark: usize);
}

impl NatOps for Nat44 {
    fn now_s(&self) -> u32 {
        self.now_s
    }

    fn find_mapping(&self, proto: Proto, int: u32, iport: u16) -> Option<u32> {
        self.tables.find_mapping_in(proto, int, iport)
    }

    fn mapping(&self, mid: u32) -> Mapping {
        self.tables.mapping(mid)
    }

    fn find_session(&self, proto: Proto, int: u32, iport: u16, rem: u32, rport: u16) -> Option<u32> {
        self.tables.find_session_in(proto, int, iport, rem, rport)
    }

    fn session(&self, sid: u32) -> Session {
        self.tables.session(sid)
    }

    fn shortest_timeout(&self) -> u32 {
        TimeoutClass::NAPT.into_iter().map(|c| self.timeout_of(c)).min().unwrap_or(1)
    }

    fn is_deterministic(&self) -> bool {
        self.det.is_some()
    }

    fn touch(&mut self, sid: u32) {
        let class = self.tables.session(sid).class;
        self.tables.touch(sid, self.now_s, class);
    }

    fn create_mapping(&mut self, proto: Proto, int: u32, iport: u16) -> Result<u32, DropReason> {
        let hash_in = self.tables.hash_in(proto, int, iport);
        Nat44::create_mapping(self, proto, int, iport, NONE, hash_in).map(|(mid, _)| mid)
    }

    /// The allocator's hint is the internal port, so the mapping is made as
    /// if for internal port `want`, with the allocator in port-preserving
    /// mode, and then re-keyed to `iport`; the events it logged are
    /// corrected to match.
    fn create_mapping_at(&mut self, proto: Proto, int: u32, iport: u16, want: u16) -> Result<u32, DropReason> {
        let mark = self.events.len();
        let (sel, parity, hold) = (self.cfg.port_selection, self.cfg.port_parity, self.cfg.hold_down_s);
        if sel != PortSelection::Preserve {
            self.pool.set_policy(PortSelection::Preserve, parity, hold);
        }
        let made = NatOps::create_mapping(self, proto, int, want);
        if sel != PortSelection::Preserve {
            self.pool.set_policy(sel, parity, hold);
        }
        self.events.since_mut(mark).filter(|e| e.int_addr == int && e.int_port == want && e.proto == proto).for_each(|e| e.int_port = iport);
        let mid = made?;
        let mut mp = self.tables.mapping(mid);
        self.tables.remove_mapping(mid);
        mp.int_port = iport;
        // Cannot fail: the slot was just freed in both indices.
        self.tables.insert_mapping(mp).map_err(|_| DropReason::SessionTableFull)
    }

    fn create_session(&mut self, mid: u32, rem: u32, rport: u16) -> Result<u32, DropReason> {
        Nat44::create_session(self, mid, rem, rport, Direction::Out, 0)
    }

    fn keepalive(&mut self, mid: u32) -> Result<u32, DropReason> {
        let m = self.tables.mapping(mid);
        if let Some(sid) = self.tables.find_session_in(m.proto, m.int_addr, m.int_port, 0, 0) {
            return Ok(sid);
        }
        let sub = self.subscriber_of(m.int_addr).ok_or(DropReason::SubscriberTableFull)?;
        if self.subs.get(sub).sessions >= self.cfg.max_sessions_per_subscriber {
            return Err(DropReason::SessionQuota);
        }
        if self.mapping_is_full(mid) {
            return Err(DropReason::MappingSessionQuota);
        }
        // A TCP hold is an established connection to the tracker, so its
        // class is the one its state gives, as for every other session.
        let (state, class) = match m.proto {
            Proto::Tcp => (tcp::SYN_OUT | tcp::SYN_IN, TimeoutClass::TcpEstablished),
            _ => (0, TimeoutClass::Udp),
        };
        let sid = self.tables.insert_session(mid, 0, 0, state, class, self.now_s).map_err(|_| DropReason::SessionTableFull)?;
        self.subs.get_mut(sub).sessions += 1;
        Ok(sid)
    }

    fn release_keepalive(&mut self, sid: u32) {
        let s = self.tables.remove_session(sid);
        let sub = self.subscriber_of(s.int_addr);
        if let Some(sub) = sub {
            self.subs.get_mut(sub).sessions -= 1;
        }
        if !self.tables.has_sessions(s.mapping) && self.tables.mapping(s.mapping).flags & mapping_flags::STATIC == 0 {
            self.delete_mapping(s.mapping, false);
        } else if let Some(sub) = sub {
            self.subs.release_if_idle(sub);
        }
    }

    fn undo_mapping(&mut self, mid: u32) {
        self.delete_mapping(mid, true);
        self.counters.mappings_created = self.counters.mappings_created.saturating_sub(1);
    }

    fn suggest_address(&mut self, int: u32, addr: u32) {
        let Some(idx) = self.pool.index_of(addr) else { return };
        if let Some(sub) = self.subs.find_or_create(int) {
            let s = self.subs.get_mut(sub);
            if s.mappings == 0 && s.blocks.is_empty() {
                s.paired = idx;
            }
        }
    }

    fn set_filters(&mut self, proto: Proto, int: u32, iport: u16, rules: Option<Vec<FilterRule>>) {
        match rules {
            Some(r) => self.pcp_filters.insert((proto, int, iport), r),
            None => self.pcp_filters.remove(&(proto, int, iport)),
        };
    }

    fn events_mark(&self) -> usize {
        self.events.len()
    }

    fn discard_mapping_events_since(&mut self, mark: usize) {
        self.events.retain_since(mark, |e| !matches!(e.kind, EventKind::MappingCreated | EventKind::MappingDeleted | EventKind::BlockAllocated | EventKind::BlockReleased));
    }
}

impl Nat44 {
    /// Whether PCP decides who may use mapping `mid`: Some(verdict) for a
    /// mapping PCP holds (endpoint-independent unless it carries FILTER
    /// options), None otherwise.
    pub(super) fn pcp_filter_allows(&self, mid: u32, rem: u32, rport: u16) -> Option<bool> {
        if self.pcp_filters.is_empty() {
            return None;
        }
        let m = self.tables.mapping(mid);
        let rules = self.pcp_filters.get(&(m.proto, m.int_addr, m.int_port))?;
        // A hold whose keep-alive is gone (cleared by the operator) decides nothing.
        self.tables.find_session_in(m.proto, m.int_addr, m.int_port, 0, 0)?;
        Some(rules.is_empty() || rules.iter().any(|f| f.matches(rem, rport)))
    }
}
