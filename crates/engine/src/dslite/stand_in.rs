//! Swapping a host's inner IPv4 address for its stand-in (on the way in)
//! and back (on the way out), with every checksum the address is under:
//! the IPv4 header, the TCP or UDP pseudo-header, and for an ICMP error the
//! datagram it quotes, whose own addresses are the other way round.

use natrix_wire::checksum::Delta;
use natrix_wire::{get_u16_at, get_u32_at, icmp, ipv4, proto, set_u16_at, tcp, udp};

use crate::pipeline::frame::Ip;
use crate::rewrite::Which;

/// Replaces the `which` address of the datagram `ip` by `addr`. For an ICMP
/// error, the quoted datagram's address on the other side is replaced too
/// when it is the one being replaced (the error is about a datagram that
/// host sent or received).
pub(crate) fn replace(frame: &mut [u8], ip: &Ip, which: Which, addr: u32) {
    let old = replace_in_header(frame, ip.l3, which, addr);
    if ip.later_frag {
        return;
    }
    let d = Delta::from_u32(old, addr);
    patch_transport(frame, ip.proto, ip.l4, ip.l4_len, d);
    if ip.proto == proto::ICMP && ip.l4_len >= icmp::HEADER_LEN && icmp::classify(frame[ip.l4]) == icmp::Class::Error {
        replace_quoted(frame, ip, opposite(which), old, addr);
    }
}

fn opposite(which: Which) -> Which {
    match which {
        Which::Src => Which::Dst,
        Which::Dst => Which::Src,
    }
}

/// Writes `addr` into the IPv4 header at `l3`, patching its checksum;
/// returns the address it replaced.
fn replace_in_header(frame: &mut [u8], l3: usize, which: Which, addr: u32) -> u32 {
    let at = l3 + if which == Which::Src { ipv4::SRC_OFFSET } else { ipv4::DST_OFFSET };
    let old = get_u32_at(frame, at);
    frame[at..at + 4].copy_from_slice(&addr.to_be_bytes());
    let c = l3 + ipv4::CHECKSUM_OFFSET;
    set_u16_at(frame, c, Delta::from_u32(old, addr).apply(get_u16_at(frame, c)));
    old
}

/// The transport checksum covers the addresses through its pseudo-header
/// (TCP and UDP; ICMP has none). A quoted header may stop before it.
fn patch_transport(frame: &mut [u8], p: u8, l4: usize, present: usize, d: Delta) {
    match p {
        proto::TCP if present >= tcp::CHECKSUM_OFFSET + 2 => {
            let c = l4 + tcp::CHECKSUM_OFFSET;
            set_u16_at(frame, c, d.apply(get_u16_at(frame, c)));
        }
        proto::UDP if present >= udp::CHECKSUM_OFFSET + 2 => {
            let c = l4 + udp::CHECKSUM_OFFSET;
            set_u16_at(frame, c, d.apply_udp(get_u16_at(frame, c)));
        }
        _ => {}
    }
}

/// The quoted datagram of an ICMP error: its `which` address, if it is
/// `old`, becomes `addr`; then the ICMP checksum is computed afresh (errors
/// are short and rare).
fn replace_quoted(frame: &mut [u8], ip: &Ip, which: Which, old: u32, addr: u32) {
    let q_l3 = ip.l4 + icmp::HEADER_LEN;
    let end = ip.l4 + ip.l4_len;
    let Ok(q) = ipv4::Packet::new_lax(&frame[q_l3..end]) else { return };
    let (hl, qp, q_addr) = (q.header_len(), q.protocol(), if which == Which::Src { q.src_addr() } else { q.dst_addr() });
    if q_addr != old || q_l3 + hl > end {
        return;
    }
    replace_in_header(frame, q_l3, which, addr);
    patch_transport(frame, qp, q_l3 + hl, end - q_l3 - hl, Delta::from_u32(old, addr));
    if let Ok(mut m) = icmp::Packet::new_checked(&mut frame[ip.l4..end]) {
        m.fill_checksum();
    }
}
