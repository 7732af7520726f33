//! The trial engine: one thread that paces frames out of the two ports,
//! receives on both, answers ARP for the addresses it simulates, and
//! accounts for every frame.
//!
//! The initiator port sits where subscribers are, the responder port where
//! servers are, with the device under test between them. A trial sends a
//! forward stream (initiator to responder), a reverse stream (responder to
//! the external endpoints it learned), or both, and the responder may
//! reflect every forward frame (round-trip times) or answer SYNs with
//! SYN-ACKs (seed 003's synbomber-reply).
//!
//! One thread does all of it, so sending never waits for a receiver thread
//! and one clock stamps both ends; between due frames it sleeps in ppoll()
//! on the ports, waking early enough to spin up to the next due time.

use natrix_io::{IoError, PacketPort, MAX_FRAME};

use crate::flows::{FlowSpace, Permutation, Rng, Tuple};
use crate::frame::{self, Direction, Endpoints, Received, Tag, TCP_ACK, TCP_RST, TCP_SYN};
use crate::pacing::{Rate, Schedule};
use crate::stats::Jitter;
use crate::sys::{now_ns, wait_readable};

/// Frames one pass of the loop sends per stream before it looks at the
/// receive rings again: one copy-mode AF_XDP kick's worth, so that frames
/// arriving while the generator runs flat out wait little for their stamp.
const SEND_BATCH: u64 = 32;
/// Frames taken from a receive ring in one call.
const RECV_BATCH: usize = 256;
/// Sleep until this long before the next due frame, then spin: a timer
/// wakes up late by up to a few tens of microseconds.
const WAKE_EARLY_NS: u64 = 60_000;
/// Duplicates are recognised among the first 2^28 keys (a 32 MiB bitmap):
/// more than any trial sends.
const MAX_SEEN_WORDS: usize = 1 << 22;
/// The initial sequence number of the SYN-ACKs the responder sends.
const RESPONDER_ISN: u32 = 0x1000_0000;

/// Addresses the tester answers ARP for on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrRange {
    pub first: u32,
    pub count: u32,
}

impl AddrRange {
    pub fn single(addr: u32) -> AddrRange {
        AddrRange { first: addr, count: 1 }
    }

    fn contains(&self, addr: u32) -> bool {
        addr.wrapping_sub(self.first) < self.count
    }
}

/// One side of the tester: its port on a link to the device under test.
pub struct Link {
    pub port: Box<dyn PacketPort>,
    /// The tester's own MAC on this link.
    pub mac: [u8; 6],
    /// The device's MAC on this link: every test frame goes there.
    pub gateway_mac: [u8; 6],
    pub answers_arp_for: Vec<AddrRange>,
}

/// What the receiving side expects of frames that crossed the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// Routers on the path: each takes one off the TTL.
    pub hops: u8,
    /// The device translates: a forward frame must not arrive from a
    /// simulated subscriber's own address.
    pub translated: bool,
    /// Count tagged frames of any trial, not only this process's current
    /// one (a receiver listening to another process's generator).
    pub any_trial: bool,
}

impl Expect {
    /// Through one NAT.
    pub const NAT: Expect = Expect { hops: 1, translated: true, any_trial: false };
    /// Across a switch only, as in the generator's own accuracy test.
    pub const SWITCH: Expect = Expect { hops: 0, translated: false, any_trial: false };
}

/// What each frame of a stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// UDP test frames of this RFC 2544 size (FCS included).
    Udp { frame_size: usize },
    /// 64-byte TCP SYNs whose sequence number is the connection index.
    Syn,
}

/// Which connection each frame of a stream uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pick {
    /// Connections 0..n, each once, in pseudorandom order (RFC 9693's
    /// preliminary phase and its validation).
    Enumerate { conns: u32, seed: u64 },
    /// Connections drawn at random from 0..n, with repetition (RFC 9693's
    /// real test phase: every frame belongs to an existing connection).
    Random { conns: u32, seed: u64 },
    /// A share of the frames each opening a connection never used before
    /// (counting up from `first_new`), the rest drawn from 0..established.
    Mix { established: u32, first_new: u32, new_share: f64, seed: u64 },
}

/// One direction's frames: which connections, how fast, how many.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stream {
    pub pick: Pick,
    pub rate: Rate,
    pub frames: u64,
    /// Frames sent back to back at each due time (1: evenly spaced).
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrialPlan {
    pub kind: Kind,
    pub forward: Option<Stream>,
    pub reverse: Option<Stream>,
    /// The responder sends every forward frame back (RTT).
    pub reflect: bool,
    /// The responder answers SYNs with SYN-ACKs.
    pub answer_syn: bool,
    /// Record the external endpoint of each connection the responder sees.
    pub learn: bool,
    /// How long to wait after the last frame for late ones.
    pub drain_ns: u64,
    /// Keep each frame's latency (for percentiles), not only counts.
    pub keep_latencies: bool,
    /// Keep the gaps between successive sends (generator accuracy).
    pub keep_gaps: bool,
    /// Stop sending after this long even if frames are left (a ceiling
    /// test asks for more than the generator can send).
    pub send_for_ns: Option<u64>,
}

impl TrialPlan {
    pub fn new(kind: Kind) -> TrialPlan {
        TrialPlan {
            kind,
            forward: None,
            reverse: None,
            reflect: false,
            answer_syn: false,
            learn: false,
            drain_ns: 500_000_000,
            keep_latencies: false,
            keep_gaps: false,
            send_for_ns: None,
        }
    }
}

/// What happened to one direction's frames.
#[derive(Debug, Clone, Default)]
pub struct DirectionReport {
    pub sent: u64,
    /// Distinct frames received (duplicates are counted apart).
    pub received: u64,
    pub duplicates: u64,
    /// Frames that arrived after a frame sent later than them.
    pub reordered: u64,
    pub first_tx_ns: u64,
    pub last_tx_ns: u64,
    pub first_rx_ns: u64,
    pub last_rx_ns: u64,
    /// Per received frame, send to receipt in nanoseconds (with
    /// `keep_latencies`).
    pub latencies_ns: Vec<u32>,
    /// RFC 3550 jitter of the one-way transit times, nanoseconds.
    pub jitter_ns: f64,
    /// UDP payload bytes received.
    pub payload_bytes: u64,
    /// Gaps between successive sends, nanoseconds (with `keep_gaps`).
    pub tx_gaps_ns: Vec<u32>,
    /// Gaps between successive receipts, nanoseconds (with `keep_gaps`).
    pub rx_gaps_ns: Vec<u32>,
    /// Frames its stream sends back to back at each due time (0 or 1:
    /// evenly spaced).
    pub burst: u32,
    seen: Vec<u64>,
    highest_seq: Option<u32>,
    jitter: Jitter,
}

impl DirectionReport {
    /// Frames lost, as a share of those sent.
    pub fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        1.0 - self.received.min(self.sent) as f64 / self.sent as f64
    }

    /// The highest sequence number received: a receiver that did not see
    /// the sending expects that many frames and one more.
    pub fn highest_seq(&self) -> Option<u32> {
        self.highest_seq
    }

    /// The rate the frames really left at, from first to last send.
    pub fn sent_pps(&self) -> f64 {
        rate_between(self.sent, self.burst, self.first_tx_ns, self.last_tx_ns)
    }

    /// The rate they arrived at, from first to last receipt.
    pub fn received_pps(&self) -> f64 {
        rate_between(self.received, self.burst, self.first_rx_ns, self.last_rx_ns)
    }

    /// Seconds the frames took to arrive: first to last receipt, and one
    /// mean gap more (n frames evenly spaced at r a second take n / r).
    /// What a destination measures goodput over (seed 002); None where
    /// fewer than two arrived.
    pub fn receiving_seconds(&self) -> Option<f64> {
        let span = self.last_rx_ns.checked_sub(self.first_rx_ns).filter(|&ns| ns > 0 && self.received >= 2)?;
        Some(span as f64 / 1e9 * self.received as f64 / (self.received - 1) as f64)
    }

    fn note_sent(&mut self, now: u64, keep_gaps: bool) {
        if self.sent == 0 {
            self.first_tx_ns = now;
        } else if keep_gaps {
            self.tx_gaps_ns.push(clamp_u32(now - self.last_tx_ns));
        }
        self.last_tx_ns = now;
        self.sent += 1;
    }

    /// Counts a frame's arrival; false when it was a duplicate.
    fn note_received(&mut self, a: Arrival, plan: &TrialPlan) -> bool {
        let key = a.key;
        let (word, bit) = (key as usize / 64, 1u64 << (key % 64));
        if word < MAX_SEEN_WORDS {
            if self.seen.len() <= word {
                self.seen.resize(word + 1, 0);
            }
            if self.seen[word] & bit != 0 {
                self.duplicates += 1;
                return false;
            }
            self.seen[word] |= bit;
        }
        if a.sequenced {
            match self.highest_seq {
                Some(h) if key < h => self.reordered += 1,
                _ => self.highest_seq = Some(key),
            }
        }
        let now = a.now;
        if self.received == 0 {
            self.first_rx_ns = now;
        } else if plan.keep_gaps {
            self.rx_gaps_ns.push(clamp_u32(now.saturating_sub(self.last_rx_ns)));
        }
        self.last_rx_ns = now;
        self.received += 1;
        self.payload_bytes += a.payload as u64;
        if let Some(transit) = a.transit_ns {
            self.jitter.add(transit as i64);
            self.jitter_ns = self.jitter.ns();
            if plan.keep_latencies {
                self.latencies_ns.push(clamp_u32(transit));
            }
        }
        true
    }
}

/// One frame received, as its direction's report counts it.
struct Arrival {
    /// Its sequence number (UDP), or its connection (SYNs and their answers).
    key: u32,
    now: u64,
    /// Send to receipt, when the send time is known.
    transit_ns: Option<u64>,
    payload: usize,
    /// Keys are sequence numbers, so a lower one after a higher one was reordered.
    sequenced: bool,
}

impl Arrival {
    fn tagged(tag: &Tag, now: u64, payload: usize) -> Arrival {
        Arrival { key: tag.seq, now, transit_ns: Some(frame::since_stamp(now, tag.stamp_ns)), payload, sequenced: true }
    }

    fn syn(conn: u32, now: u64, sent_at: Option<u64>) -> Arrival {
        Arrival { key: conn, now, transit_ns: sent_at.map(|t| now.saturating_sub(t)), payload: 0, sequenced: false }
    }
}

/// The rate of `frames` from the first at `first_ns` to the last at
/// `last_ns`, sent in bursts of `burst` (0 or 1: one at a time): the span
/// holds every burst but the last, so n frames at r a second in bursts of
/// b span (n - b) / r.
fn rate_between(frames: u64, burst: u32, first_ns: u64, last_ns: u64) -> f64 {
    let burst = u64::from(burst.max(1));
    if frames <= burst || last_ns <= first_ns {
        return 0.0;
    }
    (frames - burst) as f64 * 1e9 / (last_ns - first_ns) as f64
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Frames that arrived wrong, by what was wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Problems {
    /// IPv4 header or UDP/TCP checksum wrong.
    pub checksum: u64,
    /// TTL not one less than sent: not forwarded exactly once.
    pub ttl: u64,
    /// A forward frame that kept its subscriber source address.
    pub untranslated: u64,
    /// Arrived for another address or port than its connection's.
    pub misdelivered: u64,
    /// Tagged by an earlier trial.
    pub stale: u64,
}

impl Problems {
    pub fn total(&self) -> u64 {
        self.checksum + self.ttl + self.untranslated + self.misdelivered + self.stale
    }
}

#[derive(Debug, Clone, Default)]
pub struct TrialOutcome {
    pub forward: DirectionReport,
    pub reverse: DirectionReport,
    /// Forward frames that came back to the initiator (with `reflect`), or
    /// SYNs answered with a SYN-ACK or RST.
    pub returned: DirectionReport,
    /// Connections whose external endpoint the responder learned in this trial.
    pub learned: u64,
    /// Reverse frames not sent because the connection's endpoint was never learned.
    pub unlearned: u64,
    pub problems: Problems,
    /// Times the transmit ring was full and the sender had to wait.
    pub tx_full: u64,
    /// Frames the tester's own ports lost during the trial: its receive
    /// rings overflowed, or the kernel refused what it sent. They count as
    /// lost in the directions' reports, but the loss is the tester's, not
    /// the device's.
    pub tester_dropped: u64,
    /// Nanoseconds the trial took, from the first due frame to the end of the drain.
    pub elapsed_ns: u64,
}

/// The tester: two links, the connections, what it learned.
pub struct Tester {
    initiator: Link,
    responder: Link,
    state: State,
}

/// What the tester knows apart from its ports, so that receiving can
/// borrow a port and the state at once.
struct State {
    flows: FlowSpace,
    /// Per connection, the external endpoint (address << 16 | port) the
    /// responder saw; 0 when not seen.
    learned: Vec<u64>,
    /// Per connection, when its SYN left (SYN streams).
    syn_sent_at: Vec<u64>,
    trial: u8,
    expect: Expect,
    /// The tester's MAC and the device's MAC on each side: where frames
    /// come from and go to.
    initiator_macs: ([u8; 6], [u8; 6]),
    responder_macs: ([u8; 6], [u8; 6]),
}

/// Which of the two links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Initiator,
    Responder,
}

impl Tester {
    pub fn new(initiator: Link, responder: Link, flows: FlowSpace, expect: Expect) -> Tester {
        let initiator_macs = (initiator.mac, initiator.gateway_mac);
        let responder_macs = (responder.mac, responder.gateway_mac);
        Tester { initiator, responder, state: State { flows, learned: Vec::new(), syn_sent_at: Vec::new(), trial: 0, expect, initiator_macs, responder_macs } }
    }

    pub fn flows(&self) -> &FlowSpace {
        &self.state.flows
    }

    /// Forgets every learned endpoint: the device's table was emptied.
    pub fn forget(&mut self) {
        self.state.learned.fill(0);
    }

    /// Connections among `0..conns` whose external endpoint is known.
    pub fn learned_among(&self, conns: u32) -> u64 {
        self.state.learned.iter().take(conns as usize).filter(|&&e| e != 0).count() as u64
    }

    /// Asks the device for its own address on each link from every
    /// simulated address there (ARP requests), which teaches it where they
    /// are: after a restart its first frames to them need not wait for ARP.
    pub fn announce(&mut self, inside_router: u32, outside_router: u32) -> Result<(), IoError> {
        let flows = self.state.flows;
        let subscribers = (0..flows.subscribers).map(|i| flows.first_subscriber + i);
        for sub in subscribers {
            self.initiator.port.send(&frame::arp_request(self.initiator.mac, sub, inside_router));
        }
        self.initiator.port.flush()?;
        self.responder.port.send(&frame::arp_request(self.responder.mac, flows.server, outside_router));
        self.responder.port.flush()
    }

    /// Which backends the two ports use ("af_xdp" or "af_packet").
    pub fn backends(&self) -> (&'static str, &'static str) {
        (self.initiator.port.backend(), self.responder.port.backend())
    }

    /// Frames both ports lost so far: their receive rings' overflows and
    /// the sends the kernel refused.
    fn own_drops(&mut self) -> u64 {
        [&mut self.initiator, &mut self.responder].into_iter().map(|l| l.port.kernel_dropped() + l.port.dropped_on_transmit()).sum()
    }

    /// Runs one trial to its end.
    pub fn run(&mut self, plan: &TrialPlan) -> Result<TrialOutcome, IoError> {
        self.state.prepare(plan);
        let dropped_before = self.own_drops();
        let start = now_ns() + 1_000_000;
        let mut senders: Vec<Sender> = Vec::new();
        if let Some(s) = plan.forward {
            senders.push(Sender::new(s, Side::Initiator, Direction::Forward, start));
        }
        if let Some(s) = plan.reverse {
            senders.push(Sender::new(s, Side::Responder, Direction::Reverse, start));
        }
        let mut run = Run { plan, out: TrialOutcome::default(), outbox: Outbox::default(), buf: [0u8; MAX_FRAME] };
        for sender in &senders {
            run.report(sender.direction).burst = sender.stream.burst;
        }
        let mut done_at = None;
        let stop_sending_at = plan.send_for_ns.map(|ns| start + ns);
        loop {
            let now = now_ns();
            for sender in &mut senders {
                if stop_sending_at.is_some_and(|t| now >= t) {
                    sender.next = sender.stream.frames;
                }
                self.pump(sender, &mut run, now)?;
            }
            self.receive(Side::Initiator, &mut run)?;
            self.receive(Side::Responder, &mut run)?;
            let next_due = senders.iter().filter(|s| !s.finished()).map(|s| s.schedule.due(s.next)).min();
            let now = now_ns();
            let deadline = match next_due {
                Some(due) => due,
                None => *done_at.get_or_insert(now + plan.drain_ns),
            };
            if next_due.is_none() && (now >= deadline || run.all_back()) {
                break;
            }
            if deadline > now + WAKE_EARLY_NS {
                wait_readable(&[self.initiator.port.fd(), self.responder.port.fd()], deadline - now - WAKE_EARLY_NS);
            }
        }
        run.out.elapsed_ns = now_ns().saturating_sub(start);
        run.out.tester_dropped = self.own_drops().saturating_sub(dropped_before);
        Ok(run.out)
    }

    /// Sends what of `sender`'s stream is due at `now`, at most a batch.
    fn pump(&mut self, sender: &mut Sender, run: &mut Run, now: u64) -> Result<(), IoError> {
        let mut queued = false;
        for _ in 0..SEND_BATCH {
            if sender.finished() || sender.schedule.due(sender.next) > now {
                break;
            }
            // A frame the full ring refused keeps its connection: drawing
            // again would skip a new connection of a `Pick::Mix`.
            let conn = match sender.pending.take() {
                Some(conn) => conn,
                None => sender.conn(sender.next),
            };
            let stamp = now_ns();
            let Some(len) = self.state.build(run.plan.kind, sender, conn, stamp, &mut run.buf) else {
                // No learned endpoint to send this reverse frame to.
                run.out.unlearned += 1;
                sender.next += 1;
                continue;
            };
            let link = self.link(sender.side);
            if !link.port.send(&run.buf[..len]) {
                sender.pending = Some(conn);
                run.out.tx_full += 1;
                link.port.flush()?;
                break;
            }
            queued = true;
            if run.plan.kind == Kind::Syn {
                self.state.syn_sent_at[conn as usize] = stamp;
            }
            let keep_gaps = run.plan.keep_gaps;
            run.report(sender.direction).note_sent(stamp, keep_gaps);
            sender.next += 1;
        }
        if queued {
            self.link(sender.side).port.flush()?;
        }
        Ok(())
    }

    fn link(&mut self, side: Side) -> &mut Link {
        match side {
            Side::Initiator => &mut self.initiator,
            Side::Responder => &mut self.responder,
        }
    }

    /// Takes what waits on one link's receive ring, accounts for it and
    /// sends the answers it calls for (ARP replies, reflections, SYN-ACKs).
    fn receive(&mut self, side: Side, run: &mut Run) -> Result<(), IoError> {
        let now = now_ns();
        let Tester { initiator, responder, state } = self;
        let link = match side {
            Side::Initiator => initiator,
            Side::Responder => responder,
        };
        let (mac, arp_addrs) = (link.mac, &link.answers_arp_for);
        link.port.recv_batch(RECV_BATCH, &mut |f| match frame::parse(f) {
            Received::ArpRequest(q) if arp_addrs.iter().any(|r| r.contains(q.target)) => run.outbox.push(&frame::arp_reply(&q, mac)),
            parsed @ (Received::Udp(_) | Received::Tcp(_)) if side == Side::Initiator => state.at_initiator(parsed, now, run),
            parsed @ (Received::Udp(_) | Received::Tcp(_)) => state.at_responder(parsed, f, now, run),
            _ => {}
        })?;
        if !run.outbox.is_empty() {
            for f in run.outbox.frames() {
                link.port.send(f);
            }
            run.outbox.clear();
            link.port.flush()?;
        }
        Ok(())
    }
}

impl State {
    /// Sizes the per-connection tables for `plan` and starts a new trial number.
    fn prepare(&mut self, plan: &TrialPlan) {
        self.trial = self.trial.wrapping_add(1);
        let conns = [plan.forward, plan.reverse].iter().flatten().map(max_conn).max().unwrap_or(0) as usize;
        if self.learned.len() < conns {
            self.learned.resize(conns, 0);
        }
        if plan.kind == Kind::Syn && self.syn_sent_at.len() < conns {
            self.syn_sent_at.resize(conns, 0);
        }
    }

    /// Writes `sender`'s next frame, for connection `conn` and stamped
    /// `stamp`, into `buf`: its length; None for a reverse frame whose
    /// connection was never learned.
    fn build(&self, kind: Kind, sender: &Sender, conn: u32, stamp: u64, buf: &mut [u8; MAX_FRAME]) -> Option<usize> {
        let t = self.flows.tuple(conn);
        let ep = match sender.direction {
            Direction::Forward => {
                let (mac, gateway) = self.initiator_macs;
                Endpoints { src_mac: mac, dst_mac: gateway, src: t.src, sport: t.sport, dst: t.dst, dport: t.dport }
            }
            _ => {
                let ext = *self.learned.get(conn as usize).filter(|&&e| e != 0)?;
                let (mac, gateway) = self.responder_macs;
                Endpoints { src_mac: mac, dst_mac: gateway, src: t.dst, sport: t.dport, dst: (ext >> 16) as u32, dport: ext as u16 }
            }
        };
        match kind {
            Kind::Udp { frame_size } => {
                let len = frame::wire_len(frame_size);
                let tag = Tag { trial: self.trial, direction: sender.direction, seq: sender.next as u32, conn, stamp_ns: stamp };
                frame::write_udp(&mut buf[..len], &ep, &tag);
                Some(len)
            }
            Kind::Syn => {
                let f: &mut [u8; 60] = (&mut buf[..60]).try_into().expect("a frame buffer holds 60 bytes");
                frame::write_tcp(f, &ep, TCP_SYN, conn, 0);
                Some(60)
            }
        }
    }

    /// A frame `parsed` from `f` arrived on the server side.
    fn at_responder(&mut self, parsed: Received, f: &mut [u8], now: u64, run: &mut Run) {
        match parsed {
            Received::Udp(u) => {
                let Some(tag) = u.tag.filter(|t| t.direction == Direction::Forward) else { return };
                if tag.trial != self.trial && !self.expect.any_trial {
                    run.out.problems.stale += 1;
                    return;
                }
                let t = self.flows.tuple(tag.conn);
                if !judge(u.ip, u.valid, (u.ip.dst, u.dport) == (t.dst, t.dport), self.expect, run) {
                    return;
                }
                if self.expect.translated && self.flows.is_subscriber(u.ip.src) {
                    run.out.problems.untranslated += 1;
                }
                self.learn(tag.conn, u.ip.src, u.sport, run);
                let new = run.out.forward.note_received(Arrival::tagged(&tag, now, u.payload_len), run.plan);
                if new && run.plan.reflect {
                    let (mac, gateway) = self.responder_macs;
                    frame::reverse_udp(f, mac, gateway, Direction::Reflected);
                    run.outbox.push(f);
                }
            }
            Received::Tcp(t) if t.flags == TCP_SYN => {
                // A SYN this process sent has its send time; one from a
                // generator elsewhere (a receiver's) has none.
                let sent_at = self.syn_sent_at.get(t.seq as usize).copied();
                if sent_at.is_none() && !self.expect.any_trial {
                    return;
                }
                let tuple = self.flows.tuple(t.seq);
                if !judge(t.ip, t.valid, (t.ip.dst, t.dport) == (tuple.dst, tuple.dport), self.expect, run) {
                    return;
                }
                self.learn(t.seq, t.ip.src, t.sport, run);
                let new = run.out.forward.note_received(Arrival::syn(t.seq, now, sent_at), run.plan);
                if new && run.plan.answer_syn {
                    let (mac, gateway) = self.responder_macs;
                    let ep = Endpoints { src_mac: mac, dst_mac: gateway, src: t.ip.dst, sport: t.dport, dst: t.ip.src, dport: t.sport };
                    let mut answer = [0u8; 60];
                    frame::write_tcp(&mut answer, &ep, TCP_SYN | TCP_ACK, RESPONDER_ISN, t.seq.wrapping_add(1));
                    run.outbox.push(&answer);
                }
            }
            _ => {}
        }
    }

    /// A frame arrived on the subscriber side.
    fn at_initiator(&mut self, parsed: Received, now: u64, run: &mut Run) {
        match parsed {
            Received::Udp(u) => {
                let Some(tag) = u.tag.filter(|t| t.direction != Direction::Forward) else { return };
                if tag.trial != self.trial && !self.expect.any_trial {
                    run.out.problems.stale += 1;
                    return;
                }
                let t = self.flows.tuple(tag.conn);
                if !judge(u.ip, u.valid, reaches_subscriber(&t, u.ip.dst, u.dport), self.expect, run) {
                    return;
                }
                let report = if tag.direction == Direction::Reverse { &mut run.out.reverse } else { &mut run.out.returned };
                report.note_received(Arrival::tagged(&tag, now, u.payload_len), run.plan);
            }
            // A SYN answered by the responder or a real server: SYN-ACK or RST
            // (seed 003: either ends the attempt).
            Received::Tcp(t) if t.flags & TCP_ACK != 0 && t.flags & (TCP_SYN | TCP_RST) != 0 => {
                let conn = t.ack.wrapping_sub(1);
                let Some(&sent_at) = self.syn_sent_at.get(conn as usize) else { return };
                let tuple = self.flows.tuple(conn);
                if judge(t.ip, t.valid, reaches_subscriber(&tuple, t.ip.dst, t.dport), self.expect, run) {
                    run.out.returned.note_received(Arrival::syn(conn, now, Some(sent_at)), run.plan);
                }
            }
            _ => {}
        }
    }

    fn learn(&mut self, conn: u32, addr: u32, port: u16, run: &mut Run) {
        if !run.plan.learn {
            return;
        }
        let ext = u64::from(addr) << 16 | u64::from(port);
        if let Some(slot) = self.learned.get_mut(conn as usize) {
            if *slot != ext {
                run.out.learned += 1;
                *slot = ext;
            }
        }
    }
}

/// Counts what is wrong with a frame; false when it cannot be counted as
/// delivered at all (corrupt, or for another connection).
fn judge(ip: frame::Ip, l4_valid: bool, right_place: bool, expect: Expect, run: &mut Run) -> bool {
    if !ip.valid || !l4_valid {
        run.out.problems.checksum += 1;
        return false;
    }
    if !right_place {
        run.out.problems.misdelivered += 1;
        return false;
    }
    if ip.ttl != frame::SEND_TTL - expect.hops {
        run.out.problems.ttl += 1;
    }
    true
}

fn reaches_subscriber(t: &Tuple, dst: u32, dport: u16) -> bool {
    (dst, dport) == (t.src, t.sport)
}

/// One past the highest connection index `stream` can use.
fn max_conn(stream: &Stream) -> u32 {
    match stream.pick {
        Pick::Enumerate { conns, .. } | Pick::Random { conns, .. } => conns,
        Pick::Mix { established, first_new, new_share, .. } => established.max(first_new + (stream.frames as f64 * new_share).ceil() as u32 + 1),
    }
}

/// Writes a forward stream's frames, each stamped with its due time, to
/// `sink` instead of sending them: what `natrix gen --out` captures. The
/// macs are the source's and the next hop's.
pub fn render<E>(kind: Kind, stream: Stream, flows: FlowSpace, macs: ([u8; 6], [u8; 6]), start_ns: u64, mut sink: impl FnMut(u64, &[u8]) -> Result<(), E>) -> Result<(), E> {
    let state = State { flows, learned: Vec::new(), syn_sent_at: Vec::new(), trial: 0, expect: Expect::NAT, initiator_macs: macs, responder_macs: macs };
    let mut sender = Sender::new(stream, Side::Initiator, Direction::Forward, start_ns);
    let mut buf = [0u8; MAX_FRAME];
    while !sender.finished() {
        let due = sender.schedule.due(sender.next);
        let conn = sender.conn(sender.next);
        let len = state.build(kind, &sender, conn, due, &mut buf).expect("forward frames need nothing learned");
        sink(due, &buf[..len])?;
        sender.next += 1;
    }
    Ok(())
}

/// Frames to send on a link after a receive pass, in one flat buffer.
#[derive(Default)]
struct Outbox {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Outbox {
    fn push(&mut self, f: &[u8]) {
        self.bytes.extend_from_slice(f);
        self.ends.push(self.bytes.len());
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn frames(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(|(a, b)| &self.bytes[a..b])
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

/// A trial in progress: its plan, what it has counted, frames to send back.
struct Run<'a> {
    plan: &'a TrialPlan,
    out: TrialOutcome,
    outbox: Outbox,
    buf: [u8; MAX_FRAME],
}

impl Run<'_> {
    fn report(&mut self, direction: Direction) -> &mut DirectionReport {
        match direction {
            Direction::Forward => &mut self.out.forward,
            Direction::Reverse => &mut self.out.reverse,
            Direction::Reflected => &mut self.out.returned,
        }
    }

    /// Everything sent has arrived (and come back, where it should): the
    /// drain can end early.
    fn all_back(&self) -> bool {
        if self.plan.forward.is_none() && self.plan.reverse.is_none() {
            // A receiver only: it listens for the whole drain.
            return false;
        }
        let o = &self.out;
        let returns = self.plan.reflect || self.plan.answer_syn;
        o.forward.received >= o.forward.sent && o.reverse.received >= o.reverse.sent && (!returns || o.returned.received >= o.forward.received)
    }
}

/// One stream being sent: its schedule and which frame is next.
struct Sender {
    stream: Stream,
    side: Side,
    direction: Direction,
    schedule: Schedule,
    next: u64,
    permutation: Option<Permutation>,
    rng: Rng,
    /// For `Pick::Mix`: how many new connections so far.
    opened: u64,
    /// The connection of frame `next`, drawn but not yet sent.
    pending: Option<u32>,
}

impl Sender {
    fn new(stream: Stream, side: Side, direction: Direction, start: u64) -> Sender {
        let (permutation, seed) = match stream.pick {
            Pick::Enumerate { conns, seed } => (Some(Permutation::new(u64::from(conns), seed)), seed),
            Pick::Random { seed, .. } | Pick::Mix { seed, .. } => (None, seed),
        };
        Sender { stream, side, direction, schedule: Schedule::new(start, stream.rate, stream.burst), next: 0, permutation, rng: Rng::new(seed), opened: 0, pending: None }
    }

    fn finished(&self) -> bool {
        self.next >= self.stream.frames
    }

    /// The connection frame `k` uses.
    fn conn(&mut self, k: u64) -> u32 {
        match self.stream.pick {
            Pick::Enumerate { conns, .. } => self.permutation.as_ref().map_or(0, |p| p.get(k % u64::from(conns.max(1)))) as u32,
            Pick::Random { conns, .. } => self.rng.below(conns.max(1)),
            Pick::Mix { established, first_new, new_share, .. } => {
                // Frame k opens a connection when the running count of
                // new ones, k * share, passes an integer: exactly the share.
                let due_new = ((k + 1) as f64 * new_share) as u64;
                if due_new > self.opened || established == 0 {
                    self.opened += 1;
                    first_new + (self.opened - 1) as u32
                } else {
                    self.rng.below(established)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Arp;
    use natrix_io::{MemoryPeer, MemoryPort};
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;
    use std::time::Duration;

    /// 100 frames at 1,000 a second in bursts of 10 leave in 10 bursts,
    /// the last 90 ms after the first: the rate is 1,000, where counting
    /// gaps between frames would make it 1,100.
    #[test]
    fn a_bursty_streams_rate_counts_whole_bursts() {
        assert_eq!(rate_between(100, 10, 0, 90_000_000), 1000.0);
        assert_eq!(rate_between(100, 1, 0, 99_000_000), 1000.0);
        assert_eq!(rate_between(100, 0, 0, 99_000_000), 1000.0, "0 is one at a time");
        assert_eq!(rate_between(10, 10, 0, 5), 0.0, "one burst tells no rate");
    }

    const TESTER_IN: [u8; 6] = [2, 0, 0, 0, 1, 1];
    const TESTER_OUT: [u8; 6] = [2, 0, 0, 0, 1, 2];
    const NAT_IN: [u8; 6] = [2, 0, 0, 0, 2, 1];
    const NAT_OUT: [u8; 6] = [2, 0, 0, 0, 2, 2];
    const EXTERNAL: u32 = 0xcb00_7101;

    fn flows() -> FlowSpace {
        FlowSpace { first_subscriber: 0x6440_0101, subscribers: 4, first_sport: 1024, server: 0xc633_6415, first_dport: 5001, dports: 8 }
    }

    /// A NAPT on a thread between the two memory links: one external
    /// address, ports handed out in order, TTL decremented; it drops every
    /// `drop_every`-th forward frame (0: none).
    struct FakeNapt {
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl FakeNapt {
        fn start(inside: MemoryPeer, outside: MemoryPeer, drop_every: u64) -> FakeNapt {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            let thread = std::thread::spawn(move || {
                let (mut out_map, mut in_map) = (HashMap::new(), HashMap::new());
                let mut forwarded = 0u64;
                while !flag.load(Ordering::Relaxed) {
                    let (up, down) = (inside.take_sent(), outside.take_sent());
                    for f in &up {
                        forwarded += 1;
                        if drop_every > 0 && forwarded.is_multiple_of(drop_every) {
                            continue;
                        }
                        if let Some(t) = translate_out(f, &mut out_map, &mut in_map) {
                            outside.inject(&t);
                        }
                    }
                    for f in &down {
                        if let Some(t) = translate_in(f, &in_map) {
                            inside.inject(&t);
                        }
                    }
                    if up.is_empty() && down.is_empty() {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            });
            FakeNapt { stop, thread: Some(thread) }
        }
    }

    impl Drop for FakeNapt {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn forwarded(mut f: Vec<u8>, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
        f[0..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&src_mac);
        f[22] -= 1;
        // RFC 1624: the TTL's word went down by 0x0100.
        let c = u16::from_be_bytes([f[24], f[25]]);
        let sum = u32::from(c) + 0x0100;
        f[24..26].copy_from_slice(&(((sum & 0xffff) + (sum >> 16)) as u16).to_be_bytes());
        f
    }

    fn translate_out(f: &[u8], out_map: &mut HashMap<(u32, u16), u16>, in_map: &mut HashMap<u16, (u32, u16)>) -> Option<Vec<u8>> {
        let (ip, sport, dport, tag, tcp) = match frame::parse(f) {
            Received::Udp(u) => (u.ip, u.sport, u.dport, u.tag, None),
            Received::Tcp(t) => (t.ip, t.sport, t.dport, None, Some((t.flags, t.seq, t.ack))),
            _ => return None,
        };
        let next = 20_000 + out_map.len() as u16;
        let ext = *out_map.entry((ip.src, sport)).or_insert(next);
        in_map.insert(ext, (ip.src, sport));
        let ep = Endpoints { src_mac: TESTER_IN, dst_mac: NAT_IN, src: EXTERNAL, sport: ext, dst: ip.dst, dport };
        let mut g = f.to_vec();
        match (tag, tcp) {
            (Some(tag), _) => frame::write_udp(&mut g, &ep, &tag),
            (None, Some((flags, seq, ack))) => frame::write_tcp((&mut g[..60]).try_into().unwrap(), &ep, flags, seq, ack),
            _ => return None,
        }
        Some(forwarded(g, NAT_OUT, TESTER_OUT))
    }

    fn translate_in(f: &[u8], in_map: &HashMap<u16, (u32, u16)>) -> Option<Vec<u8>> {
        let (ip, sport, dport, tag, tcp) = match frame::parse(f) {
            Received::Udp(u) => (u.ip, u.sport, u.dport, u.tag, None),
            Received::Tcp(t) => (t.ip, t.sport, t.dport, None, Some((t.flags, t.seq, t.ack))),
            _ => return None,
        };
        if ip.dst != EXTERNAL {
            return None;
        }
        let &(sub, port) = in_map.get(&dport)?;
        let ep = Endpoints { src_mac: TESTER_OUT, dst_mac: NAT_OUT, src: ip.src, sport, dst: sub, dport: port };
        let mut g = f.to_vec();
        match (tag, tcp) {
            (Some(tag), _) => frame::write_udp(&mut g, &ep, &tag),
            (None, Some((flags, seq, ack))) => frame::write_tcp((&mut g[..60]).try_into().unwrap(), &ep, flags, seq, ack),
            _ => return None,
        }
        Some(forwarded(g, NAT_IN, TESTER_IN))
    }

    fn lab(drop_every: u64) -> (Tester, FakeNapt) {
        let (ip, ipeer) = MemoryPort::pair().unwrap();
        let (rp, rpeer) = MemoryPort::pair().unwrap();
        let f = flows();
        let initiator = Link { port: Box::new(ip), mac: TESTER_IN, gateway_mac: NAT_IN, answers_arp_for: vec![AddrRange { first: f.first_subscriber, count: f.subscribers }] };
        let responder = Link { port: Box::new(rp), mac: TESTER_OUT, gateway_mac: NAT_OUT, answers_arp_for: vec![AddrRange::single(f.server)] };
        (Tester::new(initiator, responder, f, Expect::NAT), FakeNapt::start(ipeer, rpeer, drop_every))
    }

    fn stream(pick: Pick, frames: u64) -> Stream {
        Stream { pick, rate: Rate::pps(200_000.0), frames, burst: 1 }
    }

    fn preliminary_plan(conns: u32) -> TrialPlan {
        let mut plan = TrialPlan::new(Kind::Udp { frame_size: 64 });
        plan.forward = Some(stream(Pick::Enumerate { conns, seed: 3 }, u64::from(conns)));
        plan.learn = true;
        plan.drain_ns = 2_000_000_000;
        plan
    }

    #[test]
    fn the_preliminary_phase_learns_every_connection_and_validation_reaches_each() {
        let (mut t, _nat) = lab(0);
        let o = t.run(&preliminary_plan(500)).unwrap();
        assert_eq!((o.forward.sent, o.forward.received, o.learned), (500, 500, 500));
        assert_eq!(o.problems, Problems::default());
        assert_eq!(t.learned_among(500), 500);
        let mut check = TrialPlan::new(Kind::Udp { frame_size: 64 });
        check.reverse = Some(stream(Pick::Enumerate { conns: 500, seed: 4 }, 500));
        check.drain_ns = 2_000_000_000;
        let o = t.run(&check).unwrap();
        assert_eq!((o.reverse.sent, o.reverse.received, o.unlearned), (500, 500, 0));
        assert_eq!(o.problems, Problems::default());
    }

    #[test]
    fn losses_are_counted_and_latencies_kept() {
        let (mut t, _nat) = lab(10);
        t.run(&preliminary_plan(64)).unwrap();
        let mut plan = TrialPlan::new(Kind::Udp { frame_size: 1518 });
        plan.forward = Some(stream(Pick::Random { conns: 64, seed: 5 }, 1000));
        plan.keep_latencies = true;
        plan.drain_ns = 300_000_000;
        let o = t.run(&plan).unwrap();
        assert_eq!(o.forward.sent, 1000);
        // The preliminary phase's 64 frames were the first 64 the NAT saw:
        // it drops every tenth frame counting from there.
        assert_eq!(o.forward.received, 1000 - ((64 + 1000) / 10 - 64 / 10));
        assert_eq!(o.forward.latencies_ns.len() as u64, o.forward.received);
        assert_eq!(o.forward.payload_bytes, o.forward.received * (1514 - 42));
        assert_eq!(o.problems, Problems::default());
    }

    #[test]
    fn reflected_frames_come_back_for_round_trip_times() {
        let (mut t, _nat) = lab(0);
        t.run(&preliminary_plan(64)).unwrap();
        let mut plan = TrialPlan::new(Kind::Udp { frame_size: 132 });
        plan.forward = Some(stream(Pick::Random { conns: 64, seed: 6 }, 300));
        plan.reflect = true;
        plan.keep_latencies = true;
        plan.drain_ns = 2_000_000_000;
        let o = t.run(&plan).unwrap();
        assert_eq!((o.forward.received, o.returned.received, o.returned.latencies_ns.len()), (300, 300, 300));
    }

    #[test]
    fn syns_are_answered_by_the_responder() {
        let (mut t, _nat) = lab(0);
        let mut plan = TrialPlan::new(Kind::Syn);
        plan.forward = Some(Stream { pick: Pick::Enumerate { conns: 200, seed: 7 }, rate: Rate::pps(100_000.0), frames: 200, burst: 25 });
        plan.answer_syn = true;
        plan.keep_latencies = true;
        plan.drain_ns = 2_000_000_000;
        let o = t.run(&plan).unwrap();
        assert_eq!((o.forward.sent, o.forward.received, o.returned.received), (200, 200, 200));
        assert_eq!(o.problems, Problems::default());
    }

    #[test]
    fn a_mix_opens_the_asked_share_of_new_connections() {
        let mut s = Sender::new(
            Stream { pick: Pick::Mix { established: 100, first_new: 1000, new_share: 0.25, seed: 1 }, rate: Rate::pps(1.0), frames: 400, burst: 1 },
            Side::Initiator,
            Direction::Forward,
            0,
        );
        let conns: Vec<u32> = (0..400).map(|k| s.conn(k)).collect();
        let new: Vec<u32> = conns.iter().copied().filter(|&c| c >= 1000).collect();
        assert_eq!(new.len(), 100);
        assert_eq!(new, (1000..1100).collect::<Vec<_>>());
        assert!(conns.iter().all(|&c| !(100..1000).contains(&c)));
    }

    #[test]
    fn a_full_transmit_ring_does_not_skip_new_connections() {
        // A ring of 3 frames against batches of 32: most sends are refused
        // and tried again; the frames that go out still open exactly the
        // asked share of new connections, each once and in order.
        let (ip, ipeer) = MemoryPort::pair().unwrap();
        let initiator = Link { port: Box::new(ip.with_tx_capacity(3)), mac: TESTER_IN, gateway_mac: NAT_IN, answers_arp_for: vec![] };
        let nowhere = Link { port: Box::new(crate::ports::Unconnected), mac: TESTER_OUT, gateway_mac: NAT_OUT, answers_arp_for: vec![] };
        let mut t = Tester::new(initiator, nowhere, flows(), Expect::NAT);
        let mut plan = TrialPlan::new(Kind::Udp { frame_size: 64 });
        plan.forward = Some(Stream { pick: Pick::Mix { established: 100, first_new: 1000, new_share: 0.25, seed: 1 }, rate: Rate::pps(10_000_000.0), frames: 400, burst: 1 });
        plan.drain_ns = 0;
        let o = t.run(&plan).unwrap();
        assert!(o.tx_full > 0, "the ring never filled");
        let conns: Vec<u32> = ipeer
            .take_sent()
            .iter()
            .filter_map(|f| match frame::parse(f) {
                Received::Udp(u) => u.tag.map(|tag| tag.conn),
                _ => None,
            })
            .collect();
        assert_eq!(conns.len(), 400);
        let new: Vec<u32> = conns.into_iter().filter(|&c| c >= 1000).collect();
        assert_eq!(new, (1000..1100).collect::<Vec<_>>());
    }

    #[test]
    fn arp_requests_for_simulated_addresses_are_answered_and_others_not() {
        let (ip, ipeer) = MemoryPort::pair().unwrap();
        let (rp, _rpeer) = MemoryPort::pair().unwrap();
        let f = flows();
        let initiator = Link { port: Box::new(ip), mac: TESTER_IN, gateway_mac: NAT_IN, answers_arp_for: vec![AddrRange { first: f.first_subscriber, count: f.subscribers }] };
        let responder = Link { port: Box::new(rp), mac: TESTER_OUT, gateway_mac: NAT_OUT, answers_arp_for: vec![] };
        let mut t = Tester::new(initiator, responder, f, Expect::NAT);
        for target in [0x6440_0102, 0x6440_0002] {
            let req = frame::arp_request(NAT_IN, 0x6440_0001, target);
            assert_eq!(frame::parse(&req), Received::ArpRequest(Arp { sender_mac: NAT_IN, sender: 0x6440_0001, target }));
            ipeer.inject(&req);
        }
        let mut plan = TrialPlan::new(Kind::Udp { frame_size: 64 });
        plan.forward = Some(stream(Pick::Random { conns: 1, seed: 1 }, 1));
        plan.drain_ns = 20_000_000;
        t.run(&plan).unwrap();
        let replies: Vec<Vec<u8>> = ipeer.take_sent().into_iter().filter(|f| f[12..14] == [8, 6]).collect();
        assert_eq!(replies.len(), 1, "only the simulated subscriber is answered for");
        assert_eq!((&replies[0][0..6], &replies[0][22..28], &replies[0][28..32]), (&NAT_IN[..], &TESTER_IN[..], &[100, 64, 1, 2][..]));
    }

    #[test]
    fn rendering_stamps_each_frame_with_its_due_time() {
        let stream = Stream { pick: Pick::Random { conns: 10, seed: 1 }, rate: Rate::pps(1000.0), frames: 5, burst: 1 };
        let mut seen = Vec::new();
        render(Kind::Udp { frame_size: 128 }, stream, flows(), (TESTER_IN, NAT_IN), 7, |t, f| {
            seen.push((t, f.len(), frame::parse(f)));
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![7, 1_000_007, 2_000_007, 3_000_007, 4_000_007]);
        for (t, len, parsed) in seen {
            let Received::Udp(u) = parsed else { panic!("not UDP") };
            assert!(u.valid && u.ip.valid && len == 124);
            assert_eq!(u.tag.map(|tag| tag.stamp_ns), Some(t));
        }
    }
}
