//! The MTU of each softwire. Every softwire starts at `[dslite] mtu`; an
//! ICMPv6 packet too big about a packet natrix encapsulated lowers the MTU
//! natrix uses towards that B4 (RFC 2473 section 7: the tunnel entry point
//! learns the tunnel's path MTU), never below the IPv6 minimum of 1280.

use std::collections::HashMap;
use std::net::Ipv6Addr;

use natrix_wire::{checksum, get_u32_at, icmpv6, ipv6};

use super::{ipv6_dst, ipv6_src};
use crate::pipeline::frame::Ip6;

/// The most B4s with a lowered MTU natrix remembers: a bound against
/// packet too big floods; past it, further B4s keep the configured MTU.
const MAX_LOWERED: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct SoftwireMtus {
    lowered: HashMap<Ipv6Addr, u16>,
}

impl SoftwireMtus {
    /// The outer MTU towards `b4`.
    pub fn of(&self, b4: &Ipv6Addr, configured: u16) -> u16 {
        // Most AFTRs never see a packet too big: no hash of the address then.
        if self.lowered.is_empty() {
            return configured;
        }
        self.lowered.get(b4).map_or(configured, |&m| m.min(configured))
    }

    /// Reads the ICMPv6 message `ip` addressed to `aftr`: when it is a valid
    /// packet too big quoting a softwire packet from `aftr`, lowers that B4's
    /// MTU and returns the B4.
    pub fn on_icmpv6(&mut self, frame: &[u8], ip: &Ip6, aftr: Ipv6Addr, configured: u16) -> Option<Ipv6Addr> {
        let (b4, reported) = packet_too_big(frame, ip, aftr)?;
        let mtu = reported.clamp(ipv6::MIN_MTU as u32, u32::from(u16::MAX)) as u16;
        if mtu >= self.of(&b4, configured) || (self.lowered.len() >= MAX_LOWERED && !self.lowered.contains_key(&b4)) {
            return None;
        }
        self.lowered.insert(b4, mtu);
        Some(b4)
    }

    pub fn memory_bytes(&self) -> usize {
        self.lowered.capacity() * (std::mem::size_of::<(Ipv6Addr, u16)>() + 1)
    }
}

/// The B4 and MTU of a packet too big (RFC 4443 section 3.2) that quotes a
/// softwire packet natrix sent: checksum valid, quoted source the AFTR,
/// quoted next header IPv4 in IPv6 (or a fragment header, for a packet
/// natrix fragmented).
fn packet_too_big(frame: &[u8], ip: &Ip6, aftr: Ipv6Addr) -> Option<(Ipv6Addr, u32)> {
    if !ip.l4_header || ip.proto != natrix_wire::proto::ICMPV6 {
        return None;
    }
    let end = ip.l3 + ip.total;
    let msg = frame.get(ip.l4..end)?;
    if msg.len() < icmpv6::HEADER_LEN + ipv6::HEADER_LEN || msg[0] != icmpv6::kind::PACKET_TOO_BIG {
        return None;
    }
    if !checksum::verify_v6(ipv6_src(frame, ip.l3), ipv6_dst(frame, ip.l3), natrix_wire::proto::ICMPV6, msg) {
        return None;
    }
    let q = icmpv6::HEADER_LEN;
    let quoted_next = msg[q + 6];
    let is_softwire = quoted_next == ipv6::next_header::IPV4 || quoted_next == ipv6::next_header::FRAGMENT;
    (is_softwire && ipv6_src(msg, q) == aftr).then(|| (ipv6_dst(msg, q), get_u32_at(msg, 4)))
}
