//! The first stage: a frame is parsed and classified once, into a small
//! record later stages read instead of parsing again (VPP keeps the same in
//! its buffer metadata). Only the network layer is checked here; what a
//! transport header must hold is each translator's business, so a frame
//! that dies of TTL is answered before its ports are ever looked at.

use natrix_wire::{ethernet, ipv4, ipv6, tcp, WireError};

use crate::drop::DropReason;

/// A frame's network layer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Net {
    V4(Ip),
    V6(Ip6),
}

/// The parsed IPv4 layer of a frame; offsets are absolute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ip {
    pub l3: usize,
    pub l4: usize,
    pub l4_len: usize,
    pub proto: u8,
    pub src: u32,
    pub dst: u32,
    pub ttl: u8,
    pub ident: u16,
    pub first_frag: bool,
    pub later_frag: bool,
    pub dont_fragment: bool,
    /// The TCP flags of a segment whose header is in this frame; 0 otherwise.
    pub tcp_flags: u8,
}

impl Ip {
    /// Bytes of the datagram, header included.
    pub fn total_len(&self) -> usize {
        self.l4 - self.l3 + self.l4_len
    }
}

/// The parsed IPv6 layer of a frame; offsets are absolute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ip6 {
    pub l3: usize,
    /// Bytes from the fixed header to the end of the payload.
    pub total: usize,
    pub hop_limit: u8,
    /// The upper-layer protocol after the extension headers, and where its
    /// header starts; `l4_header` is false when the bytes there are not one
    /// (a non-first fragment, ESP, no next header).
    pub proto: u8,
    pub l4: usize,
    pub l4_header: bool,
}

/// Parses the network layer of `frame`, or says why it cannot be forwarded.
pub(crate) fn parse(frame: &[u8]) -> Result<Net, DropReason> {
    let eth = ethernet::Frame::new_checked(frame).map_err(|_| DropReason::EthTruncated)?;
    let l3 = eth.payload_offset();
    match eth.ethertype() {
        ethernet::ETHERTYPE_IPV4 => parse_ipv4(frame, l3).map(Net::V4),
        ethernet::ETHERTYPE_IPV6 => parse_ipv6(frame, l3).map(Net::V6),
        _ => Err(DropReason::NotIpv4),
    }
}

fn parse_ipv4(frame: &[u8], l3: usize) -> Result<Ip, DropReason> {
    let ip = parse_ipv4_any_address(frame, l3)?;
    if is_martian(ip.src) || is_martian(ip.dst) {
        return Err(DropReason::Martian);
    }
    Ok(ip)
}

/// `parse_ipv4` without the address check, for a frame natrix translated
/// itself (whose destination may be a DS-Lite stand-in).
pub(crate) fn parse_ipv4_any_address(frame: &[u8], l3: usize) -> Result<Ip, DropReason> {
    let ip = ipv4::Packet::new_checked(&frame[l3..]).map_err(ipv4_reason)?;
    if !ip.verify_checksum() {
        return Err(DropReason::Ipv4BadChecksum);
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let hl = ip.header_len();
    let (l4, l4_len) = (l3 + hl, usize::from(ip.total_len()) - hl);
    let later_frag = ip.frag_offset() != 0;
    Ok(Ip {
        l3,
        l4,
        l4_len,
        proto: ip.protocol(),
        src,
        dst,
        ttl: ip.ttl(),
        ident: ip.ident(),
        first_frag: ip.more_frags() && !later_frag,
        later_frag,
        dont_fragment: ip.dont_frag(),
        tcp_flags: if later_frag { 0 } else { tcp_flags_of(ip.protocol(), &frame[l4..l4 + l4_len]) },
    })
}

fn parse_ipv6(frame: &[u8], l3: usize) -> Result<Ip6, DropReason> {
    let ip = ipv6::Packet::new_checked(&frame[l3..]).map_err(|e| match e {
        WireError::Truncated { .. } => DropReason::Ipv6Truncated,
        WireError::Malformed { .. } => DropReason::Ipv6BadHeader,
    })?;
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    if src.is_multicast() || src.is_unspecified() || src.is_loopback() || dst.is_unspecified() || dst.is_loopback() {
        return Err(DropReason::Martian);
    }
    // Headers that cannot be walked are refused here, before any function reads them.
    let upper = ip.upper_layer().map_err(|_| DropReason::Ipv6BadHeader)?;
    Ok(Ip6 { l3, total: ip.total_len(), hop_limit: ip.hop_limit(), proto: upper.protocol, l4: l3 + upper.offset, l4_header: upper.has_header() })
}

fn tcp_flags_of(proto: u8, l4: &[u8]) -> u8 {
    if proto != natrix_wire::proto::TCP {
        return 0;
    }
    tcp::Packet::new_checked(l4).map_or(0, |t| t.flags())
}

fn ipv4_reason(e: WireError) -> DropReason {
    use natrix_wire::Field;
    match e {
        WireError::Truncated { .. } => DropReason::Ipv4Truncated,
        WireError::Malformed { field: Field::Version, .. } => DropReason::Ipv4BadVersion,
        WireError::Malformed { field: Field::HeaderLength, .. } => DropReason::Ipv4BadHeaderLength,
        WireError::Malformed { .. } => DropReason::Ipv4BadTotalLength,
    }
}

/// Addresses that are never routed: 0/8, 127/8, multicast and above.
pub(crate) fn is_martian(addr: u32) -> bool {
    let first = addr >> 24;
    first == 0 || first == 127 || first >= 224
}
