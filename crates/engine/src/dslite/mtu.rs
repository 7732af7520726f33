//! The MTU of each softwire. Every softwire starts at `[dslite] mtu`; an
//! ICMPv6 packet too big about a packet natrix encapsulated lowers the MTU
//! natrix uses towards that B4 (RFC 2473 section 7: the tunnel entry point
//! learns the tunnel's path MTU), never below the IPv6 minimum of 1280, for
//! ten minutes (RFC 8201 section 4: then the larger MTU is tried again).

use std::collections::HashMap;
use std::net::Ipv6Addr;

use natrix_wire::{checksum, get_u32_at, icmpv6, ipv6};

use super::{ipv6_dst, ipv6_src};
use crate::pipeline::frame::Ip6;

/// The most B4s with a lowered MTU natrix remembers: a bound against
/// packet too big floods; past it, further B4s keep the configured MTU
/// until lowered ones expire.
const MAX_LOWERED: usize = 1 << 16;
/// How long a lowered MTU holds (RFC 8201 section 4).
const LOWERED_FOR_S: u32 = 600;

#[derive(Default)]
pub(crate) struct SoftwireMtus {
    /// Per B4, its MTU and the second it goes back to the configured one.
    lowered: HashMap<Ipv6Addr, (u16, u32)>,
    /// When a full table may next forget what expired.
    next_sweep_s: u32,
}

impl SoftwireMtus {
    /// The outer MTU towards `b4` at `now_s`.
    pub fn of(&self, b4: &Ipv6Addr, configured: u16, now_s: u32) -> u16 {
        // Most AFTRs never see a packet too big: no hash of the address then.
        if self.lowered.is_empty() {
            return configured;
        }
        match self.lowered.get(b4) {
            Some(&(m, until_s)) if now_s < until_s => m.min(configured),
            _ => configured,
        }
    }

    /// Reads the ICMPv6 message `ip` addressed to `cfg.aftr` at `now_s`:
    /// when it is a valid packet too big quoting a softwire packet from the
    /// AFTR to a B4 `cfg` accepts, lowers that B4's MTU and returns the B4.
    pub fn on_icmpv6(&mut self, frame: &[u8], ip: &Ip6, cfg: &super::DsliteConfig, now_s: u32) -> Option<Ipv6Addr> {
        let (b4, reported) = packet_too_big(frame, ip, cfg.aftr)?;
        let mtu = reported.clamp(ipv6::MIN_MTU as u32, u32::from(u16::MAX)) as u16;
        if !cfg.accepts(b4) || mtu >= self.of(&b4, cfg.mtu, now_s) || !self.room_for(&b4, now_s) {
            return None;
        }
        self.lowered.insert(b4, (mtu, now_s + LOWERED_FOR_S));
        Some(b4)
    }

    /// Whether `b4` may be remembered: a full table first forgets what
    /// expired, at most once a second.
    fn room_for(&mut self, b4: &Ipv6Addr, now_s: u32) -> bool {
        if self.lowered.len() < MAX_LOWERED || self.lowered.contains_key(b4) {
            return true;
        }
        if now_s >= self.next_sweep_s {
            self.next_sweep_s = now_s + 1;
            self.lowered.retain(|_, &mut (_, until_s)| now_s < until_s);
        }
        self.lowered.len() < MAX_LOWERED
    }

    pub fn memory_bytes(&self) -> usize {
        self.lowered.capacity() * (std::mem::size_of::<(Ipv6Addr, (u16, u32))>() + 1)
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
