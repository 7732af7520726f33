//! Shared helpers for the engine's integration tests. Frames are built and
//! decoded with etherparse only; checksums are verified with etherparse's own
//! calculators, never with natrix_wire.

#![allow(dead_code, clippy::too_many_arguments, clippy::type_complexity)]

use etherparse::{
    checksum::Sum16BitWords, Ethernet2Header, Icmpv4Header, Icmpv4Type, Ipv4Header, NetHeaders, PacketBuilder, PacketHeaders, PayloadSlice, TcpHeader, TransportHeader, UdpHeader,
};
use natrix_engine::{Engine, EngineConfig, Side, Verdict};

pub const MAC_SUB: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const MAC_NAT_IN: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];
pub const MAC_PEER: [u8; 6] = [0x02, 0, 0, 0, 1, 0x01];
pub const MAC_NAT_OUT: [u8; 6] = [0x02, 0, 0, 0, 1, 0xfe];

pub const INSIDE_ADDR: [u8; 4] = [100, 64, 0, 1];
pub const ETH_LEN: usize = 14;

pub fn u32_of(a: [u8; 4]) -> u32 {
    u32::from_be_bytes(a)
}

pub fn addr_of(a: u32) -> [u8; 4] {
    a.to_be_bytes()
}

/// 203.0.113.0/28 expanded, host order, sorted and unique.
pub fn pool_28() -> Vec<u32> {
    let base = u32_of([203, 0, 113, 0]);
    (0..16).map(|i| base + i).collect()
}

pub fn in_pool(cfg: &EngineConfig, a: [u8; 4]) -> bool {
    cfg.pool.binary_search(&u32_of(a)).is_ok()
}

pub fn config() -> EngineConfig {
    EngineConfig { pool: pool_28(), ..EngineConfig::default() }
}

pub fn config_single(addr: [u8; 4]) -> EngineConfig {
    EngineConfig { pool: vec![u32_of(addr)], ..EngineConfig::default() }
}

pub fn engine(cfg: EngineConfig) -> Engine {
    Engine::new(cfg).expect("valid engine config")
}

/// Ethernet addresses for a frame arriving on `side`.
pub fn macs(side: Side) -> ([u8; 6], [u8; 6]) {
    match side {
        Side::Inside => (MAC_SUB, MAC_NAT_IN),
        Side::Outside => (MAC_PEER, MAC_NAT_OUT),
    }
}

pub fn udp_frame(side: Side, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, ttl: u8, payload: &[u8], zero_csum: bool) -> Vec<u8> {
    let (ms, md) = macs(side);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(src, dst, ttl).udp(sport, dport);
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).unwrap();
    if zero_csum {
        // The builder always fills the checksum in; an all-zero field means "none" (RFC 768).
        let off = ETH_LEN + 20 + 6;
        v[off] = 0;
        v[off + 1] = 0;
    }
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpKind {
    Syn,
    SynAck,
    Ack,
    Fin,
    Rst,
}

pub fn tcp_frame(side: Side, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, ttl: u8, kind: TcpKind, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
    let (ms, md) = macs(side);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(src, dst, ttl).tcp(sport, dport, seq, 64240);
    let b = match kind {
        TcpKind::Syn => b.syn(),
        TcpKind::SynAck => b.syn().ack(ack),
        TcpKind::Ack => b.ack(ack),
        TcpKind::Fin => b.fin().ack(ack),
        TcpKind::Rst => b.rst().ack(ack),
    };
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).unwrap();
    v
}

pub fn echo_frame(side: Side, src: [u8; 4], dst: [u8; 4], ttl: u8, reply: bool, id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let (ms, md) = macs(side);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(src, dst, ttl);
    let b = if reply { b.icmpv4_echo_reply(id, seq) } else { b.icmpv4_echo_request(id, seq) };
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).unwrap();
    v
}

pub fn icmp_frame(side: Side, src: [u8; 4], dst: [u8; 4], ttl: u8, t: Icmpv4Type, payload: &[u8]) -> Vec<u8> {
    let (ms, md) = macs(side);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(src, dst, ttl).icmpv4(t);
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).unwrap();
    v
}

/// ICMP destination unreachable, port unreachable (RFC 792 code 3).
pub fn port_unreachable() -> Icmpv4Type {
    Icmpv4Type::DestinationUnreachable(etherparse::icmpv4::DestUnreachableHeader::Port)
}

/// What an ICMP error quotes: the IP header of `frame` plus 8 bytes of what follows it.
pub fn quote_of(frame: &[u8]) -> Vec<u8> {
    let (h, _) = Ipv4Header::from_slice(&frame[ETH_LEN..]).expect("quotable ipv4");
    let end = (ETH_LEN + h.header_len() + 8).min(frame.len());
    frame[ETH_LEN..end].to_vec()
}

/// A fully decoded, checksum-verified frame.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub eth: Ethernet2Header,
    pub ip: Ipv4Header,
    pub l4: L4,
    pub payload: Vec<u8>,
}

#[derive(Debug, Clone)]
pub enum L4 {
    Udp(UdpHeader),
    Tcp(TcpHeader),
    Icmp(Icmpv4Header),
    /// A fragment or an untranslated protocol: transport not parsed.
    None,
}

impl Decoded {
    pub fn src(&self) -> [u8; 4] {
        self.ip.source
    }
    pub fn dst(&self) -> [u8; 4] {
        self.ip.destination
    }
    pub fn udp(&self) -> &UdpHeader {
        match &self.l4 {
            L4::Udp(u) => u,
            other => panic!("expected UDP, got {other:?}"),
        }
    }
    pub fn tcp(&self) -> &TcpHeader {
        match &self.l4 {
            L4::Tcp(t) => t,
            other => panic!("expected TCP, got {other:?}"),
        }
    }
    pub fn icmp(&self) -> &Icmpv4Header {
        match &self.l4 {
            L4::Icmp(i) => i,
            other => panic!("expected ICMP, got {other:?}"),
        }
    }
}

/// Whether the 16-bit one's complement sum over `bytes` (checksum field included) verifies.
pub fn ones_sum_ok(bytes: &[u8]) -> bool {
    Sum16BitWords::new().add_slice(bytes).ones_complement() == 0
}

/// Decodes an Ethernet/IPv4 frame with etherparse and checks every checksum it
/// can: the IPv4 header checksum, the UDP (unless zero), TCP or ICMP checksum.
pub fn decode(frame: &[u8]) -> Result<Decoded, String> {
    let h = PacketHeaders::from_ethernet_slice(frame).map_err(|e| format!("etherparse: {e:?}"))?;
    let eth = h.link.clone().and_then(|l| l.ethernet2()).ok_or("no ethernet header")?;
    let ip = match &h.net {
        Some(NetHeaders::Ipv4(ip, _)) => ip.clone(),
        other => return Err(format!("not ipv4: {other:?}")),
    };
    if ip.header_checksum != ip.calc_header_checksum() {
        return Err(format!("bad IPv4 header checksum {:#06x}, expected {:#06x}", ip.header_checksum, ip.calc_header_checksum()));
    }
    let payload: Vec<u8> = match &h.payload {
        PayloadSlice::Udp(p) | PayloadSlice::Tcp(p) | PayloadSlice::Icmpv4(p) => p.to_vec(),
        PayloadSlice::Ip(p) => p.payload.to_vec(),
        other => return Err(format!("unexpected payload {other:?}")),
    };
    let l4 = match h.transport.clone() {
        Some(TransportHeader::Udp(u)) => {
            if u.checksum != 0 {
                let want = u.calc_checksum_ipv4(&ip, &payload).map_err(|e| format!("{e:?}"))?;
                if want != u.checksum {
                    return Err(format!("bad UDP checksum {:#06x}, expected {want:#06x}", u.checksum));
                }
            }
            L4::Udp(u)
        }
        Some(TransportHeader::Tcp(t)) => {
            let want = t.calc_checksum_ipv4(&ip, &payload).map_err(|e| format!("{e:?}"))?;
            if want != t.checksum {
                return Err(format!("bad TCP checksum {:#06x}, expected {want:#06x}", t.checksum));
            }
            L4::Tcp(t)
        }
        Some(TransportHeader::Icmpv4(i)) => {
            // Verify over the raw ICMP bytes (header as on the wire + payload).
            let l3 = ETH_LEN + h.vlan.as_ref().map_or(0, |v| v.header_len());
            let start = l3 + ip.header_len();
            let end = l3 + usize::from(ip.total_len);
            if !ones_sum_ok(&frame[start..end]) {
                return Err(format!("bad ICMP checksum {:#06x} (etherparse computes {:#06x})", i.checksum, i.icmp_type.calc_checksum(&payload)));
            }
            L4::Icmp(i)
        }
        Some(other) => return Err(format!("unexpected transport {other:?}")),
        None => L4::None,
    };
    Ok(Decoded { eth, ip, l4, payload })
}

pub fn must_decode(frame: &[u8]) -> Decoded {
    decode(frame).unwrap_or_else(|e| panic!("{e}\nframe: {frame:02x?}"))
}

/// The quoted datagram inside an ICMP error: its IP header (checksum verified)
/// and the (up to) 8 transport bytes after it.
#[derive(Debug, Clone)]
pub struct Quoted {
    pub ip: Ipv4Header,
    pub l4: Vec<u8>,
}

impl Quoted {
    pub fn sport(&self) -> u16 {
        u16::from_be_bytes([self.l4[0], self.l4[1]])
    }
    pub fn dport(&self) -> u16 {
        u16::from_be_bytes([self.l4[2], self.l4[3]])
    }
    /// Bytes 6..8: the UDP checksum.
    pub fn udp_checksum(&self) -> u16 {
        UdpHeader::from_slice(&self.l4).unwrap().0.checksum
    }
    /// ICMP echo identifier of a quoted echo message.
    pub fn icmp_id(&self) -> u16 {
        u16::from_be_bytes([self.l4[4], self.l4[5]])
    }
}

pub fn quoted(d: &Decoded) -> Result<Quoted, String> {
    let (ip, rest) = Ipv4Header::from_slice(&d.payload).map_err(|e| format!("quoted header: {e:?}"))?;
    if ip.header_checksum != ip.calc_header_checksum() {
        return Err(format!("bad quoted IPv4 checksum {:#06x}, expected {:#06x}", ip.header_checksum, ip.calc_header_checksum()));
    }
    if rest.len() < 8 {
        return Err(format!("quoted transport only {} bytes", rest.len()));
    }
    Ok(Quoted { ip, l4: rest[..8].to_vec() })
}

pub fn must_quoted(d: &Decoded) -> Quoted {
    quoted(d).unwrap_or_else(|e| panic!("{e}\npayload: {:02x?}", d.payload))
}

/// Processes `frame` in place and returns the verdict.
pub fn run(e: &mut Engine, frame: &mut [u8], side: Side, now_ns: u64) -> Verdict {
    e.process(frame, side, now_ns)
}

/// Everything queued in the engine's output: (side, time, bytes).
pub fn outputs(e: &mut Engine) -> Vec<(Side, u64, Vec<u8>)> {
    let mut v = Vec::new();
    e.drain_output(|f| v.push((f.side, f.time_ns, f.data.clone())));
    v
}

pub const SEC: u64 = 1_000_000_000;

/// One IPv4 fragment (offset `off` bytes into the datagram's payload) of a UDP
/// datagram, framed with `eth`.
pub fn ipv4_fragment(eth: &Ethernet2Header, src: [u8; 4], dst: [u8; 4], ident: u16, off: usize, chunk: &[u8], more: bool) -> Vec<u8> {
    let mut ip = Ipv4Header::new(chunk.len() as u16, 64, etherparse::IpNumber::UDP, src, dst).unwrap();
    ip.dont_fragment = false;
    ip.more_fragments = more;
    ip.identification = ident;
    ip.fragment_offset = etherparse::IpFragOffset::try_new((off / 8) as u16).unwrap();
    ip.header_checksum = ip.calc_header_checksum();
    let mut v = Vec::new();
    eth.write(&mut v).unwrap();
    ip.write(&mut v).unwrap();
    v.extend_from_slice(chunk);
    v
}
