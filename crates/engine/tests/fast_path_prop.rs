//! Differential property test: the fast path never decides differently from
//! the full path. Two engines with the same configuration see the same
//! frames, one through `process` (fast path first), one through
//! `process_full`; established flows are then sent in both directions,
//! intact or damaged in the fields the fast path reads (TTL, fragment bits,
//! lengths, header length, checksums, protocol, addresses, TCP flags).
//! Verdicts, the frames as rewritten, generated frames, counters and table
//! sizes must match after every frame. Through `process_batch`, each
//! flow's frames must leave in the order they leave frame by frame.

mod common;

use common::*;
use natrix_engine::{Engine, Side, Verdict};
use proptest::prelude::*;

const REMOTE: [u8; 4] = [198, 51, 100, 7];

#[derive(Debug, Clone, Copy)]
enum Damage {
    None,
    Ttl(u8),
    FragmentBits(u16),
    TotalLength(u16),
    HeaderLength(u8),
    IpChecksum(u16),
    Protocol(u8),
    Destination(u8),
    TcpFlags(u8),
    TcpDataOffset(u8),
    UdpLength(u16),
    Truncate(usize),
    Byte(usize, u8),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => Just(Damage::None),
        1 => prop_oneof![Just(0u8), Just(1), Just(2), any::<u8>()].prop_map(Damage::Ttl),
        1 => prop_oneof![Just(0x2000u16), Just(0x0001), Just(0x4000), any::<u16>()].prop_map(Damage::FragmentBits),
        1 => any::<u16>().prop_map(Damage::TotalLength),
        1 => (0u8..16).prop_map(Damage::HeaderLength),
        1 => any::<u16>().prop_map(Damage::IpChecksum),
        1 => prop_oneof![Just(1u8), Just(6), Just(17), any::<u8>()].prop_map(Damage::Protocol),
        1 => any::<u8>().prop_map(Damage::Destination),
        1 => any::<u8>().prop_map(Damage::TcpFlags),
        1 => (0u8..16).prop_map(Damage::TcpDataOffset),
        1 => any::<u16>().prop_map(Damage::UdpLength),
        1 => (0usize..80).prop_map(Damage::Truncate),
        1 => (0usize..80, any::<u8>()).prop_map(|(i, v)| Damage::Byte(i, v)),
    ]
}

fn apply(frame: &mut Vec<u8>, d: Damage, tcp: bool) {
    const IP: usize = ETH_LEN;
    const L4: usize = ETH_LEN + 20;
    match d {
        Damage::None => {}
        Damage::Ttl(v) => frame[IP + 8] = v,
        Damage::FragmentBits(v) => frame[IP + 6..IP + 8].copy_from_slice(&v.to_be_bytes()),
        Damage::TotalLength(v) => frame[IP + 2..IP + 4].copy_from_slice(&v.to_be_bytes()),
        Damage::HeaderLength(v) => frame[IP] = 0x40 | v,
        Damage::IpChecksum(v) => frame[IP + 10..IP + 12].copy_from_slice(&v.to_be_bytes()),
        Damage::Protocol(v) => frame[IP + 9] = v,
        Damage::Destination(v) => frame[IP + 19] = v,
        Damage::TcpFlags(v) if tcp => frame[L4 + 13] = v,
        Damage::TcpDataOffset(v) if tcp => frame[L4 + 12] = v << 4,
        Damage::UdpLength(v) if !tcp => frame[L4 + 4..L4 + 6].copy_from_slice(&v.to_be_bytes()),
        Damage::Truncate(n) => frame.truncate(n.min(frame.len())),
        Damage::Byte(i, v) => {
            if let Some(b) = frame.get_mut(i) {
                *b = v;
            }
        }
        _ => {}
    }
}

/// Makes the IPv4 header checksum right again after damage elsewhere, so the
/// damage itself is what the paths must agree on.
fn refill_ip_checksum(frame: &mut [u8]) {
    let Some(&vihl) = frame.get(ETH_LEN) else { return };
    let end = ETH_LEN + usize::from(vihl & 0x0f) * 4;
    if end < ETH_LEN + 12 || end > frame.len() {
        return;
    }
    frame[ETH_LEN + 10] = 0;
    frame[ETH_LEN + 11] = 0;
    let mut sum: u32 = frame[ETH_LEN..end].chunks(2).map(|w| u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

/// Everything observable about an engine after a frame.
fn observe(e: &mut Engine) -> (String, usize, usize, Vec<Vec<u8>>) {
    let mut out = Vec::new();
    e.drain_output(|o| out.push(o.data.clone()));
    e.drain_events(|_| {});
    (format!("{:?}", e.stats()), e.tables().session_count(), e.tables().mapping_count(), out)
}

/// Whether a batch's verdict on a frame gives it the fate frame by frame
/// gave it: the same verdict, or a copy (`Held`) of what would otherwise
/// overtake a frame of its flow waiting in the output queue.
fn same_fate(batch: Verdict, one_by_one: Verdict) -> bool {
    batch == one_by_one || (batch == Verdict::Held && matches!(one_by_one, Verdict::Forward(_)))
}

/// Frames in the order they left, grouped by what a receiver sees as one
/// ordered stream: the side, addresses and protocol of an IPv4 packet
/// (fragments without ports included). natrix's own ICMP errors carry no
/// order against the frames they answer, so ICMP is compared as a set.
fn in_flow_order(left: Vec<(Side, Vec<u8>)>) -> std::collections::BTreeMap<(u8, Vec<u8>), Vec<Vec<u8>>> {
    let mut streams: std::collections::BTreeMap<(u8, Vec<u8>), Vec<Vec<u8>>> = Default::default();
    for (side, fr) in left {
        let key = match fr.get(ETH_LEN + 9) {
            Some(&p) if p != 1 && fr.len() >= ETH_LEN + 20 => [&fr[ETH_LEN + 9..ETH_LEN + 10], &fr[ETH_LEN + 12..ETH_LEN + 20]].concat(),
            _ => vec![1],
        };
        streams.entry((side as u8, key)).or_default().push(fr);
    }
    if let Some(icmp) = streams.get_mut(&(Side::Inside as u8, vec![1])) {
        icmp.sort();
    }
    if let Some(icmp) = streams.get_mut(&(Side::Outside as u8, vec![1])) {
        icmp.sort();
    }
    streams
}

/// The allocation modes both paths must agree in: 0 the defaults (ports
/// kept when free); 1 two ports per subscriber, so that some new flows are
/// refused (with ICMP, RFC 6888 REQ-11); 2 port blocks of four, at most two
/// per subscriber; 3 random ports (RFC 6056); 4 deterministic NAT (RFC
/// 7422), each subscriber its formula's 16 ports; 5 the remote's ports below
/// 512 exempt from translation (RFC 6888 REQ-6), the rest translated.
/// With middlebox functions, whose frames take the fast path's translation
/// between the functions' runs: 6 HOST_ID in SYN mode inserting WING and
/// BOUCADAIR (every SYN grows); 7 HOST_ID in ACK mode (every TCP segment
/// is the function's); 8 the SYN accelerator for the remote's ports.
const MODES: u8 = 9;

/// Whether `mode` installs a middlebox function.
fn with_functions(mode: u8) -> bool {
    mode >= 6
}

fn config_for(mode: u8) -> natrix_engine::EngineConfig {
    use natrix_engine::config::PortSelection;
    use natrix_engine::deterministic::{Deterministic, DeterministicConfig, SubscriberPrefix};
    let mut cfg = config();
    match mode {
        1 => cfg.max_ports_per_subscriber = 2,
        2 => {
            cfg.port_block_size = 4;
            cfg.max_ports_per_subscriber = 8;
        }
        3 => cfg.port_selection = PortSelection::Random,
        4 => {
            cfg.deterministic = Some(
                Deterministic::new(
                    &DeterministicConfig { subscribers: vec![SubscriberPrefix::Ipv4(u32::from_be_bytes([100, 64, 0, 0]), 29)], ports_per_subscriber: 16 },
                    &cfg.pool,
                    cfg.ports,
                )
                .unwrap(),
            )
        }
        5 => cfg.exempt = vec![natrix_engine::config::Exemption { network: u32::from_be_bytes(REMOTE), prefix_len: 32, ports: (1, 511) }],
        6 | 7 => {
            use natrix_engine::host_id::{HostIdConfig, Kinds, Mode, Origin, WingData};
            let ack = mode == 7;
            cfg.host_id = Some(HostIdConfig {
                mode: if ack { Mode::Ack } else { Mode::Syn },
                wing: (!ack).then_some(WingData::Ipv4Low16),
                boucadair: Some(Origin::PortIpv4),
                lifetime: 0,
                enabled: ack,
                kinds: Kinds::DEFAULT,
                rules: vec![],
            })
        }
        8 => {
            use natrix_engine::syn_accel::{Deadline, Interval, SynAccelConfig};
            cfg.syn_accel = Some(SynAccelConfig {
                destinations: vec![natrix_engine::config::Exemption { network: u32::from_be_bytes(REMOTE), prefix_len: 32, ports: (1, 1023) }],
                interval: Interval::Fixed { ns: 200_000_000 },
                attempts: 4,
                deadline: Deadline::Fixed { ns: 900_000_000 },
            })
        }
        _ => {}
    }
    cfg
}

#[derive(Debug, Clone)]
struct Flow {
    tcp: bool,
    sub: u8,
    sport: u16,
    dport: u16,
    /// Payload bytes: UDP frames under 54 bytes (12 bytes of payload) are
    /// too short for the fast path's view and go to the full path.
    payload: usize,
}

fn flows() -> impl Strategy<Value = Vec<Flow>> {
    proptest::collection::vec(
        (any::<bool>(), 2u8..6, 1024u16..1100, 1u16..1024, prop_oneof![3 => 12usize..40, 1 => 0usize..12]).prop_map(|(tcp, sub, sport, dport, payload)| Flow {
            tcp,
            sub,
            sport,
            dport,
            payload,
        }),
        1..8,
    )
}

const PAYLOAD: [u8; 40] = *b"payload payload payload payload payload ";

fn frame(f: &Flow, side: Side, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, kind: TcpKind) -> Vec<u8> {
    let payload = &PAYLOAD[..f.payload];
    if f.tcp {
        tcp_frame(side, src, sport, dst, dport, 64, kind, 1000, 2000, payload)
    } else {
        udp_frame(side, src, sport, dst, dport, 64, payload, false)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn fast_path_decides_as_the_full_path_does(
        flows in flows(),
        traffic in proptest::collection::vec((0usize..8, any::<bool>(), prop_oneof![Just(TcpKind::Ack), Just(TcpKind::Fin), Just(TcpKind::Rst), Just(TcpKind::Syn)], damage(), any::<bool>()), 1..40),
        mode in 0..MODES,
    ) {
        let cfg = config_for(mode);
        let (mut fast, mut full) = (engine(cfg.clone()), engine(cfg));
        let mut now = 1_000_000_000u64;
        // Open every flow (through the fast path's `open` in one engine, the
        // full path in the other; refused past a quota, with ICMP) and
        // learn its external endpoint from the translation.
        let mut ext = Vec::new();
        for f in &flows {
            let sub = [100, 64, 0, f.sub];
            let mut a = frame(f, Side::Inside, sub, f.sport, REMOTE, f.dport, TcpKind::Syn);
            let mut b = a.clone();
            let va = fast.process(&mut a, Side::Inside, now);
            let vb = full.process_full(&mut b, Side::Inside, now);
            prop_assert_eq!(va, vb);
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(observe(&mut fast), observe(&mut full));
            ext.push((va == Verdict::Forward(Side::Outside)).then(|| (addr_of(u32::from_be_bytes([a[26], a[27], a[28], a[29]])), u16::from_be_bytes([a[34], a[35]]))));
        }
        for (i, outbound, kind, d, bad_checksum) in traffic {
            let f = &flows[i % flows.len()];
            now += 250_000_000;
            let (mut a, side) = match (outbound, ext[i % flows.len()]) {
                (true, _) => (frame(f, Side::Inside, [100, 64, 0, f.sub], f.sport, REMOTE, f.dport, kind), Side::Inside),
                (false, Some((eaddr, eport))) => (frame(f, Side::Outside, REMOTE, f.dport, eaddr, eport, kind), Side::Outside),
                (false, None) => continue,
            };
            apply(&mut a, d, f.tcp);
            if !bad_checksum {
                refill_ip_checksum(&mut a);
            }
            let mut b = a.clone();
            let va = fast.process(&mut a, side, now);
            let vb = full.process_full(&mut b, side, now);
            prop_assert_eq!(va, vb, "damage {:?}", d);
            prop_assert_eq!(&a, &b, "damage {:?}", d);
            prop_assert_eq!(observe(&mut fast), observe(&mut full), "damage {:?}", d);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, ..ProptestConfig::default() })]
    /// `process_batch` (batch prefetch, hashes handed to the lookups, one
    /// clock step) decides every frame as the full path does frame by frame,
    /// new flows and replies mixed in one batch, damaged frames included,
    /// batches longer than one prefetch chunk (64 frames) included.
    #[test]
    fn a_batch_decides_as_the_full_path_does(
        flows in flows(),
        batches in proptest::collection::vec((prop_oneof![Just(300u64), Just(150_000), Just(301_000)], proptest::collection::vec((0usize..8, any::<bool>(), damage(), any::<bool>()), 1..150)), 1..6),
        mode in 0..MODES,
    ) {
        let cfg = config_for(mode);
        let (mut batched, mut full) = (engine(cfg.clone()), engine(cfg));
        let mut now = 1_000_000_000u64;
        let mut ext: Vec<Option<([u8; 4], u16)>> = vec![None; flows.len()];
        // Steps long enough for sessions to expire between some batches.
        for (step_ms, batch) in batches {
            now += step_ms * 1_000_000;
            for side in [Side::Inside, Side::Outside] {
                let mut frames = Vec::new();
                let mut owners = Vec::new();
                for &(i, syn, d, bad_checksum) in &batch {
                    let i = i % flows.len();
                    let f = &flows[i];
                    let kind = if syn { TcpKind::Syn } else { TcpKind::Ack };
                    let mut fr = match (side, ext[i]) {
                        (Side::Inside, _) => frame(f, side, [100, 64, 0, f.sub], f.sport, REMOTE, f.dport, kind),
                        (Side::Outside, Some((eaddr, eport))) => frame(f, side, REMOTE, f.dport, eaddr, eport, kind),
                        (Side::Outside, None) => continue,
                    };
                    apply(&mut fr, d, f.tcp);
                    if !bad_checksum {
                        refill_ip_checksum(&mut fr);
                    }
                    frames.push(fr);
                    owners.push(i);
                }
                // What timers sent at the batch's instant, apart from the
                // frames' own leaving order.
                batched.advance(now);
                full.advance(now);
                prop_assert_eq!(observe(&mut batched), observe(&mut full));
                let mut expected = frames.clone();
                let mut verdicts = vec![Verdict::Held; frames.len()];
                if with_functions(mode) {
                    // Lent without room, as `process_full` has none: a SYN
                    // that grows leaves as a copy in both (the growth in
                    // place is host_id_in_place_prop's).
                    let mut lent: Vec<&mut [u8]> = frames.iter_mut().map(|f| f.as_mut_slice()).collect();
                    batched.process_batch(&mut lent, side, now, &mut verdicts);
                } else {
                    batched.process_batch(&mut frames, side, now, &mut verdicts);
                }
                // Frame by frame, each forwarded frame leaves before what
                // its translation queued; a batch's frames forwarded where
                // they lie leave before the whole queue.
                let mut left_full = Vec::new();
                for (k, fr) in expected.iter_mut().enumerate() {
                    let v = full.process_full(fr, side, now);
                    prop_assert!(same_fate(verdicts[k], v), "frame {} of the batch: {:?} against {:?}", k, verdicts[k], v);
                    prop_assert_eq!(&frames[k], &*fr, "frame {} of the batch", k);
                    if let Verdict::Forward(out) = v {
                        left_full.push((out, fr.clone()));
                    }
                    full.drain_output(|o| left_full.push((o.side, o.data.clone())));
                    if side == Side::Inside && v == Verdict::Forward(Side::Outside) && frames[k].len() >= 36 {
                        ext[owners[k]] = Some((addr_of(u32::from_be_bytes([fr[26], fr[27], fr[28], fr[29]])), u16::from_be_bytes([fr[34], fr[35]])));
                    }
                }
                let mut left_batch: Vec<(Side, Vec<u8>)> = verdicts.iter().zip(&frames).filter_map(|(v, fr)| match v {
                    Verdict::Forward(out) => Some((*out, fr.clone())),
                    _ => None,
                }).collect();
                batched.drain_output(|o| left_batch.push((o.side, o.data.clone())));
                prop_assert_eq!(in_flow_order(left_batch), in_flow_order(left_full));
                prop_assert_eq!(observe(&mut batched), observe(&mut full));
            }
        }
    }
}
