//! Deterministic mode by B4 (RFC 7422 with RFC 6333): `[nat] subscribers`
//! lists B4 prefixes, each B4 address is one subscriber counted in order,
//! and every host behind a B4 leaves inside the B4's range. Frames are built
//! and decoded with etherparse; the expected ranges are the documented
//! formula computed here by hand, not asked of the engine.

mod common;

use common::*;
use natrix_engine::deterministic::{Deterministic, DeterministicConfig, SubscriberPrefix};
use natrix_engine::dslite::DsliteConfig;
use natrix_engine::{DropReason, Engine, EngineConfig, Side, Verdict};

const AFTR: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
const POOL: [u32; 2] = [0xcb00_7101, 0xcb00_7102];
/// 2001:db8:100::/126, then 100.64.0.0/30: B4s are subscribers 0-3.
const B4_NET: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
/// Ports 1024-65535 in ranges of 16128: 4 ranges per address.
const N: u16 = 16128;

fn b4(last: u8) -> [u8; 16] {
    let mut a = B4_NET;
    a[15] = last;
    a
}

fn engine_det() -> Engine {
    let formula = DeterministicConfig { subscribers: vec![SubscriberPrefix::B4(B4_NET.into(), 126), SubscriberPrefix::Ipv4(u32_of([100, 64, 0, 0]), 30)], ports_per_subscriber: N };
    let cfg = EngineConfig {
        pool: POOL.to_vec(),
        deterministic: Some(Deterministic::new(&formula, &POOL, (1024, 65535)).unwrap()),
        dslite: Some(DsliteConfig { aftr: AFTR.into(), b4_prefixes: vec![], mtu: 1500, mss_clamp: None, ecn_compatibility: false }),
        max_sessions: 1024,
        max_ports_per_subscriber: 3 * u32::from(N),
        ..config()
    };
    engine(cfg)
}

fn softwire_udp(b4: [u8; 16], inner: [u8; 4], sport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4(inner, [198, 51, 100, 7], 64).udp(sport, 53).write(&mut v, b"q").unwrap();
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).ipv6(b4, AFTR, 64).write(&mut f, etherparse::IpNumber(4), &v).unwrap();
    f
}

/// Sends a softwire packet; the translated frame's (source address, port).
fn translate(e: &mut Engine, f: &mut [u8], now: u64) -> Option<([u8; 4], u16)> {
    let v = run(e, f, Side::Inside, now);
    let out = outputs(e);
    if v != Verdict::Consumed {
        return None;
    }
    let d = must_decode(&out.iter().find(|o| o.0 == Side::Outside)?.2);
    Some((d.src(), d.udp().source_port))
}

/// Subscriber `i` of the formula: pool[i / 4], ports 1024 + (i % 4) * N ..
fn range_of(i: u32) -> ([u8; 4], u16, u16) {
    let first = 1024 + (i % 4) as u16 * N;
    (addr_of(POOL[(i / 4) as usize]), first, first + (N - 1))
}

#[test]
fn hosts_behind_each_b4_leave_inside_the_b4s_range() {
    let mut e = engine_det();
    let mut now = SEC;
    for (last, i) in [(0u8, 0u32), (2, 2), (3, 3)] {
        let (addr, first, last_port) = range_of(i);
        for (inner, sport) in [([192, 0, 0, 2], 5000), ([10, 0, 0, 9], 5000), ([192, 0, 0, 2], 40001)] {
            now += 1000;
            let (src, port) = translate(&mut e, &mut softwire_udp(b4(last), inner, sport), now).expect("translated");
            assert_eq!(src, addr, "B4 ::{last}");
            assert!((first..=last_port).contains(&port), "B4 ::{last}: {port} outside {first}-{last_port}");
        }
    }
    // The IPv4 prefix continues the numbering: 100.64.0.1 is subscriber 5.
    let (addr, first, last_port) = range_of(5);
    let mut f = udp_frame(Side::Inside, [100, 64, 0, 1], 7000, [198, 51, 100, 7], 53, 64, b"q", false);
    assert_eq!(run(&mut e, &mut f, Side::Inside, now), Verdict::Forward(Side::Outside));
    let d = must_decode(&f);
    assert!(d.src() == addr && (first..=last_port).contains(&d.udp().source_port));
}

#[test]
fn a_b4_outside_the_prefixes_is_dropped_and_counted_without_a_stand_in() {
    let mut e = engine_det();
    assert_eq!(translate(&mut e, &mut softwire_udp(b4(4), [192, 0, 0, 2], 5000), SEC), None);
    assert_eq!(e.stats().drops.get(DropReason::NotSubscriber), 1);
    assert_eq!(e.tables().mapping_count(), 0);
    assert!(e.stats().dslite.is_some_and(|s| s.softwires == 0), "no B4 interned");
}
