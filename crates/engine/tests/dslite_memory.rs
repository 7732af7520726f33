//! Issue #18's memory rule: a softwire session costs at most 16 bytes more
//! than a NAPT44 session. natrix interns each (B4, inner address) into a
//! 32-bit stand-in once, so sessions stay as they are and only hosts cost
//! (a B4 and an endpoint, with their index slots). Measured with homes of
//! 16 sessions each, the same traffic once through softwires and once from
//! plain IPv4 subscribers, frames built with etherparse.

mod common;

use common::*;
use natrix_engine::dslite::DsliteConfig;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};

const HOMES: u32 = 2000;
const SESSIONS_PER_HOME: u16 = 16;
const AFTR: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];

fn b4(home: u32) -> [u8; 16] {
    let mut a = [0x20, 0x01, 0x0d, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    a[12..].copy_from_slice(&home.to_be_bytes());
    a
}

fn cfg(dslite: bool) -> EngineConfig {
    EngineConfig {
        max_sessions: 1 << 16,
        dslite: dslite.then(|| DsliteConfig { aftr: AFTR.into(), b4_prefixes: vec![], mtu: 1500, mss_clamp: None, ecn_compatibility: false }),
        ..config()
    }
}

fn softwire_udp(home: u32, sport: u16, dport: u16) -> Vec<u8> {
    let mut f = Vec::new();
    let inner = {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ipv4([192, 0, 0, 2], [198, 51, 100, 7], 64).udp(sport, dport).write(&mut v, b"x").unwrap();
        v
    };
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 9], [2, 0, 0, 0, 1, 1]).ipv6(b4(home), AFTR, 64).write(&mut f, etherparse::IpNumber(4), &inner).unwrap();
    f
}

fn bytes_per_session(dslite: bool) -> f64 {
    let mut e: Engine = engine(cfg(dslite));
    for home in 0..HOMES {
        for s in 0..SESSIONS_PER_HOME {
            let (sport, dport) = (10_000 + s, 53);
            let mut f = if dslite {
                softwire_udp(home, sport, dport)
            } else {
                udp_frame(Side::Inside, addr_of(u32_of([100, 64, 0, 0]) + home), sport, [198, 51, 100, 7], dport, 64, b"x", false)
            };
            let v = run(&mut e, &mut f, Side::Inside, SEC);
            assert!(matches!(v, Verdict::Forward(Side::Outside) | Verdict::Consumed), "{v:?}");
            e.drain_output(|_| {});
        }
    }
    assert_eq!(e.tables().session_count(), (HOMES * u32::from(SESSIONS_PER_HOME)) as usize);
    e.memory_bytes() as f64 / f64::from(HOMES * u32::from(SESSIONS_PER_HOME))
}

#[test]
fn a_softwire_session_costs_at_most_16_bytes_more_than_a_napt44_one() {
    let (plain, softwire) = (bytes_per_session(false), bytes_per_session(true));
    assert!(softwire - plain <= 16.0, "softwire {softwire:.1} vs NAPT44 {plain:.1} bytes per session");
}
