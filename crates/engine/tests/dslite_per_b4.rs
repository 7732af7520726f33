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
    softwire_udp_from(b4, [192, 0, 0, 2], sport, payload)
}

/// A UDP datagram from `host` behind `b4`, in its softwire.
fn softwire_udp_from(b4: [u8; 16], host: [u8; 4], sport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4(host, [198, 51, 100, 7], 64).udp(sport, 53).write(&mut v, payload).unwrap();
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
    engine(EngineConfig { dslite: Some(DsliteConfig { aftr: AFTR.into(), b4_prefixes: vec![], mtu: 1500, mss_clamp: None, ecn_compatibility: false }), ..config() })
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
    // `show --b4`: a listing of one B4's hosts, walked by the worker.
    let mut behind = natrix_engine::admin::Walk::new(None, usize::MAX).behind(Some(b4(1).into()));
    while !e.walk_sessions(&mut behind, 1) {}
    assert_eq!(behind.rows.len(), 3);
    assert!(behind.rows.iter().all(|s| s.b4 == Some(b4(1).into())));
}

/// The fast paths decide as the full path does: a host address that is
/// never routed (0/8, 127/8, multicast) is refused as martian however the
/// softwire packet is taken, and takes no stand-in.
#[test]
fn a_martian_host_behind_a_b4_is_refused_on_every_path() {
    for host in [[127, 0, 0, 1], [0, 0, 0, 1], [224, 0, 0, 9]] {
        for full in [false, true] {
            let mut e = engine_ds();
            let mut f = softwire_udp_from(b4(1), host, 5000, b"x");
            let v = if full { e.process_full(&mut f, Side::Inside, SEC) } else { e.process(&mut f, Side::Inside, SEC) };
            assert_eq!(v, Verdict::Drop(natrix_engine::DropReason::Martian), "{host:?}, full path {full}");
            assert!(e.mapping_views(None).is_empty());
        }
    }
}

/// A packet too big lowers one B4's softwire MTU for ten minutes (RFC 8201
/// section 4), then the configured MTU is tried again; one about a B4
/// outside `b4_prefixes` lowers nothing.
#[test]
fn a_lowered_softwire_mtu_holds_ten_minutes_and_only_for_accepted_b4s() {
    let only_b4_1 = natrix_engine::dslite::B4Prefix { network: b4(1).into(), len: 128 };
    let mut e =
        engine(EngineConfig { dslite: Some(DsliteConfig { aftr: AFTR.into(), b4_prefixes: vec![only_b4_1], mtu: 1500, mss_clamp: None, ecn_compatibility: false }), ..config() });
    assert_eq!(run(&mut e, &mut softwire_udp(b4(1), 5000, b"q"), Side::Inside, SEC), Verdict::Consumed);
    let d = must_decode(&outputs(&mut e).into_iter().find(|o| o.0 == Side::Outside).unwrap().2);
    let (ext, port) = (d.src(), d.udp().source_port);
    assert_eq!(run(&mut e, &mut packet_too_big(b4(9), 1280), Side::Inside, SEC), Verdict::Drop(natrix_engine::DropReason::LocalDestination));
    assert_eq!(e.stats().dslite.map(|s| s.mtu_lowered), Some(0), "a B4 natrix does not serve lowers nothing");
    run(&mut e, &mut packet_too_big(b4(1), 1280), Side::Inside, SEC);
    // A reply of 1368 bytes in its softwire, DF set: refused while the MTU towards b4(1) is 1280.
    let large_reply = |e: &mut Engine, at: u64| {
        // The host writes first: its session stays up.
        run(e, &mut softwire_udp(b4(1), 5000, b"q"), Side::Inside, at);
        outputs(e);
        let mut r = udp_frame(Side::Outside, [198, 51, 100, 7], 53, ext, port, 64, &[0; 1300], false);
        let v = run(e, &mut r, Side::Outside, at);
        outputs(e);
        v
    };
    assert_eq!(large_reply(&mut e, 2 * SEC), Verdict::Drop(natrix_engine::DropReason::FragmentationNeeded));
    assert_eq!(large_reply(&mut e, 290 * SEC), Verdict::Drop(natrix_engine::DropReason::FragmentationNeeded));
    assert_eq!(large_reply(&mut e, 580 * SEC), Verdict::Drop(natrix_engine::DropReason::FragmentationNeeded));
    assert_eq!(large_reply(&mut e, 602 * SEC), Verdict::Consumed, "ten minutes on, the configured 1500 again");
}
