//! The operator's configuration file. Every key is optional except
//! `[nat] pool`, which `[nat] mode = "off"` (natrix routes without
//! translating) does without; an unknown key, a wrong type or a value out
//! of range is refused with an error naming the key, and so is, with mode
//! "off", a key that only translation uses. Values the RFCs advise against
//! (timeouts below their minima) are accepted with a warning.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use natrix_engine::config::{Addr6, Exemption, Filtering, PortSelection, StaticMapping, UnsolicitedSyn};
use natrix_engine::deterministic::{Deterministic, DeterministicConfig, Member, SubscriberPrefix};
use natrix_engine::nptv6::Binding as Nptv6Binding;
use natrix_engine::{EngineConfig, Proto};
use toml::{Table, Value};

use crate::duration;

pub mod cluster;
mod dslite;
mod host_id;
mod sctp;
mod syn_accel;

/// More pool addresses than this is a typo (a /8 where a /28 was meant).
const MAX_POOL_ADDRESSES: u64 = 1 << 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path of the offending key, e.g. `nat.pool[1]`; empty for a syntax error.
    pub key: String,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "{}: {}", self.key, self.problem)
        }
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(key: impl Into<String>, problem: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError { key: key.into(), problem: problem.into() })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoBackend {
    Auto,
    AfXdp,
    AfPacket,
}

/// Whether natrix has its AF_XDP devices defer their receive work to its
/// polls (`prefer_busy_poll`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreferBusyPoll {
    /// Where every worker polls queues of its own (one worker, or
    /// per-queue workers).
    Auto,
    On,
    Off,
}

/// Whether the interfaces' XDP programs forward established flows
/// themselves (`offload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// Where natrix runs on AF_XDP and an interface takes redirected frames.
    Auto,
    /// As `Auto`, and natrix refuses to start where it cannot.
    On,
    Off,
}

/// The mode of the interfaces' XDP programs (`xdp_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpProgramMode {
    /// Native where the driver takes it, generic elsewhere.
    Auto,
    /// The driver runs the program, on frames as it received them.
    Native,
    /// The kernel runs the program on each frame's skb, on any interface.
    Generic,
}

/// Keys only the live dataplane uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveConfig {
    pub inside_interface: Option<String>,
    pub outside_interface: Option<String>,
    pub gateway: Option<Ipv4Addr>,
    /// The IPv6 next hop for destinations off the outside `address6` prefix.
    pub gateway6: Option<Ipv6Addr>,
    pub workers: u32,
    pub io: IoBackend,
    /// Poll without sleeping: lowest latency, but a whole core per thread.
    pub busy_poll: bool,
    /// AF_XDP: defer the interfaces' receive work to natrix's polls
    /// (their `napi_defer_hard_irqs` and `gro_flush_timeout`, while natrix runs).
    pub prefer_busy_poll: PreferBusyPoll,
    /// AF_XDP: established flows forwarded by the XDP programs.
    pub offload: Offload,
    /// AF_XDP: where the XDP programs run.
    pub xdp_mode: XdpProgramMode,
    pub management_listen: Option<String>,
    /// Prefix length of the outside address: hosts inside it are on-link.
    pub outside_prefix_len: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogUnit {
    /// One record per mapping created or deleted.
    Mapping,
    /// Mapping records plus one per session, with the remote endpoint.
    Session,
    /// One record per port block allocated or released (RFC 6888 REQ-14: less log volume).
    Block,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingConfig {
    pub unit: LogUnit,
    /// JSON-lines event log.
    pub json: Option<PathBuf>,
    /// IPFIX collector (RFC 7011 over UDP, RFC 8158 elements).
    pub ipfix: Option<std::net::SocketAddr>,
    /// Syslog destination (RFC 5424 messages).
    pub syslog: Option<crate::syslog::SyslogTarget>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub engine: EngineConfig,
    pub live: LiveConfig,
    pub logging: LoggingConfig,
    /// This node's place in a cluster (`[cluster]`), if it is in one.
    pub cluster: Option<cluster::ClusterConfig>,
    /// Accepted but questionable settings, for the operator to read.
    pub warnings: Vec<String>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError { key: String::new(), problem: format!("cannot read {}: {e}", path.display()) })?;
        Config::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let root: Table = text.parse().map_err(|e: toml::de::Error| ConfigError { key: String::new(), problem: format!("not valid TOML: {e}") })?;
        let mut root = Section::new("", &root);
        let mut warnings = Vec::new();
        let mut engine = EngineConfig::default();
        let mut live = LiveConfig {
            inside_interface: None,
            outside_interface: None,
            gateway: None,
            gateway6: None,
            workers: 1,
            io: IoBackend::Auto,
            busy_poll: false,
            prefer_busy_poll: PreferBusyPoll::Auto,
            offload: Offload::Auto,
            xdp_mode: XdpProgramMode::Auto,
            management_listen: None,
            outside_prefix_len: 32,
        };

        if let Some(mut s) = root.section("inside")? {
            live.inside_interface = s.string("interface")?.map(str::to_owned);
            if let Some((addr, len)) = s.parsed("address", parse_interface_address)? {
                engine.inside_addr = addr;
                engine.inside_prefix_len = len;
            }
            engine.inside_addr6 = s.parsed("address6", parse_interface_address6)?;
            s.finish()?;
        }
        if let Some(mut s) = root.section("outside")? {
            live.outside_interface = s.string("interface")?.map(str::to_owned);
            if let Some((addr, len)) = s.parsed("address", parse_interface_address)? {
                engine.outside_addr = Some(addr);
                live.outside_prefix_len = len;
            }
            live.gateway = s.parsed("gateway", |t| t.parse::<Ipv4Addr>().map_err(|_| format!("\"{t}\" is not an IPv4 address")))?;
            engine.outside_addr6 = s.parsed("address6", parse_interface_address6)?;
            live.gateway6 = s.parsed("gateway6", parse_ipv6)?;
            s.finish()?;
        }
        let Some(mut nat) = root.section("nat")? else {
            return err("nat.pool", "missing: the [nat] section with a pool of external addresses is required (or mode = \"off\" to route without translating)");
        };
        parse_nat(&mut nat, &mut engine, &mut warnings)?;
        nat.finish()?;
        if let Some(mut s) = root.section("timeouts")? {
            refuse_without_translation(&s, &engine)?;
            parse_timeouts(&mut s, &mut engine, &mut warnings)?;
            s.finish()?;
        }
        if let Some(mut s) = root.section("fragments")? {
            refuse_without_translation(&s, &engine)?;
            engine.max_held_fragments = s.integer("max_held", 0, 1 << 20)?.unwrap_or(engine.max_held_fragments);
            engine.max_held_fragment_bytes = s.integer("max_held_bytes", 0, 1 << 30)?.unwrap_or(engine.max_held_fragment_bytes);
            s.finish()?;
        }
        engine.sctp = sctp::parse(&mut root, &engine)?;
        let logging = parse_logging(&mut root, &mut engine, &mut warnings)?;
        if let Some(mut s) = root.section("pcp")? {
            engine.pcp = parse_pcp(&mut s)?;
            if engine.pcp.is_some() && !engine.translate {
                return err("pcp.enabled", NEEDS_TRANSLATION);
            }
            refuse_without_translation(&s, &engine)?;
            s.finish()?;
        }
        engine.nptv6 = parse_nptv6(&mut root)?;
        if let Some(mut s) = root.section("management")? {
            live.management_listen = s.parsed("listen", |t| t.parse::<std::net::SocketAddr>().map(|_| t.to_owned()).map_err(|_| format!("\"{t}\" is not ADDRESS:PORT")))?;
            s.finish()?;
        }
        engine.syn_accel = syn_accel::parse(&mut root, &mut warnings)?;
        engine.host_id = host_id::parse(&mut root, &mut warnings)?;
        engine.dslite = dslite::parse(&mut root, &engine, &mut warnings)?;
        host_id::check_origin_needs_dslite(&engine)?;
        let cluster = cluster::parse(&mut root, &engine)?;
        live.workers = root.integer("workers", 1, 1024)?.unwrap_or(1);
        live.io = root.choice("io", &[("auto", IoBackend::Auto), ("af_xdp", IoBackend::AfXdp), ("af_packet", IoBackend::AfPacket)])?.unwrap_or(IoBackend::Auto);
        live.busy_poll = root.boolean("busy_poll")?.unwrap_or(false);
        live.prefer_busy_poll = match true_false_or_auto(&mut root, "prefer_busy_poll")? {
            None => PreferBusyPoll::Auto,
            Some(true) => PreferBusyPoll::On,
            Some(false) => PreferBusyPoll::Off,
        };
        live.offload = match true_false_or_auto(&mut root, "offload")? {
            None => Offload::Auto,
            Some(true) => Offload::On,
            Some(false) => Offload::Off,
        };
        live.xdp_mode =
            root.choice("xdp_mode", &[("auto", XdpProgramMode::Auto), ("native", XdpProgramMode::Native), ("generic", XdpProgramMode::Generic)])?.unwrap_or(XdpProgramMode::Auto);
        root.finish()?;
        check_consistency(&engine)?;
        check_addressing(&engine, &live)?;
        check_worker_slices(&engine, live.workers)?;
        Ok(Config { engine, live, logging, cluster, warnings })
    }

    /// Keys `natrix run` needs that this configuration lacks, each with
    /// why; `replay` needs none of them.
    pub fn missing_for_run(&self) -> Vec<ConfigError> {
        let mut missing = Vec::new();
        let mut need = |key: &str, why: &str| missing.push(ConfigError { key: key.into(), problem: format!("missing: natrix run needs it ({why})") });
        if self.live.inside_interface.is_none() {
            need("inside.interface", "the interface towards the subscribers");
        }
        if self.live.outside_interface.is_none() {
            need("outside.interface", "the interface towards the internet");
        }
        if self.engine.dslite.is_some() && self.engine.inside_addr6.is_none() {
            need("inside.address6", "DS-Lite: natrix answers Neighbor Discovery for the AFTR and reaches the B4s on the inside IPv6 prefix");
        }
        if self.engine.outside_addr.is_none() {
            need("outside.address", "natrix's address and prefix on the outside link, to answer ARP and find next hops");
        }
        missing
    }

    /// The first key whose change a reload cannot apply (the running
    /// interfaces, links, threads, and what sizes or partitions NAT state),
    /// if `new` changes one.
    pub fn restart_key_changed(&self, new: &Config) -> Option<&'static str> {
        let (a, b) = (&self.live, &new.live);
        let (old_e, new_e) = (&self.engine, &new.engine);
        [
            (a.inside_interface != b.inside_interface, "inside.interface"),
            (a.outside_interface != b.outside_interface, "outside.interface"),
            (old_e.outside_addr != new_e.outside_addr || a.outside_prefix_len != b.outside_prefix_len, "outside.address"),
            (old_e.inside_addr6 != new_e.inside_addr6, "inside.address6"),
            (old_e.outside_addr6 != new_e.outside_addr6, "outside.address6"),
            (a.gateway != b.gateway, "outside.gateway"),
            (a.gateway6 != b.gateway6, "outside.gateway6"),
            (a.workers != b.workers, "workers"),
            (a.io != b.io, "io"),
            (a.busy_poll != b.busy_poll, "busy_poll"),
            (a.prefer_busy_poll != b.prefer_busy_poll, "prefer_busy_poll"),
            (a.offload != b.offload, "offload"),
            (a.xdp_mode != b.xdp_mode, "xdp_mode"),
            (a.management_listen != b.management_listen, "management.listen"),
            (self.cluster != new.cluster, "cluster"),
        ]
        .into_iter()
        .find_map(|(changed, key)| changed.then_some(key))
        .or_else(|| natrix_engine::config::restart_key_changed(old_e, new_e))
    }

    /// Keys `natrix run` works without but an operator most likely wants.
    pub fn advice_for_run(&self) -> Vec<String> {
        let mut advice = Vec::new();
        if self.live.gateway.is_none() {
            advice.push("outside.gateway: not set: natrix run will reach only hosts inside the outside prefix".to_owned());
        }
        if self.engine.outside_addr6.is_some() && self.live.gateway6.is_none() {
            advice.push("outside.gateway6: not set: natrix run will reach only IPv6 hosts inside the outside address6 prefix".to_owned());
        }
        advice
    }
}

/// The NAT's own prefixes and addresses must not collide: a pool inside the
/// subscribers' prefix, natrix's own address in the pool, overlapping links
/// or one interface on both sides would each make a NAT that cannot work.
fn check_addressing(e: &EngineConfig, live: &LiveConfig) -> Result<(), ConfigError> {
    let inside = (e.inside_addr, e.inside_prefix_len);
    let outside = e.outside_addr.map(|a| (a, live.outside_prefix_len));
    let show = |(a, len): (u32, u8)| format!("{}/{len}", Ipv4Addr::from(a));
    if let Some(a) = e.pool.iter().find(|&&a| natrix_engine::config::prefix_contains(inside.0, inside.1, a)) {
        return err("nat.pool", format!("{} is inside the subscribers' prefix {} (inside.address): the pool must be outside it", Ipv4Addr::from(*a), show(inside)));
    }
    if let Some((addr, _)) = outside {
        if e.pool.binary_search(&addr).is_ok() {
            return err("nat.pool", format!("contains natrix's own outside.address {}: take it out of the pool", Ipv4Addr::from(addr)));
        }
    }
    if let Some(o) = outside {
        let len = o.1.min(inside.1);
        if natrix_engine::config::prefix_contains(inside.0, len, o.0) {
            return err("outside.address", format!("{} overlaps the inside prefix {} (inside.address): the two links need separate prefixes", show(o), show(inside)));
        }
    }
    if let (Some(i), Some(o)) = (&live.inside_interface, &live.outside_interface) {
        if i == o {
            return err("outside.interface", format!("\"{o}\" is also inside.interface: natrix needs one interface per side"));
        }
    }
    if let Some(gw) = live.gateway.map(u32::from) {
        match outside {
            Some(o) if !natrix_engine::config::prefix_contains(o.0, o.1, gw) => {
                return err("outside.gateway", format!("{} is not in the outside prefix {} (outside.address): a next hop must be on the link", Ipv4Addr::from(gw), show(o)));
            }
            None => return err("outside.gateway", "needs outside.address: natrix reaches the gateway through its outside address"),
            Some(_) if e.pool.binary_search(&gw).is_ok() => return err("outside.gateway", "is a pool address (nat.pool)"),
            Some(_) => {}
        }
    }
    check_addressing6(e, live)
}

/// The IPv6 side of `check_addressing`: the two links' `address6`
/// prefixes must not overlap, and `gateway6` must be on the outside link.
fn check_addressing6(e: &EngineConfig, live: &LiveConfig) -> Result<(), ConfigError> {
    let show = |a: Addr6| format!("{}/{}", a.addr, a.prefix_len);
    if let (Some(i), Some(o)) = (e.inside_addr6, e.outside_addr6) {
        if prefix6_contains(i.addr, i.prefix_len.min(o.prefix_len), o.addr) {
            return err("outside.address6", format!("{} overlaps the inside prefix {} (inside.address6): the two links need separate prefixes", show(o), show(i)));
        }
    }
    if let Some(gw) = live.gateway6 {
        match e.outside_addr6 {
            None => return err("outside.gateway6", "needs outside.address6: natrix reaches the IPv6 gateway through its outside IPv6 address"),
            Some(o) if gw == o.addr => return err("outside.gateway6", format!("{gw} is natrix's own outside.address6")),
            Some(o) if !prefix6_contains(o.addr, o.prefix_len, gw) => {
                return err("outside.gateway6", format!("{gw} is not in the outside prefix {} (outside.address6): a next hop must be on the link", show(o)));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn prefix6_contains(network: Ipv6Addr, len: u8, addr: Ipv6Addr) -> bool {
    let len = u32::from(len.min(128));
    len == 0 || (u128::from(network) ^ u128::from(addr)) >> (128 - len) == 0
}

/// The problem of a key that `[nat] mode = "off"` has no use for.
const NEEDS_TRANSLATION: &str = "only used when natrix translates, and [nat] mode = \"off\" routes without translating: remove it";

/// In the sections translation configures, the keys that serve the router
/// as well; with `[nat] mode = "off"` every other key of these sections
/// (the pool, ports, quotas, NAT timeouts, fragments, the log unit, PCP's
/// lifetime) is refused by name (so is `[pcp] enabled = true`).
const ROUTER_KEYS: &[(&str, &[&str])] = &[
    ("nat", &["mode", "seed", "icmp_errors_per_second"]),
    // Mappings, sessions and the SYNs held for them; fragments held until
    // their first fragment names the ports: all translation's.
    ("timeouts", &[]),
    ("fragments", &[]),
    // Which NAT records to log (`unit`) is translation's; where to, not.
    ("logging", &["json", "ipfix", "syslog"]),
    // SCTP associations are translation's.
    ("sctp", &[]),
    // PCP creates mappings: `enabled = true` is refused on its own.
    ("pcp", &["enabled"]),
];

/// Whether `[nat] mode = "off"` refuses key `key` of `section`.
fn needs_translation(section: &str, key: &str) -> bool {
    let known = KNOWN_KEYS.iter().any(|(s, keys)| *s == section && keys.contains(&key));
    known && ROUTER_KEYS.iter().find(|(s, _)| *s == section).is_some_and(|(_, keys)| !keys.contains(&key))
}

/// With translation off, refuses the keys of `s` that only translation
/// uses, naming the first as the key and every other in the message.
fn refuse_without_translation(s: &Section, e: &EngineConfig) -> Result<(), ConfigError> {
    if e.translate {
        return Ok(());
    }
    let keys: Vec<&String> = s.table.keys().filter(|k| needs_translation(&s.name, k)).collect();
    match keys.split_first() {
        Some((first, [])) => err(s.path(first), NEEDS_TRANSLATION),
        Some((first, rest)) => {
            let all: Vec<String> = std::iter::once(first).chain(rest).map(|k| s.path(k)).collect();
            let why = NEEDS_TRANSLATION.trim_end_matches(": remove it");
            err(s.path(first), format!("these are {why}: remove them ({})", all.join(", ")))
        }
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NatMode {
    Dynamic,
    Deterministic,
    /// Route without translating.
    Off,
}

fn parse_nat(s: &mut Section, e: &mut EngineConfig, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
    let mode = s.choice("mode", &[("dynamic", NatMode::Dynamic), ("deterministic", NatMode::Deterministic), ("off", NatMode::Off)])?.unwrap_or(NatMode::Dynamic);
    if mode == NatMode::Off {
        e.translate = false;
        refuse_without_translation(s, e)?;
        e.icmp_errors_per_second = s.integer("icmp_errors_per_second", 0, u32::MAX)?.unwrap_or(e.icmp_errors_per_second);
        e.seed = s.integer_u64("seed")?.unwrap_or(e.seed);
        return Ok(());
    }
    let deterministic = mode == NatMode::Deterministic;
    if !deterministic {
        for key in ["subscribers", "ports_per_subscriber"] {
            if s.has(key) {
                return err(s.path(key), "only meaningful with mode = \"deterministic\"");
            }
        }
    }
    e.pool = parse_pool(s)?;
    if let Some((lo, hi)) = s.parsed("ports", parse_port_range)? {
        if lo == 0 {
            return err("nat.ports", "port 0 cannot be an external port");
        }
        if lo < 1024 {
            warnings.push(format!("nat.ports: range starts at {lo}; RFC 6056 advises external ports from 1024 up"));
        }
        e.ports = (lo, hi);
    }
    let range = u32::from(e.ports.1 - e.ports.0) + 1;
    if deterministic {
        let formula = parse_deterministic(s, e, range, warnings)?;
        e.deterministic = Some(Deterministic::new(&formula, &e.pool, e.ports).or_else(|x| err(format!("nat.{}", x.key), x.problem))?);
    }
    e.filtering = s.choice("filtering", &Filtering::ALL.map(|f| (f.name(), f)))?.unwrap_or(e.filtering);
    // In deterministic mode the range is the allowance: by default a
    // subscriber may fill its range for each protocol.
    let default_ports = e.deterministic.as_ref().map_or(e.max_ports_per_subscriber, |d| 3 * u32::from(d.ports_per_subscriber()));
    e.max_ports_per_subscriber = s.integer("max_ports_per_subscriber", 1, 3 * range)?.unwrap_or(default_ports);
    if let Some(mut per) = s.section("max_ports_per_protocol")? {
        for p in Proto::ALL {
            if let Some(n) = per.integer(p.name(), 1, range)? {
                e.max_ports_per_protocol[p as usize] = n;
            }
        }
        per.finish()?;
    }
    e.max_new_mappings_per_second = s.integer("max_new_mappings_per_second", 0, u32::MAX)?.unwrap_or(e.max_new_mappings_per_second);
    e.max_sessions_per_subscriber = s.integer("max_sessions_per_subscriber", 1, u32::MAX)?.unwrap_or(e.max_sessions_per_subscriber);
    e.max_sessions_per_mapping = s.integer("max_sessions_per_mapping", 0, u32::MAX)?.unwrap_or(e.max_sessions_per_mapping);
    if e.max_sessions_per_mapping >= e.max_sessions_per_subscriber {
        warnings.push(format!(
            "nat.max_sessions_per_mapping: {} is not below max_sessions_per_subscriber ({}), which a mapping reaches first: it limits nothing",
            e.max_sessions_per_mapping, e.max_sessions_per_subscriber
        ));
    }
    e.max_sessions = s.integer("max_sessions", 1, 1 << 28)?.unwrap_or(e.max_sessions);
    e.max_subscribers = s.integer("max_subscribers", 1, 1 << 24)?.unwrap_or(e.max_subscribers);
    e.port_block_size = s.integer("port_block_size", 0, range)?.map(|v| v as u16).unwrap_or(e.port_block_size);
    if let Some(ms) = s.parsed("hold_down", duration::parse_ms)? {
        e.hold_down_s = seconds("nat.hold_down", ms)?;
    }
    e.port_selection = s.choice("port_selection", &[("preserve", PortSelection::Preserve), ("random", PortSelection::Random)])?.unwrap_or(e.port_selection);
    e.port_parity = s.boolean("port_parity")?.unwrap_or(e.port_parity);
    e.inbound_refresh = s.boolean("inbound_refresh")?.unwrap_or(e.inbound_refresh);
    e.unsolicited_syn = s.choice("unsolicited_syn", &[("icmp", UnsolicitedSyn::IcmpPortUnreachable), ("drop", UnsolicitedSyn::Drop)])?.unwrap_or(e.unsolicited_syn);
    e.exhaustion_icmp_code = s.choice("exhaustion_icmp", &REFUSAL_CODES)?.unwrap_or(e.exhaustion_icmp_code);
    e.icmp_errors_per_second = s.integer("icmp_errors_per_second", 0, u32::MAX)?.unwrap_or(e.icmp_errors_per_second);
    e.exempt = parse_exempt(s)?;
    e.statics = parse_statics(s)?;
    e.seed = s.integer_u64("seed")?.unwrap_or(e.seed);
    Ok(())
}

/// `mode = "deterministic"` (RFC 7422): the inside prefixes, numbered in
/// order, and each subscriber's range size. Whether the numbers fit the pool
/// is checked with the rest of the config in `check_consistency`.
fn parse_deterministic(s: &mut Section, e: &EngineConfig, range: u32, warnings: &mut Vec<String>) -> Result<DeterministicConfig, ConfigError> {
    let Some(list) = s.array("subscribers")? else {
        return err("nat.subscribers", "missing: deterministic mode needs the inside prefixes, e.g. subscribers = [\"100.64.0.0/22\"]");
    };
    let mut subscribers = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let key = format!("nat.subscribers[{i}]");
        let Some(t) = v.as_str() else { return err(key, "expected a string like \"100.64.0.0/22\"") };
        if t.contains(':') {
            // B4 addresses (DS-Lite): whether [dslite] is on is checked once it is parsed.
            let (network, len) = dslite::parse_b4_prefix(t).or_else(|m| err(&key, m))?;
            subscribers.push(SubscriberPrefix::B4(network, len));
            continue;
        }
        let (network, len) = parse_prefix(t).or_else(|m| err(&key, m))?;
        if !natrix_engine::config::prefix_contains(e.inside_addr, e.inside_prefix_len, network) {
            warnings.push(format!("{key}: {t} is outside the inside prefix {}/{}", Ipv4Addr::from(e.inside_addr), e.inside_prefix_len));
        }
        subscribers.push(SubscriberPrefix::Ipv4(network, len));
    }
    if subscribers.is_empty() {
        return err("nat.subscribers", "empty: list the inside prefixes, e.g. subscribers = [\"100.64.0.0/22\"]");
    }
    let Some(n) = s.integer("ports_per_subscriber", 1, range)? else {
        return err("nat.ports_per_subscriber", "missing: deterministic mode needs each subscriber's range size, e.g. ports_per_subscriber = 1008");
    };
    Ok(DeterministicConfig { subscribers, ports_per_subscriber: n as u16 })
}

/// `[pcp]`: the PCP server (RFC 6887) on the inside address, off by default.
fn parse_pcp(s: &mut Section) -> Result<Option<natrix_engine::pcp::PcpConfig>, ConfigError> {
    let enabled = s.boolean("enabled")?.unwrap_or(false);
    let mut pcp = natrix_engine::pcp::PcpConfig::default();
    if let Some(ms) = s.parsed("max_lifetime", duration::parse_ms)? {
        pcp.max_lifetime_s = seconds("pcp.max_lifetime", ms)?;
        if pcp.max_lifetime_s == 0 {
            return err("pcp.max_lifetime", "must be at least 1s");
        }
    }
    Ok(enabled.then_some(pcp))
}

/// ICMP destination-unreachable codes an operator may choose for refusals:
/// 1 is RFC 6888's host unreachable, 13 communication administratively prohibited.
const REFUSAL_CODES: [(&str, Option<u8>); 3] = [("host-unreachable", Some(1)), ("admin-prohibited", Some(13)), ("none", None)];

fn parse_pool(s: &mut Section) -> Result<Vec<u32>, ConfigError> {
    let Some(list) = s.array("pool")? else {
        return err("nat.pool", "missing: list the external addresses, e.g. pool = [\"203.0.113.0/28\"] (or set mode = \"off\" to route without translating)");
    };
    let mut addrs = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let key = format!("nat.pool[{i}]");
        let Some(t) = v.as_str() else { return err(key, "expected a string like \"203.0.113.0/28\"") };
        let (net, len) = parse_prefix(t).or_else(|m| err(&key, m))?;
        let count = 1u64 << (32 - u32::from(len));
        if addrs.len() as u64 + count > MAX_POOL_ADDRESSES {
            return err(key, format!("the pool would exceed {MAX_POOL_ADDRESSES} addresses"));
        }
        addrs.extend((0..count).map(|k| net + k as u32));
    }
    if addrs.is_empty() {
        return err("nat.pool", "the pool is empty");
    }
    let n = addrs.len();
    addrs.sort_unstable();
    addrs.dedup();
    if addrs.len() != n {
        return err("nat.pool", "entries overlap: an address appears more than once");
    }
    Ok(addrs)
}

fn parse_exempt(s: &mut Section) -> Result<Vec<Exemption>, ConfigError> {
    let mut out = Vec::new();
    for (i, v) in s.array("exempt")?.into_iter().flatten().enumerate() {
        let key = format!("nat.exempt[{i}]");
        let Some(t) = v.as_str() else { return err(key, "expected a string like \"192.0.2.0/24\" or \"198.51.100.53/32:53\"") };
        out.push(parse_destination(t).or_else(|m| err(&key, m))?);
    }
    Ok(out)
}

/// "prefix[:port[-port]]": a destination prefix and its ports (all ports
/// when none are given), as `[nat] exempt` and `[syn_accel] destinations` write it.
fn parse_destination(t: &str) -> Result<Exemption, String> {
    let (prefix, ports) = match t.split_once(':') {
        Some((p, r)) => (p, parse_port_range(r)?),
        None => (t, (0, u16::MAX)),
    };
    let (network, prefix_len) = parse_prefix(prefix)?;
    Ok(Exemption { network, prefix_len, ports })
}

fn parse_statics(s: &mut Section) -> Result<Vec<StaticMapping>, ConfigError> {
    let mut out: Vec<StaticMapping> = Vec::new();
    for (i, v) in s.array("static")?.into_iter().flatten().enumerate() {
        let key = format!("nat.static[{i}]");
        let Some(t) = v.as_table() else { return err(key, "expected { proto = \"tcp\", inside = \"ADDR:PORT\", outside = \"ADDR:PORT\" }") };
        let mut st = Section::new(&key, t);
        let proto = st.choice("proto", &[("tcp", Proto::Tcp), ("udp", Proto::Udp), ("icmp", Proto::Icmp)])?;
        let inside = st.parsed("inside", parse_endpoint)?;
        let outside = st.parsed("outside", parse_endpoint)?;
        st.finish()?;
        let (Some(proto), Some((int_addr, int_port)), Some((ext_addr, ext_port))) = (proto, inside, outside) else {
            return err(key, "needs proto, inside and outside");
        };
        out.push(StaticMapping { proto, int_addr, int_port, ext_addr, ext_port });
    }
    Ok(out)
}

fn parse_timeouts(s: &mut Section, e: &mut EngineConfig, warnings: &mut Vec<String>) -> Result<(), ConfigError> {
    // Each protocol's tracker says which timeouts it has and what its RFC requires.
    for spec in natrix_engine::trackers::TIMEOUTS {
        let Some(ms) = s.parsed(spec.key, duration::parse_ms)? else { continue };
        let secs = seconds(&s.path(spec.key), ms)?;
        if secs == 0 {
            return err(s.path(spec.key), "must be at least 1s");
        }
        if secs < spec.min_s {
            warnings.push(format!("timeouts.{}: {secs}s is below the {}s minimum of {}", spec.key, spec.min_s, spec.source));
        }
        *e.timeouts.of_class_mut(spec.class) = secs;
    }
    if let Some(ms) = s.parsed("fragment", duration::parse_ms)? {
        if ms == 0 {
            return err("timeouts.fragment", "must be above zero");
        }
        e.timeouts.fragment_ns = ms * 1_000_000;
    }
    if let Some(ms) = s.parsed("syn_hold", duration::parse_ms)? {
        e.timeouts.syn_hold_ns = ms * 1_000_000;
    }
    Ok(())
}

fn parse_logging(root: &mut Section, e: &mut EngineConfig, warnings: &mut Vec<String>) -> Result<LoggingConfig, ConfigError> {
    let mut logging = LoggingConfig { unit: LogUnit::Mapping, json: None, ipfix: None, syslog: None };
    let Some(mut s) = root.section("logging")? else { return Ok(logging) };
    refuse_without_translation(&s, e)?;
    logging.unit = s.choice("unit", &[("mapping", LogUnit::Mapping), ("session", LogUnit::Session), ("block", LogUnit::Block)])?.unwrap_or(LogUnit::Mapping);
    e.log_sessions = logging.unit == LogUnit::Session;
    if logging.unit == LogUnit::Block && e.port_block_size == 0 {
        return err("logging.unit", "\"block\" needs nat.port_block_size > 0");
    }
    logging.json = s.string("json")?.map(PathBuf::from);
    logging.ipfix = s.typed("ipfix", "a string like \"192.0.2.10:4739\"", Value::as_str)?.map(parse_collector).transpose().or_else(|m| err("logging.ipfix", m))?;
    logging.syslog = s
        .typed("syslog", "a string like \"udp:192.0.2.10:514\" or \"unix:/dev/log\"", Value::as_str)?
        .map(crate::syslog::SyslogTarget::parse)
        .transpose()
        .or_else(|m| err("logging.syslog", m))?;
    if let Some(crate::syslog::SyslogTarget::Unix(path)) = &logging.syslog {
        if !path.exists() {
            warnings.push(format!("logging.syslog: {} does not exist (yet); messages are counted as lost until a syslog daemon listens there", path.display()));
        }
    }
    s.finish()?;
    Ok(logging)
}

/// `[[nptv6]]`: RFC 6296 bindings, each an inside and an outside prefix of
/// one length. Allowed in every `[nat] mode`, "off" included: NPTv6
/// translates IPv6, and the mode is about IPv4.
fn parse_nptv6(root: &mut Section) -> Result<Vec<Nptv6Binding>, ConfigError> {
    let mut bindings = Vec::new();
    for (i, v) in root.array("nptv6")?.into_iter().flatten().enumerate() {
        let key = format!("nptv6[{i}]");
        let Some(t) = v.as_table() else { return err(key, "expected a table: [[nptv6]] with inside and outside") };
        let mut s = Section::new(&key, t);
        let inside = s.parsed("inside", parse_prefix6)?;
        let outside = s.parsed("outside", parse_prefix6)?;
        s.finish()?;
        let (Some((inside, len)), Some((outside, outside_len))) = (inside, outside) else {
            return err(key, "needs inside and outside, e.g. inside = \"fd01:203:405::/48\", outside = \"2001:db8:1::/48\"");
        };
        if outside_len != len {
            return err(format!("{key}.outside"), format!("/{outside_len} differs from the inside prefix's /{len}: RFC 6296 maps prefixes of equal length"));
        }
        bindings.push(Nptv6Binding { inside, outside, prefix_len: len });
    }
    natrix_engine::nptv6::check_bindings(&bindings).or_else(|p| err(format!("nptv6[{}].{}", p.index, p.prefix), p.problem))?;
    Ok(bindings)
}

/// "ADDRESS/LENGTH" of an IPv6 prefix; which lengths and host bits a
/// binding accepts is `check_bindings`' to say.
fn parse_prefix6(t: &str) -> Result<(Ipv6Addr, u8), String> {
    let (a, len) = t.split_once('/').ok_or_else(|| format!("\"{t}\": expected PREFIX/LENGTH, e.g. \"2001:db8:1::/48\""))?;
    let len = len.parse::<u8>().ok().filter(|&l| l <= 128).ok_or_else(|| format!("\"{t}\": prefix length must be 0-128"))?;
    Ok((parse_ipv6(a)?, len))
}

/// An IPFIX collector: ADDRESS:PORT (IPv6 as [ADDRESS]:PORT).
fn parse_collector(t: &str) -> Result<std::net::SocketAddr, String> {
    let addr: std::net::SocketAddr = t.parse().map_err(|_| format!("\"{t}\" is not ADDRESS:PORT, e.g. \"192.0.2.10:4739\""))?;
    if addr.port() == 0 || addr.ip().is_unspecified() {
        return Err(format!("\"{t}\" is not a usable collector address"));
    }
    Ok(addr)
}

fn check_consistency(e: &EngineConfig) -> Result<(), ConfigError> {
    natrix_engine::config::check_statics(&e.statics, &e.pool, e.ports).or_else(|p| err(format!("nat.static[{}].{}", p.index, p.endpoint), p.problem))?;
    check_deterministic(e)?;
    check_static_subscribers(e)?;
    if e.pool.binary_search(&e.inside_addr).is_ok() {
        return err("inside.address", "is also a pool address");
    }
    Ok(())
}

/// Every subscriber with a static mapping holds a place in the subscriber
/// table from the start, and `replay` runs one table of max_subscribers.
fn check_static_subscribers(e: &EngineConfig) -> Result<(), ConfigError> {
    let subscribers: std::collections::HashSet<u32> = e.statics.iter().map(|s| s.int_addr).collect();
    if subscribers.len() > e.max_subscribers as usize {
        return err("nat.static", format!("{} subscribers have static mappings, more than nat.max_subscribers ({}) holds", subscribers.len(), e.max_subscribers));
    }
    Ok(())
}

/// Each worker allocates from its own slice of the port range, aligned to
/// the block size (and to 2 for parity): there must be one per worker.
fn check_worker_slices(e: &EngineConfig, workers: u32) -> Result<(), ConfigError> {
    let span = u32::from(e.ports.1 - e.ports.0) + 1;
    let unit = u32::from(e.port_block_size.max(2));
    let slices = span / unit;
    if workers > slices {
        return err(
            "workers",
            format!(
                "{workers} workers need {workers} slices of nat.ports {}-{} of at least {unit} ports each (port_block_size, or 2 for parity); the range holds {slices}",
                e.ports.0, e.ports.1
            ),
        );
    }
    Ok(())
}

/// Deterministic mode: the subscribers, pool and ports must divide so that
/// every subscriber gets its range (otherwise say how many fit), and no other
/// mechanism may hand out ports of a subscriber's range.
fn check_deterministic(e: &EngineConfig) -> Result<(), ConfigError> {
    let Some(d) = &e.deterministic else { return Ok(()) };
    if e.port_block_size > 0 {
        return err("nat.port_block_size", "not used with mode = \"deterministic\": each subscriber's range is its block; remove it");
    }
    for (i, st) in e.statics.iter().enumerate() {
        if let Some(a) = d.owner(st.ext_addr, st.ext_port).filter(|a| a.subscriber != Member::Ipv4(st.int_addr)) {
            return err(
                format!("nat.static[{i}].outside"),
                format!("port {} of {} is in {}'s deterministic range {}-{}", st.ext_port, Ipv4Addr::from(st.ext_addr), a.subscriber, a.first, a.last),
            );
        }
    }
    if d.numbers_b4s() && e.dslite.is_none() {
        let i = d.prefix_kinds().position(|b4s| b4s).unwrap_or(0);
        return err(format!("nat.subscribers[{i}]"), "an IPv6 prefix numbers DS-Lite B4s, which needs [dslite] aftr; without DS-Lite list IPv4 prefixes only");
    }
    Ok(())
}

fn seconds(key: &str, ms: u64) -> Result<u32, ConfigError> {
    u32::try_from(ms / 1000).or_else(|_| err(key, "duration too large"))
}

fn parse_ipv4(t: &str) -> Result<u32, String> {
    t.parse::<Ipv4Addr>().map(u32::from).map_err(|_| format!("\"{t}\" is not an IPv4 address"))
}

/// "a.b.c.d/len" or a bare address (/32); host bits must be zero.
fn parse_prefix(t: &str) -> Result<(u32, u8), String> {
    let (a, len) = match t.split_once('/') {
        Some((a, l)) => (a, l.parse::<u8>().ok().filter(|&l| l <= 32).ok_or_else(|| format!("\"{t}\": prefix length must be 0-32"))?),
        None => (t, 32),
    };
    let addr = parse_ipv4(a)?;
    let host_mask = if len == 0 { u32::MAX } else { (1u64 << (32 - u32::from(len))) as u32 - 1 };
    if addr & host_mask != 0 {
        return Err(format!("\"{t}\" has host bits set; did you mean {}/{len}?", Ipv4Addr::from(addr & !host_mask)));
    }
    Ok((addr, len))
}

fn parse_ipv6(t: &str) -> Result<Ipv6Addr, String> {
    t.parse::<Ipv6Addr>().map_err(|_| format!("\"{t}\" is not an IPv6 address"))
}

/// natrix's IPv6 address on a link and the link's prefix length
/// (`address6`): a unicast address, host bits and all.
fn parse_interface_address6(t: &str) -> Result<Addr6, String> {
    let (a, len) = t.split_once('/').ok_or_else(|| format!("\"{t}\": expected ADDRESS/PREFIX, e.g. \"2001:db8::1/64\""))?;
    let prefix_len = len.parse::<u8>().ok().filter(|&l| (1..=128).contains(&l)).ok_or_else(|| format!("\"{t}\": prefix length must be 1-128"))?;
    let addr = parse_ipv6(a)?;
    if addr.is_multicast() || addr.is_unspecified() || addr.is_loopback() {
        return Err(format!("\"{a}\" cannot be an interface's address (multicast, unspecified or loopback)"));
    }
    Ok(Addr6 { addr, prefix_len })
}

/// The NAT's own address on a link and the link's prefix length.
fn parse_interface_address(t: &str) -> Result<(u32, u8), String> {
    let (a, len) = t.split_once('/').ok_or_else(|| format!("\"{t}\": expected ADDRESS/PREFIX, e.g. \"100.64.0.1/10\""))?;
    let len = len.parse::<u8>().ok().filter(|&l| (1..=32).contains(&l)).ok_or_else(|| format!("\"{t}\": prefix length must be 1-32"))?;
    Ok((parse_ipv4(a)?, len))
}

fn parse_port_range(t: &str) -> Result<(u16, u16), String> {
    let port = |p: &str| p.trim().parse::<u16>().map_err(|_| format!("\"{p}\" is not a port (0-65535)"));
    let (lo, hi) = match t.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => (port(t)?, port(t)?),
    };
    if lo > hi {
        return Err(format!("\"{t}\": the range is reversed"));
    }
    Ok((lo, hi))
}

/// "ADDRESS:PORT", as operators write an IPv4 endpoint (config keys, `whois`).
pub fn parse_endpoint(t: &str) -> Result<(u32, u16), String> {
    let (a, p) = t.rsplit_once(':').ok_or_else(|| format!("\"{t}\": expected ADDRESS:PORT, e.g. 203.0.113.1:40000"))?;
    let port = p.parse::<u16>().map_err(|_| format!("\"{p}\" is not a port (0-65535)"))?;
    Ok((parse_ipv4(a)?, port))
}

/// A TOML table being read; remembers which keys were used so that any
/// other key is reported as unknown.
struct Section<'a> {
    name: String,
    table: &'a Table,
    used: Vec<&'a str>,
}

impl<'a> Section<'a> {
    fn new(name: &str, table: &'a Table) -> Self {
        Section { name: name.to_owned(), table, used: Vec::new() }
    }

    fn path(&self, key: &str) -> String {
        if self.name.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.name)
        }
    }

    fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    fn get(&mut self, key: &str) -> Option<&'a Value> {
        let (k, v) = self.table.get_key_value(key)?;
        self.used.push(k.as_str());
        Some(v)
    }

    fn typed<T>(&mut self, key: &str, what: &str, f: impl FnOnce(&'a Value) -> Option<T>) -> Result<Option<T>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match f(v) {
                Some(t) => Ok(Some(t)),
                None => err(self.path(key), format!("expected {what}, found {}", v.type_str())),
            },
        }
    }

    fn section(&mut self, key: &str) -> Result<Option<Section<'a>>, ConfigError> {
        let path = self.path(key);
        Ok(self.typed(key, "a table", Value::as_table)?.map(|t| Section::new(&path, t)))
    }

    fn string(&mut self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        self.typed(key, "a string", Value::as_str)
    }

    fn boolean(&mut self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.typed(key, "true or false", Value::as_bool)
    }

    fn array(&mut self, key: &str) -> Result<Option<&'a Vec<Value>>, ConfigError> {
        self.typed(key, "a list", Value::as_array)
    }

    fn integer(&mut self, key: &str, min: u32, max: u32) -> Result<Option<u32>, ConfigError> {
        let Some(v) = self.typed(key, "an integer", Value::as_integer)? else { return Ok(None) };
        if v < i64::from(min) || v > i64::from(max) {
            return err(self.path(key), format!("{v} is out of range {min}-{max}"));
        }
        Ok(Some(v as u32))
    }

    fn integer_u64(&mut self, key: &str) -> Result<Option<u64>, ConfigError> {
        let Some(v) = self.typed(key, "an integer", Value::as_integer)? else { return Ok(None) };
        u64::try_from(v).map(Some).or_else(|_| err(self.path(key), "must not be negative"))
    }

    /// A string parsed by `f`, whose error message is reported against the key.
    fn parsed<T>(&mut self, key: &str, f: impl FnOnce(&str) -> Result<T, String>) -> Result<Option<T>, ConfigError> {
        let v = match self.get(key) {
            None => return Ok(None),
            Some(Value::String(s)) => f(s),
            // Durations may also be bare seconds.
            Some(Value::Integer(i)) => f(&i.to_string()),
            Some(v) => return err(self.path(key), format!("expected a string, found {}", v.type_str())),
        };
        v.map(Some).or_else(|m| err(self.path(key), m))
    }

    fn choice<T: Copy>(&mut self, key: &str, options: &[(&str, T)]) -> Result<Option<T>, ConfigError> {
        let Some(s) = self.string(key)? else { return Ok(None) };
        match options.iter().find(|(name, _)| *name == s) {
            Some((_, v)) => Ok(Some(*v)),
            None => {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("\"{n}\"")).collect();
                err(self.path(key), format!("\"{s}\" is not one of {}", names.join(", ")))
            }
        }
    }

    /// Refuses keys nobody read, with the likely intended key when there is one.
    fn finish(self) -> Result<(), ConfigError> {
        match self.table.keys().find(|k| !self.used.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => err(self.path(k), unknown_key_problem(&self.name, k)),
        }
    }
}

/// A key that takes true, false or "auto" (the default: None).
fn true_false_or_auto(root: &mut Section, key: &str) -> Result<Option<bool>, ConfigError> {
    match root.get(key) {
        None => Ok(None),
        Some(Value::Boolean(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if s == "auto" => Ok(None),
        Some(Value::String(s)) => err(root.path(key), format!("\"{s}\" is not true, false or \"auto\"")),
        Some(v) => err(root.path(key), format!("expected true, false or \"auto\", found {}", v.type_str())),
    }
}

/// Every key the parser reads, by section ("" is the top level); a test
/// holds this list to the parser. Used only to explain unknown keys.
const KNOWN_KEYS: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "inside",
            "outside",
            "nat",
            "timeouts",
            "fragments",
            "logging",
            "pcp",
            "management",
            "workers",
            "io",
            "busy_poll",
            "prefer_busy_poll",
            "offload",
            "xdp_mode",
            "nptv6",
            "syn_accel",
            "sctp",
            "host_id",
            "dslite",
            "cluster",
        ],
    ),
    ("inside", &["interface", "address", "address6"]),
    ("outside", &["interface", "address", "gateway", "address6", "gateway6"]),
    (
        "nat",
        &[
            "mode",
            "pool",
            "ports",
            "filtering",
            "max_ports_per_subscriber",
            "max_ports_per_protocol",
            "max_new_mappings_per_second",
            "max_sessions_per_subscriber",
            "max_sessions_per_mapping",
            "max_sessions",
            "max_subscribers",
            "port_block_size",
            "hold_down",
            "port_selection",
            "port_parity",
            "inbound_refresh",
            "unsolicited_syn",
            "exhaustion_icmp",
            "icmp_errors_per_second",
            "exempt",
            "static",
            "seed",
            "subscribers",
            "ports_per_subscriber",
        ],
    ),
    ("nat.max_ports_per_protocol", &["tcp", "udp", "icmp", "sctp"]),
    ("nat.static", &["proto", "inside", "outside"]),
    ("timeouts", &["udp", "tcp_established", "tcp_transitory", "icmp", "sctp_init", "sctp", "fragment", "syn_hold"]),
    ("fragments", &["max_held", "max_held_bytes"]),
    ("logging", &["unit", "json", "ipfix", "syslog"]),
    ("pcp", &["enabled", "max_lifetime"]),
    ("management", &["listen"]),
    ("syn_accel", &["destinations", "interval", "attempts", "deadline"]),
    ("host_id", &["mode", "wing", "wing_data", "boucadair", "lifetime", "enabled", "kinds", "rule"]),
    ("host_id.kinds", &["wing", "boucadair", "enabled"]),
    ("host_id.rule", &["option", "value", "action"]),
    ("nptv6", &["inside", "outside"]),
    ("cluster", &["node", "partition", "role", "subscribers", "subscriber_space", "pool_space", "sync_listen", "sync_peer", "peer_timeout", "bgp"]),
    ("cluster.bgp", &["local_as", "peer", "peer_as", "router_id", "hold_time", "standby_prepend", "bird", "bfd"]),
    ("dslite", &["aftr", "b4_prefixes", "mtu", "mss_clamp", "ecn"]),
    ("sctp", &["max_chunks", "max_params", "track_global_addresses", "reply_ootb", "max_associations"]),
];

/// "unknown key", and what the operator most likely meant: the key's home
/// when it belongs in another section, else a known key a typo away.
fn unknown_key_problem(section: &str, key: &str) -> String {
    // "nat.static[2]" is one of the "nat.static" entries.
    let section: String = section.split('.').map(|part| part.split('[').next().unwrap_or(part)).collect::<Vec<_>>().join(".");
    let here = KNOWN_KEYS.iter().find(|(s, _)| *s == section).map_or(&[][..], |(_, keys)| *keys);
    if let Some(near) = here.iter().filter(|k| edit_distance(k, key) <= 2.min(k.len() / 3)).min_by_key(|k| edit_distance(k, key)) {
        return format!("unknown key; did you mean `{near}`?");
    }
    let top_level = ["", "inside", "outside", "nat", "timeouts", "fragments", "logging", "pcp", "management", "syn_accel", "sctp", "host_id", "dslite", "cluster"];
    if let Some((home, _)) = KNOWN_KEYS.iter().find(|(s, keys)| *s != section && top_level.contains(s) && keys.contains(&key)) {
        return match *home {
            "" => format!("unknown key here: `{key}` is a top-level key (put it above the first [section])"),
            home => format!("unknown key here: `{key}` belongs in [{home}]"),
        };
    }
    "unknown key".to_owned()
}

/// Optimal string alignment distance: insertions, deletions, substitutions
/// and swaps of neighbours each cost one.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text)
    }

    fn key_of(text: &str) -> String {
        parse(text).unwrap_err().key
    }

    #[test]
    fn a_pool_alone_is_a_config() {
        let c = parse("[nat]\npool = [\"203.0.113.0/30\", \"198.51.100.10\"]\n").unwrap();
        assert_eq!(c.engine.pool.len(), 5);
        assert_eq!(c.engine.ports, (1024, 65535));
        assert_eq!(c.engine.timeouts.tcp_established_s, 7440);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/natrix.toml")).unwrap();
        let c = parse(&text).unwrap();
        assert_eq!(c.engine.pool.len(), 17);
        assert_eq!(c.live.inside_interface.as_deref(), Some("eth1"));
        assert_eq!(c.live.gateway, Some(Ipv4Addr::new(198, 51, 100, 254)));
        assert_eq!(c.live.management_listen.as_deref(), Some("127.0.0.1:9300"), "natrix show works out of the box");
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.0/28\"]\nbogus = 1\n"), "nat.bogus");
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.0/28\", \"300.1.1.1\"]\n"), "nat.pool[1]");
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.1/28\"]\n"), "nat.pool[0]");
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.0/28\"]\nfiltering = \"full-cone\"\n"), "nat.filtering");
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.0/28\"]\nports = \"5000-1024\"\n"), "nat.ports");
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.0/28\"]\n[timeouts]\nudp = \"5 minutes\"\n"), "timeouts.udp");
        assert_eq!(key_of("[nat]\npool = []\n"), "nat.pool");
        assert_eq!(key_of("[inside]\naddress = \"100.64.0.1/10\"\n"), "nat.pool");
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.0/28\"]\nmax_ports_per_subscriber = \"many\"\n"), "nat.max_ports_per_subscriber");
        assert_eq!(
            key_of("[nat]\npool = [\"203.0.113.0/28\"]\nstatic = [{ proto = \"tcp\", inside = \"100.64.0.5:22\", outside = \"192.0.2.1:2222\" }]\n"),
            "nat.static[0].outside"
        );
        assert_eq!(key_of("[nat]\npool = [\"203.0.113.0/28\"]\n[unknown]\n"), "unknown");
    }

    /// A value of the wrong type for a key the parser reads is refused as a
    /// wrong value, never as an unknown key: so every key in KNOWN_KEYS is
    /// one the parser knows.
    #[test]
    fn every_known_key_is_read_by_the_parser() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        for (section, keys) in KNOWN_KEYS {
            for key in *keys {
                let text = match *section {
                    "" if *key == "nat" => "nat = [[1]]\n".to_owned(),
                    "" => format!("{key} = [[1]]\n{base}"),
                    "nat" if *key == "pool" => "[nat]\npool = 7\n".to_owned(),
                    "nat" => format!("{base}{key} = [[1]]\n"),
                    "nat.max_ports_per_protocol" => format!("{base}max_ports_per_protocol = {{ {key} = [[1]] }}\n"),
                    "nat.static" => format!("{base}static = [{{ {key} = [[1]] }}]\n"),
                    "nptv6" => format!("{base}[[nptv6]]\n{key} = [[1]]\n"),
                    s => format!("{base}[{s}]\n{key} = [[1]]\n"),
                };
                let e = parse(&text).unwrap_err();
                assert!(!e.problem.starts_with("unknown key"), "{section}.{key}: {e}");
            }
        }
    }

    #[test]
    fn unknown_keys_say_what_was_meant() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        let problem = |extra: &str| parse(&format!("{base}{extra}")).unwrap_err().to_string();
        assert_eq!(problem("max_session = 5\n"), "nat.max_session: unknown key; did you mean `max_sessions`?");
        assert_eq!(problem("filterin = \"endpoint-independent\"\n"), "nat.filterin: unknown key; did you mean `filtering`?");
        assert_eq!(problem("workers = 2\n"), "nat.workers: unknown key here: `workers` is a top-level key (put it above the first [section])");
        assert_eq!(problem("gateway = \"198.51.100.254\"\n"), "nat.gateway: unknown key here: `gateway` belongs in [outside]");
        assert_eq!(problem("[timeouts]\nupd = \"5m\"\n"), "timeouts.upd: unknown key; did you mean `udp`?");
        assert_eq!(
            problem("static = [{ proto = \"tcp\", insde = \"100.64.0.5:22\", outside = \"203.0.113.1:22\" }]\n"),
            "nat.static[0].insde: unknown key; did you mean `inside`?"
        );
        assert_eq!(problem("banana = 1\n"), "nat.banana: unknown key");
    }

    #[test]
    fn addresses_that_collide_are_refused_naming_both_keys() {
        let problem = |text: &str| parse(text).unwrap_err().to_string();
        let p = problem("[inside]\naddress = \"100.64.0.1/10\"\n[nat]\npool = [\"100.64.5.0/28\"]\n");
        assert!(p.starts_with("nat.pool:") && p.contains("inside.address"), "{p}");
        let p = problem("[outside]\naddress = \"203.0.113.1/24\"\n[nat]\npool = [\"203.0.113.0/28\"]\n");
        assert!(p.starts_with("nat.pool:") && p.contains("outside.address"), "{p}");
        let p = problem("[inside]\naddress = \"10.0.0.1/16\"\n[outside]\naddress = \"10.0.5.1/24\"\n[nat]\npool = [\"203.0.113.0/28\"]\n");
        assert!(p.starts_with("outside.address:") && p.contains("inside.address"), "{p}");
        let p = problem("[inside]\ninterface = \"eth1\"\n[outside]\ninterface = \"eth1\"\n[nat]\npool = [\"203.0.113.0/28\"]\n");
        assert!(p.starts_with("outside.interface:") && p.contains("inside.interface"), "{p}");
        let p = problem("[outside]\naddress = \"198.51.100.1/24\"\ngateway = \"192.0.2.1\"\n[nat]\npool = [\"203.0.113.0/28\"]\n");
        assert!(p.starts_with("outside.gateway:") && p.contains("outside.address"), "{p}");
        // The lab's plan is sound: an on-link pool address in the outside prefix is fine.
        parse("[outside]\naddress = \"198.51.100.1/24\"\ngateway = \"198.51.100.11\"\n[nat]\npool = [\"203.0.113.0/28\", \"198.51.100.10/32\"]\n").unwrap();
    }

    #[test]
    fn run_needs_interfaces_and_the_outside_address() {
        let c = parse("[nat]\npool = [\"203.0.113.0/28\"]\n").unwrap();
        let keys: Vec<String> = c.missing_for_run().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["inside.interface", "outside.interface", "outside.address"]);
        assert_eq!(c.advice_for_run().len(), 1);
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/natrix.toml")).unwrap();
        let c = parse(&text).unwrap();
        assert!(c.missing_for_run().is_empty() && c.advice_for_run().is_empty());
    }

    #[test]
    fn a_reload_that_changes_a_restart_key_names_it() {
        let base = "[inside]\ninterface = \"in\"\naddress = \"100.64.0.1/10\"\n[outside]\ninterface = \"out\"\naddress = \"198.51.100.1/24\"\n";
        let with = |extra: &str| parse(&format!("{base}{extra}[nat]\npool = [\"203.0.113.0/28\"]\n")).unwrap();
        let running = with("");
        assert_eq!(running.restart_key_changed(&with("address6 = \"2001:db8:2::1/64\"\n")), Some("outside.address6"));
        let policy = parse(&format!("{base}[nat]\npool = [\"203.0.113.0/28\"]\nfiltering = \"address-dependent\"\n[timeouts]\nudp = \"10m\"\n")).unwrap();
        assert_eq!(running.restart_key_changed(&policy), None, "policy applies live");
        let ports = parse(&format!("{base}[nat]\npool = [\"203.0.113.0/28\"]\nports = \"2000-60000\"\n")).unwrap();
        assert_eq!(running.restart_key_changed(&ports), Some("nat.ports"), "the engine's keys are in the one list");
    }

    #[test]
    fn syntax_errors_say_so() {
        let e = parse("[nat\npool = 1").unwrap_err();
        assert!(e.problem.contains("not valid TOML"), "{e}");
    }

    #[test]
    fn timeouts_below_rfc_minima_warn() {
        let c = parse("[nat]\npool = [\"203.0.113.0/28\"]\n[timeouts]\nudp = \"30s\"\ntcp_established = \"2h4m\"\n").unwrap();
        assert_eq!(c.engine.timeouts.udp_s, 30);
        assert_eq!(c.warnings.len(), 1);
        assert!(c.warnings[0].contains("RFC 4787"));
    }

    #[test]
    fn a_per_mapping_session_limit_above_the_subscribers_warns() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\nmax_sessions_per_subscriber = 100\n";
        let c = parse(&format!("{base}max_sessions_per_mapping = 50\n")).unwrap();
        assert_eq!((c.engine.max_sessions_per_mapping, c.warnings.len()), (50, 0), "{:?}", c.warnings);
        let c = parse(&format!("{base}max_sessions_per_mapping = 100\n")).unwrap();
        assert!(c.warnings.iter().any(|w| w.starts_with("nat.max_sessions_per_mapping")), "{:?}", c.warnings);
        assert_eq!(parse("[nat]\npool = [\"203.0.113.0/28\"]\n").unwrap().engine.max_sessions_per_mapping, 0, "off by default");
    }

    #[test]
    fn logging_exporters_parse_and_errors_name_the_key() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n[logging]\n";
        let c = parse(&format!("{base}ipfix = \"192.0.2.10:4739\"\nsyslog = \"udp:192.0.2.10:514\"\n")).unwrap();
        assert_eq!(c.logging.ipfix, Some("192.0.2.10:4739".parse().unwrap()));
        assert_eq!(c.logging.syslog, Some(crate::syslog::SyslogTarget::Udp("192.0.2.10:514".parse().unwrap())));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let c = parse(&format!("{base}syslog = \"unix:/nonexistent/natrix/log\"\n")).unwrap();
        assert!(c.warnings.iter().any(|w| w.starts_with("logging.syslog")), "{:?}", c.warnings);
        for bad in ["ipfix = \"192.0.2.10\"", "ipfix = \"collector:4739\"", "ipfix = 4739", "ipfix = \"192.0.2.10:0\""] {
            assert_eq!(key_of(&format!("{base}{bad}\n")), "logging.ipfix", "{bad}");
        }
        for bad in ["syslog = \"192.0.2.10:514\"", "syslog = \"udp:192.0.2.10\"", "syslog = \"unix:\"", "syslog = true"] {
            assert_eq!(key_of(&format!("{base}{bad}\n")), "logging.syslog", "{bad}");
        }
    }

    #[test]
    fn pcp_is_off_unless_enabled_and_its_lifetime_is_checked() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        assert_eq!(parse(base).unwrap().engine.pcp, None);
        assert_eq!(parse(&format!("{base}[pcp]\nenabled = false\nmax_lifetime = \"1h\"\n")).unwrap().engine.pcp, None);
        let c = parse(&format!("{base}[pcp]\nenabled = true\n")).unwrap();
        assert_eq!(c.engine.pcp.map(|p| p.max_lifetime_s), Some(86_400));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        let c = parse(&format!("{base}[pcp]\nenabled = true\nmax_lifetime = \"2h\"\n")).unwrap();
        assert_eq!(c.engine.pcp.map(|p| p.max_lifetime_s), Some(7200));
        assert_eq!(key_of(&format!("{base}[pcp]\nenabled = true\nmax_lifetime = \"soon\"\n")), "pcp.max_lifetime");
        assert_eq!(key_of(&format!("{base}[pcp]\nenabled = true\nmax_lifetime = \"0s\"\n")), "pcp.max_lifetime");
        assert_eq!(key_of(&format!("{base}[pcp]\nenabled = \"yes\"\n")), "pcp.enabled");
        assert_eq!(key_of(&format!("{base}[pcp]\nport = 5351\n")), "pcp.port");
    }

    #[test]
    fn exemptions_and_statics_parse() {
        let c = parse(
            "[nat]\npool = [\"203.0.113.0/28\"]\nexempt = [\"192.0.2.0/24\", \"198.51.100.53/32:53\", \"203.0.113.64/26:8000-8080\"]\n\
             static = [{ proto = \"udp\", inside = \"100.64.0.5:53\", outside = \"203.0.113.1:5353\" }]\n",
        )
        .unwrap();
        assert_eq!(c.engine.exempt[1].ports, (53, 53));
        assert_eq!(c.engine.exempt[2].ports, (8000, 8080));
        assert_eq!(c.engine.statics[0].ext_port, 5353);
    }

    #[test]
    fn address6_and_gateway6_parse_into_the_engine_and_live_config() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        let c = parse(&format!(
            "[inside]\naddress6 = \"2001:db8:1::1/64\"\n[outside]\naddress = \"198.51.100.1/24\"\naddress6 = \"2001:db8:2::1/64\"\ngateway6 = \"2001:db8:2::fe\"\n{base}"
        ))
        .unwrap();
        assert_eq!(c.engine.inside_addr6, Some(Addr6 { addr: "2001:db8:1::1".parse().unwrap(), prefix_len: 64 }));
        assert_eq!(c.engine.outside_addr6, Some(Addr6 { addr: "2001:db8:2::1".parse().unwrap(), prefix_len: 64 }));
        assert_eq!(c.live.gateway6, Some("2001:db8:2::fe".parse().unwrap()));
        assert!(!c.advice_for_run().iter().any(|a| a.starts_with("outside.gateway6")));
        // address6 alone is fine; run is advised to have gateway6 beside it.
        let c = parse(&format!("[outside]\naddress6 = \"2001:db8:2::1/64\"\n{base}")).unwrap();
        assert_eq!(c.live.gateway6, None);
        assert!(c.advice_for_run().iter().any(|a| a.starts_with("outside.gateway6")), "{:?}", c.advice_for_run());
        assert_eq!(parse(base).unwrap().engine.inside_addr6, None);
    }

    #[test]
    fn malformed_ipv6_addresses_are_refused_naming_the_key() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        for bad in ["\"2001:db8::1\"", "\"2001:db8::1/0\"", "\"2001:db8::1/129\"", "\"ff02::1/64\"", "\"::/64\"", "\"::1/128\"", "\"100.64.0.1/10\"", "\"2001:db8::g/64\"", "64"] {
            assert_eq!(key_of(&format!("[inside]\naddress6 = {bad}\n{base}")), "inside.address6", "{bad}");
            assert_eq!(key_of(&format!("[outside]\naddress6 = {bad}\n{base}")), "outside.address6", "{bad}");
        }
        for bad in ["\"198.51.100.254\"", "\"2001:db8::1/64\"", "\"fe80::zz\""] {
            assert_eq!(key_of(&format!("[outside]\naddress6 = \"2001:db8:2::1/64\"\ngateway6 = {bad}\n{base}")), "outside.gateway6", "{bad}");
        }
    }

    #[test]
    fn ipv6_addresses_that_collide_are_refused_naming_both_keys() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        let problem = |links: &str| parse(&format!("{links}{base}")).unwrap_err().to_string();
        let p = problem("[inside]\naddress6 = \"2001:db8::1/32\"\n[outside]\naddress6 = \"2001:db8:5::1/64\"\n");
        assert!(p.starts_with("outside.address6:") && p.contains("inside.address6"), "{p}");
        let p = problem("[inside]\naddress6 = \"2001:db8:5::1/64\"\n[outside]\naddress6 = \"2001:db8::1/32\"\n");
        assert!(p.starts_with("outside.address6:") && p.contains("inside.address6"), "{p}");
        let p = problem("[outside]\naddress6 = \"2001:db8:2::1/64\"\ngateway6 = \"2001:db8:3::1\"\n");
        assert!(p.starts_with("outside.gateway6:") && p.contains("outside.address6"), "{p}");
        let p = problem("[outside]\ngateway6 = \"2001:db8:2::fe\"\n");
        assert!(p.starts_with("outside.gateway6:") && p.contains("needs outside.address6"), "{p}");
        let p = problem("[outside]\naddress6 = \"2001:db8:2::1/64\"\ngateway6 = \"2001:db8:2::1\"\n");
        assert!(p.starts_with("outside.gateway6:") && p.contains("own"), "{p}");
        // Neighbouring prefixes are fine.
        parse(&format!("[inside]\naddress6 = \"2001:db8:1::1/64\"\n[outside]\naddress6 = \"2001:db8:2::1/64\"\ngateway6 = \"2001:db8:2::fe\"\n{base}")).unwrap();
    }

    #[test]
    fn devices_defer_unless_told_and_only_a_restart_changes_it() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        let with = |v: &str| parse(&format!("prefer_busy_poll = {v}\n{base}"));
        let default = parse(base).unwrap();
        assert_eq!(default.live.prefer_busy_poll, PreferBusyPoll::Auto);
        assert_eq!(with("\"auto\"").unwrap().live.prefer_busy_poll, PreferBusyPoll::Auto);
        assert_eq!(with("false").unwrap().live.prefer_busy_poll, PreferBusyPoll::Off);
        let on = with("true").unwrap();
        assert_eq!(on.live.prefer_busy_poll, PreferBusyPoll::On);
        assert_eq!(default.restart_key_changed(&on), Some("prefer_busy_poll"));
        for bad in ["1", "\"yes\""] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.key, "prefer_busy_poll");
            assert!(e.to_string().contains("true, false or \"auto\""), "{e}");
        }
    }

    #[test]
    fn xdp_mode_is_automatic_unless_told_and_only_a_restart_changes_it() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        let with = |v: &str| parse(&format!("xdp_mode = {v}\n{base}"));
        let default = parse(base).unwrap();
        assert_eq!(default.live.xdp_mode, XdpProgramMode::Auto);
        assert_eq!(with("\"native\"").unwrap().live.xdp_mode, XdpProgramMode::Native);
        let generic = with("\"generic\"").unwrap();
        assert_eq!(generic.live.xdp_mode, XdpProgramMode::Generic);
        assert_eq!(default.restart_key_changed(&generic), Some("xdp_mode"));
        let e = with("\"skb\"").unwrap_err();
        assert_eq!(e.key, "xdp_mode");
        assert!(e.to_string().contains("\"auto\", \"native\", \"generic\""), "{e}");
    }

    #[test]
    fn offload_is_automatic_unless_told_and_only_a_restart_changes_it() {
        let base = "[nat]\npool = [\"203.0.113.0/28\"]\n";
        let with = |v: &str| parse(&format!("offload = {v}\n{base}"));
        let default = parse(base).unwrap();
        assert_eq!(default.live.offload, Offload::Auto);
        assert_eq!(with("\"auto\"").unwrap().live.offload, Offload::Auto);
        assert_eq!(with("false").unwrap().live.offload, Offload::Off);
        let on = with("true").unwrap();
        assert_eq!(on.live.offload, Offload::On);
        assert_eq!(default.restart_key_changed(&on), Some("offload"));
        for bad in ["1", "\"yes\""] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.key, "offload");
            assert!(e.to_string().contains("true, false or \"auto\""), "{e}");
        }
    }

    #[test]
    fn mode_off_routes_without_a_pool() {
        let c = parse("[nat]\nmode = \"off\"\n").unwrap();
        assert!(!c.engine.translate);
        assert!(c.engine.pool.is_empty());
        assert!(parse("[nat]\npool = [\"203.0.113.0/28\"]\n").unwrap().engine.translate);
        // The keys a router uses still work beside it.
        let c = parse(
            "workers = 2\n[inside]\naddress = \"100.64.0.1/10\"\naddress6 = \"2001:db8:1::1/64\"\n[outside]\ninterface = \"eth2\"\naddress = \"198.51.100.1/24\"\n\
             gateway = \"198.51.100.254\"\naddress6 = \"2001:db8:2::1/64\"\ngateway6 = \"2001:db8:2::fe\"\n\
             [nat]\nmode = \"off\"\nseed = 7\nicmp_errors_per_second = 10\n[logging]\njson = \"/tmp/natrix-events.json\"\n[pcp]\nenabled = false\n",
        )
        .unwrap();
        assert_eq!((c.engine.seed, c.engine.icmp_errors_per_second, c.live.workers), (7, 10, 2));
        assert_eq!(key_of("[nat]\nmode = \"off\"\nbanana = 1\n"), "nat.banana");
        assert_eq!(key_of("[nat]\nmode = \"of\"\n"), "nat.mode");
    }

    /// Every key of the sections translation configures, except those
    /// that serve the router too, is refused by name with mode "off".
    #[test]
    fn mode_off_refuses_each_key_that_needs_translation_by_name() {
        let off = "[nat]\nmode = \"off\"\n";
        for (section, _) in ROUTER_KEYS {
            let known = KNOWN_KEYS.iter().find(|(s, _)| s == section).unwrap().1;
            for key in known.iter().filter(|k| needs_translation(section, k)) {
                let text = match *section {
                    "nat" => format!("{off}{key} = 1\n"),
                    s => format!("{off}[{s}]\n{key} = 1\n"),
                };
                let e = parse(&text).unwrap_err();
                assert_eq!((e.key.as_str(), e.problem.as_str()), (format!("{section}.{key}").as_str(), NEEDS_TRANSLATION), "{text}");
            }
        }
        assert!(needs_translation("nat", "pool") && needs_translation("timeouts", "udp") && needs_translation("logging", "unit"));
        assert!(!needs_translation("nat", "seed") && !needs_translation("logging", "json") && !needs_translation("outside", "address"));
        let e = parse(&format!("{off}banana = 1\n")).unwrap_err();
        assert_eq!((e.key.as_str(), e.problem.as_str()), ("nat.banana", "unknown key"), "an unknown key is unknown, not translation's");
        let e = parse(&format!("{off}[pcp]\nenabled = true\n")).unwrap_err();
        assert_eq!((e.key.as_str(), e.problem.as_str()), ("pcp.enabled", NEEDS_TRANSLATION));
    }

    #[test]
    fn nptv6_bindings_parse_in_every_mode_and_bad_ones_name_the_key() {
        let bindings = "[[nptv6]]\ninside = \"fd01:203:405::/48\"\noutside = \"2001:db8:1::/48\"\n\
                        [[nptv6]]\ninside = \"fd02:0:0:7::/64\"\noutside = \"2001:db8:2:7::/64\"\n";
        for nat in ["[nat]\npool = [\"203.0.113.0/28\"]\n", "[nat]\nmode = \"off\"\n"] {
            let c = parse(&format!("{nat}{bindings}")).unwrap();
            assert_eq!(c.engine.nptv6.len(), 2);
            assert_eq!(c.engine.nptv6[0], Nptv6Binding { inside: "fd01:203:405::".parse().unwrap(), outside: "2001:db8:1::".parse().unwrap(), prefix_len: 48 });
            assert_eq!(c.engine.nptv6[1].prefix_len, 64);
        }
        let base = "[nat]\nmode = \"off\"\n[[nptv6]]\n";
        let problem = |binding: &str| parse(&format!("{base}{binding}")).unwrap_err().to_string();
        let p = problem("inside = \"fd01:203:405::/48\"\noutside = \"2001:db8:1::/56\"\n");
        assert!(p.starts_with("nptv6[0].outside:") && p.contains("equal length"), "{p}");
        let p = problem("inside = \"fd01:203:405:1::/72\"\noutside = \"2001:db8:1:1::/72\"\n");
        assert!(p.starts_with("nptv6[0].inside:") && p.contains("1-64"), "{p}");
        let p = problem("inside = \"fd01:203:405:1::/48\"\noutside = \"2001:db8:1::/48\"\n");
        assert!(p.starts_with("nptv6[0].inside:") && p.contains("host bits"), "{p}");
        let p = problem("inside = \"fd01:203:405::/48\"\noutside = \"2001:db8:1::/48\"\n[[nptv6]]\ninside = \"fd01:203::/32\"\noutside = \"2001:db9::/32\"\n");
        assert!(p.starts_with("nptv6[1].inside:") && p.contains("overlaps nptv6[0].inside"), "{p}");
        assert!(problem("inside = \"fd01:203:405::/48\"\n").starts_with("nptv6[0]: needs inside and outside"));
        assert!(problem("inside = \"fd01:203:405::\"\noutside = \"2001:db8:1::/48\"\n").starts_with("nptv6[0].inside:"));
        assert!(problem("inside = \"fd01:203:405::/48\"\noutside = \"2001:db8:1::/48\"\nlength = 48\n").starts_with("nptv6[0].length: unknown key"));
    }
}
