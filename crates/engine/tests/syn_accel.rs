//! The SYN accelerator through the engine (seed 003, CONTRACTS.md "SYN
//! accelerator"), judged by etherparse: the schedule of copies, the copies
//! byte for byte the SYN natrix forwarded, absorbed retransmissions, the
//! reset's fields, answers ending tracking, the batch path, router mode,
//! and established traffic left to the fast path.

mod common;

use common::*;
use natrix_engine::syn_accel::{Deadline, Interval, SynAccelConfig};
use natrix_engine::{DropReason, Engine, EngineConfig, Side, Verdict};

const SUB: [u8; 4] = [100, 64, 0, 10];
const SERVER: [u8; 4] = [198, 51, 100, 7];
const OTHER: [u8; 4] = [192, 0, 2, 9];
const MS: u64 = 1_000_000;
const T0: u64 = 1_000 * SEC;
const ISN: u32 = 2_835_748_628;

fn accelerated(mut cfg: EngineConfig, interval: Interval, deadline: Deadline) -> Engine {
    cfg.syn_accel = Some(SynAccelConfig {
        destinations: vec![natrix_engine::config::Exemption { network: u32_of(SERVER), prefix_len: 32, ports: (5060, 5061) }],
        interval,
        attempts: 4,
        deadline,
    });
    engine(cfg)
}

fn defaults(cfg: EngineConfig) -> Engine {
    accelerated(cfg, Interval::Fixed { ns: 500 * MS }, Deadline::Fixed { ns: 2_000 * MS })
}

fn syn(port: u16, isn: u32) -> Vec<u8> {
    tcp_frame(Side::Inside, SUB, 40000, SERVER, port, 64, TcpKind::Syn, isn, 0, b"")
}

/// Runs the clock through `until` in 1 ms steps, collecting what the engine sends.
fn tick(e: &mut Engine, from: u64, until: u64) -> Vec<(Side, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut now = from;
    while now <= until {
        e.advance(now);
        out.extend(outputs(e));
        now += MS;
    }
    out
}

#[test]
fn an_unanswered_syn_is_sent_again_at_the_interval_and_the_caller_reset_at_the_deadline() {
    let mut e = defaults(config());
    let mut first = syn(5060, ISN);
    assert_eq!(run(&mut e, &mut first, Side::Inside, T0), Verdict::Forward(Side::Outside));
    // The caller's own retransmission (Linux: 1 s later) is absorbed.
    let mut again = syn(5060, ISN);
    let mut out = tick(&mut e, T0, T0 + 999 * MS);
    assert_eq!(run(&mut e, &mut again, Side::Inside, T0 + SEC), Verdict::Drop(DropReason::SynAbsorbed));
    out.extend(tick(&mut e, T0 + SEC, T0 + 3 * SEC));
    let copies: Vec<_> = out.iter().filter(|o| o.0 == Side::Outside).collect();
    assert_eq!(copies.iter().map(|c| c.1).collect::<Vec<_>>(), [T0 + 500 * MS, T0 + 1_000 * MS, T0 + 1_500 * MS], "4 SYNs in all, the caller's first included");
    for c in &copies {
        assert_eq!(c.2, first, "a copy is the SYN as natrix forwarded it, byte for byte");
    }
    let resets: Vec<_> = out.iter().filter(|o| o.0 == Side::Inside).collect();
    assert_eq!(resets.len(), 1);
    assert_eq!(resets[0].1, T0 + 2 * SEC, "stamped with the deadline");
    let rst = must_decode(&resets[0].2);
    assert_eq!((rst.src(), rst.dst()), (SERVER, SUB));
    let t = rst.tcp();
    assert_eq!((t.source_port, t.destination_port), (5060, 40000));
    assert!(t.rst && t.ack && !t.syn && !t.fin && !t.psh);
    assert_eq!((t.sequence_number, t.acknowledgment_number, t.window_size), (0, ISN + 1, 0));
    assert!(t.options.is_empty() && rst.payload.is_empty());
    assert_eq!((rst.eth.source, rst.eth.destination), (MAC_NAT_IN, MAC_SUB));
    let s = e.stats();
    let a = s.syn_accel.clone().unwrap();
    assert_eq!((a.syns, a.retransmits, a.answered, a.resets, a.pending), (1, 3, 0, 1, 0));
    assert_eq!(s.drops.get(DropReason::SynAbsorbed), 1);
    assert_eq!(s.generated, [1, 3]);
}

#[test]
fn a_syn_ack_ends_tracking_passes_through_and_is_timed() {
    let mut e = defaults(config());
    let mut first = syn(5061, ISN);
    assert_eq!(run(&mut e, &mut first, Side::Inside, T0), Verdict::Forward(Side::Outside));
    let out = must_decode(&first);
    let mut answer = tcp_frame(Side::Outside, SERVER, 5061, out.src(), out.tcp().source_port, 64, TcpKind::SynAck, 77, ISN + 1, b"");
    let mut sent = tick(&mut e, T0, T0 + 600 * MS);
    assert_eq!(run(&mut e, &mut answer, Side::Outside, T0 + 600 * MS), Verdict::Forward(Side::Inside));
    let back = must_decode(&answer);
    assert_eq!((back.dst(), back.tcp().destination_port), (SUB, 40000));
    sent.extend(tick(&mut e, T0 + 600 * MS, T0 + 3 * SEC));
    assert_eq!(sent.len(), 1, "one copy at 0.5 s, nothing after the answer: {sent:?}");
    let a = e.stats().syn_accel.unwrap();
    assert_eq!((a.syns, a.retransmits, a.answered, a.resets), (1, 1, 1, 0));
    assert_eq!(a.handshake.count, 1);
    assert_eq!(a.handshake.sum_ns, 600 * MS);
    assert!(a.learned.is_empty(), "Karn: a copy went out, the answer may be to either");
}

#[test]
fn established_traffic_and_other_destinations_are_untouched() {
    let mut plain = engine(config());
    let mut accel = defaults(config());
    let frames = [
        (Side::Inside, syn(80, 5)),
        (Side::Inside, tcp_frame(Side::Inside, SUB, 40000, OTHER, 5060, 64, TcpKind::Syn, 6, 0, b"")),
        (Side::Inside, tcp_frame(Side::Inside, SUB, 40000, SERVER, 80, 64, TcpKind::Ack, 6, 1, b"payload")),
    ];
    for (side, f) in &frames {
        let (mut a, mut b) = (f.clone(), f.clone());
        assert_eq!(run(&mut plain, &mut a, *side, T0), run(&mut accel, &mut b, *side, T0));
        assert_eq!(a, b);
    }
    assert!(tick(&mut accel, T0, T0 + 3 * SEC).is_empty());
    assert_eq!(accel.stats().syn_accel.unwrap().syns, 0);
}

#[test]
fn the_batch_path_decides_as_the_frame_path() {
    let mut one = defaults(config());
    let mut batched = defaults(config());
    // Eight callers' ports, to both accelerated ports.
    let frames: Vec<Vec<u8>> = (0..8u32).map(|i| tcp_frame(Side::Inside, SUB, 41000 + i as u16, SERVER, 5060 + (i % 2) as u16, 64, TcpKind::Syn, ISN + i, 0, b"")).collect();
    let mut singles = Vec::new();
    for f in &frames {
        let mut f = f.clone();
        singles.push((run(&mut one, &mut f, Side::Inside, T0), f));
    }
    let mut fs = frames.clone();
    let mut verdicts = vec![Verdict::Held; fs.len()];
    batched.process_batch(&mut fs, Side::Inside, T0, &mut verdicts);
    assert_eq!(verdicts.into_iter().zip(fs).collect::<Vec<_>>(), singles);
    assert_eq!(tick(&mut one, T0, T0 + 3 * SEC), tick(&mut batched, T0, T0 + 3 * SEC));
    assert_eq!(one.stats().syn_accel.unwrap().resets, 8);
}

/// With HOST_ID inserting before it, a SYN lent in a buffer with room grows
/// where it lies within the run of functions, and the accelerator after
/// HOST_ID sees it grown: its copies are the SYN as it left, options and
/// all (seed 003 section 4.3.3, seed 000 section 7).
#[test]
fn copies_of_a_syn_grown_where_it_lies_carry_its_host_id_options() {
    use natrix_engine::host_id::{HostIdConfig, Kinds, Mode, Origin, WingData};
    use natrix_engine::InBuffer;
    let h = HostIdConfig { mode: Mode::Syn, wing: Some(WingData::Ipv4Low16), boucadair: Some(Origin::PortIpv4), lifetime: 0, enabled: false, kinds: Kinds::DEFAULT, rules: vec![] };
    let mut e = defaults(EngineConfig { host_id: Some(h), ..config() });
    let first = syn(5060, ISN);
    let mut buffer = first.clone();
    buffer.resize(first.len() + 64, 0xaa);
    let mut lent = [InBuffer::new(&mut buffer, 0, first.len())];
    let mut verdicts = [Verdict::Held];
    e.process_batch(&mut lent, Side::Inside, T0, &mut verdicts);
    assert_eq!(verdicts[0], Verdict::Forward(Side::Outside));
    let (start, len) = (lent[0].start(), lent[0].len());
    let left = buffer[start..start + len].to_vec();
    let d = must_decode(&left);
    assert_eq!(d.tcp().options.as_slice()[..2], [Kinds::DEFAULT.wing, 4], "WING went in where the SYN lay");
    let copies: Vec<_> = tick(&mut e, T0, T0 + 1_999 * MS).into_iter().filter(|o| o.0 == Side::Outside).collect();
    assert_eq!(copies.len(), 3);
    for c in &copies {
        assert_eq!(c.2, left, "a copy is the SYN as natrix forwarded it, HOST_ID options included");
    }
}

#[test]
fn router_mode_accelerates_untranslated() {
    let cfg = EngineConfig { translate: false, ..config() };
    let mut e = defaults(cfg);
    let mut first = syn(5060, ISN);
    assert_eq!(run(&mut e, &mut first, Side::Inside, T0), Verdict::Forward(Side::Outside));
    assert_eq!(must_decode(&first).src(), SUB, "not translated");
    let out = tick(&mut e, T0, T0 + 3 * SEC);
    assert_eq!(out.iter().filter(|o| o.0 == Side::Outside && o.2 == first).count(), 3);
    assert_eq!(out.iter().filter(|o| o.0 == Side::Inside).count(), 1);
}

#[test]
fn with_rtt_the_interval_is_one_and_a_half_learned_handshakes() {
    let mut e = accelerated(config(), Interval::Learned, Deadline::AttemptsTimesInterval);
    // A first connection answered in 100 ms, before any copy: learned.
    let mut first = syn(5060, ISN);
    run(&mut e, &mut first, Side::Inside, T0);
    let o = must_decode(&first);
    let mut answer = tcp_frame(Side::Outside, SERVER, 5060, o.src(), o.tcp().source_port, 64, TcpKind::SynAck, 1, ISN + 1, b"");
    assert_eq!(run(&mut e, &mut answer, Side::Outside, T0 + 100 * MS), Verdict::Forward(Side::Inside));
    let learned = e.stats().syn_accel.unwrap().learned;
    assert_eq!((learned.len(), learned[0].destination, learned[0].handshake_ns), (1, u32_of(SERVER), 100 * MS));
    // The next attempt: copies every 150 ms, the reset at 4 x 150 ms.
    let t1 = T0 + SEC;
    let mut next = tcp_frame(Side::Inside, SUB, 40001, SERVER, 5060, 64, TcpKind::Syn, 99, 0, b"");
    run(&mut e, &mut next, Side::Inside, t1);
    let out = tick(&mut e, t1, t1 + SEC);
    let times: Vec<u64> = out.iter().map(|o| o.1 - t1).collect();
    assert_eq!(times, [150 * MS, 300 * MS, 450 * MS, 600 * MS]);
}

#[test]
fn the_end_of_a_run_plays_out_pending_attempts() {
    let mut e = defaults(config());
    let mut first = syn(5060, ISN);
    run(&mut e, &mut first, Side::Inside, T0);
    e.finish();
    let out = outputs(&mut e);
    let times: Vec<(Side, u64)> = out.iter().map(|o| (o.0, o.1 - T0)).collect();
    assert_eq!(times, [(Side::Outside, 500 * MS), (Side::Outside, 1_000 * MS), (Side::Outside, 1_500 * MS), (Side::Inside, 2_000 * MS)]);
}

#[test]
fn a_reload_sets_the_interval_and_destinations_for_the_next_attempt_and_refuses_turning_it_off() {
    let mut cfg = config();
    let mut e = defaults(cfg.clone());
    let mut a = e.config().syn_accel.clone().unwrap();
    a.interval = Interval::Fixed { ns: 200 * MS };
    a.destinations[0].ports = (5062, 5062);
    cfg.syn_accel = Some(a);
    e.reconfigure(cfg.clone(), |_| {}).expect("the SYN accelerator's settings apply live");
    // 5060 is no longer accelerated; 5062 is, at the new interval.
    let mut old_port = syn(5060, ISN);
    assert_eq!(run(&mut e, &mut old_port, Side::Inside, T0), Verdict::Forward(Side::Outside));
    assert!(tick(&mut e, T0, T0 + SEC).iter().all(|o| o.0 != Side::Outside), "5060 left the destinations: no copies");
    let mut new_port = tcp_frame(Side::Inside, SUB, 40001, SERVER, 5062, 64, TcpKind::Syn, ISN, 0, b"");
    let t1 = T0 + 2 * SEC;
    assert_eq!(run(&mut e, &mut new_port, Side::Inside, t1), Verdict::Forward(Side::Outside));
    let copies: Vec<u64> = tick(&mut e, t1, t1 + 700 * MS).iter().filter(|o| o.0 == Side::Outside).map(|o| o.1).collect();
    assert_eq!(copies, [t1 + 200 * MS, t1 + 400 * MS, t1 + 600 * MS]);
    cfg.syn_accel = None;
    let err = e.reconfigure(cfg, |_| {}).unwrap_err().to_string();
    assert!(err.contains("syn_accel") && err.contains("restart"), "{err}");
}

#[test]
fn an_attempt_under_way_keeps_its_count_of_syns_across_a_reload() {
    let mut cfg = config();
    let mut e = defaults(cfg.clone());
    let mut first = syn(5060, ISN);
    assert_eq!(run(&mut e, &mut first, Side::Inside, T0), Verdict::Forward(Side::Outside));
    let mut a = e.config().syn_accel.clone().unwrap();
    a.attempts = 2;
    cfg.syn_accel = Some(a);
    e.reconfigure(cfg, |_| {}).expect("applies live");
    let mut second = tcp_frame(Side::Inside, SUB, 40001, SERVER, 5061, 64, TcpKind::Syn, ISN, 0, b"");
    assert_eq!(run(&mut e, &mut second, Side::Inside, T0 + 100 * MS), Verdict::Forward(Side::Outside));
    let copies = tick(&mut e, T0, T0 + 1_900 * MS);
    let of = |port: u16| copies.iter().filter(|o| o.0 == Side::Outside && must_decode(&o.2).tcp().destination_port == port).count();
    assert_eq!((of(5060), of(5061)), (3, 1), "4 SYNs in all for the attempt begun before the reload, 2 for the one after");
}

/// The reset's checksum with a sum that carries out of 32 bits (this
/// caller and ISN): etherparse verifies it, and a debug build does not
/// panic on the addition.
#[test]
fn a_reset_whose_checksum_sum_carries_is_right() {
    let isn = 0x9C26_FFFF;
    let mut e = defaults(config());
    assert_eq!(run(&mut e, &mut syn(5060, isn), Side::Inside, T0), Verdict::Forward(Side::Outside));
    let out = tick(&mut e, T0, T0 + 3 * SEC);
    let resets: Vec<_> = out.iter().filter(|o| o.0 == Side::Inside).collect();
    assert_eq!(resets.len(), 1);
    assert_eq!(must_decode(&resets[0].2).tcp().acknowledgment_number, isn.wrapping_add(1), "decoded with its checksum verified");
}

/// A SYN with data (TCP Fast Open) takes sequence numbers past its own: a
/// SYN-ACK acknowledging the SYN alone (a server that refused the cookie)
/// or the data too ends tracking, as its caller accepts either (RFC 9293
/// section 3.10.7.3); one acknowledging past them (another attempt's) does
/// not. The reset acknowledges the SYN (CONTRACTS.md: ISN + 1), which the
/// caller accepts for the same reason.
#[test]
fn a_syn_with_data_is_acknowledged_by_the_syn_or_its_data() {
    let data = b"GET / HTTP/1.0\r\n";
    let end = ISN + 1 + data.len() as u32;
    for (ack, ends) in [(ISN + 1, true), (end, true), (end + 1, false), (ISN, false)] {
        let mut e = defaults(config());
        let mut first = tcp_frame(Side::Inside, SUB, 40000, SERVER, 5060, 64, TcpKind::Syn, ISN, 0, data);
        assert_eq!(run(&mut e, &mut first, Side::Inside, T0), Verdict::Forward(Side::Outside));
        let out = must_decode(&first);
        let mut answer = tcp_frame(Side::Outside, SERVER, 5060, out.src(), out.tcp().source_port, 64, TcpKind::SynAck, 77, ack, b"");
        assert_eq!(run(&mut e, &mut answer, Side::Outside, T0 + 100 * MS), Verdict::Forward(Side::Inside), "the answer passes either way");
        let sent = tick(&mut e, T0 + 100 * MS, T0 + 3 * SEC);
        let resets: Vec<_> = sent.iter().filter(|o| o.0 == Side::Inside).map(|o| must_decode(&o.2).tcp().acknowledgment_number).collect();
        if ends {
            assert!(sent.is_empty(), "ack {ack}: the attempt ended, nothing more: {sent:?}");
        } else {
            assert_eq!(resets, [ISN + 1], "ack {ack} is no answer: the reset still comes");
            assert_eq!(sent.len(), 4, "3 copies and the reset");
        }
    }
}
