//! Decapsulation (RFC 2473 section 3.2, RFC 6333 section 6.3): a softwire
//! packet from an accepted B4 gives up its inner IPv4 packet, after
//! reassembly when the B4 fragmented it, as an Ethernet/IPv4 frame built
//! beside the original for the NAPT44 stages.

use std::net::Ipv6Addr;

use natrix_wire::{ethernet, ipv6};

use super::reassembly::Piece;
use super::{ecn, ipv6_src, Dslite};
use crate::drop::DropReason;
use crate::pipeline::frame::Ip6;

/// Builds into `out` the Ethernet/IPv4 frame the softwire packet `ip`
/// carries: Ok(Some(b4)) when there is one, Ok(None) when the packet is a
/// fragment that waits for the rest.
pub(crate) fn decapsulate(ds: &mut Dslite, frame: &[u8], ip: &Ip6, now_ns: u64, out: &mut Vec<u8>) -> Result<Option<Ipv6Addr>, DropReason> {
    let b4 = ipv6_src(frame, ip.l3);
    if !ds.cfg.accepts(b4) {
        return Err(DropReason::DsliteB4Refused);
    }
    let end = ip.l3 + ip.total;
    let packet = ipv6::Packet::new_checked(&frame[ip.l3..end]).map_err(|_| DropReason::Ipv6Truncated)?;
    let upper = packet.upper_layer().map_err(|_| DropReason::Ipv6BadHeader)?;
    let start_frame = |out: &mut Vec<u8>| {
        out.clear();
        out.extend_from_slice(&frame[..ip.l3]);
        out[ip.l3 - 2..ip.l3].copy_from_slice(&ethernet::ETHERTYPE_IPV4.to_be_bytes());
    };
    let outer_ecn = ecn::of_ipv6(&frame[ip.l3..]);
    let outer_ecn = match upper.fragment.filter(|f| !f.is_atomic()) {
        None => {
            start_frame(out);
            out.extend_from_slice(&frame[ip.l4..end]);
            Some(outer_ecn)
        }
        Some(f) if frame[ip.l3 + f.header_at] != ipv6::next_header::IPV4 => return Err(DropReason::DsliteBadFragment),
        Some(f) => {
            let data_at = ip.l3 + f.header_at + ipv6::FRAGMENT_HEADER_LEN;
            let piece = Piece { b4, ident: f.ident, offset: usize::from(f.offset), more: f.more, ecn: outer_ecn, data: &frame[data_at..end] };
            let Some(whole) = ds.reassembly.add(piece, now_ns)? else { return Ok(None) };
            ds.stats.reassembled += 1;
            start_frame(out);
            out.extend_from_slice(&whole.packet);
            whole.marks.combined()
        }
    };
    if carry_congestion(&mut out[ip.l3..], outer_ecn)? {
        ds.stats.ecn_unexpected += 1;
    }
    ds.stats.decapsulated += 1;
    Ok(Some(b4))
}

/// Gives the inner IPv4 packet `inner` the ECN field RFC 6040 makes of its
/// own and the outer one (None: fragments that disagreed, RFC 3168 section
/// 5.3); Err when it is dropped for it, Ok(true) when the two make a
/// combination RFC 6040 asks to log. An inner packet too short for its
/// header is left to NAPT44's checks.
fn carry_congestion(inner: &mut [u8], outer: Option<u8>) -> Result<bool, DropReason> {
    if inner.len() < natrix_wire::ipv4::MIN_HEADER_LEN || inner[0] >> 4 != 4 {
        return Ok(false);
    }
    let own = ecn::of_ipv4(inner);
    let unexpected = outer.is_some_and(|outer| ecn::unexpected(own, outer));
    match outer.and_then(|outer| ecn::decapsulated(own, outer)) {
        Some(e) if e == own => Ok(unexpected),
        Some(e) => {
            ecn::set_ipv4(inner, e);
            Ok(unexpected)
        }
        None => Err(DropReason::DsliteEcnNotEctCe),
    }
}
