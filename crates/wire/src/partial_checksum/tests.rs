//! Checked against etherparse's checksums, and against a pseudo-header sum
//! worked out here by hand, as a kernel's offload writes it.

use super::*;
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use proptest::prelude::*;

const MACS: ([u8; 6], [u8; 6]) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11];

fn tcp4(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MACS.0, MACS.1).ipv4([100, 64, 0, 2], [198, 51, 100, 11], 64).tcp(40000, 5201, 7, 1024).ack(9).write(&mut out, payload).unwrap();
    out
}

fn udp4(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MACS.0, MACS.1).ipv4([100, 64, 0, 2], [198, 51, 100, 11], 64).udp(40000, 53).write(&mut out, payload).unwrap();
    out
}

fn tcp6(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MACS.0, MACS.1).ipv6(SRC6, DST6, 64).tcp(40000, 443, 7, 1024).ack(9).write(&mut out, payload).unwrap();
    out
}

fn udp6(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MACS.0, MACS.1).ipv6(SRC6, DST6, 64).udp(40000, 53).write(&mut out, payload).unwrap();
    out
}

/// `frame` (IPv6) with `headers` (each its type and what follows its
/// next header and length bytes, 6 bytes and a multiple of 8 more) in
/// order between the fixed header and what it carried.
fn with_ext(frame: Vec<u8>, headers: &[(u8, &[u8])]) -> Vec<u8> {
    let upper = frame[20];
    let mut out = frame[..54].to_vec();
    out[20] = headers[0].0;
    for (i, (_, body)) in headers.iter().enumerate() {
        assert_eq!((body.len() + 2) % 8, 0, "a header is a multiple of 8 bytes");
        let next = headers.get(i + 1).map_or(upper, |h| h.0);
        out.extend_from_slice(&[next, ((body.len() + 2) / 8 - 1) as u8]);
        out.extend_from_slice(body);
    }
    out.extend_from_slice(&frame[54..]);
    let len = u16::from_be_bytes([out[18], out[19]]) as usize + out.len() - frame.len();
    out[18..20].copy_from_slice(&(len as u16).to_be_bytes());
    out
}

/// PadN over the 6 bytes a header of 8 leaves.
const PADN: [u8; 6] = [1, 4, 0, 0, 0, 0];
/// ip6tnl's Tunnel Encapsulation Limit of 4 (RFC 2473 section 4.1.1),
/// padded by PadN.
const ENCAP_LIMIT: [u8; 6] = [4, 1, 4, 1, 1, 0];

/// `frame` (IPv6) with a Hop-by-Hop and a Destination Options header,
/// each of PadN, before its transport, as a kernel sends a segment with
/// those socket options set.
fn with_options(frame: Vec<u8>) -> Vec<u8> {
    with_ext(frame, &[(0, &PADN), (60, &PADN)])
}

/// `frame` (IPv4, from a builder above) in a softwire: its IPv4 datagram
/// as the payload of an IPv6 packet with next header 4 (RFC 6333).
fn in_softwire(frame: Vec<u8>) -> Vec<u8> {
    let inner = &frame[14..];
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MACS.0, MACS.1).ipv6(SRC6, DST6, 64).write(&mut out, etherparse::IpNumber(4), inner).unwrap();
    out
}

fn tcp6_options(payload: &[u8]) -> Vec<u8> {
    with_options(tcp6(payload))
}

fn udp6_options(payload: &[u8]) -> Vec<u8> {
    with_options(udp6(payload))
}

fn tcp6_hop_by_hop(payload: &[u8]) -> Vec<u8> {
    with_ext(tcp6(payload), &[(0, &PADN)])
}

fn udp6_destination(payload: &[u8]) -> Vec<u8> {
    with_ext(udp6(payload), &[(60, &PADN)])
}

fn tcp4_softwire(payload: &[u8]) -> Vec<u8> {
    in_softwire(tcp4(payload))
}

fn udp4_softwire(payload: &[u8]) -> Vec<u8> {
    in_softwire(udp4(payload))
}

/// As a kernel's ip6tnl sends them by default, with an encapsulation limit.
fn tcp4_softwire_limited(payload: &[u8]) -> Vec<u8> {
    with_ext(in_softwire(tcp4(payload)), &[(60, &ENCAP_LIMIT)])
}

fn udp4_softwire_limited(payload: &[u8]) -> Vec<u8> {
    with_ext(in_softwire(udp4(payload)), &[(60, &ENCAP_LIMIT)])
}

/// Builds a frame around a payload.
type Build = fn(&[u8]) -> Vec<u8>;

/// Every shape of frame whose partial checksums are found.
const BUILDERS: [Build; 12] =
    [tcp4, udp4, tcp6, udp6, tcp6_options, udp6_options, tcp6_hop_by_hop, udp6_destination, tcp4_softwire, udp4_softwire, tcp4_softwire_limited, udp4_softwire_limited];

/// Where the IP header that carries the transport starts, where the
/// transport starts, and its protocol, in a frame the builders above made:
/// IPv4 (alone or in a softwire) by its header length, IPv6 past the
/// options headers `with_options` adds.
fn layout(frame: &[u8]) -> (usize, usize, u8) {
    let v4 = |ip: usize| (ip, ip + usize::from(frame[ip] & 0x0f) * 4, frame[ip + 9]);
    if u16::from_be_bytes([frame[12], frame[13]]) == 0x0800 {
        return v4(14);
    }
    let (mut nh, mut at) = (frame[20], 54);
    while nh == 0 || nh == 60 {
        (nh, at) = (frame[at], at + (usize::from(frame[at + 1]) + 1) * 8);
    }
    if nh == 4 {
        v4(at)
    } else {
        (14, at, nh)
    }
}

/// Where the frame's transport checksum lies.
fn field_at(frame: &[u8]) -> usize {
    let (_, l4, proto) = layout(frame);
    l4 + if proto == 17 { 6 } else { 16 }
}

fn field(frame: &[u8]) -> u16 {
    let at = field_at(frame);
    u16::from_be_bytes([frame[at], frame[at + 1]])
}

/// Whether `complete_if_partial` finished the frame's checksum.
fn finished(frame: &mut [u8]) -> bool {
    complete_if_partial(frame) == Found::Finished
}

/// Whether the frame's checksum looks as an offload leaves it, found on a
/// copy, whether finished or not.
fn looks_partial(frame: &[u8]) -> bool {
    complete_if_partial(&mut frame.to_vec()).looks_partial()
}

/// The checksum etherparse computes for the frame's transport; for a
/// softwire's, that of its inner datagram framed on its own.
fn expected(frame: &[u8]) -> u16 {
    let (ip, _, _) = layout(frame);
    if ip != 14 {
        let mut plain = frame[..12].to_vec();
        plain.extend_from_slice(&[0x08, 0x00]);
        plain.extend_from_slice(&frame[ip..]);
        return expected(&plain);
    }
    let p = SlicedPacket::from_ethernet(frame).unwrap();
    match (p.net.unwrap(), p.transport.unwrap()) {
        (NetSlice::Ipv4(ip), TransportSlice::Tcp(t)) => t.to_header().calc_checksum_ipv4(&ip.header().to_header(), t.payload()).unwrap(),
        (NetSlice::Ipv4(ip), TransportSlice::Udp(u)) => u.to_header().calc_checksum_ipv4(&ip.header().to_header(), u.payload()).unwrap(),
        (NetSlice::Ipv6(ip), TransportSlice::Tcp(t)) => t.to_header().calc_checksum_ipv6(&ip.header().to_header(), t.payload()).unwrap(),
        (NetSlice::Ipv6(ip), TransportSlice::Udp(u)) => u.to_header().calc_checksum_ipv6(&ip.header().to_header(), u.payload()).unwrap(),
        other => panic!("not TCP or UDP over IP: {other:?}"),
    }
}

/// The field as a kernel's checksum offload leaves it: the folded sum of
/// the pseudo-header (addresses, protocol, transport length), worked out
/// here word by word, not complemented.
fn left_partial(frame: &mut [u8]) {
    let (ip, l4, proto) = layout(frame);
    let (addresses, ip_payload) = if frame[ip] >> 4 == 4 {
        (ip + 12..ip + 20, usize::from(u16::from_be_bytes([frame[ip + 2], frame[ip + 3]])) - (l4 - ip))
    } else {
        (ip + 8..ip + 40, ip + 40 + usize::from(u16::from_be_bytes([frame[ip + 4], frame[ip + 5]])) - l4)
    };
    // UDP's length is its own field's (RFC 768).
    let len = if proto == 17 { usize::from(u16::from_be_bytes([frame[l4 + 4], frame[l4 + 5]])) } else { ip_payload };
    let words = frame[addresses].chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])));
    let mut s: u32 = words.sum::<u32>() + u32::from(proto) + len as u32;
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    let at = field_at(frame);
    frame[at..at + 2].copy_from_slice(&(s as u16).to_be_bytes());
}

#[test]
fn partial_checksums_are_finished_as_etherparse_computes_them() {
    for build in BUILDERS {
        let right = build(b"a payload of odd length");
        let mut frame = right.clone();
        left_partial(&mut frame);
        assert_ne!(field(&frame), expected(&right), "the partial field differs from the whole checksum");
        assert!(finished(&mut frame));
        assert_eq!(field(&frame), expected(&right));
        assert_eq!(frame, right, "only the checksum field changes");
    }
}

#[test]
fn complete_checksums_are_left_alone() {
    for build in BUILDERS {
        let right = build(b"payload");
        let mut frame = right.clone();
        assert!(!finished(&mut frame));
        assert_eq!(frame, right);
    }
}

#[test]
fn a_wrong_checksum_that_is_not_the_pseudo_header_sum_is_left_wrong() {
    // A corrupt frame goes on as it came, for its receiver to refuse.
    let mut frame = tcp4(b"payload");
    let at = field_at(&frame);
    frame[at] ^= 0x5a;
    let corrupt = frame.clone();
    assert!(!finished(&mut frame));
    assert_eq!(frame, corrupt);
}

#[test]
fn a_udp_datagram_without_a_checksum_keeps_none() {
    let mut frame = udp4(b"payload");
    let at = field_at(&frame);
    frame[at..at + 2].copy_from_slice(&[0, 0]);
    assert!(!finished(&mut frame));
    assert_eq!(field(&frame), 0);
}

#[test]
fn a_udp_checksum_computed_as_zero_is_sent_as_all_ones() {
    // A whole sum of 0 cannot be, so a computed 0 is the one way to get
    // 0xffff: found by search over the payload's one word.
    let right = (0..=u16::MAX).map(|w| udp4(&w.to_be_bytes())).find(|f| expected(f) == 0xffff).expect("some word makes the checksum 0");
    let mut frame = right.clone();
    left_partial(&mut frame);
    assert!(finished(&mut frame));
    assert_eq!(field(&frame), 0xffff);
}

#[test]
fn complete_finishes_only_what_looks_partial() {
    for build in BUILDERS {
        let right = build(b"0123456789");
        let mut frame = right.clone();
        left_partial(&mut frame);
        assert!(complete(&mut frame));
        assert_eq!(frame, right);
        // Marked partial by the kernel, yet not as TCP or UDP leave it: a
        // checksum natrix does not look for, such as another tunnel's.
        let at = field_at(&frame);
        frame[at..at + 2].copy_from_slice(&[0xde, 0xad]);
        let kept = frame.clone();
        assert!(!complete(&mut frame));
        assert_eq!(frame, kept);
    }
}

/// CRC32c (RFC 9260 appendix A), bit by bit: reflected, polynomial
/// 0x82F63B78, as the checksum field stores it (least significant byte
/// first).
fn crc32c_bitwise(data: &[u8]) -> [u8; 4] {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    (!crc).to_le_bytes()
}

/// An IPv4 frame carrying an SCTP packet (common header, one DATA chunk)
/// with its CRC32c right.
fn sctp4() -> Vec<u8> {
    let mut sctp = vec![0x9c, 0x40, 0x0b, 0x59, 0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0];
    sctp.extend_from_slice(&[0, 0x03, 0, 20, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, b'd', b'a', b't', b'a']);
    let crc = crc32c_bitwise(&sctp);
    sctp[8..12].copy_from_slice(&crc);
    let mut out = Vec::new();
    PacketBuilder::ethernet2(MACS.0, MACS.1).ipv4([100, 64, 0, 2], [198, 51, 100, 11], 64).write(&mut out, etherparse::IpNumber(132), &sctp).unwrap();
    out
}

#[test]
fn an_sctp_crc_left_zero_is_finished() {
    let right = sctp4();
    assert_ne!(right[42..46], [0, 0, 0, 0]);
    let mut frame = right.clone();
    frame[42..46].copy_from_slice(&[0, 0, 0, 0]);
    assert!(looks_partial(&frame));
    assert!(finished(&mut frame));
    assert_eq!(frame, right);
    let mut marked = right.clone();
    marked[42..46].copy_from_slice(&[0, 0, 0, 0]);
    assert!(complete(&mut marked));
    assert_eq!(marked, right);
    // A CRC that is not 0 is no offload's: left as it is, right or wrong.
    let mut wrong = right.clone();
    wrong[42] ^= 1;
    let kept = wrong.clone();
    assert!(!looks_partial(&wrong) && !finished(&mut wrong) && !complete(&mut wrong));
    assert_eq!(wrong, kept);
}

#[test]
fn fragments_extension_headers_and_other_protocols_are_not_touched() {
    let mut fragment = tcp4(b"payload");
    fragment[20] |= 0x20; // more fragments
    left_partial(&mut fragment);
    let kept = fragment.clone();
    assert!(!finished(&mut fragment) && !complete(&mut fragment));
    assert_eq!(fragment, kept);

    // A Routing header with segments left moves the pseudo-header's
    // destination; a fragment header is never on a partial segment.
    for (next, ext) in [(43u8, [6u8, 0, 0, 1, 0, 0, 0, 0]), (44, [6, 0, 0, 0, 0, 0, 0, 7])] {
        let right = tcp6(b"payload");
        let mut behind = right[..54].to_vec();
        behind[20] = next;
        behind.extend_from_slice(&ext);
        behind.extend_from_slice(&right[54..]);
        let len = u16::from_be_bytes([behind[18], behind[19]]) + 8;
        behind[18..20].copy_from_slice(&len.to_be_bytes());
        let (field, sum) = (54 + 8 + 16, field_at(&right));
        let mut partial = right.clone();
        left_partial(&mut partial);
        behind[field..field + 2].copy_from_slice(&partial[sum..sum + 2]);
        let kept = behind.clone();
        assert!(!looks_partial(&behind) && !finished(&mut behind) && !complete(&mut behind), "behind next header {next}");
        assert_eq!(behind, kept);
    }

    let mut icmp = Vec::new();
    PacketBuilder::ethernet2(MACS.0, MACS.1).ipv4([100, 64, 0, 2], [198, 51, 100, 11], 64).icmpv4_echo_request(1, 1).write(&mut icmp, b"ping").unwrap();
    let kept = icmp.clone();
    assert!(!complete(&mut icmp));
    assert_eq!(icmp, kept);
}

#[test]
fn a_datagram_longer_than_its_frame_is_not_touched() {
    for build in BUILDERS {
        let mut whole = build(b"payload");
        left_partial(&mut whole);
        for len in 0..whole.len() {
            let mut frame = whole[..len].to_vec();
            assert!(!looks_partial(&frame) && !finished(&mut frame) && !complete(&mut frame), "cut to {len} bytes");
            assert_eq!(frame, whole[..len]);
        }
    }
}

#[test]
fn ethernet_padding_is_not_summed() {
    // A short frame padded to Ethernet's 60 bytes: the datagram ends where
    // its IPv4 total length says.
    let right = udp4(b"ab");
    let mut frame = right.clone();
    left_partial(&mut frame);
    frame.resize(60, 0xee);
    assert!(finished(&mut frame));
    assert_eq!(frame[..right.len()], right[..]);
}

#[test]
fn ipv4_options_are_stepped_over() {
    let mut out = Vec::new();
    let mut ip = etherparse::Ipv4Header::new(28, 64, etherparse::IpNumber::UDP, [100, 64, 0, 2], [198, 51, 100, 11]).unwrap();
    ip.options = [1, 1, 1, 0][..].try_into().unwrap();
    ip.total_len = ip.header_len() as u16 + 8 + 4;
    let udp = etherparse::UdpHeader::with_ipv4_checksum(40000, 53, &ip, b"opts").unwrap();
    etherparse::Ethernet2Header { source: MACS.1, destination: MACS.0, ether_type: etherparse::EtherType::IPV4 }.write(&mut out).unwrap();
    ip.header_checksum = ip.calc_header_checksum();
    ip.write(&mut out).unwrap();
    udp.write(&mut out).unwrap();
    out.extend_from_slice(b"opts");
    let right = out.clone();
    // The field at the transport's offset behind 4 bytes of options.
    let at = 14 + 24 + 6;
    let pseudo = [100u32 << 8 | 64, 2, 198 << 8 | 51, 100 << 8 | 11, 17, 12].iter().sum::<u32>();
    out[at..at + 2].copy_from_slice(&((pseudo & 0xffff) + (pseudo >> 16)).to_be_bytes()[2..]);
    assert!(finished(&mut out));
    assert_eq!(out, right);
}

#[test]
fn complete_refuses_a_udp_field_of_zero() {
    // An offload never leaves 0 (the pseudo-header's sum is never 0): a 0
    // there is no partial UDP checksum, and no checksum is made up for it.
    let mut frame = udp4(b"tunnel");
    let at = field_at(&frame);
    frame[at..at + 2].copy_from_slice(&[0, 0]);
    let kept = frame.clone();
    assert!(!complete(&mut frame) && !looks_partial(&frame));
    assert_eq!(frame, kept);
}

proptest! {
    #[test]
    fn any_bytes_are_safe(mut bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = finished(&mut bytes);
        let _ = complete(&mut bytes);
    }

    #[test]
    fn mangled_frames_are_safe(which in 0usize..BUILDERS.len(), flips in proptest::collection::vec((0usize..120, any::<u8>()), 1..6), cut in 0usize..130) {
        // Valid headers with a few bytes changed and cut anywhere: lengths,
        // header lengths and versions that lie.
        let mut frame = BUILDERS[which](&[7u8; 60]);
        for (at, b) in flips {
            if let Some(x) = frame.get_mut(at) {
                *x = b;
            }
        }
        frame.truncate(cut.max(1));
        let _ = looks_partial(&frame);
        let _ = finished(&mut frame.clone());
        let _ = complete(&mut frame);
    }

    #[test]
    fn every_partial_frame_is_finished_and_every_whole_one_kept(payload in proptest::collection::vec(any::<u8>(), 0..1400), which in 0usize..BUILDERS.len()) {
        let right = BUILDERS[which](&payload);
        let mut whole = right.clone();
        prop_assert!(!finished(&mut whole));
        prop_assert_eq!(&whole, &right);
        let mut partial = right.clone();
        left_partial(&mut partial);
        // One frame in 65,535 has a whole checksum equal to its
        // pseudo-header's sum: nothing is left to finish there.
        let left_something = field(&partial) != field(&right);
        prop_assert!(looks_partial(&partial));
        prop_assert_eq!(finished(&mut partial), left_something);
        prop_assert_eq!(&partial, &right);
    }
}

#[test]
fn options_headers_and_softwires_keep_whole_checksums_etherparse_agrees_with() {
    // The builders' frames are whole to begin with, behind options headers
    // as in a softwire, or the tests above would prove nothing.
    for build in BUILDERS {
        let frame = build(b"whole");
        assert_eq!(field(&frame), expected(&frame));
        assert!(!looks_partial(&frame));
    }
}

#[test]
fn a_softwire_whose_datagram_runs_past_its_ipv6_packet_is_not_touched() {
    let mut frame = tcp4_softwire(b"payload");
    left_partial(&mut frame);
    let short = u16::from_be_bytes([frame[18], frame[19]]) - 1;
    frame[18..20].copy_from_slice(&short.to_be_bytes());
    let kept = frame.clone();
    assert!(!looks_partial(&frame) && !finished(&mut frame) && !complete(&mut frame));
    assert_eq!(frame, kept);
}

/// `frame` with its transport checksum left partial, as a copy.
fn partial(frame: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    left_partial(&mut f);
    f
}

/// Asserts that nothing is found in `frame`, nor changed.
fn untouched(frame: &[u8], case: &str) {
    let mut f = frame.to_vec();
    assert!(!looks_partial(&f) && !finished(&mut f) && !complete(&mut f), "{case}");
    assert_eq!(f, frame, "{case}");
}

#[test]
fn a_home_address_option_stops_the_search() {
    // RFC 6275: the home address is the pseudo-header's source, not the
    // IPv6 header's: PadN to 8n+6, then the option (type 0xc9, 16 bytes).
    let mut hao = vec![1, 2, 0, 0, 0xc9, 16];
    hao.extend_from_slice(&SRC6);
    let frame = partial(&with_ext(tcp6(b"payload"), &[(60, &hao)]));
    untouched(&frame, "behind a Home Address option");
}

#[test]
fn a_hop_by_hop_header_after_another_stops_the_search() {
    // RFC 8200 section 4.1: Hop-by-Hop comes first, or the packet is bad.
    let frame = partial(&with_ext(tcp6(b"payload"), &[(60, &PADN), (0, &PADN)]));
    untouched(&frame, "Hop-by-Hop second");
}

#[test]
fn an_options_header_that_runs_past_the_packet_stops_the_search() {
    let mut frame = partial(&with_ext(udp6(b""), &[(60, &PADN)]));
    // The payload now ends within the options header.
    frame[18..20].copy_from_slice(&4u16.to_be_bytes());
    untouched(&frame, "options header past the payload length");
}

#[test]
fn a_softwires_fragment_is_not_touched() {
    let mut inner = tcp4(b"payload");
    inner[20] |= 0x20; // more fragments
    let frame = partial(&in_softwire(inner));
    untouched(&frame, "a fragment inside a softwire");
}

#[test]
fn an_sctp_crc_left_zero_is_finished_behind_options_and_in_a_softwire() {
    for right in [with_options(in_softwire(sctp4())), with_ext(in_softwire(sctp4()), &[(60, &ENCAP_LIMIT)])] {
        let crc = right.len() - 32 + 8;
        assert_ne!(right[crc..crc + 4], [0, 0, 0, 0]);
        let mut frame = right.clone();
        frame[crc..crc + 4].copy_from_slice(&[0, 0, 0, 0]);
        let mut marked = frame.clone();
        assert!(finished(&mut frame) && complete(&mut marked));
        assert_eq!(frame, right);
        assert_eq!(marked, right);
    }
}

#[test]
fn a_udp_datagram_ends_where_its_length_says_not_where_the_ip_payload_does() {
    // Four bytes after the datagram within the IPv4 payload: not part of
    // its checksum (RFC 768), which the kernel's receive trims away.
    let plain = udp4(b"datagram");
    let mut right = plain.clone();
    right.extend_from_slice(&[0xaa; 4]);
    let total = u16::from_be_bytes([right[16], right[17]]) + 4;
    right[16..18].copy_from_slice(&total.to_be_bytes());
    right[24..26].copy_from_slice(&[0, 0]);
    let header_sum = right[14..34].chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum::<u32>();
    let header = !(((header_sum & 0xffff) + (header_sum >> 16)) as u16);
    right[24..26].copy_from_slice(&header.to_be_bytes());
    assert_eq!(field(&right), expected(&plain), "the trailing bytes change nothing of the datagram's checksum");
    assert!(!looks_partial(&right));
    let mut frame = partial(&right);
    assert!(finished(&mut frame));
    assert_eq!(frame, right);
    // A UDP length past the IP payload is no datagram to finish.
    let mut long = partial(&plain);
    long[38..40].copy_from_slice(&100u16.to_be_bytes());
    untouched(&long, "UDP length past the IP payload");
}
