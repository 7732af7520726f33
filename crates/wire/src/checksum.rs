//! Internet checksum: full computation (RFC 1071) and incremental update (RFC 1624),
//! with the IPv4 and IPv6 (RFC 8200 section 8.1) pseudo-headers.

use std::net::Ipv6Addr;

/// One's-complement sum of `data` folded into 32 bits, not yet complemented.
#[inline]
pub fn sum(data: &[u8]) -> u32 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        acc += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        acc += u64::from(u32::from_be_bytes([c[4], c[5], c[6], c[7]]));
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 2 {
        acc += u64::from(u16::from_be_bytes([rest[0], rest[1]]));
        rest = &rest[2..];
    }
    if let Some(&last) = rest.first() {
        acc += u64::from(last) << 8;
    }
    fold64(acc)
}

/// `sum` for a run of whole 32-bit words (a length that is a multiple of
/// 4; a remainder is not summed), as a TCP header's option words are: one
/// addition a word, no tail to handle. For the short runs on the packet path.
#[inline]
pub fn sum_words(data: &[u8]) -> u32 {
    debug_assert_eq!(data.len() % 4, 0, "sum_words: whole 32-bit words");
    let mut acc: u64 = 0;
    for w in data.chunks_exact(4) {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    fold64(acc)
}

/// Folds a 64-bit one's-complement accumulator to 32 bits: the high half
/// added to the low, and the carry of that (at most 1, which cannot carry
/// again) added back. No loop, no branch.
#[inline]
pub(crate) fn fold64(acc: u64) -> u32 {
    let (sum, carry) = (acc as u32).overflowing_add((acc >> 32) as u32);
    sum + u32::from(carry)
}

/// The one's-complement sum of two accumulators (`sum`, a pseudo-header's):
/// a plain `+` of two 32-bit sums can overflow and lose its carry.
#[inline]
pub fn add(a: u32, b: u32) -> u32 {
    fold64(u64::from(a) + u64::from(b))
}

/// Folds a 32-bit one's-complement accumulator to 16 bits.
#[inline]
pub fn fold(mut acc: u32) -> u16 {
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    acc as u16
}

/// The checksum field value for `data` (RFC 1071): complement of the folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data))
}

/// Sum of the IPv4 pseudo-header used by TCP and UDP.
#[inline]
pub fn pseudo_header_sum(src: u32, dst: u32, proto: u8, l4_len: u16) -> u32 {
    let mut acc = 0u64;
    acc += u64::from(src >> 16) + u64::from(src & 0xffff);
    acc += u64::from(dst >> 16) + u64::from(dst & 0xffff);
    acc += u64::from(proto) + u64::from(l4_len);
    fold64(acc)
}

/// Sum of the IPv6 pseudo-header (RFC 8200 section 8.1) used by TCP, UDP and
/// ICMPv6: source address, destination address, the upper-layer packet length
/// as 32 bits, and the upper-layer protocol's next header value (6, 17, 58;
/// never that of an extension header in between). Not yet complemented; add
/// `sum` of the upper-layer bytes and fold, as with `pseudo_header_sum`.
///
/// With a Routing header whose Segments Left is not zero, `dst` must be the
/// final destination (the Routing header's last address), not the header's.
#[inline]
pub fn pseudo_header_sum_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, upper_len: u32) -> u32 {
    let mut acc = 0u64;
    for w in src.segments().into_iter().chain(dst.segments()) {
        acc += u64::from(w);
    }
    acc += u64::from(upper_len >> 16) + u64::from(upper_len & 0xffff);
    acc += u64::from(next_header);
    fold64(acc)
}

/// The checksum field value for an upper-layer packet over IPv6 whose checksum
/// field reads zero: `data` is the whole TCP segment, UDP datagram or ICMPv6
/// message. For UDP use `udp_checksum_v6`, which never yields zero.
#[inline]
pub fn checksum_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, data: &[u8]) -> u16 {
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    !fold(fold64(u64::from(pseudo_header_sum_v6(src, dst, next_header, len)) + u64::from(sum(data))))
}

/// True when the checksum of an upper-layer packet over IPv6 verifies
/// (`data` with its checksum field as received). For UDP use
/// `udp_v6_checksum_ok`, which also refuses a zero field.
#[inline]
pub fn verify_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, data: &[u8]) -> bool {
    let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    fold(fold64(u64::from(pseudo_header_sum_v6(src, dst, next_header, len)) + u64::from(sum(data)))) == 0xffff
}

/// The UDP checksum field value over IPv6 for `datagram` (header and payload,
/// checksum field reading zero): a computed zero is sent as 0xffff (RFC 768,
/// RFC 8200 section 8.1).
#[inline]
pub fn udp_checksum_v6(src: Ipv6Addr, dst: Ipv6Addr, datagram: &[u8]) -> u16 {
    match checksum_v6(src, dst, crate::proto::UDP, datagram) {
        0 => 0xffff,
        c => c,
    }
}

/// Offset of the UDP checksum field, which over IPv6 must not be zero.
const UDP_CHECKSUM_AT: usize = 6;

/// True when a UDP datagram over IPv6 carries a checksum that verifies. A zero
/// field means the sender computed none, which RFC 8200 section 8.1 forbids
/// (the RFC 6935 tunnel exception does not apply to natrix): the receiver must
/// discard such a datagram, so this returns false for it, as it does for a
/// datagram shorter than the 8-byte header. `datagram` ends at the UDP length.
#[inline]
pub fn udp_v6_checksum_ok(src: Ipv6Addr, dst: Ipv6Addr, datagram: &[u8]) -> bool {
    match datagram.get(UDP_CHECKSUM_AT..UDP_CHECKSUM_AT + 2) {
        Some(&[0, 0]) | None => false,
        Some(_) => datagram.len() >= 8 && verify_v6(src, dst, crate::proto::UDP, datagram),
    }
}

/// A precomputed one's-complement difference: adding it to a checksum turns
/// the checksum of the old words into the checksum of the new ones (RFC 1624 eqn. 3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta(u32);

impl Delta {
    /// Difference for replacing a 32-bit word `old` by `new`.
    #[inline]
    pub fn from_u32(old: u32, new: u32) -> Self {
        Delta((!old >> 16) + (!old & 0xffff) + (new >> 16) + (new & 0xffff))
    }

    /// Difference for replacing a 16-bit word `old` by `new`.
    #[inline]
    pub fn from_u16(old: u16, new: u16) -> Self {
        Delta(u32::from(!old) + u32::from(new))
    }

    /// Difference for fields that grow by `by` in all (lengths, a data
    /// offset's nibble), without wrapping: a field's 16-bit words sum, in
    /// one's complement, to its value modulo 0xffff (2^16 is 1 there), so
    /// the difference is `by` itself, with no old or new value to read.
    /// Once applied, the same as `from_u16`/`from_u32` of the fields, but
    /// for one's complement's two zeros when `by` and every other term are 0.
    #[inline]
    pub fn grown_by(by: u16) -> Self {
        Delta(u32::from(by))
    }

    /// Difference for replacing an IPv6 address `old` by `new` (eight 16-bit words).
    #[inline]
    pub fn from_ipv6(old: Ipv6Addr, new: Ipv6Addr) -> Self {
        Delta::from_slices(&old.octets(), &new.octets())
    }

    /// Difference for replacing the bytes `old` by `new`, both starting at the
    /// same even offset of the checksummed data. Where one is longer, the other
    /// counts as zeros there: right when those bytes were or became zero, or
    /// when what else lies there sums the same before and after (a payload
    /// moved by an even number of bytes, as TCP option insertion does).
    #[inline]
    pub fn from_slices(old: &[u8], new: &[u8]) -> Self {
        Delta(u32::from(!fold(sum(old))) + u32::from(fold(sum(new))))
    }

    /// Difference for replacing bytes whose `sum` was `old` by bytes whose
    /// `sum` is `new` (as `from_slices`, for a caller that summed them).
    #[inline]
    pub fn from_sums(old: u32, new: u32) -> Self {
        Delta(u32::from(!fold(old)) + u32::from(fold(new)))
    }

    /// Combines two differences. Unfolded: the few terms of one header
    /// rewrite cannot overflow, and `apply` folds once at the end.
    #[inline]
    #[must_use]
    pub fn plus(self, other: Delta) -> Self {
        Delta(self.0 + other.0)
    }

    /// Applies the difference to a stored checksum field value (RFC 1624: HC' = ~(~HC + ~m + m')).
    #[inline]
    pub fn apply(self, field: u16) -> u16 {
        // A sum of nonnegative terms is zero only if every term is, so one
        // fold at the end gives the same field as folding the delta first.
        !fold(u32::from(!field) + self.0)
    }

    /// Applies the difference to a UDP checksum field, where 0 means "no checksum"
    /// and must stay 0, and a computed 0 is sent as 0xffff (RFC 768).
    #[inline]
    pub fn apply_udp(self, field: u16) -> u16 {
        self.apply_transport(field, true)
    }

    /// `apply_udp` if `udp`, else `apply`, chosen by selects rather than a
    /// branch, for paths that meet TCP and UDP mixed unpredictably. Both
    /// special values are the same in either byte order.
    #[inline]
    pub fn apply_transport(self, field: u16, udp: bool) -> u16 {
        let v = self.apply(field);
        let v = core::hint::select_unpredictable(udp & (v == 0), 0xffff, v);
        core::hint::select_unpredictable(udp & (field == 0), 0, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 1071 section 3 example: words 0001 f203 f4f5 f6f7 sum to ddf2.
    #[test]
    fn adding_two_sums_keeps_the_carry() {
        assert_eq!(add(0xffff_ffff, 1), 1, "the end-around carry");
        // Two runs summed apart and added, as if summed in one.
        let (first, second) = ([0xffu8; 8], [0x9c, 0x26, 0xff, 0xff, 0x50, 0x14, 0x00, 0x00]);
        assert_eq!(fold(add(sum(&first), sum(&second))), fold(sum(&[first, second].concat())));
    }

    #[test]
    fn rfc1071_example_sum() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn word_sums_agree_with_16_bit_sums() {
        // The RFC 1071 example as 32-bit words, then runs whose sums carry
        // out of 32 bits (all ones), as a TCP header's option words can.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum_words(&data)), 0xddf2);
        for len in (0..=40).step_by(4) {
            for fill in [0x00, 0x01, 0x7f, 0xfe, 0xff] {
                let run: Vec<u8> = (0..len).map(|i| if i % 3 == 0 { 0xff } else { fill }).collect();
                let by_u16: u32 = run.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
                assert_eq!(fold(sum_words(&run)), fold(by_u16), "{len} bytes of {fill:#x}");
            }
        }
    }

    #[test]
    fn folding_64_bits_keeps_the_end_around_carry() {
        for acc in [0u64, 1, 0xffff_ffff, 0x1_0000_0000, 0x1_ffff_fffe, 0x1_ffff_ffff, 0xffff_ffff_ffff_ffff, 0x8000_0001_8000_0000] {
            // By hand: 2^32 is 1 in one's complement; the sum is taken mod 2^32 - 1.
            let expect = (acc % 0xffff_ffff) as u32;
            let got = fold64(acc);
            assert!(got == expect || (expect == 0 && got == 0xffff_ffff && acc != 0), "{acc:#x}: {got:#x}");
        }
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(fold(sum(&[0xab])), 0xab00);
        assert_eq!(fold(sum(&[0x12, 0x34, 0x56])), 0x1234 + 0x5600);
    }

    #[test]
    fn incremental_matches_full_recompute() {
        let mut data: Vec<u8> = (0u8..40).map(|i| i.wrapping_mul(37)).collect();
        let before = checksum(&data);
        let old = u32::from_be_bytes([data[12], data[13], data[14], data[15]]);
        let new = 0xcb00_7105u32;
        data[12..16].copy_from_slice(&new.to_be_bytes());
        assert_eq!(Delta::from_u32(old, new).apply(before), checksum(&data));
    }

    #[test]
    fn udp_zero_checksum_stays_zero() {
        assert_eq!(Delta::from_u32(1, 2).apply_udp(0), 0);
        assert_eq!(Delta::from_u32(1, 2).apply_transport(0, true), 0);
        assert_ne!(Delta::from_u32(1, 2).apply_transport(0, false), 0, "TCP has no such rule");
    }

    /// RFC 768: a computed UDP checksum of zero is transmitted as all ones.
    /// Replacing word 0x0000 by 0xffff (the same in one's complement) in data
    /// whose checksum field reads 0xffff computes a checksum of zero.
    #[test]
    fn a_computed_zero_udp_checksum_is_sent_as_all_ones() {
        let d = Delta::from_u16(0x0000, 0xffff);
        assert_eq!(d.apply(0xffff), 0, "the plain update computes zero");
        assert_eq!(d.apply_udp(0xffff), 0xffff);
        assert_eq!(d.apply_transport(0xffff, true), 0xffff);
        assert_eq!(d.apply_transport(0xffff, false), 0);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    const A1: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    const A2: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    // scapy 2.8.0: IPv6(src="2001:db8::1", dst="2001:db8::2", hlim=64)/UDP(sport=5353, dport=53)/b"abcd"
    const V6_UDP: &str = "60000000000c114020010db800000000000000000000000120010db800000000000000000000000214e90035000cca7c61626364";

    #[test]
    fn udp_over_ipv6_matches_scapy_and_etherparse() {
        let b = hex(V6_UDP);
        let mut d = b[40..].to_vec();
        assert_eq!(&d[6..8], &[0xca, 0x7c], "scapy's checksum");
        assert!(verify_v6(A1, A2, 17, &d));
        assert!(udp_v6_checksum_ok(A1, A2, &d));
        d[9] ^= 1;
        assert!(!udp_v6_checksum_ok(A1, A2, &d));
        d[9] ^= 1;
        d[6..8].fill(0);
        assert_eq!(udp_checksum_v6(A1, A2, &d), 0xca7c);
        assert_eq!(checksum_v6(A1, A2, 17, &d), 0xca7c);
        let (h, payload) = etherparse::UdpHeader::from_slice(&b[40..]).unwrap();
        let (ip, _) = etherparse::Ipv6Header::from_slice(&b).unwrap();
        assert_eq!(h.calc_checksum_ipv6(&ip, payload).unwrap(), 0xca7c);
        // The pseudo-header by hand: addresses' words, the 32-bit length, the next header.
        let by_hand: u32 = A1.segments().iter().chain(A2.segments().iter()).map(|&w| u32::from(w)).sum::<u32>() + 12 + 17;
        assert_eq!(fold(pseudo_header_sum_v6(A1, A2, 17, 12)), fold(by_hand));
        // A length past 16 bits counts both of its words.
        assert_eq!(fold(pseudo_header_sum_v6(A1, A2, 17, 0x0001_0002)), fold(by_hand - 12 + 1 + 2));
    }

    /// RFC 8200 section 8.1: a zero UDP checksum over IPv6 is refused, and a
    /// computed zero goes out as 0xffff.
    #[test]
    fn a_zero_udp_checksum_over_ipv6_is_refused() {
        let mut d = hex(V6_UDP)[40..].to_vec();
        d[6..8].fill(0);
        assert!(!udp_v6_checksum_ok(A1, A2, &d));
        assert!(!udp_v6_checksum_ok(A1, A2, &d[..7]));
        assert!(!udp_v6_checksum_ok(A1, A2, &[]));
        // A payload word raised by the checksum (one's complement addition)
        // makes the sum all ones, so the computed checksum is zero: 0xffff is
        // sent instead, and verifies.
        let c = checksum_v6(A1, A2, 17, &d);
        let t = u32::from(u16::from_be_bytes([d[8], d[9]])) + u32::from(c);
        let w = ((t & 0xffff) + (t >> 16)) as u16;
        d[8..10].copy_from_slice(&w.to_be_bytes());
        assert_eq!(checksum_v6(A1, A2, 17, &d), 0);
        assert_eq!(udp_checksum_v6(A1, A2, &d), 0xffff);
        d[6..8].copy_from_slice(&[0xff, 0xff]);
        assert!(udp_v6_checksum_ok(A1, A2, &d));
    }

    #[test]
    fn ipv6_address_delta_matches_full_recompute() {
        let b = hex(V6_UDP);
        let d = b[40..].to_vec();
        let new = Ipv6Addr::new(0xfd01, 0x203, 0x405, 1, 0, 0, 0, 0x1234);
        let c = u16::from_be_bytes([d[6], d[7]]);
        let updated = Delta::from_ipv6(A1, new).apply(c);
        let mut z = d.clone();
        z[6..8].fill(0);
        assert_eq!(updated, checksum_v6(new, A2, 17, &z));
        // from_slices on data of uneven lengths, extended with zeros.
        let old = [0x12, 0x34, 0x56];
        let new = [0xab, 0xcd, 0xef, 0x01, 0x02];
        let mut data = [0u8; 8];
        data[2..5].copy_from_slice(&old);
        let before = checksum(&data);
        data[2..7].copy_from_slice(&new);
        assert_eq!(Delta::from_slices(&old, &new).apply(before), checksum(&data));
    }

    proptest::proptest! {
        #[test]
        fn incremental_equals_full(mut data in proptest::collection::vec(proptest::num::u8::ANY, 8..64),
                                   at in 0usize..3, new16 in proptest::num::u16::ANY, new32 in proptest::num::u32::ANY) {
            let before = checksum(&data);
            let off = at * 2;
            let old16 = u16::from_be_bytes([data[off], data[off + 1]]);
            data[off..off + 2].copy_from_slice(&new16.to_be_bytes());
            let oldw = u32::from_be_bytes([data[4], data[5], data[6], data[7]]);
            data[4..8].copy_from_slice(&new32.to_be_bytes());
            let delta = Delta::from_u16(old16, new16).plus(Delta::from_u32(oldw, new32));
            // One's-complement has two zeros; compare the folded values' meaning.
            let inc = delta.apply(before);
            let full = checksum(&data);
            proptest::prop_assert!(inc == full || (inc ^ full) == 0xffff && (inc == 0 || full == 0),
                "inc {:04x} full {:04x}", inc, full);
        }

        /// A length field that grows: `grown_by` gives the checksum a full
        /// recomputation gives, and what `from_u16` of the field gives.
        #[test]
        fn a_grown_field_equals_full(mut data in proptest::collection::vec(proptest::num::u8::ANY, 8..64),
                                     at in 0usize..4, by in proptest::num::u16::ANY) {
            let off = at * 2;
            let old = u16::from_be_bytes([data[off], data[off + 1]]);
            // Grown by at least one (as an insertion grows lengths), and no carry.
            proptest::prop_assume!(old < u16::MAX);
            let by = 1 + by % (u16::MAX - old);
            let before = checksum(&data);
            data[off..off + 2].copy_from_slice(&(old + by).to_be_bytes());
            let (inc, full) = (Delta::grown_by(by).apply(before), checksum(&data));
            proptest::prop_assert!(inc == full || (inc ^ full) == 0xffff && (inc == 0 || full == 0),
                "inc {:04x} full {:04x}", inc, full);
            proptest::prop_assert_eq!(inc, Delta::from_u16(old, old + by).apply(before));
        }
    }
}
