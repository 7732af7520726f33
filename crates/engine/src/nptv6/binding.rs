//! One NPTv6 binding (RFC 6296 section 3): an inside and an outside prefix
//! of equal length, and what translating between them takes, computed once
//! when the table is built: the masks and the checksum-neutral adjustment
//! for each direction (sections 3.2 to 3.5).
//!
//! An address is handled as a `u128` in network order, so a prefix is one
//! mask and one OR, and its 16-bit words are shifts of it.

use std::net::Ipv6Addr;

/// The longest prefix RFC 6296's checksum-neutral mapping takes: the
/// adjustment must land in a word outside the prefix (section 3.5 ends at /64).
pub const MAX_PREFIX_LEN: u8 = 64;

/// Up to this length the adjustment goes into the subnet word, bits 48-63
/// (section 3.4); past it, into the interface identifier (section 3.5).
const SUBNET_WORD_MAX_LEN: u8 = 48;
/// Index of the subnet word (bits 48-63) among the address's eight 16-bit words.
const SUBNET_WORD: u32 = 3;
/// The interface identifier's words (bits 64-127), first to last.
const IID_WORDS: std::ops::Range<u32> = 4..8;

/// IPv6 multicast (RFC 4291 section 2.7), which no binding may touch.
const MULTICAST: (Ipv6Addr, u8) = (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8);

/// An operator's `[[nptv6]]` entry, typed: both prefixes carry `prefix_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub inside: Ipv6Addr,
    pub outside: Ipv6Addr,
    pub prefix_len: u8,
}

/// Why a list of bindings cannot be put in force: which binding (its index),
/// which of its prefixes ("inside" or "outside"), and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingProblem {
    pub index: usize,
    pub prefix: &'static str,
    pub problem: String,
}

/// The one check of a binding list, for the control plane's messages and
/// the engine's own refusal: lengths from /1 to /64, no host bits, and no
/// prefix that overlaps another (of any binding, its own pair included), so
/// that every address has at most one mapping in each direction.
pub fn check_bindings(bindings: &[Binding]) -> Result<(), BindingProblem> {
    let problem = |index, prefix, problem: String| Err(BindingProblem { index, prefix, problem });
    for (i, b) in bindings.iter().enumerate() {
        if !(1..=MAX_PREFIX_LEN).contains(&b.prefix_len) {
            return problem(i, "inside", format!("prefix length /{} is not 1-{MAX_PREFIX_LEN} (RFC 6296's checksum-neutral mapping)", b.prefix_len));
        }
        for (prefix, addr) in [("inside", b.inside), ("outside", b.outside)] {
            let net = u128::from(addr) & mask(b.prefix_len);
            if net != u128::from(addr) {
                return problem(i, prefix, format!("{addr}/{} has host bits set; did you mean {}/{}?", b.prefix_len, Ipv6Addr::from(net), b.prefix_len));
            }
        }
        for (prefix, addr) in [("inside", b.inside), ("outside", b.outside)] {
            if overlaps((addr, b.prefix_len), MULTICAST) {
                return problem(i, prefix, format!("{addr}/{} overlaps the multicast range ff00::/8: NPTv6 maps unicast prefixes", b.prefix_len));
            }
        }
        if overlaps((b.inside, b.prefix_len), (b.outside, b.prefix_len)) {
            return problem(i, "outside", format!("{}/{} overlaps its own inside prefix {}/{}", b.outside, b.prefix_len, b.inside, b.prefix_len));
        }
        for (j, earlier) in bindings[..i].iter().enumerate() {
            for (prefix, addr) in [("inside", b.inside), ("outside", b.outside)] {
                for (other, other_addr) in [("inside", earlier.inside), ("outside", earlier.outside)] {
                    if overlaps((addr, b.prefix_len), (other_addr, earlier.prefix_len)) {
                        return problem(i, prefix, format!("{addr}/{} overlaps nptv6[{j}].{other} {other_addr}/{}", b.prefix_len, earlier.prefix_len));
                    }
                }
            }
        }
    }
    Ok(())
}

fn overlaps((a, a_len): (Ipv6Addr, u8), (b, b_len): (Ipv6Addr, u8)) -> bool {
    let m = mask(a_len.min(b_len));
    u128::from(a) & m == u128::from(b) & m
}

/// The network mask of a prefix length, as a `u128` in network order.
fn mask(len: u8) -> u128 {
    match len {
        0 => 0,
        l => u128::MAX << (128 - u32::from(l.min(128))),
    }
}

/// Which way an address is mapped: inside to outside (a source leaving
/// outside), or outside to inside (a destination coming in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    Outbound = 0,
    Inbound = 1,
}

/// A binding ready for the packet path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapping {
    mask: u128,
    /// The prefix an address is mapped from, and to, by direction.
    from: [u128; 2],
    to: [u128; 2],
    /// The one's-complement value added to the adjustment word, by direction.
    adjustment: [u16; 2],
    /// True for /48 and shorter: the subnet word takes the adjustment.
    in_subnet_word: bool,
}

/// An address that RFC 6296 gives no mapping: its subnet word (/48 and
/// shorter) or all four interface-identifier words (longer) are 0xFFFF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unmappable;

impl Mapping {
    /// Section 3.2: the adjustment outbound is the one's-complement sum of
    /// the inside prefix less that of the outside prefix, so that the
    /// address's sum, and every checksum over it, stays the same; inbound
    /// it is the opposite.
    pub fn new(b: &Binding) -> Mapping {
        let m = mask(b.prefix_len);
        let (inside, outside) = (u128::from(b.inside) & m, u128::from(b.outside) & m);
        let (sum_in, sum_out) = (ones_sum(inside), ones_sum(outside));
        Mapping {
            mask: m,
            from: [inside, outside],
            to: [outside, inside],
            adjustment: [ones_add(sum_in, !sum_out), ones_add(sum_out, !sum_in)],
            in_subnet_word: b.prefix_len <= SUBNET_WORD_MAX_LEN,
        }
    }

    /// True when `addr` lies in the prefix this direction maps from.
    #[inline(always)]
    pub fn covers(&self, addr: u128, dir: Direction) -> bool {
        addr & self.mask == self.from[dir as usize]
    }

    /// True when `addr` lies in either prefix: one mask for both.
    #[inline(always)]
    pub fn covers_either(&self, addr: u128) -> bool {
        let prefix = addr & self.mask;
        prefix == self.from[0] || prefix == self.from[1]
    }

    /// Maps `addr`, which `covers` this direction's prefix: the prefix
    /// replaced, then the adjustment added to the word RFC 6296 chooses
    /// (sections 3.4 and 3.5), a result of 0xFFFF written as 0x0000.
    #[inline(always)]
    pub fn map(&self, addr: u128, dir: Direction) -> Result<u128, Unmappable> {
        let d = dir as usize;
        let word = self.adjustment_word(addr)?;
        let shift = 112 - 16 * word;
        let old = (addr >> shift) as u16;
        let new = match ones_add(old, self.adjustment[d]) {
            0xffff => 0,
            w => w,
        };
        let rewritten = (addr & !self.mask) | self.to[d];
        Ok(rewritten & !(0xffff << shift) | u128::from(new) << shift)
    }

    /// The index of the word that takes the adjustment. 0xFFFF there is
    /// one's-complement zero, like 0x0000, so such an address cannot be
    /// told apart from another once mapped: it has no mapping.
    #[inline(always)]
    fn adjustment_word(&self, addr: u128) -> Result<u32, Unmappable> {
        if self.in_subnet_word {
            return if word(addr, SUBNET_WORD) == 0xffff { Err(Unmappable) } else { Ok(SUBNET_WORD) };
        }
        IID_WORDS.into_iter().find(|&i| word(addr, i) != 0xffff).ok_or(Unmappable)
    }
}

/// Word `i` (0 = bits 0-15) of an address.
#[inline(always)]
fn word(addr: u128, i: u32) -> u16 {
    (addr >> (112 - 16 * i)) as u16
}

/// One's-complement sum of the eight words of an address.
fn ones_sum(addr: u128) -> u16 {
    (0..8).fold(0, |acc, i| ones_add(acc, word(addr, i)))
}

/// One's-complement addition of two 16-bit words (end-around carry).
#[inline(always)]
fn ones_add(a: u16, b: u16) -> u16 {
    let s = u32::from(a) + u32::from(b);
    ((s & 0xffff) + (s >> 16)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn binding(inside: &str, outside: &str, prefix_len: u8) -> Binding {
        Binding { inside: a(inside), outside: a(outside), prefix_len }
    }

    fn map(m: &Mapping, addr: &str, dir: Direction) -> Result<Ipv6Addr, Unmappable> {
        m.map(u128::from(a(addr)), dir).map(Ipv6Addr::from)
    }

    /// RFC 6296 section 3.6, word for word: fd01:203:405:1::1234 becomes
    /// 2001:db8:1:d550::1234 with adjustment 0xD54F, and back.
    #[test]
    fn the_rfc_example_comes_out_exactly() {
        let m = Mapping::new(&binding("fd01:203:405::", "2001:db8:1::", 48));
        assert_eq!(m.adjustment[Direction::Outbound as usize], 0xd54f);
        assert_eq!(map(&m, "fd01:203:405:1::1234", Direction::Outbound), Ok(a("2001:db8:1:d550::1234")));
        assert_eq!(map(&m, "2001:db8:1:d550::1234", Direction::Inbound), Ok(a("fd01:203:405:1::1234")));
    }

    #[test]
    fn an_adjusted_word_of_ffff_is_written_as_zero_and_maps_back() {
        let m = Mapping::new(&binding("fd01:203:405::", "2001:db8:1::", 48));
        // 0xD54F + 0x2AB0 = 0xFFFF: that subnet comes out as 0x0000.
        let out = map(&m, "fd01:203:405:2ab0::1", Direction::Outbound).unwrap();
        assert_eq!(out, a("2001:db8:1::1"));
        assert_eq!(map(&m, "2001:db8:1::1", Direction::Inbound), Ok(a("fd01:203:405:2ab0::1")));
    }

    #[test]
    fn subnet_ffff_has_no_mapping_in_either_direction() {
        let m = Mapping::new(&binding("fd01:203:405::", "2001:db8:1::", 48));
        assert_eq!(map(&m, "fd01:203:405:ffff::1", Direction::Outbound), Err(Unmappable));
        assert_eq!(map(&m, "2001:db8:1:ffff::1", Direction::Inbound), Err(Unmappable));
    }

    #[test]
    fn longer_prefixes_adjust_the_first_iid_word_that_is_not_ffff() {
        let m = Mapping::new(&binding("fd01:203:405:600::", "2001:db8:1:100::", 56));
        let adj = m.adjustment[0];
        let out = u128::from(map(&m, "fd01:203:405:6aa:ffff:ffff:1:2", Direction::Outbound).unwrap());
        assert_eq!(word(out, 3), 0x01aa, "the subnet bits past the prefix stay");
        assert_eq!((word(out, 4), word(out, 5)), (0xffff, 0xffff));
        assert_eq!(word(out, 6), ones_add(1, adj));
        assert_eq!(map(&m, "fd01:203:405:6aa:ffff:ffff:ffff:ffff", Direction::Outbound), Err(Unmappable));
        assert_eq!(map(&m, "2001:db8:1:1aa:ffff:ffff:ffff:ffff", Direction::Inbound), Err(Unmappable));
    }

    #[test]
    fn bindings_are_checked() {
        let ok = binding("fd01:203:405::", "2001:db8:1::", 48);
        check_bindings(&[ok, binding("fd02::", "2001:db8:2::", 48)]).unwrap();
        let p = check_bindings(&[binding("fd01::", "2001:db8::", 65)]).unwrap_err();
        assert!(p.problem.contains("/65"), "{p:?}");
        let p = check_bindings(&[binding("fd01:203:405:1::", "2001:db8:1::", 48)]).unwrap_err();
        assert_eq!((p.index, p.prefix), (0, "inside"));
        assert!(p.problem.contains("did you mean fd01:203:405::/48"), "{p:?}");
        let p = check_bindings(&[ok, binding("fd01:203::", "2001:db9::", 32)]).unwrap_err();
        assert_eq!((p.index, p.prefix), (1, "inside"));
        assert!(p.problem.contains("nptv6[0].inside"), "{p:?}");
        let p = check_bindings(&[ok, binding("fd02::", "2001:db8:1:5::", 64)]).unwrap_err();
        assert_eq!((p.index, p.prefix), (1, "outside"));
        let p = check_bindings(&[binding("fd01::", "ff0e::", 16)]).unwrap_err();
        assert!(p.problem.contains("multicast"), "{p:?}");
        let p = check_bindings(&[binding("2001:db8::", "2001:db8::", 32)]).unwrap_err();
        assert!(p.problem.contains("its own inside"), "{p:?}");
    }

    fn any_binding() -> impl Strategy<Value = Binding> {
        (1u8..=64, any::<u128>(), any::<u128>())
            .prop_map(|(len, i, o)| Binding { inside: Ipv6Addr::from(i & mask(len)), outside: Ipv6Addr::from(o & mask(len)), prefix_len: len })
            .prop_filter("distinct prefixes", |b| check_bindings(&[*b]).is_ok())
    }

    proptest! {
        /// Any binding and any host in it: the mapped address has the
        /// outside prefix, the same one's-complement sum (so any checksum
        /// over it still verifies), and maps back to the original.
        #[test]
        fn mapping_is_checksum_neutral_and_round_trips(b in any_binding(), host in any::<u128>()) {
            let m = Mapping::new(&b);
            let addr = u128::from(b.inside) | host & !mask(b.prefix_len);
            prop_assert!(m.covers(addr, Direction::Outbound));
            match m.map(addr, Direction::Outbound) {
                Ok(out) => {
                    prop_assert!(m.covers(out, Direction::Inbound));
                    prop_assert_eq!(ones_sum(out) % 0xffff, ones_sum(addr) % 0xffff);
                    prop_assert_eq!(m.map(out, Direction::Inbound), Ok(addr));
                }
                Err(Unmappable) => prop_assert!(m.adjustment_word(addr).is_err()),
            }
        }
    }
}
