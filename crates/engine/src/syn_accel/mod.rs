//! The SYN accelerator of seed 003 (its "TCP hacker"): a caller connecting
//! to a configured destination learns in about two seconds, instead of the
//! 30 to 90 its own stack would take, that the server is unreachable.
//! natrix forwards the caller's first SYN at once, sends byte copies of it
//! on its own fast schedule (`interval`, up to `attempts` SYNs in all),
//! absorbs the caller's own retransmissions, and at `deadline` resets the caller as if the server had
//! refused (RFC 9293 section 3.10.7.1). What the caller in SYN-SENT would
//! act on ends tracking and passes through: the server's SYN-ACK or RST
//! acknowledging the SYN, a SYN from the server (a simultaneous open), an
//! ICMP error about the SYN that every stack gives up on, the caller's own
//! RST; after the handshake the connection is never looked at again.
//!
//! ```text
//!  caller SYN ──> before translation: new attempt? (staged) or a retransmission (absorbed: syn_absorbed)
//!             ──> NAPT44 (or routing only) ──> after translation: the SYN as it leaves is kept (the copy)
//!  timers ──────> copy at first + k x interval (k = 1 .. attempts-1, before the deadline), RST at the deadline
//!  server SYN-ACK or RST acknowledging the SYN, server SYN, ICMP error about it
//!             ──> after translation (the caller's own addresses): tracking ends, the frame passes
//! ```
//!
//! Two pipeline points, one decision: the function decides on the frame as
//! it arrived inside (the caller's own addresses and ports, which its
//! retransmissions and the server's answers after translation carry), and
//! keeps the same frame as it leaves, translated, as the copy it sends
//! again. A frame refused between the two points (a quota, an exhausted
//! pool) leaves nothing behind: what was staged before translation is
//! dropped by the next frame. The copy is taken before the router's TTL
//! decrement, which is applied to it the same way, so a copy is the caller's
//! first SYN byte for byte as natrix forwarded it.
//!
//! Sharding: each worker's engine has its own accelerator and table.
//! Steering already brings both directions of a connection to one worker
//! (the subscriber's, by its address outbound and its external port
//! inbound; in router mode the inside host's address both ways), as seed
//! 003 section 4.4.1 asks of several "SYN hackers".
//!
//! Memory: each pending attempt is one 192-byte record (the copy of the SYN,
//! up to 128 bytes of frame, and its schedule) plus its slot in an index
//! reserved up front at about 9 bytes per attempt of capacity
//! (`nat.max_sessions` attempts per worker); an attempt answered or reset
//! keeps its record until its timer next fires (at most one interval, or
//! the time to the deadline), then the record is reused. Records are
//! allocated as they are needed, up to twice the capacity
//! (`bytes_under_load`, which `natrix check-config` reports).
//!
//! Timers: the shared seconds wheel (`state::timers::Wheel`) holds attempts
//! due in a later second; the current second is split into 1000 one-millisecond
//! slots. Arming and expiry are O(1) (seed 003 section 4.3.3 names its
//! sorted timer queue as its bottleneck). A slot runs once it has ended, so
//! a copy or reset leaves at most a millisecond after it falls due and is
//! stamped with the exact time it fell due (in replay, the capture's
//! clock); within a slot, timers run in the order they were armed.

mod attempts;
mod learned;
mod reset;
mod timers;

use natrix_wire::tcp;

use crate::config::{EngineConfig, Exemption};
use crate::drop::DropReason;
use crate::error::EngineError;
use crate::pipeline::hooks::{Emitter, FrameInfo, HookVerdict, Hooks, Interest, Middlebox, Point};
use crate::pipeline::Stats;
use crate::Side;

use attempts::{Attempt, Attempts, Key, State};

/// How long a refused attempt stays indexed after its reset: a caller's
/// retransmission already in flight (Linux retransmits a SYN every second
/// at first, so one may cross the reset) is absorbed, not forwarded as new.
const REFUSED_GRACE_NS: u64 = 1_000_000_000;
use learned::Learned;
use timers::Timers;

const MS: u64 = 1_000_000;

/// A destination whose connection attempts are accelerated: a prefix and a
/// port range, written as `[nat] exempt` entries are ("198.51.100.7/32:5060").
pub type Destination = Exemption;

/// `[syn_accel] interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    /// The same for every destination.
    Fixed { ns: u64 },
    /// `"rtt"`: 1.5 times the handshake time learned per destination (seed
    /// 003 section 3.6.2), `DEFAULT_INTERVAL_NS` until one is learned.
    Learned,
}

/// `[syn_accel] deadline`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    Fixed {
        ns: u64,
    },
    /// The default with `interval = "rtt"`: `attempts` x the attempt's interval.
    AttemptsTimesInterval,
}

/// The accelerator's configuration, as the control plane validated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynAccelConfig {
    /// Never empty: an empty list turns the accelerator off (no config at all).
    pub destinations: Vec<Destination>,
    pub interval: Interval,
    /// SYNs sent in all, the caller's first included (at least 1).
    pub attempts: u8,
    pub deadline: Deadline,
}

impl SynAccelConfig {
    /// Seed 003 section 4.3.3: 500 ms between attempts, 4 SYNs (the
    /// prototype's 3 retransmissions), a reset after 2 s.
    pub const DEFAULT_INTERVAL_NS: u64 = 500 * MS;
    pub const DEFAULT_ATTEMPTS: u8 = 4;
    pub const DEFAULT_DEADLINE_NS: u64 = 2_000 * MS;
    /// natrix's floor under any interval: a path of microseconds (a lab, a
    /// data centre) must not turn into a SYN every few microseconds, nor a
    /// configuration into a flood of copies (seed 003 section 3.6.1 warns
    /// of the congestion more frequent SYNs may cause).
    pub const MIN_INTERVAL_NS: u64 = 10 * MS;
    /// The longest deadline (and interval): a minute, far beyond what the
    /// accelerator is for, and within its timer wheel's span.
    pub const MAX_DEADLINE_NS: u64 = timers::MAX_AHEAD_NS;

    fn wants(&self, server: u32, port: u16) -> bool {
        self.destinations.iter().any(|d| d.matches(server, port))
    }
}

/// Handshake-time histogram buckets (upper bounds, seconds), for metrics.
pub const HANDSHAKE_BUCKETS_S: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The time from a caller's first SYN to the server's answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HandshakeHistogram {
    /// Answers per bucket of `HANDSHAKE_BUCKETS_S` (not cumulative); the
    /// last counts those above the largest bound.
    pub buckets: [u64; HANDSHAKE_BUCKETS_S.len() + 1],
    pub sum_ns: u64,
    pub count: u64,
}

impl HandshakeHistogram {
    fn observe(&mut self, ns: u64) {
        let s = ns as f64 / 1e9;
        let i = HANDSHAKE_BUCKETS_S.iter().position(|&b| s <= b).unwrap_or(HANDSHAKE_BUCKETS_S.len());
        self.buckets[i] += 1;
        self.sum_ns += ns;
        self.count += 1;
    }

    /// Adds another worker's.
    pub fn merge(&mut self, other: &HandshakeHistogram) {
        self.buckets.iter_mut().zip(other.buckets).for_each(|(a, b)| *a += b);
        self.sum_ns += other.sum_ns;
        self.count += other.count;
    }
}

/// A destination's learned handshake time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnedHandshake {
    pub destination: u32,
    /// Smoothed as RFC 6298 smooths a round-trip time (gain 1/8).
    pub handshake_ns: u64,
    pub samples: u32,
}

/// The accelerator's counters (metrics `natrix_synaccel_*`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SynAccelStats {
    /// Callers' first SYNs tracked.
    pub syns: u64,
    /// Copies natrix sent.
    pub retransmits: u64,
    /// Attempts ended before their deadline by an answer: a SYN-ACK or
    /// RST from the server, a simultaneous open, an ICMP error about the
    /// SYN (an attempt its caller gave up with a RST is not counted).
    pub answered: u64,
    /// RSTs natrix sent to callers at the deadline.
    pub resets: u64,
    /// First SYNs to a configured destination passed on untracked: the
    /// table full, or a SYN longer than a record holds (one with data).
    pub untracked: u64,
    /// Attempts being tracked now.
    pub pending: u64,
    pub handshake: HandshakeHistogram,
    /// Learned handshake times, by destination address (ascending).
    pub learned: Vec<LearnedHandshake>,
}

/// Installs the accelerator in `hooks` when `cfg` configures it.
pub(crate) fn install(cfg: &EngineConfig, mut hooks: Hooks) -> Result<Hooks, EngineError> {
    if let Some(accel) = &cfg.syn_accel {
        hooks.add(Box::new(SynAccel::new(accel.clone(), capacity(cfg), cfg.seed)?));
    }
    Ok(hooks)
}

/// Bytes the accelerator `cfg` configures reserves up front (its index).
pub fn reserved_bytes(cfg: &EngineConfig) -> u64 {
    cfg.syn_accel.as_ref().map_or(0, |_| Attempts::reserved_bytes(capacity(cfg)) as u64)
}

/// Bytes the attempts' records may take as they fill, beyond `reserved_bytes`.
pub fn bytes_under_load(cfg: &EngineConfig) -> u64 {
    cfg.syn_accel.as_ref().map_or(0, |_| Attempts::bytes_under_load(capacity(cfg)) as u64)
}

/// Pending attempts per worker: a NAT cannot have more connection attempts
/// open than sessions, and router mode keeps the same default.
fn capacity(cfg: &EngineConfig) -> usize {
    cfg.max_sessions as usize
}

/// A caller's SYN seen before translation, waiting to be seen leaving.
#[derive(Debug, Clone, Copy)]
struct Staged {
    key: Key,
    isn: u32,
    data_len: usize,
    at_ns: u64,
}

/// The TCP facts the accelerator reads from a segment.
struct Segment {
    src_port: u16,
    dst_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    /// Bytes of data it carries (a SYN's, with TCP Fast Open).
    data_len: usize,
}

impl Segment {
    fn read(frame: &[u8], info: &FrameInfo) -> Option<Segment> {
        if info.proto != natrix_wire::proto::TCP {
            return None;
        }
        let t = tcp::Packet::new_checked(frame.get(info.l4..info.l4 + info.l4_len)?).ok()?;
        let data_len = info.l4_len.saturating_sub(t.header_len());
        Some(Segment { src_port: t.src_port(), dst_port: t.dst_port(), seq: t.seq_number(), ack: t.ack_number(), flags: t.flags(), data_len })
    }

    /// A connection's opening SYN: SYN without ACK, RST or FIN.
    fn is_opening_syn(&self) -> bool {
        self.flags & (tcp::flags::SYN | tcp::flags::ACK | tcp::flags::RST | tcp::flags::FIN) == tcp::flags::SYN
    }

    /// What the server's segment means to attempt `a`'s caller in SYN-SENT
    /// (RFC 9293 section 3.10.7.3): a SYN-ACK or a RST whose ACK
    /// acknowledges the SYN answers it; a SYN alone is a simultaneous open,
    /// after which the caller needs no copy; anything else (a RST without
    /// ACK, an ACK of an older attempt's SYN) the caller ignores.
    fn answers(&self, a: &Attempt) -> Option<Answer> {
        let acked = self.flags & tcp::flags::ACK != 0 && a.acknowledged_by(self.ack);
        if self.flags & tcp::flags::RST != 0 {
            acked.then_some(Answer::Server)
        } else if self.flags & tcp::flags::SYN == 0 {
            None
        } else if self.flags & tcp::flags::ACK == 0 {
            Some(Answer::Other)
        } else {
            acked.then_some(Answer::Server)
        }
    }
}

/// What ended an attempt before its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A SYN-ACK or RST: its time is a handshake time.
    Server,
    /// A simultaneous open, an ICMP error about the SYN that makes the
    /// caller give up (a router's, or the server host's), the caller's RST.
    Other,
}

/// An ICMP error about a SYN that every stack in SYN-SENT gives up on: a
/// destination unreachable of RFC 1122 section 4.2.3.9's hard kind
/// (protocol or port unreachable) or an administrative prohibition (RFC
/// 1812's codes 9, 10 and 13). The soft ones (network or host unreachable,
/// time exceeded) a caller following RFC 1122 keeps retrying through, so
/// the attempt goes on to its reset. Returns the quoted segment's
/// endpoints, as the caller sent it, and its sequence number.
fn icmp_error_about(frame: &[u8], info: &FrameInfo) -> Option<(Key, u32)> {
    const UNREACHABLE: u8 = 3;
    const HARD: [u8; 5] = [2, 3, 9, 10, 13];
    let icmp = frame.get(info.l4..info.l4 + info.l4_len)?;
    if *icmp.first()? != UNREACHABLE || !HARD.contains(icmp.get(1)?) {
        return None;
    }
    let quote = natrix_wire::ipv4::Packet::new_lax(icmp.get(8..)?).ok()?;
    if quote.protocol() != natrix_wire::proto::TCP {
        return None;
    }
    let t = icmp.get(8 + quote.header_len()..8 + quote.header_len() + 8)?;
    let key = Key { caller: quote.src_addr(), server: quote.dst_addr(), caller_port: u16::from_be_bytes([t[0], t[1]]), server_port: u16::from_be_bytes([t[2], t[3]]) };
    Some((key, u32::from_be_bytes([t[4], t[5], t[6], t[7]])))
}

/// The endpoints of an untagged Ethernet/IPv4/TCP frame, read without
/// checks beyond the lengths (for a prefetch; the pipeline's parse judges).
fn caller_key(frame: &[u8]) -> Option<Key> {
    const L3: usize = natrix_wire::ethernet::HEADER_LEN;
    let ip = natrix_wire::ipv4::Packet::new_lax(frame.get(L3..)?).ok()?;
    if ip.protocol() != natrix_wire::proto::TCP {
        return None;
    }
    let l4 = L3 + ip.header_len();
    let ports = frame.get(l4..l4 + 4)?;
    Some(Key { caller: ip.src_addr(), server: ip.dst_addr(), caller_port: u16::from_be_bytes([ports[0], ports[1]]), server_port: u16::from_be_bytes([ports[2], ports[3]]) })
}

pub struct SynAccel {
    cfg: SynAccelConfig,
    attempts: Attempts,
    timers: Timers,
    learned: Learned,
    staged: Option<Staged>,
    /// Attempts whose timers fell due, reused between runs.
    due: Vec<u32>,
    stats: SynAccelStats,
}

impl SynAccel {
    pub fn new(cfg: SynAccelConfig, capacity: usize, seed: u64) -> Result<SynAccel, EngineError> {
        Ok(SynAccel {
            cfg,
            attempts: Attempts::new(capacity, seed)?,
            timers: Timers::new(),
            learned: Learned::default(),
            staged: None,
            due: Vec::new(),
            stats: SynAccelStats::default(),
        })
    }

    /// A segment from the caller, before translation: a retransmission of a
    /// tracked SYN is absorbed (seed 003 section 4.2.3: "should be
    /// ignored"); an opening SYN to a configured destination is staged, to
    /// be kept as it leaves, unless it is a fragment; the caller's own
    /// RST, in its attempt's sequence space, ends its attempt.
    fn on_caller_segment(&mut self, frame: &[u8], info: &FrameInfo) -> HookVerdict {
        let Some(seg) = Segment::read(frame, info) else { return HookVerdict::Continue };
        let key = Key { caller: info.src, caller_port: seg.src_port, server: info.dst, server_port: seg.dst_port };
        if seg.flags & tcp::flags::RST != 0 {
            self.end_attempt(key, info.now_ns, |a| a.acknowledged_by(seg.seq).then_some(Answer::Other));
            return HookVerdict::Continue;
        }
        if !seg.is_opening_syn() || !self.cfg.wants(key.server, key.server_port) {
            return HookVerdict::Continue;
        }
        if let Some(id) = self.attempts.find(&key) {
            let a = self.attempts.get(id);
            match a.state {
                State::Live | State::Refused if a.isn == seg.seq => return HookVerdict::Drop(DropReason::SynAbsorbed),
                // Its SYN-ACK is on its way: the crossing retransmission passes untracked.
                State::Answered if a.isn == seg.seq => return HookVerdict::Continue,
                // The same endpoints with a new ISN: a new attempt replaces the old.
                _ => self.attempts.retire(id),
            }
        }
        // A copy of a lone first fragment would never reassemble.
        if !(info.first_frag || info.later_frag) {
            self.staged = Some(Staged { key, isn: seg.seq, data_len: seg.data_len, at_ns: info.now_ns });
        }
        HookVerdict::Continue
    }

    /// The staged SYN leaving outside, translated: it becomes a tracked
    /// attempt, with this frame (TTL as the router leaves it) as its copy.
    fn keep_forwarded(&mut self, frame: &[u8], info: &FrameInfo) {
        let Some(staged) = self.staged.take() else { return };
        let Some(seg) = Segment::read(frame, info) else { return };
        let same = seg.is_opening_syn() && seg.seq == staged.isn && info.dst == staged.key.server && seg.dst_port == staged.key.server_port;
        if !same {
            return;
        }
        let (interval_ns, deadline_ns) = self.schedule_for(staged.key.server);
        let mut a = Attempt::new(staged.key, staged.isn, self.cfg.attempts, staged.at_ns, interval_ns, staged.at_ns + deadline_ns);
        if !a.keep_copy(frame, info.l3, staged.data_len) {
            self.stats.untracked += 1;
            return;
        }
        a.due_ns = a.next_due();
        let due = a.due_ns;
        self.timers.catch_up_idle(info.now_ns);
        match self.attempts.insert(a) {
            Some(id) => {
                self.timers.arm(id, due);
                self.stats.syns += 1;
            }
            None => self.stats.untracked += 1,
        }
    }

    /// A segment leaving towards a caller, translated back to its own
    /// addresses: the server's answer, or a simultaneous open, ends the
    /// attempt; an answer to the first SYN alone is a handshake time.
    fn on_server_segment(&mut self, frame: &[u8], info: &FrameInfo) {
        let Some(seg) = Segment::read(frame, info) else { return };
        let key = Key { caller: info.dst, caller_port: seg.dst_port, server: info.src, server_port: seg.src_port };
        let Some((answer, handshake_ns, first_syn_only)) = self.end_attempt(key, info.now_ns, |a| seg.answers(a)) else { return };
        self.stats.answered += 1;
        if answer == Answer::Server {
            self.stats.handshake.observe(handshake_ns);
            // Karn's rule: once a copy went out, an answer may be to either SYN.
            if first_syn_only {
                self.learned.sample(key.server, handshake_ns);
            }
        }
    }

    /// An ICMP error leaving towards a caller about its tracked SYN, after
    /// which its stack gives up the connection: nothing more is sent for it.
    fn on_icmp_error(&mut self, frame: &[u8], info: &FrameInfo) {
        let Some((key, seq)) = icmp_error_about(frame, info) else { return };
        if self.end_attempt(key, info.now_ns, |a| (a.isn == seq).then_some(Answer::Other)).is_some() {
            self.stats.answered += 1;
        }
    }

    /// Ends the live attempt of `key` at `now_ns` if `ends` says what ends
    /// it; its record stays, answered, until its timer fires, and what fell
    /// due by then (a copy, or the reset once the deadline has passed) is
    /// still sent. Returns, for an attempt ended before its deadline, what
    /// ended it, how long it waited and whether only the first SYN had
    /// gone out.
    fn end_attempt(&mut self, key: Key, now_ns: u64, ends: impl FnOnce(&Attempt) -> Option<Answer>) -> Option<(Answer, u64, bool)> {
        let id = self.attempts.find(&key)?;
        let a = self.attempts.get(id);
        if a.state != State::Live {
            return None;
        }
        let answer = ends(a)?;
        let in_time = now_ns < a.deadline_ns;
        let ended = (answer, now_ns.saturating_sub(a.first_ns), a.first_syn_only(now_ns));
        self.attempts.answer(id, now_ns);
        in_time.then_some(ended)
    }

    /// This attempt's interval and how long after the first SYN its deadline falls.
    fn schedule_for(&self, server: u32) -> (u64, u64) {
        let interval = match self.cfg.interval {
            Interval::Fixed { ns } => ns,
            Interval::Learned => self.learned.interval(server).unwrap_or(SynAccelConfig::DEFAULT_INTERVAL_NS),
        };
        let deadline = match self.cfg.deadline {
            Deadline::Fixed { ns } => ns,
            Deadline::AttemptsTimesInterval => u64::from(self.cfg.attempts) * interval,
        };
        // A learned interval can be long; no timer waits past the wheel's span.
        (interval, deadline.min(SynAccelConfig::MAX_DEADLINE_NS))
    }

    /// Runs every timer due by `now_ns`.
    fn run_timers(&mut self, now_ns: u64, out: &mut Emitter) {
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        self.timers.expire(now_ns, &mut due);
        // The records (and the index lines of those about to end) are
        // fetched a few timers ahead: one at a time, each is a memory miss.
        const AHEAD: usize = 8;
        for (i, &id) in due.iter().enumerate() {
            if let Some(&later) = due.get(i + AHEAD) {
                self.attempts.prefetch(later);
            }
            if let Some(&soon) = due.get(i + AHEAD / 2) {
                self.attempts.prefetch_index_if_ending(soon);
            }
            self.fire(id, now_ns, out);
        }
        self.due = due;
    }

    /// An attempt's timer fell due: the copy or the reset it owes (one that
    /// fell due before any answer), or its record back once it owes nothing.
    /// What falls due again by `now_ns` (time that jumped, as between the
    /// frames of a sparse capture) is sent at once, each stamped with its
    /// own time, before anything else can touch the attempt.
    fn fire(&mut self, id: u32, now_ns: u64, out: &mut Emitter) {
        loop {
            let a = self.attempts.get_mut(id);
            let owed = matches!(a.state, State::Live | State::Answered) && a.due_ns <= a.answered_ns;
            let next = match (owed, a.copies_left()) {
                (true, true) => {
                    out.send_copy(Side::Outside, a.due_ns, a.copy());
                    a.sent += 1;
                    a.due_ns = a.next_due();
                    self.stats.retransmits += 1;
                    a.due_ns
                }
                (true, false) if a.state == State::Live => {
                    self.learned.back_off(a.key.server);
                    let at = a.deadline_ns;
                    out.send_built(Side::Inside, at, |buf, ident| reset::refusal(buf, a, ident));
                    a.due_ns = at + REFUSED_GRACE_NS;
                    let until = a.due_ns;
                    self.stats.resets += 1;
                    self.attempts.refuse(id);
                    until
                }
                (true, false) => {
                    let at = a.deadline_ns;
                    out.send_built(Side::Inside, at, |buf, ident| reset::refusal(buf, a, ident));
                    self.stats.resets += 1;
                    self.attempts.release(id);
                    return;
                }
                (false, _) => {
                    self.attempts.release(id);
                    return;
                }
            };
            if next > now_ns {
                self.timers.arm(id, next);
                return;
            }
        }
    }
}

impl Middlebox for SynAccel {
    fn point(&self) -> Point {
        Point::Both
    }

    /// SYNs (the callers' and the servers' SYN-ACKs), RSTs and ICMP only:
    /// established traffic keeps NAPT44's fast path.
    fn interest(&self) -> Interest {
        Interest::tcp(tcp::flags::SYN | tcp::flags::RST).with_protocol(natrix_wire::proto::ICMP)
    }

    fn on_frame(&mut self, frame: &mut [u8], info: &FrameInfo) -> HookVerdict {
        match (info.point, info.side) {
            (Point::BeforeTranslation, Side::Inside) => {
                self.staged = None;
                return self.on_caller_segment(frame, info);
            }
            (Point::BeforeTranslation, Side::Outside) => self.staged = None,
            (_, Side::Outside) => self.keep_forwarded(frame, info),
            (_, Side::Inside) if info.proto == natrix_wire::proto::ICMP => self.on_icmp_error(frame, info),
            (_, Side::Inside) => self.on_server_segment(frame, info),
        }
        HookVerdict::Continue
    }

    fn prefetches(&self) -> bool {
        true
    }

    /// A caller's SYN in a batch: its index line, which `on_caller_segment` reads.
    fn prefetch(&self, frame: &[u8], side: Side) {
        if side == Side::Inside {
            if let Some(key) = caller_key(frame) {
                self.attempts.prefetch_key(&key);
            }
        }
    }

    fn next_wake_ns(&self) -> u64 {
        self.timers.next_wake_ns()
    }

    fn on_time(&mut self, now_ns: u64, out: &mut Emitter) {
        self.run_timers(now_ns, out);
    }

    /// Every pending attempt runs to its end (copies, then the reset), as
    /// if the capture had gone on without an answer.
    fn finish(&mut self, out: &mut Emitter) {
        self.staged = None;
        while !self.timers.is_empty() {
            let now = self.timers.next_wake_ns();
            self.run_timers(now, out);
        }
    }

    /// New destinations, interval, attempts and deadline: for the
    /// attempts that start from now on (one under way keeps its timers).
    fn reconfigure(&mut self, cfg: &EngineConfig) {
        if let Some(a) = &cfg.syn_accel {
            self.cfg = a.clone();
        }
    }

    fn add_stats(&self, stats: &mut Stats) {
        let mut s = self.stats.clone();
        s.pending = self.attempts.live() as u64;
        s.learned = self.learned.all();
        stats.syn_accel = Some(s);
    }

    fn memory_bytes(&self) -> usize {
        self.attempts.memory_bytes() + self.timers.memory_bytes() + self.learned.memory_bytes()
    }
}
