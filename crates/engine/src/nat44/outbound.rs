//! Outbound: a subscriber's datagram leaves with its mapping's external
//! address and port, a mapping and session made for it if need be. A
//! datagram to a pool address is a hairpin (RFC 4787 REQ-9, RFC 5382
//! REQ-8): translated out and straight back in to the subscriber holding
//! that address and port.

use natrix_wire::{icmp, tcp};

use crate::drop::DropReason;
use crate::nat44::{Flow, Looked, Nat44};
use crate::pipeline::frame::Ip;
use crate::rewrite::{self, Which};
use crate::state::sessions::NIL;
use crate::state::subscribers::NONE;
use crate::trackers::Direction;
use crate::{Proto, Side};

impl Nat44 {
    /// Translates an outbound datagram that is neither exempt nor an ICMP
    /// error; refusals for lack of resources are the router's to answer.
    pub(super) fn translate_out(&mut self, frame: &mut [u8], ip: &Ip, flow: &Flow) -> Result<Side, DropReason> {
        let hairpin = self.pool.contains(ip.dst);
        let may_create = match flow.icmp_class {
            None | Some(icmp::Class::QueryRequest) => true,
            Some(icmp::Class::QueryReply) => false,
            Some(_) => return Err(DropReason::IcmpUnsupported),
        };
        if hairpin && flow.proto == Proto::Icmp {
            // Queries to a pool address reach no subscriber: identifiers are ours.
            return Err(DropReason::NoMapping);
        }
        let (port, rport) = flow.out_ports();
        let hash_in = self.tables.hash_in(flow.proto, ip.src, port);
        let found = self.tables.lookup_in_hinted(NIL, hash_in, flow.proto, ip.src, port, ip.dst, rport);
        let looked = Looked { hash_in, found, sub_hint: NONE };
        let sid = self.outbound_session(ip.src, ip.dst, flow, may_create, looked)?;
        let s = self.tables.endpoints(sid);
        if !hairpin || !self.owns_external(flow.proto, ip.dst, flow.dport) {
            rewrite::rewrite(frame, ip.l3, flow.l4, Which::Src, s.ext_addr, s.ext_port);
            // A hairpin to another worker's mapping leaves as if outbound; the
            // dataplane turns it around to that worker as an inbound packet.
            return Ok(Side::Outside);
        }
        // The peer first: a refusal (its session quota) answers the sender
        // about its datagram as it sent it.
        let peer = self.inbound_session(frame, ip.l3, flow.proto, ip.dst, flow.dport, s.ext_addr, s.ext_port, flow.tcp_flags, true)?;
        let p = self.tables.endpoints(peer);
        rewrite::rewrite(frame, ip.l3, flow.l4, Which::Src, s.ext_addr, s.ext_port);
        rewrite::rewrite(frame, ip.l3, flow.l4, Which::Dst, p.int_addr, p.int_port);
        Ok(Side::Inside)
    }

    /// The session of an outbound datagram from `src` to `dst`, made if
    /// there is none and `may_create`.
    #[inline(always)]
    pub(crate) fn outbound_session(&mut self, src: u32, dst: u32, flow: &Flow, may_create: bool, looked: Looked) -> Result<u32, DropReason> {
        let (port, rport) = flow.out_ports();
        let found = looked.found;
        if let Some(id) = found.and_then(|f| f.session) {
            self.track(id, Direction::Out, flow.tcp_flags, true);
            return Ok(id);
        }
        if !may_create {
            return Err(DropReason::NoMapping);
        }
        let made = match found {
            Some(f) => self.create_session(f.mapping, dst, rport, Direction::Out, flow.tcp_flags),
            None => {
                let (mid, sub) = self.create_mapping(flow.proto, src, port, looked.sub_hint, looked.hash_in)?;
                self.create_session_of(sub, mid, dst, rport, Direction::Out, flow.tcp_flags).inspect_err(|_| self.delete_mapping(mid, true))
            }
        };
        let sid = made?;
        if flow.proto == Proto::Tcp && flow.tcp_flags & tcp::flags::SYN != 0 && !self.held_syns.is_empty() {
            let ends = self.tables.endpoints(sid);
            self.held_syns.cancel(ends.ext_addr, ends.ext_port, dst, rport);
        }
        Ok(sid)
    }
}
