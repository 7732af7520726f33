//! Property test: random outbound flows are translated as RFC 4787/5382/5508
//! and the contract require, and a reply built from the translated packet
//! comes back to exactly the original subscriber endpoint.

mod common;

/// An address and port (or ICMP identifier).
type Endpoint = ([u8; 4], u16);
/// An endpoint of one protocol.
type ProtoEndpoint = (u8, [u8; 4], u16);

use common::*;
use natrix_engine::{Side, Verdict};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Udp { zero_csum: bool },
    Tcp,
    Echo,
}

impl Kind {
    fn proto(self) -> u8 {
        match self {
            Kind::Udp { .. } => 17,
            Kind::Tcp => 6,
            Kind::Echo => 1,
        }
    }
}

#[derive(Debug, Clone)]
struct Flow {
    sub: usize,
    sport: u16,
    remote: [u8; 4],
    dport: u16,
    kind: Kind,
    ttl: u8,
    seq: u32,
    payload: Vec<u8>,
}

/// Addresses in 100.64.0.0/10 other than its network and broadcast
/// addresses and natrix's own inside address 100.64.0.1.
fn subscriber() -> impl Strategy<Value = [u8; 4]> {
    let base = u32_of([100, 64, 0, 0]);
    (2u32..(1 << 22) - 1).prop_map(move |o| addr_of(base + o))
}

fn remote() -> impl Strategy<Value = [u8; 4]> {
    prop_oneof![(1u8..=254).prop_map(|x| [198, 51, 100, x]), (1u8..=254).prop_map(|x| [192, 0, 2, x])]
}

fn port() -> impl Strategy<Value = u16> {
    // A few fixed ports make repeated internal endpoints (EIM) and clashes
    // between subscribers (port preservation fallback) likely.
    prop_oneof![3 => 1u16..=65535, 1 => prop::sample::select(vec![53u16, 1024, 5000, 5001, 40000, 65535])]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![any::<bool>().prop_map(|z| Kind::Udp { zero_csum: z }), Just(Kind::Tcp), Just(Kind::Echo)]
}

fn flow(nsubs: usize) -> impl Strategy<Value = Flow> {
    (0..nsubs, port(), remote(), 1u16..=65535, kind(), 2u8..=255, any::<u32>(), prop::collection::vec(any::<u8>(), 0..64))
        .prop_map(|(sub, sport, remote, dport, kind, ttl, seq, payload)| Flow { sub, sport, remote, dport, kind, ttl, seq, payload })
}

fn scenario() -> impl Strategy<Value = (Vec<[u8; 4]>, Vec<Flow>)> {
    prop::collection::vec(subscriber(), 1..6).prop_flat_map(|subs| {
        let n = subs.len();
        (Just(subs), prop::collection::vec(flow(n), 1..24))
    })
}

fn outbound_frame(f: &Flow, sub: [u8; 4]) -> Vec<u8> {
    match f.kind {
        Kind::Udp { zero_csum } => udp_frame(Side::Inside, sub, f.sport, f.remote, f.dport, f.ttl, &f.payload, zero_csum),
        Kind::Tcp => tcp_frame(Side::Inside, sub, f.sport, f.remote, f.dport, f.ttl, TcpKind::Syn, f.seq, 0, &f.payload),
        Kind::Echo => echo_frame(Side::Inside, sub, f.remote, f.ttl, false, f.sport, f.seq as u16, &f.payload),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn outbound_then_reply_round_trips((subs, flows) in scenario()) {
        let cfg = config();
        let mut e = engine(cfg.clone());
        let mut now = SEC;
        // Paired pooling: subscriber -> external address.
        let mut paired: HashMap<[u8; 4], [u8; 4]> = HashMap::new();
        // EIM: (proto, internal endpoint) -> external endpoint.
        let mut eim: HashMap<ProtoEndpoint, Endpoint> = HashMap::new();
        // Uniqueness: (proto, external endpoint) -> internal endpoint.
        let mut owner: HashMap<ProtoEndpoint, Endpoint> = HashMap::new();

        for (i, f) in flows.iter().enumerate() {
            let sub = subs[f.sub];
            let proto = f.kind.proto();
            let orig = outbound_frame(f, sub);
            let mut frame = orig.clone();
            now += 1_000_000;
            let v = e.process(&mut frame, Side::Inside, now);
            prop_assert_eq!(v, Verdict::Forward(Side::Outside), "flow {} {:?} from {:?}", i, f, sub);
            prop_assert!(outputs(&mut e).is_empty(), "no generated frames expected");

            let o = decode(&frame).map_err(|m| TestCaseError::fail(format!("outbound flow {i}: {m}")))?;
            let inp = must_decode(&orig);
            // Ethernet untouched, addresses: src from the pool, dst unchanged.
            prop_assert_eq!(&frame[..ETH_LEN], &orig[..ETH_LEN]);
            prop_assert!(in_pool(&cfg, o.src()), "src {:?} not in pool", o.src());
            prop_assert_eq!(o.dst(), f.remote);
            prop_assert_eq!(o.ip.time_to_live, f.ttl - 1);
            prop_assert_eq!(o.ip.protocol.0, proto);
            prop_assert_eq!(o.ip.total_len, inp.ip.total_len);
            prop_assert_eq!(&o.payload, &f.payload);

            let ext_port = match f.kind {
                Kind::Udp { zero_csum } => {
                    let u = o.udp();
                    prop_assert_eq!(u.destination_port, f.dport);
                    prop_assert_eq!(u.length, inp.udp().length);
                    if zero_csum {
                        prop_assert_eq!(u.checksum, 0, "zero UDP checksum must stay zero");
                    } else {
                        prop_assert_ne!(u.checksum, 0);
                    }
                    u.source_port
                }
                Kind::Tcp => {
                    let t = o.tcp();
                    let ti = inp.tcp();
                    prop_assert_eq!(t.destination_port, f.dport);
                    prop_assert_eq!(t.sequence_number, f.seq);
                    prop_assert!(t.syn && !t.ack && !t.fin && !t.rst);
                    prop_assert_eq!(t.window_size, ti.window_size);
                    t.source_port
                }
                Kind::Echo => match o.icmp().icmp_type {
                    etherparse::Icmpv4Type::EchoRequest(h) => {
                        prop_assert_eq!(h.seq, f.seq as u16);
                        h.id
                    }
                    ref other => return Err(TestCaseError::fail(format!("expected echo request, got {other:?}"))),
                },
            };
            let ext = (o.src(), ext_port);

            // Port range and parity (UDP/TCP); ICMP identifiers have no parity rule.
            if proto != 1 {
                prop_assert!(ext_port >= cfg.ports.0, "external port {} below range", ext_port);
                prop_assert_eq!(ext_port % 2, f.sport % 2, "parity of {} -> {}", f.sport, ext_port);
            }

            // Paired pooling.
            if let Some(a) = paired.get(&sub) {
                prop_assert_eq!(*a, o.src(), "subscriber {:?} moved external address", sub);
            }
            paired.insert(sub, o.src());

            // Endpoint-independent mapping.
            let key = (proto, sub, f.sport);
            match eim.get(&key) {
                Some(prev) => prop_assert_eq!(*prev, ext, "EIM broken for {:?}", key),
                None => {
                    // Port preservation: a new mapping keeps the source port when in range and free.
                    let free = !owner.contains_key(&(proto, o.src(), f.sport));
                    if f.sport >= cfg.ports.0 && free {
                        prop_assert_eq!(ext_port, f.sport, "port not preserved for {:?}", key);
                    }
                    eim.insert(key, ext);
                }
            }
            match owner.get(&(proto, ext.0, ext.1)) {
                Some(o2) => prop_assert_eq!(*o2, (sub, f.sport), "external endpoint {:?} shared", ext),
                None => {
                    owner.insert((proto, ext.0, ext.1), (sub, f.sport));
                }
            }

            // The reply: the translated packet with its endpoints swapped.
            let reply_payload: Vec<u8> = f.payload.iter().rev().copied().collect();
            let mut reply = match f.kind {
                Kind::Udp { zero_csum } => udp_frame(Side::Outside, f.remote, f.dport, ext.0, ext.1, 64, &reply_payload, zero_csum),
                Kind::Tcp => tcp_frame(Side::Outside, f.remote, f.dport, ext.0, ext.1, 64, TcpKind::SynAck, 0x1000_0000, f.seq.wrapping_add(1), &[]),
                Kind::Echo => echo_frame(Side::Outside, f.remote, ext.0, 64, true, ext.1, f.seq as u16, &reply_payload),
            };
            let reply_orig = reply.clone();
            now += 1_000_000;
            let v = e.process(&mut reply, Side::Outside, now);
            prop_assert_eq!(v, Verdict::Forward(Side::Inside), "reply to flow {} {:?}", i, f);
            prop_assert!(outputs(&mut e).is_empty());
            let r = decode(&reply).map_err(|m| TestCaseError::fail(format!("reply flow {i}: {m}")))?;
            prop_assert_eq!(&reply[..ETH_LEN], &reply_orig[..ETH_LEN]);
            prop_assert_eq!(r.src(), f.remote);
            prop_assert_eq!(r.dst(), sub);
            prop_assert_eq!(r.ip.time_to_live, 63);
            match f.kind {
                Kind::Udp { zero_csum } => {
                    let u = r.udp();
                    prop_assert_eq!(u.source_port, f.dport);
                    prop_assert_eq!(u.destination_port, f.sport);
                    prop_assert_eq!(u.checksum == 0, zero_csum);
                    prop_assert_eq!(&r.payload, &reply_payload);
                }
                Kind::Tcp => {
                    let t = r.tcp();
                    prop_assert_eq!(t.source_port, f.dport);
                    prop_assert_eq!(t.destination_port, f.sport);
                    prop_assert!(t.syn && t.ack);
                    prop_assert_eq!(t.acknowledgment_number, f.seq.wrapping_add(1));
                }
                Kind::Echo => match r.icmp().icmp_type {
                    etherparse::Icmpv4Type::EchoReply(h) => {
                        prop_assert_eq!(h.id, f.sport);
                        prop_assert_eq!(h.seq, f.seq as u16);
                        prop_assert_eq!(&r.payload, &reply_payload);
                    }
                    ref other => return Err(TestCaseError::fail(format!("expected echo reply, got {other:?}"))),
                },
            }
        }
        // Every subscriber's mappings live on one address.
        prop_assert!(e.tables().mapping_count() <= eim.len());
        e.finish();
        prop_assert!(outputs(&mut e).is_empty());
    }
}
