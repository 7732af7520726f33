//! Inbound: a datagram to a pool address finds its mapping by the external
//! endpoint, passes the filtering behaviour (RFC 4787 REQ-8) and leaves
//! for the subscriber; an unsolicited SYN is held (RFC 5382 REQ-4).

use natrix_wire::{icmp, tcp};

use crate::config::Filtering;
use crate::drop::DropReason;
use crate::nat44::Nat44;
use crate::pipeline::frame::Ip;
use crate::rewrite::{self, Which};
use crate::state::sessions::mapping_flags;
use crate::trackers::Direction;
use crate::{Proto, Side};

impl Nat44 {
    pub(super) fn translate_in(&mut self, frame: &mut [u8], ip: &Ip) -> Result<Side, DropReason> {
        let flow = self.parse_flow(frame, ip)?;
        match flow.icmp_class {
            None | Some(icmp::Class::QueryReply) => {}
            // Inbound requests carry the remote's identifier, not one of ours.
            Some(icmp::Class::QueryRequest) => return Err(DropReason::NoMapping),
            Some(_) => return Err(DropReason::IcmpUnsupported),
        }
        let (port, rport) = flow.in_ports();
        let sid = self.inbound_session(frame, ip.l3, flow.proto, ip.dst, port, ip.src, rport, flow.tcp_flags, false)?;
        let s = self.tables.endpoints(sid);
        rewrite::rewrite(frame, ip.l3, flow.l4, Which::Dst, s.int_addr, s.int_port);
        Ok(Side::Inside)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn inbound_session(
        &mut self,
        frame: &[u8],
        l3: usize,
        proto: Proto,
        ext: u32,
        eport: u16,
        rem: u32,
        rport: u16,
        tcp_flags: u8,
        hairpin: bool,
    ) -> Result<u32, DropReason> {
        let found = self.tables.lookup_out(proto, ext, eport, rem, rport);
        if let Some(id) = found.and_then(|f| f.session) {
            self.track(id, Direction::In, tcp_flags, self.cfg.inbound_refresh);
            return Ok(id);
        }
        let Some(mid) = found.map(|f| f.mapping) else {
            let plain_syn = tcp_flags & (tcp::flags::SYN | tcp::flags::ACK | tcp::flags::RST) == tcp::flags::SYN;
            if proto == Proto::Tcp && plain_syn && !hairpin {
                self.held_syns.hold(frame, l3, ext, eport, rem, rport, self.now_ns + self.cfg.timeouts.syn_hold_ns);
                return Err(DropReason::UnsolicitedSyn);
            }
            return Err(DropReason::NoMapping);
        };
        if !self.filter_allows(mid, rem, rport) {
            return Err(DropReason::Filtered);
        }
        self.create_session(mid, rem, rport, Direction::In, tcp_flags)
    }

    /// RFC 4787 REQ-8: which remote endpoints may use an existing mapping.
    fn filter_allows(&self, mid: u32, rem: u32, rport: u16) -> bool {
        if self.tables.mapping(mid).flags & mapping_flags::STATIC != 0 {
            return true;
        }
        // A PCP MAP mapping: endpoint-independent, or its FILTER options.
        if let Some(allowed) = self.pcp_filter_allows(mid, rem, rport) {
            return allowed;
        }
        match self.cfg.filtering {
            Filtering::EndpointIndependent => true,
            Filtering::AddressDependent => self.tables.sessions_of(mid).any(|s| self.tables.session(s).rem_addr == rem),
            // The exact (address, port) session would already have matched.
            Filtering::AddressAndPortDependent => false,
        }
    }
}
