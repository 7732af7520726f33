//! `natrix bench --syn-accel`: the SYN accelerator (seed 003) under a
//! stream of first SYNs to accelerated destinations, on one core. The
//! stream is offered at `--rate` SYNs per second of simulated time, so the
//! table and the timers carry what that rate leaves pending; `--answered`
//! of the attempts get their SYN-ACK back a millisecond later, the others
//! run their whole course (three copies, then the reset at the deadline).
//! The same stream then goes through an engine without the accelerator:
//! the difference is the time the accelerator adds per SYN. Both in router
//! mode (`[nat] mode = "off"`: a bump in the wire, as seed 003's prototype
//! was a bridge) and with NAPT44 translating every connection. Every copy,
//! reset and answer is counted and checked against what the schedule
//! implies. Seed 003's prototype tracked about 14,000 SYN/s.

use std::collections::VecDeque;
use std::time::Instant;

use natrix_engine::config::Exemption;
use natrix_engine::rng::Rng;
use natrix_engine::syn_accel::{Deadline, Interval, SynAccelConfig};
use natrix_engine::{Engine, EngineConfig, Side, Verdict};
use natrix_wire::{checksum, get_u16_at, get_u32_at, ipv4, proto, set_u16_at};
use serde::Serialize;

use crate::Failure;

const BATCH: usize = 64;
/// Ethernet, IPv4 and TCP with the 20 bytes of options Linux puts in a
/// SYN (MSS, SACK permitted, timestamps, window scale): 74 bytes.
pub(super) const SYN_LEN: usize = 74;
const L4: usize = 34;
const SUBSCRIBER_BASE: u32 = 0x6440_0000;
/// Servers: 198.18.0.0/16 (RFC 2544 benchmarking space), all accelerated.
const SERVER_BASE: u32 = 0xc612_0000;
const POOL_BASE: u32 = 0xc613_0000;
const FLOWS_PER_SUBSCRIBER: u64 = 64;
/// When an answered attempt's SYN-ACK comes back.
const ANSWER_AFTER_NS: u64 = 1_000_000;
const MS: u64 = 1_000_000;
/// The contract's defaults: copies at 0.5, 1.0, 1.5 s, the reset at 2 s.
const COPIES: u64 = 3;
const DEADLINE_NS: u64 = 2_000 * MS;

#[derive(Serialize)]
struct Line {
    mode: &'static str,
    /// `[nat] mode`: "off" (routing only) or "dynamic" (NAPT44).
    nat: &'static str,
    syns: u64,
    answered_share: f64,
    offered_rate: u64,
    /// First SYNs the accelerating engine handled per second of its time
    /// (translation, tracking, copies, resets, answers all included).
    syns_per_second: f64,
    ns_per_syn: f64,
    /// The same stream without the accelerator.
    ns_per_syn_without: f64,
    added_ns_per_syn: f64,
    /// Per-SYN time of a batch of first SYNs alone (their forwarding
    /// delay), median and 99th percentile, with and without.
    syn_batch_p50_ns_per_syn: f64,
    syn_batch_p99_ns_per_syn: f64,
    syn_batch_p50_ns_per_syn_without: f64,
    peak_pending: u64,
    accelerator_bytes_at_peak: u64,
    retransmits: u64,
    resets: u64,
    answered: u64,
    errors: u64,
}

/// What one pass through an engine measured.
#[derive(Default)]
struct Pass {
    busy_ns: u64,
    syn_batch_ns: Vec<u32>,
    copies: u64,
    resets: u64,
    peak_pending: u64,
    peak_bytes: u64,
    refused: u64,
    drains: u64,
}

pub fn run(syns: Option<u64>, answered: f64, rate: u64, json: bool) -> Result<(), Failure> {
    if !(0.0..=1.0).contains(&answered) {
        return Err(Failure::Usage("--answered is a share between 0 and 1".into()));
    }
    if rate == 0 {
        return Err(Failure::Usage("--rate must be above zero".into()));
    }
    let syns = syns.unwrap_or(1 << 21);
    let mut errors = 0;
    for translate in [false, true] {
        let line = measure(syns, answered, rate, translate)?;
        errors += line.errors;
        if json {
            println!("{}", serde_json::to_string(&line).expect("serializable"));
        } else {
            print_line(&line);
        }
    }
    if errors > 0 {
        return Err(Failure::Other(format!("{errors} SYNs were not handled as the schedule implies")));
    }
    Ok(())
}

/// The stream with and without the accelerator, routed or translated.
fn measure(syns: u64, answered: f64, rate: u64, translate: bool) -> Result<Line, Failure> {
    let with = pass(syns, answered, rate, Setup { accelerate: true, translate })?;
    let without = pass(syns, answered, rate, Setup { accelerate: false, translate })?;
    let stats_errors = check(&with, syns, answered);
    let n = syns as f64;
    let per_syn = |v: &[u32], pct: usize| percentile(v, pct) as f64 / BATCH as f64;
    Ok(Line {
        mode: "syn_accel",
        nat: if translate { "dynamic" } else { "off" },
        syns,
        answered_share: answered,
        offered_rate: rate,
        syns_per_second: n / (with.busy_ns as f64 / 1e9),
        ns_per_syn: with.busy_ns as f64 / n,
        ns_per_syn_without: without.busy_ns as f64 / n,
        added_ns_per_syn: (with.busy_ns as f64 - without.busy_ns as f64) / n,
        syn_batch_p50_ns_per_syn: per_syn(&with.syn_batch_ns, 50),
        syn_batch_p99_ns_per_syn: per_syn(&with.syn_batch_ns, 99),
        syn_batch_p50_ns_per_syn_without: per_syn(&without.syn_batch_ns, 50),
        peak_pending: with.peak_pending,
        accelerator_bytes_at_peak: with.peak_bytes,
        retransmits: with.copies,
        resets: with.resets,
        answered: answered_count(syns, answered),
        errors: stats_errors + with.refused + without.refused,
    })
}

fn print_line(l: &Line) {
    let setting = if l.nat == "off" { "router mode, a bump in the wire" } else { "with NAPT44" };
    println!("SYN accelerator, one core, {setting}: {} first SYNs offered at {}/s, {:.0}% answered", l.syns, l.offered_rate, l.answered_share * 100.0);
    println!("  tracked          {:>12.0} SYN/s   ({:.1} ns per SYN, everything included)", l.syns_per_second, l.ns_per_syn);
    println!("  without          {:>12.1} ns per SYN (the same stream, no accelerator)", l.ns_per_syn_without);
    println!("  added            {:>12.1} ns per SYN", l.added_ns_per_syn);
    println!(
        "  SYN batch        {:>12.1} ns per SYN p50, {:.1} p99 ({:.1} p50 without)",
        l.syn_batch_p50_ns_per_syn, l.syn_batch_p99_ns_per_syn, l.syn_batch_p50_ns_per_syn_without
    );
    println!("  peak pending     {:>12} attempts, {} bytes of accelerator state", l.peak_pending, l.accelerator_bytes_at_peak);
    println!("  sent             {:>12} copies, {} resets; {} answered", l.retransmits, l.resets, l.answered);
}

/// The engine's counters against the schedule: each unanswered attempt
/// gets three copies and a reset; an answered one (after 1 ms) none.
fn check(p: &Pass, syns: u64, answered: f64) -> u64 {
    let unanswered = syns - answered_count(syns, answered);
    u64::from(p.copies != COPIES * unanswered) + u64::from(p.resets != unanswered)
}

fn answered_count(syns: u64, share: f64) -> u64 {
    (0..syns).filter(|&i| is_answered(i, share)).count() as u64
}

fn is_answered(i: u64, share: f64) -> bool {
    (Rng::new(i ^ 0x5eed).next_u64() % 1_000_000) < (share * 1_000_000.0) as u64
}

/// What a pass runs through.
#[derive(Clone, Copy)]
struct Setup {
    accelerate: bool,
    translate: bool,
}

fn config(syns: u64, setup: Setup) -> EngineConfig {
    EngineConfig {
        translate: setup.translate,
        pool: (POOL_BASE..POOL_BASE + 1024).collect(),
        max_sessions: u32::try_from(syns).unwrap_or(u32::MAX),
        max_subscribers: u32::try_from(syns / FLOWS_PER_SUBSCRIBER + 16).unwrap_or(u32::MAX),
        max_ports_per_subscriber: 2 * FLOWS_PER_SUBSCRIBER as u32,
        event_capacity: 1024,
        syn_accel: setup.accelerate.then(|| SynAccelConfig {
            destinations: vec![Exemption { network: SERVER_BASE, prefix_len: 16, ports: (0, u16::MAX) }],
            interval: Interval::Fixed { ns: 500 * MS },
            attempts: 4,
            deadline: Deadline::Fixed { ns: DEADLINE_NS },
        }),
        ..EngineConfig::default()
    }
}

/// SYN-ACKs waiting to come back, with the time they do.
type Answers = VecDeque<(u64, Vec<[u8; SYN_LEN]>)>;

fn pass(syns: u64, answered: f64, rate: u64, setup: Setup) -> Result<Pass, Failure> {
    let mut engine = Engine::new(config(syns, setup)).map_err(|e| Failure::Other(e.to_string()))?;
    let mut p = Pass { syn_batch_ns: Vec::with_capacity(syns as usize / BATCH + 1), ..Pass::default() };
    let batch_ns = BATCH as u64 * 1_000_000_000 / rate;
    let mut now = 1_000_000_000_000u64;
    let mut answers: Answers = VecDeque::new();
    let mut frames = vec![[0u8; SYN_LEN]; BATCH];
    let mut verdicts = [Verdict::Held; BATCH];
    let mut start = 0u64;
    while start < syns {
        let n = (syns - start).min(BATCH as u64) as usize;
        for (k, f) in frames.iter_mut().enumerate().take(n) {
            first_syn(f, start + k as u64);
        }
        let t = Instant::now();
        engine.process_batch(&mut frames[..n], Side::Inside, now, &mut verdicts[..n]);
        let ns = t.elapsed().as_nanos() as u64;
        p.busy_ns += ns;
        p.syn_batch_ns.push(u32::try_from(ns * BATCH as u64 / n as u64).unwrap_or(u32::MAX));
        p.refused += verdicts[..n].iter().filter(|v| **v != Verdict::Forward(Side::Outside)).count() as u64;
        let back: Vec<[u8; SYN_LEN]> = (0..n).filter(|&k| is_answered(start + k as u64, answered)).map(|k| syn_ack_to(&frames[k])).collect();
        answers.push_back((now + ANSWER_AFTER_NS, back));
        answer_due(&mut engine, &mut answers, now, &mut p);
        drain(&mut engine, &mut p, setup.accelerate);
        start += n as u64;
        now += batch_ns;
    }
    // The stream ends; the clock runs on until every attempt has ended.
    let end = now + DEADLINE_NS + 10 * MS;
    while now < end {
        answer_due(&mut engine, &mut answers, now, &mut p);
        let t = Instant::now();
        engine.advance(now);
        p.busy_ns += t.elapsed().as_nanos() as u64;
        drain(&mut engine, &mut p, setup.accelerate);
        now += MS;
    }
    Ok(p)
}

/// Brings back the SYN-ACKs due by `now`.
fn answer_due(engine: &mut Engine, answers: &mut Answers, now: u64, p: &mut Pass) {
    let mut verdicts = [Verdict::Held; BATCH];
    while answers.front().is_some_and(|a| a.0 <= now) {
        let (at, mut back) = answers.pop_front().expect("just looked");
        if back.is_empty() {
            continue;
        }
        let n = back.len();
        let t = Instant::now();
        engine.process_batch(&mut back, Side::Outside, at.max(now), &mut verdicts[..n]);
        p.busy_ns += t.elapsed().as_nanos() as u64;
        p.refused += verdicts[..n].iter().filter(|v| **v != Verdict::Forward(Side::Inside)).count() as u64;
    }
}

/// Takes what the engine sent (timed: a worker hands it to the I/O thread)
/// and counts it.
fn drain(engine: &mut Engine, p: &mut Pass, accelerate: bool) {
    let (mut copies, mut resets) = (0, 0);
    let t = Instant::now();
    engine.drain_output(|o| match o.side {
        Side::Outside => copies += 1,
        Side::Inside => resets += 1,
    });
    engine.drain_events(|_| {});
    p.busy_ns += t.elapsed().as_nanos() as u64;
    p.copies += copies;
    p.resets += resets;
    p.drains += 1;
    // Read now and then: a snapshot copies every counter.
    if accelerate && p.drains.is_multiple_of(64) {
        if let Some(a) = engine.stats().syn_accel.filter(|a| a.pending > p.peak_pending) {
            p.peak_pending = a.pending;
            p.peak_bytes = engine.memory_bytes() as u64;
        }
    }
}

/// The i-th caller's first SYN: its own subscriber and port, a server in
/// 198.18.0.0/16, options as Linux sends them.
pub(super) fn first_syn(f: &mut [u8; SYN_LEN], i: u64) {
    let r = Rng::new(i).next_u64();
    let sub = SUBSCRIBER_BASE + (i / FLOWS_PER_SUBSCRIBER) as u32;
    let sport = 1024 + ((i % FLOWS_PER_SUBSCRIBER) * 1000 + (r >> 48) % 1000) as u16;
    let server = SERVER_BASE + (r & 0xffff) as u32;
    let dport = [5060, 443, 80, 8080][(r >> 16) as usize % 4];
    segment(f, (sub, sport), (server, dport), r as u32 >> 1, 0, 0x02);
}

/// The server's SYN-ACK to the translated SYN `syn`.
fn syn_ack_to(syn: &[u8; SYN_LEN]) -> [u8; SYN_LEN] {
    let mut f = [0u8; SYN_LEN];
    let (src, dst) = (get_u32_at(syn, 26), get_u32_at(syn, 30));
    let (sport, dport) = (get_u16_at(syn, L4), get_u16_at(syn, L4 + 2));
    let isn = get_u32_at(syn, L4 + 4);
    segment(&mut f, (dst, dport), (src, sport), 7, isn.wrapping_add(1), 0x12);
    f
}

/// Writes an Ethernet/IPv4/TCP segment with Linux's 20 bytes of SYN
/// options and valid checksums.
pub(super) fn segment(f: &mut [u8; SYN_LEN], (src, sport): (u32, u16), (dst, dport): (u32, u16), seq: u32, ack: u32, flags: u8) {
    const OPTIONS: [u8; 20] = [2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7];
    const TCP_LEN: usize = 40;
    *f = [0; SYN_LEN];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    ipv4::emit_header(&mut f[14..L4], src, dst, proto::TCP, (20 + TCP_LEN) as u16, 64, 0);
    set_u16_at(f, L4, sport);
    set_u16_at(f, L4 + 2, dport);
    f[L4 + 4..L4 + 8].copy_from_slice(&seq.to_be_bytes());
    f[L4 + 8..L4 + 12].copy_from_slice(&ack.to_be_bytes());
    f[L4 + 12] = ((TCP_LEN / 4) as u8) << 4;
    f[L4 + 13] = flags;
    set_u16_at(f, L4 + 14, 64_240);
    f[L4 + 20..L4 + TCP_LEN].copy_from_slice(&OPTIONS);
    // Each sum folded to 16 bits first: two 32-bit sums can overflow a u32.
    let pseudo = checksum::fold(checksum::pseudo_header_sum(src, dst, proto::TCP, TCP_LEN as u16));
    let sum = u32::from(pseudo) + u32::from(checksum::fold(checksum::sum(&f[L4..L4 + TCP_LEN])));
    set_u16_at(f, L4 + 16, !checksum::fold(sum));
}

fn percentile(v: &[u32], pct: usize) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get((pct * s.len()).div_ceil(100).max(1) - 1).map_or(0, |&x| u64::from(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_stream_runs_its_whole_schedule_with_and_without_answers() {
        for (share, translate) in [(0.0, true), (0.5, true), (1.0, true), (0.5, false)] {
            let with = pass(4096, share, 1_400_000, Setup { accelerate: true, translate }).unwrap();
            assert_eq!(with.refused, 0);
            assert_eq!(check(&with, 4096, share), 0, "share {share}: {} copies, {} resets", with.copies, with.resets);
            assert!(with.peak_pending > 0);
            let without = pass(4096, share, 1_400_000, Setup { accelerate: false, translate }).unwrap();
            assert_eq!((without.copies, without.resets, without.refused), (0, 0, 0));
        }
    }
}
