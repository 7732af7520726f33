//! Per-B4 counters (issue #18's "metrics per softwire"): each B4 counts its
//! hosts' packets decapsulated and the packets encapsulated towards it, its
//! MTU events and its current sessions, and the operator views of its hosts'
//! mappings and sessions carry them. Two B4s, traffic built with etherparse;
//! the expected counts are the frames this test sent.

mod common;

use common::*;
use natrix_engine::dslite::DsliteConfig;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};

const AFTR: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];

fn b4(n: u8) -> [u8; 16] {
    [0x20, 0x01, 0x0d, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n]
}

fn softwire_udp(b4: [u8; 16], sport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([192, 0, 0, 2], [198, 51, 100, 7], 64).udp(sport, 53).write(&mut v, payload).unwrap();
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).ipv6(b4, AFTR, 64).write(&mut f, etherparse::IpNumber(4), &v).unwrap();
    f
}

/// A packet too big from a router on the way to `to`, quoting a softwire packet natrix sent it.
fn packet_too_big(to: [u8; 16], mtu: u32) -> Vec<u8> {
    let mut quoted = Vec::new();
    let inner = {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ipv4([198, 51, 100, 7], [192, 0, 0, 2], 63).udp(53, 5000).write(&mut v, &[0; 1400]).unwrap();
        v
    };
    etherparse::PacketBuilder::ipv6(AFTR, to, 64).write(&mut quoted, etherparse::IpNumber(4), &inner).unwrap();
    quoted.truncate(1232);
    let router = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0xfe];
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).ipv6(router, AFTR, 64).icmpv6(etherparse::Icmpv6Type::PacketTooBig { mtu }).write(&mut f, &quoted).unwrap();
    f
}

fn engine_ds() -> Engine {
    engine(EngineConfig { dslite: Some(DsliteConfig { aftr: AFTR.into(), b4_prefixes: vec![], mtu: 1500, mss_clamp: None }), ..config() })
}

#[test]
fn each_b4_counts_its_own_traffic_and_the_views_carry_it() {
    let mut e = engine_ds();
    // B4 1: three flows, one with a payload large enough for the fast path; B4 2: one flow.
    let sent = [(b4(1), 5000, &b"q"[..]), (b4(1), 5001, &[7u8; 64][..]), (b4(1), 5002, &b"q"[..]), (b4(2), 5000, &b"q"[..])];
    let mut replies = Vec::new();
    for (b, sport, payload) in sent {
        assert_eq!(run(&mut e, &mut softwire_udp(b, sport, payload), Side::Inside, SEC), Verdict::Consumed);
        let out = outputs(&mut e);
        let d = must_decode(&out.iter().find(|o| o.0 == Side::Outside).unwrap().2);
        replies.push((b, d.src(), d.udp().source_port));
    }
    // Replies to B4 1's first two flows only.
    for &(_, ext, port) in &replies[..2] {
        let mut r = udp_frame(Side::Outside, [198, 51, 100, 7], 53, ext, port, 64, b"a", false);
        assert_eq!(run(&mut e, &mut r, Side::Outside, SEC), Verdict::Consumed);
        outputs(&mut e);
    }
    assert_eq!(run(&mut e, &mut packet_too_big(b4(2), 1400), Side::Inside, SEC), Verdict::Drop(natrix_engine::DropReason::LocalDestination));
    let views = e.mapping_views(None);
    let of = |n: u8| {
        let b: std::net::Ipv6Addr = b4(n).into();
        let rows: Vec<_> = views.iter().filter(|m| m.b4 == Some(b)).collect();
        assert!(rows.iter().all(|m| m.softwire == rows[0].softwire), "every row of a B4 carries its counters");
        let w = rows[0].softwire.expect("softwire counters");
        (w.counters.decapsulated, w.counters.encapsulated, w.counters.mtu_lowered, w.sessions)
    };
    assert_eq!(of(1), (3, 2, 0, 3));
    assert_eq!(of(2), (1, 0, 1, 1));
    assert!(e.session_views(None).iter().all(|s| s.softwire.is_some()));
}
