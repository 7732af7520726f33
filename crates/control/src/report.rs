//! The replay report: what went in, what came out, why things were dropped,
//! and how much of the pool and of each subscriber's quota was used.

use std::collections::{BTreeMap, HashMap};

use natrix_engine::{Engine, EngineConfig, Event, EventKind, Proto, Side};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub packets: Packets,
    /// Non-zero drop counters by reason name.
    pub drops: BTreeMap<&'static str, u64>,
    pub mappings_created: u64,
    pub sessions_created: u64,
    pub peak_sessions: u64,
    pub peak_mappings: u64,
    /// Subscribers that held at least one mapping.
    pub subscribers: u64,
    /// Peak number of external ports each subscriber held at once.
    pub ports_per_subscriber: Percentiles,
    pub pool: PoolUse,
    pub events_lost: u64,
    /// What each logging scheme would write for this traffic.
    pub log_volume: LogVolume,
    /// Records each configured log sink took and lost, by sink (`json`,
    /// `ipfix`, `syslog`).
    pub log_export: BTreeMap<&'static str, SinkUse>,
    /// Where the input capture ended inside a record, if it did.
    pub input_truncated: Option<Truncation>,
    /// The SYN accelerator's counters, when `[syn_accel]` is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syn_accel: Option<SynAccelUse>,
    /// SYNs that passed without the HOST_ID options they lacked, for want of
    /// room (CONTRACTS.md's counter); with `host_id.no_room`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_id_no_room: Option<u64>,
    /// HOST_ID's counters, when `[host_id]` is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_id: Option<HostIdUse>,
    /// DS-Lite's counters, when `[dslite]` is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dslite: Option<DsliteUse>,
}

/// What the DS-Lite AFTR did: B4s seen, packets decapsulated and
/// encapsulated, outer fragments sent, softwire packets reassembled,
/// packet-too-big messages that lowered a softwire's MTU, and packets
/// whose ECN fields RFC 6040 asks to log.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct DsliteUse {
    pub softwires: u64,
    pub decapsulated: u64,
    pub encapsulated: u64,
    pub outer_fragments: u64,
    pub reassembled: u64,
    pub mtu_lowered: u64,
    pub ecn_unexpected: u64,
}

/// What HOST_ID did (seed 000): segments options were inserted into,
/// options corrected and removed in place, segments without room or with a
/// malformed options area, ACK mode's echoes removed and first ACKs
/// written, and what each `[[host_id.rule]]` decided.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct HostIdUse {
    pub injected: u64,
    pub corrected: u64,
    pub removed: u64,
    pub no_room: u64,
    pub malformed: u64,
    pub echoes_removed: u64,
    pub acks_injected: u64,
    pub acks_untracked: u64,
    pub no_b4: u64,
    pub events_lost: u64,
    pub rules: Vec<RuleUse>,
}

/// One rule, as configured, and the segments it decided.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RuleUse {
    pub option: &'static str,
    pub action: &'static str,
    pub matched: u64,
}

impl HostIdUse {
    fn of(st: &natrix_engine::host_id::HostIdStats, cfg: Option<&natrix_engine::host_id::HostIdConfig>) -> HostIdUse {
        let rules = cfg.map_or(&[][..], |c| &c.rules[..]);
        HostIdUse {
            injected: st.injected,
            corrected: st.corrected,
            removed: st.removed,
            no_room: st.no_room,
            malformed: st.malformed,
            echoes_removed: st.echoes_removed,
            acks_injected: st.acks_injected,
            acks_untracked: st.acks_untracked,
            no_b4: st.no_b4,
            events_lost: st.events_lost,
            rules: rules.iter().zip(&st.rule_matches).map(|(r, &matched)| RuleUse { option: r.option.name(), action: r.action.name(), matched }).collect(),
        }
    }
}

/// What the SYN accelerator did: first SYNs tracked, copies sent, attempts
/// an answer ended before the deadline (the server's, a simultaneous open,
/// an ICMP error about the SYN), resets sent to callers, first SYNs left
/// untracked.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SynAccelUse {
    pub syns: u64,
    pub retransmits: u64,
    pub answered: u64,
    pub resets: u64,
    pub untracked: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct SinkUse {
    pub sent: u64,
    pub lost: u64,
}

/// A capture cut short: `after_frame` whole frames were read, and the
/// incomplete record starts at `byte_offset`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Truncation {
    pub after_frame: u64,
    pub byte_offset: u64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Packets {
    #[serde(rename = "in")]
    pub input: u64,
    pub in_inside: u64,
    pub in_outside: u64,
    pub out: u64,
    pub out_inside: u64,
    pub out_outside: u64,
    /// Frames natrix built itself (ICMP errors), included in `out`.
    pub generated: u64,
    pub dropped: u64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Percentiles {
    pub p50: u32,
    pub p99: u32,
    pub max: u32,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PoolUse {
    pub addresses: u64,
    /// External ports over all addresses and the three protocols.
    pub ports: u64,
    pub peak_ports_used: u64,
    pub peak_utilisation: f64,
}

/// Follows mapping events to learn each subscriber's peak port count.
#[derive(Default)]
pub struct ReportBuilder {
    ports: HashMap<u32, (u32, u32)>,
    volume: VolumeBuilder,
}

impl ReportBuilder {
    /// A builder that also simulates port block logging as `cfg` would
    /// allocate blocks (port range, parity, configured block size).
    pub fn for_config(cfg: &EngineConfig) -> ReportBuilder {
        ReportBuilder { ports: HashMap::new(), volume: VolumeBuilder::new(cfg) }
    }

    pub fn on_event(&mut self, e: &Event) {
        self.volume.on_event(e);
        match e.kind {
            EventKind::MappingCreated => {
                let (now, peak) = self.ports.entry(e.int_addr).or_default();
                *now += 1;
                *peak = (*peak).max(*now);
            }
            EventKind::MappingDeleted => {
                if let Some((now, _)) = self.ports.get_mut(&e.int_addr) {
                    *now = now.saturating_sub(1);
                }
            }
            _ => {}
        }
    }

    pub fn build(&self, engine: &Engine) -> Report {
        let st = engine.stats();
        let drops: BTreeMap<_, _> = st.drops.nonzero().collect();
        let (i, o) = (Side::Inside as usize, Side::Outside as usize);
        let out_inside = st.forwarded[i] + st.generated[i];
        let out_outside = st.forwarded[o] + st.generated[o];
        let packets = Packets {
            input: st.received[i] + st.received[o],
            in_inside: st.received[i],
            in_outside: st.received[o],
            out: out_inside + out_outside,
            out_inside,
            out_outside,
            generated: st.generated[i] + st.generated[o],
            dropped: st.drops.total(),
        };
        let mut peaks: Vec<u32> = self.ports.values().map(|&(_, peak)| peak).collect();
        peaks.sort_unstable();
        let pool = engine.pool();
        let ports = pool.total_ports();
        Report {
            packets,
            drops,
            mappings_created: st.mappings_created,
            sessions_created: st.sessions_created,
            peak_sessions: st.peak_sessions,
            peak_mappings: st.peak_mappings,
            subscribers: peaks.len() as u64,
            ports_per_subscriber: Percentiles { p50: nearest_rank(&peaks, 50), p99: nearest_rank(&peaks, 99), max: peaks.last().copied().unwrap_or(0) },
            pool: PoolUse {
                addresses: pool.addresses().count() as u64,
                ports,
                peak_ports_used: st.peak_ports_in_use,
                peak_utilisation: if ports == 0 { 0.0 } else { st.peak_ports_in_use as f64 / ports as f64 },
            },
            events_lost: engine.events_lost(),
            log_volume: self.volume.build(st.sessions_created, engine.tables().session_count() as u64),
            log_export: BTreeMap::new(),
            input_truncated: None,
            syn_accel: st.syn_accel.as_ref().map(|a| SynAccelUse { syns: a.syns, retransmits: a.retransmits, answered: a.answered, resets: a.resets, untracked: a.untracked }),
            host_id_no_room: st.host_id.as_ref().map(|h| h.no_room),
            host_id: st.host_id.as_ref().map(|h| HostIdUse::of(h, engine.config().host_id.as_ref())),
            dslite: st.dslite.map(|d| DsliteUse {
                softwires: d.softwires,
                decapsulated: d.decapsulated,
                encapsulated: d.encapsulated,
                outer_fragments: d.fragmented,
                reassembled: d.reassembled,
                mtu_lowered: d.mtu_lowered,
                ecn_unexpected: d.ecn_unexpected,
            }),
        }
    }
}

/// Log records and bytes (JSON lines, as `[logging] json` writes them).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Volume {
    pub records: u64,
    pub bytes: u64,
    /// True when the figures are estimated rather than counted from the
    /// records natrix would write for this run.
    pub estimated: bool,
}

/// What per-mapping, per-session, port block and deterministic logging
/// would write for the replayed traffic, so an operator can choose.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct LogVolume {
    /// `[logging] unit = "mapping"`: mapping create/delete records.
    pub per_mapping: Volume,
    /// `unit = "session"`: mapping records plus session create/delete records.
    pub per_session: Volume,
    /// `port_block_size = N`: block allocate/release records, by block size.
    pub port_block: BTreeMap<u16, Volume>,
    /// `mode = "deterministic"` (RFC 7422): the configuration is the log.
    pub deterministic: Volume,
}

impl LogVolume {
    /// Human-readable lines for the replay summary.
    pub fn summary_lines(&self) -> Vec<String> {
        let v = |name: String, v: &Volume| format!("    {name:<22} {:>10} records {:>12} bytes{}", v.records, v.bytes, if v.estimated { "  (estimated)" } else { "" });
        let mut out = vec!["  log volume for this traffic (JSON lines):".to_owned(), v("per mapping".into(), &self.per_mapping), v("per session".into(), &self.per_session)];
        out.extend(self.port_block.iter().map(|(size, vol)| v(format!("port blocks of {size}"), vol)));
        out.push(v("deterministic".into(), &self.deterministic));
        out
    }
}

/// Block sizes the report always estimates, besides the configured one.
const BLOCK_SIZES: [u16; 3] = [64, 256, 1024];
/// Bytes a session record adds to a mapping record: `,"remote":"198.51.100.20","remote_port":443`.
const SESSION_EXTRA_BYTES: u64 = 43;

/// One simulated port block of a subscriber for one protocol.
struct SimBlock {
    id: u64,
    /// Free ports of each parity (even, odd); with no parity rule, all in [0].
    free: [u32; 2],
}

/// Port block allocation replayed on the mapping events: a mapping takes a
/// port in the subscriber's first block with room (of its parity), else a
/// new block; a block whose last mapping goes is released. The same rules
/// as the engine's block mode, without quotas or exhaustion.
struct BlockSim {
    size: u16,
    lo: u16,
    parity: bool,
    blocks: HashMap<(u32, Proto), Vec<SimBlock>>,
    mappings: HashMap<(Proto, u32, u16), (u64, usize)>,
    next_id: u64,
    volume: Volume,
}

impl BlockSim {
    fn new(size: u16, lo: u16, parity: bool) -> Self {
        BlockSim { size, lo, parity, blocks: HashMap::new(), mappings: HashMap::new(), next_id: 0, volume: Volume { estimated: true, ..Volume::default() } }
    }

    fn lane(&self, proto: Proto, port: u16) -> usize {
        usize::from(self.parity && proto != Proto::Icmp) * usize::from(port & 1)
    }

    fn record(&mut self, kind: EventKind, e: &Event) {
        let first = self.lo + (e.ext_port.saturating_sub(self.lo) / self.size) * self.size;
        let last = first.saturating_add(self.size - 1);
        let block = Event { kind, int_port: 0, ext_port: first, ext_port_end: last, rem_addr: 0, rem_port: 0, ..*e };
        self.volume.records += 1;
        self.volume.bytes += crate::eventlog::line_len(&block);
    }

    fn on_create(&mut self, e: &Event) {
        let lane = self.lane(e.proto, e.int_port);
        let split = self.parity && e.proto != Proto::Icmp;
        let size = u32::from(self.size);
        let list = self.blocks.entry((e.int_addr, e.proto)).or_default();
        let (taken, fresh) = match list.iter_mut().find(|b| b.free[lane] > 0) {
            Some(b) => {
                b.free[lane] -= 1;
                ((b.id, lane), false)
            }
            None => {
                let mut free = if split { [size / 2, size - size / 2] } else { [size, 0] };
                // A fresh block with no port of the wanted parity takes any.
                let lane = if free[lane] > 0 { lane } else { 1 - lane };
                free[lane] -= 1;
                self.next_id += 1;
                list.push(SimBlock { id: self.next_id, free });
                ((self.next_id, lane), true)
            }
        };
        if fresh {
            self.record(EventKind::BlockAllocated, e);
        }
        self.mappings.insert((e.proto, e.int_addr, e.int_port), taken);
    }

    fn on_delete(&mut self, e: &Event) {
        let Some((id, lane)) = self.mappings.remove(&(e.proto, e.int_addr, e.int_port)) else { return };
        let size = u32::from(self.size);
        let split = self.parity && e.proto != Proto::Icmp;
        let Some(list) = self.blocks.get_mut(&(e.int_addr, e.proto)) else { return };
        let Some(at) = list.iter().position(|b| b.id == id) else { return };
        list[at].free[lane] += 1;
        let full = if split { [size / 2, size - size / 2] } else { [size, 0] };
        if list[at].free == full {
            list.remove(at);
            if list.is_empty() {
                self.blocks.remove(&(e.int_addr, e.proto));
            }
            self.record(EventKind::BlockReleased, e);
        }
    }
}

/// Counts what each logging scheme would write, from the engine's events.
#[derive(Default)]
struct VolumeBuilder {
    mapping: Volume,
    /// Exhaustion and quota records, written in every unit.
    always: Volume,
    session: Volume,
    session_events: bool,
    /// Real block records (the engine ran in block mode with this size).
    real_blocks: Option<(u16, Volume)>,
    sims: Vec<BlockSim>,
}

impl VolumeBuilder {
    fn new(cfg: &EngineConfig) -> Self {
        let mut sizes: Vec<u16> = BLOCK_SIZES.to_vec();
        if cfg.port_block_size > 0 && !sizes.contains(&cfg.port_block_size) {
            sizes.push(cfg.port_block_size);
        }
        let sims = sizes.into_iter().filter(|&s| s != cfg.port_block_size).map(|s| BlockSim::new(s, cfg.ports.0, cfg.port_parity)).collect();
        let real_blocks = (cfg.port_block_size > 0).then(|| (cfg.port_block_size, Volume::default()));
        VolumeBuilder { sims, real_blocks, session_events: cfg.log_sessions, ..VolumeBuilder::default() }
    }

    fn on_event(&mut self, e: &Event) {
        let add = |v: &mut Volume| {
            v.records += 1;
            v.bytes += crate::eventlog::line_len(e);
        };
        match e.kind {
            // An SCTP association holds no port block: its record is written in every unit.
            EventKind::MappingCreated | EventKind::MappingDeleted if e.proto == Proto::Sctp => add(&mut self.always),
            EventKind::MappingCreated => {
                add(&mut self.mapping);
                self.sims.iter_mut().for_each(|s| s.on_create(e));
            }
            EventKind::MappingDeleted => {
                add(&mut self.mapping);
                self.sims.iter_mut().for_each(|s| s.on_delete(e));
            }
            EventKind::SessionCreated | EventKind::SessionDeleted => add(&mut self.session),
            EventKind::BlockAllocated | EventKind::BlockReleased => {
                if let Some((_, v)) = self.real_blocks.as_mut() {
                    add(v);
                }
            }
            EventKind::AddressesExhausted | EventKind::PortsExhausted | EventKind::QuotaExceeded => add(&mut self.always),
        }
    }

    /// `sessions_created` and `sessions_live` (at the end) count the session
    /// records when the engine did not emit them.
    fn build(&self, sessions_created: u64, sessions_live: u64) -> LogVolume {
        let plus = |a: &Volume, b: &Volume| Volume { records: a.records + b.records, bytes: a.bytes + b.bytes, estimated: a.estimated || b.estimated };
        let per_mapping = plus(&self.mapping, &self.always);
        let sessions = if self.session_events {
            self.session.clone()
        } else {
            let records = sessions_created + sessions_created.saturating_sub(sessions_live);
            let mean = self.mapping.bytes.checked_div(self.mapping.records).unwrap_or(0);
            Volume { records, bytes: records * (mean + SESSION_EXTRA_BYTES), estimated: true }
        };
        let mut port_block: BTreeMap<u16, Volume> = self.sims.iter().map(|s| (s.size, plus(&s.volume, &self.always))).collect();
        if let Some((size, v)) = &self.real_blocks {
            port_block.insert(*size, plus(v, &self.always));
        }
        LogVolume { per_session: plus(&per_mapping, &sessions), per_mapping, port_block, deterministic: Volume::default() }
    }
}

/// The nearest-rank percentile of sorted values (0 when there are none).
fn nearest_rank(sorted: &[u32], pct: usize) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (pct * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::nearest_rank;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50), 50);
        assert_eq!(nearest_rank(&v, 99), 99);
        assert_eq!(nearest_rank(&[7], 99), 7);
        assert_eq!(nearest_rank(&[1, 2, 3], 50), 2);
        assert_eq!(nearest_rank(&[], 50), 0);
    }
}
