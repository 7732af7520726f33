//! Internet checksum: full computation (RFC 1071) and incremental update (RFC 1624).

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

#[inline]
fn fold64(mut acc: u64) -> u32 {
    while acc >> 32 != 0 {
        acc = (acc & 0xffff_ffff) + (acc >> 32);
    }
    acc as u32
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
    fn rfc1071_example_sum() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
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
    }
}
