//! Differential property test for DS-Lite's fast path: softwire packets
//! taken by NAPT44's fast path while still inside their softwire (the
//! batch's own stage, the stand-in carried to the decision, the single
//! copy), and replies encapsulated from the fast path's record, decide
//! nothing differently from the full path (generic decapsulation, the
//! stand-in interned, the IPv4 stages). Three engines with one
//! configuration see the same traffic: through `process_batch`, through
//! `process` frame by frame, and through `process_full`. Softwire packets
//! from several B4s and hosts (one host behind two B4s), TCP and UDP,
//! opening and established, some damaged, and replies from outside are
//! mixed in batches; between batches the clock moves far enough for flows
//! to expire and their stand-ins to be recycled. Verdicts, the frames as
//! rewritten, every frame sent (decapsulated, encapsulated, ICMP
//! refusals into softwires), counters (each B4's too) and table sizes must match, and no
//! frame sent may carry a stand-in (240.0.0.0/4, never on the wire). A
//! batch's softwire packet leaves decapsulated where it lay, and a reply
//! encapsulated where it lay (`Forward`), where the others send the same
//! bytes through their queue (`Consumed`), in the same order. The batch's
//! frames lie in 2048-byte buffers with 0, 16, 40 or 256 bytes before them:
//! without 40, replies go through the queue.

mod common;

use common::*;
use natrix_engine::dslite::DsliteConfig;
use natrix_engine::{Engine, EngineConfig, FrameBuf, InBuffer, Side, Verdict};
use proptest::prelude::*;

const AFTR: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
const REMOTE: [u8; 4] = [198, 51, 100, 7];
const HOSTS: [[u8; 4]; 2] = [[192, 0, 0, 2], [10, 0, 0, 5]];
const PAYLOAD: [u8; 40] = *b"payload payload payload payload payload ";

fn b4(n: u8) -> [u8; 16] {
    [0x20, 0x01, 0x0d, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n]
}

#[derive(Debug, Clone)]
struct Flow {
    tcp: bool,
    b4: u8,
    host: usize,
    sport: u16,
    /// Payload bytes: under 12, a UDP packet is too short for the fast path's view.
    payload: usize,
}

fn flows() -> impl Strategy<Value = Vec<Flow>> {
    proptest::collection::vec(
        (any::<bool>(), 1u8..4, 0usize..2, 1024u16..1030, prop_oneof![3 => 12usize..40, 1 => 0usize..12]).prop_map(|(tcp, b4, host, sport, payload)| Flow {
            tcp,
            b4,
            host,
            sport,
            payload,
        }),
        1..8,
    )
}

/// What is done to a softwire packet before it is sent: the inner packet's
/// fields the fast path reads, or the outer frame cut short.
#[derive(Debug, Clone, Copy)]
enum Damage {
    None,
    InnerTtl(u8),
    InnerChecksum(u16),
    InnerFragment(u16),
    InnerDestination([u8; 4]),
    Truncate(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => Just(Damage::None),
        1 => prop_oneof![Just(0u8), Just(1), Just(2)].prop_map(Damage::InnerTtl),
        1 => any::<u16>().prop_map(Damage::InnerChecksum),
        1 => prop_oneof![Just(0x2000u16), Just(0x0001), Just(0x4000)].prop_map(Damage::InnerFragment),
        // The AFTR's own address (PCP), natrix's inside address, a martian.
        1 => prop_oneof![Just([192, 0, 0, 1]), Just(INSIDE_ADDR), Just([127, 0, 0, 1])].prop_map(Damage::InnerDestination),
        1 => (40usize..100).prop_map(Damage::Truncate),
    ]
}

/// `ipv4` (an Ethernet/IPv4 frame) sent by its host through B4 `n`'s softwire.
fn softwire(n: u8, ipv4: &[u8], d: Damage) -> Vec<u8> {
    let mut inner = ipv4[ETH_LEN..].to_vec();
    let total = usize::from(u16::from_be_bytes([inner[2], inner[3]]));
    inner.truncate(total);
    let fix_checksum = |p: &mut Vec<u8>| {
        p[10..12].copy_from_slice(&[0, 0]);
        let mut sum: u32 = p[..20].chunks(2).map(|w| u32::from(w[0]) << 8 | u32::from(w[1])).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    };
    match d {
        Damage::InnerTtl(t) => {
            inner[8] = t;
            fix_checksum(&mut inner);
        }
        Damage::InnerChecksum(c) => inner[10..12].copy_from_slice(&c.to_be_bytes()),
        Damage::InnerFragment(f) => {
            inner[6..8].copy_from_slice(&f.to_be_bytes());
            fix_checksum(&mut inner);
        }
        Damage::InnerDestination(a) => {
            inner[16..20].copy_from_slice(&a);
            fix_checksum(&mut inner);
        }
        Damage::None | Damage::Truncate(_) => {}
    }
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).ipv6(b4(n), AFTR, 64).write(&mut f, etherparse::IpNumber(4), &inner).unwrap();
    if let Damage::Truncate(n) = d {
        f.truncate(n);
    }
    f
}

fn ipv4(f: &Flow, side: Side, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, kind: TcpKind) -> Vec<u8> {
    let payload = &PAYLOAD[..f.payload];
    if f.tcp {
        tcp_frame(side, src, sport, dst, dport, 64, kind, 1000, 2000, payload)
    } else {
        udp_frame(side, src, sport, dst, dport, 64, payload, false)
    }
}

/// The flows' remote ports tell their translated packets apart.
fn dport_of(i: usize) -> u16 {
    2000 + i as u16
}

/// 0: the defaults; 1: an MSS clamp (softwire SYNs take the full path);
/// 2: two ports per subscriber, so that some new flows are refused, with
/// ICMP errors encapsulated into their softwires (RFC 6888 REQ-11); 3: a
/// softwire MTU of 100, so that replies of over 60 bytes are fragmented
/// (through the queue) among smaller ones (encapsulated where they lie).
const MODES: u8 = 4;

fn config_for(mode: u8) -> EngineConfig {
    let mut cfg = EngineConfig {
        dslite: Some(DsliteConfig {
            aftr: AFTR.into(),
            b4_prefixes: vec![],
            mtu: if mode == 3 { 100 } else { 1500 },
            mss_clamp: (mode == 1).then_some(1400),
            ecn_compatibility: false,
        }),
        ..config()
    };
    if mode == 2 {
        cfg.max_ports_per_subscriber = 2;
    }
    cfg
}

/// Everything observable about an engine after a batch: its stats with
/// each B4's own counters (of the B4s with mappings), its table sizes and
/// the frames it sent.
fn observe(e: &mut Engine) -> (String, usize, usize, Vec<(Side, Vec<u8>)>) {
    let mut out = Vec::new();
    e.drain_output(|o| out.push((o.side, o.data.clone())));
    e.drain_events(|_| {});
    let mut per_b4: Vec<String> = e.mapping_views(None).iter().filter_map(|m| Some(format!("{} {:?}", m.b4?, m.softwire?.counters))).collect();
    per_b4.sort();
    per_b4.dedup();
    (format!("{:?} {per_b4:?}", e.stats()), e.tables().session_count(), e.tables().mapping_count(), out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]
    #[test]
    fn softwire_packets_and_replies_are_decided_as_the_full_path_does(
        flows in flows(),
        batches in proptest::collection::vec((prop_oneof![Just(300u64), Just(150_000), Just(301_000)], proptest::collection::vec((0usize..8, any::<bool>(), damage()), 1..100)), 1..6),
        mode in 0..MODES,
        room in prop_oneof![Just(0usize), Just(16), Just(40), Just(256)],
    ) {
        let cfg = config_for(mode);
        let (mut batched, mut single, mut full) = (engine(cfg.clone()), engine(cfg.clone()), engine(cfg));
        let mut now = 1_000_000_000u64;
        // Each flow's external endpoint, learned from its translated packets.
        let mut ext: Vec<Option<([u8; 4], u16)>> = vec![None; flows.len()];
        for (step_ms, batch) in batches {
            now += step_ms * 1_000_000;
            for side in [Side::Inside, Side::Outside] {
                let mut frames = Vec::new();
                for &(i, syn, d) in &batch {
                    let i = i % flows.len();
                    let f = &flows[i];
                    let kind = if syn { TcpKind::Syn } else { TcpKind::Ack };
                    frames.push(match (side, ext[i]) {
                        (Side::Inside, _) => softwire(f.b4, &ipv4(f, side, HOSTS[f.host], f.sport, REMOTE, dport_of(i), kind), d),
                        (Side::Outside, Some((eaddr, eport))) => ipv4(f, side, REMOTE, dport_of(i), eaddr, eport, kind),
                        (Side::Outside, None) => continue,
                    });
                }
                let (mut one_by_one, mut expected) = (frames.clone(), frames.clone());
                let mut verdicts = vec![Verdict::Held; frames.len()];
                // The batch's frames lie in buffers as the dataplane lends
                // them: `room` bytes before each (AF_XDP leaves 256, the
                // copying pool none), the rest of 2048 after.
                let mut buffers: Vec<Vec<u8>> = frames.iter().map(|f| [vec![0xa5; room], f.clone(), vec![0x5a; 2048 - room - f.len()]].concat()).collect();
                let mut lent: Vec<InBuffer> = buffers.iter_mut().zip(&frames).map(|(b, f)| InBuffer::new(b, room, f.len())).collect();
                batched.process_batch(&mut lent, side, now, &mut verdicts);
                let frames: Vec<Vec<u8>> = lent.iter_mut().map(|b| b.frame().to_vec()).collect();
                // A batch's softwire packet decapsulated where it lay, or a
                // reply encapsulated where it lay, leaves from there: the
                // frame the others send through their queue.
                let mut in_place = Vec::new();
                for (k, (a, b)) in one_by_one.iter_mut().zip(expected.iter_mut()).enumerate() {
                    let (va, vb) = (single.process(a, side, now), full.process_full(b, side, now));
                    if let (Verdict::Forward(to), Verdict::Consumed) = (verdicts[k], vb) {
                        in_place.push((to, frames[k].clone()));
                    } else {
                        prop_assert_eq!(verdicts[k], vb, "frame {} of the batch, batched", k);
                        // A frame not forwarded is not sent: a batch may have begun decapsulating it where it lay.
                        if matches!(vb, Verdict::Forward(_)) {
                            prop_assert_eq!(&frames[k], &*b, "frame {} of the batch", k);
                        }
                    }
                    prop_assert_eq!(va, vb, "frame {} of the batch, one by one", k);
                    prop_assert_eq!(&*a, &*b, "frame {} of the batch", k);
                }
                let seen = observe(&mut full);
                let (stats, sessions, mappings, queued) = observe(&mut batched);
                prop_assert_eq!((&stats, sessions, mappings), (&seen.0, seen.1, seen.2));
                // Frames leave their buffers before anything queued, and
                // change in place only while nothing is queued: in order.
                let mut sent = in_place;
                sent.extend(queued);
                prop_assert_eq!(&sent, &seen.3, "every frame sent, in place or queued, in order");
                prop_assert_eq!(&observe(&mut single), &seen);
                for (out_side, data) in &seen.3 {
                    // Stand-ins (240.0.0.0/4) never reach the wire: what goes to a softwire host is encapsulated.
                    if data.len() >= 34 && data[12..14] == [8, 0] {
                        prop_assert!(data[26] < 240 && data[30] < 240, "a stand-in left in {:?}", data);
                    }
                    if *out_side != Side::Outside || data.len() < 38 || data[12..14] != [8, 0] || data[30..34] != REMOTE {
                        continue;
                    }
                    if let Some(i) = u16::from_be_bytes([data[36], data[37]]).checked_sub(dport_of(0)).map(usize::from).filter(|&i| i < flows.len()) {
                        ext[i] = Some(([data[26], data[27], data[28], data[29]], u16::from_be_bytes([data[34], data[35]])));
                    }
                }
            }
        }
    }
}

/// Beside an NPTv6 binding whose inside prefix covers a B4 (a configuration
/// `check-config` refuses), a softwire packet is DS-Lite's on every path,
/// as the full path decides (it asks DS-Lite before NPTv6): NPTv6's fast
/// path leaves IPv4 in IPv6 alone, in a batch as frame by frame.
#[test]
fn beside_an_nptv6_binding_a_softwire_packet_is_dslites_on_every_path() {
    let binding = natrix_engine::nptv6::Binding { inside: std::net::Ipv6Addr::from(b4(0)), outside: "2001:db8:99::".parse().unwrap(), prefix_len: 48 };
    let cfg = EngineConfig { nptv6: vec![binding], ..config_for(0) };
    let (mut batched, mut single, mut full) = (engine(cfg.clone()), engine(cfg.clone()), engine(cfg));
    let f = Flow { tcp: false, b4: 1, host: 0, sport: 1024, payload: 20 };
    let packet = softwire(f.b4, &ipv4(&f, Side::Inside, HOSTS[0], f.sport, REMOTE, dport_of(0), TcpKind::Ack), Damage::None);
    // Twice: the first makes the host's stand-in, the second may take a fast path.
    for _ in 0..2 {
        let mut frames = [packet.clone()];
        let mut verdicts = [Verdict::Held];
        batched.process_batch(&mut frames, Side::Inside, SEC, &mut verdicts);
        let (mut one, mut again) = (packet.clone(), packet.clone());
        let v = single.process(&mut one, Side::Inside, SEC);
        assert_eq!(full.process_full(&mut again, Side::Inside, SEC), v);
        let left = |e: &mut Engine, v: Verdict, frame: &[u8]| {
            let mut out = observe(e).3;
            if v == Verdict::Forward(Side::Outside) {
                out.push((Side::Outside, frame.to_vec()));
            }
            out
        };
        let sent = left(&mut batched, verdicts[0], &frames[0]);
        assert_eq!(sent, left(&mut single, v, &one));
        assert_eq!(sent, left(&mut full, v, &again));
        assert_eq!(sent.len(), 1);
        assert_eq!(&sent[0].1[12..14], &[8, 0], "decapsulated: IPv4 leaves, not the softwire NPTv6 would translate");
    }
}
