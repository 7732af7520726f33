//! The three HOST_ID options of seed 000 section 3 as bytes: what natrix
//! writes, and where a segment already carries them.
//!
//! ```text
//!  HOST_ID_WING       kind | 4  | data (2 bytes)
//!  HOST_ID_BOUCADAIR  kind | 10 | lifetime<<4 | origin | data (7 bytes, value left-aligned, zero-padded)
//!  HOST_ID_ENABLED    kind | 2
//! ```

use std::net::Ipv6Addr;

use natrix_wire::tcp_options::Iter;

use super::{Kinds, Origin, WingData};

/// Which HOST_ID option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Which {
    Wing = 0,
    Boucadair = 1,
    Enabled = 2,
}

impl Which {
    pub const ALL: [Which; 3] = [Which::Wing, Which::Boucadair, Which::Enabled];

    pub fn name(self) -> &'static str {
        match self {
            Which::Wing => "wing",
            Which::Boucadair => "boucadair",
            Which::Enabled => "enabled",
        }
    }

    /// The option's whole length, kind and length bytes included.
    pub const fn option_len(self) -> usize {
        match self {
            Which::Wing => 4,
            Which::Boucadair => 10,
            Which::Enabled => 2,
        }
    }

    pub fn kind(self, kinds: &Kinds) -> u8 {
        match self {
            Which::Wing => kinds.wing,
            Which::Boucadair => kinds.boucadair,
            Which::Enabled => kinds.enabled,
        }
    }

    fn of_kind(kind: u8, kinds: &Kinds) -> Option<Which> {
        Which::ALL.into_iter().find(|w| w.kind(kinds) == kind)
    }
}

/// A HOST_ID option a segment carries. Small (a scan holds 20 and is
/// made for every SYN): offsets and lengths within a 60-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Present {
    pub which: Which,
    offset: u8,
    len: u8,
}

impl Present {
    /// Offset of its kind byte from the TCP header's start.
    pub fn offset(&self) -> usize {
        usize::from(self.offset)
    }

    /// Its length byte (the seed's lengths, or whatever a host wrote).
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether its length is the one seed 000 gives the option.
    pub fn well_formed(&self) -> bool {
        self.len() == self.which.option_len()
    }
}

/// Every HOST_ID option in a TCP header, in order (at most 20: each takes
/// two of the 40 option bytes), and whether the options area is malformed
/// (a length below 2, or an option running past the header: seed 000
/// section 6.1.4's servers and boxes refuse such segments). Options after a
/// malformed one cannot be told apart from padding and are not listed.
#[derive(Debug, Clone, Copy)]
pub struct Scan {
    found: [Present; 20],
    count: u8,
    pub malformed: bool,
    /// Where the options end, from the header's start: at an EOL, or past
    /// the last option (what `tcp_options::Options::options_end` says, read
    /// in the same walk). Overwriting options in place never moves it.
    end: usize,
}

impl Scan {
    /// Scans `header`, a TCP header with its options.
    pub fn of(header: &[u8], kinds: &Kinds) -> Scan {
        const NONE: Present = Present { which: Which::Enabled, offset: 0, len: 0 };
        let mut scan = Scan { found: [NONE; 20], count: 0, malformed: false, end: natrix_wire::tcp::MIN_HEADER_LEN };
        let area = header.get(natrix_wire::tcp::MIN_HEADER_LEN..).unwrap_or(&[]);
        for o in Iter::new(area) {
            let Ok(o) = o else {
                scan.malformed = true;
                break;
            };
            scan.end = if o.kind == natrix_wire::tcp_options::kind::EOL { o.offset } else { o.offset + o.bytes.len() };
            if let Some(which) = Which::of_kind(o.kind, kinds) {
                // Offsets and lengths fit a byte: the header is at most 60 bytes.
                if let (Some(slot), Ok(offset), Ok(len)) = (scan.found.get_mut(usize::from(scan.count)), u8::try_from(o.offset), u8::try_from(o.bytes.len())) {
                    *slot = Present { which, offset, len };
                    scan.count += 1;
                }
            }
        }
        scan
    }

    pub fn iter(&self) -> impl Iterator<Item = Present> + '_ {
        self.found[..usize::from(self.count)].iter().copied()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Where the options end (None when the area is malformed).
    pub fn options_end(&self) -> Option<usize> {
        (!self.malformed).then_some(self.end)
    }
}

/// What a HOST_ID option says about a subscriber, read from its own
/// addresses and port as it sent the segment (before translation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subscriber {
    /// Its IPv4 source; behind a B4, the host's inner address.
    pub addr: u32,
    pub port: u16,
    /// The B4 of a softwire host (DS-Lite); None for a plain IPv4 subscriber.
    pub b4: Option<Ipv6Addr>,
}

/// HOST_ID_WING: the last 16 bits of the private IPv4 source (seed 000
/// section 8.4), or the internal source port.
pub fn wing(kind: u8, data: WingData, s: Subscriber) -> [u8; Which::Wing.option_len()] {
    let v = match data {
        WingData::Ipv4Low16 => s.addr as u16,
        WingData::Port => s.port,
    };
    let [a, b] = v.to_be_bytes();
    [kind, 4, a, b]
}

/// HOST_ID_BOUCADAIR: lifetime in the high nibble and origin in the low
/// nibble of one byte, then 7 data bytes, the value left-aligned and
/// zero-padded (CONTRACTS.md, "HOST_ID TCP options"). None for origin 3 (the
/// B4's first 56 bits, seed 000 section 7.1) when the subscriber has no B4.
pub fn boucadair(kind: u8, origin: Origin, lifetime: u8, s: Subscriber) -> Option<[u8; Which::Boucadair.option_len()]> {
    let mut b = [kind, 10, (lifetime << 4) | origin.number(), 0, 0, 0, 0, 0, 0, 0];
    let (port, addr) = (s.port.to_be_bytes(), s.addr.to_be_bytes());
    match origin {
        Origin::Port => b[3..5].copy_from_slice(&port),
        Origin::Ipv4 => b[3..7].copy_from_slice(&addr),
        Origin::PortIpv4 => {
            b[3..5].copy_from_slice(&port);
            b[5..9].copy_from_slice(&addr);
        }
        Origin::Ipv6Prefix => b[3..10].copy_from_slice(&s.b4?.octets()[..B4_PREFIX_BYTES]),
    }
    Some(b)
}

/// Origin 3 carries the first 56 bits of the B4.
const B4_PREFIX_BYTES: usize = 7;

/// HOST_ID_ENABLED: kind and length 2, no data.
pub fn enabled(kind: u8) -> [u8; Which::Enabled.option_len()] {
    [kind, 2]
}

/// The HOST_ID options a segment must carry, one after the other in the
/// order natrix inserts them (WING, BOUCADAIR, ENABLED), as they go into
/// the header: built once per SYN, and inserted as they lie.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wanted {
    bytes: [u8; Wanted::MAX_LEN],
    len: u8,
    /// Where each option starts in `bytes`, by `Which`; None: not wanted.
    starts: [Option<u8>; 3],
}

impl Wanted {
    /// All three options.
    const MAX_LEN: usize = Which::Wing.option_len() + Which::Boucadair.option_len() + Which::Enabled.option_len();

    /// Appends `which`'s bytes; options are added in the order they go in.
    #[inline]
    pub fn add(&mut self, which: Which, option: &[u8]) {
        let start = usize::from(self.len);
        self.bytes[start..start + option.len()].copy_from_slice(option);
        self.starts[which as usize] = Some(self.len);
        self.len += option.len() as u8;
    }

    /// `which`'s bytes, if wanted.
    pub fn get(&self, which: Which) -> Option<&[u8]> {
        let start = usize::from(self.starts[which as usize]?);
        self.bytes.get(start..start + which.option_len())
    }

    /// The options, one after the other.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Leaves out the `kept` options (by `Which`: present and correct).
    #[inline]
    pub fn leave_out(&mut self, kept: [bool; 3]) {
        if kept == [false; 3] {
            return;
        }
        let mut rest = Wanted::default();
        for which in Which::ALL.into_iter().filter(|w| !kept[*w as usize]) {
            if let Some(option) = self.get(which) {
                rest.add(which, option);
            }
        }
        *self = rest;
    }
}

/// The value a policy rule compares: WING's 2 data bytes, BOUCADAIR's 8
/// bytes after the length (lifetime/origin byte and data), as big-endian
/// numbers (seed 000 section 8.1); None for ENABLED and for an option whose
/// length is not the seed's.
pub fn value_of(header: &[u8], p: &Present) -> Option<u64> {
    if !p.well_formed() || p.which == Which::Enabled {
        return None;
    }
    let data = header.get(p.offset() + 2..p.offset() + p.len())?;
    Some(data.iter().fold(0u64, |v, &b| v << 8 | u64::from(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: Kinds = Kinds { wing: 200, boucadair: 201, enabled: 202 };
    const SUB: Subscriber = Subscriber { addr: 0x6440_000a, port: 5482, b4: None };

    #[test]
    fn the_layouts_of_section_3() {
        assert_eq!(wing(200, WingData::Ipv4Low16, SUB), [200, 4, 0x00, 0x0a]);
        assert_eq!(wing(200, WingData::Port, SUB), [200, 4, 0x15, 0x6a]);
        assert_eq!(enabled(202), [202, 2]);
        let b = |origin, lifetime, s| boucadair(201, origin, lifetime, s).map(|o| o.to_vec());
        assert_eq!(b(Origin::Port, 0, SUB).unwrap(), [201, 10, 0x00, 0x15, 0x6a, 0, 0, 0, 0, 0]);
        assert_eq!(b(Origin::Ipv4, 3, SUB).unwrap(), [201, 10, 0x31, 100, 64, 0, 10, 0, 0, 0]);
        assert_eq!(b(Origin::PortIpv4, 15, SUB).unwrap(), [201, 10, 0xf2, 0x15, 0x6a, 100, 64, 0, 10, 0]);
        let behind_b4 = Subscriber { b4: Some("2001:db8:100:ab12:3456::2".parse().unwrap()), ..SUB };
        assert_eq!(b(Origin::Ipv6Prefix, 0, behind_b4).unwrap(), [201, 10, 0x03, 0x20, 0x01, 0x0d, 0xb8, 0x01, 0x00, 0xab], "the B4's first 56 bits");
        assert_eq!(b(Origin::Ipv6Prefix, 0, SUB), None, "a plain IPv4 subscriber has no B4");
    }

    #[test]
    fn wanted_options_lie_one_after_the_other_and_kept_ones_leave() {
        let mut w = Wanted::default();
        w.add(Which::Wing, &wing(200, WingData::Port, SUB));
        w.add(Which::Boucadair, &boucadair(201, Origin::Port, 0, SUB).unwrap());
        w.add(Which::Enabled, &enabled(202));
        assert_eq!(w.as_slice(), [200, 4, 0x15, 0x6a, 201, 10, 0x00, 0x15, 0x6a, 0, 0, 0, 0, 0, 202, 2]);
        assert_eq!(w.get(Which::Boucadair), Some(&[201, 10, 0x00, 0x15, 0x6a, 0, 0, 0, 0, 0][..]));
        let without = |kept| {
            let mut rest = w;
            rest.leave_out(kept);
            rest
        };
        assert_eq!(without([false; 3]), w);
        assert_eq!(without([false, true, false]).as_slice(), [200, 4, 0x15, 0x6a, 202, 2]);
        assert_eq!(without([false, true, false]).get(Which::Enabled), Some(&[202, 2][..]));
        assert_eq!(without([true; 3]).as_slice(), []);
        let mut only_enabled = Wanted::default();
        only_enabled.add(Which::Enabled, &enabled(202));
        assert_eq!((only_enabled.get(Which::Wing), only_enabled.get(Which::Enabled)), (None, Some(&[202, 2][..])));
    }

    #[test]
    fn a_scan_lists_host_id_options_and_stops_at_a_malformed_one() {
        let mut h = vec![0u8; 20];
        h.extend([2, 4, 5, 180, 200, 4, 0, 10, 1, 202, 2, 1]);
        h[12] = 8 << 4;
        let s = Scan::of(&h, &KINDS);
        let found: Vec<_> = s.iter().collect();
        assert_eq!(found.iter().map(|p| (p.which, p.offset(), p.len())).collect::<Vec<_>>(), [(Which::Wing, 24, 4), (Which::Enabled, 29, 2)]);
        assert!(!s.malformed);
        assert_eq!(value_of(&h, &found[0]), Some(10));
        assert_eq!(value_of(&h, &found[1]), None);
        assert_eq!(s.options_end(), Some(32), "past the last option, the NOP after ENABLED");
        // A zero length after the WING: the area is malformed and the scan ends there.
        h[29] = 8;
        h[30] = 0;
        let s = Scan::of(&h, &KINDS);
        assert!(s.malformed);
        assert_eq!(s.iter().count(), 1);
    }
}
