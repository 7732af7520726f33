//! The DS-Lite AFTR (RFC 6333): softwires from B4s, IPv4 in IPv6 (RFC
//! 2473), terminated around the NAPT44 translator. A softwire packet is
//! decapsulated (`decap`), its inner IPv4 source replaced by the stand-in
//! that `state::identity` interns for (B4, inner address), and translated by
//! NAPT44 like any subscriber's; a frame NAPT44 sends towards a stand-in is
//! given its inner address back and encapsulated to its B4 (`encap`). So the
//! B4 is part of every key without growing one, and the B4 is the
//! subscriber for quotas, paired pooling and port blocks.
//!
//! Most softwire packets have one shape, which `plain` recognises from
//! fixed offsets; the pipeline then decapsulates them straight into
//! NAPT44's fast path.
//!
//! Around that: ECN carried across the softwire (`ecn`, RFC 6040), MSS clamping (`mss`), the softwire MTU per B4 that ICMPv6
//! packet too big lowers (`mtu`, RFC 2473 section 7), and reassembly of
//! fragmented softwire packets within bounded memory (`reassembly`, RFC
//! 6333 section 6.3).

pub(crate) mod decap;
pub(crate) mod ecn;
pub(crate) mod encap;
pub(crate) mod mss;
pub(crate) mod mtu;
pub(crate) mod plain;
pub(crate) mod reassembly;
pub(crate) mod stand_in;

use std::net::Ipv6Addr;

use natrix_wire::ipv6;

use crate::pipeline::frame::Ip6;

/// The AFTR's own IPv4 address (RFC 6333 section 5.7): the source of ICMPv4
/// errors natrix sends into a softwire.
pub const AFTR_IPV4: u32 = 0xc000_0001;
/// Hop limit of the packets natrix encapsulates (natrix's choice: RFC 6333 fixes none).
pub const HOP_LIMIT: u8 = 64;
/// Bytes encapsulation adds: the outer IPv6 header.
pub const OVERHEAD: usize = ipv6::HEADER_LEN;
/// Bytes of a packet too big for its softwire that its fragmentation
/// needed quotes: the IPv4 and transport headers with their options (RFC
/// 792 asks for the IPv4 header and 8 bytes).
const QUOTED: usize = 128;

/// A prefix of accepted B4 addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct B4Prefix {
    pub network: Ipv6Addr,
    pub len: u8,
}

impl B4Prefix {
    pub fn contains(&self, a: Ipv6Addr) -> bool {
        let len = u32::from(self.len);
        len == 0 || (u128::from(a) ^ u128::from(self.network)) >> (128 - len) == 0
    }
}

/// `[dslite]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsliteConfig {
    /// The softwire endpoint: softwire packets are addressed to it and
    /// encapsulated packets come from it.
    pub aftr: Ipv6Addr,
    /// Accepted B4 sources; empty accepts any.
    pub b4_prefixes: Vec<B4Prefix>,
    /// The outer IPv6 MTU of every softwire, until a packet too big lowers a B4's.
    pub mtu: u16,
    /// The MSS softwire SYNs are lowered to; None: no clamping.
    pub mss_clamp: Option<u16>,
    /// RFC 6040's compatibility mode: the outer header natrix writes is
    /// Not-ECT, for B4s that would not carry its congestion marks in;
    /// false: normal mode, the inner packet's ECN field copied out.
    pub ecn_compatibility: bool,
}

impl DsliteConfig {
    /// The clamp `mss_clamp = 0` means: the MTU less IPv6, IPv4 and TCP headers.
    pub fn default_clamp(mtu: u16) -> u16 {
        mtu - 80
    }

    #[inline]
    pub fn accepts(&self, b4: Ipv6Addr) -> bool {
        self.b4_prefixes.is_empty() || self.b4_prefixes.iter().any(|p| p.contains(b4))
    }
}

/// What DS-Lite has done, for reports and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DsliteStats {
    /// Softwire packets decapsulated (after reassembly: one per inner packet).
    pub decapsulated: u64,
    /// Packets encapsulated towards B4s (before outer fragmentation).
    pub encapsulated: u64,
    /// Outer fragments sent because a packet exceeded its softwire's MTU.
    pub fragmented: u64,
    /// Softwire packets rebuilt from fragments.
    pub reassembled: u64,
    /// Packet-too-big messages that lowered a softwire's MTU.
    pub mtu_lowered: u64,
    /// B4s with a stand-in (every B4 seen since start).
    pub softwires: u64,
    /// Softwire packets decapsulated whose inner and outer ECN fields make a
    /// combination no compliant encapsulator makes (RFC 6040 section 4.2:
    /// SHOULD log); Not-ECT inside CE is dropped and counted as a drop.
    pub ecn_unexpected: u64,
}

/// One B4's own counters, kept on its interned entry (`state::identity`)
/// for `natrix show --b4` and the API; not Prometheus labels, whose
/// series would number the B4s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SoftwireCounters {
    /// Its hosts' packets decapsulated and given their stand-ins.
    pub decapsulated: u64,
    /// Packets encapsulated towards it (before outer fragmentation).
    pub encapsulated: u64,
    /// Packet-too-big messages that lowered its softwire's MTU.
    pub mtu_lowered: u64,
}

/// How an IPv6 frame on the inside concerns DS-Lite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Not DS-Lite's: routed like other IPv6.
    None,
    /// IPv4 in IPv6 to the AFTR (whole or a fragment).
    Softwire,
    /// Anything else to the AFTR: natrix's own (a packet too big about a
    /// softwire is read; nothing is forwarded).
    ToAftr,
    /// IPv4 in IPv6 for another address: not a softwire natrix serves.
    WrongAftr,
}

/// DS-Lite's state in an engine.
pub(crate) struct Dslite {
    pub cfg: DsliteConfig,
    pub mtus: mtu::SoftwireMtus,
    pub reassembly: reassembly::Reassembly,
    pub stats: DsliteStats,
    /// Identification of the next outer fragment set (RFC 8200 section 4.5).
    frag_ident: u32,
    /// The head of a large inbound frame as it arrived, kept until it is
    /// known whether it goes into a softwire, so a fragmentation needed can
    /// quote it.
    pub original: Vec<u8>,
}

impl Dslite {
    pub fn new(cfg: DsliteConfig, max_held: u32, max_bytes: u32, timeout_ns: u64) -> Dslite {
        Dslite {
            cfg,
            mtus: mtu::SoftwireMtus::default(),
            reassembly: reassembly::Reassembly::new(max_held, max_bytes, timeout_ns),
            stats: DsliteStats::default(),
            frag_ident: 0,
            original: Vec::new(),
        }
    }

    /// How the inside IPv6 frame `ip` (parsed by the pipeline) concerns DS-Lite.
    pub fn claim(&self, frame: &[u8], ip: &Ip6) -> Claim {
        let dst = ipv6_dst(frame, ip.l3);
        let to_aftr = dst == self.cfg.aftr;
        match ip.proto {
            ipv6::next_header::IPV4 if to_aftr => Claim::Softwire,
            ipv6::next_header::IPV4 => Claim::WrongAftr,
            _ if to_aftr => Claim::ToAftr,
            _ => Claim::None,
        }
    }

    /// What of an inner TOS byte the outer header carries: its ECN field
    /// (RFC 6040's normal mode), or nothing (compatibility mode).
    #[inline(always)]
    pub fn ecn_mask(&self) -> u8 {
        if self.cfg.ecn_compatibility {
            0
        } else {
            0b11
        }
    }

    pub fn next_frag_ident(&mut self) -> u32 {
        self.frag_ident = self.frag_ident.wrapping_add(1);
        self.frag_ident
    }

    pub fn memory_bytes(&self) -> usize {
        self.mtus.memory_bytes() + self.reassembly.memory_bytes() + self.original.capacity()
    }

    /// Keeps the head of an inbound frame that may be too large for a
    /// softwire: its first `QUOTED` bytes of IPv4 (every header), all a
    /// fragmentation needed quotes. A short copy, since most large frames
    /// go to plain subscribers or fit.
    #[inline]
    pub fn keep_if_large(&mut self, frame: &[u8], l3: usize) {
        self.original.clear();
        if frame.len() - l3 + OVERHEAD > ipv6::MIN_MTU {
            self.original.extend_from_slice(&frame[..frame.len().min(l3 + QUOTED)]);
        }
    }
}

pub(crate) fn ipv6_src(frame: &[u8], l3: usize) -> Ipv6Addr {
    let o: [u8; 16] = frame[l3 + 8..l3 + 24].try_into().unwrap_or([0; 16]);
    Ipv6Addr::from(o)
}

pub(crate) fn ipv6_dst(frame: &[u8], l3: usize) -> Ipv6Addr {
    let o: [u8; 16] = frame[l3 + 24..l3 + 40].try_into().unwrap_or([0; 16]);
    Ipv6Addr::from(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b4_prefixes_match_by_their_length() {
        let p = B4Prefix { network: "2001:db8:100::".parse().unwrap(), len: 40 };
        assert!(p.contains("2001:db8:100::2".parse().unwrap()));
        assert!(p.contains("2001:db8:1ff::2".parse().unwrap()));
        assert!(!p.contains("2001:db8:200::2".parse().unwrap()));
        assert!(B4Prefix { network: Ipv6Addr::UNSPECIFIED, len: 0 }.contains("2001:db8::1".parse().unwrap()));
        let cfg = DsliteConfig { aftr: "2001:db8:0:1::1".parse().unwrap(), b4_prefixes: vec![p], mtu: 1500, mss_clamp: None, ecn_compatibility: false };
        assert!(!cfg.accepts("2001:db8:200::2".parse().unwrap()));
        assert!(DsliteConfig { b4_prefixes: vec![], ..cfg }.accepts("2001:db8:200::2".parse().unwrap()));
    }
}
