//! The shape most softwire packets have, recognised from fixed offsets so
//! they skip the generic parse: Ethernet (untagged), an IPv6 header with no
//! extension header whose next header is IPv4 (4), to the AFTR, carrying
//! exactly one IPv4 packet without options, whose ECN field the outer
//! one leaves as it is (RFC 6040). Anything else (extension headers,
//! fragments, bytes past the inner packet, options, a congestion mark to
//! carry in) is left to the full decapsulation (`decap`), which checks and
//! counts it.

use std::net::Ipv6Addr;

use natrix_wire::{ethernet, get_u16_at, ipv6};

use super::ecn;

/// Where the IPv6 header of an untagged frame starts.
const L3: usize = ethernet::HEADER_LEN;
/// Where the inner IPv4 packet starts.
pub(crate) const INNER: usize = L3 + ipv6::HEADER_LEN;

/// The B4 (IPv6 source) of `frame` if it is a plain softwire packet to
/// `aftr`, and the length of its inner IPv4 packet. The B4 is not checked
/// (`may_be_b4`).
#[inline]
pub(crate) fn plain_softwire(frame: &[u8], aftr: &Ipv6Addr) -> Option<(Ipv6Addr, usize)> {
    let h = frame.first_chunk::<{ INNER + 20 }>()?;
    let payload = usize::from(get_u16_at(h, L3 + 4));
    let plain = get_u16_at(h, 12) == ethernet::ETHERTYPE_IPV6
        && version_6_keeping_ecn(h)
        && h[L3 + 6] == ipv6::next_header::IPV4
        && h[L3 + 24..INNER] == aftr.octets()
        && h[INNER] == 0x45
        && usize::from(get_u16_at(h, INNER + 2)) == payload
        && INNER + payload <= frame.len();
    if !plain {
        return None;
    }
    let src: [u8; 16] = h[L3 + 8..L3 + 24].try_into().ok()?;
    Some((Ipv6Addr::from(src), payload))
}

/// Whether the IPv6 header of `h` says version 6 and carries an ECN field
/// under which decapsulation leaves the inner one as it is (RFC 6040): an
/// outer Not-ECT, most softwires' (one test, as the version's alone), or
/// any the table keeps.
#[inline(always)]
fn version_6_keeping_ecn(h: &[u8; INNER + 20]) -> bool {
    let w = get_u16_at(h, L3);
    w & 0xf030 == 0x6000 || (w >> 12 == 6 && ecn::kept(h[INNER + 1], (w >> 4) as u8))
}

/// Whether the full parse takes `b4` as a softwire packet's source: what
/// it refuses is its to count.
#[inline]
pub(crate) fn may_be_b4(b4: &Ipv6Addr) -> bool {
    !(b4.is_multicast() || b4.is_unspecified() || b4.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 1);

    fn softwire(dst: Ipv6Addr, trailing: usize) -> Vec<u8> {
        let mut inner = Vec::new();
        etherparse::PacketBuilder::ipv4([192, 0, 0, 2], [198, 51, 100, 7], 64).udp(5000, 53).write(&mut inner, b"0123456789ab").unwrap();
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6([0x20, 0x01, 0x0d, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2], dst.octets(), 64)
            .write(&mut f, etherparse::IpNumber(4), &inner)
            .unwrap();
        f.extend(std::iter::repeat_n(0, trailing));
        f
    }

    #[test]
    fn only_the_plain_shape_is_recognised() {
        let b4: Ipv6Addr = "2001:db8:100::2".parse().unwrap();
        assert_eq!(plain_softwire(&softwire(AFTR, 0), &AFTR), Some((b4, 40)));
        assert_eq!(plain_softwire(&softwire(AFTR, 6), &AFTR), Some((b4, 40)), "Ethernet padding after it");
        assert_eq!(plain_softwire(&softwire("2001:db8::99".parse().unwrap(), 0), &AFTR), None, "another AFTR");
        let mut lying = softwire(AFTR, 0);
        lying[L3 + 5] += 1;
        assert_eq!(plain_softwire(&lying, &AFTR), None, "payload length disagrees with the inner packet");
        let mut options = softwire(AFTR, 0);
        options[INNER] = 0x46;
        assert_eq!(plain_softwire(&options, &AFTR), None);
        let mut ext = softwire(AFTR, 0);
        ext[L3 + 6] = ipv6::next_header::FRAGMENT;
        assert_eq!(plain_softwire(&ext, &AFTR), None);
        assert_eq!(plain_softwire(&softwire(AFTR, 0)[..60], &AFTR), None, "truncated");
        let mut congested = softwire(AFTR, 0);
        congested[L3 + 1] |= ecn::CE << 4;
        assert_eq!(plain_softwire(&congested, &AFTR), None, "CE to carry into the inner packet");
        congested[INNER + 1] |= ecn::CE;
        assert_eq!(plain_softwire(&congested, &AFTR), Some((b4, 40)), "CE both inside and out: nothing to change");
    }
}
