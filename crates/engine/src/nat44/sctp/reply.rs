//! The SCTP packets natrix sends itself, as a middlebox (the M bit,
//! draft-ietf-tsvwg-natsupp): an ABORT for an INIT that collides (seed 001
//! section 5.2.1), an ERROR for a packet with no state (section 3.3) or an
//! ASCONF that collides. Each goes back to the sender, addresses and ports
//! swapped, from the side it came in on, with its CRC32c computed (the only
//! CRC natrix computes), within the router's budget for ICMP errors.

use natrix_wire::sctp::{self, cause, chunk, flags};
use natrix_wire::{ethernet, ipv4, proto};

use crate::pipeline::frame::Ip;
use crate::pipeline::router::Router;
use crate::Side;

/// An answer is at most as large as an ICMP error (RFC 1812 section
/// 4.3.2.3's 576 bytes, natrix's choice): the quoted chunk or packet is cut
/// to fit, as the draft allows.
const ANSWER_MAX: usize = 576;
const FIXED: usize = ipv4::MIN_HEADER_LEN + sctp::HEADER_LEN + sctp::CHUNK_HEADER_LEN + cause::HEADER_LEN;

/// What to answer with.
pub(super) struct Answer<'a> {
    pub chunk_type: u8,
    pub flags: u8,
    pub verification_tag: u32,
    pub cause: u16,
    /// The cause's information: the offending chunk or packet.
    pub info: &'a [u8],
}

/// ABORT-M for an INIT that collides: its tag is the INIT's own Initiate
/// Tag, T bit clear (RFC 9260 section 8.4), with the INIT chunk quoted.
pub(super) fn collision_abort(init_tag: u32, init_chunk: &[u8]) -> Answer<'_> {
    Answer { chunk_type: chunk::ABORT, flags: flags::M, verification_tag: init_tag, cause: cause::VTAG_AND_PORT_COLLISION, info: init_chunk }
}

/// ERROR-M for an ASCONF that collides: the packet's own tag reflected (T bit).
pub(super) fn collision_error(packet_tag: u32, asconf_chunk: &[u8]) -> Answer<'_> {
    Answer { chunk_type: chunk::ERROR, flags: flags::M | flags::T, verification_tag: packet_tag, cause: cause::VTAG_AND_PORT_COLLISION, info: asconf_chunk }
}

/// ERROR-M "Missing State" for a packet that matched no association: its
/// own tag reflected (T bit), the IPv4 packet quoted from its header on.
pub(super) fn missing_state(packet_tag: u32, ip_packet: &[u8]) -> Answer<'_> {
    Answer { chunk_type: chunk::ERROR, flags: flags::M | flags::T, verification_tag: packet_tag, cause: cause::MISSING_STATE, info: ip_packet }
}

/// Sends `a` back to the sender of the SCTP packet in `frame` (IPv4
/// header at `ip.l3`, SCTP at `ip.l4`), which arrived on `side`.
pub(super) fn send(router: &mut Router, frame: &[u8], ip: &Ip, side: Side, a: &Answer) {
    let ports = &frame[ip.l4..ip.l4 + 4];
    let (sport, dport) = (u16::from_be_bytes([ports[0], ports[1]]), u16::from_be_bytes([ports[2], ports[3]]));
    let info = &a.info[..a.info.len().min(ANSWER_MAX - FIXED)];
    router.emit_answer(side, frame, |out, ident| {
        out.extend_from_slice(&frame[..ip.l3]);
        ethernet::swap_addresses(out);
        let at = out.len();
        let cause_len = cause::HEADER_LEN + info.len();
        let chunk_len = sctp::CHUNK_HEADER_LEN + cause_len;
        let sctp_len = sctp::HEADER_LEN + chunk_len.next_multiple_of(4);
        let total = ipv4::MIN_HEADER_LEN + sctp_len;
        out.resize(at + total, 0);
        let (ip_out, l4) = out[at..].split_at_mut(ipv4::MIN_HEADER_LEN);
        ipv4::emit_header(ip_out, ip.dst, ip.src, proto::SCTP, total as u16, 64, ident);
        // The lengths were computed to fit: these writes cannot fail.
        let written = sctp::emit_header(l4, dport, sport, a.verification_tag)
            .and_then(|()| sctp::emit_chunk_header(&mut l4[sctp::HEADER_LEN..], a.chunk_type, a.flags, chunk_len as u16))
            .and_then(|()| sctp::emit_cause_header(&mut l4[sctp::HEADER_LEN + sctp::CHUNK_HEADER_LEN..], a.cause, cause_len as u16));
        debug_assert!(written.is_ok());
        let info_at = sctp::HEADER_LEN + sctp::CHUNK_HEADER_LEN + cause::HEADER_LEN;
        l4[info_at..info_at + info.len()].copy_from_slice(info);
        if let Ok(mut p) = sctp::Packet::new_checked(&mut l4[..]) {
            p.fill_checksum();
        }
    });
}
