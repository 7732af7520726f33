//! The packet pipeline: every frame goes through the same stages, as a
//! packet goes through netfilter's hooks or VPP's feature arcs.
//!
//! ```text
//!  frame ─> parse ─> local ─> router in ─> hooks ─> translate ─> hooks ─> router out ─> verdict
//!           (frame)  (PCP,   (TTL, hop    (before)  (NAPT44, or  (after)  (TTL, hop
//!                    own     limit, MTU)             routing               limit; ICMP
//!                    address)                        only)                 refusals)
//! ```
//!
//! - `frame`: parse and classify once, into a record later stages read.
//! - local delivery: frames for natrix's own address (PCP, or dropped).
//! - `router`: router duties, and every frame natrix sends on its own.
//! - `hooks`: middlebox functions, before and after translation; each says
//!   which frames interest it, so a batch none of them wants passes them
//!   with one test.
//! - the translator: NAPT44 (`crate::nat44`) when `translate` is on, else
//!   natrix only routes. IPv6 that no function claims is routed in every mode.
//!
//! The fast path is NAPT44's own: an established IPv4 TCP or UDP frame
//! that no hook wants is translated straight from its bytes (`nat44::fast`),
//! and a batch prefetches its table lines ahead of time (`nat44::batch`).

pub mod emit;
mod fragment;
pub(crate) mod frame;
pub mod frame_buf;
pub mod hooks;
pub(crate) mod router;
mod softwire;

use crate::config::EngineConfig;
use crate::drop::{DropCounters, DropReason};
use crate::dslite::{decap, encap, mss, stand_in, Claim, Dslite, DsliteStats};
use crate::error::EngineError;
use crate::nat44::{self, Nat44, MAX_BATCH};
use crate::nptv6::Nptv6;
use crate::pcp::{PcpHoldView, PcpServer, PcpStats};
use crate::rewrite::Which;
use crate::state::deterministic::Member;
use crate::state::events::Event;
use crate::state::identity::{self, Identity};
use crate::Side;

use emit::OutFrame;
use frame::{Ip, Ip6, Net};
use frame_buf::FrameBuf;
use hooks::{HookVerdict, Hooks, Middlebox};
use router::Router;

const NS: u64 = 1_000_000_000;
/// The TCP flags an offloaded segment may carry: any but SYN, FIN and RST,
/// which always come to the engine.
const SEGMENTS_OFFLOADED: u8 = !(natrix_wire::tcp::flags::SYN | natrix_wire::tcp::flags::FIN | natrix_wire::tcp::flags::RST);

/// What became of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Rewritten in place; send it on this side. A frame of a batch is
    /// sent as its `FrameBuf` now holds it: longer (options inserted),
    /// starting later (a softwire packet decapsulated where it lay) or
    /// earlier (a reply encapsulated where it lay).
    Forward(Side),
    Drop(DropReason),
    /// Taken by the engine: kept (a fragment waiting for its first
    /// fragment), to come out later through the output queue; or forwarded
    /// already, as a copy that waits in the output queue: a longer one a
    /// middlebox function wrote (HOST_ID options inserted into a frame
    /// whose buffer had no room), or, in a batch, one that would otherwise
    /// overtake a frame of its flow queued before it.
    Held,
    /// Replaced by a frame of another shape that leaves through the output
    /// queue (a softwire packet decapsulated, or a packet encapsulated
    /// towards a B4); counted as forwarded.
    Consumed,
}

/// A translated frame whose functions wait for it to grow.
#[derive(Debug, Clone, Copy)]
struct ToLengthen {
    /// The side it leaves by.
    out: Side,
    /// Where its IPv4 header starts.
    l3: usize,
    /// The side it came from.
    from: Side,
}

/// What the engine has done, for reports and metrics.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub received: [u64; 2],
    pub forwarded: [u64; 2],
    pub generated: [u64; 2],
    pub held: u64,
    pub drops: DropCounters,
    pub sessions_created: u64,
    pub mappings_created: u64,
    pub peak_sessions: u64,
    pub peak_mappings: u64,
    pub peak_ports_in_use: u64,
    /// Frames NPTv6 translated, by the side they arrived on.
    pub nptv6_translated: [u64; 2],
    /// The SYN accelerator's counters, when `[syn_accel]` is configured.
    pub syn_accel: Option<crate::syn_accel::SynAccelStats>,
    /// HOST_ID's counters, when `[host_id]` is configured.
    pub host_id: Option<crate::host_id::HostIdStats>,
    /// DS-Lite's counters, when `[dslite]` is configured.
    pub dslite: Option<DsliteStats>,
}

/// The frames' own counters; the translator's and the router's are added
/// when `stats` is asked for.
#[derive(Debug, Clone, Default)]
struct FrameCounters {
    received: [u64; 2],
    forwarded: [u64; 2],
    held: u64,
    drops: DropCounters,
}

pub struct Engine {
    nat: Nat44,
    router: Router,
    pcp: PcpServer,
    hooks: Hooks,
    nptv6: Nptv6,
    /// The DS-Lite AFTR, when `[dslite]` is configured.
    dslite: Option<Dslite>,
    /// Whether the frame `process_batch` hands the full path can grow in
    /// its own buffer; taken by the first IPv4 stage that reads it.
    frame_can_grow: bool,
    /// A frame that a function asked to grow, left for `process_batch`
    /// to lengthen in its buffer.
    to_lengthen: Option<ToLengthen>,
    counters: FrameCounters,
    now_ns: u64,
    now_s: u32,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        Ok(Engine {
            router: Router::new(&cfg),
            pcp: PcpServer::new(cfg.pcp, cfg.inside_addr),
            // HOST_ID first: its policy drops a SYN before the accelerator
            // tracks it, and the accelerator's copy is the SYN with HOST_ID.
            hooks: crate::syn_accel::install(&cfg, crate::host_id::install(&cfg, Hooks::default()))?,
            nptv6: Nptv6::new(&cfg.nptv6)?.with_local_addresses(cfg.dslite.as_ref().map(|d| d.aftr), own_addresses6(&cfg)),
            dslite: cfg.dslite.clone().map(|d| Dslite::new(d, cfg.max_held_fragments, cfg.max_held_fragment_bytes, cfg.timeouts.fragment_ns)),
            frame_can_grow: false,
            to_lengthen: None,
            counters: FrameCounters::default(),
            now_ns: 0,
            now_s: 0,
            nat: Nat44::new(cfg)?,
        })
    }

    /// Bytes an engine for `cfg` reserves when it is built, before any traffic.
    pub fn reserved_bytes(cfg: &EngineConfig) -> u64 {
        Nat44::reserved_bytes(cfg) + crate::syn_accel::reserved_bytes(cfg)
    }

    /// Bytes beyond `reserved_bytes` an engine for `cfg` may allocate as
    /// its tables fill, for those that grow with load: the SYN
    /// accelerator's records of attempts.
    pub fn bytes_under_load(cfg: &EngineConfig) -> u64 {
        crate::syn_accel::bytes_under_load(cfg)
    }

    /// Adds a middlebox function, run on the frames it declares an interest in.
    pub fn add_middlebox(&mut self, m: Box<dyn Middlebox>) {
        self.hooks.add(m);
    }

    pub fn config(&self) -> &EngineConfig {
        self.nat.config()
    }

    /// NAPT44's state, for operators' views and reports.
    pub fn tables(&self) -> &crate::state::sessions::Tables {
        self.nat.tables()
    }

    /// SCTP's associations (seed 001), kept apart from NAPT's sessions.
    pub fn associations(&self) -> &crate::state::associations::Associations {
        self.nat.associations()
    }

    /// Sessions by protocol, SCTP's associations included.
    pub fn sessions_by_proto(&self) -> [u32; crate::Proto::COUNT] {
        self.nat.sessions_by_proto()
    }

    /// Mappings by protocol, SCTP's associations included.
    pub fn mappings_by_proto(&self) -> [u32; crate::Proto::COUNT] {
        self.nat.mappings_by_proto()
    }

    pub fn pool(&self) -> &crate::state::pool::Pool {
        self.nat.pool()
    }

    pub fn subscribers(&self) -> &crate::state::subscribers::Subscribers {
        self.nat.subscribers()
    }

    /// The RFC 7422 formula in deterministic mode.
    pub fn deterministic(&self) -> Option<&crate::state::deterministic::Deterministic> {
        self.nat.deterministic()
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let n = &self.nat.counters;
        let r = &self.router;
        let mut stats = Stats {
            received: c.received,
            forwarded: [c.forwarded[0] + r.released[0], c.forwarded[1] + r.released[1]],
            generated: r.generated,
            held: c.held,
            drops: c.drops.clone(),
            sessions_created: n.sessions_created,
            mappings_created: n.mappings_created,
            peak_sessions: n.peak_sessions,
            peak_mappings: n.peak_mappings,
            peak_ports_in_use: n.peak_ports_in_use,
            nptv6_translated: self.nptv6.translated,
            syn_accel: None,
            host_id: None,
            dslite: self.dslite.as_ref().map(|d| DsliteStats { softwires: self.nat.subs.identities().b4_count() as u64, ..d.stats }),
        };
        self.hooks.add_stats(&mut stats);
        stats
    }

    pub fn events_lost(&self) -> u64 {
        self.nat.events_lost()
    }

    /// Installs state the cluster's active node made or ended, as its event
    /// `e` describes it (session sync; `nat44::synced`).
    pub fn install_synced(&mut self, e: &Event) -> Result<(), nat44::synced::SyncRefusal> {
        self.nat.install_synced(e)
    }

    /// Whether this engine is a cluster standby, whose synced sessions
    /// wait for the active node's deletions instead of expiring; leaving
    /// standby gives each a full idle timeout from now.
    pub fn set_standby(&mut self, standby: bool) {
        self.nat.set_standby(standby);
    }

    /// Takes the NAT events queued since the last call; a softwire host's
    /// events name its B4 and inner address.
    pub fn drain_events(&mut self, f: impl FnMut(Event)) {
        self.nat.drain_events_resolved(f);
    }

    /// Takes the log records the middlebox functions queued (HOST_ID's
    /// policy events) since the last call.
    pub fn drain_function_records(&mut self, f: impl FnMut(hooks::FunctionRecord)) {
        self.hooks.drain_records(f);
    }

    /// Takes the frames the engine generated or released. Those for a
    /// softwire host (ICMP errors, released fragments) are encapsulated first.
    pub fn drain_output(&mut self, f: impl FnMut(&OutFrame)) {
        if self.dslite.is_some() {
            self.encapsulate_queued();
        }
        self.router.drain(f);
    }

    pub fn has_output(&self) -> bool {
        self.router.has_output()
    }

    /// Bytes held by tables, allocator and subscriber state.
    pub fn memory_bytes(&self) -> usize {
        self.nat.memory_bytes() + self.hooks.memory_bytes() + self.dslite.as_ref().map_or(0, |d| d.memory_bytes())
    }

    /// Moves the clock: expires sessions, ends hold-downs, answers held SYNs
    /// and drops fragments that waited too long. `now_ns` earlier than the
    /// last time is taken as the last time.
    pub fn advance(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        let s = (self.now_ns / NS) as u32;
        self.router.set_time(self.now_ns, s);
        self.now_s = s;
        if self.nat.set_time(self.now_ns) {
            // PCP lifetimes keep their sessions alive: touched before expiry runs.
            self.pcp.tick(&mut self.nat);
            self.nat.second_passed();
        }
        let (timed_out, crowded_out) = self.nat.run_timers(&mut self.router);
        self.count_drops(DropReason::FragmentTimeout, timed_out);
        self.count_drops(DropReason::FragmentBufferFull, crowded_out);
        if let Some(ds) = self.dslite.as_mut().filter(|d| !d.reassembly.is_empty()) {
            let stale = ds.reassembly.expire(self.now_ns);
            self.count_drops(DropReason::FragmentTimeout, stale);
        }
        self.hooks.tick(self.now_ns, &mut self.router);
    }

    /// When a middlebox function's timer (the SYN accelerator's copies and
    /// resets) next falls due, for `advance`: a thread that sleeps wakes by
    /// then. `u64::MAX`: none.
    pub fn next_wake_ns(&self) -> u64 {
        self.hooks.wake_ns()
    }

    /// Ends a run (the end of a capture): resolves every held SYN as if its
    /// hold had passed, drops every fragment still waiting, and plays out
    /// the middlebox functions' timers (the SYN accelerator's copies and
    /// resets, at the times they fall due).
    pub fn finish(&mut self) {
        let (dropped, crowded_out) = self.nat.finish(&mut self.router);
        self.count_drops(DropReason::FragmentTimeout, dropped);
        self.count_drops(DropReason::FragmentBufferFull, crowded_out);
        if let Some(ds) = self.dslite.as_mut() {
            let waiting = ds.reassembly.clear();
            self.count_drops(DropReason::FragmentTimeout, waiting);
        }
        self.hooks.finish(&mut self.router);
    }

    /// Translates one frame in place.
    pub fn process(&mut self, frame: &mut [u8], side: Side, now_ns: u64) -> Verdict {
        self.advance(now_ns);
        self.counters.received[side as usize] += 1;
        if self.nat.config().translate {
            match self.nat.candidate(frame, side) {
                Some(c) if !self.hooks.wants(c.ip_proto(), c.tcp_flags()) => {
                    let replies = side == Side::Outside && self.dslite.is_some();
                    return self.decide_unwanted(&mut &mut *frame, side, &c, replies);
                }
                Some(c) if side == Side::Inside => return self.decide_for_functions(&mut &mut *frame, &c),
                _ => {}
            }
        }
        self.nptv6_fast_or_full_path(frame, side)
    }

    /// Whether the frames of the flow of `head` (the start of a frame as it
    /// arrived on `side`, at least an untagged IPv4 and a TCP header long)
    /// may bypass the engine: forwarded by an offload that repeats the
    /// rewrite the engine gave this frame, and hands it every SYN, FIN and
    /// RST. So only flows the rewrite alone translates, whose state no
    /// plain segment can change, and whose segments no middlebox function
    /// wants.
    pub fn may_offload(&self, head: &[u8], side: Side) -> bool {
        self.offload_allowed(head) && self.nat.steady_flow(head, side)
    }

    /// For a flow an offload has forwarded frames of since it last said so
    /// (`head` as for `may_offload`): its session refreshed as those frames
    /// would have refreshed it, as of the engine's last `advance`. Whether
    /// it may still be offloaded; where not, nothing changes and the
    /// offload must hand the flow back.
    pub fn refresh_offloaded(&mut self, head: &[u8], side: Side) -> bool {
        self.offload_allowed(head) && self.nat.refresh_offloaded(head, side)
    }

    /// Whether the engine translates, and no middlebox function wants the
    /// segments of `head`'s protocol an offload would forward.
    fn offload_allowed(&self, head: &[u8]) -> bool {
        let proto = head.get(natrix_wire::ethernet::HEADER_LEN + 9).copied().unwrap_or(0);
        self.nat.config().translate && !self.hooks.wants(proto, SEGMENTS_OFFLOADED)
    }

    /// `process` without the fast paths: every frame takes the full path,
    /// parsed (a softwire packet decapsulated by `dslite::decap`). The fast
    /// paths must never decide differently; tests hold them to that.
    #[doc(hidden)]
    pub fn process_full(&mut self, frame: &mut [u8], side: Side, now_ns: u64) -> Verdict {
        self.advance(now_ns);
        self.counters.received[side as usize] += 1;
        self.parsed_path(frame, side)
    }

    /// Translates `frames`, all arrived on `side` at `now_ns`, in place;
    /// `verdicts[i]` says what became of `frames[i]`. The same verdicts as
    /// `process` frame by frame, in fewer nanoseconds: NAPT44 prefetches the
    /// table lines of the whole batch before it decides any frame. The
    /// difference: a frame whose length or start changes (HOST_ID's options
    /// inserted, a softwire packet decapsulated, a reply encapsulated)
    /// changes where it lies when its buffer allows (`FrameBuf`) and is
    /// forwarded (`Forward`), where `process` sends a copy (`Held`,
    /// `Consumed`). The caller sends the frames forwarded where they lie
    /// first, then the output queue (`drain_output`); so once a frame that
    /// stands in a flow's order is queued, every later frame the batch
    /// forwards is queued behind it (`Held`), and each flow's frames leave
    /// in the order they arrived, as they do frame by frame.
    pub fn process_batch<F: FrameBuf>(&mut self, frames: &mut [F], side: Side, now_ns: u64, verdicts: &mut [Verdict]) {
        assert_eq!(frames.len(), verdicts.len(), "process_batch: one verdict per frame");
        self.advance(now_ns);
        // Tests once for the whole batch: whether it is translated at all,
        // whether any middlebox function may want a frame of it, and whether
        // anything beside NAPT44 (a function, DS-Lite) is configured at all:
        // without, the loop runs free of their per-frame checks.
        let translate = self.nat.config().translate;
        let screen = !self.hooks.is_empty();
        let extras = screen || self.dslite.is_some();
        for (chunk, out) in frames.chunks_mut(MAX_BATCH).zip(verdicts.chunks_mut(MAX_BATCH)) {
            self.counters.received[side as usize] += chunk.len() as u64;
            if screen {
                self.hooks.prefetch_batch(chunk, side);
            }
            if !translate {
                for (f, v) in chunk.iter_mut().zip(out.iter_mut()) {
                    *v = self.in_flow_order(f, |e, f| e.full_path_in_buffer(f, side));
                }
            } else if extras {
                self.translate_chunk::<true, F>(chunk, side, out);
            } else {
                self.translate_chunk::<false, F>(chunk, side, out);
            }
        }
    }

    /// NAPT44's batch: the table lines of the whole chunk prefetched before
    /// any frame is decided. `EXTRAS`: whether a middlebox function or
    /// DS-Lite is configured, which each frame must then be checked for.
    #[inline(always)]
    fn translate_chunk<const EXTRAS: bool, F: FrameBuf>(&mut self, chunk: &mut [F], side: Side, out: &mut [Verdict]) {
        let mut candidates: [Option<nat44::Candidate>; MAX_BATCH] = [None; MAX_BATCH];
        // Which candidates are softwire packets' (`softwire`), bit i for frame i.
        // Beside NPTv6 bindings a softwire packet tries NPTv6's fast path
        // first, in a batch as frame by frame, so then there is no such stage.
        let softwires = if EXTRAS && side == Side::Inside && self.dslite.is_some() && self.nptv6.is_empty() {
            self.prepare_batch_with_softwires(chunk, &mut candidates)
        } else {
            self.nat.prepare_batch(chunk, side, &mut candidates);
            0
        };
        // Whether replies may be for softwire hosts, once for the chunk.
        let replies = EXTRAS && side == Side::Outside && self.dslite.is_some();
        for (i, (f, v)) in chunk.iter_mut().zip(out.iter_mut()).enumerate() {
            self.nat.prefetch_ahead(&mut candidates, i, side);
            let c = &candidates[i];
            *v = self.in_flow_order(f, |e, f| match c {
                Some(c) if EXTRAS && softwires >> i & 1 == 1 => e.decide_carried(f, c),
                Some(c) if !(EXTRAS && e.hooks.wants(c.ip_proto(), c.tcp_flags())) => e.decide_unwanted(f, side, c, replies),
                Some(c) if EXTRAS && side == Side::Inside => e.decide_for_functions(f, c),
                _ => e.full_path_in_buffer(f, side),
            });
        }
    }

    /// A frame of a batch decided by `decide`. The frames forwarded where
    /// they lie leave before the output queue; so once a frame that stands
    /// in a flow's order waits there (one grown into a copy, a softwire
    /// packet rebuilt, a fragment released), a later frame of the batch
    /// forwarded where it lies would overtake it: that one leaves as a
    /// copy behind it (`Held`) instead.
    #[inline(always)]
    fn in_flow_order<F: FrameBuf>(&mut self, f: &mut F, decide: impl FnOnce(&mut Self, &mut F) -> Verdict) -> Verdict {
        let Some(at) = self.router.overtaking_at() else { return decide(self, f) };
        match decide(self, f) {
            Verdict::Forward(out) => {
                self.router.queue_behind(at, out, f.frame());
                Verdict::Held
            }
            v => v,
        }
    }

    /// `nptv6_fast_or_full_path` for a frame of a batch, which a function
    /// may make longer in its buffer.
    fn full_path_in_buffer<F: FrameBuf>(&mut self, f: &mut F, side: Side) -> Verdict {
        self.frame_can_grow = true;
        let v = self.nptv6_fast_or_full_path(f.frame(), side);
        self.frame_can_grow = false;
        match self.to_lengthen.take() {
            Some(g) => self.grow_in_buffer(f, g),
            None => v,
        }
    }

    /// Lengthens a frame a function asked to grow, in its buffer, and
    /// finishes it there; in a copy where the buffer has no room. One
    /// that leaves for a softwire host is encapsulated, as `ipv4` does.
    fn grow_in_buffer<F: FrameBuf>(&mut self, f: &mut F, g: ToLengthen) -> Verdict {
        let ToLengthen { out, l3, from } = g;
        let len = f.frame().len() + self.hooks.growth().unwrap_or(0);
        let Some(frame) = f.set_frame_len(len) else { return self.grow_into_copy(f.frame(), out, l3, from) };
        let (result, end) = self.finish_grown(frame, out, l3);
        // Never longer than the room it just had.
        let frame = f.set_frame_len(end).unwrap_or_default();
        self.settle_translated(frame, l3, from, result)
    }

    /// Lengthens a frame a function asked to grow in a copy, which leaves
    /// through the output queue in the frame's place.
    fn grow_into_copy(&mut self, frame: &[u8], out: Side, l3: usize, from: Side) -> Verdict {
        let mut copy = self.router.buffer();
        copy.extend_from_slice(frame);
        copy.resize(frame.len() + self.hooks.growth().unwrap_or(0), 0);
        let (result, end) = self.finish_grown(&mut copy, out, l3);
        copy.truncate(end);
        if result != Ok(Some(out)) {
            let v = self.settle(frame, l3, from, result);
            self.router.recycle(copy);
            return v;
        }
        self.router.queue_rebuilt(out, self.now_ns, copy);
        self.counters.forwarded[out as usize] += 1;
        Verdict::Held
    }

    /// The rest of the stages of a translated frame whose functions stopped
    /// for it to grow: `frame` is it with the room asked for. The functions
    /// finish, then the router's TTL; the result, and the frame's new length.
    #[inline(always)]
    fn finish_grown(&mut self, frame: &mut [u8], out: Side, l3: usize) -> (Result<Option<Side>, DropReason>, usize) {
        let (verdict, end) = self.hooks.resume(frame);
        if let HookVerdict::Drop(r) = verdict {
            return (Err(r), end);
        }
        self.router.decrement_ttl(&mut frame[..end], l3);
        (Ok(Some(out)), end)
    }

    /// Whether a frame may change its length or start where it lies: only
    /// while nothing waits in the output queue, which it would overtake.
    fn may_change_in_place(&self) -> bool {
        !self.router.has_output()
    }

    /// NPTv6's fast path (`nptv6::fast`) for a plain IPv6 frame a binding
    /// maps; the full path for every other frame.
    #[inline(always)]
    fn nptv6_fast_or_full_path(&mut self, frame: &mut [u8], side: Side) -> Verdict {
        if !self.nptv6.fast_path(frame, side) {
            return self.full_path(frame, side);
        }
        self.forwarded(side.other())
    }

    /// The verdict on a candidate frame no middlebox function wants:
    /// NAPT44's (`decide`), or, where `replies` may be for softwire hosts
    /// (DS-Lite on, an inbound frame), `decide_towards_softwires`'.
    #[inline(always)]
    fn decide_unwanted<F: FrameBuf>(&mut self, f: &mut F, side: Side, c: &nat44::Candidate, replies: bool) -> Verdict {
        if replies {
            self.decide_towards_softwires(f, c)
        } else {
            self.decide(f, side, c)
        }
    }

    /// NAPT44's verdict on a candidate frame (with DS-Lite on, an inbound
    /// one is `decide_towards_softwires`').
    #[inline(always)]
    fn decide<F: FrameBuf>(&mut self, f: &mut F, side: Side, c: &nat44::Candidate) -> Verdict {
        let frame = f.frame();
        match self.nat.decide(frame, side, c) {
            Some(Ok(out)) => self.forwarded(out),
            Some(Err(r)) => self.settle(frame, nat44::fast::L3, side, Err(r)),
            None => self.full_path(frame, side),
        }
    }

    /// `decide` for an inbound candidate with DS-Lite on: a reply to a
    /// softwire host is translated to its inner address and encapsulated
    /// to its B4.
    #[inline(always)]
    fn decide_towards_softwires<F: FrameBuf>(&mut self, f: &mut F, c: &nat44::Candidate) -> Verdict {
        let frame = f.frame();
        if let Some(ds) = self.dslite.as_mut() {
            ds.keep_if_large(frame, nat44::fast::L3);
        }
        match self.nat.decide_inbound_to_hosts(frame, c) {
            Some((_, stand_in, Some(host))) => self.encapsulate_translated(f, Side::Outside, c, stand_in, host),
            Some((_, stand_in, None)) if identity::is_softwire(stand_in) => self.softwire_verdict(Err(DropReason::NoMapping)),
            Some((out, _, None)) => self.forwarded(out),
            None => self.full_path(frame, Side::Outside),
        }
    }

    /// NAPT44's fast path for an outbound candidate a middlebox function
    /// wants: the full path's stages from the functions before translation
    /// on, with `decide`'s translation; the candidate has passed every
    /// check before them (it is no local, hairpin, short-lived or too big
    /// frame). A frame a function makes longer grows within the run of
    /// functions where its buffer lends the room (`FrameBuf::with_room`)
    /// and nothing waits in the output queue; else in its buffer after
    /// the run, or in a copy, as `full_path_in_buffer` grows it.
    fn decide_for_functions<F: FrameBuf>(&mut self, f: &mut F, c: &nat44::Candidate) -> Verdict {
        let (buf, len) = f.with_room();
        let ip = c.ip(&buf[..len]);
        let mut end = len;
        let result = self.translated_between_functions(buf, &mut end, &ip, Side::Inside, |e, frame| e.nat.decide_outbound::<false>(frame, c, |_| {}).map(Some));
        if end != len {
            // Grown into the room `with_room` lent: the buffer has it.
            let set = f.set_frame_len(end).is_some();
            debug_assert!(set, "a FrameBuf refused the length of the room it lent");
        }
        match (result, self.hooks.growth()) {
            (Ok(Some(out)), Some(_)) if self.may_change_in_place() => self.grow_in_buffer(f, ToLengthen { out, l3: ip.l3, from: Side::Inside }),
            _ => self.leave_translated(f.frame(), ip.l3, Side::Inside, result, false),
        }
    }

    /// Every frame no fast path took: a plain softwire packet is still
    /// tried by DS-Lite's (`softwire`), anything else is parsed.
    fn full_path(&mut self, frame: &mut [u8], side: Side) -> Verdict {
        if side == Side::Inside && self.dslite.is_some() {
            if let Some(v) = self.plain_softwire_in(frame) {
                return v;
            }
        }
        self.parsed_path(frame, side)
    }

    /// The full path proper: the frame parsed, then the stages.
    fn parsed_path(&mut self, frame: &mut [u8], side: Side) -> Verdict {
        let result = match frame::parse(frame) {
            Err(r) => Err(r),
            Ok(Net::V4(ip)) => return self.ipv4(frame, &ip, side),
            Ok(Net::V6(ip)) if side == Side::Inside && self.dslite.is_some() => return self.inside_ipv6(frame, &ip),
            Ok(Net::V6(ip)) => self.ipv6(frame, &ip, side),
        };
        self.verdict_of(result)
    }

    fn ipv4(&mut self, frame: &mut [u8], ip: &Ip, side: Side) -> Verdict {
        if let Some(ds) = self.dslite.as_mut().filter(|_| side == Side::Outside) {
            ds.keep_if_large(frame, ip.l3);
        }
        let can_grow = std::mem::take(&mut self.frame_can_grow);
        let result = self.ipv4_stages(frame, ip, side);
        self.leave_translated(frame, ip.l3, side, result, can_grow)
    }

    /// A frame through the IPv4 stages leaves: made longer first where a
    /// function asked for it (in its buffer when `can_grow`, left to
    /// `full_path_in_buffer` behind a placeholder verdict; else in a copy),
    /// then settled.
    #[inline(always)]
    fn leave_translated(&mut self, frame: &mut [u8], l3: usize, side: Side, result: Result<Option<Side>, DropReason>, can_grow: bool) -> Verdict {
        if self.hooks.growth().is_some() {
            match result {
                Ok(Some(out)) if can_grow && self.may_change_in_place() => {
                    self.to_lengthen = Some(ToLengthen { out, l3, from: side });
                    return Verdict::Held;
                }
                Ok(Some(out)) => return self.grow_into_copy(frame, out, l3, side),
                _ => self.hooks.cancel(),
            }
        }
        self.settle_translated(frame, l3, side, result)
    }

    /// `settle` for an IPv4 frame through the stages: one that leaves for a
    /// softwire host is encapsulated to its B4 instead.
    fn settle_translated(&mut self, frame: &mut [u8], l3: usize, side: Side, result: Result<Option<Side>, DropReason>) -> Verdict {
        if result == Ok(Some(Side::Inside)) && self.dslite.is_some() && to_softwire(frame, l3) {
            return self.send_into_softwire(frame, l3, side);
        }
        match result {
            Ok(Some(out)) if self.too_big_for(frame, l3, out) => self.send_fragmented(frame, l3, out),
            _ => self.settle(frame, l3, side, result),
        }
    }

    /// Whether the IPv4 datagram at `l3`, without DF, is larger than the
    /// link on `out` takes: the router let it through to be fragmented
    /// (one with DF it refused as it arrived).
    fn too_big_for(&self, frame: &[u8], l3: usize, out: Side) -> bool {
        const DONT_FRAGMENT: u8 = 0x40;
        let mtu = self.router.egress_mtu(out);
        let Some(h) = frame.get(l3..l3 + 8) else { return false };
        mtu != 0 && h[6] & DONT_FRAGMENT == 0 && u16::from_be_bytes([h[2], h[3]]) > mtu
    }

    /// The translated datagram at `l3` leaves on `out` as fragments that
    /// fit its link (RFC 4787 REQ-13), through the output queue, in order.
    fn send_fragmented(&mut self, frame: &[u8], l3: usize, out: Side) -> Verdict {
        if !self.queue_fragments(frame, l3, out) {
            return self.verdict_of(Err(DropReason::TooBig));
        }
        self.counters.forwarded[out as usize] += 1;
        Verdict::Consumed
    }

    /// Queues the fragments of the datagram at `l3` that fit the link on
    /// `out`; false, nothing queued, where its MTU leaves no room for them.
    fn queue_fragments(&mut self, frame: &[u8], l3: usize, out: Side) -> bool {
        let Some(pieces) = fragment::split(frame, l3, self.router.egress_mtu(out)) else { return false };
        for piece in pieces {
            self.router.queue_final(out, self.now_ns, piece);
        }
        true
    }

    /// An IPv6 frame on the inside with DS-Lite on: a softwire packet, a
    /// message for the AFTR, a softwire for another AFTR, or plain IPv6.
    fn inside_ipv6(&mut self, frame: &mut [u8], ip: &Ip6) -> Verdict {
        let Some(ds) = self.dslite.as_mut() else { return self.full_path(frame, Side::Inside) };
        let result = match ds.claim(frame, ip) {
            Claim::Softwire => return self.softwire_in(frame, ip),
            Claim::ToAftr => {
                if let Some(b4) = ds.mtus.on_icmpv6(frame, ip, &ds.cfg, self.now_s) {
                    ds.stats.mtu_lowered += 1;
                    if let Some(c) = self.nat.subs.identities_mut().counters_of_b4_mut(b4) {
                        c.mtu_lowered += 1;
                    }
                }
                Err(DropReason::LocalDestination)
            }
            Claim::WrongAftr if self.is_site_tunnel(frame, ip) => self.ipv6(frame, ip, Side::Inside),
            Claim::WrongAftr => Err(DropReason::DsliteWrongAftr),
            Claim::None => self.ipv6(frame, ip, Side::Inside),
        };
        self.verdict_of(result)
    }

    /// Whether IPv4 in IPv6 to another address than the AFTR comes from a
    /// host of an NPTv6 site that is no listed B4: the host's own tunnel,
    /// NPTv6's to route (`check-config` keeps the B4 prefixes apart from
    /// the sites').
    fn is_site_tunnel(&self, frame: &[u8], ip: &Ip6) -> bool {
        let src = crate::dslite::ipv6_src(frame, ip.l3);
        let listed_b4 = self.dslite.as_ref().is_some_and(|d| !d.cfg.b4_prefixes.is_empty() && d.cfg.accepts(src));
        self.nptv6.covers_inside(src) && !listed_b4
    }

    /// A softwire packet from a B4: decapsulated, its host's address
    /// replaced by the stand-in for (B4, host), then through the IPv4 stages
    /// as any subscriber's packet.
    fn softwire_in(&mut self, frame: &[u8], ip6: &Ip6) -> Verdict {
        // Called only with DS-Lite on (`inside_ipv6`).
        let Some(ds) = self.dslite.as_mut() else { return self.verdict_of(Err(DropReason::DsliteWrongAftr)) };
        let mut buf = self.router.buffer();
        let clamp = ds.cfg.mss_clamp;
        let decapsulated = decap::decapsulate(ds, frame, ip6, self.now_ns, &mut buf);
        let ip = match decapsulated.and_then(|b4| b4.map(|b4| self.host_behind(&mut buf, b4, clamp)).transpose()) {
            Ok(Some(ip)) => ip,
            // A fragment waiting for the rest of its packet.
            Ok(None) => {
                self.router.recycle(buf);
                return self.verdict_of(Ok(None));
            }
            Err(r) => {
                self.router.recycle(buf);
                return self.verdict_of(Err(r));
            }
        };
        // Bytes past the inner packet's total length are not part of it.
        buf.truncate(ip.l3 + ip.total_len());
        let result = match self.softwire_fast_path(&mut buf) {
            Some(done) => done.map(Some),
            None => self.ipv4_stages(&mut buf, &ip, Side::Inside),
        };
        let result = match (result, self.hooks.growth()) {
            // A function makes it longer after translation (HOST_ID options),
            // in the buffer it was decapsulated into.
            (Ok(Some(out)), Some(by)) => {
                buf.resize(buf.len() + by, 0);
                let (result, end) = self.finish_grown(&mut buf, out, ip.l3);
                buf.truncate(end);
                result
            }
            (result, growth) => {
                if growth.is_some() {
                    self.hooks.cancel();
                }
                result
            }
        };
        match self.settle(&buf, ip.l3, Side::Inside, result) {
            Verdict::Forward(out) => {
                self.send_rebuilt(out, buf, ip.l3);
                Verdict::Consumed
            }
            v => {
                self.router.recycle(buf);
                v
            }
        }
    }

    /// NAPT44's fast path for a decapsulated packet (`nat44::fast`): one of
    /// an established flow, or one that opens a flow, translated in `buf`,
    /// with the side it leaves on or why not. None: `buf` is untouched, for
    /// the full path (PCP to 192.0.0.1, hairpins, anything the fast path
    /// leaves alone, what a middlebox function wants to see).
    #[inline]
    fn softwire_fast_path(&mut self, buf: &mut [u8]) -> Option<Result<Side, DropReason>> {
        let c = self.nat.softwire_candidate(buf)?;
        let dst = natrix_wire::get_u32_at(buf, nat44::fast::L3 + natrix_wire::ipv4::DST_OFFSET);
        if dst == crate::dslite::AFTR_IPV4 || (!self.hooks.is_empty() && self.hooks.wants(c.ip_proto(), c.tcp_flags())) {
            return None;
        }
        self.nat.decide(buf, Side::Inside, &c)
    }

    /// The decapsulated packet in `buf`, its source replaced by the stand-in
    /// for (`b4`, source), its SYN's MSS clamped.
    fn host_behind(&mut self, buf: &mut [u8], b4: std::net::Ipv6Addr, clamp: Option<u16>) -> Result<Ip, DropReason> {
        let Net::V4(mut ip) = frame::parse(buf)? else { return Err(DropReason::Ipv4BadVersion) };
        // Deterministic mode numbers B4s: one it does not number has no range,
        // and is refused before it takes a stand-in.
        if self.nat.deterministic().is_some_and(|d| d.index_of_member(Member::B4(b4)).is_none()) {
            return Err(DropReason::NotSubscriber);
        }
        let ids = self.nat.subs.identities_mut();
        let stand_in = ids.intern_softwire(b4, ip.src, self.now_s)?;
        if let Some(c) = ids.counters_mut(stand_in) {
            c.decapsulated += 1;
        }
        stand_in::replace(buf, &ip, Which::Src, stand_in);
        ip.src = stand_in;
        if let Some(c) = clamp {
            mss::clamp(buf, &ip, c);
        }
        Ok(ip)
    }

    /// A decapsulated packet after translation: to a softwire host (a
    /// hairpin) it is encapsulated again, else it leaves as it is.
    fn send_rebuilt(&mut self, out: Side, buf: Vec<u8>, l3: usize) {
        if out == Side::Inside && to_softwire(&buf, l3) {
            // The stages counted it forwarded; an encapsulation refused here only drops it.
            let mut buf = buf;
            let _ = self.encapsulate(&mut buf, l3, self.now_ns, Origin::Hairpin);
            self.router.recycle(buf);
        } else if self.too_big_for(&buf, l3, out) {
            // The stages counted it forwarded: as fragments, or dropped
            // where the link leaves no room to fragment it.
            if !self.queue_fragments(&buf, l3, out) {
                self.counters.drops.count(DropReason::TooBig);
            }
            self.router.recycle(buf);
        } else {
            self.router.queue_final(out, self.now_ns, buf);
        }
    }

    /// An IPv4 frame that arrived on `side` and that NAPT44 translated
    /// towards a softwire host: encapsulated to its B4 (the frame itself is
    /// not sent, and is left with its host's inner address).
    fn send_into_softwire(&mut self, frame: &mut [u8], l3: usize, side: Side) -> Verdict {
        let result = self.encapsulate(frame, l3, self.now_ns, Origin::of_arrival(side));
        self.softwire_verdict(result)
    }

    /// What became of a frame encapsulated (or refused) in place of being
    /// sent: counted forwarded to the inside, consumed.
    fn softwire_verdict(&mut self, result: Result<(), DropReason>) -> Verdict {
        match self.verdict_of(result.map(|()| Some(Side::Inside))) {
            Verdict::Forward(_) => Verdict::Consumed,
            v => v,
        }
    }

    /// Frames natrix queued for softwire hosts (its own, fragments it
    /// released), encapsulated in their place: the queue is taken out and
    /// queued again in order, so a frame of a flow keeps its place before
    /// the flow's later frames.
    fn encapsulate_queued(&mut self) {
        // Only natrix's own frames may still need it: those the pipeline rebuilt are final.
        if !self.router.has_own_output() {
            return;
        }
        for f in self.router.take_queued(|_| true) {
            let Some(l3) = ethernet_l3(&f.data).filter(|&l3| f.side == Side::Inside && to_softwire(&f.data, l3)) else {
                self.router.queue_final(f.side, f.time_ns, f.data);
                continue;
            };
            // Frames natrix made itself: one it cannot encapsulate is not sent.
            let mut data = f.data;
            let _ = self.encapsulate(&mut data, l3, f.time_ns, Origin::Natrix);
            self.router.recycle(data);
        }
    }

    /// Encapsulates the IPv4 packet in `buf` (translated, addressed to a
    /// softwire host's stand-in) to the host's B4 into frames of its own,
    /// fragmenting the outer packet past the softwire's MTU; with DF set, a
    /// packet from outside that would need that is refused with
    /// fragmentation needed quoting it as it arrived (RFC 2473 section 7).
    /// `buf` is left with the host's inner address.
    fn encapsulate(&mut self, buf: &mut [u8], l3: usize, at_ns: u64, origin: Origin) -> Result<(), DropReason> {
        if self.dslite.is_none() {
            return Err(DropReason::NoMapping);
        }
        let mut ip = frame::parse_ipv4_any_address(buf, l3)?;
        let Identity::Softwire { b4, inner } = self.nat.subs.identities().resolve(ip.dst) else { return Err(DropReason::NoMapping) };
        if origin == Origin::Natrix && ip.src == self.router.source(Side::Inside) && ip.proto == natrix_wire::proto::ICMP {
            stand_in::replace(buf, &ip, Which::Src, crate::dslite::AFTR_IPV4);
            ip.src = crate::dslite::AFTR_IPV4;
        }
        stand_in::replace(buf, &ip, Which::Dst, inner);
        self.encapsulate_to(buf, &ip, b4, at_ns, origin)
    }

    /// The rest of `encapsulate` once `buf`, which `ip` reads, carries the
    /// host's inner address (`ip.dst` still names its stand-in): into
    /// frames towards `b4`.
    fn encapsulate_to(&mut self, buf: &mut [u8], ip: &Ip, b4: std::net::Ipv6Addr, at_ns: u64, origin: Origin) -> Result<(), DropReason> {
        let Some(ds) = self.dslite.as_mut() else { return Err(DropReason::NoMapping) };
        let l3 = ip.l3;
        if let Some(c) = ds.cfg.mss_clamp {
            mss::clamp(buf, ip, c);
        }
        let softwire = encap::Softwire { eth: &buf[..l3], aftr: ds.cfg.aftr, b4, mtu: ds.mtus.of(&b4, ds.cfg.mtu, self.now_s), ecn_mask: ds.ecn_mask() };
        let total = ip.total_len();
        if !softwire.fits(total) && ip.dont_fragment && origin == Origin::Outside && !ds.original.is_empty() {
            let from = self.router.source(Side::Outside);
            let mtu = softwire.mtu - crate::dslite::OVERHEAD as u16;
            self.router.send_icmp_error(&ds.original, l3, from, Side::Outside, (natrix_wire::icmp::kind::DEST_UNREACHABLE, natrix_wire::icmp::unreachable::FRAG_NEEDED), mtu);
            return Err(DropReason::FragmentationNeeded);
        }
        let ident = if softwire.fits(total) { 0 } else { ds.next_frag_ident() };
        let router = &mut self.router;
        let mut frames = 0;
        softwire.encapsulate(&buf[l3..l3 + total], ident, |write| {
            let mut b = router.buffer();
            write(&mut b);
            router.queue_final(Side::Inside, at_ns, b);
            frames += 1;
        });
        let host = self.nat.subs.identities().endpoint_of(ip.dst);
        self.count_encapsulated(host, frames);
        Ok(())
    }

    /// A packet to the softwire host `host` left in `frames` outer packets
    /// (more than one: fragments).
    fn count_encapsulated(&mut self, host: Option<identity::Endpoint>, frames: u64) {
        if let Some(ds) = self.dslite.as_mut() {
            ds.stats.encapsulated += 1;
            if frames > 1 {
                ds.stats.fragmented += frames;
            }
        }
        if let Some(c) = host.and_then(|h| self.nat.subs.identities_mut().endpoint_counters_mut(h)) {
            c.encapsulated += 1;
        }
    }

    /// The stages of an IPv4 frame, up to its verdict.
    fn ipv4_stages(&mut self, frame: &mut [u8], ip: &Ip, side: Side) -> Result<Option<Side>, DropReason> {
        let admitted = self.ipv4_local_and_admission(frame, ip, side)?;
        self.router.check_ttl(frame, ip.l3, ip.ttl, side)?;
        self.router.check_mtu(frame, ip.l3, ip.total_len(), ip.dont_fragment, side)?;
        self.refuse_tcp_header_tricks(frame, ip)?;
        let mut len = frame.len();
        self.translated_between_functions(frame, &mut len, ip, side, |e, frame| match (e.nat.config().translate, admitted) {
            (false, _) => Ok(Some(side.other())),
            (true, None) => e.nat.translate_outbound(frame, ip, &mut e.router),
            (true, Some(inbound)) => e.nat.translate_inbound(frame, ip, inbound, &mut e.router),
        })
    }

    /// RFC 1858's fragment tricks on a TCP header, dropped wherever a
    /// function looks at TCP (NAPT44 drops the first anyway): a first
    /// fragment too short for its header (options included), whose flags
    /// and options would pass the functions unseen in the next fragment
    /// (a SYN evading the HOST_ID rules of a bump in the wire), and a later
    /// fragment starting where a header may lie, which a receiver keeping
    /// later data would let rewrite options the functions judged.
    fn refuse_tcp_header_tricks(&self, frame: &[u8], ip: &Ip) -> Result<(), DropReason> {
        const LONGEST_TCP_HEADER: usize = 60;
        if ip.proto != natrix_wire::proto::TCP || !(ip.first_frag || ip.later_frag) || !self.hooks.wants(ip.proto, 0xff) {
            return Ok(());
        }
        if ip.first_frag && natrix_wire::tcp::Packet::new_checked(&frame[ip.l4..ip.l4 + ip.l4_len]).is_err() {
            return Err(DropReason::FragmentTooSmall);
        }
        let offset = natrix_wire::ipv4::Packet::new_lax(&frame[ip.l3..]).map_or(0, |p| usize::from(p.frag_offset()));
        if ip.later_frag && offset < LONGEST_TCP_HEADER {
            return Err(DropReason::FragmentInTcpHeader);
        }
        Ok(())
    }

    /// The stages of an admitted IPv4 frame from the functions before
    /// translation on: those, `translate`, the functions after it and the
    /// router's TTL. The frame is the first `*len` bytes of `buf`; the rest
    /// is room a function after translation may grow it into, where it
    /// may change where it lies, and `*len` says how long it came out.
    #[inline(always)]
    fn translated_between_functions(
        &mut self,
        buf: &mut [u8],
        len: &mut usize,
        ip: &Ip,
        side: Side,
        translate: impl FnOnce(&mut Self, &mut [u8]) -> Result<Option<Side>, DropReason>,
    ) -> Result<Option<Side>, DropReason> {
        self.run_hooks(hooks::Point::BeforeTranslation, &mut buf[..*len], ip, side)?;
        let Some(out) = translate(self, &mut buf[..*len])? else { return Ok(None) };
        let room = if buf.len() > *len && self.may_change_in_place() { buf.len() } else { *len };
        self.run_hooks_in_room(hooks::Point::AfterTranslation, &mut buf[..room], len, ip, out)?;
        // A frame a function makes longer elsewhere gets its TTL once it has grown.
        if self.hooks.growth().is_none() {
            self.router.decrement_ttl(&mut buf[..*len], ip.l3);
        }
        Ok(Some(out))
    }

    /// Frames for natrix itself end here (PCP answers them on the inside);
    /// NAPT44 says which frames from outside it takes.
    fn ipv4_local_and_admission(&mut self, frame: &[u8], ip: &Ip, side: Side) -> Result<Option<nat44::Inbound>, DropReason> {
        match side {
            Side::Inside if ip.dst == self.router.source(Side::Inside) || (identity::is_softwire(ip.src) && ip.dst == crate::dslite::AFTR_IPV4) => {
                if self.pcp.is_enabled() {
                    // A softwire host names its own inner address in its requests.
                    let client = match self.nat.subs.identities().resolve(ip.src) {
                        Identity::Softwire { inner, .. } => inner,
                        Identity::Ipv4(a) => a,
                    };
                    // Answered through the output queue; the request itself ends here.
                    self.pcp.request(frame, ip, client, &mut self.nat, &mut self.router);
                }
                Err(DropReason::LocalDestination)
            }
            Side::Inside => Ok(None),
            Side::Outside if !self.nat.config().translate => match self.nat.config().outside_addr {
                Some(a) if a == ip.dst => Err(DropReason::LocalDestination),
                _ => Ok(None),
            },
            Side::Outside => self.nat.admit_inbound(frame, ip).map(Some),
        }
    }

    /// IPv6 is routed, its prefix translated where an NPTv6 binding claims
    /// it. The hop limit is judged as the packet arrived, so a time exceeded
    /// quotes it as its sender knows it.
    fn ipv6(&mut self, frame: &mut [u8], ip: &Ip6, side: Side) -> Result<Option<Side>, DropReason> {
        // natrix answers none of its own (Neighbor Discovery ends before the engine).
        if self.nptv6.is_own(crate::dslite::ipv6_dst(frame, ip.l3), side) {
            return Err(DropReason::LocalDestination);
        }
        self.router.check_hop_limit(frame, ip.l3, ip.total, ip.hop_limit, side)?;
        let out = self.nptv6.translate(frame, ip, side)?;
        self.router.decrement_hop_limit(frame, ip.l3);
        Ok(Some(out))
    }

    fn run_hooks(&mut self, at: hooks::Point, frame: &mut [u8], ip: &Ip, side: Side) -> Result<(), DropReason> {
        let mut len = frame.len();
        self.run_hooks_in_room(at, frame, &mut len, ip, side)
    }

    /// `run_hooks` for the frame of `*len` bytes at the start of `buf`,
    /// which may grow into the rest (`Hooks::run`).
    fn run_hooks_in_room(&mut self, at: hooks::Point, buf: &mut [u8], len: &mut usize, ip: &Ip, side: Side) -> Result<(), DropReason> {
        if self.hooks.is_empty() {
            return Ok(());
        }
        let egress_mtu = if at == hooks::Point::AfterTranslation { self.router.egress_mtu(side) } else { 0 };
        let ctx = hooks::Context { side, now_ns: self.now_ns, softwire: self.softwire_host(ip.src), egress_mtu };
        match self.hooks.run(at, buf, len, ip, ctx) {
            HookVerdict::Drop(r) => Err(r),
            HookVerdict::Continue | HookVerdict::Grow(_) => Ok(()),
        }
    }

    /// The host behind a B4 whose stand-in `src` is: a frame's source as
    /// it arrived, so a function sees who sent it through which softwire.
    fn softwire_host(&self, src: u32) -> Option<hooks::SoftwireHost> {
        if !identity::is_softwire(src) {
            return None;
        }
        match self.nat.subs.identities().resolve(src) {
            Identity::Softwire { b4, inner } => Some(hooks::SoftwireHost { b4, inner }),
            Identity::Ipv4(_) => None,
        }
    }

    /// Counts a handled IPv4 frame's outcome and says what became of it; a
    /// subscriber refused for lack of resources is told (RFC 6888 REQ-11).
    fn settle(&mut self, frame: &[u8], l3: usize, side: Side, result: Result<Option<Side>, DropReason>) -> Verdict {
        if let Err(r) = result {
            if side == Side::Inside && r.is_resource() {
                self.router.refuse(frame, l3);
            }
        }
        self.verdict_of(result)
    }

    /// A frame that leaves by `out`, counted.
    #[inline(always)]
    fn forwarded(&mut self, out: Side) -> Verdict {
        self.counters.forwarded[out as usize] += 1;
        Verdict::Forward(out)
    }

    fn verdict_of(&mut self, result: Result<Option<Side>, DropReason>) -> Verdict {
        match result {
            Ok(Some(out)) => self.forwarded(out),
            Ok(None) => {
                self.counters.held += 1;
                Verdict::Held
            }
            Err(r) => {
                self.counters.drops.count(r);
                Verdict::Drop(r)
            }
        }
    }

    fn count_drops(&mut self, r: DropReason, n: u64) {
        for _ in 0..n {
            self.counters.drops.count(r);
        }
    }

    /// Counters of the PCP server.
    pub fn pcp_stats(&self) -> PcpStats {
        self.pcp.stats()
    }

    /// Every live PCP hold (MAP mappings and PEER sessions), in key order.
    pub fn pcp_holds(&self) -> Vec<PcpHoldView> {
        self.pcp.holds(&self.nat)
    }

    /// The unsolicited ANNOUNCE a restarted PCP server multicasts on the
    /// inside, or None when PCP is disabled.
    pub fn pcp_announcement(&mut self, src_mac: [u8; 6]) -> Option<Vec<u8>> {
        self.pcp.announcement(src_mac, self.now_s, &mut self.router)
    }

    /// Applies a reloaded configuration (see `Nat44::reconfigure`); the
    /// events of what it deletes (a removed pool address's mappings), and
    /// those queued before, go to `sink`.
    pub fn reconfigure(&mut self, new: EngineConfig, mut sink: impl FnMut(Event)) -> Result<(), EngineError> {
        // Built before anything changes, so a refused reload leaves all as it was.
        let bindings = Nptv6::new(&new.nptv6)?;
        self.nat.reconfigure(new, &mut sink)?;
        self.nptv6.replace_table(bindings);
        self.nptv6.set_local_addresses(self.nat.config().dslite.as_ref().map(|d| d.aftr), own_addresses6(self.nat.config()));
        self.router.reconfigure(self.nat.config());
        self.hooks.reconfigure(self.nat.config());
        let c = self.nat.config();
        if let (Some(ds), Some(cfg)) = (self.dslite.as_mut(), c.dslite.clone()) {
            ds.cfg = cfg;
            ds.reassembly.set_limits(c.max_held_fragments, c.max_held_fragment_bytes, c.timeouts.fragment_ns);
        }
        // A softwire endpoint admitted under the old configuration is admitted again.
        self.nat.subs.identities_mut().forget_recent();
        self.pcp.reconfigure(self.nat.config().pcp, self.nat.config().inside_addr);
        self.pcp.drop_lost_holds(&mut self.nat, None);
        Ok(())
    }

    pub fn session_views(&self, subscriber: Option<u32>) -> Vec<crate::admin::SessionView> {
        self.nat.session_views(subscriber)
    }

    pub fn mapping_views(&self, subscriber: Option<u32>) -> Vec<crate::admin::MappingView> {
        self.nat.mapping_views(subscriber)
    }

    /// `session_views` a part at a time (`admin::Walk`): true once done.
    pub fn walk_sessions(&self, w: &mut crate::admin::Walk<crate::admin::SessionView>, budget: u32) -> bool {
        self.nat.walk_sessions(w, budget)
    }

    /// `mapping_views` a part at a time (`admin::Walk`): true once done.
    pub fn walk_mappings(&self, w: &mut crate::admin::Walk<crate::admin::MappingView>, budget: u32) -> bool {
        self.nat.walk_mappings(w, budget)
    }

    /// Ends a subscriber's sessions and dynamic mappings; their events,
    /// and those queued before, go to `sink`.
    pub fn clear_subscriber(&mut self, addr: u32, mut sink: impl FnMut(Event)) -> crate::admin::Cleared {
        let cleared = self.nat.clear_subscriber(addr, &mut sink);
        self.pcp.drop_lost_holds(&mut self.nat, Some(addr));
        cleared
    }

    /// `clear_subscriber`'s walk a part at a time (`admin::Walk`): true once done.
    pub fn walk_subscriber_mappings(&self, w: &mut crate::admin::Walk<u32>, budget: u32) -> bool {
        self.nat.walk_subscriber_mappings(w, budget)
    }

    /// Ends the sessions of subscriber `addr`'s mappings a walk found
    /// (`walk_subscriber_mappings`), and its associations.
    pub fn clear_mappings(&mut self, addr: u32, mappings: &[u32], mut sink: impl FnMut(Event)) -> crate::admin::Cleared {
        let cleared = self.nat.clear_mappings(addr, mappings, &mut sink);
        self.pcp.drop_lost_holds(&mut self.nat, Some(addr));
        cleared
    }

    /// Ends every dynamic mapping (natrix stops); their events, and those
    /// queued before, go to `sink`.
    pub fn release_all(&mut self, mut sink: impl FnMut(Event)) -> crate::admin::Cleared {
        self.nat.release_all(&mut sink)
    }
}

/// Who made a frame that goes into a softwire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A host outside: a packet that needs fragmenting with DF set is refused.
    Outside,
    /// A subscriber, through NAPT44's hairpinning.
    Hairpin,
    /// natrix itself (an ICMP error, a released fragment).
    Natrix,
}

impl Origin {
    /// The origin of a frame NAPT44 translated, by the side it arrived on.
    fn of_arrival(side: Side) -> Origin {
        if side == Side::Outside {
            Origin::Outside
        } else {
            Origin::Hairpin
        }
    }
}

/// Whether the IPv4 frame's destination (at `l3`) is a softwire host's stand-in.
#[inline(always)]
fn to_softwire(frame: &[u8], l3: usize) -> bool {
    frame.len() >= l3 + 20 && identity::is_softwire(natrix_wire::get_u32_at(frame, l3 + natrix_wire::ipv4::DST_OFFSET))
}

/// Where the IPv4 header of an Ethernet/IPv4 frame starts.
fn ethernet_l3(frame: &[u8]) -> Option<usize> {
    let eth = natrix_wire::ethernet::Frame::new_checked(frame).ok()?;
    (eth.ethertype() == natrix_wire::ethernet::ETHERTYPE_IPV4).then(|| eth.payload_offset())
}

/// natrix's own IPv6 addresses, inside and outside.
fn own_addresses6(cfg: &EngineConfig) -> [Option<std::net::Ipv6Addr>; 2] {
    [cfg.inside_addr6, cfg.outside_addr6].map(|a| a.map(|a| a.addr))
}
