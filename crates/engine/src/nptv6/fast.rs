//! NPTv6's fast path: a plain IPv6 frame (untagged, no extension header,
//! not ICMPv6, not to DS-Lite's AFTR or natrix's own addresses nor, with
//! DS-Lite on, IPv4 in IPv6 from inside, not from inside to a binding's
//! prefix, hop limit to spare) whose address a binding maps is
//! translated straight from its fixed header, with the full path's checks
//! of that header made on the bytes. Anything else, and any frame the
//! mapping refuses, is left untouched for the full path, which must decide
//! the same; tests hold the two to that.

use natrix_wire::{ethernet, get_u16_at, ipv6};

use super::binding::Direction;
use super::{Nptv6, DST_AT, SRC_AT};
use crate::Side;

const L3: usize = ethernet::HEADER_LEN;
/// Bytes the fast path reads: Ethernet and the IPv6 fixed header.
const VIEW: usize = L3 + ipv6::HEADER_LEN;
const PAYLOAD_LEN_AT: usize = L3 + 4;
const NEXT_HEADER_AT: usize = L3 + 6;
const HOP_LIMIT_AT: usize = L3 + 7;

impl Nptv6 {
    /// Translates `frame` and decrements its hop limit if it takes the fast
    /// path; false (the frame untouched) when it needs the full path.
    #[inline(always)]
    pub(crate) fn fast_path(&mut self, frame: &mut [u8], arrived: Side) -> bool {
        if self.mappings.is_empty() {
            return false;
        }
        let len = frame.len();
        let Some(h) = frame.first_chunk_mut::<VIEW>() else { return false };
        if get_u16_at(h, 12) != ethernet::ETHERTYPE_IPV6 || h[L3] >> 4 != 6 || VIEW + usize::from(get_u16_at(h, PAYLOAD_LEN_AT)) > len {
            return false;
        }
        let (next_header, hop_limit) = (h[NEXT_HEADER_AT], h[HOP_LIMIT_AT]);
        let dslites = next_header == ipv6::next_header::IPV4 && arrived == Side::Inside && self.aftr.is_some();
        if hop_limit <= 1 || ipv6::is_extension_header(next_header) || next_header == ipv6::next_header::ICMPV6 || dslites {
            return false;
        }
        let (src, dst) = (address(h, L3 + SRC_AT), address(h, L3 + DST_AT));
        if is_martian(src, dst) || self.aftr == Some(dst) || dst == self.own[arrived as usize] {
            return false;
        }
        let (dir, at, addr) = match arrived {
            Side::Inside => (Direction::Outbound, L3 + SRC_AT, src),
            Side::Outside => (Direction::Inbound, L3 + DST_AT, dst),
        };
        // From inside to any binding's prefix (hairpinned, or a site's own
        // destination): the full path's.
        if arrived == Side::Inside && self.mappings.iter().any(|m| m.covers_either(dst)) {
            return false;
        }
        let Some(Ok(mapped)) = self.mappings.iter().find(|m| m.covers(addr, dir)).map(|m| m.map(addr, dir)) else { return false };
        // To the image of natrix's own inside address: the full path's.
        if arrived == Side::Outside && mapped == self.own[Side::Inside as usize] {
            return false;
        }
        h[at..at + 16].copy_from_slice(&mapped.to_be_bytes());
        h[HOP_LIMIT_AT] = hop_limit - 1;
        self.translated[arrived as usize] += 1;
        true
    }
}

#[inline(always)]
fn address(h: &[u8; VIEW], at: usize) -> u128 {
    u128::from_be_bytes(h[at..at + 16].try_into().expect("16 bytes"))
}

/// The full path's martian test (`pipeline::frame`) on bare addresses: a
/// multicast, unspecified or loopback source, an unspecified or loopback
/// destination.
#[inline(always)]
fn is_martian(src: u128, dst: u128) -> bool {
    src >> 120 == 0xff || src <= 1 || dst <= 1
}
