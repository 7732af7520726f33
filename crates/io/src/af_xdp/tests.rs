//! Tests of the whole port over a veth pair (root only: they skip
//! otherwise, saying why).

use std::os::fd::FromRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use super::ports::{FILL_CHUNKS, SPARE_CHUNKS};
use super::*;
use crate::ethtool::driver;
use crate::frames::FrameId;
use crate::iface::Interface;

/// The local experimental ethertype: no kernel protocol answers it.
const TEST_ETHERTYPE: u16 = 0x88b5;
const PORT_IF: &str = "xsk0";
const PEER_IF: &str = "peer0";

#[test]
fn missing_interface_is_named_in_the_error() {
    let err = AfXdpPort::open("nx-no-such0").err().expect("no such interface").to_string();
    assert!(err.contains("nx-no-such0"), "{err}");
}

/// Frames cross in both directions, in rounds that together pass more
/// frames than the UMEM has of either kind, so every frame is recycled;
/// each round's burst needs several 32-frame kicks.
#[test]
fn frames_cross_a_veth_pair_both_ways() {
    const ROUNDS: u32 = 12;
    const BURST: u32 = 200;
    let Some(ns) = Netns::with_veth_pair("both") else {
        return;
    };
    ns.run(|| {
        let mut port = AfXdpPort::open(PORT_IF).expect("AF_XDP opens on veth");
        assert_eq!(port.backend(), "af_xdp");
        let peer = RawSocket::open(PEER_IF);
        let port_mac = Interface::lookup(PORT_IF).unwrap().mac;
        let peer_mac = Interface::lookup(PEER_IF).unwrap().mac;
        for round in 0..ROUNDS {
            let seqs = round * BURST..(round + 1) * BURST;
            let inbound: Vec<Vec<u8>> = seqs.clone().map(|seq| test_frame(port_mac, peer_mac, seq)).collect();
            for frame in &inbound {
                peer.send(frame);
            }
            assert!(receive_on_port(&mut port, inbound.len()) == inbound, "round {round}: frames into the port differ");

            let outbound: Vec<Vec<u8>> = seqs.map(|seq| test_frame(peer_mac, port_mac, seq)).collect();
            for frame in &outbound {
                assert!(port.send(frame), "round {round}: TX ring full");
            }
            port.flush().expect("flush");
            assert!(peer.receive(outbound.len()) == outbound, "round {round}: frames out of the port differ");
        }
    });
}

/// Overload both ways, more frames than the rings hold: what arrives is
/// intact and arrives once; every receive chunk is back with the kernel on
/// the fill ring and every transmit chunk back on the free list once the
/// kernel is done (no chunk leaked); the transmit ring refuses past its
/// size instead of overwriting; and the port still works afterwards.
#[test]
fn under_overload_no_chunk_leaks_and_no_frame_arrives_twice() {
    let Some(ns) = Netns::with_veth_pair("overload") else {
        return;
    };
    ns.run(|| {
        let mut port = AfXdpPort::open(PORT_IF).expect("AF_XDP opens on veth");
        let peer = RawSocket::open(PEER_IF);
        let port_mac = Interface::lookup(PORT_IF).unwrap().mac;
        let peer_mac = Interface::lookup(PEER_IF).unwrap().mac;

        // In: three rings' worth sent before the port reads anything.
        let sent = 3 * FILL_CHUNKS;
        for seq in 0..sent {
            peer.send(&test_frame(port_mac, peer_mac, seq));
        }
        let got = drain_port(&mut port);
        let dropped = port.kernel_dropped();
        assert!(!got.is_empty() && dropped > 0, "{} of {sent} frames in, {dropped} counted dropped: no overload?", got.len());
        // veth may drop a few before the socket sees them, never the
        // socket count a frame twice.
        assert!(got.len() as u64 + dropped <= u64::from(sent), "{} in and {dropped} dropped of {sent} sent", got.len());
        assert_each_intact_and_once(&got, port_mac, peer_mac);
        assert_eq!(port.ports.chunks_lent(), FILL_CHUNKS, "every receive chunk is back on the fill ring");

        // Out: the transmit ring takes TX_RING frames and refuses the next.
        let outbound: Vec<Vec<u8>> = (0..TX_RING).map(|seq| test_frame(peer_mac, port_mac, seq)).collect();
        for frame in &outbound {
            assert!(port.send(frame), "the TX ring holds {TX_RING} frames");
        }
        assert!(!port.send(&outbound[0]), "a full TX ring refuses");
        port.flush().expect("flush");
        let out = peer.receive(outbound.len());
        assert_each_intact_and_once(&out, peer_mac, port_mac);
        let deadline = Instant::now() + Duration::from_secs(5);
        while port.ports.chunks_not_lent() < SPARE_CHUNKS as usize && Instant::now() < deadline {
            port.flush().expect("flush");
        }
        assert_eq!(port.ports.chunks_not_lent(), SPARE_CHUNKS as usize, "every transmit chunk came back through the completion ring");

        // And the port still carries a round both ways.
        let again: Vec<Vec<u8>> = (0..64).map(|seq| test_frame(port_mac, peer_mac, sent + seq)).collect();
        for frame in &again {
            peer.send(frame);
        }
        assert!(receive_on_port(&mut port, again.len()) == again, "frames in after the overload");
    });
}

/// Every test frame the port has, until none comes for 200 ms.
fn drain_port(port: &mut AfXdpPort) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    loop {
        let mut pfd = libc::pollfd { fd: port.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 200) } <= 0 {
            return frames;
        }
        port.recv_batch(64, &mut |frame| {
            if frame.get(12..14) == Some(&TEST_ETHERTYPE.to_be_bytes()[..]) {
                frames.push(frame.to_vec());
            }
        })
        .expect("recv_batch");
    }
}

/// Each frame is the test frame its sequence number names, and no number
/// comes twice.
fn assert_each_intact_and_once(frames: &[Vec<u8>], dst: [u8; 6], src: [u8; 6]) {
    let mut seen = std::collections::HashSet::new();
    for f in frames {
        let seq = u32::from_be_bytes(f[14..18].try_into().unwrap());
        assert!(seen.insert(seq), "frame {seq} arrived twice");
        assert!(*f == test_frame(dst, src, seq), "frame {seq} differs from what was sent");
    }
}

/// Copy mode cannot deliver a frame past a chunk less the kernel's
/// headroom: an interface whose MTU allows one is refused as unsupported
/// (so `auto` falls back to AF_PACKET), naming the MTU; one byte less opens.
#[test]
fn an_mtu_past_a_chunk_is_refused_and_one_that_fits_opens() {
    let Some(ns) = Netns::with_veth_pair("mtu") else {
        return;
    };
    let fits = (MAX_RX_FRAME - ETHERNET_HEADER).to_string();
    let too_big = (MAX_RX_FRAME - ETHERNET_HEADER + 1).to_string();
    ns.ip(&["link", "set", PORT_IF, "mtu", &too_big]);
    ns.run(|| match AfXdpPort::open(PORT_IF) {
        Err(IoError::Unsupported { reason, .. }) => assert!(reason.contains(&format!("MTU {too_big}")), "{reason}"),
        Err(other) => panic!("expected a refusal as unsupported, got {other}"),
        Ok(_) => panic!("AF_XDP opened with MTU {too_big}"),
    });
    ns.ip(&["link", "set", PORT_IF, "mtu", &fits]);
    ns.run(|| {
        AfXdpPort::open(PORT_IF).expect("AF_XDP opens when the largest frame fits");
    });
}

#[test]
fn one_port_per_queue_and_drop_detaches_the_program() {
    let Some(ns) = Netns::with_veth_pair("drop") else {
        return;
    };
    ns.run(|| {
        let port = AfXdpPort::open(PORT_IF).expect("AF_XDP opens on veth");
        assert!(ns.ip(&["link", "show", PORT_IF]).contains("prog/xdp"));
        match AfXdpPort::open(PORT_IF) {
            Err(IoError::Unsupported { interface, .. }) => assert_eq!(interface, PORT_IF),
            other => panic!("a second socket on queue 0: {:?}", other.map(|_| ())),
        }
        drop(port);
        assert!(!ns.ip(&["link", "show", PORT_IF]).contains("prog/xdp"));
        AfXdpPort::open(PORT_IF).expect("reopens after drop");
    });
}

/// The single port (the tester's) serves one queue and says so.
#[test]
fn interfaces_with_several_receive_queues_are_refused() {
    let Some(ns) = Netns::with_veth_pair("queues") else {
        return;
    };
    ns.add_veth_pair(PORT2_IF, PEER2_IF, 2);
    ns.run(|| match AfXdpPort::open(PORT2_IF) {
        Err(IoError::Unsupported { reason, .. }) => {
            assert!(reason.contains("ethtool -L"), "{reason}")
        }
        other => panic!("two receive queues: {:?}", other.map(|_| ())),
    });
}

const PORT2_IF: &str = "xsk1";
const PEER2_IF: &str = "peer1";

/// The dataplane's ports: a frame received on one interface is changed
/// where it lies and leaves by the other without a copy, both ways, over
/// rounds that pass many more frames than the UMEM has chunks; every frame
/// arrives once and changed; afterwards every chunk is back with a fill
/// ring or on the free list (none leaked, none held). veth takes native
/// programs, so "auto" gives native mode.
#[test]
fn held_frames_leave_by_the_other_interface_changed_in_place_and_no_chunk_leaks() {
    forward_in_place_both_ways("forward", XdpAttach::Auto, XdpAttach::Native);
}

/// As above with the programs in generic mode (`xdp_mode = "generic"`),
/// where the kernel hands the program each frame's skb.
#[test]
fn in_generic_mode_held_frames_leave_changed_in_place_and_no_chunk_leaks() {
    forward_in_place_both_ways("generic", XdpAttach::Generic, XdpAttach::Generic);
}

fn forward_in_place_both_ways(tag: &str, attach: XdpAttach, mode: XdpAttach) {
    const ROUNDS: u32 = 8;
    const BURST: u32 = 1500;
    let Some(ns) = Netns::with_veth_pair(tag) else {
        return;
    };
    ns.add_veth_pair(PORT2_IF, PEER2_IF, 1);
    ns.run(|| {
        let mut ports = XdpPorts::open_per_queue(&[PORT_IF, PORT2_IF], 1, None, attach).expect("AF_XDP opens on both").remove(0);
        assert_eq!(ports.mode(), XdpMode::Copy, "veth has no zero-copy");
        assert_eq!(ports.program_modes(), [mode, mode], "both programs in {} mode", mode.name());
        assert_eq!(driver(PORT_IF).as_deref(), Some("veth"), "ethtool names veth's driver");
        let shown = ns.ip(&["-d", "link", "show", PORT_IF]);
        let word = if mode == XdpAttach::Generic { "xdpgeneric" } else { "xdp" };
        assert!(shown.split_whitespace().any(|w| w == word), "`ip -d link show {PORT_IF}` does not show `{word}`: {shown}");
        let peers = [RawSocket::open(PEER_IF), RawSocket::open(PEER2_IF)];
        let macs = [PORT_IF, PEER_IF, PORT2_IF, PEER2_IF].map(|i| Interface::lookup(i).unwrap().mac);
        for round in 0..ROUNDS {
            let (from, to) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
            let seqs = round * BURST..(round + 1) * BURST;
            for seq in seqs.clone() {
                peers[from].send(&test_frame(macs[2 * from], macs[2 * from + 1], seq));
            }
            let mut forwarded = 0;
            let deadline = Instant::now() + Duration::from_secs(5);
            while forwarded < BURST && Instant::now() < deadline {
                let mut held = Vec::new();
                ports.receive(from, 64, &mut |id, frame| {
                    let ours = frame.get(12..14) == Some(&TEST_ETHERTYPE.to_be_bytes()[..]);
                    if ours {
                        mark_forwarded(frame, macs[2 * to + 1], macs[2 * to]);
                        held.push(id);
                    }
                    ours
                });
                for id in held {
                    // SAFETY: receive handed the id over; transmitting gives it up.
                    assert!(unsafe { ports.transmit(to, id) }, "round {round}: TX ring full");
                    forwarded += 1;
                }
                ports.flush().expect("flush");
            }
            let want: Vec<Vec<u8>> = seqs
                .map(|seq| {
                    let mut f = test_frame(macs[2 * from], macs[2 * from + 1], seq);
                    mark_forwarded(&mut f, macs[2 * to + 1], macs[2 * to]);
                    f
                })
                .collect();
            assert!(peers[to].receive(want.len()) == want, "round {round}: forwarded frames differ from what was received and changed");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while ports.chunks_not_lent() < SPARE_CHUNKS as usize && Instant::now() < deadline {
            ports.flush().expect("flush");
        }
        let calls = ports.counters(0).transmit_calls + ports.counters(1).transmit_calls;
        let frames = u64::from(ROUNDS * BURST);
        assert!(calls > 0 && calls * 16 < frames, "{calls} system calls to transmit {frames} frames: not one per 32-frame kick");
        assert_eq!(ports.chunks_lent(), 2 * FILL_CHUNKS, "both fill rings are full again");
        assert_eq!(ports.chunks_not_lent(), SPARE_CHUNKS as usize, "every transmitted chunk came back");
    });
}

/// All of the interfaces' queues as one set, as the dataplane opens them
/// for one worker.
fn open_one(interfaces: &[&str]) -> Result<XdpPorts, IoError> {
    XdpPorts::open_per_queue(interfaces, 1, None, XdpAttach::Auto).map(|mut sets| sets.remove(0))
}

/// What the test's forwarding writes into a frame where it lies: the next
/// hop's addresses and a mark after the sequence number.
fn mark_forwarded(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    frame[..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[18] ^= 0xa5;
}

/// An interface with two receive queues gets a socket on each; flows the
/// sender spreads over both queues all arrive, each once, and both queues
/// carry some (RSS on veth: the sender's transmit queue picks the receive
/// queue, by a hash of the flow).
#[test]
fn every_receive_queue_has_a_socket_and_is_served() {
    const FLOWS: u32 = 256;
    let Some(ns) = Netns::with_veth_pair("queues2") else {
        return;
    };
    ns.add_veth_pair(PORT2_IF, PEER2_IF, 2);
    ns.run(|| {
        let mut ports = open_one(&[PORT2_IF, PORT_IF]).expect("AF_XDP opens on every queue");
        assert_eq!((ports.queues(0), ports.queues(1)), (2, 1));
        let peer = RawSocket::open_all(PEER2_IF);
        let (port_mac, peer_mac) = (Interface::lookup(PORT2_IF).unwrap().mac, Interface::lookup(PEER2_IF).unwrap().mac);
        for flow in 0..FLOWS {
            peer.send(&udp_frame(port_mac, peer_mac, flow, flow));
        }
        let mut seen = std::collections::HashSet::new();
        let mut per_queue = [0u32; 2];
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.len() < FLOWS as usize && Instant::now() < deadline {
            ports.receive(0, 64, &mut |id, frame| {
                if let Some(flow) = udp_flow(frame) {
                    assert!(seen.insert(flow), "flow {flow} arrived twice");
                    per_queue[usize::from(id.queue)] += 1;
                }
                false
            });
        }
        assert_eq!(seen.len(), FLOWS as usize, "every flow arrived ({per_queue:?} per queue)");
        assert!(per_queue.iter().all(|&n| n > 0), "both queues carried flows: {per_queue:?}");
    });
}

/// A round's budget goes round the queues: with frames waiting on both,
/// one frame a round comes from each queue in turn, not always from the
/// first (whose backlog would starve the other's ring into the kernel's
/// drops).
#[test]
fn rounds_take_turns_at_the_receive_queues() {
    let Some(ns) = Netns::with_veth_pair("queues-turns") else {
        return;
    };
    ns.add_veth_pair(PORT2_IF, PEER2_IF, 2);
    ns.run(|| {
        let mut ports = open_one(&[PORT2_IF, PORT_IF]).expect("AF_XDP opens on every queue");
        let peer = RawSocket::open_all(PEER2_IF);
        let (port_mac, peer_mac) = (Interface::lookup(PORT2_IF).unwrap().mac, Interface::lookup(PEER2_IF).unwrap().mac);
        for flow in 0..256 {
            peer.send(&udp_frame(port_mac, peer_mac, flow, flow));
        }
        std::thread::sleep(Duration::from_millis(300));
        let mut queues = Vec::new();
        for _ in 0..4 {
            ports.receive(0, 1, &mut |id, _| {
                queues.push(id.queue);
                false
            });
        }
        assert_eq!(queues, [0, 1, 0, 1], "one frame a round, from each queue in turn");
    });
}

const PORT3_IF: &str = "xsk2";
const PEER3_IF: &str = "peer2";

/// Per-queue sets, each driven by a thread of its own, over two interfaces
/// of two queues: set q serves queue q of both. Each frame a set receives
/// from the first interface is handed to the other set, which changes it
/// where it lies and sends it out of the second: every frame arrives once,
/// changed, marked as received by one set and sent by the other. Most
/// flows land on queue 0, so more chunks leave set 0 for set 1 (a frame's
/// chunk comes back to the set that sent it) than set 0 ever had: only the
/// depot can have brought them back. Afterwards every chunk is on a fill
/// ring, a free list or in the depot, every fill ring is full and each
/// free list holds about its share.
#[test]
fn per_queue_sets_on_their_own_threads_hand_frames_across_and_chunks_come_back_through_the_depot() {
    const SETS: usize = 2;
    const SURVEY_FLOWS: u32 = 64;
    const ROUNDS: u32 = 12;
    const BURST: u32 = 1024;
    /// One frame in this many of a round is on a queue-1 flow.
    const LIGHT_EVERY: u32 = 16;
    let Some(ns) = Netns::with_veth_pair("sets") else {
        return;
    };
    ns.add_veth_pair(PORT2_IF, PEER2_IF, 2);
    ns.add_veth_pair(PORT3_IF, PEER3_IF, 2);
    ns.run(|| {
        let sets = XdpPorts::open_per_queue(&[PORT2_IF, PORT3_IF], SETS, None, XdpAttach::Auto).expect("AF_XDP opens on every queue");
        assert_eq!(sets.len(), SETS, "one set per queue");
        for (q, set) in sets.iter().enumerate() {
            assert_eq!((set.served_queues(0), set.served_queues(1)), (vec![q as u32], vec![q as u32]), "set {q} serves queue {q} of both");
        }
        let [a, a_peer, b, b_peer] = [PORT2_IF, PEER2_IF, PORT3_IF, PEER3_IF].map(|i| Interface::lookup(i).unwrap().mac);
        let sender = RawSocket::open_all(PEER2_IF);
        let receiver = RawSocket::open_all(PEER3_IF);
        let stop = AtomicBool::new(false);
        // Sends the round's frames (seq first.., flow flows[seq - first])
        // and checks what the second interface's peer gets: each frame
        // once, received by one set, changed and sent by the other.
        // Returns the set that received each.
        let round = |first: u32, flows: &[u32]| -> Vec<u8> {
            for (seq, &flow) in (first..).zip(flows) {
                sender.send(&udp_frame(a, a_peer, flow, seq));
            }
            let mut received_by = vec![u8::MAX; flows.len()];
            for f in receiver.receive(flows.len()).iter().filter(|f| udp_flow(f).is_some()) {
                let seq = udp_seq(f);
                let i = seq.wrapping_sub(first) as usize;
                assert!(i < flows.len(), "frame {seq} is not of the round from {first}");
                assert!(received_by[i] == u8::MAX, "frame {seq} arrived twice");
                let by = f[RECEIVED_BY_AT];
                assert!(usize::from(by) < SETS, "frame {seq} marked received by set {by}");
                let mut want = udp_frame(a, a_peer, flows[i], seq);
                want[RECEIVED_BY_AT] = by;
                want[SENT_BY_AT] = 1 - by;
                mark_forwarded(&mut want, b_peer, b);
                assert!(*f == want, "frame {seq} differs from what was sent, received by set {by}, changed and sent by the other");
                received_by[i] = by;
            }
            let missing = received_by.iter().filter(|&&by| by == u8::MAX).count();
            assert_eq!(missing, 0, "{missing} of the {} frames from {first} did not arrive", flows.len());
            received_by
        };
        let mut sets = std::thread::scope(|s| {
            let _stop_workers = StopOnDrop(&stop);
            let (to_1, from_0) = mpsc::channel();
            let (to_0, from_1) = mpsc::channel();
            let mut sets = sets.into_iter();
            let stop = &stop;
            let workers = [(0, to_1, from_1), (1, to_0, from_0)].map(|(me, hand_over, handed)| {
                let set = sets.next().unwrap();
                s.spawn(move || forward_across(me, set, &hand_over, &handed, (b_peer, b), stop))
            });

            // Which queue (set) each of a few flows lands on.
            let survey: Vec<u32> = (0..SURVEY_FLOWS).collect();
            let landed = round(0, &survey);
            let on = |q: u8| -> Vec<u32> { survey.iter().zip(&landed).filter(|&(_, &by)| by == q).map(|(&f, _)| f).collect() };
            let (heavy, light) = (on(0), on(1));
            assert!(!heavy.is_empty() && !light.is_empty(), "flows spread over both queues: {} and {}", heavy.len(), light.len());

            let mut received = [0u32; SETS];
            for r in 0..ROUNDS {
                let first = SURVEY_FLOWS + r * BURST;
                let flows: Vec<u32> = (0..BURST).map(|k| if k % LIGHT_EVERY == 0 { light[k as usize % light.len()] } else { heavy[k as usize % heavy.len()] }).collect();
                for by in round(first, &flows) {
                    received[usize::from(by)] += 1;
                }
            }
            assert!(received.iter().all(|&n| n > 0), "both sets received frames: {received:?}");
            let set_0_had = 2 * FILL_CHUNKS + SPARE_CHUNKS;
            assert!(received[0].saturating_sub(received[1]) > set_0_had, "{received:?} received: more chunks crossed from set 0 to set 1 than set 0 had ({set_0_had})");

            stop.store(true, Ordering::Relaxed);
            workers.map(|w| w.join().expect("worker"))
        });

        let total = 2 * 2 * FILL_CHUNKS as usize + SETS * SPARE_CHUNKS as usize;
        let accounted = |sets: &[XdpPorts]| sets.iter().map(|s| s.chunks_lent() as usize + s.chunks_not_lent()).sum::<usize>() + sets[0].chunks_in_depot();
        let fill_rings_full = |sets: &[XdpPorts]| sets.iter().all(|s| s.chunks_lent() == 2 * FILL_CHUNKS);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(accounted(&sets) == total && fill_rings_full(&sets)) && Instant::now() < deadline {
            for set in &mut sets {
                set.flush().expect("flush");
            }
        }
        assert_eq!(accounted(&sets), total, "every chunk is on a fill ring, a free list or in the depot");
        for (q, set) in sets.iter().enumerate() {
            assert_eq!(set.chunks_lent(), 2 * FILL_CHUNKS, "set {q}'s fill rings are full again");
            let free = set.chunks_not_lent();
            assert!(free.abs_diff(SPARE_CHUNKS as usize) < SPARE_CHUNKS as usize / 4, "set {q}'s free list holds {free} chunks, not about its share of {SPARE_CHUNKS}");
        }
    });
}

/// One set's worker, until `stop`: frames of the test received from side 0
/// are marked as received by set `me` and handed over to the other set's
/// worker; frames handed over by it are marked as sent by `me`, addressed
/// to `next_hop` (destination, source) and sent out of side 1. Returns
/// the set, for the ledger.
fn forward_across(me: u8, mut set: XdpPorts, hand_over: &Sender<Vec<FrameId>>, handed: &Receiver<Vec<FrameId>>, next_hop: ([u8; 6], [u8; 6]), stop: &AtomicBool) -> XdpPorts {
    while !stop.load(Ordering::Relaxed) {
        let mut held = Vec::new();
        set.receive(0, 64, &mut |id, frame| {
            let ours = udp_flow(frame).is_some();
            if ours {
                frame[RECEIVED_BY_AT] = me;
                held.push(id);
            }
            ours
        });
        let mut idle = held.is_empty();
        if !idle {
            hand_over_or_release(&mut set, hand_over, held);
        }
        while let Ok(ids) = handed.try_recv() {
            idle = false;
            for id in ids {
                // SAFETY: the other worker handed the id over and no longer
                // touches the frame; the UMEM is both sets'.
                let frame = unsafe { set.memory().frame(id) }.expect("the frame lies in the shared UMEM");
                frame[SENT_BY_AT] = me;
                mark_forwarded(frame, next_hop.0, next_hop.1);
                // SAFETY: this worker holds the id; transmitting gives it up.
                assert!(unsafe { set.transmit(1, id) }, "set {me}: TX ring full");
            }
            set.flush().expect("flush");
        }
        set.flush().expect("flush");
        if idle {
            let mut pfds: Vec<libc::pollfd> = set.fds().into_iter().map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
            // SAFETY: pfds is a valid array of that many pollfds.
            unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 1) };
        }
    }
    set
}

/// Hands frames over to the other worker or, where it has stopped (its
/// test failed), gives them back to this set.
fn hand_over_or_release(set: &mut XdpPorts, hand_over: &Sender<Vec<FrameId>>, held: Vec<FrameId>) {
    if let Err(mpsc::SendError(lost)) = hand_over.send(held) {
        for id in lost {
            // SAFETY: receive handed the id over; nobody else has it.
            unsafe { set.release(id) };
        }
    }
}

/// Tells the workers to stop when dropped, also when the test fails.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Where some interface has fewer receive queues than the sets asked for,
/// a set would have no socket to send from on it: one set serves every
/// queue, with one share of spare chunks and no depot.
#[test]
fn an_interface_of_one_queue_makes_one_set_of_every_queue() {
    let Some(ns) = Netns::with_veth_pair("oneset") else {
        return;
    };
    ns.add_veth_pair(PORT2_IF, PEER2_IF, 2);
    ns.run(|| {
        let sets = XdpPorts::open_per_queue(&[PORT_IF, PORT2_IF], 2, None, XdpAttach::Auto).expect("AF_XDP opens on every queue");
        assert_eq!(sets.len(), 1, "one set");
        let set = &sets[0];
        assert_eq!((set.served_queues(0), set.served_queues(1)), (vec![0], vec![0, 1]), "the set serves every queue");
        assert_eq!(set.chunks_lent(), 3 * FILL_CHUNKS, "a full fill ring on each of the three queues");
        assert_eq!((set.chunks_not_lent(), set.chunks_in_depot()), (SPARE_CHUNKS as usize, 0), "one share of spare chunks, no depot");
    });
}

/// An Ethernet/IPv4/UDP frame of one flow (source port 1000 + flow),
/// which the kernel's flow hash spreads over transmit queues; its payload
/// is the flow, a sequence number and two marks not yet made (0xff).
fn udp_frame(dst: [u8; 6], src: [u8; 6], flow: u32, seq: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00]);
    // IPv4: 20 bytes, UDP, 198.18.0.1 -> 198.18.0.2 (the benchmarking range).
    f.extend_from_slice(&[0x45, 0, 0, 40, 0, 0, 0, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2]);
    f.extend_from_slice(&((1000 + flow) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 9, 0, 20, 0, 0]);
    f.extend_from_slice(&flow.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&[0xff, 0xff]);
    f.resize(60, 0);
    f
}

/// Where `udp_frame` keeps the sequence number and the two marks.
const SEQ_AT: usize = 46;
const RECEIVED_BY_AT: usize = 50;
const SENT_BY_AT: usize = 51;

/// The flow of a frame `udp_frame` made, or None for other traffic.
fn udp_flow(frame: &[u8]) -> Option<u32> {
    if frame.len() < 60 || frame[12..14] != [0x08, 0x00] || frame[23] != 17 || frame[26..30] != [198, 18, 0, 1] {
        return None;
    }
    Some(u32::from_be_bytes(frame[42..46].try_into().ok()?))
}

/// The sequence number of a frame `udp_frame` made.
fn udp_seq(frame: &[u8]) -> u32 {
    u32::from_be_bytes(frame[SEQ_AT..SEQ_AT + 4].try_into().unwrap())
}

/// 60 to 1514 bytes: addresses, the test ethertype, the sequence number
/// and a pattern that differs per frame.
fn test_frame(dst: [u8; 6], src: [u8; 6], seq: u32) -> Vec<u8> {
    let len = 60 + (seq as usize * 151) % 1455;
    let mut frame = Vec::with_capacity(len);
    frame.extend_from_slice(&dst);
    frame.extend_from_slice(&src);
    frame.extend_from_slice(&TEST_ETHERTYPE.to_be_bytes());
    frame.extend_from_slice(&seq.to_be_bytes());
    frame.extend((frame.len()..len).map(|i| (i as u32 ^ seq) as u8));
    frame
}

/// Collects `count` test frames from the port, skipping the kernel's own
/// traffic (IPv6 neighbour discovery from the peer).
fn receive_on_port(port: &mut AfXdpPort, count: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut frames = Vec::new();
    while frames.len() < count && Instant::now() < deadline {
        let mut pfd = libc::pollfd { fd: port.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 100) };
        port.recv_batch(64, &mut |frame| {
            if frame.get(12..14) == Some(&TEST_ETHERTYPE.to_be_bytes()[..]) {
                frames.push(frame.to_vec());
            }
        })
        .expect("recv_batch");
    }
    frames
}

/// An AF_PACKET socket on the peer interface that sees only test frames.
struct RawSocket(OwnedFd);

impl RawSocket {
    /// Sees only test frames.
    fn open(interface: &str) -> RawSocket {
        RawSocket::bound(interface, TEST_ETHERTYPE)
    }

    /// For sending any frame.
    fn open_all(interface: &str) -> RawSocket {
        RawSocket::bound(interface, libc::ETH_P_ALL as u16)
    }

    fn bound(interface: &str, ethertype: u16) -> RawSocket {
        let protocol = ethertype.to_be();
        // SAFETY: plain socket creation.
        let fd = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, i32::from(protocol)) }).expect("AF_PACKET socket");
        // SAFETY: fd was just created and nothing else owns it.
        let socket = RawSocket(unsafe { OwnedFd::from_raw_fd(fd) });
        // Room for a whole burst of full-size frames.
        set_option(&socket.0, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(8 << 20)).expect("SO_RCVBUFFORCE");
        let timeout = libc::timeval { tv_sec: 5, tv_usec: 0 };
        set_option(&socket.0, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout).expect("SO_RCVTIMEO");
        // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = protocol;
        addr.sll_ifindex = Interface::lookup(interface).unwrap().index as i32;
        let len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: addr is a valid sockaddr_ll of that length.
        check(unsafe { libc::bind(fd, (&addr as *const libc::sockaddr_ll).cast(), len) }).expect("bind AF_PACKET");
        socket
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: frame is readable for its length; the bound interface
        // is the destination.
        let sent = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(sent, frame.len() as isize, "AF_PACKET send: {}", io::Error::last_os_error());
    }

    fn receive(&self, count: usize) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let mut buf = [0u8; MAX_FRAME];
        while frames.len() < count {
            // SAFETY: buf is writable for its length.
            let got = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if got < 0 {
                break; // the receive timeout: report what arrived
            }
            frames.push(buf[..got as usize].to_vec());
        }
        frames
    }
}

/// A network namespace of our own, deleted (with its interfaces) on drop,
/// also when a test fails.
pub(crate) struct Netns {
    pub(crate) name: String,
}

impl Netns {
    /// An empty namespace; None, after saying why, where the test cannot
    /// run here.
    pub(crate) fn empty(tag: &str) -> Option<Netns> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: network namespaces need root");
            return None;
        }
        let name = format!("nxtest-xdp-{}-{tag}", std::process::id());
        match Command::new("ip").args(["netns", "add", &name]).status() {
            Ok(status) if status.success() => Some(Netns { name }),
            other => {
                eprintln!("skipped: cannot create a network namespace: {other:?}");
                None
            }
        }
    }

    /// A namespace holding a veth pair, `PORT_IF` and `PEER_IF`.
    fn with_veth_pair(tag: &str) -> Option<Netns> {
        let ns = Netns::empty(tag)?;
        // No frames of the kernel's own (IPv6's DAD, MLD, router
        // solicitations): the ports count and drop only the tests' frames.
        run_command(&["ip", "netns", "exec", &ns.name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]);
        ns.add_veth_pair(PORT_IF, PEER_IF, 1);
        Some(ns)
    }

    /// A veth pair whose ends have `queues` receive and transmit queues.
    fn add_veth_pair(&self, port: &str, peer: &str, queues: u32) {
        let q = queues.to_string();
        let queues = ["numrxqueues", &q, "numtxqueues", &q];
        self.ip(&[&["link", "add", port][..], &queues, &["type", "veth", "peer", "name", peer], &queues].concat());
        for interface in [port, peer] {
            // Offloads would leave kernel-built frames with partial
            // checksums or merged by GRO.
            self.ethtool(&["-K", interface, "rx", "off", "tx", "off", "tso", "off", "gso", "off", "gro", "off"]);
            self.ip(&["link", "set", interface, "up"]);
        }
    }

    pub(crate) fn ip(&self, args: &[&str]) -> String {
        run_command(&[&["ip", "-n", &self.name], args].concat())
    }

    pub(crate) fn ethtool(&self, args: &[&str]) {
        run_command(&[&["ip", "netns", "exec", &self.name, "ethtool"], args].concat());
    }

    /// Runs `f` on a thread that has entered the namespace; setns moves
    /// only the calling thread, so the test's own thread stays put.
    pub(crate) fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = std::ffi::CString::new(format!("/run/netns/{}", self.name)).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: path is a valid C string.
                let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) }).expect("open the namespace");
                // SAFETY: fd was just opened and nothing else owns it.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                // SAFETY: fd refers to a network namespace.
                check(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) }).expect("setns");
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Runs a command line, panicking with its stderr when it fails.
fn run_command(argv: &[&str]) -> String {
    let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap_or_else(|e| panic!("{}: {e}", argv[0]));
    assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
