//! The engine's typed configuration. Parsing and validation of the operator's
//! file live in the control plane; this is what it produces.

use crate::state::shard::Shard;
use crate::Proto;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filtering {
    EndpointIndependent,
    AddressDependent,
    AddressAndPortDependent,
}

impl Filtering {
    pub const ALL: [Filtering; 3] = [Filtering::EndpointIndependent, Filtering::AddressDependent, Filtering::AddressAndPortDependent];

    /// The name operators write in `[nat] filtering` (RFC 4787 section 5 terms).
    pub fn name(self) -> &'static str {
        match self {
            Filtering::EndpointIndependent => "endpoint-independent",
            Filtering::AddressDependent => "address-dependent",
            Filtering::AddressAndPortDependent => "address-and-port-dependent",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSelection {
    /// Keep the subscriber's source port when it is free (RFC 4787 REQ-3 port preservation).
    Preserve,
    /// Always choose pseudo-randomly (RFC 6056).
    Random,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsolicitedSyn {
    /// After the hold, answer ICMP port unreachable (RFC 5382 REQ-4).
    IcmpPortUnreachable,
    Drop,
}

/// A destination that passes untranslated (RFC 6888 REQ-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exemption {
    pub network: u32,
    pub prefix_len: u8,
    pub ports: (u16, u16),
}

impl Exemption {
    pub fn matches(&self, addr: u32, port: u16) -> bool {
        prefix_contains(self.network, self.prefix_len, addr) && (self.ports.0..=self.ports.1).contains(&port)
    }
}

/// An operator-configured mapping that never expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticMapping {
    pub proto: Proto,
    pub int_addr: u32,
    pub int_port: u16,
    pub ext_addr: u32,
    pub ext_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub udp_s: u32,
    pub tcp_established_s: u32,
    pub tcp_transitory_s: u32,
    pub icmp_s: u32,
    pub sctp_init_s: u32,
    pub sctp_s: u32,
    pub syn_hold_ns: u64,
    pub fragment_ns: u64,
}

impl Timeouts {
    /// Idle seconds per timeout class, indexed by `TimeoutClass as usize`.
    pub fn by_class(&self) -> [u32; crate::trackers::TimeoutClass::COUNT] {
        [self.udp_s, self.tcp_established_s, self.tcp_transitory_s, self.icmp_s, self.sctp_init_s, self.sctp_s]
    }
}

impl Timeouts {
    /// The idle timeout of `class`, to set.
    pub fn of_class_mut(&mut self, class: crate::trackers::TimeoutClass) -> &mut u32 {
        use crate::trackers::TimeoutClass::*;
        match class {
            Udp => &mut self.udp_s,
            TcpEstablished => &mut self.tcp_established_s,
            TcpTransitory => &mut self.tcp_transitory_s,
            Icmp => &mut self.icmp_s,
            SctpInit => &mut self.sctp_init_s,
            Sctp => &mut self.sctp_s,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        let mut t = Timeouts { udp_s: 0, tcp_established_s: 0, tcp_transitory_s: 0, icmp_s: 0, sctp_init_s: 0, sctp_s: 0, syn_hold_ns: 6_000_000_000, fragment_ns: 5_000_000_000 };
        for spec in crate::trackers::TIMEOUTS {
            *t.of_class_mut(spec.class) = spec.default_s;
        }
        t
    }
}

/// An IPv6 address natrix holds on a link, with the link's prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr6 {
    pub addr: std::net::Ipv6Addr,
    pub prefix_len: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// `[nat] mode = "off"` clears it: natrix routes between its interfaces
    /// without translating (a router with the middlebox functions).
    pub translate: bool,
    pub inside_addr: u32,
    pub inside_prefix_len: u8,
    /// Source of ICMP natrix sends outside; the first pool address when absent.
    pub outside_addr: Option<u32>,
    /// natrix's IPv6 addresses (`[inside] address6`, `[outside] address6`):
    /// sources of the ICMPv6 errors it sends on each side.
    pub inside_addr6: Option<Addr6>,
    pub outside_addr6: Option<Addr6>,
    /// Every pool address, expanded, sorted and unique.
    pub pool: Vec<u32>,
    pub ports: (u16, u16),
    pub filtering: Filtering,
    pub max_ports_per_subscriber: u32,
    pub max_ports_per_protocol: [u32; Proto::COUNT],
    /// 0 means unlimited.
    pub max_new_mappings_per_second: u32,
    pub max_sessions_per_subscriber: u32,
    /// Sessions one mapping may hold (RFC 6888 REQ-5); 0: only the
    /// subscriber's limit.
    pub max_sessions_per_mapping: u32,
    pub max_sessions: u32,
    pub max_subscribers: u32,
    /// 0: one port at a time.
    pub port_block_size: u16,
    pub hold_down_s: u32,
    pub port_selection: PortSelection,
    pub port_parity: bool,
    pub inbound_refresh: bool,
    pub unsolicited_syn: UnsolicitedSyn,
    /// ICMP destination unreachable code sent on quota or exhaustion; None stays silent.
    pub exhaustion_icmp_code: Option<u8>,
    pub icmp_errors_per_second: u32,
    pub exempt: Vec<Exemption>,
    pub statics: Vec<StaticMapping>,
    pub timeouts: Timeouts,
    pub max_held_fragments: u32,
    pub max_held_fragment_bytes: u32,
    pub max_held_syns: u32,
    /// Deterministic NAT (RFC 7422): each subscriber's external address and
    /// port range come from this formula, validated against the pool and
    /// ports when it was built; None in dynamic mode.
    pub deterministic: Option<crate::state::deterministic::Deterministic>,
    /// PCP server (RFC 6887) on the inside address, UDP 5351; None: disabled.
    pub pcp: Option<crate::pcp::PcpConfig>,
    /// SCTP associations (`[sctp]`, seed 001); translated whenever NAT is on.
    pub sctp: crate::nat44::sctp::SctpConfig,
    /// Emit per-session events as well as per-mapping ones.
    pub log_sessions: bool,
    pub event_capacity: u32,
    pub seed: u64,
    /// Which worker this engine is; it allocates from its slice of `ports`.
    pub shard: Shard,
    /// MTU of the link each side sends on (inside, outside); 0: no limit.
    pub egress_mtu: [u16; 2],
    /// NPTv6 bindings (RFC 6296, `[[nptv6]]`); empty: IPv6 is only routed.
    pub nptv6: Vec<crate::nptv6::Binding>,
    /// The SYN accelerator (seed 003, `[syn_accel]`); None: off.
    pub syn_accel: Option<crate::syn_accel::SynAccelConfig>,
    /// HOST_ID options and policy (seed 000, `[host_id]`); None: off.
    pub host_id: Option<crate::host_id::HostIdConfig>,
    /// The DS-Lite AFTR (RFC 6333, `[dslite]`); None: off.
    pub dslite: Option<crate::dslite::DsliteConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            translate: true,
            inside_addr: u32::from_be_bytes([100, 64, 0, 1]),
            inside_prefix_len: 10,
            outside_addr: None,
            inside_addr6: None,
            outside_addr6: None,
            pool: Vec::new(),
            ports: (1024, 65535),
            filtering: Filtering::EndpointIndependent,
            max_ports_per_subscriber: 2000,
            max_ports_per_protocol: [u32::MAX; Proto::COUNT],
            max_new_mappings_per_second: 0,
            max_sessions_per_subscriber: 10_000,
            max_sessions_per_mapping: 0,
            max_sessions: 1 << 20,
            max_subscribers: 1 << 16,
            port_block_size: 0,
            hold_down_s: 120,
            port_selection: PortSelection::Preserve,
            port_parity: true,
            inbound_refresh: false,
            unsolicited_syn: UnsolicitedSyn::IcmpPortUnreachable,
            exhaustion_icmp_code: Some(natrix_wire::icmp::unreachable::HOST),
            icmp_errors_per_second: 100,
            exempt: Vec::new(),
            statics: Vec::new(),
            timeouts: Timeouts::default(),
            max_held_fragments: 256,
            max_held_fragment_bytes: 1 << 20,
            max_held_syns: 1024,
            deterministic: None,
            pcp: None,
            sctp: crate::nat44::sctp::SctpConfig::default(),
            log_sessions: false,
            event_capacity: 1 << 16,
            seed: 1,
            shard: Shard::default(),
            egress_mtu: [0, 0],
            nptv6: Vec::new(),
            syn_accel: None,
            host_id: None,
            dslite: None,
        }
    }
}

pub fn prefix_contains(network: u32, len: u8, addr: u32) -> bool {
    len == 0 || (addr ^ network) >> (32 - u32::from(len)) == 0
}

/// The engine keys a reload cannot change (they size or partition state),
/// as operators write them: the first one that differs, if any. The control
/// plane adds the live keys (interfaces, links, threads) to this one list.
pub fn restart_key_changed(old: &EngineConfig, new: &EngineConfig) -> Option<&'static str> {
    [
        (old.translate != new.translate, "nat.mode"),
        (old.inside_addr != new.inside_addr || old.inside_prefix_len != new.inside_prefix_len, "inside.address"),
        (old.ports != new.ports, "nat.ports"),
        (old.port_block_size != new.port_block_size, "nat.port_block_size"),
        (old.statics != new.statics, "nat.static"),
        (old.deterministic != new.deterministic, "nat.mode, nat.subscribers or nat.ports_per_subscriber (deterministic mode)"),
        (old.deterministic.is_some() && old.pool != new.pool, "nat.pool (in deterministic mode the formula depends on it)"),
        (old.max_sessions != new.max_sessions, "nat.max_sessions"),
        (old.max_subscribers != new.max_subscribers, "nat.max_subscribers"),
        (old.sctp.max_associations != new.sctp.max_associations, "sctp.max_associations"),
        (old.syn_accel.is_some() != new.syn_accel.is_some(), "syn_accel (turning the SYN accelerator on or off)"),
        (host_id_active(old) != host_id_active(new), "host_id (turning HOST_ID on or off)"),
        (old.dslite.is_some() != new.dslite.is_some(), "dslite.aftr (turning DS-Lite on or off)"),
    ]
    .into_iter()
    .find_map(|(changed, key)| changed.then_some(key))
}

/// Whether HOST_ID is one of the pipeline's functions.
fn host_id_active(cfg: &EngineConfig) -> bool {
    cfg.host_id.as_ref().is_some_and(|h| h.is_active())
}

/// Why a static mapping cannot be installed: which mapping (its index in
/// `statics`), which of its endpoints, and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticProblem {
    pub index: usize,
    /// "inside" or "outside".
    pub endpoint: &'static str,
    pub problem: String,
}

/// The one check of static mappings, for the control plane's messages and
/// the engine's own refusal: each external endpoint on a pool address and
/// in the port range, and no endpoint mapped twice.
pub fn check_statics(statics: &[StaticMapping], pool: &[u32], ports: (u16, u16)) -> Result<(), StaticProblem> {
    let problem = |index, endpoint, problem: String| Err(StaticProblem { index, endpoint, problem });
    for (i, st) in statics.iter().enumerate() {
        if pool.binary_search(&st.ext_addr).is_err() {
            return problem(i, "outside", "address is not in nat.pool".into());
        }
        if st.proto != Proto::Icmp && !(ports.0..=ports.1).contains(&st.ext_port) {
            return problem(i, "outside", format!("port is outside nat.ports {}-{}", ports.0, ports.1));
        }
        let earlier = &statics[..i];
        if earlier.iter().any(|o| o.proto == st.proto && (o.ext_addr, o.ext_port) == (st.ext_addr, st.ext_port)) {
            return problem(i, "outside", "the same external endpoint is mapped twice".into());
        }
        if earlier.iter().any(|o| o.proto == st.proto && (o.int_addr, o.int_port) == (st.int_addr, st.int_port)) {
            return problem(i, "inside", "the same internal endpoint is mapped twice (endpoint-independent mapping gives it one external endpoint)".into());
        }
    }
    Ok(())
}
