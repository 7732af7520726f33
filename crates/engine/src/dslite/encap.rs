//! Encapsulation towards a B4 (RFC 2473 section 3): the IPv4 packet becomes
//! the payload of an IPv6 packet from the AFTR to the B4, next header 4,
//! hop limit 64. A packet larger than the softwire's MTU is fragmented
//! after encapsulation (RFC 6333 section 5.3, RFC 8200 section 4.5): the
//! inner packet is the fragmentable part, split on 8-byte boundaries.

use std::net::Ipv6Addr;

use natrix_wire::{ethernet, ipv6};

use super::HOP_LIMIT;

/// Where a softwire packet goes: its Ethernet header (MACs as they are,
/// for the link layer to address), the endpoints and the MTU.
pub(crate) struct Softwire<'a> {
    pub eth: &'a [u8],
    pub aftr: Ipv6Addr,
    pub b4: Ipv6Addr,
    pub mtu: u16,
    /// What of the inner TOS byte the outer header carries
    /// (`Dslite::ecn_mask`): the ECN field, or nothing.
    pub ecn_mask: u8,
}

/// Whether `inner` bytes fit in one outer packet of a softwire of `mtu`.
pub(crate) fn fits(mtu: u16, inner: usize) -> bool {
    inner + ipv6::HEADER_LEN <= usize::from(mtu)
}

/// The outer IPv6 header from `aftr` to `b4`, built whole to be written in
/// one go; its ECN field `ecn`, the inner packet's (RFC 6040 section 4.1's
/// normal mode), its DSCP 0.
pub(crate) fn outer_header(aftr: &Ipv6Addr, b4: &Ipv6Addr, next_header: u8, payload_len: usize, ecn: u8) -> [u8; ipv6::HEADER_LEN] {
    let mut h = [0u8; ipv6::HEADER_LEN];
    h[0] = 0x60;
    h[1] = ecn << 4;
    h[4..6].copy_from_slice(&(payload_len as u16).to_be_bytes());
    h[6] = next_header;
    h[7] = HOP_LIMIT;
    h[8..24].copy_from_slice(&aftr.octets());
    h[24..40].copy_from_slice(&b4.octets());
    h
}

impl Softwire<'_> {
    /// Whether `inner` bytes fit in one outer packet.
    pub fn fits(&self, inner: usize) -> bool {
        fits(self.mtu, inner)
    }

    /// Hands `emit` each frame that carries `inner`: one when it fits, else
    /// fragments of the outer packet, all with identification `ident`.
    pub fn encapsulate(&self, inner: &[u8], ident: u32, mut emit: impl FnMut(&mut dyn FnMut(&mut Vec<u8>))) {
        let ecn = inner.get(1).map_or(0, |tos| tos & self.ecn_mask);
        if self.fits(inner.len()) {
            emit(&mut |buf| self.write(buf, ipv6::next_header::IPV4, inner.len(), ecn, |b| b.extend_from_slice(inner)));
            return;
        }
        let per_fragment = (usize::from(self.mtu) - ipv6::HEADER_LEN - ipv6::FRAGMENT_HEADER_LEN) & !7;
        for (i, chunk) in inner.chunks(per_fragment).enumerate() {
            let offset = i * per_fragment;
            let more = offset + chunk.len() < inner.len();
            emit(&mut |buf| {
                self.write(buf, ipv6::next_header::FRAGMENT, ipv6::FRAGMENT_HEADER_LEN + chunk.len(), ecn, |b| {
                    b.extend_from_slice(&[ipv6::next_header::IPV4, 0]);
                    b.extend_from_slice(&((offset as u16) | u16::from(more)).to_be_bytes());
                    b.extend_from_slice(&ident.to_be_bytes());
                    b.extend_from_slice(chunk);
                })
            });
        }
    }

    /// Ethernet, the outer IPv6 header, then `payload` writes the rest.
    fn write(&self, buf: &mut Vec<u8>, next_header: u8, payload_len: usize, ecn: u8, payload: impl FnOnce(&mut Vec<u8>)) {
        buf.clear();
        buf.extend_from_slice(self.eth);
        let l3 = buf.len();
        buf[l3 - 2..l3].copy_from_slice(&ethernet::ETHERTYPE_IPV6.to_be_bytes());
        buf.extend_from_slice(&outer_header(&self.aftr, &self.b4, next_header, payload_len, ecn));
        payload(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softwire(mtu: u16) -> Softwire<'static> {
        const ETH: [u8; 14] = [2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0];
        Softwire { eth: &ETH, aftr: "2001:db8:0:1::1".parse().unwrap(), b4: "2001:db8:100::2".parse().unwrap(), mtu, ecn_mask: 0b11 }
    }

    fn frames(s: &Softwire, inner: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        s.encapsulate(inner, 9, |write| {
            let mut b = Vec::new();
            write(&mut b);
            out.push(b);
        });
        out
    }

    #[test]
    fn a_packet_that_fits_is_one_ipv6_packet_under_etherparse() {
        let inner = [0x45u8; 100];
        let f = frames(&softwire(1500), &inner);
        assert_eq!(f.len(), 1);
        let p = etherparse::SlicedPacket::from_ethernet(&f[0]).unwrap();
        let Some(etherparse::NetSlice::Ipv6(ip)) = p.net else { panic!("not IPv6") };
        assert_eq!(ip.header().next_header(), etherparse::IpNumber(4));
        assert_eq!(ip.header().hop_limit(), 64);
        assert_eq!(ip.header().payload_length(), 100);
        assert_eq!(&f[0][54..], &inner[..]);
    }

    /// RFC 6040 section 4.1, normal mode: the outer ECN field is the
    /// inner one, in every fragment; the outer DSCP is 0. Compatibility
    /// mode: Not-ECT.
    #[test]
    fn the_outer_header_carries_the_inner_ecn_field() {
        for ecn in 0..4u8 {
            for size in [100, 3000] {
                let mut inner = vec![0x45u8; size];
                inner[1] = 0xb8 | ecn;
                for f in frames(&softwire(1280), &inner) {
                    let h = etherparse::Ipv6Header::from_slice(&f[14..]).unwrap().0;
                    assert_eq!(h.traffic_class, ecn, "inner ECN {ecn:02b}, {size} bytes");
                }
                let compatible = Softwire { ecn_mask: 0, ..softwire(1280) };
                for f in frames(&compatible, &inner) {
                    let h = etherparse::Ipv6Header::from_slice(&f[14..]).unwrap().0;
                    assert_eq!(h.traffic_class, 0, "compatibility mode: Not-ECT outside");
                }
            }
        }
    }

    #[test]
    fn a_larger_packet_is_fragmented_on_eight_byte_boundaries_within_the_mtu() {
        let inner: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let f = frames(&softwire(1280), &inner);
        assert_eq!(f.len(), 3);
        let mut rebuilt = Vec::new();
        for (i, fr) in f.iter().enumerate() {
            assert!(fr.len() - 14 <= 1280);
            let h = etherparse::Ipv6Header::from_slice(&fr[14..]).unwrap().0;
            assert_eq!(h.next_header, etherparse::IpNumber(44));
            // RFC 8200 section 4.5 read by hand: etherparse 0.16 places the M flag in the wrong bit.
            let frag = &fr[54..62];
            assert_eq!(frag[0], 4, "the fragmentable part is the IPv4 packet");
            assert_eq!(u32::from_be_bytes([frag[4], frag[5], frag[6], frag[7]]), 9);
            let offset_and_m = u16::from_be_bytes([frag[2], frag[3]]);
            assert_eq!(usize::from(offset_and_m & 0xfff8), rebuilt.len());
            assert_eq!(offset_and_m & 1 == 1, i < 2);
            rebuilt.extend_from_slice(&fr[62..]);
        }
        assert_eq!(rebuilt, inner);
    }
}
