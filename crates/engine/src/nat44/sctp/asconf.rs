//! Multi-homing (seed 001 sections 2.2.4, 3.2 and 4; RFC 5061;
//! draft-ietf-tsvwg-natsupp): an ASCONF from inside carrying the VTags
//! parameter opens the association it names when natrix has no state for
//! it (an internal host adding its path through natrix, or natrix after a
//! restart), and with `track_global_addresses` on, the remote's addresses
//! are tracked: those its INIT-ACK lists and those its ASCONFs add or
//! delete, up to the configured number. At most `max_params` parameters of
//! a chunk are examined; a parameter past them is never looked at.

use natrix_wire::sctp::{param, Asconf, Init, Param};

use crate::drop::DropReason;
use crate::nat44::sctp::associations::Opening;
use crate::nat44::sctp::outbound::Header;
use crate::nat44::sctp::reply;
use crate::nat44::Nat44;
use crate::pipeline::frame::Ip;
use crate::pipeline::router::Router;
use crate::state::associations::Key;
use crate::trackers::sctp as tracker;
use crate::Side;

/// The examined parameters of the ASCONF chunk `chunk`, malformed lengths
/// refused as a whole.
fn asconf_params(chunk: &[u8], max_params: u32, mut each: impl FnMut(&Param)) -> Result<(), DropReason> {
    let asconf = Asconf::new_checked(chunk).map_err(|_| DropReason::SctpMalformed)?;
    for p in asconf.params(max_params as usize) {
        each(&p.map_err(|_| DropReason::SctpMalformed)?);
    }
    Ok(())
}

/// The (internal, remote) tags of an ASCONF's VTags parameter, if it has
/// one among the parameters examined; tags are never 0.
pub(super) fn vtags_of(chunk: &[u8], max_params: u32) -> Result<Option<(u32, u32)>, DropReason> {
    let mut found = None;
    asconf_params(chunk, max_params, |p| {
        if found.is_none() {
            found = p.vtags().filter(|&(int, rem)| int != 0 && rem != 0);
        }
    })?;
    Ok(found)
}

impl Nat44 {
    /// An ASCONF from inside that matched no association and carries VTags
    /// (`tags`: internal, remote): the association it names is opened, up
    /// already, unless its internal tag and ports collide with another
    /// subscriber's association towards the same remote, which is answered
    /// with an ERROR-M (draft-ietf-tsvwg-natsupp).
    pub(super) fn restore_association(&mut self, frame: &[u8], ip: &Ip, h: Header, asconf: &[u8], tags: (u32, u32), router: &mut Router) -> Result<u32, DropReason> {
        let (int_port, rem_port) = (h.src_port, h.dst_port);
        let (ext_addr, sub) = self.sctp_external_address(ip.src)?;
        let other = self.assocs.find(Key::OutsideByIntTag, ext_addr, int_port, rem_port, tags.0, ip.dst).filter(|f| f.remote_known).map(|f| self.assocs.get(f.id));
        if other.is_some_and(|o| o.int_addr != ip.src && o.rem_vtag != tags.1) {
            self.subs.release_if_idle(sub);
            reply::send(router, frame, ip, Side::Inside, &reply::collision_error(h.verification_tag, asconf));
            return Err(DropReason::SctpCollision);
        }
        let (state, class) = tracker::open_established();
        let o = Opening { int_addr: ip.src, rem_addr: ip.dst, int_port, rem_port, int_vtag: tags.0, rem_vtag: tags.1, state, class };
        self.open_association(sub, ext_addr, &o)
    }

    /// The remote's addresses an ASCONF from outside adds or deletes, when
    /// they are tracked; the wildcard 0.0.0.0 stands for the packet's source.
    pub(super) fn track_asconf_addresses(&mut self, id: u32, asconf: &[u8], src: u32) -> Result<(), DropReason> {
        let (max_params, limit) = (self.cfg.sctp.max_params, self.cfg.sctp.track_global_addresses);
        let assocs = &mut self.assocs;
        asconf_params(asconf, max_params, |p| {
            let Some(addr) = p.asconf_ipv4_address().map(|a| if a == 0 { src } else { a }) else { return };
            match p.param_type {
                param::ADD_IP_ADDRESS => {
                    // Past the limit the address is simply not tracked (seed 001 section 3.2).
                    assocs.add_global(id, addr, limit);
                }
                _ => assocs.remove_global(id, addr),
            }
        })
    }

    /// The remote's further addresses its INIT-ACK lists (IPv4 Address
    /// parameters), when they are tracked.
    pub(super) fn track_init_ack_addresses(&mut self, id: u32, init_ack: &[u8]) -> Result<(), DropReason> {
        let (max_params, limit) = (self.cfg.sctp.max_params, self.cfg.sctp.track_global_addresses);
        let init = Init::new_checked(init_ack).map_err(|_| DropReason::SctpMalformed)?;
        for p in init.params(max_params as usize) {
            if let Some(addr) = p.map_err(|_| DropReason::SctpMalformed)?.ipv4_address() {
                self.assocs.add_global(id, addr, limit);
            }
        }
        Ok(())
    }
}
