//! Feeds sequences of frames to `Engine::process` from both sides with a
//! moving clock. Checks: no panic, and state stays within its configured
//! bounds (sessions, held fragments, output queue).
//!
//! Input: records of [flags][len_hi][len_lo][frame...]. flags bit 0: side
//! (1 = outside); bit 1: repair the IPv4 header and ICMP checksums (of the
//! frame's IPv4 packet, or of the one a DS-Lite softwire packet carries) so
//! the fuzzer reaches past checksum validation; bits 2-7: seconds to advance.

#![no_main]

use libfuzzer_sys::fuzz_target;
use natrix_engine::{Engine, EngineConfig, Side};
use natrix_wire::checksum;

const MAX_SESSIONS: u32 = 256;

fn config() -> EngineConfig {
    EngineConfig {
        pool: (0..4).map(|i| u32::from_be_bytes([203, 0, 113, i])).collect(),
        ports: (1024, 1100),
        max_ports_per_subscriber: 32,
        max_sessions: MAX_SESSIONS,
        max_subscribers: 64,
        max_held_fragments: 8,
        max_held_fragment_bytes: 4096,
        max_held_syns: 8,
        event_capacity: 64,
        exempt: vec![natrix_engine::config::Exemption { network: u32::from_be_bytes([192, 0, 2, 0]), prefix_len: 24, ports: (0, 65535) }],
        // NPTv6 (RFC 6296): one binding of each word choice (sections 3.4 and 3.5);
        // IPv6 outside them is only routed, so the seeds reach both.
        nptv6: vec![
            natrix_engine::nptv6::Binding { inside: "fd01:203:405::".parse().expect("address"), outside: "2001:db8:1::".parse().expect("address"), prefix_len: 48 },
            natrix_engine::nptv6::Binding { inside: "fd02:0:0:600::".parse().expect("address"), outside: "2001:db8:2:100::".parse().expect("address"), prefix_len: 56 },
        ],
        // DS-Lite (RFC 6333): softwire packets to this AFTR from B4s in one
        // prefix, with a small MTU so outer fragmentation is reached.
        dslite: Some(natrix_engine::dslite::DsliteConfig {
            aftr: "2001:db8:0:1::1".parse().expect("address"),
            b4_prefixes: vec![natrix_engine::dslite::B4Prefix { network: "2001:db8:100::".parse().expect("address"), len: 40 }],
            mtu: 1280,
            mss_clamp: Some(1200),
            ecn_compatibility: false,
        }),
        ..EngineConfig::default()
    }
}

/// Recomputes the IPv4 header checksum and, for ICMP, the message checksum,
/// of an Ethernet/IPv4 frame or of the packet in an IPv4-in-IPv6 one.
fn repair(frame: &mut [u8]) {
    match frame.get(12..14) {
        Some([0x08, 0x00]) => repair_ipv4(&mut frame[14..]),
        Some([0x86, 0xdd]) if frame.len() > 54 && frame[20] == 4 => repair_ipv4(&mut frame[54..]),
        _ => {}
    }
}

fn repair_ipv4(ip: &mut [u8]) {
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < 20 || ip.len() < ihl {
        return;
    }
    ip[10..12].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(&ip[..ihl]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
    if ip[9] == 1 && total >= ihl + 4 {
        let icmp = &mut ip[ihl..total];
        icmp[2..4].copy_from_slice(&[0, 0]);
        let c = checksum::checksum(icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
    }
}

fuzz_target!(|data: &[u8]| {
    let mut engine = Engine::new(config()).expect("valid config");
    let mut now_ns = 1_000_000_000u64;
    let mut rest = data;
    let mut frame = Vec::with_capacity(2048);
    while rest.len() >= 3 {
        let flags = rest[0];
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        frame.clear();
        frame.extend_from_slice(&rest[3..3 + len]);
        rest = &rest[3 + len..];
        if flags & 2 != 0 {
            repair(&mut frame);
        }
        now_ns += u64::from(flags >> 2) * 1_000_000_000;
        let side = if flags & 1 != 0 { Side::Outside } else { Side::Inside };
        engine.process(&mut frame, side, now_ns);
        let mut out = 0;
        engine.drain_output(|_| out += 1);
        engine.drain_events(|_| {});
        assert!(out <= 64, "one frame produced {out} frames");
        assert!(engine.tables().session_count() <= MAX_SESSIONS as usize);
    }
    engine.finish();
    engine.drain_output(|_| {});
});
