//! HOST_ID through the engine (seed 000, CONTRACTS.md "HOST_ID TCP
//! options"), judged by etherparse: a SYN that grows frame by frame leaves
//! through the output queue in the original's place (verdict `Held`,
//! counted as forwarded), with every checksum and length right and the TTL
//! decremented once; in a batch of buffers with room it grows where it lies
//! into the same bytes (verdict `Forward`); established
//! traffic keeps the fast path's bytes; a policy drop is counted.

mod common;

use common::*;
use etherparse::{PacketBuilder, TcpOptionElement};
use natrix_engine::host_id::{Action, HostIdConfig, Kinds, Mode, Rule, RuleOption, WingData};
use natrix_engine::{DropReason, Engine, EngineConfig, Side, Verdict};

const SUB: [u8; 4] = [100, 64, 0, 10];
const SERVER: [u8; 4] = [198, 51, 100, 7];
const T0: u64 = 1_000 * SEC;
const ISN: u32 = 77;

fn host_id(mode: Mode, rules: Vec<Rule>) -> HostIdConfig {
    HostIdConfig { mode, wing: Some(WingData::Ipv4Low16), boucadair: None, lifetime: 0, enabled: false, kinds: Kinds::DEFAULT, rules }
}

fn with_host_id(mut cfg: EngineConfig, h: HostIdConfig) -> Engine {
    cfg.host_id = Some(h);
    engine(cfg)
}

/// A subscriber's SYN with an MSS option (4 bytes), as Linux would start it.
fn syn(sport: u16) -> Vec<u8> {
    let (ms, md) = macs(Side::Inside);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(SUB, SERVER, 64).tcp(sport, 80, ISN, 64240).syn().options(&[TcpOptionElement::MaximumSegmentSize(1460)]).unwrap();
    let mut v = Vec::new();
    b.write(&mut v, b"").unwrap();
    v
}

/// The TCP options area of a decoded frame's header.
fn options_of(frame: &[u8]) -> Vec<u8> {
    let d = must_decode(frame);
    d.tcp().options.as_slice().to_vec()
}

#[test]
fn a_grown_syn_leaves_through_the_output_queue_counted_as_forwarded() {
    let mut e = with_host_id(config(), host_id(Mode::Syn, vec![]));
    let mut f = syn(40000);
    assert_eq!(run(&mut e, &mut f, Side::Inside, T0), Verdict::Held);
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1);
    let (side, at, frame) = &out[0];
    assert_eq!((*side, *at), (Side::Outside, T0));
    let d = must_decode(frame);
    assert_eq!(d.ip.time_to_live, 63, "the router's TTL, once");
    assert_eq!(usize::from(d.ip.total_len), 20 + 28);
    assert!(in_pool(e.config(), d.src()));
    assert_eq!(options_of(frame), [2, 4, 5, 180, 200, 4, 0, 10], "MSS kept, WING = the subscriber's low 16 bits");
    let st = e.stats();
    assert_eq!((st.forwarded[Side::Outside as usize], st.held, st.generated), (1, 0, [0, 0]));
    assert_eq!(st.host_id.unwrap().injected, 1);
}

/// A batch's frames in buffers with room (vectors) grow where they lie and
/// leave as forwarded; in slices without room they leave as copies, as
/// `process` sends them. Either way the same bytes and counters.
#[test]
fn the_batch_path_grows_syns_where_they_lie_into_the_frames_the_frame_path_copies() {
    let mut one = with_host_id(config(), host_id(Mode::Syn, vec![]));
    let frames: Vec<Vec<u8>> = (0..6u16).map(|i| syn(41000 + i)).collect();
    let mut singles = Vec::new();
    for f in &frames {
        let mut f = f.clone();
        singles.push(run(&mut one, &mut f, Side::Inside, T0));
    }
    assert!(singles.iter().all(|v| *v == Verdict::Held));
    let copied = outputs(&mut one);
    assert!(copied.iter().all(|(side, at, _)| (*side, *at) == (Side::Outside, T0)));
    let copied: Vec<Vec<u8>> = copied.into_iter().map(|(_, _, f)| f).collect();

    let mut in_place = with_host_id(config(), host_id(Mode::Syn, vec![]));
    let mut fs = frames.clone();
    let mut verdicts = vec![Verdict::Held; fs.len()];
    in_place.process_batch(&mut fs, Side::Inside, T0, &mut verdicts);
    assert!(verdicts.iter().all(|v| *v == Verdict::Forward(Side::Outside)));
    assert!(outputs(&mut in_place).is_empty());
    assert_eq!(fs, copied);

    let mut no_room = with_host_id(config(), host_id(Mode::Syn, vec![]));
    let mut fs = frames.clone();
    let mut slices: Vec<&mut [u8]> = fs.iter_mut().map(|f| f.as_mut_slice()).collect();
    let mut verdicts = vec![Verdict::Forward(Side::Inside); slices.len()];
    no_room.process_batch(&mut slices, Side::Inside, T0, &mut verdicts);
    assert_eq!(verdicts, singles);
    let queued: Vec<Vec<u8>> = outputs(&mut no_room).into_iter().map(|(_, _, f)| f).collect();
    assert_eq!(queued, copied);

    for e in [&one, &in_place, &no_room] {
        let st = e.stats();
        assert_eq!((st.forwarded[Side::Outside as usize], st.held), (6, 0));
        assert_eq!(st.host_id.unwrap().injected, 6);
    }
}

/// A subscriber's segment after its SYN, with data (no option for HOST_ID).
fn data_after_syn(sport: u16) -> Vec<u8> {
    let (ms, md) = macs(Side::Inside);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(SUB, SERVER, 64).tcp(sport, 80, ISN + 1, 64240).ack(1);
    let mut v = Vec::new();
    b.write(&mut v, b"GET / HTTP/1.0\r\n\r\n").unwrap();
    v
}

/// A SYN grown into a copy waits in the output queue, which leaves after
/// the frames forwarded where they lie: the segment behind it in the same
/// batch must not overtake it, so it is queued behind it too.
#[test]
fn a_segment_batched_behind_a_syn_grown_into_a_copy_leaves_after_it() {
    let mut e = with_host_id(config(), host_id(Mode::Syn, vec![]));
    let mut fs = [syn(42000), data_after_syn(42000)];
    let mut slices: Vec<&mut [u8]> = fs.iter_mut().map(|f| f.as_mut_slice()).collect();
    let mut verdicts = [Verdict::Forward(Side::Inside); 2];
    e.process_batch(&mut slices, Side::Inside, T0, &mut verdicts);
    assert_eq!(verdicts, [Verdict::Held; 2], "nothing leaves from where it lies");
    let out = outputs(&mut e);
    assert_eq!(out.len(), 2);
    let (first, second) = (must_decode(&out[0].2), must_decode(&out[1].2));
    assert!(first.tcp().syn && !first.tcp().options.as_slice().is_empty(), "the grown SYN first");
    assert!(!second.tcp().syn && second.payload.len() == 18, "then the data segment");
    assert_eq!(second.tcp().source_port, first.tcp().source_port, "one flow");
    assert_eq!(e.stats().forwarded[Side::Outside as usize], 2);
}

#[test]
fn established_traffic_keeps_its_bytes_in_syn_mode() {
    let mut plain = engine(config());
    let mut hid = with_host_id(config(), host_id(Mode::Syn, vec![]));
    let mut a = syn(40000);
    run(&mut plain, &mut a, Side::Inside, T0);
    let mut b = syn(40000);
    run(&mut hid, &mut b, Side::Inside, T0);
    outputs(&mut hid);
    let data = tcp_frame(Side::Inside, SUB, 40000, SERVER, 80, 64, TcpKind::Ack, ISN + 1, 1, b"payload");
    let (mut x, mut y) = (data.clone(), data);
    assert_eq!(run(&mut plain, &mut x, Side::Inside, T0), run(&mut hid, &mut y, Side::Inside, T0));
    assert_eq!(x, y);
}

#[test]
fn a_policy_drop_in_router_mode_is_counted() {
    let rule = Rule { option: RuleOption::Wing, value: Some((10, 10)), action: Action::Drop };
    let mut cfg = EngineConfig { translate: false, ..EngineConfig::default() };
    cfg.pool.clear();
    let mut e = with_host_id(cfg, host_id(Mode::Off, vec![rule]));
    let (ms, md) = macs(Side::Outside);
    let b = PacketBuilder::ethernet2(ms, md).ipv4(SERVER, SUB, 64).tcp(5000, 80, 1, 1024).syn();
    let mut f = Vec::new();
    b.options_raw(&[200, 4, 0, 10]).unwrap().write(&mut f, b"").unwrap();
    assert_eq!(run(&mut e, &mut f, Side::Outside, T0), Verdict::Drop(DropReason::HostIdPolicy));
    assert!(outputs(&mut e).is_empty());
    assert_eq!(e.stats().host_id.unwrap().rule_matches, [1]);
}

#[test]
fn a_reload_changes_the_rules_from_the_next_segment_and_refuses_turning_host_id_off() {
    // Policy keys apply live (CONTRACTS, "SIGHUP"): a drop rule put in a
    // rule's place by a reload drops the next SYN that matches it; the
    // count of the rule at that place goes on.
    let wing_10 = |action| Rule { option: RuleOption::Wing, value: Some((10, 10)), action };
    let mut router = EngineConfig { translate: false, ..EngineConfig::default() };
    router.pool.clear();
    let mut e = with_host_id(router.clone(), host_id(Mode::Off, vec![wing_10(Action::Log)]));
    let marked_syn = |sport: u16| {
        let (ms, md) = macs(Side::Outside);
        let mut f = Vec::new();
        PacketBuilder::ethernet2(ms, md).ipv4(SERVER, SUB, 64).tcp(sport, 80, 1, 1024).syn().options_raw(&[200, 4, 0, 10]).unwrap().write(&mut f, b"").unwrap();
        f
    };
    assert_eq!(run(&mut e, &mut marked_syn(5000), Side::Outside, T0), Verdict::Forward(Side::Inside));
    let dropping = EngineConfig { host_id: Some(host_id(Mode::Off, vec![wing_10(Action::Drop)])), ..router.clone() };
    e.reconfigure(dropping.clone(), |_| {}).expect("HOST_ID's rules apply live");
    assert_eq!(run(&mut e, &mut marked_syn(5001), Side::Outside, T0 + SEC), Verdict::Drop(DropReason::HostIdPolicy));
    assert_eq!(e.stats().host_id.unwrap().rule_matches, [2], "rule 0's count goes on");
    let off = EngineConfig { host_id: None, ..dropping };
    let err = e.reconfigure(off, |_| {}).unwrap_err().to_string();
    assert!(err.contains("host_id") && err.contains("restart"), "turning HOST_ID off needs a restart: {err}");
    assert_eq!(run(&mut e, &mut marked_syn(5002), Side::Outside, T0 + 2 * SEC), Verdict::Drop(DropReason::HostIdPolicy), "the refused reload changed nothing");
}

#[test]
fn a_reload_into_syn_mode_writes_host_id_into_the_next_syn() {
    let logging = vec![Rule { option: RuleOption::Wing, value: None, action: Action::Log }];
    let mut e = with_host_id(config(), host_id(Mode::Off, logging.clone()));
    let mut before = syn(6000);
    assert_eq!(run(&mut e, &mut before, Side::Inside, T0), Verdict::Forward(Side::Outside));
    assert_eq!(options_of(&before), [2, 4, 5, 180], "no HOST_ID_WING while HOST_ID only logs");
    let mut syn_mode = config();
    syn_mode.host_id = Some(host_id(Mode::Syn, logging));
    e.reconfigure(syn_mode, |_| {}).expect("HOST_ID's mode applies live");
    // Grown, it leaves through the output queue (as above).
    assert_eq!(run(&mut e, &mut syn(6001), Side::Inside, T0 + SEC), Verdict::Held);
    let out = outputs(&mut e);
    assert_eq!(out.len(), 1);
    assert_eq!(options_of(&out[0].2), [2, 4, 5, 180, 200, 4, 0, 10], "WING = the subscriber's low 16 bits");
}

/// A SYN with data (TCP Fast Open) as long as the outside link takes: its
/// HOST_ID option would make it too long for the link, where DF would have
/// it lost, so it leaves without one (counted `no_room`); a shorter one
/// gets it.
#[test]
fn a_syn_the_option_would_make_too_long_for_the_link_leaves_without_it() {
    let mut cfg = config();
    cfg.egress_mtu = [1500, 1400];
    let mut e = with_host_id(cfg, host_id(Mode::Syn, vec![]));
    let syn_with = |sport: u16, data: usize| {
        let (ms, md) = macs(Side::Inside);
        let b = PacketBuilder::ethernet2(ms, md).ipv4(SUB, SERVER, 64).tcp(sport, 80, ISN, 64240).syn().options(&[TcpOptionElement::MaximumSegmentSize(1460)]).unwrap();
        let mut v = Vec::new();
        b.write(&mut v, &vec![7u8; data]).unwrap();
        v[14 + 6] |= 0x40; // DF, as Linux sends it
        v[14 + 10..14 + 12].fill(0);
        let sum = etherparse::Ipv4HeaderSlice::from_slice(&v[14..]).unwrap().to_header().calc_header_checksum();
        v[14 + 10..14 + 12].copy_from_slice(&sum.to_be_bytes());
        v
    };
    // 20 + 24 + 1356 = 1400: the link's MTU exactly.
    let mut full = syn_with(42000, 1356);
    let v = run(&mut e, &mut full, Side::Inside, T0);
    let out = outputs(&mut e);
    let frame = if v == Verdict::Forward(Side::Outside) { full.clone() } else { out.into_iter().next().expect("the SYN leaves").2 };
    let d = must_decode(&frame);
    assert_eq!(usize::from(d.ip.total_len), 1400, "not grown past the link");
    assert_eq!(options_of(&frame), [2, 4, 5, 180], "no HOST_ID");
    assert_eq!(e.stats().host_id.unwrap().no_room, 1);
    let mut short = syn_with(42001, 1300);
    assert_eq!(run(&mut e, &mut short, Side::Inside, T0), Verdict::Held);
    let out = outputs(&mut e);
    let d = must_decode(&out[0].2);
    assert_eq!(usize::from(d.ip.total_len), 1300 + 20 + 28, "grown by the option");
    assert_eq!(e.stats().host_id.unwrap().injected, 1);
}
