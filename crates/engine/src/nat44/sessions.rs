//! Making and ending mappings and sessions: the quotas, the port
//! allocation (paired pooling, parity, port blocks, deterministic ranges),
//! the tracker run on every packet, and the NAT events each step logs.

use crate::config::check_statics;
use crate::drop::DropReason;
use crate::error::EngineError;
use crate::nat44::Nat44;
use crate::state::events::EventKind;
use crate::state::hash;
use crate::state::pool::AllocError;
use crate::state::sessions::{mapping_flags, Endpoints, Mapping};
use crate::state::shard;
use crate::state::subscribers::NONE;
use crate::trackers::{self, Direction};
use crate::Proto;

impl Nat44 {
    pub(super) fn install_statics(&mut self) -> Result<(), EngineError> {
        check_statics(&self.cfg.statics, &self.cfg.pool, self.cfg.ports)
            .map_err(|p| EngineError::Config { key: format!("nat.static[{}].{}", p.index, p.endpoint), problem: p.problem })?;
        let refuse = |problem: String| EngineError::Config { key: "nat.static".into(), problem };
        for st in self.cfg.statics.clone() {
            // `check_statics` holds each to a pool address and a free port.
            let Some(ext_index) = self.pool.index_of(st.ext_addr) else { continue };
            let reserved = self.pool.reserve(ext_index, st.proto, st.ext_port);
            debug_assert!(reserved, "a checked static mapping's port is free");
            // Every worker keeps the port out of its allocator; only the
            // subscriber's own worker holds the mapping.
            if shard::worker_of_subscriber(st.int_addr, self.cfg.shard.count) != self.cfg.shard.index {
                continue;
            }
            let sub = self.subs.find_or_create(st.int_addr).ok_or_else(|| refuse("more static subscribers than nat.max_subscribers".into()))?;
            let m = Mapping { int_addr: st.int_addr, ext_addr: st.ext_addr, int_port: st.int_port, ext_port: st.ext_port, proto: st.proto, flags: mapping_flags::STATIC };
            self.tables.insert_mapping(m).map_err(|_| refuse("the mapping table is full".into()))?;
            let s = self.subs.get_mut(sub);
            s.mappings += 1;
            if s.paired == NONE {
                s.paired = ext_index;
            }
        }
        Ok(())
    }

    /// Runs a packet of session `id` through its protocol's tracker and
    /// refreshes it; returns its endpoints for the rewrite.
    #[inline]
    pub(crate) fn track(&mut self, id: u32, dir: Direction, tcp_flags: u8, refresh: bool) -> Endpoints {
        self.tables.on_packet(id, self.now_s, refresh, |proto, state, class| trackers::on_packet(proto, state, class, dir, tcp_flags))
    }

    /// Makes a mapping for an internal endpoint, whose hash is `hash_in` and
    /// whose subscriber may be `sub_hint` (checked; NONE: unknown); returns
    /// it and its subscriber.
    #[inline(always)]
    pub(super) fn create_mapping(&mut self, proto: Proto, int: u32, iport: u16, sub_hint: u32, hash_in: u64) -> Result<(u32, u32), DropReason> {
        if self.det.is_some() && self.det_assignment(int).is_none() {
            return Err(DropReason::NotSubscriber);
        }
        let sub = self.subs.find_or_create_hinted(int, sub_hint).ok_or(DropReason::SubscriberTableFull)?;
        let result = self.allocate_for(sub, proto, int, iport, hash_in);
        if result.is_err() {
            self.subs.release_if_idle(sub);
        }
        result.map(|mid| (mid, sub))
    }

    #[inline(always)]
    pub(super) fn allocate_for(&mut self, sub: u32, proto: Proto, int: u32, iport: u16, hash_in: u64) -> Result<u32, DropReason> {
        let cfg_ports = self.cfg.max_ports_per_subscriber;
        let per_proto = self.cfg.max_ports_per_protocol[proto as usize];
        let s = self.subs.get(sub);
        if s.ports_total() >= cfg_ports || s.ports[proto as usize] >= per_proto {
            self.event(EventKind::QuotaExceeded, proto, int, iport, 0, 0, 0, 0, 0);
            return Err(DropReason::PortQuota);
        }
        let (now_s, rate) = (self.now_s, self.cfg.max_new_mappings_per_second);
        if !self.subs.get_mut(sub).admit_new_mapping(now_s, rate) {
            return Err(DropReason::RateLimited);
        }
        let mut paired = self.subs.get(sub).paired;
        let det_range = self.det_assignment(int);
        if let Some(a) = det_range {
            paired = self.pool.index_of(a.ext_addr).ok_or(DropReason::PoolExhausted)?;
            self.subs.get_mut(sub).paired = paired;
        } else if paired == NONE {
            match self.pool.choose_address(hash::address(self.cfg.seed, int), proto) {
                Some(a) => paired = a,
                None => {
                    self.event(EventKind::AddressesExhausted, proto, int, iport, 0, 0, 0, 0, 0);
                    return Err(DropReason::PoolExhausted);
                }
            }
            self.subs.get_mut(sub).paired = paired;
        }
        let (port, block) = if let Some(a) = det_range {
            (self.pool.alloc_port_in(paired, proto, iport, (a.first, a.last), &mut self.rng), None)
        } else if self.cfg.port_block_size == 0 {
            (self.pool.alloc_port(paired, proto, iport, &mut self.rng), None)
        } else {
            let max_blocks = (cfg_ports.min(per_proto) as usize).div_ceil(usize::from(self.cfg.port_block_size)).max(1);
            let mut blocks = std::mem::take(&mut self.subs.get_mut(sub).blocks);
            let r = self.pool.alloc_in_blocks(paired, proto, iport, sub, &mut blocks, max_blocks, &mut self.rng);
            self.subs.get_mut(sub).blocks = blocks;
            match r {
                Ok((p, b)) => (Ok(p), b),
                Err(e) => (Err(e), None),
            }
        };
        let ext_addr = self.pool.address(paired);
        let port = match port {
            Ok(p) => p,
            Err(AllocError::Exhausted) if det_range.is_none() => {
                self.event(EventKind::PortsExhausted, proto, int, iport, ext_addr, 0, 0, 0, 0);
                return Err(DropReason::PoolExhausted);
            }
            // Out of blocks, or a full deterministic range: the subscriber's whole allowance.
            Err(_) => {
                self.event(EventKind::QuotaExceeded, proto, int, iport, ext_addr, 0, 0, 0, 0);
                return Err(DropReason::PortQuota);
            }
        };
        if let Some(b) = block {
            self.event(EventKind::BlockAllocated, proto, int, 0, b.addr, b.first, b.last, 0, 0);
        }
        let m = Mapping { int_addr: int, ext_addr, int_port: iport, ext_port: port, proto, flags: 0 };
        let mid = match self.tables.insert_mapping_hashed(m, hash_in) {
            Ok(id) => id,
            Err(_) => {
                let mut blocks = std::mem::take(&mut self.subs.get_mut(sub).blocks);
                self.pool.release(paired, proto, port, self.now_s, true, &mut blocks);
                self.subs.get_mut(sub).blocks = blocks;
                return Err(DropReason::SessionTableFull);
            }
        };
        self.subs.identities_mut().hold(int);
        let s = self.subs.get_mut(sub);
        s.ports[proto as usize] += 1;
        s.mappings += 1;
        self.counters.mappings_created += 1;
        self.note_peak_mappings();
        self.counters.peak_ports_in_use = self.counters.peak_ports_in_use.max(self.pool.ports_in_use());
        self.event(EventKind::MappingCreated, proto, int, iport, ext_addr, port, port, 0, 0);
        Ok(mid)
    }

    pub(super) fn create_session(&mut self, mid: u32, rem: u32, rport: u16, dir: Direction, tcp_flags: u8) -> Result<u32, DropReason> {
        let sub = self.subscriber_of(self.tables.mapping(mid).int_addr).ok_or(DropReason::SubscriberTableFull)?;
        if self.mapping_is_full(mid) {
            return Err(DropReason::MappingSessionQuota);
        }
        self.create_session_of(sub, mid, rem, rport, dir, tcp_flags)
    }

    /// Whether mapping `mid` holds `max_sessions_per_mapping` sessions
    /// already (RFC 6888 REQ-5): with endpoint-independent filtering any
    /// remote makes a session through a mapping it knows, and without
    /// this limit remotes could spend the subscriber's whole session
    /// quota through one mapping. A static mapping (a port forward, open
    /// to every remote by design) has the subscriber's limit alone.
    pub(super) fn mapping_is_full(&self, mid: u32) -> bool {
        let limit = self.cfg.max_sessions_per_mapping as usize;
        limit != 0 && self.tables.mapping(mid).flags & mapping_flags::STATIC == 0 && self.tables.session_count_of(mid) >= limit
    }

    /// `create_session` for a mapping whose subscriber the caller has at hand.
    #[inline(always)]
    pub(super) fn create_session_of(&mut self, sub: u32, mid: u32, rem: u32, rport: u16, dir: Direction, tcp_flags: u8) -> Result<u32, DropReason> {
        let m = self.tables.mapping(mid);
        if self.subs.get(sub).sessions >= self.cfg.max_sessions_per_subscriber {
            return Err(DropReason::SessionQuota);
        }
        let (state, class) = trackers::open(m.proto, dir, tcp_flags);
        let sid = self.tables.insert_session(mid, rem, rport, state, class, self.now_s).map_err(|_| DropReason::SessionTableFull)?;
        self.subs.get_mut(sub).sessions += 1;
        self.counters.sessions_created += 1;
        self.note_peak_sessions();
        if self.cfg.log_sessions {
            self.event(EventKind::SessionCreated, m.proto, m.int_addr, m.int_port, m.ext_addr, m.ext_port, m.ext_port, rem, rport);
        }
        Ok(sid)
    }

    /// Peak mappings so far; an SCTP association is one.
    #[inline(always)]
    pub(super) fn note_peak_mappings(&mut self) {
        self.counters.peak_mappings = self.counters.peak_mappings.max((self.tables.mapping_count() + self.assocs.len()) as u64);
    }

    /// Peak sessions so far; an SCTP association is one.
    #[inline(always)]
    pub(super) fn note_peak_sessions(&mut self) {
        self.counters.peak_sessions = self.counters.peak_sessions.max((self.tables.session_count() + self.assocs.len()) as u64);
    }

    pub(super) fn expire_sessions(&mut self) {
        let mut due = std::mem::take(&mut self.expired);
        self.tables.expire(self.now_s, &mut due);
        self.delete_sessions(&mut due);
        due.clear();
        self.expired = due;
    }

    /// The subscriber record of an internal address: every mapping's
    /// subscriber has one for as long as the mapping lives.
    pub(crate) fn subscriber_of(&self, int_addr: u32) -> Option<u32> {
        self.subs.find(int_addr)
    }

    /// Deletes many sessions. Extras go before own sessions (their ids sort
    /// higher), so ending an own session never promotes one that is going too.
    pub(crate) fn delete_sessions(&mut self, ids: &mut [u32]) {
        ids.sort_unstable_by(|a, b| b.cmp(a));
        for &id in ids.iter() {
            if self.tables.is_live(id) {
                self.delete_session(id);
            }
        }
    }

    pub(crate) fn delete_session(&mut self, id: u32) {
        let s = self.tables.remove_session(id);
        let sub = self.subscriber_of(s.int_addr);
        if let Some(sub) = sub {
            self.subs.get_mut(sub).sessions -= 1;
        }
        if self.cfg.log_sessions {
            self.event(EventKind::SessionDeleted, s.proto, s.int_addr, s.int_port, s.ext_addr, s.ext_port, s.ext_port, s.rem_addr, s.rem_port);
        }
        let m = self.tables.mapping(s.mapping);
        if !self.tables.has_sessions(s.mapping) && m.flags & mapping_flags::STATIC == 0 {
            let closed = s.proto == Proto::Tcp && trackers::tcp::is_closed(s.state);
            self.delete_mapping(s.mapping, closed);
        } else if let Some(sub) = sub {
            self.subs.release_if_idle(sub);
        }
    }

    /// Removes a mapping with no sessions left. `skip_hold_down` for TCP
    /// closed by FIN or RST (RFC 6888 REQ-8's exception) or a mapping that never carried traffic.
    pub(super) fn delete_mapping(&mut self, mid: u32, skip_hold_down: bool) {
        let m = self.tables.mapping(mid);
        self.tables.remove_mapping(mid);
        self.subs.identities_mut().release(m.int_addr, self.now_s);
        self.event(EventKind::MappingDeleted, m.proto, m.int_addr, m.int_port, m.ext_addr, m.ext_port, m.ext_port, 0, 0);
        let sub = self.subscriber_of(m.int_addr);
        debug_assert!(sub.is_some(), "a mapping outlived its subscriber");
        let mut blocks = sub.map(|s| std::mem::take(&mut self.subs.get_mut(s).blocks)).unwrap_or_default();
        // The port goes back even if the subscriber record were missing.
        let released = match self.pool.index_of(m.ext_addr) {
            Some(ext_index) => self.pool.release(ext_index, m.proto, m.ext_port, self.now_s, skip_hold_down, &mut blocks),
            None => None,
        };
        if let Some(b) = released {
            self.event(EventKind::BlockReleased, m.proto, m.int_addr, 0, b.addr, b.first, b.last, 0, 0);
        }
        let Some(sub) = sub else { return };
        let s = self.subs.get_mut(sub);
        s.blocks = blocks;
        s.ports[m.proto as usize] -= 1;
        s.mappings -= 1;
        if s.mappings == 0 && s.blocks.is_empty() {
            s.paired = NONE;
        }
        self.subs.release_if_idle(sub);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig;
    use crate::nat44::pcp_ops::NatOps;

    /// DS-Lite's ground: hosts behind two B4s with one private address get
    /// mappings of their own, and quotas hold per B4.
    #[test]
    fn softwire_endpoints_are_told_apart_and_share_their_b4s_quota() {
        let cfg = EngineConfig { pool: vec![0xcb00_7101], max_ports_per_subscriber: 2, max_sessions: 64, ..EngineConfig::default() };
        let mut nat = Nat44::new(cfg).unwrap();
        let b4 = |n| std::net::Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, n);
        let mut endpoint = |n, inner| nat.subs.identities_mut().intern_softwire(b4(n), inner, 0).unwrap();
        let (a, b, c) = (endpoint(1, 0xc000_0002), endpoint(2, 0xc000_0002), endpoint(1, 0xc000_0003));
        let ma = NatOps::create_mapping(&mut nat, Proto::Udp, a, 5000).unwrap();
        let mb = NatOps::create_mapping(&mut nat, Proto::Udp, b, 5000).unwrap();
        assert_ne!(ma, mb);
        assert_ne!(nat.tables.mapping(ma).ext_port, nat.tables.mapping(mb).ext_port, "one external endpoint each");
        NatOps::create_mapping(&mut nat, Proto::Udp, c, 6000).unwrap();
        assert_eq!(NatOps::create_mapping(&mut nat, Proto::Udp, a, 7000), Err(DropReason::PortQuota), "B4 1 holds its two ports");
        assert!(NatOps::create_mapping(&mut nat, Proto::Udp, b, 7000).is_ok(), "B4 2 has one left");
        assert_eq!(nat.subs.len(), 2);
    }
}
