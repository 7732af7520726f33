//! `natrix bench --mode dslite`: what a softwire (RFC 6333) adds to a
//! NAPT44 packet, on one core. Two engines get the same `--flows` flows
//! (default 1M; 64 per subscriber, half TCP and half UDP, as the NAPT44
//! mode builds them): one from plain IPv4 subscribers, one from hosts
//! behind B4s, each subscriber a B4 (2001:db8:100::/104) whose host is
//! 192.0.0.2 and whose frames are the same IPv4 packets inside IPv6 to the
//! AFTR. After a pass that opens every flow, an established pass outbound
//! (decapsulated, translated) and one inbound (translated, encapsulated to
//! the B4) are timed. Frames lie in buffers with room before them, as
//! AF_XDP's do, so both leave where they lay. The engines run in alternation, `ROUNDS` times, and
//! each figure is the median of its rounds; time is the thread's CPU time,
//! so a shared host's preemptions do not count. Every packet is checked to
//! come out where it should, and both engines' bytes per session are given
//! (all table and allocator bytes / sessions), for issue #18's memory rule.

use std::net::Ipv6Addr;

use natrix_engine::dslite::DsliteConfig;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};
use natrix_wire::{get_u16_at, get_u32_at};
use serde::Serialize;

use super::buffers::Buffers;
use super::host_id::{median, table_config, thread_cpu_ns};
use super::{build, flow, FRAME_LEN, TCP_ACK, TCP_SYN};
use crate::Failure;

const BATCH: usize = 64;
const ROUNDS: usize = 3;
const DEFAULT_FLOWS: u64 = 1 << 20;
const AFTR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, 1);
/// The first B4: subscriber k's B4 is this plus k.
const B4_BASE: u128 = 0x2001_0db8_0100_0000_0000_0000_0000_0000;
/// RFC 6333's B4 address, the one host behind each B4.
const HOST: u32 = 0xc000_0002;
const IPV6_LEN: usize = 40;
const SOFTWIRE_LEN: usize = FRAME_LEN + IPV6_LEN;
const NEXT_HEADER_IPV4: u8 = 4;

#[derive(Serialize)]
struct Line {
    mode: &'static str,
    flows: u64,
    rounds: usize,
    /// An established packet from the inside: NAPT44 alone, and a softwire
    /// packet decapsulated then translated. Medians of the rounds.
    ns_per_outbound_napt44: f64,
    ns_per_outbound_softwire: f64,
    /// An established reply: NAPT44 alone, and translated then encapsulated to its B4.
    ns_per_inbound_napt44: f64,
    ns_per_inbound_softwire: f64,
    /// Both directions together, softwire over NAPT44 (issue #18's target: at most 1.3).
    ratio: f64,
    bytes_per_session_napt44: f64,
    bytes_per_session_softwire: f64,
    errors: u64,
}

/// The engines a round compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Setup {
    Napt44,
    Softwire,
}

pub fn run(flows: Option<u64>, json: bool) -> Result<(), Failure> {
    let flows = flows.unwrap_or(DEFAULT_FLOWS).max(BATCH as u64);
    let (mut out, mut back, mut bytes) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()], [0.0; 2]);
    let mut errors = 0;
    for _ in 0..ROUNDS {
        for (k, setup) in [Setup::Napt44, Setup::Softwire].into_iter().enumerate() {
            let r = round(flows, setup)?;
            out[k].push(r.outbound_ns);
            back[k].push(r.inbound_ns);
            bytes[k] = r.bytes_per_session;
            errors += r.errors;
        }
    }
    let [o4, o6] = out.map(median);
    let [i4, i6] = back.map(median);
    let ratio = (o6 + i6) / (o4 + i4);
    let line = Line {
        mode: "dslite",
        flows,
        rounds: ROUNDS,
        ns_per_outbound_napt44: o4,
        ns_per_outbound_softwire: o6,
        ns_per_inbound_napt44: i4,
        ns_per_inbound_softwire: i6,
        ratio,
        bytes_per_session_napt44: bytes[0],
        bytes_per_session_softwire: bytes[1],
        errors,
    };
    if json {
        println!("{}", serde_json::to_string(&line).expect("serializable"));
    } else {
        println!("DS-Lite (RFC 6333): {flows} established flows, NAPT44 alone and through softwires, one core, median of {ROUNDS} alternating rounds");
        println!("{:>28} {:>10} {:>10} {:>7}", "", "NAPT44", "softwire", "ratio");
        println!("{:>28} {:>10.1} {:>10.1} {:>7.2}", "ns per outbound packet", o4, o6, o6 / o4);
        println!("{:>28} {:>10.1} {:>10.1} {:>7.2}", "ns per inbound packet", i4, i6, i6 / i4);
        println!("{:>28} {:>10.1} {:>10.1} {:>7.2}", "ns per packet, both ways", (o4 + i4) / 2.0, (o6 + i6) / 2.0, ratio);
        println!("{:>28} {:>10.1} {:>10.1} {:>+7.1}", "bytes per session", bytes[0], bytes[1], bytes[1] - bytes[0]);
    }
    if errors > 0 {
        return Err(Failure::Other(format!("{errors} packets did not come out as expected")));
    }
    Ok(())
}

fn config(flows: u64, setup: Setup) -> EngineConfig {
    EngineConfig {
        dslite: (setup == Setup::Softwire).then_some(DsliteConfig { aftr: AFTR, b4_prefixes: Vec::new(), mtu: 1500, mss_clamp: None, ecn_compatibility: false }),
        ..table_config(flows)
    }
}

struct Round {
    outbound_ns: f64,
    inbound_ns: f64,
    bytes_per_session: f64,
    errors: u64,
}

/// Room before each frame in its buffer, as AF_XDP leaves (256 bytes
/// there): enough for the 40 bytes of an outer IPv6 header.
const ROOM: usize = 64;

/// The frames of a batch, of either kind, in buffers with room before
/// them, as an I/O backend's (a softwire packet leaves decapsulated from
/// where it lay, a reply encapsulated where it lay).
type Frames = Buffers<{ ROOM + SOFTWIRE_LEN }>;

/// Flow `i`'s frame from the inside: the NAPT44 frame, or for a softwire
/// the same IPv4 packet from 192.0.0.2 inside IPv6 from its subscriber's B4.
fn outbound(frames: &mut Frames, k: usize, i: u64, setup: Setup, tcp_flags: u8) {
    let fl = flow(0, i);
    let mut plain = [0u8; FRAME_LEN];
    let src = if setup == Setup::Softwire { HOST } else { fl.sub };
    build(&mut plain, fl.tcp, src, fl.sport, fl.server, fl.dport, tcp_flags);
    if setup == Setup::Napt44 {
        frames.fresh(k, ROOM, FRAME_LEN).copy_from_slice(&plain);
        return;
    }
    let b4 = b4_of(fl.sub);
    // The B4 sends the IPv4 packet alone, without the Ethernet padding of the NAPT44 frame.
    let inner = usize::from(get_u16_at(&plain, 16));
    let b = frames.fresh(k, ROOM, 54 + inner);
    b[..12].copy_from_slice(&plain[..12]);
    b[12..14].copy_from_slice(&[0x86, 0xdd]);
    b[14..18].copy_from_slice(&[0x60, 0, 0, 0]);
    b[18..20].copy_from_slice(&(inner as u16).to_be_bytes());
    b[20] = NEXT_HEADER_IPV4;
    b[21] = 64;
    b[22..38].copy_from_slice(&b4.octets());
    b[38..54].copy_from_slice(&AFTR.octets());
    b[54..54 + inner].copy_from_slice(&plain[14..14 + inner]);
}

/// The B4 of the subscriber NAPT44's frames give `sub`.
fn b4_of(sub: u32) -> Ipv6Addr {
    Ipv6Addr::from(B4_BASE + u128::from(sub - flow(0, 0).sub))
}

/// The external endpoint a translated outbound frame left with.
fn external_of(frame: &[u8]) -> (u32, u16) {
    (get_u32_at(frame, 26), get_u16_at(frame, 34))
}

fn round(flows: u64, setup: Setup) -> Result<Round, Failure> {
    // Each engine starts from a heap the one before gave back.
    super::release_free_heap();
    let mut engine = Engine::new(config(flows, setup)).map_err(|e| Failure::Other(e.to_string()))?;
    let mut frames = Frames::new(BATCH);
    let mut verdicts = [Verdict::Held; BATCH];
    let mut external = vec![(0u32, 0u16); flows as usize];
    let mut errors = 0u64;
    let now = 1_000_000_000u64;
    // Opening: every flow's first frame; where it left is kept for the replies.
    let mut i = 0;
    while i < flows {
        let n = (flows - i).min(BATCH as u64) as usize;
        (0..n).for_each(|k| outbound(&mut frames, k, i + k as u64, setup, TCP_SYN));
        frames.lend(n, |lent| engine.process_batch(lent, Side::Inside, now, &mut verdicts[..n]));
        // A host's first packet leaves as a copy (its stand-in is made on
        // the full path), the others decapsulated where they lay.
        let mut left = Vec::with_capacity(n);
        engine.drain_output(|o| left.push(external_of(&o.data)));
        let mut queued = left.into_iter();
        for (k, v) in verdicts[..n].iter().enumerate() {
            let at = (i + k as u64) as usize;
            match *v {
                Verdict::Forward(Side::Outside) => external[at] = external_of(frames.frame(k)),
                Verdict::Consumed if setup == Setup::Softwire => match queued.next() {
                    Some(e) => external[at] = e,
                    None => errors += 1,
                },
                _ => errors += 1,
            }
        }
        engine.drain_events(|_| {});
        i += n as u64;
    }
    let sessions = engine.tables().session_count().max(1) as f64;
    let bytes_per_session = engine.memory_bytes() as f64 / sessions;
    let (outbound_busy, e1) = established_outbound(&mut engine, &mut frames, flows, setup, now);
    let (inbound_busy, e2) = established_inbound(&mut engine, &mut frames, &external, setup, now);
    Ok(Round { outbound_ns: outbound_busy as f64 / flows as f64, inbound_ns: inbound_busy as f64 / flows as f64, bytes_per_session, errors: errors + e1 + e2 })
}

/// The timed established pass from the inside: (CPU ns, errors).
#[inline(never)]
fn established_outbound(engine: &mut Engine, frames: &mut Frames, flows: u64, setup: Setup, now: u64) -> (u64, u64) {
    let mut verdicts = [Verdict::Held; BATCH];
    let (mut busy, mut errors, mut i) = (0u64, 0u64, 0u64);
    while i < flows {
        let n = (flows - i).min(BATCH as u64) as usize;
        (0..n).for_each(|k| outbound(frames, k, i + k as u64, setup, TCP_ACK));
        let mut left = 0;
        frames.lend(n, |lent| {
            let t = thread_cpu_ns();
            engine.process_batch(lent, Side::Inside, now, &mut verdicts[..n]);
            engine.drain_output(|o| left += usize::from(o.side == Side::Outside));
            busy += thread_cpu_ns() - t;
        });
        // Decapsulated where they lay, or (a softwire packet whose frame could not narrow) as copies.
        let in_place = (0..n).filter(|&k| verdicts[k] == Verdict::Forward(Side::Outside) && frames.frame(k)[12..14] == [8, 0]).count();
        errors += n.abs_diff(in_place + left) as u64;
        i += n as u64;
    }
    (busy, errors)
}

/// The timed established pass of replies from the servers: (CPU ns,
/// errors). A reply must reach its host: in place for NAPT44, encapsulated
/// to the flow's B4 for a softwire.
#[inline(never)]
fn established_inbound(engine: &mut Engine, frames: &mut Frames, external: &[(u32, u16)], setup: Setup, now: u64) -> (u64, u64) {
    let mut verdicts = [Verdict::Held; BATCH];
    let (mut busy, mut errors, mut i) = (0u64, 0u64, 0usize);
    let mut plain = [0u8; FRAME_LEN];
    while i < external.len() {
        let n = (external.len() - i).min(BATCH);
        for k in 0..n {
            let fl = flow(0, (i + k) as u64);
            let (ext, eport) = external[i + k];
            build(&mut plain, fl.tcp, fl.server, fl.dport, ext, eport, TCP_ACK);
            frames.fresh(k, ROOM, FRAME_LEN).copy_from_slice(&plain);
        }
        let mut to_b4s = [0u128; BATCH];
        let mut sent = 0;
        frames.lend(n, |lent| {
            let t = thread_cpu_ns();
            engine.process_batch(lent, Side::Outside, now, &mut verdicts[..n]);
            engine.drain_output(|o| {
                if o.side == Side::Inside && o.data[12..14] == [0x86, 0xdd] && sent < BATCH {
                    to_b4s[sent] = u128::from_be_bytes(o.data[38..54].try_into().unwrap_or([0; 16]));
                    sent += 1;
                }
            });
            busy += thread_cpu_ns() - t;
        });
        // A softwire's reply leaves encapsulated where it lay, or (one
        // that needs fragments) through the queue, in order.
        let mut queued = to_b4s[..sent].iter();
        for (k, v) in verdicts[..n].iter().enumerate() {
            let fl = flow(0, (i + k) as u64);
            let b4 = u128::from(b4_of(fl.sub));
            let f = frames.frame(k);
            let ok = match (setup, *v) {
                (Setup::Napt44, Verdict::Forward(Side::Inside)) => get_u32_at(f, 30) == fl.sub && get_u16_at(f, 36) == fl.sport,
                (Setup::Softwire, Verdict::Forward(Side::Inside)) => f[12..14] == [0x86, 0xdd] && f[38..54] == b4.to_be_bytes(),
                (Setup::Softwire, Verdict::Consumed) => queued.next() == Some(&b4),
                _ => false,
            };
            errors += u64::from(!ok);
        }
        i += n;
    }
    (busy, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_packet_comes_out_both_ways_for_both_engines() {
        for setup in [Setup::Napt44, Setup::Softwire] {
            let r = round(4096, setup).unwrap();
            assert_eq!(r.errors, 0, "{setup:?}");
            assert!(r.bytes_per_session > 0.0);
        }
    }
}
