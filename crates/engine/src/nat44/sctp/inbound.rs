//! Inbound SCTP: a packet to a pool address is found by the internal host's
//! tag (by the remote's own with the T bit), the external address, and the
//! ports; its destination becomes the internal address. An INIT-ACK names
//! the remote's tag. Nothing is opened from outside: an INIT, or any packet
//! that matches no association, is dropped and answered only where
//! `reply_ootb` covers the outside (seed 001 section 3.3: an answer would
//! tell an attacker which associations exist). With global addresses
//! tracked, a packet whose tags and ports match but whose source is not
//! tracked is the one case seed 001 answers from outside (section 3.3, case
//! 2): its sender may add the address with an ASCONF.

use natrix_wire::sctp::{self, chunk};

use crate::drop::DropReason;
use crate::nat44::sctp::chunks::{self, Scan};
use crate::nat44::sctp::outbound::Header;
use crate::nat44::sctp::{reply, ReplyOotb};
use crate::nat44::Nat44;
use crate::pipeline::frame::Ip;
use crate::pipeline::router::Router;
use crate::rewrite::{self, Which, L4};
use crate::state::associations::Key;
use crate::trackers::sctp::Signal;
use crate::Side;

impl Nat44 {
    /// Translates an SCTP packet to a pool address.
    pub(crate) fn sctp_inbound(&mut self, frame: &mut [u8], ip: &Ip, router: &mut Router) -> Result<Side, DropReason> {
        let l4 = &frame[ip.l4..ip.l4 + ip.l4_len];
        let scan = chunks::scan(l4, self.cfg.sctp.max_chunks, ip.first_frag)?;
        let h = Header::of(l4)?;
        if scan.first == chunk::INIT {
            self.answer_missing_state(frame, ip, Side::Outside, &scan, h, router);
            return Err(DropReason::SctpNoAssociation);
        }
        let id = self.find_inbound(frame, ip, &scan, h, router)?;
        if scan.signal == Signal::InitAck {
            self.assocs.learn_rem_vtag(id, scan.init_tag);
            if self.cfg.sctp.tracks_addresses() && !ip.first_frag {
                self.track_init_ack_addresses(id, &frame[ip.l4 + sctp::HEADER_LEN..ip.l4 + scan.first_end])?;
            }
        }
        let int_addr = self.assocs.get(id).int_addr;
        self.after_sctp_packet(id, scan.signal);
        rewrite::rewrite(frame, ip.l3, L4::None, Which::Dst, int_addr, 0);
        Ok(Side::Inside)
    }

    /// The association of an inbound packet. With global addresses tracked,
    /// a source the association does not know passes only in an ASCONF that
    /// adds it.
    fn find_inbound(&mut self, frame: &[u8], ip: &Ip, scan: &Scan, h: Header, router: &mut Router) -> Result<u32, DropReason> {
        let key = if scan.reflected { Key::OutsideByRemTag } else { Key::OutsideByIntTag };
        let Some(f) = self.assocs.find(key, ip.dst, h.dst_port, h.src_port, h.verification_tag, ip.src) else {
            self.answer_missing_state(frame, ip, Side::Outside, scan, h, router);
            return Err(DropReason::SctpNoAssociation);
        };
        let tracking = self.cfg.sctp.tracks_addresses();
        if let (true, Some((start, end))) = (tracking, scan.asconf) {
            self.track_asconf_addresses(f.id, &frame[ip.l4 + start..ip.l4 + end], ip.src)?;
        }
        if !tracking || self.assocs.knows_remote(f.id, ip.src) {
            return Ok(f.id);
        }
        if self.cfg.sctp.reply_ootb != ReplyOotb::None && !scan.never_answer {
            reply::send(router, frame, ip, Side::Outside, &reply::missing_state(h.verification_tag, &frame[ip.l3..ip.l4 + ip.l4_len]));
        }
        Err(DropReason::SctpNoAssociation)
    }
}
