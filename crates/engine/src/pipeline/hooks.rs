//! Middlebox functions plug into the pipeline here, before or after
//! translation, as netfilter's hooks and VPP's feature arcs take theirs.
//! Each function declares which frames interest it; the pipeline asks a
//! function only about those, and NAPT44's fast path stays open to every
//! frame none of them wants: with no function installed a batch pays one
//! test, with some a frame pays a mask test.

use crate::drop::DropReason;
use crate::pipeline::frame::Ip;
use crate::pipeline::frame_buf::FrameBuf;
use crate::pipeline::router::Router;
use crate::pipeline::Stats;
use crate::{EngineConfig, Side};

/// Where in the pipeline a function runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Addresses and ports as the frame arrived (inside: the subscriber's own).
    BeforeTranslation,
    /// Addresses and ports as the frame leaves.
    AfterTranslation,
    /// Both: a function that decides on a frame as it arrived and keeps
    /// what it looks like as it leaves (`FrameInfo::point` says which).
    Both,
}

impl Point {
    /// Whether a function at `self` runs at pipeline point `at`.
    fn includes(self, at: Point) -> bool {
        self == at || self == Point::Both
    }
}

/// Which frames a function wants to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interest {
    /// IP protocol numbers, as a set of 256 bits (TCP 6, UDP 17, ICMP 1, SCTP 132).
    pub protocols: [u64; 4],
    /// For TCP: only segments carrying one of these flags (SYN 0x02, FIN
    /// 0x01, RST 0x04, ...); 0: every segment.
    pub tcp_flags: u8,
}

impl Interest {
    /// Every TCP segment with one of `flags` set (0: every segment).
    pub const fn tcp(flags: u8) -> Interest {
        Interest::protocol(natrix_wire::proto::TCP).with_tcp_flags(flags)
    }

    /// Every frame of one IP protocol.
    pub const fn protocol(proto: u8) -> Interest {
        let mut protocols = [0; 4];
        protocols[(proto / 64) as usize] = 1 << (proto % 64);
        Interest { protocols, tcp_flags: 0 }
    }

    /// This and every frame of one more IP protocol.
    pub const fn with_protocol(self, proto: u8) -> Interest {
        let mut protocols = self.protocols;
        protocols[(proto / 64) as usize] |= 1 << (proto % 64);
        Interest { protocols, ..self }
    }

    const fn with_tcp_flags(self, tcp_flags: u8) -> Interest {
        Interest { tcp_flags, ..self }
    }

    fn has(&self, proto: u8) -> bool {
        self.protocols[usize::from(proto / 64)] & (1 << (proto % 64)) != 0
    }

    pub fn wants(&self, proto: u8, tcp_flags: u8) -> bool {
        self.has(proto) && (proto != natrix_wire::proto::TCP || self.tcp_flags == 0 || tcp_flags & self.tcp_flags != 0)
    }

    fn union(self, other: Interest) -> Interest {
        // A protocol wanted whole by one function is wanted whole.
        let whole_tcp = |i: &Interest| i.has(natrix_wire::proto::TCP) && i.tcp_flags == 0;
        let tcp_flags = if whole_tcp(&self) || whole_tcp(&other) { 0 } else { self.tcp_flags | other.tcp_flags };
        let mut protocols = self.protocols;
        protocols.iter_mut().zip(other.protocols).for_each(|(a, b)| *a |= b);
        Interest { protocols, tcp_flags }
    }
}

/// What a function sees of a frame: the pipeline's parse of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameInfo {
    /// Offsets of the IPv4 header and the transport header, and the transport's length.
    pub l3: usize,
    pub l4: usize,
    pub l4_len: usize,
    pub proto: u8,
    pub src: u32,
    pub dst: u32,
    pub tcp_flags: u8,
    /// A fragment's first piece (it holds the transport header), or a later
    /// one (what follows its IPv4 header is data, not a transport header).
    pub first_frag: bool,
    pub later_frag: bool,
    /// The side the frame arrived on (before translation) or leaves by (after).
    pub side: Side,
    /// The point this call is made at (never `Both`).
    pub point: Point,
    /// The engine's clock: the frame's arrival.
    pub now_ns: u64,
    /// The softwire host that sent the frame, when it came out of a DS-Lite
    /// softwire (its source, as the frame arrived, is the host's stand-in).
    pub softwire: Option<SoftwireHost>,
    /// After translation, the largest IPv4 datagram the link the frame
    /// leaves by takes (0: none known): a function that lengthens a frame
    /// keeps within it, since a datagram with DF past it would be lost.
    /// The link's, not a DS-Lite softwire's (which is 40 bytes less than
    /// its outer MTU, per B4) for a frame going into one.
    pub egress_mtu: u16,
}

/// What the pipeline knows of a frame beyond its bytes and their parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Context {
    /// The side it arrived on (before translation) or leaves by (after).
    pub side: Side,
    pub now_ns: u64,
    /// Its sender, when it came out of a DS-Lite softwire.
    pub softwire: Option<SoftwireHost>,
    /// The largest IPv4 datagram the link it leaves by takes (after
    /// translation; 0: none known).
    pub egress_mtu: u16,
}

/// A host behind a DS-Lite B4: who a decapsulated frame's sender is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftwireHost {
    /// The B4: the softwire's IPv6 source.
    pub b4: std::net::Ipv6Addr,
    /// The host's own (inner, private) IPv4 address.
    pub inner: u32,
}

/// What a function decided about a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookVerdict {
    Continue,
    Drop(DropReason),
    /// The frame needs up to this many more bytes than it has (options
    /// inserted, a header added): the frame is lengthened and handed to
    /// `grow` before the functions after this one run; at once where the
    /// run was lent the room (an outbound frame's fast path, its buffer
    /// with room, nothing waiting in the output queue), else by the
    /// pipeline while they wait (in a copy that leaves through the output
    /// queue when the buffer has none). Honoured after translation only,
    /// where nothing rewrites the frame any more; before, it counts as
    /// `Continue`.
    Grow(usize),
}

/// A record a function writes to the event log, beside NAT's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FunctionRecord {
    HostId(crate::host_id::HostIdEvent),
}

/// A middlebox function.
pub trait Middlebox: Send {
    fn point(&self) -> Point;
    fn interest(&self) -> Interest;
    /// Looks at (and may change, without changing its length) a frame it
    /// declared an interest in.
    fn on_frame(&mut self, frame: &mut [u8], info: &FrameInfo) -> HookVerdict;

    /// After `on_frame` answered `Grow(n)`: `frame` is the frame, `len`
    /// bytes long, followed by `n` bytes left from whatever the buffer
    /// held before (another frame's bytes: every byte of the result must be
    /// written); the function writes the longer frame, which ends where its
    /// IP packet ends, and returns its length (at most `frame.len()`).
    /// Functions after it see the longer frame. Only functions that answer
    /// `Grow` are asked; the default leaves the frame as it was.
    fn grow(&mut self, _frame: &mut [u8], len: usize, _info: &FrameInfo) -> usize {
        len
    }

    /// Hands over the log records queued since the last call.
    fn drain_records(&mut self, _f: &mut dyn FnMut(FunctionRecord)) {}

    /// A batch is about to run: start loading whatever `on_frame` will read
    /// for `frame` (arrived on `side`), as NAPT44 prefetches its table
    /// lines across a batch. Called only for frames the function wants,
    /// and only when `prefetches` says it does something.
    fn prefetch(&self, _frame: &[u8], _side: Side) {}

    /// Whether `prefetch` does anything (a function that implements one
    /// implements both): a batch none of the functions prefetches for is
    /// not walked before it runs.
    fn prefetches(&self) -> bool {
        false
    }

    /// When the function next wants `on_time` (u64::MAX: never). Asked
    /// after each `on_frame` and `on_time`, so the engine's clock pays one
    /// comparison per frame for every function's timers together.
    fn next_wake_ns(&self) -> u64 {
        u64::MAX
    }

    /// Runs the timers due by `now_ns`; frames the function sends go out
    /// through `out`, stamped with the time they fell due.
    fn on_time(&mut self, _now_ns: u64, _out: &mut Emitter) {}

    /// The end of a run (a capture's end): plays out every timer still
    /// pending, at the times they fall due.
    fn finish(&mut self, _out: &mut Emitter) {}

    /// Adds the function's counters to the engine's.
    fn add_stats(&self, _stats: &mut Stats) {}

    /// Takes a reloaded configuration's settings for it, keeping its state
    /// (connections it follows, counters). Never one that turns it off:
    /// that needs a restart (`config::restart_key_changed`).
    fn reconfigure(&mut self, _cfg: &EngineConfig) {}

    /// Bytes the function's state holds.
    fn memory_bytes(&self) -> usize {
        0
    }
}

/// Frames a function sends on its own, through the router's output queue
/// (counted as generated, like natrix's ICMP errors).
pub struct Emitter<'a> {
    router: &'a mut Router,
}

impl Emitter<'_> {
    /// Queues a byte copy of `frame` to leave on `side`, stamped `at_ns`.
    pub fn send_copy(&mut self, side: Side, at_ns: u64, frame: &[u8]) {
        self.router.copy_at(side, at_ns, frame);
    }

    /// Queues the frame `build` writes (given the next IP identification)
    /// to leave on `side`, stamped `at_ns`.
    pub fn send_built(&mut self, side: Side, at_ns: u64, build: impl FnOnce(&mut Vec<u8>, u16)) {
        self.router.emit_at(side, at_ns, build);
    }
}

pub(crate) struct Hooks {
    functions: Vec<Box<dyn Middlebox>>,
    /// Every function's interest together.
    interest: Interest,
    /// The interest of the functions that prefetch, together.
    prefetch_interest: Interest,
    /// The earliest `next_wake_ns` of every function.
    wake_ns: u64,
    /// The function that asked for a longer frame, while the pipeline
    /// lengthens it; the functions after it wait.
    suspended: Option<Suspended>,
}

/// Where an after-translation run stopped for a frame to grow.
#[derive(Debug, Clone, Copy)]
struct Suspended {
    function: usize,
    by: usize,
    info: FrameInfo,
}

impl Default for Hooks {
    fn default() -> Self {
        Hooks { functions: Vec::new(), interest: Interest::default(), prefetch_interest: Interest::default(), wake_ns: u64::MAX, suspended: None }
    }
}

impl Hooks {
    /// When the earliest function's timer falls due (ns); `u64::MAX`: none.
    pub(crate) fn wake_ns(&self) -> u64 {
        self.wake_ns
    }

    pub fn add(&mut self, m: Box<dyn Middlebox>) {
        self.interest = self.interest.union(m.interest());
        if m.prefetches() {
            self.prefetch_interest = self.prefetch_interest.union(m.interest());
        }
        self.wake_ns = self.wake_ns.min(m.next_wake_ns());
        self.functions.push(m);
    }

    /// Runs the functions' timers once the earliest is due.
    #[inline]
    pub fn tick(&mut self, now_ns: u64, router: &mut Router) {
        if now_ns < self.wake_ns {
            return;
        }
        let mut out = Emitter { router };
        for f in &mut self.functions {
            f.on_time(now_ns, &mut out);
        }
        self.wake_ns = self.functions.iter().map(|f| f.next_wake_ns()).min().unwrap_or(u64::MAX);
    }

    /// Before a batch runs: lets the functions start loading what they will
    /// read for the frames they want (read from the bytes, before the
    /// frame is parsed; a frame whose header cannot be read so is left).
    pub fn prefetch_batch<F: FrameBuf>(&self, chunk: &mut [F], side: Side) {
        if self.prefetch_interest == Interest::default() {
            return;
        }
        for frame in chunk.iter_mut() {
            let frame = frame.frame();
            let Some((proto, tcp_flags)) = peek_ipv4(frame) else { continue };
            if self.prefetch_interest.wants(proto, tcp_flags) {
                for f in self.functions.iter().filter(|f| f.prefetches() && f.interest().wants(proto, tcp_flags)) {
                    f.prefetch(frame, side);
                }
            }
        }
    }

    /// Hands a reloaded configuration to every function; what they want
    /// and when they wake may change with it.
    pub fn reconfigure(&mut self, cfg: &EngineConfig) {
        let functions = std::mem::take(&mut self.functions);
        *self = Hooks::default();
        for mut f in functions {
            f.reconfigure(cfg);
            self.add(f);
        }
    }

    /// Plays out every function's pending timers (the end of a capture).
    pub fn finish(&mut self, router: &mut Router) {
        let mut out = Emitter { router };
        for f in &mut self.functions {
            f.finish(&mut out);
        }
        self.wake_ns = self.functions.iter().map(|f| f.next_wake_ns()).min().unwrap_or(u64::MAX);
    }

    pub fn add_stats(&self, stats: &mut Stats) {
        self.functions.iter().for_each(|f| f.add_stats(stats));
    }

    pub fn memory_bytes(&self) -> usize {
        self.functions.iter().map(|f| f.memory_bytes()).sum()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// Whether any function wants a frame of `proto` with `tcp_flags`.
    #[inline]
    pub fn wants(&self, proto: u8, tcp_flags: u8) -> bool {
        !self.functions.is_empty() && self.interest.wants(proto, tcp_flags)
    }

    /// Runs the functions of `at` that want the frame, the first `*len`
    /// bytes of `buf`, in the order they were added; the first drop ends
    /// it. A function that asks for a longer frame (after translation)
    /// gets it at once where the rest of `buf`, room the frame may grow
    /// into where it lies, holds it, and `*len` becomes its new length: the
    /// common growth (HOST_ID's options in a SYN lent with its buffer) then
    /// costs no round trip through the pipeline. Without that room it
    /// suspends the run: the pipeline lengthens the frame and `resume`s.
    #[inline]
    pub fn run(&mut self, at: Point, buf: &mut [u8], len: &mut usize, ip: &Ip, ctx: Context) -> HookVerdict {
        if !self.interest.wants(ip.proto, ip.tcp_flags) {
            return HookVerdict::Continue;
        }
        // Read from the frame, not the parse: after translation they are the rewritten ones.
        let (src, dst) = natrix_wire::ipv4::Packet::new_lax(&buf[ip.l3..*len]).map_or((ip.src, ip.dst), |p| (p.src_addr(), p.dst_addr()));
        let mut info = FrameInfo {
            l3: ip.l3,
            l4: ip.l4,
            l4_len: ip.l4_len,
            proto: ip.proto,
            src,
            dst,
            tcp_flags: ip.tcp_flags,
            first_frag: ip.first_frag,
            later_frag: ip.later_frag,
            side: ctx.side,
            point: at,
            now_ns: ctx.now_ns,
            softwire: ctx.softwire,
            egress_mtu: ctx.egress_mtu,
        };
        self.run_from(0, buf, len, &mut info, false)
    }

    /// Runs the functions from the `first`th on, as `run` does;
    /// `grown`: the frame has grown already, and grows no more.
    #[inline(always)]
    fn run_from(&mut self, first: usize, buf: &mut [u8], len: &mut usize, info: &mut FrameInfo, mut grown: bool) -> HookVerdict {
        let at = info.point;
        for (i, f) in self.functions.iter_mut().enumerate().skip(first) {
            if !(f.point().includes(at) && f.interest().wants(info.proto, info.tcp_flags)) {
                continue;
            }
            let verdict = f.on_frame(&mut buf[..*len], info);
            self.wake_ns = self.wake_ns.min(f.next_wake_ns());
            match verdict {
                HookVerdict::Continue => {}
                HookVerdict::Drop(r) => return HookVerdict::Drop(r),
                // Nothing to grow by, before translation, or a second
                // function asking for more (one growth per frame): as `Continue`.
                HookVerdict::Grow(0) => {}
                HookVerdict::Grow(_) if at == Point::BeforeTranslation || grown => {}
                HookVerdict::Grow(by) if by <= buf.len() - *len => {
                    *len = f.grow(&mut buf[..*len + by], *len, info).min(*len + by);
                    info.l4_len = len.saturating_sub(info.l4);
                    grown = true;
                }
                HookVerdict::Grow(by) => {
                    self.suspended = Some(Suspended { function: i, by, info: *info });
                    return HookVerdict::Grow(by);
                }
            }
        }
        HookVerdict::Continue
    }

    /// Bytes the suspended run asked the frame to grow by, if a run is suspended.
    #[inline]
    pub fn growth(&self) -> Option<usize> {
        self.suspended.as_ref().map(|s| s.by)
    }

    /// Ends a suspended run without growing the frame.
    pub fn cancel(&mut self) {
        self.suspended = None;
    }

    /// Goes on with the suspended run: `frame` is the frame followed by the
    /// bytes it asked for. The function that asked writes the longer frame,
    /// and the functions after it see that; the verdict, and the frame's
    /// new length.
    #[inline(always)]
    pub fn resume(&mut self, frame: &mut [u8]) -> (HookVerdict, usize) {
        // Read where it lies: the common case, the last function growing
        // the frame, copies nothing.
        let Some(s) = self.suspended.as_ref() else { return (HookVerdict::Continue, frame.len()) };
        let (function, by) = (s.function, s.by);
        let mut len = self.functions[function].grow(frame, frame.len() - by, &s.info).min(frame.len());
        if function + 1 == self.functions.len() {
            self.suspended = None;
            return (HookVerdict::Continue, len);
        }
        let mut info = s.info;
        self.suspended = None;
        info.l4_len = len.saturating_sub(info.l4);
        let verdict = self.run_from(function + 1, frame, &mut len, &mut info, true);
        (verdict, len)
    }

    /// Every function's log records queued since the last call.
    pub fn drain_records(&mut self, mut f: impl FnMut(FunctionRecord)) {
        for m in &mut self.functions {
            m.drain_records(&mut f);
        }
    }
}

/// The IP protocol and TCP flags of an untagged Ethernet/IPv4 frame, read
/// without checks beyond the lengths (a hint: the pipeline's parse judges).
fn peek_ipv4(frame: &[u8]) -> Option<(u8, u8)> {
    const L3: usize = natrix_wire::ethernet::HEADER_LEN;
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let proto = *frame.get(L3 + 9)?;
    let l4 = L3 + usize::from(frame.get(L3)? & 0x0f) * 4;
    let flags = if proto == natrix_wire::proto::TCP { *frame.get(l4 + 13)? } else { 0 };
    Some((proto, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interests_say_which_frames_and_add_up() {
        let syns = Interest::tcp(0x02);
        assert!(syns.wants(6, 0x02) && syns.wants(6, 0x12));
        assert!(!syns.wants(6, 0x10), "a plain ACK is not wanted");
        assert!(!syns.wants(17, 0));
        let udp = Interest::protocol(17);
        let both = syns.union(udp);
        assert!(both.wants(17, 0) && both.wants(6, 0x02) && !both.wants(6, 0x10));
        let all_tcp = both.union(Interest::tcp(0));
        assert!(all_tcp.wants(6, 0x10), "one function wanting every segment opens them all");
        assert!(!Interest::default().wants(6, 0x02));
        assert!(!both.wants(132, 0));
        assert!(Interest::protocol(132).wants(132, 0), "SCTP has a place in the set");
    }
}
