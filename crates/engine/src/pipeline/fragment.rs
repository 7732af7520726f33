//! IPv4 fragmentation (RFC 791 section 3.2): a datagram without DF that is
//! larger than the link it leaves on goes as fragments, in order (RFC 4787
//! REQ-13 a, RFC 1812 section 4.2.2.7). Only the router's slow path sees
//! such a datagram; the fast paths pass it on.

use natrix_wire::ipv4;

const FIXED_HEADER: usize = 20;
const MORE_FRAGMENTS: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;
/// Option types whose top bit says "copied into every fragment".
const COPIED: u8 = 0x80;
const END_OF_OPTIONS: u8 = 0;
const NO_OPERATION: u8 = 1;

/// The fragments, each a whole frame (`frame`'s link header, an IPv4
/// header, at most what fits `mtu` of the data), of the datagram at `l3`
/// in `frame`: None where `mtu` leaves no room for 8 bytes of data.
/// The datagram may itself be a fragment: offsets add to its own, and its
/// last piece keeps its more-fragments flag. Options go whole into the
/// first fragment and, those marked copied, into the others.
pub(crate) fn split(frame: &[u8], l3: usize, mtu: u16) -> Option<Vec<Vec<u8>>> {
    let ip = ipv4::Packet::new_checked(frame.get(l3..)?).ok()?;
    let header_len = ip.header_len();
    let data = ip.payload();
    let first_options = &frame[l3 + FIXED_HEADER..l3 + header_len];
    let later_options = copied_options(first_options);
    let room = |header: usize| usize::from(mtu).saturating_sub(header) & !7;
    if room(header_len) == 0 || room(FIXED_HEADER + later_options.len()) == 0 {
        return None;
    }
    let word = u16::from_be_bytes([frame[l3 + 6], frame[l3 + 7]]);
    let (base, more_after) = (word & OFFSET_MASK, word & MORE_FRAGMENTS != 0);
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let options = if at == 0 { first_options } else { &later_options[..] };
        let header = FIXED_HEADER + options.len();
        let len = (data.len() - at).min(room(header));
        let more = at + len < data.len() || more_after;
        let mut f = Vec::with_capacity(l3 + header + len);
        f.extend_from_slice(&frame[..l3 + FIXED_HEADER]);
        f.extend_from_slice(options);
        f.extend_from_slice(&data[at..at + len]);
        let h = &mut f[l3..];
        h[0] = 0x40 | (header / 4) as u8;
        h[2..4].copy_from_slice(&((header + len) as u16).to_be_bytes());
        let offset = base + (at / 8) as u16;
        h[6..8].copy_from_slice(&(offset | if more { MORE_FRAGMENTS } else { 0 }).to_be_bytes());
        if let Ok(mut p) = ipv4::Packet::new_lax(&mut f[l3..]) {
            p.fill_checksum();
        }
        pieces.push(f);
        at += len;
    }
    Some(pieces)
}

/// The options of a first fragment that later ones carry too (their type's
/// copied flag set), padded with end-of-options to a multiple of 4 bytes.
fn copied_options(options: &[u8]) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut i = 0;
    while i < options.len() {
        let kind = options[i];
        let len = match kind {
            END_OF_OPTIONS => break,
            NO_OPERATION => 1,
            _ => usize::from(*options.get(i + 1).unwrap_or(&0)).max(2),
        };
        let end = (i + len).min(options.len());
        if kind & COPIED != 0 {
            kept.extend_from_slice(&options[i..end]);
        }
        i = end;
    }
    kept.resize(kept.len().div_ceil(4) * 4, END_OF_OPTIONS);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{Ipv4Header, Ipv4Options, PacketBuilder, SlicedPacket};

    const L3: usize = 14;

    fn udp(payload: usize) -> Vec<u8> {
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]).ipv4([203, 0, 113, 5], [198, 51, 100, 7], 63).udp(40000, 53);
        let payload: Vec<u8> = (0..payload).map(|i| i as u8).collect();
        let mut f = Vec::new();
        b.write(&mut f, &payload).unwrap();
        f
    }

    /// Each fragment as etherparse reads it: its header, and its data.
    fn read(pieces: &[Vec<u8>]) -> Vec<(Ipv4Header, Vec<u8>)> {
        pieces
            .iter()
            .map(|f| {
                let s = SlicedPacket::from_ethernet(f).unwrap();
                let Some(etherparse::NetSlice::Ipv4(ip)) = s.net else { panic!("not IPv4") };
                (ip.header().to_header(), ip.payload().payload.to_vec())
            })
            .collect()
    }

    #[test]
    fn a_datagram_is_cut_into_fragments_that_fit_in_order_and_add_up() {
        let f = udp(3000);
        let pieces = split(&f, L3, 1500).expect("fits in fragments");
        let read = read(&pieces);
        assert_eq!(read.len(), 3);
        let mut whole = Vec::new();
        for (i, (h, data)) in read.iter().enumerate() {
            assert!(usize::from(h.total_len) <= 1500);
            assert_eq!(h.header_checksum, h.calc_header_checksum(), "fragment {i}");
            assert_eq!(usize::from(h.fragment_offset.value()) * 8, whole.len(), "fragment {i} starts where the last ended");
            assert_eq!(h.more_fragments, i < 2);
            assert!(!h.dont_fragment);
            assert_eq!((h.identification, h.time_to_live, h.source, h.destination), (read[0].0.identification, 63, [203, 0, 113, 5], [198, 51, 100, 7]));
            assert!(i == 2 || data.len() % 8 == 0);
            whole.extend_from_slice(data);
            assert_eq!(&pieces[i][..L3], &f[..L3], "the link header travels with each");
        }
        assert_eq!(whole, f[L3 + 20..], "the data, UDP header and all, in order");
    }

    #[test]
    fn a_fragment_cut_again_keeps_its_offset_and_more_fragments() {
        let mut f = udp(2000);
        // Make it a middle fragment: offset 1480, more to come.
        f[L3 + 6..L3 + 8].copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
        let read = read(&split(&f, L3, 1000).unwrap());
        assert_eq!(read.iter().map(|(h, _)| h.fragment_offset.value()).collect::<Vec<_>>(), [185, 185 + 122, 185 + 244]);
        assert!(read.iter().all(|(h, _)| h.more_fragments), "the datagram goes on past the last piece");
    }

    #[test]
    fn only_copied_options_go_into_later_fragments() {
        // Router alert (148, copied) and record route (7, not copied).
        let mut f = udp(1200);
        let options = [148, 4, 0, 0, 7, 7, 4, 0, 0, 0, 0, 0];
        let mut header = Ipv4Header::from_slice(&f[L3..]).unwrap().0;
        header.options = Ipv4Options::try_from(&options[..]).unwrap();
        header.total_len += options.len() as u16;
        header.header_checksum = header.calc_header_checksum();
        let mut g = f[..L3].to_vec();
        header.write(&mut g).unwrap();
        g.extend_from_slice(&f[L3 + 20..]);
        f = g;
        let read = read(&split(&f, L3, 600).unwrap());
        assert_eq!(read[0].0.options.as_slice(), &options);
        assert!(read[1..].iter().all(|(h, _)| h.options.as_slice() == [148, 4, 0, 0]), "{:?}", read[1].0.options);
        assert!(read.iter().all(|(h, _)| h.header_checksum == h.calc_header_checksum()));
    }

    #[test]
    fn an_mtu_too_small_for_eight_bytes_of_data_cannot_fragment() {
        assert!(split(&udp(100), L3, 27).is_none());
        assert!(split(&udp(100), L3, 28).is_some());
    }
}
