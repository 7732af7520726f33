//! ICMP errors about SCTP packets (RFC 5508 applied to SCTP; RFC 9260
//! appendix C says what an endpoint checks in them): the quoted packet's
//! first 8 bytes hold its ports and verification tag, which find the
//! association; only addresses are translated, the quoted SCTP bytes stay
//! untouched. A quoted INIT (tag 0) is found by its Initiate Tag when the
//! error quotes that far.

use natrix_wire::{get_u16_at, get_u32_at, ipv4, sctp};

use crate::drop::DropReason;
use crate::nat44::Nat44;
use crate::pipeline::frame::Ip;
use crate::rewrite::{self, Which, L4};
use crate::state::associations::Key;
use crate::Side;

/// Where an INIT's Initiate Tag lies, from the SCTP header.
const INIT_TAG_AT: usize = sctp::HEADER_LEN + sctp::CHUNK_HEADER_LEN;

impl Nat44 {
    /// Translates an ICMP error that arrived on `arrived` quoting an SCTP
    /// packet whose IPv4 header is at `q_l3` (validated by the caller);
    /// returns the side it leaves on. The ICMP checksum is the caller's.
    pub(crate) fn sctp_icmp_error(&self, frame: &mut [u8], ip: &Ip, q_l3: usize, arrived: Side) -> Result<Side, DropReason> {
        let q = ipv4::Packet::new_lax(&frame[q_l3..]).map_err(|_| DropReason::IcmpEmbeddedInvalid)?;
        let (q_src, q_dst, q_l4) = (q.src_addr(), q.dst_addr(), q_l3 + q.header_len());
        let (sport, dport, tag) = (get_u16_at(frame, q_l4), get_u16_at(frame, q_l4 + 2), get_u32_at(frame, q_l4 + 4));
        let end = ip.l4 + ip.l4_len;
        let quoted_init_tag = || (end >= q_l4 + INIT_TAG_AT + 4 && frame[q_l4 + sctp::HEADER_LEN] == sctp::chunk::INIT).then(|| get_u32_at(frame, q_l4 + INIT_TAG_AT));
        let found = match arrived {
            // The quoted packet went out from the external address.
            Side::Outside if q_src != ip.dst => None,
            Side::Outside if tag == 0 => quoted_init_tag().and_then(|t| self.assocs.find(Key::OutsideByIntTag, q_src, sport, dport, t, q_dst)),
            Side::Outside => self.assocs.find(Key::OutsideByRemTag, q_src, sport, dport, tag, q_dst),
            // The quoted packet came in to the internal host.
            Side::Inside => self.assocs.find(Key::InsideByIntTag, q_dst, dport, sport, tag, q_src),
        };
        let a = self.assocs.get(found.ok_or(DropReason::IcmpErrorNoMapping)?.id);
        match arrived {
            Side::Outside => {
                rewrite::rewrite(frame, q_l3, L4::None, Which::Src, a.int_addr, 0);
                rewrite::rewrite(frame, ip.l3, L4::None, Which::Dst, a.int_addr, 0);
                Ok(Side::Inside)
            }
            Side::Inside => {
                rewrite::rewrite(frame, q_l3, L4::None, Which::Dst, a.ext_addr, 0);
                rewrite::rewrite(frame, ip.l3, L4::None, Which::Src, a.ext_addr, 0);
                Ok(Side::Outside)
            }
        }
    }
}
