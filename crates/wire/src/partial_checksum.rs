//! Transport checksums a sender left for its NIC to finish.
//!
//! A kernel that sends TCP or UDP through an interface with checksum
//! offload (a veth has it by default) writes only the pseudo-header's sum
//! into the checksum field and marks the packet for the hardware to finish
//! (CHECKSUM_PARTIAL). Over a veth no hardware ever does: the frame reaches
//! the peer that way, and the peer's kernel, which knows the mark, trusts
//! it. A program that reads the frame's bytes does not know it. AF_PACKET
//! says so (TP_STATUS_CSUMNOTREADY); AF_XDP says nothing. Other checksums
//! an offload leaves (SCTP's CRC32c, one inside a tunnel) are not these. A NAT that
//! updates such a field incrementally sends on a checksum that no receiver
//! accepts. So the field is finished here first: from scratch where the
//! mark is known (`complete`), and where it is not (`complete_if_partial`),
//! where the field holds exactly the pseudo-header's sum and the whole
//! does not verify.

use crate::checksum::{fold, fold64, pseudo_header_sum, pseudo_header_sum_v6, sum};
use crate::{get_u16, proto};

const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const IPV6_HEADER: usize = 40;

/// A frame's TCP segment or UDP datagram: where it lies, where its
/// checksum field is, and its pseudo-header's sum.
struct Transport {
    start: usize,
    end: usize,
    field: usize,
    pseudo: u32,
    udp: bool,
}

/// Finishes the TCP or UDP checksum of `frame` (Ethernet, untagged IPv4,
/// or IPv6 with the transport header right after the fixed header) where
/// its field holds exactly the pseudo-header's sum and the whole does not
/// verify, as a sender's offload leaves it. Whether it did.
///
/// A complete checksum that happens to equal that sum verifies and is
/// left alone. A corrupt one that happens to (one in 65,535 corrupt
/// frames) is finished over the bytes as they are, which only a
/// receiver's own checks could have caught anyway.
pub fn complete_if_partial(frame: &mut [u8]) -> bool {
    let Some(t) = transport(frame).filter(|t| holds_pseudo_header_sum(frame, t)) else { return false };
    let field = get_u16(frame, t.field);
    let whole = sum(&frame[t.start..t.end]);
    if fold(fold64(u64::from(t.pseudo) + u64::from(whole))) == 0xffff {
        return false;
    }
    // The field's own value taken back out of the sum it is part of.
    write(frame, &t, fold64(u64::from(whole) + u64::from(!field)));
    true
}

/// Whether `frame`'s TCP or UDP checksum field (as for
/// `complete_if_partial`) holds exactly its pseudo-header's sum, as an
/// offload leaves it; whether the whole verifies is not checked, so one
/// whole frame in 65,535 says yes too.
pub fn looks_partial(frame: &[u8]) -> bool {
    transport(frame).is_some_and(|t| holds_pseudo_header_sum(frame, &t))
}

/// Computes the TCP or UDP checksum of `frame` (as for
/// `complete_if_partial`) from scratch, whatever its field holds: for a
/// frame known to carry a partial one. False where it has no such
/// transport header, or one cut short, or a UDP checksum of 0, which an
/// offload never leaves (its pseudo-header sum is never 0): that one is
/// some other protocol's partial checksum, such as a tunnel's.
pub fn complete(frame: &mut [u8]) -> bool {
    let Some(t) = transport(frame) else { return false };
    let field = get_u16(frame, t.field);
    if t.udp && field == 0 {
        return false;
    }
    let whole = sum(&frame[t.start..t.end]);
    write(frame, &t, fold64(u64::from(whole) + u64::from(!field)));
    true
}

/// Whether the checksum field holds the pseudo-header's sum, one's
/// complement equal (0 and 0xffff alike). A UDP field of 0 means no
/// checksum (RFC 768).
fn holds_pseudo_header_sum(frame: &[u8], t: &Transport) -> bool {
    let field = get_u16(frame, t.field);
    !(t.udp && field == 0) && fold(fold64(u64::from(t.pseudo) + u64::from(!field))) == 0xffff
}

/// Writes the checksum of a transport whose bytes, less the field, sum to
/// `rest`. A UDP checksum computed as 0 is sent as all ones (RFC 768).
fn write(frame: &mut [u8], t: &Transport, rest: u32) {
    let c = !fold(fold64(u64::from(t.pseudo) + u64::from(rest)));
    let c = if t.udp && c == 0 { 0xffff } else { c };
    frame[t.field..t.field + 2].copy_from_slice(&c.to_be_bytes());
}

/// The TCP segment or UDP datagram of an untagged IPv4 or IPv6 frame.
fn transport(frame: &[u8]) -> Option<Transport> {
    match u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) {
        ETHERTYPE_IPV4 => transport_v4(frame),
        ETHERTYPE_IPV6 => transport_v6(frame),
        _ => None,
    }
}

/// An IPv4 datagram's transport, not a fragment: offloads never leave a
/// fragment's checksum partial.
fn transport_v4(frame: &[u8]) -> Option<Transport> {
    let ip = frame.get(ETH_HEADER..ETH_HEADER + 20)?;
    let header_len = usize::from(ip[0] & 0x0f) * 4;
    if ip[0] >> 4 != 4 || header_len < 20 || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let (start, end) = (ETH_HEADER + header_len, ETH_HEADER + total);
    let len = u16::try_from(end.checked_sub(start)?).ok()?;
    let src = u32::from_be_bytes([ip[12], ip[13], ip[14], ip[15]]);
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let pseudo = |p| pseudo_header_sum(src, dst, p, len);
    located(frame, ip[9], start, end, pseudo)
}

/// An IPv6 packet's transport where it follows the fixed header; behind
/// extension headers it is left alone.
fn transport_v6(frame: &[u8]) -> Option<Transport> {
    let ip = frame.get(ETH_HEADER..ETH_HEADER + IPV6_HEADER)?;
    if ip[0] >> 4 != 6 {
        return None;
    }
    let start = ETH_HEADER + IPV6_HEADER;
    let len = u16::from_be_bytes([ip[4], ip[5]]);
    let address = |at: usize| -> [u8; 16] { ip[at..at + 16].try_into().expect("16 bytes") };
    let (src, dst) = (address(8).into(), address(24).into());
    let pseudo = |p| pseudo_header_sum_v6(src, dst, p, u32::from(len));
    located(frame, ip[6], start, start + usize::from(len), pseudo)
}

/// The transport of protocol `p` in `frame[start..end]`, where it is TCP
/// or UDP and whole within the frame.
fn located(frame: &[u8], p: u8, start: usize, end: usize, pseudo: impl Fn(u8) -> u32) -> Option<Transport> {
    let (at, min_len) = match p {
        proto::TCP => (16, 20),
        proto::UDP => (6, 8),
        _ => return None,
    };
    if end > frame.len() || end < start + min_len {
        return None;
    }
    Some(Transport { start, end, field: start + at, pseudo: pseudo(p), udp: p == proto::UDP })
}

#[cfg(test)]
mod tests;
