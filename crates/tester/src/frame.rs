//! The tester's frames: Ethernet/IPv4/UDP test frames carrying a tag (which
//! trial, which direction, sequence number, connection, send time), TCP SYN
//! and SYN-ACK for SYN floods, and ARP replies. Built and checked here with
//! the tester's own code, not natrix's wire crate, so that a bug in natrix's
//! header handling cannot hide behind the same bug in its tester.
//!
//! Sizes follow RFC 2544 section 9: a frame size counts the Ethernet frame
//! with its 4-byte FCS, which a virtual link does not carry, so a "64-byte"
//! frame is 60 bytes written. Seed 002's frames (128 and 1514 bytes) were
//! counted without FCS: RFC 2544 sizes 132 and 1518.

/// Bytes of FCS that a frame size counts and a veth does not carry.
pub const FCS_LEN: usize = 4;
/// The smallest Ethernet frame, FCS included (RFC 2544 section 9).
pub const MIN_FRAME_SIZE: usize = 64;
/// The largest untagged Ethernet frame, FCS included.
pub const MAX_FRAME_SIZE: usize = 1518;

const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const UDP_LEN: usize = 8;
const TCP_LEN: usize = 20;
const L4: usize = ETH_LEN + IP_LEN;
const UDP_PAYLOAD: usize = L4 + UDP_LEN;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_ARP: u16 = 0x0806;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// TTL the tester sends with; a router in the path leaves one less.
pub const SEND_TTL: u8 = 64;

/// The tag's first two bytes: "NX".
const MAGIC: u16 = 0x4e58;
/// The tag fills a 64-byte frame's UDP payload exactly: 60 bytes written,
/// 42 of headers, 18 of tag.
pub const TAG_LEN: usize = 18;
const STAMP_MASK: u64 = (1 << 48) - 1;

pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// Which way a tagged frame travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Initiator (subscriber side) to responder (server side).
    Forward = 0,
    /// Responder to initiator, to an external endpoint the responder learned.
    Reverse = 1,
    /// A forward frame the responder sent back, for round-trip times.
    Reflected = 2,
}

impl Direction {
    fn from_byte(b: u8) -> Option<Direction> {
        match b {
            0 => Some(Direction::Forward),
            1 => Some(Direction::Reverse),
            2 => Some(Direction::Reflected),
            _ => None,
        }
    }
}

/// What every test frame carries after its UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    /// The trial that sent it (modulo 256), so late frames of an earlier
    /// trial are not counted in this one.
    pub trial: u8,
    pub direction: Direction,
    /// The frame's number within its trial and direction.
    pub seq: u32,
    /// The connection (flow) index it belongs to.
    pub conn: u32,
    /// Send time, CLOCK_MONOTONIC nanoseconds modulo 2^48 (78 hours).
    pub stamp_ns: u64,
}

impl Tag {
    fn write(&self, b: &mut [u8]) {
        b[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        b[2] = self.trial;
        b[3] = self.direction as u8;
        b[4..8].copy_from_slice(&self.seq.to_be_bytes());
        b[8..12].copy_from_slice(&self.conn.to_be_bytes());
        b[12..18].copy_from_slice(&(self.stamp_ns & STAMP_MASK).to_be_bytes()[2..]);
    }

    fn read(b: &[u8]) -> Option<Tag> {
        if b.len() < TAG_LEN || be16(b, 0) != MAGIC {
            return None;
        }
        let mut stamp = [0u8; 8];
        stamp[2..].copy_from_slice(&b[12..18]);
        Some(Tag { trial: b[2], direction: Direction::from_byte(b[3])?, seq: be32(b, 4), conn: be32(b, 8), stamp_ns: u64::from_be_bytes(stamp) })
    }
}

/// Nanoseconds from a tag's send time to `now_ns`, both modulo 2^48.
pub fn since_stamp(now_ns: u64, stamp_ns: u64) -> u64 {
    now_ns.wrapping_sub(stamp_ns) & STAMP_MASK
}

/// Link and network addresses of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoints {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: u32,
    pub sport: u16,
    pub dst: u32,
    pub dport: u16,
}

/// Bytes written for an RFC 2544 frame size.
pub fn wire_len(frame_size: usize) -> usize {
    frame_size - FCS_LEN
}

/// Writes a UDP test frame filling `f` (60 to 1514 bytes); the payload after
/// the tag is zeros.
pub fn write_udp(f: &mut [u8], ep: &Endpoints, tag: &Tag) {
    debug_assert!(f.len() >= UDP_PAYLOAD + TAG_LEN);
    f[UDP_PAYLOAD + TAG_LEN..].fill(0);
    write_ethernet(f, ep, ETHERTYPE_IPV4);
    write_ipv4(f, ep, PROTO_UDP, f.len() - ETH_LEN);
    put16(f, L4, ep.sport);
    put16(f, L4 + 2, ep.dport);
    put16(f, L4 + 4, (f.len() - L4) as u16);
    tag.write(&mut f[UDP_PAYLOAD..]);
    set_l4_checksum(f, PROTO_UDP);
}

/// Turns a received UDP test frame around in place: addresses and ports
/// swapped, new MACs, full TTL, the tag's direction set to `direction`.
pub fn reverse_udp(f: &mut [u8], src_mac: [u8; 6], dst_mac: [u8; 6], direction: Direction) {
    let (src, dst) = (be32(f, ETH_LEN + 12), be32(f, ETH_LEN + 16));
    let (sport, dport) = (be16(f, L4), be16(f, L4 + 2));
    let ep = Endpoints { src_mac, dst_mac, src: dst, sport: dport, dst: src, dport: sport };
    write_ethernet(f, &ep, ETHERTYPE_IPV4);
    write_ipv4(f, &ep, PROTO_UDP, usize::from(be16(f, ETH_LEN + 2)));
    put16(f, L4, ep.sport);
    put16(f, L4 + 2, ep.dport);
    f[UDP_PAYLOAD + 3] = direction as u8;
    set_l4_checksum(f, PROTO_UDP);
}

/// Writes a 60-byte TCP segment without options or data (a SYN, a SYN-ACK
/// or a RST), padded to the Ethernet minimum.
pub fn write_tcp(f: &mut [u8; 60], ep: &Endpoints, flags: u8, seq: u32, ack: u32) {
    f.fill(0);
    write_ethernet(f, ep, ETHERTYPE_IPV4);
    write_ipv4(f, ep, PROTO_TCP, IP_LEN + TCP_LEN);
    put16(f, L4, ep.sport);
    put16(f, L4 + 2, ep.dport);
    f[L4 + 4..L4 + 8].copy_from_slice(&seq.to_be_bytes());
    f[L4 + 8..L4 + 12].copy_from_slice(&ack.to_be_bytes());
    f[L4 + 12] = 0x50;
    f[L4 + 13] = flags;
    put16(f, L4 + 14, 64240);
    set_l4_checksum(f, PROTO_TCP);
}

/// A broadcast ARP request from `sender` at `mac` for `target`. Sent to a
/// router's own address, it also teaches the router where `sender` is
/// (RFC 826), so that its first frames towards `sender` need not wait.
pub fn arp_request(mac: [u8; 6], sender: u32, target: u32) -> [u8; 60] {
    let mut f = [0u8; 60];
    f[0..6].fill(0xff);
    f[6..12].copy_from_slice(&mac);
    put16(&mut f, 12, ETHERTYPE_ARP);
    f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&sender.to_be_bytes());
    f[38..42].copy_from_slice(&target.to_be_bytes());
    f
}

/// An ARP reply to `request` saying that `request.target` is at `mac`.
pub fn arp_reply(request: &Arp, mac: [u8; 6]) -> [u8; 60] {
    let mut f = [0u8; 60];
    f[0..6].copy_from_slice(&request.sender_mac);
    f[6..12].copy_from_slice(&mac);
    put16(&mut f, 12, ETHERTYPE_ARP);
    f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&request.target.to_be_bytes());
    f[32..38].copy_from_slice(&request.sender_mac);
    f[38..42].copy_from_slice(&request.sender.to_be_bytes());
    f
}

fn write_ethernet(f: &mut [u8], ep: &Endpoints, ethertype: u16) {
    f[0..6].copy_from_slice(&ep.dst_mac);
    f[6..12].copy_from_slice(&ep.src_mac);
    put16(f, 12, ethertype);
}

fn write_ipv4(f: &mut [u8], ep: &Endpoints, protocol: u8, total_len: usize) {
    let ip = &mut f[ETH_LEN..L4];
    ip.copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0, 0, SEND_TTL, protocol, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    ip[2..4].copy_from_slice(&(total_len as u16).to_be_bytes());
    ip[12..16].copy_from_slice(&ep.src.to_be_bytes());
    ip[16..20].copy_from_slice(&ep.dst.to_be_bytes());
    let c = !fold(sum16(ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

fn set_l4_checksum(f: &mut [u8], protocol: u8) {
    let total = usize::from(be16(f, ETH_LEN + 2));
    let seg_len = total - IP_LEN;
    let at = L4 + if protocol == PROTO_UDP { 6 } else { 16 };
    put16(f, at, 0);
    let c = !fold(pseudo_header(f, protocol, seg_len) + sum16(&f[L4..L4 + seg_len]));
    // RFC 768: a computed UDP checksum of zero goes out as all ones.
    put16(f, at, if protocol == PROTO_UDP && c == 0 { 0xffff } else { c });
}

fn pseudo_header(f: &[u8], protocol: u8, seg_len: usize) -> u64 {
    sum16(&f[ETH_LEN + 12..ETH_LEN + 20]) + u64::from(protocol) + seg_len as u64
}

/// The one's-complement sum of big-endian 16-bit words (RFC 1071), unfolded.
fn sum16(b: &[u8]) -> u64 {
    let mut chunks = b.chunks_exact(2);
    let mut s: u64 = chunks.by_ref().map(|c| u64::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    if let [last] = chunks.remainder() {
        s += u64::from(*last) << 8;
    }
    s
}

fn fold(mut s: u64) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn put16(f: &mut [u8], at: usize, v: u16) {
    f[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// An ARP request's question: who has `target`?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    pub sender_mac: [u8; 6],
    pub sender: u32,
    pub target: u32,
}

/// The IPv4 header facts the receiver checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ip {
    pub src: u32,
    pub dst: u32,
    pub ttl: u8,
    /// Header checksum and lengths right.
    pub valid: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp {
    pub ip: Ip,
    pub sport: u16,
    pub dport: u16,
    /// The UDP checksum verifies (or is absent, zero).
    pub valid: bool,
    pub tag: Option<Tag>,
    pub payload_len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tcp {
    pub ip: Ip,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub valid: bool,
}

/// What a received frame is, as far as the tester cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    ArpRequest(Arp),
    Udp(Udp),
    Tcp(Tcp),
    Other,
}

/// Classifies and checks a received frame.
pub fn parse(f: &[u8]) -> Received {
    if f.len() < ETH_LEN {
        return Received::Other;
    }
    match be16(f, 12) {
        ETHERTYPE_ARP => parse_arp(f),
        ETHERTYPE_IPV4 => parse_ipv4(f),
        _ => Received::Other,
    }
}

fn parse_arp(f: &[u8]) -> Received {
    // Ethernet, IPv4, 6-byte and 4-byte addresses, request.
    if f.len() < 42 || f[14..22] != [0, 1, 8, 0, 6, 4, 0, 1] {
        return Received::Other;
    }
    let mut sender_mac = [0u8; 6];
    sender_mac.copy_from_slice(&f[22..28]);
    Received::ArpRequest(Arp { sender_mac, sender: be32(f, 28), target: be32(f, 38) })
}

fn parse_ipv4(f: &[u8]) -> Received {
    if f.len() < L4 || f[ETH_LEN] != 0x45 {
        return Received::Other;
    }
    let total = usize::from(be16(f, ETH_LEN + 2));
    let fragment = be16(f, ETH_LEN + 6) & 0x3fff != 0;
    if total < IP_LEN || ETH_LEN + total > f.len() || fragment {
        return Received::Other;
    }
    let ip = Ip { src: be32(f, ETH_LEN + 12), dst: be32(f, ETH_LEN + 16), ttl: f[ETH_LEN + 8], valid: fold(sum16(&f[ETH_LEN..L4])) == 0xffff };
    let seg = &f[L4..ETH_LEN + total];
    let checksum_ok = |protocol| fold(pseudo_header(f, protocol, seg.len()) + sum16(seg)) == 0xffff;
    match f[ETH_LEN + 9] {
        PROTO_UDP if seg.len() >= UDP_LEN && usize::from(be16(seg, 4)) == seg.len() => Received::Udp(Udp {
            ip,
            sport: be16(seg, 0),
            dport: be16(seg, 2),
            valid: be16(seg, 6) == 0 || checksum_ok(PROTO_UDP),
            tag: Tag::read(&seg[UDP_LEN..]),
            payload_len: seg.len() - UDP_LEN,
        }),
        PROTO_TCP if seg.len() >= TCP_LEN => {
            Received::Tcp(Tcp { ip, sport: be16(seg, 0), dport: be16(seg, 2), seq: be32(seg, 4), ack: be32(seg, 8), flags: seg[13], valid: checksum_ok(PROTO_TCP) })
        }
        _ => Received::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn ep() -> Endpoints {
        Endpoints { src_mac: A, dst_mac: B, src: 0x6440_0101, sport: 1024, dst: 0xc633_6415, dport: 5001 }
    }

    fn tag() -> Tag {
        Tag { trial: 7, direction: Direction::Forward, seq: 123_456, conn: 99, stamp_ns: (1 << 50) + 42 }
    }

    #[test]
    fn a_64_byte_frame_is_60_bytes_with_the_tag_filling_its_payload() {
        let mut f = vec![0u8; wire_len(64)];
        write_udp(&mut f, &ep(), &tag());
        let Received::Udp(u) = parse(&f) else { panic!("not UDP") };
        assert_eq!(u.payload_len, TAG_LEN);
        assert!(u.ip.valid && u.valid);
        assert_eq!((u.ip.src, u.sport, u.ip.dst, u.dport, u.ip.ttl), (0x6440_0101, 1024, 0xc633_6415, 5001, SEND_TTL));
        // The stamp keeps its low 48 bits.
        assert_eq!(u.tag, Some(Tag { stamp_ns: 42, ..tag() }));
    }

    #[test]
    fn every_rfc_2544_size_round_trips_with_valid_checksums() {
        for size in [64, 128, 132, 256, 512, 1024, 1280, 1518] {
            let mut f = vec![0xaau8; wire_len(size)];
            write_udp(&mut f, &ep(), &tag());
            let Received::Udp(u) = parse(&f) else { panic!("size {size} not UDP") };
            assert!(u.ip.valid && u.valid, "size {size}");
            assert_eq!(u.payload_len, size - FCS_LEN - 42);
        }
    }

    #[test]
    fn a_changed_byte_fails_the_checksum() {
        let mut f = vec![0u8; wire_len(128)];
        write_udp(&mut f, &ep(), &tag());
        f[100] ^= 1;
        let Received::Udp(u) = parse(&f) else { panic!() };
        assert!(u.ip.valid && !u.valid);
    }

    #[test]
    fn checksums_match_rfc_1071_arithmetic_on_a_known_header() {
        // RFC 1071 section 3's example words sum to ddf2 (folded).
        assert_eq!(fold(sum16(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])), 0xddf2);
    }

    #[test]
    fn reversing_swaps_endpoints_and_keeps_the_tag() {
        let mut f = vec![0u8; wire_len(64)];
        write_udp(&mut f, &ep(), &tag());
        reverse_udp(&mut f, B, A, Direction::Reflected);
        let Received::Udp(u) = parse(&f) else { panic!() };
        assert!(u.ip.valid && u.valid);
        assert_eq!((u.ip.src, u.sport, u.ip.dst, u.dport), (0xc633_6415, 5001, 0x6440_0101, 1024));
        assert_eq!(u.tag.map(|t| (t.direction, t.seq, t.conn)), Some((Direction::Reflected, 123_456, 99)));
        assert_eq!(&f[0..12], &[A, B].concat()[..]);
    }

    #[test]
    fn syn_and_its_answer_parse() {
        let mut f = [0u8; 60];
        write_tcp(&mut f, &ep(), TCP_SYN, 77, 0);
        let Received::Tcp(t) = parse(&f) else { panic!() };
        assert!(t.valid && t.ip.valid);
        assert_eq!((t.flags, t.seq, t.sport, t.dport), (TCP_SYN, 77, 1024, 5001));
    }

    #[test]
    fn arp_requests_are_answered_for_the_target() {
        let req = arp_request(A, 0x6440_0001, 0x6440_0105);
        let Received::ArpRequest(q) = parse(&req) else { panic!() };
        assert_eq!(q, Arp { sender_mac: A, sender: 0x6440_0001, target: 0x6440_0105 });
        assert_eq!(q.target, 0x6440_0105);
        let reply = arp_reply(&q, B);
        assert_eq!(&reply[0..6], &A);
        assert_eq!(&reply[20..22], &[0, 2]);
        assert_eq!(&reply[28..32], &[100, 64, 1, 5]);
        assert_eq!(&reply[38..42], &[100, 64, 0, 1]);
        // A reply is not a request.
        assert_eq!(parse(&reply), Received::Other);
    }

    #[test]
    fn truncated_frames_are_other_never_a_panic() {
        let mut f = vec![0u8; wire_len(64)];
        write_udp(&mut f, &ep(), &tag());
        for len in 0..f.len() {
            let _ = parse(&f[..len]);
        }
        assert_eq!(parse(&f[..40]), Received::Other);
    }

    #[test]
    fn stamps_wrap_at_48_bits() {
        assert_eq!(since_stamp(5, STAMP_MASK - 4), 10);
        assert_eq!(since_stamp(1 << 48 | 1000, 400), 600);
    }
}
