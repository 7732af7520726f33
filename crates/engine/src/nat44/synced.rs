//! A standby's side of session sync (docs/SCALE-OUT.md): the NAT events of
//! its active node, installed here as the state they describe, with the
//! same external address and port, so that flows keep their external
//! endpoint when the standby takes over. Installing logs nothing (the
//! active node logged it) and is idempotent: a record applied twice, or a
//! deletion of what is not here, changes nothing.
//!
//! While standby, synced sessions do not expire here: the active node's
//! deletions end them. Hold-downs run on this node's clock, from when the
//! deletion arrived; a port the active node reuses first has its hold here
//! cut short. A TCP session is installed as established: what survives a
//! failover is an established connection, whose handshake the standby never saw.

use std::fmt;

use crate::nat44::Nat44;
use crate::state::events::{Event, EventKind};
use crate::state::pool::TakeError;
use crate::state::sessions::Mapping;
use crate::state::subscribers::NONE;
use crate::trackers::{self, Direction};
use crate::Proto;

/// Why a synced record could not be installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncRefusal {
    /// The external address is not in this node's pool: the two nodes' configs differ.
    NotInPool,
    /// The port or block is in use here by other state.
    Port(TakeError),
    /// The internal endpoint has a mapping here to another external endpoint.
    Conflict,
    /// A session whose mapping never arrived (its record was lost).
    NoMapping,
    /// Tables or subscribers are full.
    Full,
    /// SCTP associations and DS-Lite softwires are not synced.
    Unsupported,
    /// An event that describes no state (exhaustion, quota).
    NotState,
}

impl fmt::Display for SyncRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncRefusal::NotInPool => f.write_str("external address not in this node's pool"),
            SyncRefusal::Port(e) => write!(f, "port or block unavailable here ({e:?})"),
            SyncRefusal::Conflict => f.write_str("the internal endpoint is mapped to another external endpoint here"),
            SyncRefusal::NoMapping => f.write_str("session of a mapping this node does not have"),
            SyncRefusal::Full => f.write_str("tables or subscribers full"),
            SyncRefusal::Unsupported => f.write_str("SCTP and DS-Lite state is not synced"),
            SyncRefusal::NotState => f.write_str("not a state change"),
        }
    }
}

impl std::error::Error for SyncRefusal {}

impl Nat44 {
    /// Installs what the active node's event `e` says it made or ended.
    pub(crate) fn install_synced(&mut self, e: &Event) -> Result<(), SyncRefusal> {
        if e.proto == Proto::Sctp || crate::state::identity::is_softwire(e.int_addr) {
            return Err(SyncRefusal::Unsupported);
        }
        let mark = self.events.len();
        let result = match e.kind {
            EventKind::MappingCreated => self.install_mapping(e).map(drop),
            EventKind::MappingDeleted => {
                self.remove_synced_mapping(e);
                Ok(())
            }
            EventKind::SessionCreated => self.install_session(e),
            EventKind::SessionDeleted => {
                if let Some(sid) = self.tables.find_session_in(e.proto, e.int_addr, e.int_port, e.rem_addr, e.rem_port) {
                    self.delete_session(sid);
                }
                Ok(())
            }
            EventKind::BlockAllocated => self.install_block(e),
            // The block empties here when its last mapping's deletion arrives.
            EventKind::BlockReleased => Ok(()),
            EventKind::AddressesExhausted | EventKind::PortsExhausted | EventKind::QuotaExceeded => Err(SyncRefusal::NotState),
        };
        // The active node logged all of it.
        self.events.retain_since(mark, |_| false);
        result
    }

    fn install_mapping(&mut self, e: &Event) -> Result<u32, SyncRefusal> {
        if let Some(mid) = self.tables.find_mapping_in(e.proto, e.int_addr, e.int_port) {
            let m = self.tables.mapping(mid);
            return if (m.ext_addr, m.ext_port) == (e.ext_addr, e.ext_port) { Ok(mid) } else { Err(SyncRefusal::Conflict) };
        }
        let ext_index = self.pool.index_of(e.ext_addr).ok_or(SyncRefusal::NotInPool)?;
        let sub = self.subs.find_or_create(e.int_addr).ok_or(SyncRefusal::Full)?;
        let mut taken = self.pool.take_synced_port(ext_index, e.proto, e.ext_port, sub);
        if taken == Err(TakeError::NotOwnersBlock) {
            // Its block's record was lost, or a resync carries mappings only:
            // the port says which block the subscriber holds.
            if let Some(first) = self.pool.block_start(e.ext_port) {
                let block = Event { kind: EventKind::BlockAllocated, ext_port: first, ..*e };
                if self.install_block(&block).is_ok() {
                    taken = self.pool.take_synced_port(ext_index, e.proto, e.ext_port, sub);
                }
            }
        }
        if let Err(t) = taken {
            self.subs.release_if_idle(sub);
            return Err(SyncRefusal::Port(t));
        }
        let m = Mapping { int_addr: e.int_addr, ext_addr: e.ext_addr, int_port: e.int_port, ext_port: e.ext_port, proto: e.proto, flags: 0 };
        let Ok(mid) = self.tables.insert_mapping(m) else {
            let mut blocks = std::mem::take(&mut self.subs.get_mut(sub).blocks);
            self.pool.release(ext_index, e.proto, e.ext_port, self.now_s, true, &mut blocks);
            self.subs.get_mut(sub).blocks = blocks;
            self.subs.release_if_idle(sub);
            return Err(SyncRefusal::Full);
        };
        let s = self.subs.get_mut(sub);
        s.ports[e.proto as usize] += 1;
        s.mappings += 1;
        if s.paired == NONE {
            s.paired = ext_index;
        }
        self.counters.mappings_created += 1;
        self.note_peak_mappings();
        Ok(mid)
    }

    /// Ends a mapping and its sessions, its port held down as the active
    /// node holds it.
    fn remove_synced_mapping(&mut self, e: &Event) {
        let Some(mid) = self.tables.find_mapping_in(e.proto, e.int_addr, e.int_port) else { return };
        let m = self.tables.mapping(mid);
        if (m.ext_addr, m.ext_port) != (e.ext_addr, e.ext_port) || m.flags & crate::state::sessions::mapping_flags::STATIC != 0 {
            return;
        }
        let mut sessions: Vec<u32> = self.tables.sessions_of(mid).collect();
        if sessions.is_empty() {
            self.delete_mapping(mid, false);
        } else {
            // The last session's deletion takes the mapping with it.
            self.delete_sessions(&mut sessions);
        }
    }

    fn install_session(&mut self, e: &Event) -> Result<(), SyncRefusal> {
        if self.tables.find_session_in(e.proto, e.int_addr, e.int_port, e.rem_addr, e.rem_port).is_some() {
            return Ok(());
        }
        let mid = self.tables.find_mapping_in(e.proto, e.int_addr, e.int_port).ok_or(SyncRefusal::NoMapping)?;
        let (mut state, mut class) = trackers::open(e.proto, Direction::Out, natrix_wire::tcp::flags::SYN);
        if e.proto == Proto::Tcp {
            class = trackers::tcp::on_segment(&mut state, Direction::In, natrix_wire::tcp::flags::SYN | natrix_wire::tcp::flags::ACK);
        }
        self.tables.insert_session(mid, e.rem_addr, e.rem_port, state, class, self.now_s).map_err(|_| SyncRefusal::Full)?;
        if let Some(sub) = self.subscriber_of(e.int_addr) {
            self.subs.get_mut(sub).sessions += 1;
        }
        self.counters.sessions_created += 1;
        self.note_peak_sessions();
        Ok(())
    }

    fn install_block(&mut self, e: &Event) -> Result<(), SyncRefusal> {
        let ext_index = self.pool.index_of(e.ext_addr).ok_or(SyncRefusal::NotInPool)?;
        let sub = self.subs.find_or_create(e.int_addr).ok_or(SyncRefusal::Full)?;
        let mut blocks = std::mem::take(&mut self.subs.get_mut(sub).blocks);
        let taken = self.pool.take_synced_block(ext_index, e.proto, e.ext_port, sub, &mut blocks);
        let s = self.subs.get_mut(sub);
        s.blocks = blocks;
        if taken.is_ok() && s.paired == NONE {
            s.paired = ext_index;
        }
        if taken.is_err() {
            self.subs.release_if_idle(sub);
        }
        taken.map_err(SyncRefusal::Port)
    }

    /// A standby keeps synced sessions until the active node ends them; on
    /// becoming active, each gets a full idle timeout from now, so what a
    /// lost deletion left behind expires like any idle session.
    pub(crate) fn set_standby(&mut self, standby: bool) {
        if self.standby && !standby {
            let now = self.now_s;
            let live: Vec<u32> = self.tables.live_sessions().collect();
            for sid in live {
                let class = self.tables.session(sid).class;
                self.tables.touch(sid, now, class);
            }
        }
        self.standby = standby;
    }
}
