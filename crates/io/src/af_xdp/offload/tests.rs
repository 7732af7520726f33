//! The fast path run by the kernel (BPF_PROG_TEST_RUN) on frames built
//! here, its output checked against checksums computed from scratch
//! (RFC 1071 over the whole header), not by the incremental rule the
//! program uses. Root only: they skip otherwise, saying why.

use super::super::bpf::{self, Asm};
use super::super::program::redirect_to_sockets;
use super::*;

const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;
const HOST: [u8; 4] = [10, 0, 0, 2];
const REMOTE: [u8; 4] = [198, 51, 100, 7];
const PUBLIC: [u8; 4] = [192, 0, 2, 1];
const NAT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const OUT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 3];
const GATEWAY_MAC: [u8; 6] = [2, 0, 0, 0, 0, 4];
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

/// RFC 1071: the one's complement of the one's complement sum.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ip_checksum_ok(frame: &[u8]) -> bool {
    checksum(&frame[14..34]) == 0
}

/// The transport checksum over the pseudo-header, as a receiver checks it.
fn l4_checksum_ok(frame: &[u8]) -> bool {
    let total = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    let segment = &frame[34..14 + total];
    let mut pseudo = frame[26..34].to_vec();
    pseudo.extend_from_slice(&[0, frame[23]]);
    pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(segment);
    checksum(&pseudo) == 0
}

/// The frame with its transport checksum as a sender's offload leaves it:
/// the pseudo-header's folded sum, not complemented.
fn left_partial(mut frame: Vec<u8>) -> Vec<u8> {
    let total = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    let mut pseudo = frame[26..34].to_vec();
    pseudo.extend_from_slice(&[0, frame[23]]);
    pseudo.extend_from_slice(&((total - 20) as u16).to_be_bytes());
    let at = if frame[23] == TCP { 50 } else { 40 };
    frame[at..at + 2].copy_from_slice(&(!checksum(&pseudo)).to_be_bytes());
    frame
}

struct Packet {
    proto: u8,
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    ttl: u8,
    flags: u8,
    payload: Vec<u8>,
    macs: ([u8; 6], [u8; 6]),
}

impl Packet {
    fn tcp(flags: u8) -> Packet {
        Packet { proto: TCP, src: HOST, dst: REMOTE, sport: 40000, dport: 443, ttl: 64, flags, payload: b"natrix fast path payload".to_vec(), macs: (NAT_MAC, HOST_MAC) }
    }

    fn udp() -> Packet {
        Packet { proto: UDP, flags: 0, dport: 53, ..Packet::tcp(0) }
    }

    /// The frame with every checksum computed from scratch.
    fn frame(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&self.macs.0);
        f.extend_from_slice(&self.macs.1);
        f.extend_from_slice(&[0x08, 0x00]);
        let l4_len = if self.proto == TCP { 20 } else { 8 } + self.payload.len();
        let total = (20 + l4_len) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0x12, 0x34, 0x40, 0, self.ttl, self.proto, 0, 0]);
        f.extend_from_slice(&self.src);
        f.extend_from_slice(&self.dst);
        let ip = checksum(&f[14..34]);
        f[24..26].copy_from_slice(&ip.to_be_bytes());
        f.extend_from_slice(&self.sport.to_be_bytes());
        f.extend_from_slice(&self.dport.to_be_bytes());
        if self.proto == TCP {
            f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2, 0x50, self.flags, 0xff, 0xff, 0, 0, 0, 0]);
        } else {
            f.extend_from_slice(&(l4_len as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        f.extend_from_slice(&self.payload);
        let at = if self.proto == TCP { 50 } else { 40 };
        let mut pseudo = f[26..34].to_vec();
        pseudo.extend_from_slice(&[0, self.proto]);
        pseudo.extend_from_slice(&(l4_len as u16).to_be_bytes());
        pseudo.extend_from_slice(&f[34..]);
        let mut l4 = checksum(&pseudo);
        if self.proto == UDP && l4 == 0 {
            l4 = 0xffff;
        }
        f[at..at + 2].copy_from_slice(&l4.to_be_bytes());
        f
    }

    /// What the NAT makes of it going out: the source the public endpoint,
    /// the TTL one less, the Ethernet addresses those of the egress.
    fn translated(&self) -> Packet {
        Packet { src: PUBLIC, sport: 1024 + self.sport % 1000, ttl: self.ttl - 1, macs: (GATEWAY_MAC, OUT_MAC), payload: self.payload.clone(), ..*self }
    }
}

impl Clone for Packet {
    fn clone(&self) -> Packet {
        Packet { payload: self.payload.clone(), ..*self }
    }
}

/// The loopback device's index: BPF_PROG_TEST_RUN runs XDP as if the
/// frame came in on it.
fn test_ifindex() -> u32 {
    // SAFETY: a NUL-terminated name.
    unsafe { libc::if_nametoindex(c"lo".as_ptr()) }
}

const EGRESS: u32 = 7;

struct Fixture {
    offload: Offload,
    program: std::os::fd::OwnedFd,
    _xsks: std::os::fd::OwnedFd,
}

impl Fixture {
    fn new() -> Option<Fixture> {
        Fixture::with(|| Offload::new(64))
    }

    /// A fixture around the table `make` creates, as root only (creating
    /// BPF maps needs it too).
    fn with(make: impl FnOnce() -> io::Result<Offload>) -> Option<Fixture> {
        if !nix_is_root() {
            eprintln!("skipped: loading XDP programs needs root");
            return None;
        }
        let offload = make().expect("the flow table is created");
        let xsks = bpf::map_create(bpf::BPF_MAP_TYPE_XSKMAP, 4, 4, 1, 0).expect("an XSKMAP");
        let mut asm = Asm::default();
        offload.fast_path(&mut asm);
        redirect_to_sockets(&mut asm, xsks.as_raw_fd());
        let program = bpf::load_xdp(&asm.finish()).expect("the verifier takes the fast path");
        Some(Fixture { offload, program, _xsks: xsks })
    }

    /// The slot flow `key` has.
    fn slot_of(&self, key: &FlowKey) -> u32 {
        self.offload.slot_table(key).by_key[key]
    }

    /// Learns the flow from `p` and what the NAT made of it, as a worker does.
    fn learn(&self, p: &Packet, max_len: u16) {
        let before = head(&p.frame()).unwrap();
        let after = p.translated().frame();
        let (key, action) = learn(&before, test_ifindex(), &after, Egress { ifindex: EGRESS, counter: 1, max_len }).expect("a plain rewrite is learnt");
        // The worker's neighbour table gives these; here, the translation's.
        let eth = after[..12].try_into().unwrap();
        self.offload.install(&key, &action.with_ethernet(eth)).unwrap();
    }

    fn run(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        let mut f = frame.to_vec();
        let action = bpf::test_run(&self.program, &mut f).expect("the test run runs");
        (action, f)
    }
}

fn nix_is_root() -> bool {
    // SAFETY: no arguments, no failure.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_frame_of_a_learnt_tcp_flow_leaves_as_the_engine_would_translate_it() {
    let Some(fx) = Fixture::new() else { return };
    let first = Packet::tcp(ACK);
    fx.learn(&first, 1500);
    // A later segment: other payload, TTL, flags; same flow.
    let later = Packet { ttl: 37, flags: ACK | PSH, payload: b"a later segment, longer than the first one was".to_vec(), ..first };
    let (action, out) = fx.run(&later.frame());
    assert_eq!(action, XDP_REDIRECT);
    assert_eq!(out, later.translated().frame(), "the rewrite differs from the translation");
    assert!(ip_checksum_ok(&out) && l4_checksum_ok(&out));
    assert_eq!(fx.offload.forwarded(1), (1, out.len() as u64));
}

#[test]
fn a_frame_of_a_learnt_udp_flow_keeps_a_missing_checksum_missing() {
    let Some(fx) = Fixture::new() else { return };
    let first = Packet::udp();
    fx.learn(&first, 1500);
    let (action, out) = fx.run(&first.frame());
    assert_eq!(action, XDP_REDIRECT);
    assert_eq!(out, first.translated().frame());
    assert!(l4_checksum_ok(&out));
    let mut unchecked = first.frame();
    unchecked[40..42].copy_from_slice(&[0, 0]);
    let (action, out) = fx.run(&unchecked);
    assert_eq!(action, XDP_REDIRECT);
    assert_eq!(out[40..42], [0, 0], "RFC 768: no checksum stays no checksum");
    assert!(ip_checksum_ok(&out));
}

#[test]
fn a_udp_checksum_that_comes_out_zero_is_sent_as_all_ones() {
    let Some(fx) = Fixture::new() else { return };
    let mut first = Packet::udp();
    first.payload.extend_from_slice(&[0, 0]);
    // A payload word equal to the translated checksum brings it to 0.
    let sum = first.translated().frame()[40..42].to_vec();
    let n = first.payload.len();
    first.payload[n - 2..].copy_from_slice(&sum);
    let expected = first.translated().frame();
    assert_eq!(expected[40..42], [0xff, 0xff], "the case under test: a computed 0 (RFC 768)");
    fx.learn(&first, 1500);
    let (action, out) = fx.run(&first.frame());
    assert_eq!(action, XDP_REDIRECT);
    assert_eq!(out, expected);
    assert!(l4_checksum_ok(&out));
}

#[test]
fn checksums_stay_right_across_many_payloads_and_ttls() {
    let Some(fx) = Fixture::new() else { return };
    let first = Packet::tcp(ACK);
    fx.learn(&first, 1500);
    for i in 0..300u32 {
        let payload: Vec<u8> = (0..(i % 97) as usize).map(|b| (b as u32 * 31 + i * 7) as u8).collect();
        let p = Packet { ttl: 2 + (i % 250) as u8, payload, ..first.clone() };
        let (action, out) = fx.run(&p.frame());
        assert_eq!(action, XDP_REDIRECT, "frame {i}");
        assert!(ip_checksum_ok(&out) && l4_checksum_ok(&out), "frame {i}: checksums");
        assert_eq!(out, p.translated().frame(), "frame {i}");
    }
}

#[test]
fn frames_the_engine_must_see_are_passed_on_untouched() {
    let Some(fx) = Fixture::new() else { return };
    let flow = Packet::tcp(ACK);
    fx.learn(&flow, 100);
    let frame = |p: &Packet| p.frame();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("SYN", frame(&Packet::tcp(0x02 | ACK))),
        ("FIN", frame(&Packet::tcp(0x01 | ACK))),
        ("RST", frame(&Packet::tcp(0x04))),
        ("TTL 1", frame(&Packet { ttl: 1, ..flow.clone() })),
        ("another flow", frame(&Packet { sport: 40001, ..flow.clone() })),
        ("past the egress MTU", frame(&Packet { payload: vec![7; 100], ..flow.clone() })),
        ("UDP of a TCP flow's ports", frame(&Packet { proto: UDP, ..flow.clone() })),
    ];
    let mut bad_sum = flow.frame();
    bad_sum[25] ^= 1;
    cases.push(("bad header checksum", bad_sum));
    let mut fragment = flow.frame();
    fragment[20] = 0x20;
    fragment[24..26].copy_from_slice(&[0, 0]);
    let sum = checksum(&fragment[14..34]);
    fragment[24..26].copy_from_slice(&sum.to_be_bytes());
    cases.push(("fragment", fragment));
    let mut short = flow.frame();
    short.truncate(54);
    cases.push(("datagram longer than the frame", short));
    let mut tagged = flow.frame();
    tagged[12..14].copy_from_slice(&[0x81, 0x00]);
    cases.push(("VLAN tag", tagged));
    for byte in [1, 5] {
        let mut elsewhere = flow.frame();
        elsewhere[byte] ^= 0x10;
        cases.push(("addressed to another host", elsewhere));
    }
    // The header checksum right over the first 20 bytes, as the program
    // sums them: only the header length tells this frame apart.
    let mut options = flow.frame();
    options[14] = 0x46;
    options[24..26].copy_from_slice(&[0, 0]);
    let sum = checksum(&options[14..34]);
    options[24..26].copy_from_slice(&sum.to_be_bytes());
    cases.push(("IP options", options));
    let mut short_offset = flow.frame();
    short_offset[46] = 0x40;
    cases.push(("TCP data offset below 5", short_offset));
    let mut long_offset = flow.frame();
    long_offset[46] = 0xf0;
    cases.push(("TCP header past the datagram", long_offset));
    let udp = Packet::udp();
    fx.learn(&udp, 100);
    let mut short_udp = udp.frame();
    short_udp[38..40].copy_from_slice(&4u16.to_be_bytes());
    cases.push(("UDP length below 8", short_udp));
    let mut long_udp = udp.frame();
    long_udp[38..40].copy_from_slice(&500u16.to_be_bytes());
    cases.push(("UDP length past the datagram", long_udp));
    cases.push(("TCP checksum left partial", left_partial(flow.frame())));
    cases.push(("UDP checksum left partial", left_partial(udp.frame())));
    for (what, f) in cases {
        let (action, out) = fx.run(&f);
        assert_eq!(action, XDP_PASS, "{what}: taken by the fast path");
        assert_eq!(out, f, "{what}: changed");
    }
    assert_eq!((fx.offload.forwarded(0), fx.offload.forwarded(1)), ((0, 0), (0, 0)));
}

#[test]
fn a_flow_counts_the_frames_forwarded_until_it_is_removed() {
    let Some(fx) = Fixture::new() else { return };
    let flow = Packet::tcp(ACK);
    fx.learn(&flow, 1500);
    let key = flow_key(&flow.frame(), test_ifindex()).unwrap();
    assert_eq!(fx.offload.frames(&key), Some(0));
    for _ in 0..3 {
        assert_eq!(fx.run(&flow.frame()).0, XDP_REDIRECT);
    }
    assert_eq!(fx.run(&Packet::tcp(0x01 | ACK).frame()).0, XDP_PASS, "FIN");
    assert_eq!(fx.offload.frames(&key), Some(3), "the FIN passed on is not counted");
    fx.offload.remove(&key);
    assert_eq!(fx.offload.frames(&key), None);
    assert_eq!(fx.run(&flow.frame()).0, XDP_PASS, "removed: to the engine");
}

#[test]
fn fragments_have_no_flow() {
    let mut first = Packet::udp().frame();
    first[20] = 0x20; // more fragments, offset 0: the first fragment
    assert_eq!(flow_key(&first, 1), None);
    let before = head(&first).unwrap();
    assert!(learn(&before, 1, &Packet::udp().translated().frame(), Egress { ifindex: 2, counter: 0, max_len: 1500 }).is_none());
}

/// The answer to a translated frame, as it arrives on the egress, has the
/// key `FlowKey::reverse` names (so a FIN or RST hands both directions back).
#[test]
fn the_reverse_key_is_that_of_the_answer_to_the_translated_frame() {
    for p in [Packet::tcp(ACK), Packet::udp()] {
        let before = head(&p.frame()).unwrap();
        let out = p.translated();
        let (key, action) = learn(&before, 3, &out.frame(), Egress { ifindex: EGRESS, counter: 1, max_len: 1500 }).expect("learnt");
        let answer = Packet { src: out.dst, dst: out.src, sport: out.dport, dport: out.sport, ..out.clone() };
        assert_eq!(Some(key.reverse(&action)), flow_key(&answer.frame(), EGRESS));
        assert_ne!(key.reverse(&action), key);
    }
}

#[test]
fn only_the_plain_rewrite_is_learnt() {
    const E: Egress = Egress { ifindex: 2, counter: 0, max_len: 1500 };
    let p = Packet::tcp(ACK);
    let before = head(&p.frame()).unwrap();
    let after = p.translated().frame();
    assert!(learn(&before, 1, &after, E).is_some());
    let mut window = after.clone();
    window[48] ^= 1;
    assert!(learn(&before, 1, &window, E).is_none(), "a changed TCP window is not the plain rewrite");
    let mut ttl = after.clone();
    ttl[22] -= 1;
    assert!(learn(&before, 1, &ttl, E).is_none(), "TTL down by two");
    let syn = Packet::tcp(0x02);
    assert!(learn(&head(&syn.frame()).unwrap(), 1, &syn.translated().frame(), E).is_none(), "SYN");
    assert!(learn(&before, 1, &after[..40], E).is_none(), "short result");
}

#[test]
fn a_table_entry_that_leads_to_another_flows_slot_sends_the_frame_to_the_engine_untouched() {
    let Some(fx) = Fixture::new() else { return };
    let (a, b) = (Packet::tcp(ACK), Packet { sport: 40001, ..Packet::tcp(ACK) });
    fx.learn(&a, 1500);
    fx.learn(&b, 1500);
    let (key_a, key_b) = (flow_key(&a.frame(), test_ifindex()).unwrap(), flow_key(&b.frame(), test_ifindex()).unwrap());
    assert_eq!(fx.run(&a.frame()).0, XDP_REDIRECT);
    // What a program sees when the kernel hands a's deleted entry to b's
    // insertion while it reads: b's slot under a's key.
    bpf::map_update(&fx.offload.flows, &key_a, &fx.slot_of(&key_b)).unwrap();
    let (verdict, frame) = fx.run(&a.frame());
    assert_eq!((verdict, frame), (XDP_PASS, a.frame()), "a's frame must not leave with b's rewrite");
    assert_eq!(fx.offload.frames(&key_b), Some(0), "nor count as b's");
}

#[test]
fn a_slot_a_flow_gave_up_rests_before_another_flow_gets_it() {
    let Some(fx) = Fixture::with(|| Offload::with_rest(64, Duration::from_secs(3600))) else { return };
    let (a, b) = (Packet::tcp(ACK), Packet { sport: 40001, ..Packet::tcp(ACK) });
    let (key_a, key_b) = (flow_key(&a.frame(), test_ifindex()).unwrap(), flow_key(&b.frame(), test_ifindex()).unwrap());
    fx.learn(&a, 1500);
    let first = fx.slot_of(&key_a);
    fx.learn(&a, 1400);
    assert_ne!(fx.slot_of(&key_a), first, "a changed action is written to a fresh slot");
    fx.offload.remove(&key_a);
    fx.learn(&b, 1500);
    assert_ne!(fx.slot_of(&key_b), first);
    assert_eq!(fx.run(&b.frame()).0, XDP_REDIRECT);
    assert_eq!(fx.run(&a.frame()).0, XDP_PASS);

    // The rest is what keeps them apart: without it the slot comes back at once.
    let Some(fx) = Fixture::with(|| Offload::with_rest(64, Duration::ZERO)) else { return };
    fx.learn(&a, 1500);
    let first = fx.slot_of(&key_a);
    fx.offload.remove(&key_a);
    fx.learn(&b, 1500);
    assert_eq!(fx.slot_of(&key_b), first);
}

#[test]
fn with_every_slot_in_use_or_resting_a_flow_is_refused_as_with_a_full_table() {
    let Some(fx) = Fixture::with(|| Offload::with_rest(2, Duration::from_secs(3600))) else { return };
    let flows: Vec<Packet> = (0..3).map(|i| Packet { sport: 41000 + i, ..Packet::tcp(ACK) }).collect();
    let key = |p: &Packet| flow_key(&p.frame(), test_ifindex()).unwrap();
    let install = |p: &Packet| {
        let (k, action) = learn(&head(&p.frame()).unwrap(), test_ifindex(), &p.translated().frame(), Egress { ifindex: EGRESS, counter: 1, max_len: 1500 }).unwrap();
        fx.offload.install(&k, &action)
    };
    for round in 0..2 {
        install(&flows[0]).unwrap_or_else(|e| panic!("round {round}: {e}"));
        install(&flows[1]).unwrap_or_else(|e| panic!("round {round}: {e}"));
        fx.offload.remove(&key(&flows[0]));
        fx.offload.remove(&key(&flows[1]));
    }
    let refused = install(&flows[2]).expect_err("four slots resting");
    assert_eq!(refused.raw_os_error(), Some(libc::E2BIG));
    assert_eq!(fx.offload.frames(&key(&flows[2])), None);
}

#[test]
fn flows_spread_over_the_shards_and_no_two_share_a_slot() {
    let Some(fx) = Fixture::with(|| Offload::new(8192)) else { return };
    assert_eq!(fx.offload.slot_tables.len(), 16);
    let mut slots = std::collections::HashSet::new();
    for i in 0..2000u16 {
        let p = Packet { sport: 20000 + i, src: [10, 0, (i >> 8) as u8, i as u8], ..Packet::udp() };
        let (key, action) = learn(&head(&p.frame()).unwrap(), test_ifindex(), &p.translated().frame(), Egress { ifindex: EGRESS, counter: 1, max_len: 1500 }).unwrap();
        fx.offload.install(&key, &action).unwrap();
        assert!(slots.insert(fx.slot_of(&key)), "flow {i} got a slot in use");
    }
    for (shard, table) in fx.offload.slot_tables.iter().enumerate() {
        let n = table.lock().unwrap().by_key.len();
        assert!((60..=200).contains(&n), "shard {shard} holds {n} of 2000 flows");
    }
}
