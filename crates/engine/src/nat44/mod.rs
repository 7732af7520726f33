//! The engine: parses a frame, runs it through the right direction's
//! translation, and reports a verdict. The fast path is one index lookup and
//! an in-place rewrite; misses fall to the slow path, which checks quotas,
//! allocates a port and creates state.

pub mod batch;
mod fast;
pub mod fragments;
mod icmp_error;

use std::collections::VecDeque;

use natrix_wire::{ethernet, icmp, ipv4, proto, tcp, WireError};

use crate::config::{prefix_contains, EngineConfig, Filtering, UnsolicitedSyn};
use crate::drop::{DropCounters, DropReason};
use crate::error::EngineError;
use crate::nat44::fragments::{FragKey, FragRewrite, Fragments};
use crate::pipeline::emit::{self, OutFrame, OutQueue};
use crate::rewrite::{self, Which, L4};
use crate::state::deterministic::Deterministic;
use crate::state::events::{Event, EventKind, EventQueue};
use crate::state::hash;
use crate::state::pool::{AllocError, Pool};
use crate::state::rng::Rng;
use crate::state::sessions::{mapping_flags, Endpoints, Found, Mapping, Tables, NIL};
use crate::state::shard::{self, Owners};
use crate::state::subscribers::{Subscribers, NONE};
use crate::trackers::{self, Direction, TimeoutClass};
use crate::{Proto, Side};

const NS: u64 = 1_000_000_000;
const FRAGMENT_RECORDS: usize = 4096;
/// Enough of a held SYN's frame to quote its IP header and 8 bytes of TCP.
const HELD_SYN_BYTES: usize = 128;

/// What became of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Rewritten in place; send it on this side.
    Forward(Side),
    Drop(DropReason),
    /// Kept by the engine (a fragment waiting for its first fragment); it may
    /// come out later through the output queue.
    Held,
}

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
}

/// The parsed IPv4 layer of a frame; offsets are absolute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ip {
    pub l3: usize,
    pub l4: usize,
    pub l4_len: usize,
    pub proto: u8,
    pub src: u32,
    pub dst: u32,
    pub ttl: u8,
    pub ident: u16,
    pub first_frag: bool,
    pub later_frag: bool,
    pub dont_fragment: bool,
}

/// The transport view of a first (or only) fragment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flow {
    pub proto: Proto,
    pub sport: u16,
    pub dport: u16,
    pub tcp_flags: u8,
    pub l4: L4,
    pub icmp_class: Option<icmp::Class>,
}

/// What has been looked up of an outbound datagram before its handling:
/// its internal endpoint's hash and, under it, mapping and session, and its
/// subscriber's id (a guess, checked before use; NONE: not looked up).
#[derive(Clone, Copy)]
pub(crate) struct Looked {
    pub hash_in: u64,
    pub found: Option<Found>,
    pub sub_hint: u32,
}

impl Flow {
    /// (subscriber-side port, remote port) of an outbound packet; ICMP queries
    /// are keyed by identifier with no remote port.
    fn out_ports(&self) -> (u16, u16) {
        if self.proto == Proto::Icmp {
            (self.sport, 0)
        } else {
            (self.sport, self.dport)
        }
    }

    fn in_ports(&self) -> (u16, u16) {
        if self.proto == Proto::Icmp {
            (self.sport, 0)
        } else {
            (self.dport, self.sport)
        }
    }
}

struct HeldSyn {
    deadline_ns: u64,
    ext_addr: u32,
    ext_port: u16,
    rem_addr: u32,
    rem_port: u16,
    l3: usize,
    len: usize,
    bytes: [u8; HELD_SYN_BYTES],
}

pub struct Engine {
    pub(crate) cfg: EngineConfig,
    pub(crate) tables: Tables,
    pub(crate) subs: Subscribers,
    pub(crate) pool: Pool,
    frags: Fragments,
    syn_holds: VecDeque<HeldSyn>,
    out: OutQueue,
    events: EventQueue,
    rng: Rng,
    pub(crate) stats: Stats,
    now_ns: u64,
    pub(crate) now_s: u32,
    icmp_window_s: u32,
    icmp_sent: u32,
    ip_ident: u16,
    outside_source: u32,
    owners: Owners,
    /// Deterministic mode (RFC 7422): the formula that fixes each subscriber's range.
    det: Option<Deterministic>,
    /// Sessions the timer wheel found idle, reused each second.
    expired: Vec<u32>,
    /// The PCP server's holds and counters (RFC 6887; `crate::pcp`).
    pub(crate) pcp: crate::pcp::PcpState,
}

fn ipv4_reason(e: WireError) -> DropReason {
    use natrix_wire::Field;
    match e {
        WireError::Truncated { .. } => DropReason::Ipv4Truncated,
        WireError::Malformed { field: Field::Version, .. } => DropReason::Ipv4BadVersion,
        WireError::Malformed { field: Field::HeaderLength, .. } => DropReason::Ipv4BadHeaderLength,
        WireError::Malformed { .. } => DropReason::Ipv4BadTotalLength,
    }
}

pub(crate) fn is_martian(addr: u32) -> bool {
    let first = addr >> 24;
    first == 0 || first == 127 || first >= 224
}

impl DropReason {
    /// Refusals for lack of resources or quota: answered with ICMP (RFC 6888 REQ-8).
    pub fn is_resource(self) -> bool {
        matches!(
            self,
            DropReason::PortQuota | DropReason::SessionQuota | DropReason::RateLimited | DropReason::PoolExhausted | DropReason::SessionTableFull | DropReason::SubscriberTableFull
        )
    }
}

impl Engine {
    /// Builds an engine; fails when a static mapping conflicts with another.
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        let det = match &cfg.deterministic {
            Some(d) => Some(Deterministic::new(d, &cfg.pool, cfg.ports).map_err(|e| EngineError::Config { key: format!("nat.{}", e.key), problem: e.problem })?),
            None => None,
        };
        // Deterministic ranges belong whole to their subscriber's worker, so
        // every worker's allocator spans the whole range.
        let slice = if det.is_some() { cfg.ports } else { shard::port_slice(cfg.ports, cfg.port_block_size, cfg.shard) };
        let pool = Pool::new(&cfg.pool, slice, cfg.port_block_size, cfg.port_selection, cfg.port_parity, cfg.hold_down_s);
        let owners = Owners::new(cfg.ports, cfg.port_block_size, cfg.shard.count, &cfg.statics).with_deterministic(det.clone());
        let outside_source = cfg.outside_addr.or_else(|| cfg.pool.first().copied()).unwrap_or(0);
        let mut e = Engine {
            tables: Tables::new(cfg.max_sessions, cfg.statics.len(), cfg.seed, cfg.timeouts.by_class())?,
            subs: Subscribers::new(cfg.max_subscribers, cfg.seed)?,
            pool,
            frags: Fragments::new(FRAGMENT_RECORDS, cfg.max_held_fragments as usize, cfg.max_held_fragment_bytes as usize, cfg.timeouts.fragment_ns),
            syn_holds: VecDeque::with_capacity(cfg.max_held_syns as usize),
            out: OutQueue::default(),
            events: EventQueue::new(cfg.event_capacity as usize),
            rng: Rng::new(cfg.seed),
            stats: Stats::default(),
            now_ns: 0,
            now_s: 0,
            icmp_window_s: 0,
            icmp_sent: 0,
            ip_ident: 0,
            outside_source,
            owners,
            det,
            expired: Vec::new(),
            pcp: crate::pcp::PcpState::default(),
            cfg,
        };
        e.install_statics()?;
        Ok(e)
    }

    /// Bytes an engine for `cfg` reserves when it is built, before any
    /// traffic: the session table and index, the subscriber index and the
    /// pool's port maps. Subscriber records and timer slots grow with use.
    pub fn reserved_bytes(cfg: &EngineConfig) -> u64 {
        (Tables::reserved_bytes(cfg.max_sessions, cfg.statics.len())
            + Subscribers::reserved_bytes(cfg.max_subscribers)
            + Pool::reserved_bytes(cfg.pool.len(), cfg.ports, cfg.port_block_size)) as u64
    }

    fn install_statics(&mut self) -> Result<(), EngineError> {
        let refuse = |problem: String| EngineError::Config { key: "nat.static".into(), problem };
        for st in self.cfg.statics.clone() {
            let ext_index = self.pool.index_of(st.ext_addr).ok_or_else(|| refuse(format!("{} is not a pool address", fmt_addr(st.ext_addr))))?;
            if !self.pool.reserve(ext_index, st.proto, st.ext_port) || self.tables.find_mapping_in(st.proto, st.int_addr, st.int_port).is_some() {
                return Err(refuse(format!("{}:{} conflicts with another static mapping", fmt_addr(st.ext_addr), st.ext_port)));
            }
            // Every worker keeps the port out of its allocator; only the
            // subscriber's own worker holds the mapping.
            if shard::worker_of_subscriber(st.int_addr, self.cfg.shard.count) != self.cfg.shard.index {
                continue;
            }
            let sub = self.subs.find_or_create(st.int_addr).ok_or_else(|| refuse("more static subscribers than nat.max_subscribers".into()))?;
            let m = Mapping { int_addr: st.int_addr, ext_addr: st.ext_addr, int_port: st.int_port, ext_port: st.ext_port, proto: st.proto, flags: mapping_flags::STATIC };
            self.tables.insert_mapping(m).map_err(|_| refuse("the mapping table is full".into()))?;
            let s = self.subs.get_mut(sub);
            s.mappings += 1;
            if s.paired == NONE {
                s.paired = ext_index;
            }
        }
        Ok(())
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The RFC 7422 formula in deterministic mode.
    pub fn deterministic(&self) -> Option<&Deterministic> {
        self.det.as_ref()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn subscribers(&self) -> &Subscribers {
        &self.subs
    }

    pub fn events_lost(&self) -> u64 {
        self.events.lost()
    }

    /// Takes the queued events.
    pub fn drain_events(&mut self, f: impl FnMut(Event)) {
        self.events.drain().for_each(f);
    }

    /// Takes the frames the engine generated or released.
    pub fn drain_output(&mut self, f: impl FnMut(&OutFrame)) {
        self.out.drain(f);
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Bytes held by tables, allocator and subscriber state.
    pub fn memory_bytes(&self) -> usize {
        self.tables.memory_bytes() + self.pool.memory_bytes() + self.subs.memory_bytes()
    }

    /// Translates one frame in place. `now_ns` must not go backwards (a time
    /// earlier than the last one is taken as the last one).
    pub fn process(&mut self, frame: &mut [u8], side: Side, now_ns: u64) -> Verdict {
        self.advance(now_ns);
        self.stats.received[side as usize] += 1;
        match self.candidate(frame, side) {
            Some(c) => self.decide(frame, side, &c),
            None => self.full_path(frame, side),
        }
    }

    pub(crate) fn full_path(&mut self, frame: &mut [u8], side: Side) -> Verdict {
        let result = match side {
            Side::Inside => self.arrived_inside(frame),
            Side::Outside => self.arrived_outside(frame),
        };
        self.verdict_of(result)
    }

    /// Counts a handled frame's outcome and says what became of it.
    pub(crate) fn verdict_of(&mut self, result: Result<Option<Side>, DropReason>) -> Verdict {
        match result {
            Ok(Some(out)) => {
                self.stats.forwarded[out as usize] += 1;
                Verdict::Forward(out)
            }
            Ok(None) => {
                self.stats.held += 1;
                Verdict::Held
            }
            Err(r) => {
                self.stats.drops.count(r);
                Verdict::Drop(r)
            }
        }
    }

    /// `process` without the fast path: every frame takes the full path.
    /// The fast path must never decide differently; tests hold it to that.
    #[doc(hidden)]
    pub fn process_full(&mut self, frame: &mut [u8], side: Side, now_ns: u64) -> Verdict {
        self.advance(now_ns);
        self.stats.received[side as usize] += 1;
        self.full_path(frame, side)
    }

    /// Moves the clock: expires sessions, ends hold-downs, answers held SYNs
    /// and drops fragments that waited too long.
    pub fn advance(&mut self, now_ns: u64) {
        if now_ns > self.now_ns {
            self.now_ns = now_ns;
        }
        let s = (self.now_ns / NS) as u32;
        if s != self.now_s {
            self.now_s = s;
            // PCP lifetimes keep their sessions alive: touched before expiry runs.
            self.pcp_tick();
            self.expire_sessions();
            self.pool.expire_holds(s);
        }
        while self.syn_holds.front().is_some_and(|h| h.deadline_ns <= self.now_ns) {
            if let Some(h) = self.syn_holds.pop_front() {
                self.answer_held_syn(&h);
            }
        }
        for _ in 0..self.frags.expire(self.now_ns) {
            self.stats.drops.count(DropReason::FragmentTimeout);
        }
    }

    /// Ends a run (the end of a capture): resolves every held SYN as if its
    /// hold had passed and drops every fragment still waiting.
    pub fn finish(&mut self) {
        while let Some(h) = self.syn_holds.pop_front() {
            self.now_ns = self.now_ns.max(h.deadline_ns);
            self.answer_held_syn(&h);
        }
        for _ in 0..self.frags.drop_all_held() {
            self.stats.drops.count(DropReason::FragmentTimeout);
        }
    }

    fn parse_ip(&self, frame: &[u8]) -> Result<Ip, DropReason> {
        let eth = ethernet::Frame::new_checked(frame).map_err(|_| DropReason::EthTruncated)?;
        if eth.ethertype() != ethernet::ETHERTYPE_IPV4 {
            return Err(DropReason::NotIpv4);
        }
        let l3 = eth.payload_offset();
        let ip = ipv4::Packet::new_checked(&frame[l3..]).map_err(ipv4_reason)?;
        if !ip.verify_checksum() {
            return Err(DropReason::Ipv4BadChecksum);
        }
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        if is_martian(src) || is_martian(dst) {
            return Err(DropReason::Martian);
        }
        let hl = ip.header_len();
        Ok(Ip {
            l3,
            l4: l3 + hl,
            l4_len: usize::from(ip.total_len()) - hl,
            proto: ip.protocol(),
            src,
            dst,
            ttl: ip.ttl(),
            ident: ip.ident(),
            first_frag: ip.more_frags() && ip.frag_offset() == 0,
            later_frag: ip.frag_offset() != 0,
            dont_fragment: ip.dont_frag(),
        })
    }

    fn parse_flow(&self, frame: &[u8], ip: &Ip) -> Result<Flow, DropReason> {
        let l4 = &frame[ip.l4..ip.l4 + ip.l4_len];
        let short = if ip.first_frag { DropReason::FragmentTooSmall } else { DropReason::L4Truncated };
        let proto = Proto::from_ip(ip.proto).ok_or(DropReason::UnsupportedProtocol)?;
        match proto {
            Proto::Tcp => {
                let t = tcp::Packet::new_checked(l4).map_err(|_| short)?;
                Ok(Flow { proto, sport: t.src_port(), dport: t.dst_port(), tcp_flags: t.flags(), l4: L4::Tcp { at: ip.l4, len: ip.l4_len }, icmp_class: None })
            }
            Proto::Udp => {
                let u = if ip.first_frag { natrix_wire::udp::Packet::new_lax(l4) } else { natrix_wire::udp::Packet::new_checked(l4) };
                let u = u.map_err(|_| short)?;
                Ok(Flow { proto, sport: u.src_port(), dport: u.dst_port(), tcp_flags: 0, l4: L4::Udp { at: ip.l4 }, icmp_class: None })
            }
            Proto::Icmp => {
                let m = icmp::Packet::new_checked(l4).map_err(|_| short)?;
                let class = icmp::classify(m.msg_type());
                Ok(Flow { proto, sport: m.ident(), dport: m.ident(), tcp_flags: 0, l4: L4::IcmpQuery { at: ip.l4 }, icmp_class: Some(class) })
            }
        }
    }

    fn arrived_inside(&mut self, frame: &mut [u8]) -> Result<Option<Side>, DropReason> {
        let ip = self.parse_ip(frame)?;
        if ip.dst == self.cfg.inside_addr {
            if self.cfg.pcp.is_some() {
                // Answered through the output queue; the request itself ends here.
                self.pcp_request(frame, &ip);
            }
            return Err(DropReason::LocalDestination);
        }
        if ip.ttl <= 1 {
            self.send_icmp_error(frame, ip.l3, self.cfg.inside_addr, Side::Inside, (icmp::kind::TIME_EXCEEDED, 0), 0);
            return Err(DropReason::TtlExpired);
        }
        self.check_mtu(frame, &ip, Side::Outside, self.cfg.inside_addr, Side::Inside)?;
        if ip.later_frag {
            return self.later_fragment(frame, &ip, Side::Inside);
        }
        let out = if self.is_exempt_out(frame, &ip) {
            Side::Outside
        } else if self.is_icmp_error(frame, &ip) {
            self.icmp_error_from_inside(frame, &ip)?
        } else {
            let flow = self.parse_flow(frame, &ip)?;
            self.translate_out(frame, &ip, &flow)?
        };
        self.finish_forward(frame, &ip, Side::Inside, out);
        Ok(Some(out))
    }

    fn arrived_outside(&mut self, frame: &mut [u8]) -> Result<Option<Side>, DropReason> {
        let ip = self.parse_ip(frame)?;
        let to_pool = self.pool.contains(ip.dst);
        if !to_pool {
            if Some(ip.dst) == self.cfg.outside_addr {
                return Err(DropReason::LocalDestination);
            }
            if !self.is_exempt_in(frame, &ip) {
                return Err(DropReason::NotForPool);
            }
        }
        if ip.ttl <= 1 {
            self.send_icmp_error(frame, ip.l3, self.outside_source, Side::Outside, (icmp::kind::TIME_EXCEEDED, 0), 0);
            return Err(DropReason::TtlExpired);
        }
        self.check_mtu(frame, &ip, Side::Inside, self.outside_source, Side::Outside)?;
        if ip.later_frag {
            return self.later_fragment(frame, &ip, Side::Outside);
        }
        let out = if !to_pool {
            Side::Inside
        } else if self.is_icmp_error(frame, &ip) {
            self.icmp_error_from_outside(frame, &ip)?
        } else {
            self.translate_in(frame, &ip)?
        };
        self.finish_forward(frame, &ip, Side::Outside, out);
        Ok(Some(out))
    }

    /// A datagram larger than the link it leaves on: with DF, tell the sender
    /// the MTU (RFC 1191 path MTU discovery); without, drop it, since
    /// natrix does not fragment.
    fn check_mtu(&mut self, frame: &[u8], ip: &Ip, out: Side, icmp_src: u32, back: Side) -> Result<(), DropReason> {
        let mtu = self.cfg.egress_mtu[out as usize];
        let total = ip.l4 - ip.l3 + ip.l4_len;
        if mtu == 0 || total <= usize::from(mtu) {
            return Ok(());
        }
        if !ip.dont_fragment {
            return Err(DropReason::TooBig);
        }
        self.send_icmp_error(frame, ip.l3, icmp_src, back, (icmp::kind::DEST_UNREACHABLE, icmp::unreachable::FRAG_NEEDED), mtu);
        Err(DropReason::FragmentationNeeded)
    }

    /// Common tail of every forwarded frame: remember a first fragment's
    /// rewrite (and release fragments that waited for it), then the TTL.
    fn finish_forward(&mut self, frame: &mut [u8], ip: &Ip, arrived: Side, out: Side) {
        if ip.first_frag {
            let now = ipv4::Packet::new_lax(&frame[ip.l3..]).map(|p| (p.src_addr(), p.dst_addr())).unwrap_or((ip.src, ip.dst));
            let key = FragKey { src: ip.src, dst: ip.dst, ident: ip.ident, proto: ip.proto, side: arrived };
            let rw = FragRewrite { src: now.0, dst: now.1, out };
            self.frags.record(key, rw, self.now_ns);
            self.release_held_fragments(&key, rw);
        }
        rewrite::decrement_ttl(frame, ip.l3);
    }

    fn later_fragment(&mut self, frame: &mut [u8], ip: &Ip, side: Side) -> Result<Option<Side>, DropReason> {
        let key = FragKey { src: ip.src, dst: ip.dst, ident: ip.ident, proto: ip.proto, side };
        if let Some(rw) = self.frags.lookup(&key, self.now_ns) {
            apply_fragment_rewrite(frame, ip.l3, rw);
            rewrite::decrement_ttl(frame, ip.l3);
            return Ok(Some(rw.out));
        }
        if self.frags.hold(key, frame, ip.l3, self.now_ns) {
            Ok(None)
        } else {
            Err(DropReason::FragmentBufferFull)
        }
    }

    fn release_held_fragments(&mut self, key: &FragKey, rw: FragRewrite) {
        let Engine { frags, out, stats, now_ns, .. } = self;
        frags.take_held(key, |h| {
            apply_fragment_rewrite(&mut h.frame, h.l3, rw);
            rewrite::decrement_ttl(&mut h.frame, h.l3);
            let mut buf = out.buffer();
            buf.extend_from_slice(&h.frame);
            out.push(rw.out, *now_ns, buf);
            stats.forwarded[rw.out as usize] += 1;
        });
    }

    fn ports_of(&self, frame: &[u8], ip: &Ip) -> (u16, u16) {
        if (ip.proto == proto::TCP || ip.proto == proto::UDP) && ip.l4_len >= 4 {
            (natrix_wire::get_u16_at(frame, ip.l4), natrix_wire::get_u16_at(frame, ip.l4 + 2))
        } else {
            (0, 0)
        }
    }

    fn is_exempt_out(&self, frame: &[u8], ip: &Ip) -> bool {
        if self.cfg.exempt.is_empty() {
            return false;
        }
        let (_, dport) = self.ports_of(frame, ip);
        self.cfg.exempt.iter().any(|e| e.matches(ip.dst, dport))
    }

    /// Replies from an exempt destination to a subscriber's own address.
    fn is_exempt_in(&self, frame: &[u8], ip: &Ip) -> bool {
        if self.cfg.exempt.is_empty() || !prefix_contains(self.cfg.inside_addr, self.cfg.inside_prefix_len, ip.dst) {
            return false;
        }
        let (sport, _) = self.ports_of(frame, ip);
        self.cfg.exempt.iter().any(|e| e.matches(ip.src, sport))
    }

    /// Translates an outbound datagram; refusals for lack of resources are
    /// answered (RFC 6888 REQ-8).
    fn translate_out(&mut self, frame: &mut [u8], ip: &Ip, flow: &Flow) -> Result<Side, DropReason> {
        let result = self.translate_out_flow(frame, ip, flow);
        self.answer_refusal(frame, ip.l3, result)
    }

    /// RFC 6888 REQ-8: an outbound datagram refused for lack of resources
    /// is answered.
    pub(crate) fn answer_refusal<T>(&mut self, frame: &[u8], l3: usize, result: Result<T, DropReason>) -> Result<T, DropReason> {
        if let Err(r) = &result {
            if r.is_resource() {
                self.refuse(frame, l3);
            }
        }
        result
    }

    fn translate_out_flow(&mut self, frame: &mut [u8], ip: &Ip, flow: &Flow) -> Result<Side, DropReason> {
        let hairpin = self.pool.contains(ip.dst);
        let may_create = match flow.icmp_class {
            None | Some(icmp::Class::QueryRequest) => true,
            Some(icmp::Class::QueryReply) => false,
            Some(_) => return Err(DropReason::IcmpUnsupported),
        };
        if hairpin && flow.proto == Proto::Icmp {
            // Queries to a pool address reach no subscriber: identifiers are ours.
            return Err(DropReason::NoMapping);
        }
        let (port, rport) = flow.out_ports();
        let hash_in = self.tables.hash_in(flow.proto, ip.src, port);
        let found = self.tables.lookup_in_hinted(NIL, hash_in, flow.proto, ip.src, port, ip.dst, rport);
        let looked = Looked { hash_in, found, sub_hint: NONE };
        let sid = self.outbound_session(ip.src, ip.dst, flow, may_create, looked)?;
        let s = self.tables.endpoints(sid);
        rewrite::rewrite(frame, ip.l3, flow.l4, Which::Src, s.ext_addr, s.ext_port);
        if !hairpin || !self.owns_external(flow.proto, ip.dst, flow.dport) {
            // A hairpin to another worker's mapping leaves as if outbound; the
            // dataplane turns it around to that worker as an inbound packet.
            return Ok(Side::Outside);
        }
        let peer = self.inbound_session(frame, ip.l3, flow.proto, ip.dst, flow.dport, s.ext_addr, s.ext_port, flow.tcp_flags, true)?;
        let p = self.tables.endpoints(peer);
        rewrite::rewrite(frame, ip.l3, flow.l4, Which::Dst, p.int_addr, p.int_port);
        Ok(Side::Inside)
    }

    fn owns_external(&self, proto: Proto, addr: u32, port: u16) -> bool {
        self.owners.of_external(proto, addr, port) == self.cfg.shard.index
    }

    fn translate_in(&mut self, frame: &mut [u8], ip: &Ip) -> Result<Side, DropReason> {
        let flow = self.parse_flow(frame, ip)?;
        match flow.icmp_class {
            None | Some(icmp::Class::QueryReply) => {}
            // Inbound requests carry the remote's identifier, not one of ours.
            Some(icmp::Class::QueryRequest) => return Err(DropReason::NoMapping),
            Some(_) => return Err(DropReason::IcmpUnsupported),
        }
        let (port, rport) = flow.in_ports();
        let sid = self.inbound_session(frame, ip.l3, flow.proto, ip.dst, port, ip.src, rport, flow.tcp_flags, false)?;
        let s = self.tables.endpoints(sid);
        rewrite::rewrite(frame, ip.l3, flow.l4, Which::Dst, s.int_addr, s.int_port);
        Ok(Side::Inside)
    }

    /// The session of an outbound datagram from `src` to `dst`, made if
    /// there is none and `may_create`.
    #[inline(always)]
    pub(crate) fn outbound_session(&mut self, src: u32, dst: u32, flow: &Flow, may_create: bool, looked: Looked) -> Result<u32, DropReason> {
        let (port, rport) = flow.out_ports();
        let found = looked.found;
        if let Some(id) = found.and_then(|f| f.session) {
            self.track(id, Direction::Out, flow.tcp_flags, true);
            return Ok(id);
        }
        if !may_create {
            return Err(DropReason::NoMapping);
        }
        let made = match found {
            Some(f) => self.create_session(f.mapping, dst, rport, Direction::Out, flow.tcp_flags),
            None => {
                let (mid, sub) = self.create_mapping(flow.proto, src, port, looked.sub_hint, looked.hash_in)?;
                self.create_session_of(sub, mid, dst, rport, Direction::Out, flow.tcp_flags).inspect_err(|_| self.delete_mapping(mid, true))
            }
        };
        let sid = made?;
        if flow.proto == Proto::Tcp && flow.tcp_flags & tcp::flags::SYN != 0 && !self.syn_holds.is_empty() {
            let ends = self.tables.endpoints(sid);
            self.cancel_held_syn(ends.ext_addr, ends.ext_port, dst, rport);
        }
        Ok(sid)
    }

    #[allow(clippy::too_many_arguments)]
    fn inbound_session(&mut self, frame: &[u8], l3: usize, proto: Proto, ext: u32, eport: u16, rem: u32, rport: u16, tcp_flags: u8, hairpin: bool) -> Result<u32, DropReason> {
        let found = self.tables.lookup_out(proto, ext, eport, rem, rport);
        if let Some(id) = found.and_then(|f| f.session) {
            self.track(id, Direction::In, tcp_flags, self.cfg.inbound_refresh);
            return Ok(id);
        }
        let Some(mid) = found.map(|f| f.mapping) else {
            let plain_syn = tcp_flags & (tcp::flags::SYN | tcp::flags::ACK | tcp::flags::RST) == tcp::flags::SYN;
            if proto == Proto::Tcp && plain_syn && !hairpin {
                self.hold_syn(frame, l3, ext, eport, rem, rport);
                return Err(DropReason::UnsolicitedSyn);
            }
            return Err(DropReason::NoMapping);
        };
        if !self.filter_allows(mid, rem, rport) {
            return Err(DropReason::Filtered);
        }
        self.create_session(mid, rem, rport, Direction::In, tcp_flags)
    }

    /// RFC 4787 REQ-8: which remote endpoints may use an existing mapping.
    fn filter_allows(&self, mid: u32, rem: u32, rport: u16) -> bool {
        if self.tables.mapping(mid).flags & mapping_flags::STATIC != 0 {
            return true;
        }
        // A PCP MAP mapping: endpoint-independent, or its FILTER options.
        if let Some(allowed) = self.pcp_filter(mid, rem, rport) {
            return allowed;
        }
        match self.cfg.filtering {
            Filtering::EndpointIndependent => true,
            Filtering::AddressDependent => self.tables.sessions_of(mid).any(|s| self.tables.session(s).rem_addr == rem),
            // The exact (address, port) session would already have matched.
            Filtering::AddressAndPortDependent => false,
        }
    }

    /// Runs a packet of session `id` through its protocol's tracker and
    /// refreshes it; returns its endpoints for the rewrite.
    #[inline]
    pub(crate) fn track(&mut self, id: u32, dir: Direction, tcp_flags: u8, refresh: bool) -> Endpoints {
        self.tables.on_packet(id, self.now_s, refresh, |proto, state, class| {
            // Most packets change nothing: UDP and ICMP ones (no flags) and
            // TCP segments without SYN, FIN or RST, which leave the state and
            // so the class it gives. Testing that first spares a branch on
            // the protocol, which live traffic mixes unpredictably.
            if !trackers::tcp::acts_on(tcp_flags) {
                debug_assert!(proto != Proto::Tcp || class == trackers::tcp::timeout_class(*state), "a TCP session's class follows its state");
                return class;
            }
            match proto {
                Proto::Tcp => {
                    trackers::tcp::on_segment(state, dir, tcp_flags);
                    trackers::tcp::timeout_class(*state)
                }
                _ => class,
            }
        })
    }

    /// Makes a mapping for an internal endpoint, whose hash is `hash_in` and
    /// whose subscriber may be `sub_hint` (checked; NONE: unknown); returns
    /// it and its subscriber.
    #[inline(always)]
    fn create_mapping(&mut self, proto: Proto, int: u32, iport: u16, sub_hint: u32, hash_in: u64) -> Result<(u32, u32), DropReason> {
        if self.det.as_ref().is_some_and(|d| d.index_of(int).is_none()) {
            return Err(DropReason::NotSubscriber);
        }
        let sub = self.subs.find_or_create_hinted(int, sub_hint).ok_or(DropReason::SubscriberTableFull)?;
        let result = self.allocate_for(sub, proto, int, iport, hash_in);
        if result.is_err() {
            self.subs.release_if_idle(sub);
        }
        result.map(|mid| (mid, sub))
    }

    #[inline(always)]
    fn allocate_for(&mut self, sub: u32, proto: Proto, int: u32, iport: u16, hash_in: u64) -> Result<u32, DropReason> {
        let cfg_ports = self.cfg.max_ports_per_subscriber;
        let per_proto = self.cfg.max_ports_per_protocol[proto as usize];
        let s = self.subs.get(sub);
        if s.ports_total() >= cfg_ports || s.ports[proto as usize] >= per_proto {
            self.event(EventKind::QuotaExceeded, proto, int, iport, 0, 0, 0, 0, 0);
            return Err(DropReason::PortQuota);
        }
        let (now_s, rate) = (self.now_s, self.cfg.max_new_mappings_per_second);
        if !self.subs.get_mut(sub).admit_new_mapping(now_s, rate) {
            return Err(DropReason::RateLimited);
        }
        let mut paired = self.subs.get(sub).paired;
        let det_range = self.det.as_ref().and_then(|d| d.assignment(int));
        if let Some(a) = det_range {
            paired = self.pool.index_of(a.ext_addr).ok_or(DropReason::PoolExhausted)?;
            self.subs.get_mut(sub).paired = paired;
        } else if paired == NONE {
            match self.pool.choose_address(hash::address(self.cfg.seed, int), proto) {
                Some(a) => paired = a,
                None => {
                    self.event(EventKind::AddressesExhausted, proto, int, iport, 0, 0, 0, 0, 0);
                    return Err(DropReason::PoolExhausted);
                }
            }
            self.subs.get_mut(sub).paired = paired;
        }
        let (port, block) = if let Some(a) = det_range {
            (self.pool.alloc_port_in(paired, proto, iport, (a.first, a.last), &mut self.rng), None)
        } else if self.cfg.port_block_size == 0 {
            (self.pool.alloc_port(paired, proto, iport, &mut self.rng), None)
        } else {
            let max_blocks = (cfg_ports.min(per_proto) as usize).div_ceil(usize::from(self.cfg.port_block_size)).max(1);
            let mut blocks = std::mem::take(&mut self.subs.get_mut(sub).blocks);
            let r = self.pool.alloc_in_blocks(paired, proto, iport, sub, &mut blocks, max_blocks, &mut self.rng);
            self.subs.get_mut(sub).blocks = blocks;
            match r {
                Ok((p, b)) => (Ok(p), b),
                Err(e) => (Err(e), None),
            }
        };
        let ext_addr = self.pool.address(paired);
        let port = match port {
            Ok(p) => p,
            Err(AllocError::Exhausted) if det_range.is_none() => {
                self.event(EventKind::PortsExhausted, proto, int, iport, ext_addr, 0, 0, 0, 0);
                return Err(DropReason::PoolExhausted);
            }
            // Out of blocks, or a full deterministic range: the subscriber's whole allowance.
            Err(_) => {
                self.event(EventKind::QuotaExceeded, proto, int, iport, ext_addr, 0, 0, 0, 0);
                return Err(DropReason::PortQuota);
            }
        };
        if let Some(b) = block {
            self.event(EventKind::BlockAllocated, proto, int, 0, b.addr, b.first, b.last, 0, 0);
        }
        let m = Mapping { int_addr: int, ext_addr, int_port: iport, ext_port: port, proto, flags: 0 };
        let mid = match self.tables.insert_mapping_hashed(m, hash_in) {
            Ok(id) => id,
            Err(_) => {
                let mut blocks = std::mem::take(&mut self.subs.get_mut(sub).blocks);
                self.pool.release(paired, proto, port, self.now_s, true, &mut blocks);
                self.subs.get_mut(sub).blocks = blocks;
                return Err(DropReason::SessionTableFull);
            }
        };
        let s = self.subs.get_mut(sub);
        s.ports[proto as usize] += 1;
        s.mappings += 1;
        self.stats.mappings_created += 1;
        self.stats.peak_mappings = self.stats.peak_mappings.max(self.tables.mapping_count() as u64);
        self.stats.peak_ports_in_use = self.stats.peak_ports_in_use.max(self.pool.ports_in_use());
        self.event(EventKind::MappingCreated, proto, int, iport, ext_addr, port, port, 0, 0);
        Ok(mid)
    }

    fn create_session(&mut self, mid: u32, rem: u32, rport: u16, dir: Direction, tcp_flags: u8) -> Result<u32, DropReason> {
        let sub = self.subscriber_of(self.tables.mapping(mid).int_addr).ok_or(DropReason::SubscriberTableFull)?;
        self.create_session_of(sub, mid, rem, rport, dir, tcp_flags)
    }

    /// `create_session` for a mapping whose subscriber the caller has at hand.
    #[inline(always)]
    fn create_session_of(&mut self, sub: u32, mid: u32, rem: u32, rport: u16, dir: Direction, tcp_flags: u8) -> Result<u32, DropReason> {
        let m = self.tables.mapping(mid);
        if self.subs.get(sub).sessions >= self.cfg.max_sessions_per_subscriber {
            return Err(DropReason::SessionQuota);
        }
        let mut state = 0;
        let class = match m.proto {
            Proto::Tcp => {
                trackers::tcp::on_segment(&mut state, dir, tcp_flags);
                trackers::tcp::timeout_class(state)
            }
            Proto::Udp => trackers::udp::timeout_class(),
            Proto::Icmp => trackers::icmp::timeout_class(),
        };
        let sid = self.tables.insert_session(mid, rem, rport, state, class, self.now_s).map_err(|_| DropReason::SessionTableFull)?;
        self.subs.get_mut(sub).sessions += 1;
        self.stats.sessions_created += 1;
        self.stats.peak_sessions = self.stats.peak_sessions.max(self.tables.session_count() as u64);
        if self.cfg.log_sessions {
            self.event(EventKind::SessionCreated, m.proto, m.int_addr, m.int_port, m.ext_addr, m.ext_port, m.ext_port, rem, rport);
        }
        Ok(sid)
    }

    pub(crate) fn timeout_of(&self, class: TimeoutClass) -> u32 {
        self.cfg.timeouts.by_class()[class as usize]
    }

    fn expire_sessions(&mut self) {
        let mut due = std::mem::take(&mut self.expired);
        self.tables.expire(self.now_s, &mut due);
        self.delete_sessions(&mut due);
        due.clear();
        self.expired = due;
    }

    /// The subscriber record of an internal address: every mapping's
    /// subscriber has one for as long as the mapping lives.
    pub(crate) fn subscriber_of(&self, int_addr: u32) -> Option<u32> {
        self.subs.find(int_addr)
    }

    /// Deletes many sessions. Extras go before own sessions (their ids sort
    /// higher), so ending an own session never promotes one that is going too.
    pub(crate) fn delete_sessions(&mut self, ids: &mut [u32]) {
        ids.sort_unstable_by(|a, b| b.cmp(a));
        for &id in ids.iter() {
            if self.tables.is_live(id) {
                self.delete_session(id);
            }
        }
    }

    pub(crate) fn delete_session(&mut self, id: u32) {
        let s = self.tables.remove_session(id);
        let sub = self.subscriber_of(s.int_addr);
        if let Some(sub) = sub {
            self.subs.get_mut(sub).sessions -= 1;
        }
        if self.cfg.log_sessions {
            self.event(EventKind::SessionDeleted, s.proto, s.int_addr, s.int_port, s.ext_addr, s.ext_port, s.ext_port, s.rem_addr, s.rem_port);
        }
        let m = self.tables.mapping(s.mapping);
        if !self.tables.has_sessions(s.mapping) && m.flags & mapping_flags::STATIC == 0 {
            let closed = s.proto == Proto::Tcp && trackers::tcp::is_closed(s.state);
            self.delete_mapping(s.mapping, closed);
        } else if let Some(sub) = sub {
            self.subs.release_if_idle(sub);
        }
    }

    /// Removes a mapping with no sessions left. `skip_hold_down` for TCP
    /// closed by FIN or RST (RFC 6888 REQ-5) or a mapping that never carried traffic.
    fn delete_mapping(&mut self, mid: u32, skip_hold_down: bool) {
        let m = self.tables.mapping(mid);
        self.tables.remove_mapping(mid);
        self.event(EventKind::MappingDeleted, m.proto, m.int_addr, m.int_port, m.ext_addr, m.ext_port, m.ext_port, 0, 0);
        let sub = self.subscriber_of(m.int_addr);
        debug_assert!(sub.is_some(), "a mapping outlived its subscriber");
        let mut blocks = sub.map(|s| std::mem::take(&mut self.subs.get_mut(s).blocks)).unwrap_or_default();
        // The port goes back even if the subscriber record were missing.
        let released = match self.pool.index_of(m.ext_addr) {
            Some(ext_index) => self.pool.release(ext_index, m.proto, m.ext_port, self.now_s, skip_hold_down, &mut blocks),
            None => None,
        };
        if let Some(b) = released {
            self.event(EventKind::BlockReleased, m.proto, m.int_addr, 0, b.addr, b.first, b.last, 0, 0);
        }
        let Some(sub) = sub else { return };
        let s = self.subs.get_mut(sub);
        s.blocks = blocks;
        s.ports[m.proto as usize] -= 1;
        s.mappings -= 1;
        if s.mappings == 0 && s.blocks.is_empty() {
            s.paired = NONE;
        }
        self.subs.release_if_idle(sub);
    }

    #[allow(clippy::too_many_arguments)]
    fn event(&mut self, kind: EventKind, proto: Proto, int_addr: u32, int_port: u16, ext_addr: u32, ext_port: u16, ext_port_end: u16, rem_addr: u32, rem_port: u16) {
        self.events.push(Event { kind, time_ns: self.now_ns, proto, int_addr, int_port, ext_addr, ext_port, ext_port_end, rem_addr, rem_port });
    }

    fn hold_syn(&mut self, frame: &[u8], l3: usize, ext_addr: u32, ext_port: u16, rem_addr: u32, rem_port: u16) {
        if self.syn_holds.len() >= self.cfg.max_held_syns as usize {
            return;
        }
        let len = frame.len().min(HELD_SYN_BYTES);
        let mut bytes = [0u8; HELD_SYN_BYTES];
        bytes[..len].copy_from_slice(&frame[..len]);
        let deadline_ns = self.now_ns + self.cfg.timeouts.syn_hold_ns;
        self.syn_holds.push_back(HeldSyn { deadline_ns, ext_addr, ext_port, rem_addr, rem_port, l3, len, bytes });
    }

    /// RFC 5382 REQ-4: an outbound SYN for the held connection silences the held one.
    fn cancel_held_syn(&mut self, ext_addr: u32, ext_port: u16, rem_addr: u32, rem_port: u16) {
        self.syn_holds.retain(|h| !(h.ext_addr == ext_addr && h.ext_port == ext_port && h.rem_addr == rem_addr && h.rem_port == rem_port));
    }

    fn answer_held_syn(&mut self, h: &HeldSyn) {
        if self.cfg.unsolicited_syn != UnsolicitedSyn::IcmpPortUnreachable {
            return;
        }
        // Callers have moved the clock to or past the deadline; the answer is
        // stamped with the deadline itself, when the hold ended.
        let now = self.now_ns;
        self.now_ns = h.deadline_ns;
        self.send_icmp_error(&h.bytes[..h.len], h.l3, h.ext_addr, Side::Outside, (icmp::kind::DEST_UNREACHABLE, icmp::unreachable::PORT), 0);
        self.now_ns = now;
    }

    /// RFC 6888 REQ-8: tell the subscriber why its packet went nowhere.
    fn refuse(&mut self, frame: &[u8], l3: usize) {
        if let Some(code) = self.cfg.exhaustion_icmp_code {
            self.send_icmp_error(frame, l3, self.cfg.inside_addr, Side::Inside, (icmp::kind::DEST_UNREACHABLE, code), 0);
        }
    }

    fn send_icmp_error(&mut self, frame: &[u8], l3: usize, src: u32, side: Side, (msg_type, code): (u8, u8), next_hop_mtu: u16) {
        if !may_trigger_icmp_error(frame, l3) {
            return;
        }
        if self.icmp_window_s != self.now_s {
            self.icmp_window_s = self.now_s;
            self.icmp_sent = 0;
        }
        if self.icmp_sent >= self.cfg.icmp_errors_per_second {
            return;
        }
        self.icmp_sent += 1;
        self.ip_ident = self.ip_ident.wrapping_add(1);
        let mut buf = self.out.buffer();
        emit::icmp_error(&mut buf, frame, l3, src, emit::IcmpError { msg_type, code, next_hop_mtu }, self.ip_ident);
        self.out.push(side, self.now_ns, buf);
        self.stats.generated[side as usize] += 1;
    }
}

/// RFC 1812 section 4.3.2.7: no ICMP error about an ICMP error, a non-first
/// fragment, or a frame sent to a link-layer broadcast or multicast address.
fn may_trigger_icmp_error(frame: &[u8], l3: usize) -> bool {
    if frame.first().is_none_or(|b| b & 1 != 0) {
        return false;
    }
    let Ok(ip) = ipv4::Packet::new_lax(&frame[l3..]) else { return false };
    if ip.frag_offset() != 0 {
        return false;
    }
    let l4 = l3 + ip.header_len();
    !(ip.protocol() == proto::ICMP && frame.get(l4).is_some_and(|&t| icmp::classify(t) == icmp::Class::Error))
}

fn apply_fragment_rewrite(frame: &mut [u8], l3: usize, rw: FragRewrite) {
    let Ok(p) = ipv4::Packet::new_lax(&frame[l3..]) else { return };
    let (src, dst) = (p.src_addr(), p.dst_addr());
    if src != rw.src {
        rewrite::rewrite(frame, l3, L4::None, Which::Src, rw.src, 0);
    }
    if dst != rw.dst {
        rewrite::rewrite(frame, l3, L4::None, Which::Dst, rw.dst, 0);
    }
}

/// What the PCP server (`crate::pcp`) uses of the packet path: it makes and
/// removes state only through these, so PCP mappings are ordinary ones.
impl Engine {
    pub(crate) fn pcp_create_mapping(&mut self, proto: Proto, int: u32, iport: u16) -> Result<u32, DropReason> {
        self.create_mapping(proto, int, iport, NONE, self.tables.hash_in(proto, int, iport)).map(|(mid, _)| mid)
    }

    pub(crate) fn pcp_create_session(&mut self, mid: u32, rem: u32, rport: u16, dir: Direction, tcp_flags: u8) -> Result<u32, DropReason> {
        self.create_session(mid, rem, rport, dir, tcp_flags)
    }

    pub(crate) fn pcp_delete_mapping(&mut self, mid: u32, skip_hold_down: bool) {
        self.delete_mapping(mid, skip_hold_down);
    }

    pub(crate) fn events_mut(&mut self) -> &mut EventQueue {
        &mut self.events
    }

    pub(crate) fn pcp_next_ident(&mut self) -> u16 {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.ip_ident
    }

    /// Queues a frame natrix generated, built by `build` into a reused
    /// buffer with the next IP identification.
    pub(crate) fn pcp_emit(&mut self, side: Side, build: impl FnOnce(&mut Vec<u8>, u16)) {
        let ident = self.pcp_next_ident();
        let mut buf = self.out.buffer();
        build(&mut buf, ident);
        self.out.push(side, self.now_ns, buf);
        self.stats.generated[side as usize] += 1;
    }
}

pub fn fmt_addr(a: u32) -> String {
    std::net::Ipv4Addr::from(a).to_string()
}
