//! The dataplane running whole, threads and all, on in-memory ports: no root
//! and no interfaces. Each test plays the hosts on both links through the
//! ports' peers: it answers natrix's ARP and Neighbor Discovery, sends
//! traffic in, and checks what comes out. Frames are built and checked with
//! etherparse or taken from scapy, never with natrix's own wire code.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use etherparse::{NetHeaders, PacketBuilder, PacketHeaders, TransportHeader};
use natrix_dataplane::{Dataplane, DeviceDeferral, IoChoice, LinkSettings, Offloading, Settings, StartOptions, SuppliedPort, WorkerSnapshot, XdpAttach};
use natrix_engine::config::Addr6;
use natrix_engine::EngineConfig;
use natrix_io::{MemoryPeer, MemoryPort};

const WAIT: Duration = Duration::from_secs(5);
/// Long enough for a frame natrix would send to have left.
const QUIET: Duration = Duration::from_millis(300);

const NAT_IN: [u8; 6] = [2, 0, 0, 0, 0, 1];
const NAT_OUT: [u8; 6] = [2, 0, 0, 0, 0, 2];
const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xfe];
const SERVER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 9];
const INSIDE: [u8; 4] = [100, 64, 0, 1];
const OUTSIDE: [u8; 4] = [198, 51, 100, 1];
const GATEWAY: [u8; 4] = [198, 51, 100, 254];
/// The routed pool address, and one on the outside link natrix answers ARP for.
const POOL: [u8; 4] = [203, 0, 113, 1];
const ONLINK_POOL: [u8; 4] = [198, 51, 100, 10];
const REMOTE: [u8; 4] = [192, 0, 2, 53];
const INSIDE6: &str = "2001:db8:1::1";
const OUTSIDE6: &str = "2001:db8:2::1";
const GATEWAY6: &str = "2001:db8:2::fe";

/// Built by scapy (tests/conformance's tool), so that natrix's NDP is judged
/// by another implementation:
/// Ether(dst="33:33:ff:00:00:01", src="02:00:00:00:00:09")/IPv6(src="2001:db8:2::b",
/// dst="ff02::1:ff00:1", hlim=255)/ICMPv6ND_NS(tgt="2001:db8:2::1")/ICMPv6NDOptSrcLLAddr(lladdr="02:00:00:00:00:09")
const SCAPY_NS: &str =
    "3333ff00000102000000000986dd6000000000203aff20010db800020000000000000000000bff0200000000000000000001ff00000187001c130000000020010db80002000000000000000000010101020000000009";
/// The answer RFC 4861 section 7.2.4 asks for, by scapy:
/// Ether(dst="02:00:00:00:00:09", src="02:00:00:00:00:02")/IPv6(src="2001:db8:2::1", dst="2001:db8:2::b",
/// hlim=255)/ICMPv6ND_NA(R=1, S=1, O=1, tgt="2001:db8:2::1")/ICMPv6NDOptDstLLAddr(lladdr="02:00:00:00:00:02")
const SCAPY_NA: &str =
    "02000000000902000000000286dd6000000000203aff20010db800020000000000000000000120010db800020000000000000000000b88000a63e000000020010db80002000000000000000000010201020000000002";
/// Duplicate address detection for natrix's inside address6:
/// Ether(dst="33:33:ff:00:00:01", src="02:00:00:00:00:09")/IPv6(src="::", dst="ff02::1:ff00:1", hlim=255)/ICMPv6ND_NS(tgt="2001:db8:1::1")
const SCAPY_DAD: &str =
    "3333ff00000102000000000986dd6000000000183aff00000000000000000000000000000000ff0200000000000000000001ff00000187004cec0000000020010db8000100000000000000000001";
/// Its answer, to all nodes with S clear:
/// Ether(dst="33:33:00:00:00:01", src="02:00:00:00:00:01")/IPv6(src="2001:db8:1::1", dst="ff02::1", hlim=255)/ICMPv6ND_NA(R=1, S=0, O=1,
/// tgt="2001:db8:1::1")/ICMPv6NDOptDstLLAddr(lladdr="02:00:00:00:00:01")
const SCAPY_DAD_NA: &str =
    "33330000000102000000000186dd6000000000203aff20010db8000100000000000000000001ff02000000000000000000000000000188007928a000000020010db80001000000000000000000010201020000000001";

/// A running dataplane and the two links' far ends.
struct Net {
    dp: Dataplane,
    inside: MemoryPeer,
    outside: MemoryPeer,
    /// The engine's configuration it started with.
    engine: EngineConfig,
}

impl Net {
    fn start(workers: u16) -> Net {
        Net::start_with(workers, |_| {})
    }

    /// `start`, with the engine's configuration edited by `edit` first.
    fn start_with(workers: u16, edit: impl FnOnce(&mut EngineConfig)) -> Net {
        let (inside_port, inside) = MemoryPort::pair().unwrap();
        let (outside_port, outside) = MemoryPort::pair().unwrap();
        let engine = EngineConfig {
            inside_addr: u32::from_be_bytes(INSIDE),
            inside_prefix_len: 10,
            outside_addr: Some(u32::from_be_bytes(OUTSIDE)),
            inside_addr6: Some(Addr6 { addr: INSIDE6.parse().unwrap(), prefix_len: 64 }),
            outside_addr6: Some(Addr6 { addr: OUTSIDE6.parse().unwrap(), prefix_len: 64 }),
            pool: vec![u32::from_be_bytes(ONLINK_POOL), u32::from_be_bytes(POOL)],
            ..EngineConfig::default()
        };
        let mut engine = engine;
        edit(&mut engine);
        let settings = Settings {
            engine: engine.clone(),
            inside: LinkSettings { interface: "memory-in".into(), addr: u32::from_be_bytes(INSIDE), prefix_len: 10 },
            outside: LinkSettings { interface: "memory-out".into(), addr: u32::from_be_bytes(OUTSIDE), prefix_len: 24 },
            gateway: Some(u32::from_be_bytes(GATEWAY)),
            workers,
            io: IoChoice::Auto,
            busy_poll: false,
            prefer_busy_poll: DeviceDeferral::Off,
            offload: Offloading::Off,
            xdp_mode: XdpAttach::Auto,
            event_buffer: 1024,
        };
        let ports = [SuppliedPort { port: Box::new(inside_port), mac: NAT_IN, mtu: 1500 }, SuppliedPort { port: Box::new(outside_port), mac: NAT_OUT, mtu: 1500 }];
        let dp = Dataplane::start_with(settings, StartOptions { gateway6: Some(GATEWAY6.parse().unwrap()), ports: Some(ports) }).unwrap();
        assert_eq!((dp.backend(), dp.workers()), ("memory", usize::from(workers)));
        Net { dp, inside, outside, engine }
    }

    /// Waits until `done` holds for the workers' snapshots.
    fn wait_workers(&self, done: impl Fn(&[WorkerSnapshot]) -> bool) -> Vec<WorkerSnapshot> {
        let deadline = Instant::now() + WAIT;
        loop {
            let w = self.dp.worker_snapshots().unwrap();
            if done(&w) || Instant::now() > deadline {
                return w;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A Neighbor Solicitation (135) or Advertisement (136) from `src_mac` with
/// `flags` (R, S, O in the byte after the checksum), `target`, and a
/// link-layer address option of type `option` (1 source, 2 target) holding
/// `src_mac`: the IPv6 header and the checksum by etherparse.
#[allow(clippy::too_many_arguments)]
fn nd(dst_mac: [u8; 6], src_mac: [u8; 6], src: Ipv6Addr, dst: Ipv6Addr, kind: u8, flags: u8, target: Ipv6Addr, option: u8) -> Vec<u8> {
    let rest = [&target.octets()[..], &[option, 1], &src_mac].concat();
    let icmp_type = etherparse::Icmpv6Type::Unknown { type_u8: kind, code_u8: 0, bytes5to8: [flags, 0, 0, 0] };
    let header = etherparse::Icmpv6Header::with_checksum(icmp_type, src.octets(), dst.octets(), &rest).unwrap();
    let ip = etherparse::Ipv6Header {
        payload_length: (header.header_len() + rest.len()) as u16,
        next_header: etherparse::IpNumber::IPV6_ICMP,
        hop_limit: 255,
        source: src.octets(),
        destination: dst.octets(),
        ..Default::default()
    };
    let mut f = [&dst_mac[..], &src_mac, &[0x86, 0xdd]].concat();
    ip.write(&mut f).unwrap();
    header.write(&mut f).unwrap();
    f.extend_from_slice(&rest);
    f
}

/// An Ethernet/IPv4 ARP packet (RFC 826), padded to the minimum frame.
fn arp(dst: [u8; 6], op: u16, sender: ([u8; 6], [u8; 4]), target: ([u8; 6], [u8; 4])) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&sender.0);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sender.0);
    f.extend_from_slice(&sender.1);
    f.extend_from_slice(&target.0);
    f.extend_from_slice(&target.1);
    f.resize(60, 0);
    f
}

fn is_arp(f: &[u8], op: u16, target: [u8; 4]) -> bool {
    f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == op.to_be_bytes() && f[38..42] == target
}

fn udp(src_mac: [u8; 6], dst_mac: [u8; 6], src: Endpoint, dst: Endpoint, payload: &[u8]) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(src_mac, dst_mac).ipv4(src.0, dst.0, 64).udp(src.1, dst.1);
    let mut f = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut f, payload).unwrap();
    f
}

/// An IPv4 address and a port.
type Endpoint = ([u8; 4], u16);

/// A UDP frame's addresses and ports, after checking with etherparse that
/// both checksums hold: ((src, sport), (dst, dport), ttl, payload).
fn parse_udp(f: &[u8]) -> (Endpoint, Endpoint, u8, Vec<u8>) {
    let h = PacketHeaders::from_ethernet_slice(f).expect("an Ethernet frame");
    let (Some(NetHeaders::Ipv4(ip, _)), Some(TransportHeader::Udp(u))) = (h.net, h.transport) else { panic!("not IPv4/UDP: {f:02x?}") };
    let payload = h.payload.slice();
    assert_eq!(ip.header_checksum, ip.calc_header_checksum(), "IPv4 header checksum");
    assert_eq!(u.checksum, u.calc_checksum_ipv4(&ip, payload).unwrap(), "UDP checksum");
    ((ip.source, u.source_port), (ip.destination, u.destination_port), ip.time_to_live, payload.to_vec())
}

fn is_udp(f: &[u8]) -> bool {
    f.len() > 34 && f[12..14] == [0x08, 0x00] && f[23] == 17
}

/// Subscriber `n` (100.64.0.n) and its MAC.
fn subscriber(n: u8) -> ([u8; 4], [u8; 6]) {
    ([100, 64, 0, n], [2, 0, 0, 0, 1, n])
}

/// A host asks natrix for its gateway, as hosts do before sending: natrix
/// answers, and learns the host from the request.
fn greet(net: &Net, n: u8) {
    let (ip, mac) = subscriber(n);
    net.inside.inject(&arp([0xff; 6], 1, (mac, ip), ([0; 6], INSIDE)));
    let reply = net.inside.wait_for(WAIT, |f| f[0..6] == mac && is_arp(f, 2, ip)).expect("ARP reply to the subscriber");
    assert_eq!(reply, arp(mac, 2, (NAT_IN, INSIDE), (mac, ip)));
}

#[test]
fn answers_arp_for_its_addresses_and_announces_them() {
    let net = Net::start(1);
    // Gratuitous ARP for natrix's addresses at start.
    for (peer, addr) in [(&net.inside, INSIDE), (&net.outside, OUTSIDE), (&net.outside, ONLINK_POOL)] {
        let f = peer.wait_for(WAIT, |f| is_arp(f, 1, addr)).expect("announcement");
        assert_eq!(f, arp([0xff; 6], 1, (if addr == INSIDE { NAT_IN } else { NAT_OUT }, addr), ([0; 6], addr)));
    }
    greet(&net, 2);
    for addr in [OUTSIDE, ONLINK_POOL] {
        net.outside.inject(&arp([0xff; 6], 1, (SERVER_MAC, [198, 51, 100, 9]), ([0; 6], addr)));
        let reply = net.outside.wait_for(WAIT, |f| is_arp(f, 2, [198, 51, 100, 9])).expect("ARP reply");
        assert_eq!(reply, arp(SERVER_MAC, 2, (NAT_OUT, addr), (SERVER_MAC, [198, 51, 100, 9])));
    }
    // Not natrix's: the routed pool (the upstream routes it) and another host.
    for addr in [POOL, [198, 51, 100, 99]] {
        net.outside.inject(&arp([0xff; 6], 1, (SERVER_MAC, [198, 51, 100, 9]), ([0; 6], addr)));
    }
    assert_eq!(net.outside.wait_for(QUIET, |f| is_arp(f, 2, [198, 51, 100, 9])), None);
    let io = net.dp.io_snapshot().unwrap();
    assert_eq!(io.gateway.arp_replies_sent, 3);
}

/// A subscriber's UDP flow leaves translated, with the frame held while
/// natrix resolves its gateway, and the answer comes back translated to
/// the subscriber; with several workers one worker sees both directions.
fn udp_flow_out_and_back(workers: u16) {
    let net = Net::start(workers);
    greet(&net, 2);
    let (sub, sub_mac) = subscriber(2);
    net.inside.inject(&udp(sub_mac, NAT_IN, (sub, 40000), (REMOTE, 53), b"question"));
    // Off-link: natrix asks for its gateway, and the frame waits for the answer.
    net.outside.wait_for(WAIT, |f| f[0..6] == [0xff; 6] && is_arp(f, 1, GATEWAY)).expect("ARP request for the gateway");
    assert_eq!(net.outside.wait_for(QUIET, is_udp), None, "the frame waits for its next hop");
    net.outside.inject(&arp(NAT_OUT, 2, (GW_MAC, GATEWAY), (NAT_OUT, OUTSIDE)));
    let out = net.outside.wait_for(WAIT, is_udp).expect("the translated frame");
    assert_eq!((&out[0..6], &out[6..12]), (&GW_MAC[..], &NAT_OUT[..]));
    let (external, dst, ttl, payload) = parse_udp(&out);
    assert!([POOL, ONLINK_POOL].contains(&external.0), "from a pool address: {external:?}");
    assert_eq!((dst, ttl, payload.as_slice()), ((REMOTE, 53), 63, &b"question"[..]));

    net.outside.inject(&udp(GW_MAC, NAT_OUT, (REMOTE, 53), external, b"answer"));
    let back = net.inside.wait_for(WAIT, is_udp).expect("the answer, translated back");
    assert_eq!((&back[0..6], &back[6..12]), (&sub_mac[..], &NAT_IN[..]), "natrix learned the subscriber from its ARP");
    let (src, dst, ttl, payload) = parse_udp(&back);
    assert_eq!((src, dst, ttl, payload.as_slice()), ((REMOTE, 53), (sub, 40000), 63, &b"answer"[..]));

    let w = net.wait_workers(|w| w.iter().map(|s| s.stats.received[1]).sum::<u64>() == 1);
    let owners: Vec<usize> = (0..w.len()).filter(|&i| w[i].stats.received != [0, 0]).collect();
    assert_eq!(owners.len(), 1, "one worker owns the flow: {:?}", w.iter().map(|s| s.stats.received).collect::<Vec<_>>());
    assert_eq!(w[owners[0]].stats.received, [1, 1]);
    assert_eq!(w[owners[0]].stats.forwarded, [1, 1]);
}

#[test]
fn a_udp_flow_is_translated_out_and_back_with_one_worker() {
    udp_flow_out_and_back(1);
}

#[test]
fn a_udp_flow_is_translated_out_and_back_with_two_workers() {
    udp_flow_out_and_back(2);
}

/// Many subscribers over three workers: the I/O thread steers each
/// subscriber's frames to its worker and each answer to the worker that
/// allocated its port, which is the same one; every answer reaches its
/// subscriber.
#[test]
fn steering_keeps_both_directions_of_each_flow_on_one_worker() {
    const SUBSCRIBERS: u8 = 24;
    let net = Net::start(3);
    // An ARP packet for natrix's address teaches it the sender (RFC 826),
    // so the gateway is known before the first frame leaves.
    net.outside.inject(&arp(NAT_OUT, 2, (GW_MAC, GATEWAY), (NAT_OUT, OUTSIDE)));
    for n in 10..10 + SUBSCRIBERS {
        greet(&net, n);
        let (sub, mac) = subscriber(n);
        net.inside.inject(&udp(mac, NAT_IN, (sub, 5000 + u16::from(n)), (REMOTE, 53), &[n]));
    }
    for _ in 0..SUBSCRIBERS {
        let out = net.outside.wait_for(WAIT, is_udp).expect("a translated frame");
        assert_eq!(&out[0..6], &GW_MAC);
        let (external, _, _, payload) = parse_udp(&out);
        assert!([POOL, ONLINK_POOL].contains(&external.0));
        net.outside.inject(&udp(GW_MAC, NAT_OUT, (REMOTE, 53), external, &payload));
    }
    assert_eq!(net.outside.wait_for(Duration::ZERO, |f| is_arp(f, 1, GATEWAY) && f[0..6] == [0xff; 6]), None, "the gateway was never asked for");
    for _ in 0..SUBSCRIBERS {
        let Some(back) = net.inside.wait_for(WAIT, is_udp) else {
            let w = net.dp.worker_snapshots().unwrap();
            panic!(
                "an answer: {:#?} {:#?}",
                w.iter().map(|s| (s.stats.received, s.stats.forwarded, format!("{:?}", s.stats.drops))).collect::<Vec<_>>(),
                net.dp.io_snapshot().unwrap()
            );
        };
        let (_, (dst, dport), _, payload) = parse_udp(&back);
        let n = payload[0];
        let (sub, mac) = subscriber(n);
        assert_eq!((dst, dport, &back[0..6]), (sub, 5000 + u16::from(n), &mac[..]), "subscriber {n}");
    }
    let w = net.wait_workers(|w| w.iter().map(|s| s.stats.received[1]).sum::<u64>() == u64::from(SUBSCRIBERS));
    let per_worker: Vec<[u64; 2]> = w.iter().map(|s| s.stats.received).collect();
    for r in &per_worker {
        assert_eq!(r[0], r[1], "each worker saw the answers to its own flows: {per_worker:?}");
    }
    assert!(per_worker.iter().filter(|r| r[0] > 0).count() >= 2, "subscribers spread over the workers: {per_worker:?}");
    assert_eq!(net.dp.io_snapshot().unwrap().handoff_dropped, 0);
}

/// Hairpinning (RFC 4787 REQ-9) between subscribers whose state lives on
/// different workers: each subscriber, with endpoint-independent
/// filtering, sends to every other's external endpoint; every datagram
/// reaches its subscriber from the sender's external endpoint, whichever
/// workers own the two mappings, and nothing is lost between them.
#[test]
fn hairpins_between_subscribers_on_different_workers_arrive_from_the_senders_external_endpoint() {
    const SUBSCRIBERS: u8 = 6;
    let net = Net::start_with(3, |c| c.filtering = natrix_engine::config::Filtering::EndpointIndependent);
    net.outside.inject(&arp(NAT_OUT, 2, (GW_MAC, GATEWAY), (NAT_OUT, OUTSIDE)));
    let mut external = Vec::new();
    for n in 10..10 + SUBSCRIBERS {
        greet(&net, n);
        let (sub, mac) = subscriber(n);
        net.inside.inject(&udp(mac, NAT_IN, (sub, 7000), (REMOTE, 53), &[n]));
        let out = net.outside.wait_for(WAIT, is_udp).expect("a translated frame");
        external.push(parse_udp(&out).0);
    }
    for a in 0..SUBSCRIBERS {
        for b in (0..SUBSCRIBERS).filter(|&b| b != a) {
            let (sub, mac) = subscriber(10 + a);
            net.inside.inject(&udp(mac, NAT_IN, (sub, 7000), external[usize::from(b)], &[a, b]));
            let back = net.inside.wait_for(WAIT, is_udp).unwrap_or_else(|| panic!("hairpin {a} -> {b}: {:?}", net.dp.io_snapshot().unwrap()));
            let (src, dst, _, payload) = parse_udp(&back);
            assert_eq!(payload, [a, b]);
            assert_eq!((src, dst, &back[0..6]), (external[usize::from(a)], (subscriber(10 + b).0, 7000), &subscriber(10 + b).1[..]), "hairpin {a} -> {b}");
        }
    }
    let w = net.dp.worker_snapshots().unwrap();
    assert!(w.iter().filter(|s| s.stats.received[0] > 0).count() >= 2, "subscribers spread over the workers");
    assert_eq!(net.dp.io_snapshot().unwrap().handoff_dropped, 0);
}

#[test]
fn answers_neighbor_solicitations_for_address6_as_scapy_expects() {
    let net = Net::start(1);
    net.outside.inject(&hex(SCAPY_NS));
    let na = net.outside.wait_for(WAIT, |f| f[0..6] == SERVER_MAC).expect("a Neighbor Advertisement");
    assert_eq!(na, hex(SCAPY_NA));
    // etherparse agrees: hop limit 255, type 136, a valid checksum.
    let h = PacketHeaders::from_ethernet_slice(&na).unwrap();
    let Some(NetHeaders::Ipv6(ip, _)) = &h.net else { panic!("not IPv6") };
    assert_eq!((ip.hop_limit, ip.source, ip.destination), (255, OUTSIDE6.parse::<Ipv6Addr>().unwrap().octets(), "2001:db8:2::b".parse::<Ipv6Addr>().unwrap().octets()));
    let icmp = etherparse::Icmpv6Slice::from_slice(&na[54..]).unwrap();
    assert_eq!(icmp.type_u8(), 136);
    assert!(icmp.is_checksum_valid(ip.source, ip.destination));

    net.inside.inject(&hex(SCAPY_DAD));
    let dad_na = net.inside.wait_for(WAIT, |f| f == hex(SCAPY_DAD_NA).as_slice());
    assert!(dad_na.is_some(), "duplicate address detection answered to all nodes");
    assert_eq!(net.dp.io_snapshot().unwrap().gateway.nd_adverts_sent, 2);
}

/// A Neighbor Solicitation from `from` (MAC and address) for `target`, to
/// its solicited-node multicast group (RFC 4291 section 2.7.1).
fn solicit(from: ([u8; 6], Ipv6Addr), target: Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let group = Ipv6Addr::from([0xff02, 0, 0, 0, 0, 1, 0xff00 | u16::from(t[13]), u16::from_be_bytes([t[14], t[15]])]);
    nd([0x33, 0x33, 0xff, t[13], t[14], t[15]], from.0, from.1, group, 135, 0, target, 1)
}

/// Whether `f` is a Neighbor Advertisement for `target`.
fn advertises(f: &[u8], target: Ipv6Addr) -> bool {
    f.len() >= 78 && f[12..14] == [0x86, 0xdd] && f[20] == 58 && f[54] == 136 && f[62..78] == target.octets()
}

/// `[dslite] aftr` applies on reload: B4s on the inside link find the new
/// AFTR address by Neighbor Discovery, and the old one is no longer natrix's.
#[test]
fn a_reloaded_aftr_address_is_answered_for_and_the_old_one_no_longer() {
    let aftr = |a: &str| natrix_engine::dslite::DsliteConfig { aftr: a.parse().unwrap(), b4_prefixes: Vec::new(), mtu: 1500, mss_clamp: None, ecn_compatibility: false };
    let (old, new): (Ipv6Addr, Ipv6Addr) = ("2001:db8:1::a".parse().unwrap(), "2001:db8:1::c".parse().unwrap());
    let net = Net::start_with(1, |e| e.dslite = Some(aftr("2001:db8:1::a")));
    let b4 = (SERVER_MAC, "2001:db8:1::b4".parse::<Ipv6Addr>().unwrap());
    net.inside.inject(&solicit(b4, old));
    assert!(net.inside.wait_for(WAIT, |f| advertises(f, old)).is_some(), "the AFTR address at start is answered for");

    let mut moved = net.engine.clone();
    moved.dslite = Some(aftr("2001:db8:1::c"));
    net.dp.reload(&moved).expect("a new AFTR address applies live");
    net.inside.inject(&solicit(b4, new));
    assert!(net.inside.wait_for(WAIT, |f| advertises(f, new)).is_some(), "the reloaded AFTR address is answered for");
    net.inside.inject(&solicit(b4, old));
    assert!(net.inside.wait_for(QUIET, |f| advertises(f, old)).is_none(), "the old AFTR address is no longer natrix's");
}

/// IPv6 for natrix's MAC reaches the engine, which routes it (CONTRACTS,
/// "Wave 2": IPv6 no function claims is routed in every mode); natrix
/// solicits the next hop, gateway6, and sends the frame when it answers.
#[test]
fn ipv6_is_routed_to_gateway6_once_it_answers_a_solicitation() {
    let net = Net::start(1);
    let host: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
    let far: Ipv6Addr = "2001:db8:99::1".parse().unwrap();
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 1, 2], NAT_IN).ipv6(host.octets(), far.octets(), 64).udp(5000, 53);
    let mut f = Vec::new();
    b.write(&mut f, b"v6").unwrap();
    net.inside.inject(&f);
    let w = net.wait_workers(|w| w[0].stats.forwarded[1] == 1);
    assert_eq!((w[0].stats.received[0], w[0].stats.forwarded[1]), (1, 1), "the engine routed the IPv6 frame");
    let ns_for_gateway6 = |f: &[u8]| f.len() == 86 && f[12..14] == [0x86, 0xdd] && f[54] == 135 && f[62..78] == GATEWAY6.parse::<Ipv6Addr>().unwrap().octets();
    let ns = net.outside.wait_for(WAIT, ns_for_gateway6).expect("a Neighbor Solicitation for gateway6");
    assert_eq!(&ns[0..6], &[0x33, 0x33, 0xff, 0, 0, 0xfe], "to gateway6's solicited-node group");
    let icmp = etherparse::Icmpv6Slice::from_slice(&ns[54..]).unwrap();
    assert!(icmp.is_checksum_valid(OUTSIDE6.parse::<Ipv6Addr>().unwrap().octets(), ns[38..54].try_into().unwrap()));
    // gateway6 answers: Ether/IPv6(hlim=255)/ICMPv6ND_NA(S=1, O=1, tgt=gateway6)/target link-layer address.
    let na = nd(NAT_OUT, GW_MAC, GATEWAY6.parse().unwrap(), OUTSIDE6.parse().unwrap(), 136, 0x60, GATEWAY6.parse().unwrap(), 2);
    net.outside.inject(&na);
    let out = net.outside.wait_for(WAIT, |f| f[12..14] == [0x86, 0xdd] && f[0..6] == GW_MAC).expect("the forwarded frame");
    assert_eq!(&out[6..12], &NAT_OUT);
    let h = PacketHeaders::from_ethernet_slice(&out).unwrap();
    let (Some(NetHeaders::Ipv6(ip, _)), Some(TransportHeader::Udp(u))) = (&h.net, &h.transport) else { panic!("not IPv6/UDP") };
    assert_eq!((ip.source, ip.destination, ip.hop_limit), (host.octets(), far.octets(), 63));
    assert_eq!((u.checksum, h.payload.slice()), (u.calc_checksum_ipv6(ip, h.payload.slice()).unwrap(), &b"v6"[..]));
}

/// IPv6 over two workers: natrix routes it without per-flow state, and the
/// I/O thread steers both directions of each host's traffic to the worker
/// of the inside host's address. Neighbours are learned from their own
/// solicitations for natrix's addresses, as routers and hosts send them.
#[test]
fn ipv6_both_directions_meet_on_the_inside_hosts_worker() {
    let net = Net::start(2);
    let (gw6, out6, in6): (Ipv6Addr, Ipv6Addr, Ipv6Addr) = (GATEWAY6.parse().unwrap(), OUTSIDE6.parse().unwrap(), INSIDE6.parse().unwrap());
    let far: Ipv6Addr = "2001:db8:99::1".parse().unwrap();
    // ff02::1:ffXX:XXXX with the address's low 24 bits (RFC 4291 section 2.7.1).
    let solicited = |a: Ipv6Addr| Ipv6Addr::from(u128::from(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0)) | (u128::from(a) & 0xff_ffff));
    let group = |a: Ipv6Addr| [0x33, 0x33, 0xff, a.octets()[13], a.octets()[14], a.octets()[15]];
    net.outside.inject(&nd(group(out6), GW_MAC, gw6, solicited(out6), 135, 0, out6, 1));
    net.outside.wait_for(WAIT, |f| f[0..6] == GW_MAC && f[12..14] == [0x86, 0xdd]).expect("natrix answers gateway6");
    const HOSTS: u8 = 8;
    for n in 2..2 + HOSTS {
        let host = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, u16::from(n));
        let mac = subscriber(n).1;
        net.inside.inject(&nd(group(in6), mac, host, solicited(in6), 135, 0, in6, 1));
        net.inside.wait_for(WAIT, |f| f[0..6] == mac).expect("natrix answers the host");
        let b = PacketBuilder::ethernet2(mac, NAT_IN).ipv6(host.octets(), far.octets(), 64).udp(6000, 53);
        let mut f = Vec::new();
        b.write(&mut f, &[n]).unwrap();
        net.inside.inject(&f);
        let b = PacketBuilder::ethernet2(GW_MAC, NAT_OUT).ipv6(far.octets(), host.octets(), 64).udp(53, 6000);
        let mut f = Vec::new();
        b.write(&mut f, &[n]).unwrap();
        net.outside.inject(&f);
    }
    let is_udp6 = |f: &[u8]| f.len() > 54 && f[12..14] == [0x86, 0xdd] && f[20] == 17;
    for _ in 0..HOSTS {
        let out = net.outside.wait_for(WAIT, is_udp6).expect("routed out");
        assert_eq!(&out[0..6], &GW_MAC);
        let back = net.inside.wait_for(WAIT, is_udp6).expect("routed in");
        assert_eq!(&back[0..6], &subscriber(back[back.len() - 1]).1, "to the host's MAC");
    }
    let w = net.wait_workers(|w| w.iter().map(|s| s.stats.forwarded[0]).sum::<u64>() == u64::from(HOSTS));
    let per_worker: Vec<[u64; 2]> = w.iter().map(|s| s.stats.received).collect();
    assert_eq!(per_worker.iter().map(|r| r[0]).sum::<u64>(), u64::from(HOSTS));
    for r in &per_worker {
        assert_eq!(r[0], r[1], "each worker saw both directions of its hosts' traffic: {per_worker:?}");
    }
    assert!(per_worker.iter().all(|r| r[0] > 0), "eight hosts use both workers: {per_worker:?}");
}

/// `[nat] mode = "off"` over two workers: IPv4 is routed untranslated (TTL
/// decremented), and both directions of each host's flow are steered to
/// the worker of the inside host's address, as the router keeps no port
/// slices to steer by.
#[test]
fn without_translation_ipv4_is_routed_and_both_directions_meet_on_one_worker() {
    let net = Net::start_with(2, |e| {
        e.translate = false;
        e.pool.clear();
    });
    net.outside.inject(&arp(NAT_OUT, 2, (GW_MAC, GATEWAY), (NAT_OUT, OUTSIDE)));
    const HOSTS: u8 = 8;
    for n in 2..2 + HOSTS {
        greet(&net, n);
        let (host, mac) = subscriber(n);
        net.inside.inject(&udp(mac, NAT_IN, (host, 7000), (REMOTE, 53), &[n]));
        net.outside.inject(&udp(GW_MAC, NAT_OUT, (REMOTE, 53), (host, 7000), &[n]));
    }
    for _ in 0..HOSTS {
        let out = net.outside.wait_for(WAIT, is_udp).expect("routed out");
        let ((src, sport), dst, ttl, payload) = parse_udp(&out);
        assert_eq!((src, sport, dst, ttl, &out[0..6]), (subscriber(payload[0]).0, 7000, (REMOTE, 53), 63, &GW_MAC[..]), "untranslated");
        let back = net.inside.wait_for(WAIT, is_udp).expect("routed in");
        let (_, (dst, _), ttl, payload) = parse_udp(&back);
        assert_eq!((dst, ttl, &back[0..6]), (subscriber(payload[0]).0, 63, &subscriber(payload[0]).1[..]));
    }
    let w = net.wait_workers(|w| w.iter().map(|s| s.stats.forwarded[0]).sum::<u64>() == u64::from(HOSTS));
    let per_worker: Vec<[u64; 2]> = w.iter().map(|s| s.stats.received).collect();
    for r in &per_worker {
        assert_eq!(r[0], r[1], "each worker saw both directions of its hosts' flows: {per_worker:?}");
    }
    assert!(per_worker.iter().all(|r| r[0] > 0), "eight hosts use both workers: {per_worker:?}");
}

/// An SCTP packet (RFC 9260) with one chunk of `chunk_type`, `flags` and
/// `value`: the IPv4 header by etherparse, the SCTP bytes by hand. Its
/// CRC32c is left 0: natrix neither checks nor recomputes it (seed 001).
fn sctp(src_mac: [u8; 6], dst_mac: [u8; 6], src: Endpoint, dst: Endpoint, tag: u32, (chunk_type, flags, value): (u8, u8, &[u8])) -> Vec<u8> {
    let mut l4 = [&src.1.to_be_bytes()[..], &dst.1.to_be_bytes(), &tag.to_be_bytes(), &[0; 4], &[chunk_type, flags], &(4 + value.len() as u16).to_be_bytes(), value].concat();
    l4.resize(l4.len().next_multiple_of(4), 0);
    let ip = etherparse::Ipv4Header::new(l4.len() as u16, 64, etherparse::IpNumber(132), src.0, dst.0).unwrap();
    let mut f = [&dst_mac[..], &src_mac, &[0x08, 0x00]].concat();
    ip.write(&mut f).unwrap();
    f.extend_from_slice(&l4);
    f
}

fn is_sctp(f: &[u8]) -> bool {
    f.len() > 34 && f[12..14] == [0x08, 0x00] && f[23] == 132
}

/// (source, destination, verification tag, chunk type) of an SCTP frame.
fn parse_sctp(f: &[u8]) -> ([u8; 4], [u8; 4], u32, u8) {
    let at = 14 + usize::from(f[14] & 0xf) * 4;
    (f[26..30].try_into().unwrap(), f[30..34].try_into().unwrap(), u32::from_be_bytes(f[at + 4..at + 8].try_into().unwrap()), f[at + 12])
}

/// An INIT or INIT-ACK chunk's value with Initiate Tag `tag`.
fn init_value(tag: u32) -> Vec<u8> {
    [&tag.to_be_bytes()[..], &[0, 1, 0, 0, 0, 10, 0, 10, 0, 0, 0, 1]].concat()
}

/// Inbound SCTP names no port natrix chose, only tags the endpoints chose:
/// with three workers, subscribers on one port towards one server get their
/// INIT-ACKs (by the tag their INIT named) and the server's ABORTs with the
/// T bit (by the tag its INIT-ACK named) through the worker that opened the
/// association.
#[test]
fn inbound_sctp_is_steered_by_tag_to_the_worker_that_opened_the_association() {
    const SUBSCRIBERS: u8 = 12;
    let net = Net::start(3);
    net.outside.inject(&arp(NAT_OUT, 2, (GW_MAC, GATEWAY), (NAT_OUT, OUTSIDE)));
    let mut externals = Vec::new();
    for n in 10..10 + SUBSCRIBERS {
        greet(&net, n);
        let (sub, mac) = subscriber(n);
        net.inside.inject(&sctp(mac, NAT_IN, (sub, 5000), (REMOTE, 38412), 0, (1, 0, &init_value(0x1000 + u32::from(n)))));
        let out = net.outside.wait_for(WAIT, is_sctp).expect("the INIT, translated");
        let (ext, dst, tag, chunk) = parse_sctp(&out);
        assert_eq!((dst, tag, chunk), (REMOTE, 0, 1));
        externals.push((n, ext));
    }
    for &(n, ext) in &externals {
        net.outside.inject(&sctp(GW_MAC, NAT_OUT, (REMOTE, 38412), (ext, 5000), 0x1000 + u32::from(n), (2, 0, &init_value(0x2000 + u32::from(n)))));
        let back = net.inside.wait_for(WAIT, is_sctp).expect("the INIT-ACK");
        assert_eq!(parse_sctp(&back), (REMOTE, subscriber(n).0, 0x1000 + u32::from(n), 2), "subscriber {n}");
    }
    for &(n, ext) in &externals {
        net.outside.inject(&sctp(GW_MAC, NAT_OUT, (REMOTE, 38412), (ext, 5000), 0x2000 + u32::from(n), (6, 1, &[])));
        let back = net.inside.wait_for(WAIT, is_sctp).expect("the ABORT with the T bit");
        assert_eq!(parse_sctp(&back), (REMOTE, subscriber(n).0, 0x2000 + u32::from(n), 6), "subscriber {n}");
    }
    let w = net.wait_workers(|w| w.iter().map(|s| s.stats.received[1]).sum::<u64>() == 2 * u64::from(SUBSCRIBERS));
    let per_worker: Vec<[u64; 2]> = w.iter().map(|s| s.stats.received).collect();
    for r in &per_worker {
        assert_eq!(2 * r[0], r[1], "each worker got the two answers to each of its INITs: {per_worker:?}");
    }
    assert!(per_worker.iter().filter(|r| r[0] > 0).count() >= 2, "subscribers spread over the workers: {per_worker:?}");
}

/// Session sync's standby side: the active node's mapping events, each
/// made by the worker that owns its subscriber (so its port is in that
/// worker's slice), are installed on the same worker here, and the
/// remote's answers to those external endpoints reach the subscribers.
#[test]
fn synced_mappings_are_installed_on_each_subscribers_worker_and_translate_answers() {
    use natrix_engine::shard::{port_slice, worker_of_subscriber, Shard};
    use natrix_engine::{Event, EventKind, Proto};
    const WORKERS: u16 = 3;
    let net = Net::start(WORKERS);
    net.dp.set_standby(true).unwrap();
    net.outside.inject(&arp(NAT_OUT, 2, (GW_MAC, GATEWAY), (NAT_OUT, OUTSIDE)));
    let mut events = Vec::new();
    let mut endpoints = Vec::new();
    for n in 10..22u8 {
        greet(&net, n);
        let (sub, _) = subscriber(n);
        let worker = worker_of_subscriber(u32::from_be_bytes(sub), WORKERS);
        let (first, _) = port_slice((1024, 65535), 0, Shard { index: worker, count: WORKERS });
        let ext_port = first + 2 * u16::from(n);
        events.push(Event {
            kind: EventKind::MappingCreated,
            time_ns: 0,
            proto: Proto::Udp,
            int_addr: u32::from_be_bytes(sub),
            int_port: 6000,
            ext_addr: u32::from_be_bytes(POOL),
            ext_port,
            ext_port_end: ext_port,
            rem_addr: 0,
            rem_port: 0,
            b4: None,
        });
        endpoints.push((n, ext_port));
    }
    let tally = net.dp.install_synced(&events).unwrap();
    assert_eq!((tally.installed, tally.refused), (events.len() as u64, 0));
    assert_eq!(net.dp.mappings(Default::default(), usize::MAX).unwrap().len(), events.len());
    for &(n, ext_port) in &endpoints {
        net.outside.inject(&udp(GW_MAC, NAT_OUT, (REMOTE, 53), (POOL, ext_port), &[n]));
        let back = net.inside.wait_for(WAIT, is_udp).unwrap_or_else(|| panic!("the answer to subscriber {n}"));
        let (sub, mac) = subscriber(n);
        let (_, dst, _, payload) = parse_udp(&back);
        assert_eq!((dst, payload, &back[0..6]), ((sub, 6000), vec![n], &mac[..]));
    }
    // Installing again changes nothing.
    assert_eq!(net.dp.install_synced(&events).unwrap().installed, events.len() as u64);
    assert_eq!(net.dp.mappings(Default::default(), usize::MAX).unwrap().len(), events.len());
    // Listings across the workers: at most the limit, or one subscriber's.
    assert_eq!(net.dp.mappings(Default::default(), 3).unwrap().len(), 3);
    let one = u32::from_be_bytes(subscriber(endpoints[0].0).0);
    let rows = net.dp.mappings(natrix_dataplane::Only { subscriber: Some(one), b4: None }, usize::MAX).unwrap();
    assert_eq!(rows.iter().map(|m| m.int_addr).collect::<Vec<_>>(), [one]);
}

/// `udp` with its checksum as a sender's offload leaves it: the
/// pseudo-header's folded sum (addresses, protocol 17, UDP length), worked
/// out here word by word.
fn udp_left_partial(src_mac: [u8; 6], dst_mac: [u8; 6], src: Endpoint, dst: Endpoint, payload: &[u8]) -> Vec<u8> {
    let mut f = udp(src_mac, dst_mac, src, dst, payload);
    let words = f[26..34].chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])));
    let mut sum = words.sum::<u32>() + 17 + 8 + payload.len() as u32;
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[40..42].copy_from_slice(&(sum as u16).to_be_bytes());
    f
}

#[test]
fn partial_checksums_are_finished_both_ways_and_counted_by_interface() {
    let net = Net::start(1);
    greet(&net, 2);
    let (sub, sub_mac) = subscriber(2);
    net.outside.inject(&arp(NAT_OUT, 2, (GW_MAC, GATEWAY), (NAT_OUT, OUTSIDE)));
    net.inside.inject(&udp_left_partial(sub_mac, NAT_IN, (sub, 40000), (REMOTE, 53), b"question"));
    let out = net.outside.wait_for(WAIT, is_udp).expect("the translated frame");
    // etherparse's checksums hold (parse_udp), where the incremental
    // update of a partial field would have left one no receiver takes.
    let (external, _, _, payload) = parse_udp(&out);
    assert_eq!(payload, b"question");
    net.outside.inject(&udp_left_partial(GW_MAC, NAT_OUT, (REMOTE, 53), external, b"answer"));
    let back = net.inside.wait_for(WAIT, is_udp).expect("the answer, translated back");
    assert_eq!(parse_udp(&back).3, b"answer");
    let w = net.wait_workers(|w| w.iter().map(|s| s.checksums_completed[1]).sum::<u64>() == 1);
    let io = net.dp.io_snapshot().unwrap();
    assert_eq!(io.checksums_completed(&w), [1, 1], "one finished on each interface");
}

/// RFC 6887 section 8.5: the epoch natrix's start ANNOUNCE carries and
/// the one its answers carry later count from the same start, so a client
/// sees time pass, not a jump of fifty years.
#[test]
fn the_pcp_epoch_counts_from_the_start_in_the_announcement_and_after() {
    let net = Net::start_with(1, |e| e.pcp = Some(natrix_engine::pcp::PcpConfig { max_lifetime_s: 3600 }));
    let is_pcp_answer = |f: &[u8]| is_udp(f) && f.len() >= 54 && f[34..36] == 5351u16.to_be_bytes() && f[43] & 0x80 != 0;
    let announce = net.inside.wait_for(WAIT, |f| is_pcp_answer(f)).expect("the start's ANNOUNCE");
    let epoch = |f: &[u8]| u32::from_be_bytes([f[50], f[51], f[52], f[53]]);
    assert!(epoch(&announce) < 5, "announced epoch {}", epoch(&announce));
    greet(&net, 2);
    let (sub, sub_mac) = subscriber(2);
    let mut request = vec![2, 0, 0, 0, 0, 0, 0, 0];
    request.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    request.extend_from_slice(&sub);
    net.inside.inject(&udp(sub_mac, NAT_IN, (sub, 40000), (INSIDE, 5351), &request));
    let answer = net.inside.wait_for(WAIT, |f| is_pcp_answer(f) && f[0..6] == sub_mac).expect("the answer to an ANNOUNCE request");
    assert!(epoch(&answer) < 5, "answered epoch {}", epoch(&answer));
}
