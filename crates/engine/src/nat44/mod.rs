//! NAPT44 (RFC 4787, 5382, 5508, 6888, 7857): the translator between
//! subscribers' private IPv4 addresses and the pool. Laid out as VPP lays
//! out each of its NAT variants:
//!
//! - `mod.rs`: the translator's state and what the pipeline asks of it;
//! - `sessions`: making and ending mappings and sessions (quotas, port
//!   allocation, paired pooling, port blocks, logging);
//! - `outbound` and `inbound`: the two directions, hairpinning in `outbound`;
//! - `icmp_error`: ICMP errors, the quoted datagram translated the other way;
//! - `fragments`: fragments without reassembly;
//! - `held_syn`: unsolicited inbound SYNs held before they are answered;
//! - `fast` and `batch`: the fast path and the batch path over it;
//! - `pcp_ops`: the narrow interface the PCP server uses;
//! - `synced`: a standby installing its active node's state (session sync).

pub mod batch;
pub(crate) mod fast;
pub mod fragments;
mod held_syn;
mod icmp_error;
mod inbound;
mod outbound;
pub(crate) mod pcp_ops;
pub mod sctp;
mod sessions;
pub mod synced;

pub use batch::MAX_BATCH;
pub(crate) use fast::Candidate;

use natrix_wire::{icmp, tcp};

use crate::config::{prefix_contains, EngineConfig};
use crate::drop::DropReason;
use crate::error::EngineError;
use crate::pipeline::frame::Ip;
use crate::pipeline::router::Router;
use crate::rewrite::L4;
use crate::state::associations::Associations;
use crate::state::deterministic::{Assignment, Deterministic, Member};
use crate::state::events::{Event, EventKind, EventQueue};
use crate::state::identity::Identity;
use crate::state::pool::Pool;
use crate::state::rng::Rng;
use crate::state::sessions::{Found, Tables};
use crate::state::shard::{self, Owners};
use crate::state::subscribers::Subscribers;
use crate::trackers::TimeoutClass;
use crate::{Proto, Side};

use fragments::Fragments;
use held_syn::HeldSyns;
use pcp_ops::FilterRule;

const NS: u64 = 1_000_000_000;
const FRAGMENT_RECORDS: usize = 4096;

/// What the translator has made, for the report and metrics.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub sessions_created: u64,
    pub mappings_created: u64,
    pub peak_sessions: u64,
    pub peak_mappings: u64,
    pub peak_ports_in_use: u64,
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

/// What has been looked up of an outbound datagram before its handling:
/// its internal endpoint's hash and, under it, mapping and session, and its
/// subscriber's id (a guess, checked before use; NONE: not looked up).
#[derive(Clone, Copy)]
pub(crate) struct Looked {
    pub hash_in: u64,
    pub found: Option<Found>,
    pub sub_hint: u32,
}

/// Where a frame arriving from outside is going, as far as NAPT44 is
/// concerned: to a pool address (translated) or to an exempt subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inbound {
    ToPool,
    Exempt,
}

pub struct Nat44 {
    pub(crate) cfg: EngineConfig,
    pub(crate) tables: Tables,
    pub(crate) subs: Subscribers,
    pub(crate) pool: Pool,
    /// SCTP associations (seed 001): keyed by tags, no port translated.
    pub(crate) assocs: Associations,
    pub(crate) frags: Fragments,
    held_syns: HeldSyns,
    events: EventQueue,
    rng: Rng,
    owners: Owners,
    /// Deterministic mode (RFC 7422): the formula that fixes each subscriber's range.
    det: Option<Deterministic>,
    /// Sessions the timer wheel found idle, reused each second.
    expired: Vec<u32>,
    /// FILTER options (RFC 6887 section 13.3) of the mappings PCP holds.
    pcp_filters: std::collections::BTreeMap<(Proto, u32, u16), Vec<FilterRule>>,
    pub(crate) counters: Counters,
    pub(crate) now_ns: u64,
    pub(crate) now_s: u32,
    /// A cluster standby: synced sessions wait for the active node's deletions instead of expiring.
    standby: bool,
}

impl Nat44 {
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        let det = cfg.deterministic.clone();
        // Deterministic ranges belong whole to their subscriber's worker, so
        // every worker's allocator spans the whole range.
        let slice = if det.is_some() { cfg.ports } else { shard::port_slice(cfg.ports, cfg.port_block_size, cfg.shard) };
        let pool = Pool::new(&cfg.pool, slice, cfg.port_block_size, cfg.port_selection, cfg.port_parity, cfg.hold_down_s);
        let owners = Owners::new(cfg.ports, cfg.port_block_size, cfg.shard.count, &cfg.statics).with_deterministic(det.clone());
        let (sessions, subscribers) = table_sizes(&cfg);
        let mut nat = Nat44 {
            tables: Tables::new(sessions, cfg.statics.len(), cfg.seed, cfg.timeouts.by_class())?,
            subs: Subscribers::new(subscribers, cfg.seed)?,
            assocs: Associations::new(associations_of(&cfg), cfg.seed, cfg.timeouts.by_class())?,
            pool,
            frags: Fragments::new(FRAGMENT_RECORDS, cfg.max_held_fragments as usize, cfg.max_held_fragment_bytes as usize, cfg.timeouts.fragment_ns, cfg.seed),
            held_syns: HeldSyns::new(cfg.max_held_syns as usize),
            events: EventQueue::new(cfg.event_capacity as usize),
            rng: Rng::new(cfg.seed),
            owners,
            det,
            expired: Vec::new(),
            pcp_filters: Default::default(),
            counters: Counters::default(),
            now_ns: 0,
            now_s: 0,
            standby: false,
            cfg,
        };
        // A softwire host needs a session to matter: no more of them than sessions.
        nat.subs.identities_mut().limit_endpoints(sessions);
        nat.subs.identities_mut().limit_endpoints_per_b4(nat.cfg.max_ports_per_subscriber);
        nat.install_statics()?;
        Ok(nat)
    }

    /// Bytes an engine for `cfg` reserves when it is built, before any
    /// traffic: the session table and index, the subscriber index and the
    /// pool's port maps. Subscriber records and timer slots grow with use.
    pub fn reserved_bytes(cfg: &EngineConfig) -> u64 {
        let (sessions, subscribers) = table_sizes(cfg);
        (Tables::reserved_bytes(sessions, cfg.statics.len())
            + Subscribers::reserved_bytes(subscribers)
            + Pool::reserved_bytes(cfg.pool.len(), cfg.ports, cfg.port_block_size)
            + Associations::reserved_bytes(associations_of(cfg))) as u64
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The RFC 7422 formula in deterministic mode.
    pub fn deterministic(&self) -> Option<&Deterministic> {
        self.det.as_ref()
    }

    /// The deterministic range of internal address `int`: its own, or for
    /// a softwire host its B4's, which every host behind the B4 shares.
    pub(crate) fn det_assignment(&self, int: u32) -> Option<Assignment> {
        let d = self.det.as_ref()?;
        match self.subs.identities().resolve(int) {
            Identity::Softwire { b4, .. } => d.assignment_of(Member::B4(b4)),
            Identity::Ipv4(a) => d.assignment(a),
        }
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

    pub fn memory_bytes(&self) -> usize {
        self.tables.memory_bytes() + self.pool.memory_bytes() + self.subs.memory_bytes() + self.assocs.memory_bytes()
    }

    /// Hands over the queued events, a softwire host's stand-in resolved
    /// to its B4 and inner address.
    pub(crate) fn drain_events_resolved(&mut self, mut f: impl FnMut(Event)) {
        let ids = self.subs.identities();
        for mut e in self.events.drain() {
            if let crate::state::identity::Identity::Softwire { b4, inner } = ids.resolve(e.int_addr) {
                (e.int_addr, e.b4) = (inner, Some(b4));
            }
            f(e);
        }
        self.reclaim_stand_ins();
    }

    /// Softwire stand-ins nothing names any more are forgotten, now that no
    /// queued event names them. What names one without counting (a held
    /// fragment or SYN) lets go within its own timeout: that is the grace.
    fn reclaim_stand_ins(&mut self) {
        let t = &self.cfg.timeouts;
        let grace = (t.fragment_ns.max(t.syn_hold_ns) / NS) as u32 + 1;
        self.subs.reclaim_stand_ins(self.now_s, grace);
    }

    pub(crate) fn events_lost(&self) -> u64 {
        self.events.lost()
    }

    /// Events the queue holds between drains.
    pub(crate) fn event_capacity(&self) -> usize {
        self.events.capacity()
    }

    /// Moves the clock to `now_ns`; true when a new second began, for
    /// `second_passed` to run (after PCP has touched what it holds).
    pub(crate) fn set_time(&mut self, now_ns: u64) -> bool {
        self.now_ns = now_ns;
        let s = (now_ns / NS) as u32;
        let new_second = s != self.now_s;
        self.now_s = s;
        new_second
    }

    /// Once a second: expires idle sessions and ends hold-downs.
    pub(crate) fn second_passed(&mut self) {
        if !self.standby {
            self.expire_sessions();
            self.expire_associations();
        }
        self.pool.expire_holds(self.now_s);
    }

    /// Answers the held SYNs whose hold has ended and drops the fragments
    /// that waited too long, returning how many, and how many were pushed
    /// out of a full buffer since the last time.
    pub(crate) fn run_timers(&mut self, router: &mut Router) -> (u64, u64) {
        self.held_syns.answer_due(self.now_ns, self.cfg.unsolicited_syn, router);
        (self.frags.expire(self.now_ns), self.frags.take_crowded_out())
    }

    /// Ends a run (the end of a capture): answers every held SYN as if its
    /// hold had passed and drops every fragment still waiting, returning how
    /// many, and how many the last frames pushed out of a full buffer.
    pub(crate) fn finish(&mut self, router: &mut Router) -> (u64, u64) {
        self.held_syns.answer_all(self.cfg.unsolicited_syn, router);
        (self.frags.drop_all_held(), self.frags.take_crowded_out())
    }

    /// Whether a frame that arrived outside is NAPT44's to handle, and how:
    /// to a pool address, or an exempt remote's reply to a subscriber.
    pub(crate) fn admit_inbound(&self, frame: &[u8], ip: &Ip) -> Result<Inbound, DropReason> {
        if self.pool.contains(ip.dst) {
            return Ok(Inbound::ToPool);
        }
        if Some(ip.dst) == self.cfg.outside_addr {
            return Err(DropReason::LocalDestination);
        }
        if self.is_exempt_in(frame, ip) {
            return Ok(Inbound::Exempt);
        }
        Err(DropReason::NotForPool)
    }

    /// Translates a frame that arrived inside (past the router's checks) and
    /// says where it leaves; None: held (a fragment waiting for its first).
    pub(crate) fn translate_outbound(&mut self, frame: &mut [u8], ip: &Ip, router: &mut Router) -> Result<Option<Side>, DropReason> {
        if ip.later_frag {
            return self.later_fragment(frame, ip, Side::Inside);
        }
        let out = if self.is_exempt_out(frame, ip) {
            Side::Outside
        } else if self.is_icmp_error(frame, ip) {
            self.icmp_error_from_inside(frame, ip)?
        } else if ip.proto == natrix_wire::proto::SCTP {
            self.sctp_outbound(frame, ip, router)?
        } else {
            let flow = self.parse_flow(frame, ip)?;
            self.translate_out(frame, ip, &flow)?
        };
        self.after_translation(frame, ip, Side::Inside, out, router);
        Ok(Some(out))
    }

    /// Translates a frame that arrived outside, admitted by `admit_inbound`.
    pub(crate) fn translate_inbound(&mut self, frame: &mut [u8], ip: &Ip, admitted: Inbound, router: &mut Router) -> Result<Option<Side>, DropReason> {
        if ip.later_frag {
            return self.later_fragment(frame, ip, Side::Outside);
        }
        let out = match admitted {
            Inbound::Exempt => Side::Inside,
            Inbound::ToPool if self.is_icmp_error(frame, ip) => self.icmp_error_from_outside(frame, ip)?,
            Inbound::ToPool if ip.proto == natrix_wire::proto::SCTP => self.sctp_inbound(frame, ip, router)?,
            Inbound::ToPool => self.translate_in(frame, ip)?,
        };
        self.after_translation(frame, ip, Side::Outside, out, router);
        Ok(Some(out))
    }

    /// A translated first fragment's rewrite is remembered for the later
    /// fragments, and those that waited for it are released.
    fn after_translation(&mut self, frame: &[u8], ip: &Ip, arrived: Side, out: Side, router: &mut Router) {
        if ip.first_frag {
            self.record_first_fragment(frame, ip, arrived, out, router);
        }
    }

    pub(crate) fn parse_flow(&self, frame: &[u8], ip: &Ip) -> Result<Flow, DropReason> {
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
            // SCTP has associations, not flows: `sctp_outbound` and `sctp_inbound` take it.
            Proto::Sctp => Err(DropReason::UnsupportedProtocol),
        }
    }

    fn ports_of(&self, frame: &[u8], ip: &Ip) -> (u16, u16) {
        // TCP, UDP and SCTP all begin with the two ports.
        if matches!(ip.proto, natrix_wire::proto::TCP | natrix_wire::proto::UDP | natrix_wire::proto::SCTP) && ip.l4_len >= 4 {
            (natrix_wire::get_u16_at(frame, ip.l4), natrix_wire::get_u16_at(frame, ip.l4 + 2))
        } else {
            (0, 0)
        }
    }

    /// RFC 6888 REQ-6: destinations that pass untranslated.
    fn is_exempt_out(&self, frame: &[u8], ip: &Ip) -> bool {
        let (_, dport) = self.ports_of(frame, ip);
        self.is_exempt_destination(ip.dst, dport)
    }

    #[inline]
    fn is_exempt_destination(&self, dst: u32, dport: u16) -> bool {
        !self.cfg.exempt.is_empty() && self.cfg.exempt.iter().any(|e| e.matches(dst, dport))
    }

    /// Replies from an exempt destination to a subscriber's own address.
    fn is_exempt_in(&self, frame: &[u8], ip: &Ip) -> bool {
        if self.cfg.exempt.is_empty() || !prefix_contains(self.cfg.inside_addr, self.cfg.inside_prefix_len, ip.dst) {
            return false;
        }
        let (sport, _) = self.ports_of(frame, ip);
        self.cfg.exempt.iter().any(|e| e.matches(ip.src, sport))
    }

    fn owns_external(&self, proto: Proto, addr: u32, port: u16) -> bool {
        self.owners.of_external(proto, addr, port) == self.cfg.shard.index
    }

    pub(crate) fn timeout_of(&self, class: TimeoutClass) -> u32 {
        self.cfg.timeouts.by_class()[class as usize]
    }

    #[allow(clippy::too_many_arguments)]
    fn event(&mut self, kind: EventKind, proto: Proto, int_addr: u32, int_port: u16, ext_addr: u32, ext_port: u16, ext_port_end: u16, rem_addr: u32, rem_port: u16) {
        self.events.push(Event { kind, time_ns: self.now_ns, proto, int_addr, int_port, ext_addr, ext_port, ext_port_end, rem_addr, rem_port, b4: None });
    }
}

/// SCTP associations the table is built for: none when natrix only routes.
fn associations_of(cfg: &EngineConfig) -> u32 {
    if cfg.translate {
        cfg.sctp.max_associations
    } else {
        0
    }
}

/// Sessions and subscribers the tables are built for: none when natrix
/// only routes.
fn table_sizes(cfg: &EngineConfig) -> (u32, u32) {
    if cfg.translate {
        (cfg.max_sessions, cfg.max_subscribers)
    } else {
        (0, 0)
    }
}
