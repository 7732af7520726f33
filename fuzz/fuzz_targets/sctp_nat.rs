//! Feeds SCTP packets to the engine from both sides (seed 001's NAT): the
//! fuzzer writes the SCTP bytes (common header, chunks, parameters) and the
//! target wraps them in Ethernet and a valid IPv4 header, so every input
//! reaches the SCTP code rather than dying at the IPv4 checksum. Checks: no
//! panic; the association table stays within its size; each packet makes at
//! most one answer (an ABORT-M or ERROR-M); subscribers' counts match.
//!
//! Input: one byte of limits (bits 0-1: max_chunks - 1, bits 2-4:
//! max_params, bits 5-6: track_global_addresses, bit 7: reply_ootb both),
//! then records of [flags][len_hi][len_lo][SCTP packet...]. flags bit 0:
//! from outside; bits 1-2: which subscriber or server; bits 3-7: seconds
//! to advance.

#![no_main]

use libfuzzer_sys::fuzz_target;
use natrix_engine::nat44::sctp::{ReplyOotb, SctpConfig};
use natrix_engine::{Engine, EngineConfig, Proto, Side};
use natrix_wire::checksum;

const MAX_ASSOCIATIONS: u32 = 16;
const POOL: [u8; 4] = [203, 0, 113, 1];

fn config(limits: u8) -> EngineConfig {
    EngineConfig {
        pool: vec![u32::from_be_bytes(POOL)],
        max_subscribers: 8,
        max_sessions: 64,
        event_capacity: 64,
        sctp: SctpConfig {
            max_chunks: u32::from(limits & 3) + 1,
            max_params: u32::from(limits >> 2 & 7),
            track_global_addresses: u32::from(limits >> 5 & 3),
            reply_ootb: if limits & 0x80 != 0 { ReplyOotb::Both } else { ReplyOotb::Inside },
            max_associations: MAX_ASSOCIATIONS,
        },
        ..EngineConfig::default()
    }
}

/// An Ethernet/IPv4 frame around `sctp`, from a subscriber (inside) or a
/// server (outside), `who` picking which.
fn frame(out: &mut Vec<u8>, outside: bool, who: u8, sctp: &[u8]) {
    let (src, dst) = if outside { ([198, 51, 100, 20 + who], POOL) } else { ([100, 64, 0, 10 + who], [198, 51, 100, 20 + (who & 1)]) };
    out.clear();
    out.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00]);
    let total = (20 + sctp.len()) as u16;
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 64, 132, 0, 0]);
    out.extend_from_slice(&src);
    out.extend_from_slice(&dst);
    let c = checksum::checksum(&out[14..34]);
    out[24..26].copy_from_slice(&c.to_be_bytes());
    out.extend_from_slice(sctp);
}

fuzz_target!(|data: &[u8]| {
    let Some((&limits, mut rest)) = data.split_first() else { return };
    let mut engine = Engine::new(config(limits)).expect("valid config");
    let mut now_ns = 1_000_000_000u64;
    let mut buf = Vec::with_capacity(2048);
    while rest.len() >= 3 {
        let flags = rest[0];
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]])).min(rest.len() - 3).min(1480);
        let outside = flags & 1 != 0;
        frame(&mut buf, outside, flags >> 1 & 3, &rest[3..3 + len]);
        rest = &rest[3 + len..];
        now_ns += u64::from(flags >> 3) * 1_000_000_000;
        engine.process(&mut buf, if outside { Side::Outside } else { Side::Inside }, now_ns);
        let mut answers = 0;
        engine.drain_output(|_| answers += 1);
        engine.drain_events(|_| {});
        assert!(answers <= 1, "one packet made {answers} frames");
        let assocs = engine.associations().len();
        assert!(assocs <= MAX_ASSOCIATIONS as usize);
        let held: u32 = engine.subscribers().iter().map(|(_, s)| s.ports[Proto::Sctp as usize]).sum();
        assert_eq!(held as usize, assocs, "every association is one port use of its subscriber");
    }
    let open = engine.associations().len();
    let mut ended = 0;
    engine.release_all(|e| ended += usize::from(e.kind == natrix_engine::EventKind::MappingDeleted));
    assert_eq!(ended, open, "every association's end is logged");
    assert_eq!(engine.associations().len(), 0);
    assert!(engine.subscribers().is_empty(), "ending every association frees every subscriber");
});
