//! ICMPv6 messages (RFC 4443) and the Neighbor Discovery messages natrix
//! answers and sends (RFC 4861): Neighbor Solicitation and Advertisement with
//! their link-layer address options.
//!
//! The checksum covers the IPv6 pseudo-header, so the checksum methods take
//! the addresses. Builders write a whole IPv6 packet (fixed header and ICMPv6
//! message, checksum filled); the caller adds the Ethernet header.

use std::net::Ipv6Addr;

use crate::checksum;
use crate::error::{need, Field, WireError};
use crate::icmp::Class;
use crate::ipv6;
use crate::{get_u16, get_u32, set_u16, set_u32};

/// Type, code, checksum and the 32-bit word every message type natrix handles has.
pub const HEADER_LEN: usize = 8;
/// A Neighbor Solicitation or Advertisement without options.
pub const ND_LEN: usize = 24;
/// Neighbor Discovery messages are sent with, and only accepted with, this hop limit (RFC 4861 section 7.1).
pub const ND_HOP_LIMIT: u8 = 255;
/// The hop limit of the errors natrix generates (its choice: RFC 4443 fixes none).
pub const ERROR_HOP_LIMIT: u8 = 64;
/// An error message holds at most this much of the offending packet, so that
/// the error fits the minimum MTU (RFC 4443 section 2.4 (c)).
pub const MAX_QUOTE_LEN: usize = ipv6::MIN_MTU - ipv6::HEADER_LEN - HEADER_LEN;
/// ff02::1, where an unsolicited advertisement goes (RFC 4861 section 7.2.4).
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    pub const IDENT: usize = 4;
    pub const SEQ: usize = 6;
    /// Errors: unused, the MTU (packet too big) or the pointer (parameter problem).
    pub const PARAM: usize = 4;
    pub const QUOTED: usize = 8;
    /// Neighbor Advertisement: R, S and O flags in the first byte of the reserved word.
    pub const NA_FLAGS: usize = 4;
    pub const TARGET: Range<usize> = 8..24;
    pub const ND_OPTIONS: usize = 24;
}

pub mod kind {
    pub const DEST_UNREACHABLE: u8 = 1;
    pub const PACKET_TOO_BIG: u8 = 2;
    pub const TIME_EXCEEDED: u8 = 3;
    pub const PARAMETER_PROBLEM: u8 = 4;
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
    pub const ROUTER_SOLICITATION: u8 = 133;
    pub const ROUTER_ADVERTISEMENT: u8 = 134;
    pub const NEIGHBOR_SOLICITATION: u8 = 135;
    pub const NEIGHBOR_ADVERTISEMENT: u8 = 136;
    pub const REDIRECT: u8 = 137;
}

/// Destination unreachable codes (RFC 4443 section 3.1).
pub mod unreachable {
    pub const NO_ROUTE: u8 = 0;
    pub const ADMIN_PROHIBITED: u8 = 1;
    pub const BEYOND_SCOPE: u8 = 2;
    pub const ADDRESS: u8 = 3;
    pub const PORT: u8 = 4;
    pub const SOURCE_POLICY: u8 = 5;
    pub const REJECT_ROUTE: u8 = 6;
}

/// Time exceeded codes (RFC 4443 section 3.3).
pub mod time_exceeded {
    pub const HOP_LIMIT: u8 = 0;
    pub const REASSEMBLY: u8 = 1;
}

/// Parameter problem codes (RFC 4443 section 3.4).
pub mod parameter_problem {
    pub const HEADER_FIELD: u8 = 0;
    pub const NEXT_HEADER: u8 = 1;
    pub const OPTION: u8 = 2;
}

/// Neighbor Advertisement flags, as they sit in the byte after the checksum (RFC 4861 section 4.4).
pub mod na_flags {
    pub const ROUTER: u8 = 0x80;
    pub const SOLICITED: u8 = 0x40;
    pub const OVERRIDE: u8 = 0x20;
}

/// Neighbor Discovery option types (RFC 4861 section 4.6).
pub mod nd_option {
    pub const SOURCE_LL_ADDR: u8 = 1;
    pub const TARGET_LL_ADDR: u8 = 2;
    pub const PREFIX_INFO: u8 = 3;
    pub const REDIRECTED_HEADER: u8 = 4;
    pub const MTU: u8 = 5;
}

/// What an ICMPv6 type means to a NAT: errors are types 0 to 127 (RFC 4443 section 2.1).
pub fn classify(msg_type: u8) -> Class {
    match msg_type {
        kind::ECHO_REQUEST => Class::QueryRequest,
        kind::ECHO_REPLY => Class::QueryReply,
        0..=127 => Class::Error,
        _ => Class::Other,
    }
}

/// A view over an ICMPv6 message (the IPv6 payload from the ICMPv6 header on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        need("icmpv6", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Packet { buffer })
    }

    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Echo identifier.
    pub fn ident(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::IDENT)
    }

    /// Echo sequence number.
    pub fn seq(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::SEQ)
    }

    /// An error's 32-bit word after the checksum: the MTU of a packet too big,
    /// the pointer of a parameter problem, zero (unused) otherwise.
    pub fn param(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::PARAM)
    }

    /// True when the checksum verifies with the pseudo-header of `src` and `dst`.
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        checksum::verify_v6(src, dst, ipv6::next_header::ICMPV6, self.buffer.as_ref())
    }

    /// The bytes after the 8-byte header: an error's quoted packet, an echo's data.
    pub fn quoted(&self) -> &[u8] {
        &self.buffer.as_ref()[field::QUOTED..]
    }

    /// An error's quoted packet as a lax IPv6 view: its payload may be cut short.
    pub fn quoted_packet(&self) -> Result<ipv6::Packet<&[u8]>, WireError> {
        ipv6::Packet::new_lax(self.quoted())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_msg_type(&mut self, v: u8) {
        self.buffer.as_mut()[field::TYPE] = v;
    }

    pub fn set_code(&mut self, v: u8) {
        self.buffer.as_mut()[field::CODE] = v;
    }

    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::IDENT, v);
    }

    pub fn set_seq(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::SEQ, v);
    }

    pub fn set_param(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::PARAM, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    /// Recomputes the checksum over the whole message and the pseudo-header.
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let c = checksum::checksum_v6(src, dst, ipv6::next_header::ICMPV6, self.buffer.as_ref());
        self.set_checksum(c);
    }

    pub fn quoted_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::QUOTED..]
    }
}

pub const IDENT_OFFSET: usize = field::IDENT;
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM;

/// One Neighbor Discovery option: its type and its whole bytes (type and
/// length included, `8 * length` of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NdOption<'a> {
    pub kind: u8,
    pub bytes: &'a [u8],
}

impl NdOption<'_> {
    /// The Ethernet address a source or target link-layer address option
    /// carries (length 1: 8 bytes); None for options of other lengths.
    pub fn ethernet_addr(&self) -> Option<[u8; 6]> {
        match self.bytes.len() {
            8 => self.bytes[2..8].try_into().ok(),
            _ => None,
        }
    }
}

/// The options of a Neighbor Discovery message, validated by `NeighborMessage::new_checked`.
#[derive(Debug, Clone)]
pub struct NdOptions<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for NdOptions<'a> {
    type Item = NdOption<'a>;

    fn next(&mut self) -> Option<NdOption<'a>> {
        // Lengths were checked in `new_checked`; a malformed tail ends the walk all the same.
        let len = usize::from(*self.rest.get(1)?) * 8;
        if len == 0 || len > self.rest.len() {
            return None;
        }
        let (opt, rest) = self.rest.split_at(len);
        self.rest = rest;
        Some(NdOption { kind: opt[0], bytes: opt })
    }
}

fn check_nd_options(mut b: &[u8]) -> Result<(), WireError> {
    let total = b.len();
    while !b.is_empty() {
        let at = total - b.len();
        need("ndp option", ND_LEN + at + 2, ND_LEN + total)?;
        let len = usize::from(b[1]) * 8;
        if len == 0 {
            // RFC 4861 section 4.6: a node must discard a message with an option of length zero.
            return Err(WireError::Malformed { layer: "ndp option", field: Field::Length, value: 0 });
        }
        need("ndp option", ND_LEN + at + len, ND_LEN + total)?;
        b = &b[len..];
    }
    Ok(())
}

/// A view over a Neighbor Solicitation or Advertisement (RFC 4861 sections 4.3, 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborMessage<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> NeighborMessage<T> {
    /// Validates the type (135 or 136), the code (0), the length (at least 24)
    /// and every option's length (not zero, within the message): the checks of
    /// RFC 4861 sections 7.1.1 and 7.1.2 that need only the message. The
    /// others need the IPv6 header: see `valid_for`.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        need("ndp", ND_LEN, b.len())?;
        let t = b[field::TYPE];
        if t != kind::NEIGHBOR_SOLICITATION && t != kind::NEIGHBOR_ADVERTISEMENT {
            return Err(WireError::Malformed { layer: "ndp", field: Field::Type, value: t.into() });
        }
        if b[field::CODE] != 0 {
            return Err(WireError::Malformed { layer: "ndp", field: Field::Code, value: b[field::CODE].into() });
        }
        check_nd_options(&b[field::ND_OPTIONS..])?;
        Ok(NeighborMessage { buffer })
    }

    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    pub fn is_solicitation(&self) -> bool {
        self.msg_type() == kind::NEIGHBOR_SOLICITATION
    }

    pub fn target_addr(&self) -> Ipv6Addr {
        let t: [u8; 16] = self.buffer.as_ref()[field::TARGET].try_into().expect("16 bytes");
        Ipv6Addr::from(t)
    }

    /// An advertisement's R, S and O flags (`na_flags`); zero in a solicitation.
    pub fn flags(&self) -> u8 {
        match self.is_solicitation() {
            true => 0,
            false => self.buffer.as_ref()[field::NA_FLAGS] & (na_flags::ROUTER | na_flags::SOLICITED | na_flags::OVERRIDE),
        }
    }

    pub fn options(&self) -> NdOptions<'_> {
        NdOptions { rest: &self.buffer.as_ref()[field::ND_OPTIONS..] }
    }

    /// The first source link-layer address option's Ethernet address.
    pub fn source_ll_addr(&self) -> Option<[u8; 6]> {
        self.options().find(|o| o.kind == nd_option::SOURCE_LL_ADDR).and_then(|o| o.ethernet_addr())
    }

    /// The first target link-layer address option's Ethernet address.
    pub fn target_ll_addr(&self) -> Option<[u8; 6]> {
        self.options().find(|o| o.kind == nd_option::TARGET_LL_ADDR).and_then(|o| o.ethernet_addr())
    }

    /// The remaining checks of RFC 4861 sections 7.1.1 and 7.1.2, which need the
    /// IPv6 header: hop limit 255; a target that is not multicast; a
    /// solicitation from the unspecified address goes to a solicited-node
    /// address and carries no source link-layer address option; an
    /// advertisement to a multicast address has the S flag clear. The checksum
    /// is the caller's to verify.
    pub fn valid_for(&self, hop_limit: u8, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        if hop_limit != ND_HOP_LIMIT || self.target_addr().is_multicast() {
            return false;
        }
        match self.is_solicitation() {
            true => !src.is_unspecified() || (is_solicited_node(dst) && self.source_ll_addr().is_none()),
            false => !dst.is_multicast() || self.flags() & na_flags::SOLICITED == 0,
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// The solicited-node multicast address of `addr`: ff02::1:ff00:0/104 with
/// `addr`'s low 24 bits (RFC 4291 section 2.7.1). Solicitations for `addr` go there.
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::from([0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, o[13], o[14], o[15]])
}

/// True for a solicited-node multicast address (ff02::1:ff00:0/104).
pub fn is_solicited_node(addr: Ipv6Addr) -> bool {
    addr.octets()[..13] == [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff]
}

/// The Ethernet address an IPv6 multicast address maps to: 33:33 and the
/// address's low 32 bits (RFC 2464 section 7).
pub fn multicast_mac(addr: Ipv6Addr) -> [u8; 6] {
    let o = addr.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// Writes an ND message header, its target and one link-layer address option
/// after a fixed IPv6 header, and fills the checksum; returns the packet length.
fn emit_nd(buf: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr, msg_type: u8, flags: u8, target: Ipv6Addr, ll: Option<(u8, [u8; 6])>) -> Result<usize, WireError> {
    let icmp_len = ND_LEN + if ll.is_some() { 8 } else { 0 };
    let total = ipv6::HEADER_LEN + icmp_len;
    need("ndp emit", total, buf.len())?;
    ipv6::emit_header(buf, src, dst, ipv6::next_header::ICMPV6, icmp_len as u16, ND_HOP_LIMIT)?;
    let m = &mut buf[ipv6::HEADER_LEN..total];
    m.fill(0);
    m[field::TYPE] = msg_type;
    m[field::NA_FLAGS] = flags;
    m[field::TARGET].copy_from_slice(&target.octets());
    if let Some((opt, mac)) = ll {
        m[field::ND_OPTIONS] = opt;
        m[field::ND_OPTIONS + 1] = 1;
        m[field::ND_OPTIONS + 2..field::ND_OPTIONS + 8].copy_from_slice(&mac);
    }
    let c = checksum::checksum_v6(src, dst, ipv6::next_header::ICMPV6, m);
    set_u16(m, field::CHECKSUM, c);
    Ok(total)
}

/// A Neighbor Advertisement to build (RFC 4861 section 4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborAdvert {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub target: Ipv6Addr,
    /// `na_flags` bits.
    pub flags: u8,
    /// The target link-layer address option, if any.
    pub target_ll: Option<[u8; 6]>,
}

impl NeighborAdvert {
    /// The answer to a solicitation from `ns_src` for `target`, an address
    /// natrix owns on the interface with Ethernet address `mac` (RFC 4861
    /// section 7.2.4): from `target`, with the target link-layer address, O
    /// set (natrix is the address's owner) and R set when natrix routes. A
    /// solicitation from the unspecified address (duplicate address
    /// detection) is answered to all-nodes with S clear; any other to its
    /// source with S set.
    pub fn answer(ns_src: Ipv6Addr, target: Ipv6Addr, mac: [u8; 6], router: bool) -> NeighborAdvert {
        let r = if router { na_flags::ROUTER } else { 0 };
        let (dst, s) = match ns_src.is_unspecified() {
            true => (ALL_NODES, 0),
            false => (ns_src, na_flags::SOLICITED),
        };
        NeighborAdvert { src: target, dst, target, flags: r | s | na_flags::OVERRIDE, target_ll: Some(mac) }
    }

    /// Bytes `emit` writes: the IPv6 header and the message.
    pub fn packet_len(&self) -> usize {
        ipv6::HEADER_LEN + ND_LEN + if self.target_ll.is_some() { 8 } else { 0 }
    }

    /// Writes the IPv6 packet (hop limit 255, checksum filled) at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let ll = self.target_ll.map(|m| (nd_option::TARGET_LL_ADDR, m));
        emit_nd(buf, self.src, self.dst, kind::NEIGHBOR_ADVERTISEMENT, self.flags, self.target, ll)
    }
}

/// A Neighbor Solicitation to build (RFC 4861 section 4.3), to learn a next hop's Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborSolicit {
    pub src: Ipv6Addr,
    /// The solicited-node address of `target` for address resolution, the target itself to probe reachability.
    pub dst: Ipv6Addr,
    pub target: Ipv6Addr,
    /// The source link-layer address option; must be None when `src` is unspecified.
    pub source_ll: Option<[u8; 6]>,
}

impl NeighborSolicit {
    /// Address resolution of `target` from `src` on the interface with Ethernet address `mac`.
    pub fn resolve(src: Ipv6Addr, target: Ipv6Addr, mac: [u8; 6]) -> NeighborSolicit {
        NeighborSolicit { src, dst: solicited_node(target), target, source_ll: Some(mac) }
    }

    pub fn packet_len(&self) -> usize {
        ipv6::HEADER_LEN + ND_LEN + if self.source_ll.is_some() { 8 } else { 0 }
    }

    /// Writes the IPv6 packet (hop limit 255, checksum filled) at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let ll = self.source_ll.map(|m| (nd_option::SOURCE_LL_ADDR, m));
        emit_nd(buf, self.src, self.dst, kind::NEIGHBOR_SOLICITATION, 0, self.target, ll)
    }
}

/// An ICMPv6 error to build (RFC 4443 section 2.4): it quotes as much of the
/// offending packet as fits in the minimum MTU of 1280 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorMessage<'a> {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub msg_type: u8,
    pub code: u8,
    /// The word after the checksum: MTU (packet too big), pointer (parameter problem) or 0.
    pub param: u32,
    pub hop_limit: u8,
    /// The offending IPv6 packet from its fixed header to the end of its
    /// payload (no Ethernet padding); `emit` quotes at most `MAX_QUOTE_LEN` of it.
    pub offending: &'a [u8],
}

impl<'a> ErrorMessage<'a> {
    /// Time exceeded, hop limit exceeded in transit (code 0), from `src` (the
    /// address of the interface the error leaves by) to the offending
    /// packet's source. Errors if `offending` is not an IPv6 header.
    pub fn time_exceeded(src: Ipv6Addr, offending: &'a [u8]) -> Result<ErrorMessage<'a>, WireError> {
        let o = ipv6::Packet::new_lax(offending)?;
        Ok(ErrorMessage { src, dst: o.src_addr(), msg_type: kind::TIME_EXCEEDED, code: time_exceeded::HOP_LIMIT, param: 0, hop_limit: ERROR_HOP_LIMIT, offending })
    }

    /// How many bytes of the offending packet the error quotes.
    pub fn quote_len(&self) -> usize {
        self.offending.len().min(MAX_QUOTE_LEN)
    }

    /// Bytes `emit` writes: at most `ipv6::MIN_MTU`.
    pub fn packet_len(&self) -> usize {
        ipv6::HEADER_LEN + HEADER_LEN + self.quote_len()
    }

    /// Writes the IPv6 packet (checksum filled) at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let total = self.packet_len();
        need("icmpv6 emit", total, buf.len())?;
        let icmp_len = total - ipv6::HEADER_LEN;
        ipv6::emit_header(buf, self.src, self.dst, ipv6::next_header::ICMPV6, icmp_len as u16, self.hop_limit)?;
        let m = &mut buf[ipv6::HEADER_LEN..total];
        m[field::TYPE] = self.msg_type;
        m[field::CODE] = self.code;
        set_u16(m, field::CHECKSUM, 0);
        set_u32(m, field::PARAM, self.param);
        m[field::QUOTED..].copy_from_slice(&self.offending[..icmp_len - HEADER_LEN]);
        let c = checksum::checksum_v6(self.src, self.dst, ipv6::next_header::ICMPV6, m);
        set_u16(m, field::CHECKSUM, c);
        Ok(total)
    }
}

/// Whether RFC 4443 section 2.4 (e) allows an error of `msg_type`/`code`
/// about `offending` (an IPv6 packet, lax): not about an ICMPv6 error, nor
/// about a packet from the unspecified or a multicast address, nor about one
/// sent to a multicast address (except packet too big and parameter problem
/// code 2). A packet whose extension headers cannot be walked, or a non-first
/// fragment, cannot be shown to be an ICMPv6 error and is answered. Whether
/// the packet came as a link-layer multicast or broadcast, and rate limiting
/// (section 2.4 (f)), are the caller's to check.
pub fn may_send_error(offending: &[u8], msg_type: u8, code: u8) -> bool {
    let Ok(p) = ipv6::Packet::new_lax(offending) else {
        return false;
    };
    let src = p.src_addr();
    if src.is_unspecified() || src.is_multicast() {
        return false;
    }
    let multicast_ok = msg_type == kind::PACKET_TOO_BIG || (msg_type == kind::PARAMETER_PROBLEM && code == parameter_problem::OPTION);
    if p.dst_addr().is_multicast() && !multicast_ok {
        return false;
    }
    match p.upper_layer() {
        Ok(u) if u.protocol == ipv6::next_header::ICMPV6 && u.has_header() => offending.get(u.offset).is_none_or(|&t| t >= 128),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    const A1: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    const A2: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    const ROUTER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xff);
    const LL1: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const MAC1: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const MAC2: [u8; 6] = [2, 0, 0, 0, 0, 2];

    // scapy 2.8.0: IPv6(src="2001:db8::1", dst="2001:db8::2", hlim=64)/ICMPv6EchoRequest(id=0x4242, seq=7, data=b"ping")
    const ECHO: &str = "60000000000c3a4020010db800000000000000000000000120010db80000000000000000000000028000032a4242000770696e67";
    // scapy: IPv6(src="fe80::1", dst="ff02::1:ff00:2", hlim=255)/ICMPv6ND_NS(tgt="2001:db8::2")/ICMPv6NDOptSrcLLAddr(lladdr="02:00:00:00:00:01")
    const NS: &str = "6000000000203afffe800000000000000000000000000001ff0200000000000000000001ff00000287004b5f0000000020010db80000000000000000000000020101020000000001";
    // scapy: IPv6(src="2001:db8::2", dst="fe80::1", hlim=255)/ICMPv6ND_NA(tgt="2001:db8::2", R=1, S=1, O=1)/ICMPv6NDOptDstLLAddr(lladdr="02:00:00:00:00:02")
    const NA: &str = "6000000000203aff20010db8000000000000000000000002fe800000000000000000000000000001880039a9e000000020010db80000000000000000000000020201020000000002";
    // scapy: IPv6(src="::", dst="ff02::1:ff00:2", hlim=255)/ICMPv6ND_NS(tgt="2001:db8::2")
    const NS_DAD: &str = "6000000000183aff00000000000000000000000000000000ff0200000000000000000001ff00000287004ceb0000000020010db8000000000000000000000002";
    // scapy: IPv6(src="2001:db8::2", dst="ff02::1", hlim=255)/ICMPv6ND_NA(tgt="2001:db8::2", R=1, S=0, O=1)/ICMPv6NDOptDstLLAddr(lladdr="02:00:00:00:00:02")
    const NA_DAD: &str = "6000000000203aff20010db8000000000000000000000002ff02000000000000000000000000000188007927a000000020010db80000000000000000000000020201020000000002";
    // scapy: IPv6(src="2001:db8::1", dst="2001:db8:1::2", hlim=1)/UDP(sport=5000, dport=33434)/b"probe"
    const OFFENDING: &str = "60000000000d110120010db800000000000000000000000120010db80001000000000000000000021388829a000dc96670726f6265";
    // scapy: IPv6(src="2001:db8::ff", dst="2001:db8::1", hlim=64)/ICMPv6TimeExceeded(code=0)/Raw(bytes(OFFENDING))
    const TIME_EXCEEDED: &str = "60000000003d3a4020010db80000000000000000000000ff20010db800000000000000000000000103002f260000000060000000000d110120010db800000000000000000000000120010db80001000000000000000000021388829a000dc96670726f6265";
    // scapy: big = IPv6(src="2001:db8::1", dst="2001:db8:1::2", hlim=1)/UDP(sport=5000, dport=33434)/(b"\x00"*1400):
    // its first 48 bytes; the rest are zeros. IPv6(src="2001:db8::ff", dst="2001:db8::1", hlim=64)
    // /ICMPv6TimeExceeded(code=0)/Raw(bytes(big)[:1232]) is 1280 bytes, payload length 1240, checksum 0x2a8b.
    const BIG_HEAD: &str = "600000000580110120010db800000000000000000000000120010db80001000000000000000000021388829a05800356";

    #[test]
    fn deconstruct_an_echo_built_by_scapy() {
        let b = hex(ECHO);
        let ip = ipv6::Packet::new_checked(&b[..]).unwrap();
        let p = Packet::new_checked(ip.payload()).unwrap();
        assert_eq!((p.msg_type(), p.code(), p.ident(), p.seq()), (kind::ECHO_REQUEST, 0, 0x4242, 7));
        assert_eq!(p.quoted(), b"ping");
        assert!(p.verify_checksum(A1, A2));
        assert!(!p.verify_checksum(A2, ROUTER));
        assert_eq!(classify(p.msg_type()), Class::QueryRequest);
        // etherparse computes the same checksum.
        let (h, rest) = etherparse::Icmpv6Header::from_slice(ip.payload()).unwrap();
        assert_eq!(h.icmp_type.calc_checksum(A1.octets(), A2.octets(), rest).unwrap(), p.checksum());
    }

    #[test]
    fn ident_rewrite_and_fill_checksum() {
        let mut b = hex(ECHO);
        let mut p = Packet::new_checked(&mut b[40..]).unwrap();
        p.set_ident(9);
        assert!(!p.verify_checksum(A1, A2));
        p.fill_checksum(A1, A2);
        assert!(p.verify_checksum(A1, A2));
        p.set_ident(0x4242);
        p.fill_checksum(A1, A2);
        assert_eq!(b, hex(ECHO));
    }

    #[test]
    fn classifies() {
        assert_eq!(classify(kind::TIME_EXCEEDED), Class::Error);
        assert_eq!(classify(kind::PACKET_TOO_BIG), Class::Error);
        assert_eq!(classify(100), Class::Error);
        assert_eq!(classify(kind::ECHO_REPLY), Class::QueryReply);
        assert_eq!(classify(kind::NEIGHBOR_SOLICITATION), Class::Other);
    }

    #[test]
    fn deconstruct_a_solicitation_built_by_scapy() {
        let b = hex(NS);
        let ip = ipv6::Packet::new_checked(&b[..]).unwrap();
        let icmp = Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum(ip.src_addr(), ip.dst_addr()));
        let ns = NeighborMessage::new_checked(ip.payload()).unwrap();
        assert!(ns.is_solicitation());
        assert_eq!(ns.target_addr(), A2);
        assert_eq!(ns.source_ll_addr(), Some(MAC1));
        assert_eq!(ns.target_ll_addr(), None);
        assert_eq!(ns.flags(), 0);
        assert_eq!(ns.options().count(), 1);
        assert_eq!(ip.dst_addr(), solicited_node(A2));
        assert!(ns.valid_for(ip.hop_limit(), ip.src_addr(), ip.dst_addr()));
        assert!(!ns.valid_for(64, ip.src_addr(), ip.dst_addr()));
        assert_eq!(multicast_mac(ip.dst_addr()), [0x33, 0x33, 0xff, 0, 0, 2]);
    }

    #[test]
    fn answers_a_solicitation_as_scapy_builds_the_advertisement() {
        let b = hex(NS);
        let ip = ipv6::Packet::new_checked(&b[..]).unwrap();
        let ns = NeighborMessage::new_checked(ip.payload()).unwrap();
        let na = NeighborAdvert::answer(ip.src_addr(), ns.target_addr(), MAC2, true);
        let mut out = [0u8; 80];
        let n = na.emit(&mut out).unwrap();
        assert_eq!(n, na.packet_len());
        assert_eq!(&out[..n], &hex(NA)[..]);
        // Parse it back.
        let ip = ipv6::Packet::new_checked(&out[..n]).unwrap();
        let m = NeighborMessage::new_checked(ip.payload()).unwrap();
        assert_eq!(m.flags(), na_flags::ROUTER | na_flags::SOLICITED | na_flags::OVERRIDE);
        assert_eq!(m.target_ll_addr(), Some(MAC2));
        assert!(m.valid_for(ip.hop_limit(), ip.src_addr(), ip.dst_addr()));
        for len in 0..n {
            assert!(na.emit(&mut out[..len]).is_err(), "len {len}");
        }
    }

    #[test]
    fn answers_duplicate_address_detection_to_all_nodes() {
        let b = hex(NS_DAD);
        let ip = ipv6::Packet::new_checked(&b[..]).unwrap();
        let ns = NeighborMessage::new_checked(ip.payload()).unwrap();
        assert!(ns.valid_for(255, ip.src_addr(), ip.dst_addr()));
        assert!(!ns.valid_for(255, ip.src_addr(), A2), "DAD must go to a solicited-node address");
        let na = NeighborAdvert::answer(ip.src_addr(), ns.target_addr(), MAC2, true);
        let mut out = [0u8; 72];
        assert_eq!(na.emit(&mut out), Ok(72));
        assert_eq!(&out[..], &hex(NA_DAD)[..]);
    }

    #[test]
    fn a_solicitation_round_trips() {
        let ns = NeighborSolicit::resolve(LL1, A2, MAC1);
        let mut out = [0u8; 72];
        assert_eq!(ns.emit(&mut out), Ok(72));
        assert_eq!(&out[..], &hex(NS)[..]);
        let ns = NeighborSolicit { src: Ipv6Addr::UNSPECIFIED, dst: solicited_node(A2), target: A2, source_ll: None };
        let mut out = [0u8; 64];
        assert_eq!(ns.emit(&mut out), Ok(64));
        assert_eq!(&out[..], &hex(NS_DAD)[..]);
    }

    #[test]
    fn neighbor_messages_refuse_bad_types_codes_and_options() {
        let mut b = hex(NS);
        assert!(NeighborMessage::new_checked(&b[40..]).is_ok());
        b[41] = 1;
        assert_eq!(NeighborMessage::new_checked(&b[40..]), Err(WireError::Malformed { layer: "ndp", field: Field::Code, value: 1 }));
        b[41] = 0;
        b[40] = kind::ECHO_REQUEST;
        assert_eq!(NeighborMessage::new_checked(&b[40..]).unwrap_err().to_string(), "ndp: invalid type 128");
        b[40] = kind::NEIGHBOR_SOLICITATION;
        b[65] = 0;
        assert_eq!(NeighborMessage::new_checked(&b[40..]).unwrap_err().to_string(), "ndp option: invalid length 0");
        b[65] = 2;
        assert_eq!(NeighborMessage::new_checked(&b[40..]).unwrap_err().to_string(), "ndp option: truncated, needs 40 bytes, has 32");
    }

    #[test]
    fn every_truncation_is_an_error() {
        for fixture in [ECHO, NS, NA, NS_DAD, NA_DAD, TIME_EXCEEDED] {
            let b = hex(fixture);
            let m = &b[40..];
            for len in 0..HEADER_LEN {
                assert!(Packet::new_checked(&m[..len]).is_err(), "len {len}");
            }
            let nd = NeighborMessage::new_checked(m).is_ok();
            for len in 0..m.len() {
                // Each fixture has at most one option: a cut is valid only
                // where the message stops before it.
                if nd && len != ND_LEN || len < ND_LEN {
                    assert!(NeighborMessage::new_checked(&m[..len]).is_err(), "{fixture} len {len}");
                }
                // A cut message never verifies and never panics.
                if let Ok(p) = Packet::new_checked(&m[..len]) {
                    let _ = p.quoted_packet().map(|q| q.upper_layer());
                    let ip = ipv6::Packet::new_checked(&b[..]).unwrap();
                    assert!(!p.verify_checksum(ip.src_addr(), ip.dst_addr()), "{fixture} len {len}");
                }
            }
        }
    }

    #[test]
    fn time_exceeded_matches_scapy_and_quotes_a_lax_packet() {
        let off = hex(OFFENDING);
        let e = ErrorMessage::time_exceeded(ROUTER, &off).unwrap();
        assert_eq!(e.dst, A1);
        let mut out = [0u8; 128];
        let n = e.emit(&mut out).unwrap();
        assert_eq!(&out[..n], &hex(TIME_EXCEEDED)[..]);
        let ip = ipv6::Packet::new_checked(&out[..n]).unwrap();
        let p = Packet::new_checked(ip.payload()).unwrap();
        assert!(p.verify_checksum(ROUTER, A1));
        assert_eq!(classify(p.msg_type()), Class::Error);
        let q = p.quoted_packet().unwrap();
        assert_eq!(q.hop_limit(), 1);
        assert_eq!(q.upper_layer().unwrap().protocol, ipv6::next_header::UDP);
        // etherparse reads the same message and checksum.
        let (h, rest) = etherparse::Icmpv6Header::from_slice(ip.payload()).unwrap();
        assert_eq!(h.icmp_type, etherparse::Icmpv6Type::TimeExceeded(etherparse::icmpv6::TimeExceededCode::HopLimitExceeded));
        assert_eq!(h.icmp_type.calc_checksum(ROUTER.octets(), A1.octets(), rest).unwrap(), p.checksum());
        for len in 0..n {
            assert!(e.emit(&mut out[..len]).is_err());
        }
    }

    #[test]
    fn a_large_offending_packet_is_cut_to_the_minimum_mtu() {
        let mut off = hex(BIG_HEAD);
        off.resize(1448, 0);
        let e = ErrorMessage::time_exceeded(ROUTER, &off).unwrap();
        assert_eq!(e.quote_len(), 1232);
        let mut out = vec![0u8; 1500];
        let n = e.emit(&mut out).unwrap();
        assert_eq!(n, ipv6::MIN_MTU);
        let ip = ipv6::Packet::new_checked(&out[..n]).unwrap();
        assert_eq!(ip.payload_len(), 1240);
        let p = Packet::new_checked(ip.payload()).unwrap();
        assert_eq!(p.checksum(), 0x2a8b, "scapy's checksum");
        // The quoted packet claims more than it carries: only the lax view takes it.
        assert!(ipv6::Packet::new_checked(p.quoted()).is_err());
        assert_eq!(p.quoted_packet().unwrap().payload().len(), 1232 - 40);
    }

    #[test]
    fn rfc4443_limits_on_errors() {
        let off = hex(OFFENDING);
        assert!(may_send_error(&off, kind::TIME_EXCEEDED, 0));
        // Not about an ICMPv6 error.
        assert!(!may_send_error(&hex(TIME_EXCEEDED)[..], kind::TIME_EXCEEDED, 0));
        // About an echo request, yes.
        assert!(may_send_error(&hex(ECHO)[..], kind::TIME_EXCEEDED, 0));
        // Not about a packet to a multicast address, except packet too big and parameter problem code 2.
        let ns = hex(NS);
        assert!(!may_send_error(&ns, kind::TIME_EXCEEDED, 0));
        assert!(may_send_error(&ns, kind::PACKET_TOO_BIG, 0));
        assert!(may_send_error(&ns, kind::PARAMETER_PROBLEM, parameter_problem::OPTION));
        assert!(!may_send_error(&ns, kind::PARAMETER_PROBLEM, parameter_problem::HEADER_FIELD));
        // Not about a packet from the unspecified address, nor about something that is not IPv6.
        assert!(!may_send_error(&hex(NS_DAD)[..], kind::PACKET_TOO_BIG, 0));
        assert!(!may_send_error(&off[..39], kind::TIME_EXCEEDED, 0));
    }

    proptest::proptest! {
        #[test]
        fn views_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..96), t in proptest::bool::ANY) {
            let mut b = b;
            if let Some(first) = b.first_mut() {
                *first = if t { kind::NEIGHBOR_SOLICITATION } else { kind::NEIGHBOR_ADVERTISEMENT };
            }
            if let Some(code) = b.get_mut(1) {
                *code = 0;
            }
            if let Ok(m) = NeighborMessage::new_checked(&b[..]) {
                let _ = (m.target_addr(), m.flags(), m.source_ll_addr(), m.target_ll_addr(), m.valid_for(255, A1, A2));
                proptest::prop_assert!(m.options().count() <= b.len() / 8);
            }
            if let Ok(p) = Packet::new_checked(&b[..]) {
                let _ = p.quoted_packet().map(|q| q.upper_layer());
            }
            let _ = may_send_error(&b, kind::TIME_EXCEEDED, 0);
        }
    }
}
