//! A reload that narrows `dslite.b4_prefixes` (CONTRACTS.md "DS-Lite
//! AFTR") refuses the B4s it leaves out from the next packet on, also for
//! a host whose packets the fast path was taking a moment before: the fast
//! path admits a run of one softwire's packets once, and a reload must
//! make it admit again. Traffic built with etherparse.

mod common;

use common::*;
use natrix_engine::dslite::{B4Prefix, DsliteConfig};
use natrix_engine::{DropReason, EngineConfig, Side, Verdict};

const AFTR: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1];
const B4: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];

fn softwire_udp(sport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([192, 0, 0, 2], [198, 51, 100, 7], 64).udp(sport, 53).write(&mut v, &[7; 64]).unwrap();
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(MAC_SUB, MAC_NAT_IN).ipv6(B4, AFTR, 64).write(&mut f, etherparse::IpNumber(4), &v).unwrap();
    f
}

fn config_with(b4_prefixes: Vec<B4Prefix>) -> EngineConfig {
    EngineConfig { dslite: Some(DsliteConfig { aftr: AFTR.into(), b4_prefixes, mtu: 1500, mss_clamp: None, ecn_compatibility: false }), ..config() }
}

#[test]
fn a_reload_that_leaves_a_b4_out_refuses_its_next_packet_on_every_path() {
    let mut frame_by_frame = engine(config_with(vec![]));
    let mut batched = engine(config_with(vec![]));
    // Two packets each: the first makes the host's stand-in, the second
    // takes the fast path.
    for sport in [5000, 5000] {
        assert_eq!(run(&mut frame_by_frame, &mut softwire_udp(sport), Side::Inside, SEC), Verdict::Consumed);
        let mut frames = [softwire_udp(sport)];
        let mut verdicts = [Verdict::Held];
        batched.process_batch(&mut frames, Side::Inside, SEC, &mut verdicts);
        assert_eq!(verdicts, [Verdict::Consumed]);
    }
    assert_eq!(frame_by_frame.stats().forwarded[Side::Outside as usize], 2);
    let elsewhere = vec![B4Prefix { network: "2001:db8:2::".parse().unwrap(), len: 48 }];
    for e in [&mut frame_by_frame, &mut batched] {
        e.reconfigure(config_with(elsewhere.clone()), |_| {}).expect("a reload of b4_prefixes");
        outputs(e);
    }
    assert_eq!(run(&mut frame_by_frame, &mut softwire_udp(5000), Side::Inside, 2 * SEC), Verdict::Drop(DropReason::DsliteB4Refused));
    let mut frames = [softwire_udp(5000)];
    let mut verdicts = [Verdict::Held];
    batched.process_batch(&mut frames, Side::Inside, 2 * SEC, &mut verdicts);
    assert_eq!(verdicts, [Verdict::Drop(DropReason::DsliteB4Refused)]);
    for e in [&frame_by_frame, &batched] {
        assert_eq!(e.stats().forwarded[Side::Outside as usize], 2, "nothing more left");
    }
}
