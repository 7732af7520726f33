//! Softwire stand-ins are recycled: an engine whose table holds 64 hosts
//! behind B4s serves many times that many distinct (B4, inner address)
//! pairs over time, as their mappings expire, and replies still reach the
//! right B4 once stand-ins have served other pairs. Frames are built and
//! read with etherparse.

mod common;

use common::*;
use natrix_engine::dslite::DsliteConfig;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};

const AFTR: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
const TABLE: u32 = 64;
const ROUNDS: u32 = 40;
const PER_ROUND: u32 = 48;

fn b4(n: u32) -> [u8; 16] {
    let mut a = [0x20, 0x01, 0x0d, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    a[12..].copy_from_slice(&n.to_be_bytes());
    a
}

fn engine_small() -> Engine {
    let mut cfg = EngineConfig {
        max_sessions: TABLE,
        max_subscribers: TABLE,
        dslite: Some(DsliteConfig { aftr: AFTR.into(), b4_prefixes: vec![], mtu: 1500, mss_clamp: None, ecn_compatibility: false }),
        ..config()
    };
    cfg.timeouts.udp_s = 30;
    engine(cfg)
}

fn softwire_udp(b4: [u8; 16], inner: [u8; 4]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4(inner, [198, 51, 100, 7], 64).udp(5000, 53).write(&mut v, b"q").unwrap();
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).ipv6(b4, AFTR, 64).write(&mut f, etherparse::IpNumber(4), &v).unwrap();
    f
}

/// The (B4, inner address) a frame natrix sends into a softwire is for.
fn softwire_target(frame: &[u8]) -> ([u8; 16], [u8; 4]) {
    let ip6 = etherparse::SlicedPacket::from_ethernet(frame).unwrap();
    let Some(etherparse::NetSlice::Ipv6(v6)) = ip6.net else { panic!("not IPv6") };
    let inner = etherparse::Ipv4HeaderSlice::from_slice(v6.payload().payload).unwrap();
    (v6.header().destination(), inner.destination())
}

#[test]
fn many_more_pairs_than_the_table_holds_are_served_as_old_ones_expire() {
    let mut e = engine_small();
    let mut now = SEC;
    for round in 0..ROUNDS {
        let pairs: Vec<([u8; 16], [u8; 4])> = (0..PER_ROUND).map(|k| (b4(round * PER_ROUND + k), [10, 0, (round % 200) as u8, k as u8])).collect();
        let mut left = Vec::new();
        for &(b, inner) in &pairs {
            let mut f = softwire_udp(b, inner);
            assert_eq!(run(&mut e, &mut f, Side::Inside, now), Verdict::Consumed, "round {round}: pair refused");
            let out = outputs(&mut e);
            let d = must_decode(&out.iter().find(|o| o.0 == Side::Outside).expect("translated").2);
            left.push((d.src(), d.udp().source_port));
            e.drain_events(|_| {});
        }
        // Each reply finds the pair that sent it, whatever stand-in it got.
        for (&(ext, port), &pair) in left.iter().zip(&pairs) {
            let mut r = udp_frame(Side::Outside, [198, 51, 100, 7], 53, ext, port, 64, b"a", false);
            assert_eq!(run(&mut e, &mut r, Side::Outside, now), Verdict::Consumed);
            let out = outputs(&mut e);
            assert_eq!(softwire_target(&out.iter().find(|o| o.0 == Side::Inside).expect("to the B4").2), pair, "round {round}");
        }
        e.drain_events(|_| {});
        // Past the UDP timeout and the grace period, in steps, draining events.
        for _ in 0..40 {
            now += SEC;
            let mut idle = udp_frame(Side::Outside, [198, 51, 100, 7], 53, [203, 0, 113, 1], 9, 64, b"", false);
            run(&mut e, &mut idle, Side::Outside, now);
            e.drain_events(|_| {});
        }
        assert_eq!(e.tables().mapping_count(), 0, "round {round}: mappings expired");
    }
    let served = ROUNDS * PER_ROUND;
    assert!(served > 20 * TABLE, "the test churns {served} pairs through a table of {TABLE}");
}
