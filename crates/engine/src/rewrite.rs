//! Header rewrites with incremental checksum updates (RFC 1624). Callers have
//! validated the headers; offsets are absolute positions in the frame.

use natrix_wire::checksum::Delta;
use natrix_wire::ipv4::{CHECKSUM_OFFSET as IP_CHECKSUM, DST_OFFSET as IP_DST, SRC_OFFSET as IP_SRC, TTL_OFFSET as IP_TTL};
use natrix_wire::{get_u16_at, get_u32_at, proto, set_u16_at};

/// Where the transport checksum and the rewritten port or identifier live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// Non-first fragment: no transport header here.
    None,
    Tcp {
        at: usize,
        len: usize,
    },
    Udp {
        at: usize,
    },
    /// ICMP query: the identifier plays the port; its checksum has no pseudo-header.
    IcmpQuery {
        at: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Src,
    Dst,
}

fn addr_at(which: Which) -> usize {
    match which {
        Which::Src => IP_SRC,
        Which::Dst => IP_DST,
    }
}

/// Replaces the source or destination address and port (identifier) of the
/// datagram whose IPv4 header is at `l3`, patching every checksum it affects.
pub fn rewrite(frame: &mut [u8], l3: usize, l4: L4, which: Which, addr: u32, port: u16) {
    let addr_delta = replace_addr(frame, l3, which, addr);
    let c = get_u16_at(frame, l3 + IP_CHECKSUM);
    set_u16_at(frame, l3 + IP_CHECKSUM, addr_delta.apply(c));
    rewrite_l4(frame, l4, which, addr_delta, port);
}

/// Where the transport header of a frame without IP options starts.
const SIMPLE_L4: usize = natrix_wire::ethernet::HEADER_LEN + natrix_wire::ipv4::MIN_HEADER_LEN;

/// `rewrite` and the TTL decrement of forwarding in one, for the fast path's
/// frames (Ethernet, IPv4 without options, TCP or UDP, lengths checked):
/// each checksum takes one sum of all its changes, folded once. `TTL`
/// false leaves the TTL to the router's stage, for a frame middlebox
/// functions see between translation and routing.
#[inline(always)]
pub fn rewrite_forward<const TTL: bool>(frame: &mut [u8], tcp: bool, which: Which, addr: u32, port: u16) {
    let patched = patch_forward::<TTL>(frame, tcp, which, addr, port);
    debug_assert!(patched.is_some(), "rewrite_forward: the fast path let through a frame too short for its transport header");
}

/// `rewrite_forward` on a fixed-length view that holds a TCP header (the
/// fast path takes no shorter frame), so no access needs a bounds check. A
/// one's complement sum comes out the same in either byte order (RFC 1071
/// section 2), so every word is read and written in the CPU's own order,
/// without byte swaps. Where the transport checksum lies and UDP's rules for
/// it are selected, not branched on: live traffic mixes TCP and UDP
/// unpredictably.
#[inline(always)]
fn patch_forward<const TTL: bool>(frame: &mut [u8], tcp: bool, which: Which, addr: u32, port: u16) -> Option<()> {
    const L3: usize = natrix_wire::ethernet::HEADER_LEN;
    let f = frame.first_chunk_mut::<{ SIMPLE_L4 + natrix_wire::tcp::MIN_HEADER_LEN }>()?;
    let (a, p) = match which {
        Which::Src => (L3 + IP_SRC, SIMPLE_L4),
        Which::Dst => (L3 + IP_DST, SIMPLE_L4 + 2),
    };
    let (new_addr, new_port) = (addr.to_be_bytes(), port.to_be_bytes());
    let addr_delta = Delta::from_u32(ne_u32(f, a), u32::from_ne_bytes(new_addr));
    let port_delta = Delta::from_u16(ne_u16(f, p), u16::from_ne_bytes(new_port));
    f[a..a + 4].copy_from_slice(&new_addr);
    f[p..p + 2].copy_from_slice(&new_port);
    let ip_delta = if TTL {
        // TTL shares its 16-bit checksum word with the protocol byte.
        let ttl_word = ne_u16(f, L3 + IP_TTL);
        f[L3 + IP_TTL] -= 1;
        addr_delta.plus(Delta::from_u16(ttl_word, ne_u16(f, L3 + IP_TTL)))
    } else {
        addr_delta
    };
    let c = ip_delta.apply(ne_u16(f, L3 + IP_CHECKSUM));
    f[L3 + IP_CHECKSUM..L3 + IP_CHECKSUM + 2].copy_from_slice(&c.to_ne_bytes());
    // Arithmetic on the flag rather than a select keeps the offset's range
    // in the compiler's view, so the accesses need no bounds check.
    const UDP_CHECKSUM: usize = natrix_wire::udp::CHECKSUM_OFFSET;
    const TCP_CHECKSUM: usize = natrix_wire::tcp::CHECKSUM_OFFSET;
    let at = SIMPLE_L4 + UDP_CHECKSUM + usize::from(tcp) * (TCP_CHECKSUM - UDP_CHECKSUM);
    let c = addr_delta.plus(port_delta).apply_transport(ne_u16(f, at), !tcp);
    f[at..at + 2].copy_from_slice(&c.to_ne_bytes());
    Some(())
}

/// A 16-bit word of a fixed-length frame in the CPU's byte order.
#[inline(always)]
fn ne_u16<const N: usize>(f: &[u8; N], at: usize) -> u16 {
    u16::from_ne_bytes([f[at], f[at + 1]])
}

/// A 32-bit word of a fixed-length frame in the CPU's byte order.
#[inline(always)]
pub(crate) fn ne_u32<const N: usize>(f: &[u8; N], at: usize) -> u32 {
    u32::from_ne_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]])
}

/// Writes the new address; returns the checksum difference it makes.
#[inline]
fn replace_addr(frame: &mut [u8], l3: usize, which: Which, addr: u32) -> Delta {
    let a = l3 + addr_at(which);
    let old_addr = get_u32_at(frame, a);
    frame[a..a + 4].copy_from_slice(&addr.to_be_bytes());
    Delta::from_u32(old_addr, addr)
}

/// The transport half of a rewrite: the port (or ICMP identifier), and the
/// transport checksum, which covers the address through the pseudo-header.
#[inline]
fn rewrite_l4(frame: &mut [u8], l4: L4, which: Which, addr_delta: Delta, port: u16) {
    let port_off = match which {
        Which::Src => 0,
        Which::Dst => 2,
    };
    match l4 {
        L4::None => {}
        L4::Tcp { at, len } => {
            let old_port = get_u16_at(frame, at + port_off);
            set_u16_at(frame, at + port_off, port);
            // A TCP header quoted in an ICMP error may stop before its checksum.
            if len >= natrix_wire::tcp::CHECKSUM_OFFSET + 2 {
                let d = addr_delta.plus(Delta::from_u16(old_port, port));
                let ck = at + natrix_wire::tcp::CHECKSUM_OFFSET;
                let c = get_u16_at(frame, ck);
                set_u16_at(frame, ck, d.apply(c));
            }
        }
        L4::Udp { at } => {
            let old_port = get_u16_at(frame, at + port_off);
            set_u16_at(frame, at + port_off, port);
            let d = addr_delta.plus(Delta::from_u16(old_port, port));
            let ck = at + natrix_wire::udp::CHECKSUM_OFFSET;
            let c = get_u16_at(frame, ck);
            set_u16_at(frame, ck, d.apply_udp(c));
        }
        L4::IcmpQuery { at } => {
            let id = at + natrix_wire::icmp::IDENT_OFFSET;
            let old = get_u16_at(frame, id);
            set_u16_at(frame, id, port);
            let ck = at + natrix_wire::icmp::CHECKSUM_OFFSET;
            let c = get_u16_at(frame, ck);
            set_u16_at(frame, ck, Delta::from_u16(old, port).apply(c));
        }
    }
}

/// Decrements the TTL of the header at `l3` (callers checked it is above 1).
pub fn decrement_ttl(frame: &mut [u8], l3: usize) {
    if let Ok(mut ip) = natrix_wire::ipv4::Packet::new_lax(&mut frame[l3..]) {
        ip.decrement_ttl();
    }
}

/// The transport layout for a datagram of protocol `p` at `at` with `len` bytes present.
pub fn l4_for(p: u8, at: usize, len: usize, icmp_query: bool) -> L4 {
    match p {
        proto::TCP => L4::Tcp { at, len },
        proto::UDP => L4::Udp { at },
        proto::ICMP if icmp_query => L4::IcmpQuery { at },
        _ => L4::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tcp: bool, zero_udp_checksum: bool) -> Vec<u8> {
        let b = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4([198, 51, 100, 7], [240, 0, 0, 9], 63);
        let mut f = Vec::new();
        if tcp {
            b.tcp(443, 5000, 1, 1000).ack(2).write(&mut f, b"reply").unwrap();
        } else {
            b.udp(53, 5000).write(&mut f, b"reply reply reply ").unwrap();
        }
        if zero_udp_checksum {
            f[40..42].copy_from_slice(&[0, 0]);
        }
        f
    }

    /// The checksums etherparse computes for the frame as it now is.
    fn checksums_hold(f: &[u8]) -> bool {
        let p = etherparse::SlicedPacket::from_ethernet(f).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else { return false };
        let h = ip.header().to_header();
        let ip_ok = h.header_checksum == h.calc_header_checksum();
        ip_ok
            && match &p.transport {
                Some(etherparse::TransportSlice::Tcp(t)) => t.checksum() == t.to_header().calc_checksum_ipv4(&h, t.payload()).unwrap(),
                Some(etherparse::TransportSlice::Udp(u)) => u.checksum() == u.to_header().calc_checksum_ipv4(&h, u.payload()).unwrap(),
                _ => false,
            }
    }

    /// The fast path's rewrite, with the router's TTL decrement and
    /// without (a frame functions see before routing), keeps both
    /// checksums right under etherparse; a UDP datagram sent without a
    /// checksum keeps none.
    #[test]
    fn the_fast_rewrite_keeps_checksums_right_with_and_without_the_ttl() {
        for (tcp, zero) in [(true, false), (false, false), (false, true)] {
            let mut f = frame(tcp, zero);
            rewrite_forward::<true>(&mut f, tcp, Which::Dst, u32::from_be_bytes([100, 64, 0, 2]), 6000);
            assert_eq!((&f[30..34], &f[36..38], f[22]), (&[100, 64, 0, 2][..], &6000u16.to_be_bytes()[..], 62));
            rewrite_forward::<false>(&mut f, tcp, Which::Src, u32::from_be_bytes([203, 0, 113, 1]), 7000);
            assert_eq!((&f[26..30], &f[34..36], f[22]), (&[203, 0, 113, 1][..], &7000u16.to_be_bytes()[..], 62), "the TTL is left alone");
            if zero {
                assert_eq!(&f[40..42], &[0, 0]);
            } else {
                assert!(checksums_hold(&f), "tcp {tcp}");
            }
        }
    }
}
