//! Opening and ending associations with the subscriber machinery the other
//! protocols use (CONTRACTS "SCTP NAT"): an association is a session against
//! `max_sessions_per_subscriber` and one port use under
//! `max_ports_per_protocol.sctp` (and the subscriber's total); it counts
//! against the new-mapping rate; it uses the subscriber's paired external
//! address (RFC 4787 REQ-2), or in deterministic mode the formula's; and it
//! is logged as a mapping (natEvent 8/9, protocol 132) and, with
//! `unit = "session"`, a session with the remote too.

use crate::drop::DropReason;
use crate::nat44::Nat44;
use crate::state::associations::Association;
use crate::state::events::EventKind;
use crate::state::hash;
use crate::state::subscribers::NONE;
use crate::trackers::TimeoutClass;
use crate::Proto;

/// What a new association is made of, before it has an external address.
pub(super) struct Opening {
    pub int_addr: u32,
    pub rem_addr: u32,
    pub int_port: u16,
    pub rem_port: u16,
    pub int_vtag: u32,
    /// 0 when opened by an INIT.
    pub rem_vtag: u32,
    pub state: u8,
    pub class: TimeoutClass,
}

impl Nat44 {
    /// The external address an association of `int_addr` leaves with: the
    /// subscriber's paired address (chosen now if it has none), or its
    /// deterministic one. Returns it with the subscriber's id.
    pub(super) fn sctp_external_address(&mut self, int_addr: u32) -> Result<(u32, u32), DropReason> {
        let det = self.det.as_ref().map(|_| self.det_assignment(int_addr));
        if let Some(None) = det {
            return Err(DropReason::NotSubscriber);
        }
        let sub = self.subs.find_or_create(int_addr).ok_or(DropReason::SubscriberTableFull)?;
        let paired = match det.flatten() {
            Some(a) => self.pool.index_of(a.ext_addr),
            None if self.subs.get(sub).paired != NONE => Some(self.subs.get(sub).paired),
            None => self.pool.choose_address(hash::address(self.cfg.seed, int_addr), Proto::Sctp),
        };
        let Some(paired) = paired else {
            self.event(EventKind::AddressesExhausted, Proto::Sctp, int_addr, 0, 0, 0, 0, 0, 0);
            self.subs.release_if_idle(sub);
            return Err(DropReason::PoolExhausted);
        };
        Ok((self.pool.address(paired), sub))
    }

    /// Opens an association for subscriber `sub`, leaving with `ext_addr`,
    /// within its quotas.
    pub(super) fn open_association(&mut self, sub: u32, ext_addr: u32, o: &Opening) -> Result<u32, DropReason> {
        let refused = self.admit_association(sub, o);
        if let Err(r) = refused {
            self.subs.release_if_idle(sub);
            return Err(r);
        }
        let a = Association {
            int_addr: o.int_addr,
            ext_addr,
            rem_addr: o.rem_addr,
            int_port: o.int_port,
            rem_port: o.rem_port,
            int_vtag: o.int_vtag,
            rem_vtag: o.rem_vtag,
            state: o.state,
            class: o.class,
            last_used: self.now_s,
            globals: 0,
        };
        let Ok(id) = self.assocs.insert(&a) else {
            self.subs.release_if_idle(sub);
            return Err(DropReason::SessionTableFull);
        };
        let paired = self.pool.index_of(ext_addr).unwrap_or(NONE);
        self.subs.identities_mut().hold(a.int_addr);
        let s = self.subs.get_mut(sub);
        s.ports[Proto::Sctp as usize] += 1;
        s.mappings += 1;
        s.sessions += 1;
        if s.paired == NONE {
            s.paired = paired;
        }
        self.counters.mappings_created += 1;
        self.counters.sessions_created += 1;
        self.note_peak_mappings();
        self.note_peak_sessions();
        self.association_event(&a, EventKind::MappingCreated, EventKind::SessionCreated);
        Ok(id)
    }

    /// The quotas a new association must fit (CONTRACTS: a session and a port use).
    fn admit_association(&mut self, sub: u32, o: &Opening) -> Result<(), DropReason> {
        let s = self.subs.get(sub);
        if s.sessions >= self.cfg.max_sessions_per_subscriber {
            return Err(DropReason::SessionQuota);
        }
        if s.ports_total() >= self.cfg.max_ports_per_subscriber || s.ports[Proto::Sctp as usize] >= self.cfg.max_ports_per_protocol[Proto::Sctp as usize] {
            self.event(EventKind::QuotaExceeded, Proto::Sctp, o.int_addr, o.int_port, 0, 0, 0, 0, 0);
            return Err(DropReason::PortQuota);
        }
        let (now_s, rate) = (self.now_s, self.cfg.max_new_mappings_per_second);
        if !self.subs.get_mut(sub).admit_new_mapping(now_s, rate) {
            return Err(DropReason::RateLimited);
        }
        Ok(())
    }

    /// Ends an association: logged, and its subscriber's counts given back.
    pub(crate) fn end_association(&mut self, id: u32) {
        let a = self.assocs.remove(id);
        self.subs.identities_mut().release(a.int_addr, self.now_s);
        self.association_event(&a, EventKind::MappingDeleted, EventKind::SessionDeleted);
        let Some(sub) = self.subscriber_of(a.int_addr) else {
            debug_assert!(false, "an association outlived its subscriber");
            return;
        };
        let s = self.subs.get_mut(sub);
        s.ports[Proto::Sctp as usize] -= 1;
        s.mappings -= 1;
        s.sessions -= 1;
        if s.mappings == 0 && s.blocks.is_empty() {
            s.paired = NONE;
        }
        self.subs.release_if_idle(sub);
    }

    /// Ends the associations whose idle timeout passed.
    pub(crate) fn expire_associations(&mut self) {
        let mut due = std::mem::take(&mut self.expired);
        due.clear();
        self.assocs.expire(self.now_s, &mut due);
        for &id in &due {
            self.end_association(id);
        }
        due.clear();
        self.expired = due;
    }

    /// An association's mapping event and, when sessions are logged, its
    /// session event: the external port is the internal one, never changed.
    fn association_event(&mut self, a: &Association, mapping: EventKind, session: EventKind) {
        self.event(mapping, Proto::Sctp, a.int_addr, a.int_port, a.ext_addr, a.int_port, a.int_port, 0, 0);
        if self.cfg.log_sessions {
            self.event(session, Proto::Sctp, a.int_addr, a.int_port, a.ext_addr, a.int_port, a.int_port, a.rem_addr, a.rem_port);
        }
    }
}
