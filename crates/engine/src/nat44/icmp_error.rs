//! ICMP errors (RFC 5508): an error quotes the datagram that caused it, so the
//! NAT must translate the quoted headers the opposite way to the outer ones.
//! Errors are validated (REQ-3), refresh nothing and never remove a mapping.

use natrix_wire::{icmp, ipv4, proto};

use crate::drop::DropReason;
use crate::nat44::Nat44;
use crate::pipeline::frame::Ip;
use crate::rewrite::{self, Which, L4};
use crate::{Proto, Side};

/// Transport bytes RFC 792 guarantees after the quoted IP header.
const QUOTED_L4_MIN: usize = 8;

/// The datagram an error quotes, with absolute offsets into the frame.
#[derive(Debug, Clone, Copy)]
struct Quoted {
    l3: usize,
    proto: Proto,
    src: u32,
    dst: u32,
    /// Source port, or the identifier of a quoted ICMP query.
    sport: u16,
    /// Destination port, or the identifier of a quoted ICMP query.
    dport: u16,
    l4: L4,
}

impl Quoted {
    /// Ports of the quoted datagram as (subscriber-side, remote) when it was
    /// travelling towards the subscriber.
    fn inbound_ports(&self) -> (u16, u16) {
        if self.proto == Proto::Icmp {
            (self.dport, 0)
        } else {
            (self.dport, self.sport)
        }
    }

    /// Ports as (subscriber-side, remote) when it was travelling away from the subscriber.
    fn outbound_ports(&self) -> (u16, u16) {
        if self.proto == Proto::Icmp {
            (self.sport, 0)
        } else {
            (self.sport, self.dport)
        }
    }
}

impl Nat44 {
    pub(crate) fn is_icmp_error(&self, frame: &[u8], ip: &Ip) -> bool {
        ip.proto == proto::ICMP && ip.l4_len >= 1 && icmp::classify(frame[ip.l4]) == icmp::Class::Error
    }

    /// A subscriber's host reports a problem with a datagram it received from
    /// outside (REQ-1 direction inside to outside).
    pub(crate) fn icmp_error_from_inside(&mut self, frame: &mut [u8], ip: &Ip) -> Result<Side, DropReason> {
        let q = validate(frame, ip)?;
        if q.proto == Proto::Sctp {
            let out = self.sctp_icmp_error(frame, ip, q.l3, Side::Inside)?;
            refill_icmp_checksum(frame, ip);
            return Ok(out);
        }
        let (port, rport) = q.inbound_ports();
        let sid = self.tables.find_session_in(q.proto, q.dst, port, q.src, rport).ok_or(DropReason::IcmpErrorNoMapping)?;
        let s = self.tables.session(sid);
        rewrite::rewrite(frame, q.l3, q.l4, Which::Dst, s.ext_addr, s.ext_port);
        rewrite::rewrite(frame, ip.l3, L4::None, Which::Src, s.ext_addr, 0);
        // An error to another worker's subscriber (a hairpin whose sender's
        // mapping lies there) leaves as if outbound: the dataplane turns it
        // around to that worker, which takes it as an error from outside.
        if !self.pool.contains(ip.dst) || !self.owns_external(q.proto, q.src, q.sport) {
            refill_icmp_checksum(frame, ip);
            return Ok(Side::Outside);
        }
        // Hairpin (RFC 5508 REQ-7): the quoted datagram came from another
        // subscriber's external endpoint; deliver the error to that subscriber.
        let peer = self.tables.find_session_out(q.proto, q.src, q.sport, s.ext_addr, s.ext_port).ok_or(DropReason::IcmpErrorNoMapping)?;
        let p = self.tables.session(peer);
        rewrite::rewrite(frame, q.l3, q.l4, Which::Src, p.int_addr, p.int_port);
        rewrite::rewrite(frame, ip.l3, L4::None, Which::Dst, p.int_addr, 0);
        refill_icmp_checksum(frame, ip);
        Ok(Side::Inside)
    }

    /// A router or host outside reports a problem with a datagram a subscriber sent.
    pub(crate) fn icmp_error_from_outside(&mut self, frame: &mut [u8], ip: &Ip) -> Result<Side, DropReason> {
        let q = validate(frame, ip)?;
        if q.proto == Proto::Sctp {
            let out = self.sctp_icmp_error(frame, ip, q.l3, Side::Outside)?;
            refill_icmp_checksum(frame, ip);
            return Ok(out);
        }
        if q.src != ip.dst {
            return Err(DropReason::IcmpErrorNoMapping);
        }
        let (port, rport) = q.outbound_ports();
        let sid = self.tables.find_session_out(q.proto, q.src, port, q.dst, rport).ok_or(DropReason::IcmpErrorNoMapping)?;
        let s = self.tables.session(sid);
        rewrite::rewrite(frame, q.l3, q.l4, Which::Src, s.int_addr, s.int_port);
        rewrite::rewrite(frame, ip.l3, L4::None, Which::Dst, s.int_addr, 0);
        refill_icmp_checksum(frame, ip);
        Ok(Side::Inside)
    }
}

/// RFC 5508 REQ-3: checks the error's checksum and the quoted IP header, and
/// locates the quoted transport header past any IP options.
fn validate(frame: &[u8], ip: &Ip) -> Result<Quoted, DropReason> {
    if ip.first_frag {
        return Err(DropReason::IcmpErrorFragmented);
    }
    let msg = &frame[ip.l4..ip.l4 + ip.l4_len];
    let m = icmp::Packet::new_checked(msg).map_err(|_| DropReason::L4Truncated)?;
    if !m.verify_checksum() {
        return Err(DropReason::IcmpBadChecksum);
    }
    let q_l3 = ip.l4 + icmp::HEADER_LEN;
    let qip = ipv4::Packet::new_lax(m.quoted()).map_err(|_| DropReason::IcmpEmbeddedInvalid)?;
    if !qip.verify_checksum() || qip.is_fragment() && qip.frag_offset() != 0 {
        return Err(DropReason::IcmpEmbeddedInvalid);
    }
    let hl = qip.header_len();
    let present = m.quoted().len() - hl;
    if present < QUOTED_L4_MIN {
        return Err(DropReason::IcmpEmbeddedInvalid);
    }
    let q_l4 = q_l3 + hl;
    let proto = Proto::from_ip(qip.protocol()).ok_or(DropReason::IcmpErrorNoMapping)?;
    let (sport, dport) = match proto {
        Proto::Tcp | Proto::Udp | Proto::Sctp => (natrix_wire::get_u16_at(frame, q_l4), natrix_wire::get_u16_at(frame, q_l4 + 2)),
        Proto::Icmp => {
            let id = natrix_wire::get_u16_at(frame, q_l4 + icmp::IDENT_OFFSET);
            match icmp::classify(frame[q_l4]) {
                icmp::Class::QueryRequest | icmp::Class::QueryReply => (id, id),
                // RFC 1122: no error is sent about an error, so such a quote is bogus.
                _ => return Err(DropReason::IcmpEmbeddedInvalid),
            }
        }
    };
    let l4 = rewrite::l4_for(qip.protocol(), q_l4, present, true);
    Ok(Quoted { l3: q_l3, proto, src: qip.src_addr(), dst: qip.dst_addr(), sport, dport, l4 })
}

/// The quoted bytes changed under the ICMP checksum; errors are rare and
/// short, so a full recomputation is cheaper to trust than a chain of deltas.
fn refill_icmp_checksum(frame: &mut [u8], ip: &Ip) {
    if let Ok(mut m) = icmp::Packet::new_checked(&mut frame[ip.l4..ip.l4 + ip.l4_len]) {
        m.fill_checksum();
    }
}
