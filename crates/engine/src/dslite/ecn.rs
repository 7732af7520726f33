//! ECN across the softwire (RFC 6040). Encapsulation is the normal mode
//! (section 4.1): the outer header carries a copy of the inner packet's
//! ECN field, so congestion the access network marks is seen. At
//! decapsulation (section 4.2) the outer field's congestion mark is
//! carried into the inner packet, and a CE mark on a packet whose sender
//! is not ECN-capable drops it, the only signal such a sender understands.
//! Outer fragments keep a CE mark, as RFC 3168 section 5.3 asks; a mix of
//! ECN-capable and not is dropped, and ECT(0) with ECT(1) counts as the
//! first fragment's (natrix's choices, as Linux's).

use natrix_wire::checksum::Delta;
use natrix_wire::{get_u16_at, ipv4};

pub(crate) const NOT_ECT: u8 = 0b00;
pub(crate) const ECT1: u8 = 0b01;
pub(crate) const ECT0: u8 = 0b10;
pub(crate) const CE: u8 = 0b11;

/// The ECN field of an IPv6 header (the low two bits of its traffic class).
#[inline]
pub(crate) fn of_ipv6(header: &[u8]) -> u8 {
    (header[1] >> 4) & 0b11
}

/// The ECN field of an IPv4 header (the low two bits of its TOS byte).
#[inline]
pub(crate) fn of_ipv4(header: &[u8]) -> u8 {
    header[1] & 0b11
}

/// The ECN field the inner packet leaves with (RFC 6040 figure 4), None
/// when it must be dropped (CE on a packet that is not ECN-capable).
#[inline]
pub(crate) const fn decapsulated(inner: u8, outer: u8) -> Option<u8> {
    match (inner, outer) {
        (NOT_ECT, CE) => None,
        (NOT_ECT, _) => Some(NOT_ECT),
        (_, CE) => Some(CE),
        (ECT0, ECT1) => Some(ECT1),
        (inner, _) => Some(inner),
    }
}

/// The combinations RFC 6040 figure 4 marks "(!!!)": no compliant
/// encapsulator makes them, so the decapsulator SHOULD log them (section
/// 4.2). natrix counts them (`dslite_ecn_unexpected`); Not-ECT inside CE
/// is dropped as well.
pub(crate) const fn unexpected(inner: u8, outer: u8) -> bool {
    matches!((inner, outer), (NOT_ECT, ECT0 | ECT1 | CE) | (CE, ECT1))
}

/// Bit `inner << 2 | outer` is set where decapsulation leaves the inner
/// field as it is and there is nothing to count: the fast path's test, a
/// shift and a mask per packet.
const KEPT: u16 = {
    let mut table = 0u16;
    let mut i = 0u8;
    while i < 16 {
        let (inner, outer) = (i >> 2, i & 3);
        if let Some(e) = decapsulated(inner, outer) {
            if e == inner && !unexpected(inner, outer) {
                table |= 1 << i;
            }
        }
        i += 1;
    }
    table
};

/// Whether decapsulation leaves the inner ECN field `inner` as it is
/// under the outer `outer` (`decapsulated(inner, outer) == Some(inner)`)
/// and the combination is not one to count.
#[inline(always)]
pub(crate) fn kept(inner: u8, outer: u8) -> bool {
    KEPT >> ((inner & 3) << 2 | (outer & 3)) & 1 != 0
}

/// Writes `ecn` into the IPv4 header at the start of `header`, its checksum updated.
pub(crate) fn set_ipv4(header: &mut [u8], ecn: u8) {
    let old = get_u16_at(header, 0);
    header[1] = (header[1] & !0b11) | ecn;
    let delta = Delta::from_u16(old, get_u16_at(header, 0));
    let sum = delta.apply(get_u16_at(header, ipv4::CHECKSUM_OFFSET));
    header[ipv4::CHECKSUM_OFFSET..ipv4::CHECKSUM_OFFSET + 2].copy_from_slice(&sum.to_be_bytes());
}

/// The ECN codepoints seen in a packet's outer fragments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FragmentMarks {
    /// Bit `1 << ecn` for each codepoint seen.
    seen: u8,
    /// The first fragment's (offset 0), once it arrived.
    first: Option<u8>,
}

impl FragmentMarks {
    pub fn add(&mut self, ecn: u8, offset: usize) {
        self.seen |= 1 << ecn;
        if offset == 0 {
            self.first = Some(ecn);
        }
    }

    /// The outer ECN of the reassembled packet: CE when any fragment was
    /// (RFC 3168 section 5.3), else the first fragment's; None when
    /// ECN-capable fragments came with ones that were not, which is dropped.
    pub fn combined(&self) -> Option<u8> {
        let not_ect = self.seen & (1 << NOT_ECT) != 0;
        if not_ect && self.seen != 1 << NOT_ECT {
            return None;
        }
        if self.seen & (1 << CE) != 0 {
            return Some(CE);
        }
        self.first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6040 figure 4, rows the inner field, columns the outer
    /// (Not-ECT, ECT(0), ECT(1), CE).
    #[test]
    fn decapsulation_follows_rfc_6040_figure_4() {
        let columns = [NOT_ECT, ECT0, ECT1, CE];
        let table = [
            (NOT_ECT, [Some(NOT_ECT), Some(NOT_ECT), Some(NOT_ECT), None]),
            (ECT0, [Some(ECT0), Some(ECT0), Some(ECT1), Some(CE)]),
            (ECT1, [Some(ECT1), Some(ECT1), Some(ECT1), Some(CE)]),
            (CE, [Some(CE), Some(CE), Some(CE), Some(CE)]),
        ];
        for (inner, row) in table {
            for (outer, want) in columns.into_iter().zip(row) {
                assert_eq!(decapsulated(inner, outer), want, "inner {inner:02b}, outer {outer:02b}");
            }
        }
    }

    /// RFC 6040 figure 4's "(!!!)" cells, and no other.
    #[test]
    fn the_combinations_to_log_are_figure_4s() {
        let columns = [NOT_ECT, ECT0, ECT1, CE];
        let table = [(NOT_ECT, [false, true, true, true]), (ECT0, [false, false, false, false]), (ECT1, [false, false, false, false]), (CE, [false, false, true, false])];
        for (inner, row) in table {
            for (outer, want) in columns.into_iter().zip(row) {
                assert_eq!(unexpected(inner, outer), want, "inner {inner:02b}, outer {outer:02b}");
            }
        }
    }

    #[test]
    fn the_fast_paths_table_agrees_with_figure_4() {
        for inner in 0..4 {
            for outer in 0..4 {
                let plain = decapsulated(inner, outer) == Some(inner) && !unexpected(inner, outer);
                assert_eq!(kept(inner, outer), plain, "inner {inner:02b}, outer {outer:02b}");
            }
        }
    }

    #[test]
    fn the_ipv4_checksum_follows_the_ecn_field() {
        let mut h = [0x45, 0xb8, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 192, 0, 0, 2, 198, 51, 100, 7];
        let sum = natrix_wire::checksum::checksum(&h);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
        set_ipv4(&mut h, CE);
        assert_eq!(h[1], 0xbb, "DSCP kept");
        assert!(etherparse::Ipv4HeaderSlice::from_slice(&h).is_ok());
        assert_eq!(natrix_wire::checksum::checksum(&h), 0, "the header sums to zero");
    }

    #[test]
    fn fragments_keep_a_ce_mark_and_mixes_with_not_ect_are_dropped() {
        let marks = |list: &[(u8, usize)]| {
            let mut m = FragmentMarks::default();
            list.iter().for_each(|&(e, o)| m.add(e, o));
            m.combined()
        };
        assert_eq!(marks(&[(ECT0, 0), (CE, 1232), (ECT0, 2464)]), Some(CE));
        assert_eq!(marks(&[(ECT1, 1232), (ECT0, 0)]), Some(ECT0), "the first fragment's");
        assert_eq!(marks(&[(NOT_ECT, 0), (NOT_ECT, 1232)]), Some(NOT_ECT));
        assert_eq!(marks(&[(NOT_ECT, 0), (ECT0, 1232)]), None, "ECN-capable and not: dropped");
        assert_eq!(marks(&[(CE, 0), (NOT_ECT, 1232)]), None);
    }
}
