//! HOST_ID TCP options (seed 000): natrix, as a CGN, tells servers which
//! subscriber sits behind a shared address by writing HOST_ID_WING,
//! HOST_ID_BOUCADAIR or HOST_ID_ENABLED into the SYNs its subscribers send;
//! in front of servers it applies their policy on those options.
//!
//! ```text
//!  before translation, either side:  SYN (and the client's first ACK after the SYN-ACK: in ACK mode,
//!                                    and in a bump in the wire after an echo of ENABLED)
//!      ──> [[host_id.rule]]: first match accept / log / drop / strip; no match accepts;
//!          a dropped first ACK refuses its connection's later client segments
//!  before translation, inside:       the subscriber's own address and port are staged
//!  after translation, leaving outside (a subscriber's segment):
//!      SYN ──> enabled options verified and corrected in place, others NOPed out,
//!              the missing ones inserted after the host's own (the frame grows)
//!      ACK mode, the first ACK after an echoed ENABLED ──> HOST_ID_BOUCADAIR the same way
//!  after translation, leaving inside (ACK mode): the server's SYN-ACK loses its echo of ENABLED
//!  after translation, a SYN-ACK (ACK mode, or a bump with rules after an echo): remembered for its first ACK
//! ```
//!
//! Values come from the subscriber's addresses as it sent the segment (the
//! staged ones), so NAPT44's rewrite never leaks into them; in router mode
//! (`[nat] mode = "off"`) they are the same. Corrections, removals and
//! strips overwrite bytes in place (NOPs, seed 000 section 8.3), so lengths
//! never shrink; insertion that needs more room asks the pipeline for a
//! longer frame (`HookVerdict::Grow`), in its buffer or in a copy. Options never exceed 40 bytes,
//! nor a segment the link's MTU: what does not fit is not inserted, and counted (`no_room`).
//!
//! Speed: in SYN mode only SYNs are looked at, so established traffic keeps
//! NAPT44's fast path; ACK mode, and a bump in the wire with rules, must see
//! each client's first ACK, so every TCP segment takes the full path there
//! (a bump has no other).

mod ack_mode;
mod options;
mod policy;

use natrix_wire::checksum::Delta;
use natrix_wire::tcp::{self, flags};
use natrix_wire::tcp_options::{self, Layout, Options};

use crate::config::EngineConfig;
use crate::drop::DropReason;
use crate::pipeline::hooks::{FrameInfo, FunctionRecord, HookVerdict, Hooks, Interest, Middlebox, Point};
use crate::pipeline::Stats;
use crate::Side;

use ack_mode::{Connection, Echoed, Waiting};
pub use options::Which;
use options::{Scan, Subscriber, Wanted};
pub use policy::{Action, Rule, RuleOption};

/// `[host_id] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing written; only the rules apply.
    Off,
    /// The enabled options in SYNs (seed 000 figure 5).
    Syn,
    /// HOST_ID_ENABLED in the SYN, HOST_ID_BOUCADAIR in the first ACK after
    /// a SYN-ACK that echoed it (seed 000 figure 6).
    Ack,
}

/// `[host_id] wing_data`: what HOST_ID_WING's 2 bytes carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WingData {
    /// The last 16 bits of the private IPv4 source (seed 000 section 8.4).
    Ipv4Low16,
    /// The internal source port.
    Port,
}

/// `[host_id] boucadair`: HOST_ID_BOUCADAIR's origin (seed 000 section 3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Port,
    Ipv4,
    PortIpv4,
    /// The first 56 bits of a softwire host's B4 (DS-Lite only).
    Ipv6Prefix,
}

impl Origin {
    /// The origin field's value.
    pub fn number(self) -> u8 {
        match self {
            Origin::Port => 0,
            Origin::Ipv4 => 1,
            Origin::PortIpv4 => 2,
            Origin::Ipv6Prefix => 3,
        }
    }
}

/// The options' kind numbers: the draft never got any ("Kind=TBD").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kinds {
    pub wing: u8,
    pub boucadair: u8,
    pub enabled: u8,
}

impl Kinds {
    /// CONTRACTS.md's defaults: unassigned values, for labs.
    pub const DEFAULT: Kinds = Kinds { wing: 200, boucadair: 201, enabled: 202 };
}

/// `[host_id]`, as the control plane validated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdConfig {
    pub mode: Mode,
    /// HOST_ID_WING and what it carries; None: not enabled.
    pub wing: Option<WingData>,
    /// HOST_ID_BOUCADAIR's origin; None: not enabled.
    pub boucadair: Option<Origin>,
    /// BOUCADAIR's lifetime (0 = permanent), a nibble.
    pub lifetime: u8,
    /// HOST_ID_ENABLED in SYNs (always, in ACK mode).
    pub enabled: bool,
    pub kinds: Kinds,
    /// `[[host_id.rule]]`, in order.
    pub rules: Vec<Rule>,
}

impl HostIdConfig {
    /// The largest lifetime: it fills a nibble.
    pub const MAX_LIFETIME: u8 = 15;

    /// Whether it does anything: writes options, or has rules.
    pub fn is_active(&self) -> bool {
        self.mode != Mode::Off || !self.rules.is_empty()
    }
}

/// HOST_ID's counters (report `host_id`, metrics `natrix_host_id_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostIdStats {
    /// Segments natrix inserted options into.
    pub injected: u64,
    /// Enabled options present with wrong content, corrected in place.
    pub corrected: u64,
    /// Options present but not enabled (or malformed), overwritten with NOPs.
    pub removed: u64,
    /// Segments whose missing options did not fit in 40 bytes: passed without them.
    pub no_room: u64,
    /// Segments whose options area is malformed: nothing inserted.
    pub malformed: u64,
    /// ACK mode: servers' echoes of ENABLED removed from SYN-ACKs.
    pub echoes_removed: u64,
    /// ACK mode: first ACKs HOST_ID_BOUCADAIR was written into.
    pub acks_injected: u64,
    /// SYN-ACKs not remembered, the table full: their first ACK gets no
    /// BOUCADAIR and no rule looks at it; and refusals not kept, refusals
    /// holding half the table: the connection's later segments pass.
    pub acks_untracked: u64,
    /// Segments from plain IPv4 subscribers that HOST_ID_BOUCADAIR origin 3
    /// (a B4's prefix) has nothing for: written without BOUCADAIR.
    pub no_b4: u64,
    /// Segments each rule decided, by rule index.
    pub rule_matches: Vec<u64>,
    /// `log` events dropped because the queue was full.
    pub events_lost: u64,
}

impl HostIdStats {
    /// Adds another worker's.
    pub fn merge(&mut self, o: &HostIdStats) {
        self.injected += o.injected;
        self.corrected += o.corrected;
        self.removed += o.removed;
        self.no_room += o.no_room;
        self.malformed += o.malformed;
        self.echoes_removed += o.echoes_removed;
        self.acks_injected += o.acks_injected;
        self.acks_untracked += o.acks_untracked;
        self.no_b4 += o.no_b4;
        self.events_lost += o.events_lost;
        if self.rule_matches.len() < o.rule_matches.len() {
            self.rule_matches.resize(o.rule_matches.len(), 0);
        }
        self.rule_matches.iter_mut().zip(&o.rule_matches).for_each(|(a, b)| *a += b);
    }
}

/// A `log` rule's event: the segment, the option and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIdEvent {
    pub time_ns: u64,
    /// Index of the rule in `[[host_id.rule]]`.
    pub rule: usize,
    pub option: Which,
    /// WING's 2 data bytes or BOUCADAIR's 8 bytes after the length, as the
    /// rules compare them; None for ENABLED or an option of the wrong length.
    pub value: Option<u64>,
    pub side: Side,
    pub src: u32,
    pub src_port: u16,
    pub dst: u32,
    pub dst_port: u16,
}

/// `log` events waiting for the logger, at most.
const EVENT_CAPACITY: usize = 4096;

/// Installs HOST_ID in `hooks` when `cfg` configures it.
pub(crate) fn install(cfg: &EngineConfig, mut hooks: Hooks) -> Hooks {
    if let Some(h) = cfg.host_id.as_ref().filter(|h| h.is_active()) {
        hooks.add(Box::new(HostId::new(h.clone(), echo_capacity(cfg), cfg.translate)));
    }
    hooks
}

/// ACK mode's table holds connections between a SYN-ACK and the first ACK:
/// a small share of the sessions.
fn echo_capacity(cfg: &EngineConfig) -> usize {
    (cfg.max_sessions as usize).clamp(1, 1 << 16)
}

/// The TCP facts HOST_ID reads from a segment.
#[derive(Debug, Clone, Copy)]
struct Segment {
    src_port: u16,
    dst_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    header_len: usize,
}

impl Segment {
    fn read(frame: &[u8], info: &FrameInfo) -> Option<Segment> {
        let t = tcp::Packet::new_checked(frame.get(info.l4..info.l4 + info.l4_len)?).ok()?;
        Some(Segment { src_port: t.src_port(), dst_port: t.dst_port(), seq: t.seq_number(), ack: t.ack_number(), flags: t.flags(), header_len: t.header_len() })
    }

    /// A connection's opening SYN: SYN without ACK, RST or FIN.
    fn is_opening_syn(&self) -> bool {
        self.flags & (flags::SYN | flags::ACK | flags::RST | flags::FIN) == flags::SYN
    }

    fn is_syn_ack(&self) -> bool {
        self.flags & (flags::SYN | flags::ACK | flags::RST) == flags::SYN | flags::ACK
    }

    /// An ACK that may be a client's first: ACK without SYN or RST.
    fn is_plain_ack(&self) -> bool {
        self.flags & (flags::SYN | flags::ACK | flags::RST) == flags::ACK
    }

    fn has_options(&self) -> bool {
        self.header_len > tcp::MIN_HEADER_LEN
    }
}

/// A subscriber's segment seen before translation, waiting to be seen leaving.
#[derive(Debug, Clone, Copy)]
struct Staged {
    subscriber: Subscriber,
    server: u32,
    server_port: u16,
    seq: u32,
    /// ACK mode: the first ACK after the server echoed ENABLED, with the
    /// MSS the server announced.
    first_ack: Option<u16>,
}

pub struct HostId {
    cfg: HostIdConfig,
    stats: HostIdStats,
    staged: Option<Staged>,
    echoed: Echoed,
    events: Vec<HostIdEvent>,
    /// The options `grow` inserts, decided by `on_frame`.
    pending: Wanted,
    /// `pending` goes into a first ACK to a server that announced this MSS.
    pending_first_ack: Option<u16>,
    /// Where `pending` goes: the segment as `enforce` read it.
    pending_at: Layout,
    /// Whether NAPT44 translates (natrix is a CGN, not a bump in the wire).
    translate: bool,
}

impl HostId {
    pub fn new(cfg: HostIdConfig, echo_capacity: usize, translate: bool) -> HostId {
        let stats = HostIdStats { rule_matches: vec![0; cfg.rules.len()], ..HostIdStats::default() };
        HostId {
            cfg,
            stats,
            staged: None,
            echoed: Echoed::new(echo_capacity),
            events: Vec::new(),
            pending: Wanted::default(),
            pending_first_ack: None,
            pending_at: Layout { tcp_at: 0, header_len: 0, options_end: 0, segment_end: 0 },
            translate,
        }
    }

    /// Whether client ACKs are followed: in ACK mode (BOUCADAIR goes into
    /// the first one, and rules judge it), and in a bump in the wire with
    /// rules, where the first ACK carries the BOUCADAIR of a remote CGN in
    /// ACK mode (seed 000 section 3.2.2) to servers that echoed ENABLED.
    /// A CGN in SYN mode with rules leaves them to NAPT44's fast path.
    fn follows_first_acks(&self) -> bool {
        self.cfg.mode == Mode::Ack || (!self.cfg.rules.is_empty() && !self.translate)
    }

    /// The options a subscriber's opening SYN carries, into `pending`: WING
    /// and ENABLED in both modes, BOUCADAIR in SYN mode only (ACK mode puts
    /// it in the first ACK); added in the order they go in. Built where
    /// `grow` reads them, not copied there.
    fn want_syn_options(&mut self, s: Subscriber) {
        self.pending = Wanted::default();
        if let Some(data) = self.cfg.wing {
            self.pending.add(Which::Wing, &options::wing(self.cfg.kinds.wing, data, s));
        }
        if self.cfg.mode == Mode::Syn {
            self.want_boucadair(s);
        }
        if self.cfg.enabled || self.cfg.mode == Mode::Ack {
            self.pending.add(Which::Enabled, &options::enabled(self.cfg.kinds.enabled));
        }
    }

    fn want_first_ack_options(&mut self, s: Subscriber) {
        self.pending = Wanted::default();
        self.want_boucadair(s);
    }

    /// HOST_ID_BOUCADAIR into `pending` when enabled. Origin 3 has nothing
    /// to say about a plain IPv4 subscriber (no B4): the segment goes
    /// without it, counted, and one its host wrote is removed like any
    /// option not wanted.
    #[inline(always)]
    fn want_boucadair(&mut self, s: Subscriber) {
        let Some(origin) = self.cfg.boucadair else { return };
        match options::boucadair(self.cfg.kinds.boucadair, origin, self.cfg.lifetime, s) {
            Some(bytes) => self.pending.add(Which::Boucadair, &bytes),
            None => self.stats.no_b4 += 1,
        }
    }

    /// Seed 000 section 8: the first rule matching a SYN (or, in ACK mode,
    /// the client's first ACK after the SYN-ACK) as it arrived decides it.
    fn apply_policy(&mut self, frame: &mut [u8], info: &FrameInfo, seg: &Segment, first_ack: bool) -> HookVerdict {
        let inspected = seg.is_opening_syn() || (first_ack && seg.has_options());
        if self.cfg.rules.is_empty() || !inspected {
            return HookVerdict::Continue;
        }
        let header = &frame[info.l4..info.l4 + seg.header_len];
        let scan = Scan::of(header, &self.cfg.kinds);
        let Some(d) = policy::decide(&self.cfg.rules, header, &scan) else { return HookVerdict::Continue };
        self.stats.rule_matches[d.rule] += 1;
        let rule = self.cfg.rules[d.rule];
        match rule.action {
            Action::Accept => {}
            Action::Log => {
                let value = options::value_of(header, &d.matched);
                self.log(HostIdEvent {
                    time_ns: info.now_ns,
                    rule: d.rule,
                    option: d.matched.which,
                    value,
                    side: info.side,
                    src: info.src,
                    src_port: seg.src_port,
                    dst: info.dst,
                    dst_port: seg.dst_port,
                });
            }
            Action::Drop => return HookVerdict::Drop(DropReason::HostIdPolicy),
            Action::Strip => {
                let spans = scan.iter().filter(|p| rule.option.covers(p.which)).map(|p| (p.offset(), p.len()));
                nop_out(frame, info.l4, seg.header_len, spans);
            }
        }
        HookVerdict::Continue
    }

    fn log(&mut self, e: HostIdEvent) {
        if self.events.len() < EVENT_CAPACITY {
            self.events.push(e);
        } else {
            self.stats.events_lost += 1;
        }
    }

    /// The connection's SYN-ACK that `seg`, a client's ACK as it arrived,
    /// is the first answer to, or the refusal its connection is under;
    /// None for any other segment. A client's new SYN lifts a refusal (a
    /// RST does not: one the server throws away would lift it too).
    fn take_first_ack(&mut self, info: &FrameInfo, seg: &Segment) -> Option<Waiting> {
        if !self.follows_first_acks() || self.echoed.is_empty() {
            return None;
        }
        let c = client_connection(info, seg);
        if seg.is_opening_syn() {
            self.echoed.forget_refusal(&c);
            return None;
        }
        seg.is_plain_ack().then(|| self.echoed.take(&c, info.now_ns, seg.ack)).flatten()
    }

    /// Seed 000 section 8.5: a connection whose first ACK a rule dropped is
    /// refused as a dropped SYN would have refused it: its later client
    /// segments are dropped too, or its next one would complete the
    /// handshake at the server.
    fn refuse_connection(&mut self, info: &FrameInfo, seg: &Segment) {
        if !self.echoed.refuse(client_connection(info, seg), info.now_ns) {
            self.stats.acks_untracked += 1;
        }
    }

    /// A subscriber's segment before translation: its own address and port,
    /// and in ACK mode whether it is the first ACK after an echo.
    fn stage(&mut self, info: &FrameInfo, seg: &Segment, first_ack: Option<u16>) {
        // A softwire host is its B4 and its own inner address, not the stand-in.
        let subscriber = match info.softwire {
            Some(h) => Subscriber { addr: h.inner, port: seg.src_port, b4: Some(h.b4) },
            None => Subscriber { addr: info.src, port: seg.src_port, b4: None },
        };
        self.staged = Some(Staged { subscriber, server: info.dst, server_port: seg.dst_port, seq: seg.seq, first_ack });
    }

    /// A subscriber's segment leaving outside, translated: the options it
    /// must carry, verified, corrected, removed and inserted.
    fn on_leaving_outside(&mut self, frame: &mut [u8], info: &FrameInfo, seg: &Segment) -> HookVerdict {
        let Some(st) = self.staged.take() else { return HookVerdict::Continue };
        if (st.seq, st.server, st.server_port) != (seg.seq, info.dst, seg.dst_port) {
            return HookVerdict::Continue;
        }
        if seg.is_opening_syn() {
            self.want_syn_options(st.subscriber);
        } else if st.first_ack.is_some() {
            self.want_first_ack_options(st.subscriber);
        } else if self.cfg.mode == Mode::Ack && seg.has_options() {
            // Any other client segment: HOST_ID a host wrote itself goes.
            self.pending = Wanted::default();
        } else {
            return HookVerdict::Continue;
        }
        self.pending_first_ack = st.first_ack;
        self.enforce(frame, info, seg)
    }

    /// `pending` went in.
    fn count_inserted(&mut self) {
        self.stats.injected += 1;
        if self.pending_first_ack.is_some() {
            self.stats.acks_injected += 1;
        }
    }

    /// Seed 000 section 7.2: an enabled option present is verified and
    /// corrected in place, one present but not enabled (or of the wrong
    /// length) is overwritten with NOPs; what is missing is inserted, all
    /// of it or, without room, none. `pending` holds the options wanted,
    /// and is left with the ones to insert.
    ///
    /// A first fragment is verified and corrected the same way (its
    /// checksum covers the whole datagram, and the change is in place), so
    /// fragmenting a SYN passes no other subscriber's HOST_ID; it never
    /// grows (counted as `no_room`).
    fn enforce(&mut self, frame: &mut [u8], info: &FrameInfo, seg: &Segment) -> HookVerdict {
        let (tcp_at, hl) = (info.l4, seg.header_len);
        // A later fragment never reaches here (`on_frame`).
        let fragment = info.first_frag;
        let scan = Scan::of(&frame[tcp_at..tcp_at + hl], &self.cfg.kinds);
        let mut kept = [false; 3];
        let mut delta = Delta::default();
        for p in scan.iter() {
            let correct = self.pending.get(p.which).filter(|_| p.well_formed() && !kept[p.which as usize]);
            let mut view = Options::new_checked(&mut frame[tcp_at..tcp_at + hl]).expect("parsed by Segment::read");
            match correct {
                Some(bytes) => {
                    kept[p.which as usize] = true;
                    if view.area()[p.offset() - tcp::MIN_HEADER_LEN..][..p.len()] != *bytes {
                        delta = delta.plus(view.overwrite(p.offset(), bytes).expect("within the header"));
                        self.stats.corrected += 1;
                    }
                }
                None => {
                    delta = delta.plus(view.nop_out(p.offset(), p.len()).expect("within the header"));
                    self.stats.removed += 1;
                }
            }
        }
        // Most SYNs carry no HOST_ID option: their checksum stays as it is.
        if !scan.is_empty() {
            apply_tcp_checksum(frame, tcp_at, delta);
        }

        self.pending.leave_out(kept);
        let pending_len = self.pending.as_slice().len();
        if pending_len == 0 {
            return HookVerdict::Continue;
        }
        if fragment {
            self.stats.no_room += 1;
            return HookVerdict::Continue;
        }
        if scan.malformed {
            self.stats.malformed += 1;
            return HookVerdict::Continue;
        }
        // The scan's end: corrections and NOPs in place never move it.
        let Some(end) = scan.options_end() else { return HookVerdict::Continue };
        let padded = (end + pending_len).next_multiple_of(4);
        if padded > tcp::MIN_HEADER_LEN + tcp_options::MAX_LEN || !fits_the_link(frame, info, padded.saturating_sub(hl)) || !self.fits_the_peer(info, hl, padded) {
            self.stats.no_room += 1;
            return HookVerdict::Continue;
        }
        self.pending_at = Layout { tcp_at, header_len: hl, options_end: end, segment_end: info.l4 + info.l4_len };
        match padded.saturating_sub(hl) {
            // It fits where the host's EOL padding was: no growth.
            0 => {
                match tcp_options::insert_ipv4_at(frame, info.l3, self.pending_at, self.pending.as_slice()) {
                    Ok(_) => self.count_inserted(),
                    Err(_) => self.stats.no_room += 1,
                }
                HookVerdict::Continue
            }
            added => HookVerdict::Grow(added),
        }
    }

    /// Whether a first ACK carrying data, its header grown to `padded`
    /// bytes, keeps its data and options within the MSS the server
    /// announced (RFC 6691 section 2: a sender reduces its data for its IP
    /// and TCP options; the host did so for its own, not for natrix's).
    fn fits_the_peer(&self, info: &FrameInfo, hl: usize, padded: usize) -> bool {
        let data = info.l4_len.saturating_sub(hl);
        let ip_options = info.l4.saturating_sub(info.l3 + natrix_wire::ipv4::MIN_HEADER_LEN);
        self.pending_first_ack.is_none_or(|mss| data == 0 || data + padded - tcp::MIN_HEADER_LEN + ip_options <= usize::from(mss))
    }

    /// A SYN-ACK leaving by `side` towards its client. In ACK mode,
    /// towards a subscriber (inside), it loses its echo of ENABLED; the
    /// connection is remembered for its first ACK when the echo was there
    /// (BOUCADAIR goes in) or when rules are configured (they inspect that
    /// ACK). A bump in the wire passes the echo on (the client's CGN puts
    /// BOUCADAIR in the first ACK for it) and remembers the connection for
    /// its rules.
    fn on_syn_ack_leaving(&mut self, frame: &mut [u8], info: &FrameInfo, seg: &Segment, side: Side) {
        let ack_mode = self.cfg.mode == Mode::Ack;
        let echoed = ack_mode && side == Side::Inside && self.remove_echo(frame, info, seg);
        let judged = !self.cfg.rules.is_empty() && (ack_mode || self.carries_enabled(frame, info, seg));
        if !echoed && !judged {
            return;
        }
        let c = Connection { client: info.dst, client_port: seg.dst_port, server: info.src, server_port: seg.src_port };
        let syn_ack = (seg.seq, info.l4_len.saturating_sub(seg.header_len).min(usize::from(u16::MAX)) as u16);
        if !self.echoed.remember(c, info.now_ns, echoed, announced_mss(frame, info, seg), syn_ack) {
            self.stats.acks_untracked += 1;
        }
    }

    /// Whether a SYN-ACK echoes ENABLED.
    fn carries_enabled(&self, frame: &[u8], info: &FrameInfo, seg: &Segment) -> bool {
        seg.has_options() && Scan::of(&frame[info.l4..info.l4 + seg.header_len], &self.cfg.kinds).iter().any(|p| p.which == Which::Enabled && p.well_formed())
    }

    /// Overwrites the server's echoes of ENABLED in a SYN-ACK with NOPs;
    /// whether there was one.
    fn remove_echo(&mut self, frame: &mut [u8], info: &FrameInfo, seg: &Segment) -> bool {
        if !seg.has_options() {
            return false;
        }
        let scan = Scan::of(&frame[info.l4..info.l4 + seg.header_len], &self.cfg.kinds);
        let echoes = scan.iter().filter(|p| p.which == Which::Enabled).map(|p| (p.offset(), p.len()));
        if nop_out(frame, info.l4, seg.header_len, echoes) == 0 {
            return false;
        }
        self.stats.echoes_removed += 1;
        true
    }
}

/// The connection of a client's segment, as it arrived.
fn client_connection(info: &FrameInfo, seg: &Segment) -> Connection {
    Connection { client: info.src, client_port: seg.src_port, server: info.dst, server_port: seg.dst_port }
}

/// The MSS a SYN-ACK announces: its MSS option, else RFC 9293 section
/// 3.7.1's default for IPv4 (536).
fn announced_mss(frame: &[u8], info: &FrameInfo, seg: &Segment) -> u16 {
    const DEFAULT_MSS: u16 = 536;
    let options = Options::new_checked(&frame[info.l4..info.l4 + seg.header_len]).ok();
    let mss = options.and_then(|o| o.find(tcp_options::kind::MSS).ok().flatten().and_then(|m| m.data().try_into().ok()));
    mss.map_or(DEFAULT_MSS, u16::from_be_bytes)
}

/// Overwrites each (offset, length) span of the TCP header at `tcp_at`
/// with NOPs and fixes the checksum; how many spans there were.
fn nop_out(frame: &mut [u8], tcp_at: usize, hl: usize, spans: impl Iterator<Item = (usize, usize)>) -> usize {
    let mut delta = Delta::default();
    let mut n = 0;
    let mut view = Options::new_checked(&mut frame[tcp_at..tcp_at + hl]).expect("parsed by Segment::read");
    for (offset, len) in spans {
        delta = delta.plus(view.nop_out(offset, len).expect("within the header"));
        n += 1;
    }
    apply_tcp_checksum(frame, tcp_at, delta);
    n
}

/// Whether the datagram in `frame`, `added` bytes longer, still fits the
/// link it leaves by: a SYN carrying data (TCP Fast Open) may be close to
/// the MTU, and one with DF grown past it would be lost on the way.
fn fits_the_link(frame: &[u8], info: &FrameInfo, added: usize) -> bool {
    let total = natrix_wire::get_u16_at(frame, info.l3 + 2);
    added == 0 || info.egress_mtu == 0 || usize::from(total) + added <= usize::from(info.egress_mtu)
}

fn apply_tcp_checksum(frame: &mut [u8], tcp_at: usize, delta: Delta) {
    let at = tcp_at + 16;
    let c = delta.apply(u16::from_be_bytes([frame[at], frame[at + 1]]));
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
}

impl Middlebox for HostId {
    fn point(&self) -> Point {
        Point::Both
    }

    /// SYNs only in SYN mode (and for the rules alone, in a CGN), so
    /// established traffic keeps NAPT44's fast path; every TCP segment
    /// where client ACKs are followed, to find each first ACK.
    fn interest(&self) -> Interest {
        if self.follows_first_acks() {
            Interest::tcp(0)
        } else {
            Interest::tcp(flags::SYN)
        }
    }

    fn on_frame(&mut self, frame: &mut [u8], info: &FrameInfo) -> HookVerdict {
        // A later fragment has no TCP header: what looks like one is data.
        if info.later_frag {
            return HookVerdict::Continue;
        }
        let Some(seg) = Segment::read(frame, info) else { return HookVerdict::Continue };
        match (info.point, info.side) {
            (Point::BeforeTranslation, side) => {
                self.staged = None;
                let first_ack = self.take_first_ack(info, &seg);
                if first_ack.is_some_and(|w| w.refused) {
                    return HookVerdict::Drop(DropReason::HostIdPolicy);
                }
                let verdict = self.apply_policy(frame, info, &seg, first_ack.is_some());
                if first_ack.is_some() && verdict == HookVerdict::Drop(DropReason::HostIdPolicy) {
                    self.refuse_connection(info, &seg);
                }
                if verdict == HookVerdict::Continue && side == Side::Inside && self.cfg.mode != Mode::Off {
                    self.stage(info, &seg, first_ack.filter(|w| w.echoed).map(|w| w.mss));
                }
                verdict
            }
            (_, side) => {
                if seg.is_syn_ack() && self.follows_first_acks() {
                    self.on_syn_ack_leaving(frame, info, &seg, side);
                }
                match side {
                    Side::Outside => self.on_leaving_outside(frame, info, &seg),
                    Side::Inside => HookVerdict::Continue,
                }
            }
        }
    }

    /// Inserts the options `on_frame` decided into the longer frame.
    fn grow(&mut self, frame: &mut [u8], _len: usize, info: &FrameInfo) -> usize {
        let at = self.pending_at;
        match tcp_options::insert_ipv4_at(frame, info.l3, at, self.pending.as_slice()) {
            Ok(ins) => {
                self.count_inserted();
                at.segment_end + ins.added
            }
            // Checked by `enforce`; the frame stays as it was.
            Err(_) => {
                self.stats.no_room += 1;
                at.segment_end
            }
        }
    }

    fn drain_records(&mut self, f: &mut dyn FnMut(FunctionRecord)) {
        for e in self.events.drain(..) {
            f(FunctionRecord::HostId(e));
        }
    }

    fn add_stats(&self, stats: &mut Stats) {
        stats.host_id = Some(self.stats.clone());
    }

    /// New rules and options take effect from the next segment; the
    /// connections ACK mode follows stay, and each rule's count stays with
    /// its place in the list.
    fn reconfigure(&mut self, cfg: &EngineConfig) {
        if let Some(h) = &cfg.host_id {
            self.stats.rule_matches.resize(h.rules.len(), 0);
            if h.rules != self.cfg.rules {
                self.echoed.lift_refusals();
            }
            self.cfg = h.clone();
        }
        self.translate = cfg.translate;
    }

    fn memory_bytes(&self) -> usize {
        self.echoed.memory_bytes() + self.events.capacity() * std::mem::size_of::<HostIdEvent>()
    }
}
