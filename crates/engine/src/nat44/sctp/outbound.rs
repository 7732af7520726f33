//! Outbound SCTP: an internal host's INIT opens an association (its
//! Initiate Tag is the tag every packet towards the host will carry) unless
//! that tag and the ports collide with another subscriber's association
//! towards the same remote on the same external address, which is answered
//! with an ABORT-M (seed 001 section 5.2.1). Every other packet is found by
//! the remote's tag (by the host's own with the T bit); the source address
//! becomes the external one, ports and CRC32c stay as they are.

use natrix_wire::sctp::{self, chunk};

use crate::drop::DropReason;
use crate::nat44::sctp::associations::Opening;
use crate::nat44::sctp::chunks::{self, Scan};
use crate::nat44::sctp::{asconf, reply};
use crate::nat44::Nat44;
use crate::pipeline::frame::Ip;
use crate::pipeline::router::Router;
use crate::rewrite::{self, Which, L4};
use crate::state::associations::Key;
use crate::trackers::sctp as tracker;
use crate::Side;

/// The fields of the common header a lookup needs.
#[derive(Clone, Copy)]
pub(super) struct Header {
    pub src_port: u16,
    pub dst_port: u16,
    pub verification_tag: u32,
}

impl Header {
    pub(super) fn of(l4: &[u8]) -> Result<Header, DropReason> {
        let p = sctp::Packet::new_checked(l4).map_err(|_| DropReason::L4Truncated)?;
        Ok(Header { src_port: p.src_port(), dst_port: p.dst_port(), verification_tag: p.verification_tag() })
    }
}

impl Nat44 {
    /// Translates an SCTP packet from a subscriber; an unmatched one is
    /// dropped (and answered where `reply_ootb` says).
    pub(crate) fn sctp_outbound(&mut self, frame: &mut [u8], ip: &Ip, router: &mut Router) -> Result<Side, DropReason> {
        let l4 = &frame[ip.l4..ip.l4 + ip.l4_len];
        let scan = chunks::scan(l4, self.cfg.sctp.max_chunks, ip.first_frag)?;
        let h = Header::of(l4)?;
        if self.pool.contains(ip.dst) {
            // No association can be opened from outside, so none from one
            // subscriber to another through the pool either.
            return Err(DropReason::SctpNoAssociation);
        }
        let id = if scan.first == chunk::INIT {
            self.outbound_init(frame, ip, &scan, h, router)?
        } else {
            match self.find_outbound(ip, &scan, h) {
                Some(id) => id,
                None => self.outbound_unmatched(frame, ip, &scan, h, router)?,
            }
        };
        let ext_addr = self.assocs.get(id).ext_addr;
        self.after_sctp_packet(id, scan.signal);
        rewrite::rewrite(frame, ip.l3, L4::None, Which::Src, ext_addr, 0);
        Ok(Side::Outside)
    }

    /// The association of an outbound packet other than an INIT. With
    /// tracking on, the destination must be one of its remote's addresses.
    /// One carrying the remote's tag confirms it: the INIT-ACK the host
    /// took (`Associations::confirm_rem_vtag`).
    fn find_outbound(&mut self, ip: &Ip, scan: &Scan, h: Header) -> Option<u32> {
        let key = if scan.reflected { Key::InsideByIntTag } else { Key::InsideByRemTag };
        let f = self.assocs.find(key, ip.src, h.src_port, h.dst_port, h.verification_tag, ip.dst)?;
        let id = (f.remote_known || !self.cfg.sctp.tracks_addresses()).then_some(f.id)?;
        if key == Key::InsideByRemTag {
            self.assocs.confirm_rem_vtag(id, h.verification_tag);
        }
        Some(id)
    }

    /// An INIT: the association it opened already (a retransmission), a new
    /// one, or a collision.
    fn outbound_init(&mut self, frame: &[u8], ip: &Ip, scan: &Scan, h: Header, router: &mut Router) -> Result<u32, DropReason> {
        if h.verification_tag != 0 {
            // RFC 9260 section 8.5.1: an INIT's packet carries tag 0.
            return Err(DropReason::SctpMalformed);
        }
        let tag = scan.init_tag;
        if let Some(f) = self.assocs.find(Key::InsideByIntTag, ip.src, h.src_port, h.dst_port, tag, ip.dst).filter(|f| f.remote_known) {
            return Ok(f.id);
        }
        let (ext_addr, sub) = self.sctp_external_address(ip.src)?;
        let collides =
            self.assocs.find(Key::OutsideByIntTag, ext_addr, h.src_port, h.dst_port, tag, ip.dst).is_some_and(|f| f.remote_known && self.assocs.get(f.id).int_addr != ip.src);
        if collides {
            self.subs.release_if_idle(sub);
            let init_chunk = &frame[ip.l4 + sctp::HEADER_LEN..ip.l4 + scan.first_end];
            reply::send(router, frame, ip, Side::Inside, &reply::collision_abort(tag, init_chunk));
            return Err(DropReason::SctpCollision);
        }
        let (state, class) = tracker::open();
        let o = Opening { int_addr: ip.src, rem_addr: ip.dst, int_port: h.src_port, rem_port: h.dst_port, int_vtag: tag, rem_vtag: 0, state, class };
        self.open_association(sub, ext_addr, &o)
    }

    /// A packet from inside that matched nothing: an ASCONF with VTags
    /// opens its association again; anything else is out of the blue.
    fn outbound_unmatched(&mut self, frame: &[u8], ip: &Ip, scan: &Scan, h: Header, router: &mut Router) -> Result<u32, DropReason> {
        if let Some((start, end)) = scan.asconf {
            let chunk = &frame[ip.l4 + start..ip.l4 + end];
            if let Some(tags) = asconf::vtags_of(chunk, self.cfg.sctp.max_params)? {
                return self.restore_association(frame, ip, h, chunk, tags, router);
            }
        }
        self.answer_missing_state(frame, ip, Side::Inside, scan, h, router);
        Err(DropReason::SctpNoAssociation)
    }
}
