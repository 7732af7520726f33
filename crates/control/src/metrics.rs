//! Prometheus exposition of a running dataplane, encoded by the
//! `prometheus-client` crate: OpenMetrics 1.0 text for scrapers that ask for
//! it (Prometheus does), the Prometheus text format 0.0.4 otherwise. Every
//! name carries the `natrix_` prefix; counters end in `_total`.
//!
//! The values are read from snapshots at each scrape, so the families are
//! built here as plain data and handed to the encoder by a [`Collector`].

use crate::cluster::node::ClusterStatus;
use natrix_dataplane::{IoSnapshot, WorkerSnapshot, PORT_USE_THRESHOLDS};
use natrix_engine::{DropReason, Proto, Side};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

const SIDES: [Side; 2] = [Side::Inside, Side::Outside];

/// The two text formats a scraper may get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (ends with `# EOF`).
    OpenMetrics,
    /// The Prometheus text format, version 0.0.4.
    Prometheus,
}

impl Format {
    /// The format an HTTP `Accept` header asks for: OpenMetrics when it names
    /// it, else the Prometheus text format (what curl and older tools get).
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Value {
    Int(u64),
    Float(f64),
}

/// One metric family: its full exported name without the `natrix_` prefix
/// (counters with their `_total`), help, type and samples.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    counter: bool,
    samples: Vec<(Vec<(&'static str, String)>, Value)>,
}

#[derive(Debug, Default)]
struct Families(Vec<Family>);

impl Families {
    fn family(&mut self, name: &'static str, counter: bool, help: &'static str) -> &mut Family {
        // pool_ports_total, a gauge, predates the rule and is kept as README documents it.
        debug_assert!(counter == name.ends_with("_total") || name == "pool_ports_total", "{name}: counters, and only counters, end in _total");
        self.0.push(Family { name, help, counter, samples: Vec::new() });
        self.0.last_mut().expect("just pushed")
    }

    fn counter(&mut self, name: &'static str, help: &'static str, value: u64) {
        self.family(name, true, help).sample(&[], Value::Int(value));
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, value: u64) {
        self.family(name, false, help).sample(&[], Value::Int(value));
    }

    fn per_side(&mut self, name: &'static str, help: &'static str, values: [u64; 2]) {
        self.by_side(name, true, help, values);
    }

    fn gauge_per_side(&mut self, name: &'static str, help: &'static str, values: [u64; 2]) {
        self.by_side(name, false, help, values);
    }

    fn by_side(&mut self, name: &'static str, counter: bool, help: &'static str, values: [u64; 2]) {
        let f = self.family(name, counter, help);
        for side in SIDES {
            f.sample(&[("interface", side.name().to_owned())], Value::Int(values[side as usize]));
        }
    }
}

impl Family {
    fn sample(&mut self, labels: &[(&'static str, String)], value: Value) -> &mut Family {
        self.samples.push((labels.to_vec(), value));
        self
    }

    /// The name the encoder is given and the unit it appends: it adds the
    /// unit and, for counters, `_total` itself.
    fn parts(&self) -> (&'static str, Option<Unit>) {
        let base = if self.counter { self.name.strip_suffix("_total").unwrap_or(self.name) } else { self.name };
        if let Some(b) = base.strip_suffix("_bytes") {
            (b, Some(Unit::Bytes))
        } else if let Some(b) = base.strip_suffix("_seconds") {
            (b, Some(Unit::Seconds))
        } else {
            (base, None)
        }
    }
}

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let (name, unit) = f.parts();
            let kind = if f.counter { MetricType::Counter } else { MetricType::Gauge };
            let mut metric = encoder.encode_descriptor(name, f.help, unit.as_ref(), kind)?;
            for (labels, value) in &f.samples {
                let m = metric.encode_family(labels)?;
                match (f.counter, *value) {
                    (true, Value::Int(v)) => ConstCounter::new(v).encode(m)?,
                    (true, Value::Float(v)) => ConstCounter::new(v).encode(m)?,
                    (false, Value::Int(v)) => ConstGauge::new(v).encode(m)?,
                    (false, Value::Float(v)) => ConstGauge::new(v).encode(m)?,
                }
            }
        }
        Ok(())
    }
}

/// DS-Lite's counters (RFC 6333), where `[dslite]` is configured.
fn dslite_families(o: &mut Families, workers: &[WorkerSnapshot]) {
    if workers.iter().all(|w| w.stats.dslite.is_none()) {
        return;
    }
    let d = |f: fn(&natrix_engine::dslite::DsliteStats) -> u64| sum(workers, |w| w.stats.dslite.as_ref().map_or(0, f));
    o.gauge("dslite_softwires", "B4s that have sent softwire packets since natrix started.", d(|s| s.softwires));
    o.counter("dslite_decapsulated_packets_total", "Softwire packets decapsulated (one per inner packet, after reassembly).", d(|s| s.decapsulated));
    o.counter("dslite_encapsulated_packets_total", "IPv4 packets encapsulated towards B4s.", d(|s| s.encapsulated));
    o.counter("dslite_outer_fragments_total", "Outer IPv6 fragments sent towards B4s for packets over their softwire MTU.", d(|s| s.fragmented));
    o.counter("dslite_reassembled_packets_total", "Softwire packets rebuilt from a B4's fragments.", d(|s| s.reassembled));
    o.counter("dslite_mtu_lowered_total", "ICMPv6 packet-too-big messages that lowered a softwire's MTU (RFC 2473 section 7).", d(|s| s.mtu_lowered));
    o.counter(
        "dslite_ecn_unexpected_packets_total",
        "Softwire packets decapsulated whose inner and outer ECN fields no compliant encapsulator makes (RFC 6040 figure 4's cells to log).",
        d(|s| s.ecn_unexpected),
    );
}

fn sum(workers: &[WorkerSnapshot], f: impl Fn(&WorkerSnapshot) -> u64) -> u64 {
    workers.iter().map(f).sum()
}

/// `(log_recorded, log_lost)`: records the logger handed to its sinks, and
/// those the sinks dropped (collector down, file unwritable), which add to
/// those the workers could not hand to the logger.
/// `cluster`: the node's cluster status, where it is in one.
pub fn render(workers: &[WorkerSnapshot], io: &IoSnapshot, log: (u64, u64), cluster: Option<&ClusterStatus>, format: Format) -> String {
    let mut registry = Registry::with_prefix("natrix");
    let mut families = families(workers, io, log);
    if let Some(c) = cluster {
        cluster_families(&mut families, c);
    }
    registry.register_collector(Box::new(families));
    if let Some(syn_accel) = crate::synaccel_metrics::collector(workers) {
        registry.register_collector(Box::new(syn_accel));
    }
    if let Some(host_id) = crate::host_id_metrics::collector(workers) {
        registry.register_collector(Box::new(host_id));
    }
    let mut out = String::with_capacity(16 * 1024);
    let encoded = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry),
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry),
    };
    // Writing to a String cannot fail.
    encoded.expect("encoding metrics into a String");
    out
}

fn families(workers: &[WorkerSnapshot], io: &IoSnapshot, (log_recorded, log_lost): (u64, u64)) -> Families {
    let mut o = Families::default();
    o.per_side("rx_packets_total", "Frames received on each interface.", io.rx_frames);
    o.per_side("rx_bytes_total", "Bytes received on each interface.", io.rx_bytes);
    o.per_side("rx_kernel_dropped_total", "Frames the kernel dropped because natrix's receive ring was full (natrix fell behind).", io.rx_kernel_dropped);
    o.per_side("tx_packets_total", "Frames sent on each interface.", io.tx_frames);
    o.per_side("tx_bytes_total", "Bytes sent on each interface.", io.tx_bytes);
    o.per_side("tx_dropped_total", "Frames lost because the interface's transmit queue was full.", io.tx_dropped);
    o.per_side("rx_refused_total", "Frames refused on receive: a VLAN tag, longer than natrix's buffers, or a partial checksum natrix cannot finish (AF_PACKET).", io.rx_refused);
    o.per_side(
        "rx_checksums_completed_total",
        "Frames received with a TCP or UDP checksum their sender's offload left partial (a veth peer's), which natrix finished before translating them.",
        io.checksums_completed(workers),
    );
    o.per_side(
        "translated_packets_total",
        "Frames the NAT forwarded (the workers and the XDP offload), by the interface they left on.",
        [0, 1].map(|i| sum(workers, |w| w.stats.forwarded[i]) + io.offloaded_frames[i]),
    );
    o.per_side(
        "offloaded_packets_total",
        "Frames of established flows the interfaces' XDP programs translated and forwarded themselves (offload), by the interface they left on.",
        io.offloaded_frames,
    );
    o.per_side("offloaded_bytes_total", "Bytes of those frames.", io.offloaded_bytes);
    o.gauge("offload_flows", "Flow directions in the XDP offload's table.", sum(workers, |w| w.offloaded_flows));
    o.gauge_per_side(
        "offload_egress",
        "1 while the interface takes the frames the XDP offload redirects to it (read once a second); 0: flows leaving by it stay with the workers, as without the offload.",
        io.offload_egress.map(u64::from),
    );
    let f = o.family("offload_returned_total", true, "Flow directions the XDP offload handed back to the workers, by why (a frame it does not translate, session no longer steady, idle, next hop, egress, gone from the table, a reset of all).");
    for (i, r) in natrix_dataplane::OffloadReturned::ALL.iter().enumerate() {
        f.sample(&[("reason", r.name().to_owned())], Value::Int(sum(workers, |w| w.offload_returned[i])));
    }
    o.counter(
        "offload_table_full_total",
        "Times a flow direction found the XDP offload's table full (at most one a second per worker; such flows stay with the workers).",
        sum(workers, |w| w.offload_table_full),
    );
    o.per_side("generated_packets_total", "Frames natrix generated (ICMP errors), by the interface they left on.", [0, 1].map(|i| sum(workers, |w| w.stats.generated[i])));
    let nptv6 = [0, 1].map(|i| sum(workers, |w| w.stats.nptv6_translated[i]));
    o.per_side("nptv6_translated_packets_total", "IPv6 frames NPTv6 (RFC 6296) translated, by the interface they arrived on.", nptv6);
    dslite_families(&mut o, workers);
    let f = o.family("drops_total", true, "Frames the NAT dropped, by reason.");
    for &r in DropReason::ALL {
        f.sample(&[("reason", r.name().to_owned())], Value::Int(sum(workers, |w| w.stats.drops.get(r))));
    }
    let f = o.family("sessions", false, "Sessions in the table, by protocol.");
    for p in Proto::ALL {
        f.sample(&[("protocol", p.name().to_owned())], Value::Int(sum(workers, |w| u64::from(w.sessions_by_proto[p as usize]))));
    }
    let f = o.family("mappings", false, "Mappings (external address and port bindings), by protocol.");
    for p in Proto::ALL {
        f.sample(&[("protocol", p.name().to_owned())], Value::Int(sum(workers, |w| u64::from(w.mappings_by_proto[p as usize]))));
    }
    o.counter("sessions_created_total", "Sessions created.", sum(workers, |w| w.stats.sessions_created));
    o.counter("mappings_created_total", "Mappings created.", sum(workers, |w| w.stats.mappings_created));
    o.gauge("subscribers", "Subscribers holding state.", sum(workers, |w| w.subscribers));
    o.gauge("pool_ports_in_use", "External ports held by mappings or blocks.", sum(workers, |w| w.ports_in_use));
    // Each worker's allocator covers its slice of every address; together they are the pool.
    o.gauge("pool_ports_total", "External ports in the pool (addresses x protocols x port range).", sum(workers, |w| w.total_ports));
    let f = o.family("subscribers_port_use", false, "Subscribers whose external port use is at least this share of max_ports_per_subscriber.");
    for (i, t) in PORT_USE_THRESHOLDS.iter().enumerate() {
        f.sample(&[("at_least", t.to_string())], Value::Int(sum(workers, |w| w.port_use_over[i])));
    }
    o.gauge("memory_bytes", "Bytes held by tables, allocator and subscriber state.", sum(workers, |w| w.memory_bytes));
    o.counter("log_records_lost_total", "NAT event records dropped: logger behind, collector unreachable or log file unwritable.", sum(workers, |w| w.events_lost) + log_lost);
    o.counter("log_records_total", "NAT event records handed to the configured log sinks (JSON, IPFIX, syslog).", log_recorded);
    o.counter("handoff_dropped_total", "Frames dropped because a ring between threads (or its copy buffers) was full.", io.handoff_dropped + sum(workers, |w| w.handoff_dropped));
    let f = o.family(
        "io_system_calls_total",
        true,
        "System calls of the thread that owns the interfaces: to make the kernel transmit (sendto, sendmmsg), to make it receive (recvfrom), to wait for frames (poll).",
    );
    for (call, n) in [("transmit", io.transmit_calls), ("receive", io.receive_calls), ("wait", io.wait_calls)] {
        f.sample(&[("call", call.to_owned())], Value::Int(n));
    }
    let f = o.family("worker_packets_total", true, "Frames each worker processed.");
    for (i, w) in workers.iter().enumerate() {
        f.sample(&[("worker", i.to_string())], Value::Int(w.stats.received.iter().sum()));
    }
    let f = o.family(
        "worker_busy_seconds_total",
        true,
        "CPU time each worker spent in rounds that carried frames (not polling for them); its rate is the worker's load (1 = fully busy).",
    );
    for (i, w) in workers.iter().enumerate() {
        f.sample(&[("worker", i.to_string())], Value::Float(w.busy_ns as f64 / 1e9));
    }
    let f = o.family(
        "worker_received_frames_total",
        true,
        "Frames each worker took from the receive queues it serves (all of them for the one worker that owns the interfaces; spread over every worker with per-queue workers).",
    );
    for (i, w) in workers.iter().enumerate() {
        f.sample(&[("worker", i.to_string())], Value::Int(w.received));
    }
    let f = o.family("pcp_requests_total", true, "PCP requests answered, by result code (RFC 6887 section 7.4).");
    for code in 0..16u8 {
        let n = sum(workers, |w| w.pcp.results[usize::from(code)]);
        if n > 0 || code == 0 {
            f.sample(&[("result", natrix_wire::pcp::result::name(code).to_owned())], Value::Int(n));
        }
    }
    o.counter("pcp_requests_ignored_total", "PCP datagrams not answered (too short, bad checksum, over the rate limit).", sum(workers, |w| w.pcp.ignored));
    let g = &io.gateway;
    o.counter("arp_replies_sent_total", "ARP replies natrix sent for its addresses.", g.arp_replies_sent);
    o.counter("arp_requests_sent_total", "ARP requests natrix sent to find next hops.", g.arp_requests_sent);
    o.counter("nd_adverts_sent_total", "Neighbor Advertisements natrix sent for its IPv6 addresses (RFC 4861).", g.nd_adverts_sent);
    o.counter("nd_solicits_sent_total", "Neighbor Solicitations natrix sent to find IPv6 next hops.", g.nd_solicits_sent);
    o.counter("next_hop_unresolved_total", "Frames dropped because their next hop did not answer ARP or Neighbor Discovery.", g.unresolved);
    o.counter("no_route_total", "Frames with no next hop (off-link inside, no outside gateway of the frame's family, or IPv6 on a side without address6).", g.no_route);
    o.counter("not_for_us_total", "Unicast frames for another host's MAC address.", g.not_for_us);
    o.counter("not_ipv4_total", "Frames natrix does not route: neither IP nor ARP (LLDP, VLAN-tagged), IP to a group MAC, malformed ARP or Neighbor Discovery.", g.not_ipv4);
    o
}

/// `natrix_cluster_*`: the node's role and session sync (docs/SCALE-OUT.md).
fn cluster_families(o: &mut Families, c: &ClusterStatus) {
    let f = o.family("cluster_role", false, "1 for the role this cluster node has now (active or standby), 0 for the other.");
    for role in ["active", "standby"] {
        f.sample(&[("role", role.to_owned())], Value::Int(u64::from(c.role == role)));
    }
    o.counter("cluster_role_changes_total", "Times this node changed role (took over, or yielded to an active partner).", c.role_changes);
    o.gauge("cluster_announcing", "1 while the BGP speaker announces this node's prefixes.", u64::from(c.announcing));
    o.gauge("cluster_sync_lag_records", "Records sent to the standby and not yet acknowledged (active node).", c.lag_records);
    o.counter("cluster_sync_records_sent_total", "Records sent to the standby at least once.", c.records_sent);
    o.counter("cluster_sync_records_acked_total", "Records the standby acknowledged.", c.records_acked);
    o.counter("cluster_sync_records_given_up_total", "Records the active node gave up: window full, never acknowledged, or the sync queue full.", c.records_given_up);
    o.counter("cluster_sync_retransmits_total", "Sync messages sent again for want of an acknowledgement.", c.retransmits);
    o.counter("cluster_sync_records_received_total", "Records the standby took, in order.", c.records_received);
    o.counter("cluster_sync_records_lost_total", "Records the active node sent that the standby never got (exact).", c.records_lost);
    o.counter("cluster_sync_records_installed_total", "Records the standby installed into its tables.", c.records_installed);
    o.counter("cluster_sync_records_refused_total", "Records the standby's engine refused (conflict, pool mismatch, tables full).", c.records_refused);
    o.counter("cluster_sync_datagrams_refused_total", "Datagrams on the sync port refused: not from the partner, or malformed.", c.datagrams_refused);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet, HashSet};

    fn sample_text(format: Format) -> String {
        let mut w = WorkerSnapshot::default();
        w.stats.drops.count(DropReason::NoMapping);
        w.sessions_by_proto = [3, 2, 1, 4];
        w.busy_ns = 1_500_000_000;
        render(&[w.clone(), w], &IoSnapshot::default(), (5, 7), None, format)
    }

    /// A strict reading of the text: every sample belongs to the family
    /// declared just before it (OpenMetrics: family name plus `_total` for
    /// counters), each family is declared once with HELP then TYPE, values
    /// parse, label values are quoted. Returns sample name -> label sets.
    fn parse(text: &str, format: Format) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
        let mut declared = HashSet::new();
        let mut current: Option<(String, String)> = None;
        let mut samples: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
        let lines: Vec<&str> = text.lines().collect();
        match format {
            Format::OpenMetrics => assert_eq!(lines.last(), Some(&"# EOF"), "OpenMetrics text must end with # EOF"),
            Format::Prometheus => assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "0.0.4 text has no EOF or UNIT lines"),
        }
        assert!(text.ends_with('\n'));
        let mut help_for = None;
        for line in &lines {
            if *line == "# EOF" {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!rest.contains('\\') && !rest.contains('"'), "{line}");
                help_for = Some(name.to_owned());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(help_for.as_deref(), Some(name), "HELP then TYPE: {line}");
                assert!(declared.insert(name.to_owned()), "declared twice: {line}");
                assert!(kind == "counter" || kind == "gauge", "{line}");
                current = Some((name.to_owned(), kind.to_owned()));
            } else if let Some(rest) = line.strip_prefix("# UNIT ") {
                let (name, unit) = rest.split_once(' ').unwrap();
                assert_eq!(current.as_ref().map(|c| c.0.as_str()), Some(name), "{line}");
                assert!(name.ends_with(&format!("_{unit}")), "{line}");
            } else {
                assert!(!line.starts_with('#'), "unexpected comment: {line}");
                let (series, value) = line.rsplit_once(' ').unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line}");
                let (name, labels) = match series.split_once('{') {
                    Some((n, l)) => (n, l.strip_suffix('}').expect("closing brace")),
                    None => (series, ""),
                };
                let (family, kind) = current.as_ref().expect("sample before any TYPE");
                let expected = if kind == "counter" && format == Format::OpenMetrics { format!("{family}_total") } else { family.clone() };
                assert_eq!(name, expected, "sample outside its family: {line}");
                assert!(name.starts_with("natrix_"), "{line}");
                assert!(kind == "counter" && name.ends_with("_total") || kind == "gauge" && (!name.ends_with("_total") || name == "natrix_pool_ports_total"), "{line}");
                let mut set = BTreeMap::new();
                for pair in labels.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap();
                    let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).expect("quoted label value");
                    assert!(set.insert(k.to_owned(), v.to_owned()).is_none(), "{line}");
                }
                samples.entry(name.to_owned()).or_default().push(set);
            }
        }
        samples
    }

    #[test]
    fn both_formats_are_well_formed_and_carry_the_same_samples() {
        let om = sample_text(Format::OpenMetrics);
        let prom = sample_text(Format::Prometheus);
        let a = parse(&om, Format::OpenMetrics);
        let b = parse(&prom, Format::Prometheus);
        assert_eq!(a, b);
        for text in [&om, &prom] {
            assert!(text.contains("natrix_drops_total{reason=\"no_mapping\"} 2\n"), "{text}");
            assert!(text.contains("natrix_sessions{protocol=\"tcp\"} 6\n"));
            assert!(text.contains("natrix_log_records_lost_total 7\n"));
            assert!(text.contains("natrix_log_records_total 5\n"));
            assert!(text.contains("natrix_worker_busy_seconds_total{worker=\"1\"} 1.5\n"));
            assert!(text.contains("natrix_rx_bytes_total{interface=\"outside\"} 0\n"));
        }
        assert!(om.contains("# TYPE natrix_rx_bytes counter\n# UNIT natrix_rx_bytes bytes\n"), "{om}");
        assert!(prom.contains("# TYPE natrix_rx_bytes_total counter\n"), "{prom}");
    }

    /// Every name and label README lists, exactly.
    #[test]
    fn cluster_families_appear_only_on_a_cluster_node_and_are_well_formed() {
        assert!(!sample_text(Format::Prometheus).contains("natrix_cluster_"));
        let status = ClusterStatus { role: "standby", records_lost: 3, lag_records: 9, role_changes: 1, ..ClusterStatus::default() };
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let text = render(&[WorkerSnapshot::default()], &IoSnapshot::default(), (0, 0), Some(&status), format);
            let samples = parse(&text, format);
            assert_eq!(samples["natrix_cluster_role"].len(), 2);
            assert!(text.contains("natrix_cluster_role{role=\"standby\"} 1\n"), "{text}");
            assert!(text.contains("natrix_cluster_role{role=\"active\"} 0\n"));
            assert!(text.contains("natrix_cluster_sync_records_lost_total 3\n"));
            assert!(text.contains("natrix_cluster_sync_lag_records 9\n"));
            assert!(text.contains("natrix_cluster_role_changes_total 1\n"));
        }
    }

    #[test]
    fn the_documented_families_and_labels_are_exported() {
        let samples = parse(&sample_text(Format::Prometheus), Format::Prometheus);
        let labels = |name: &str| -> BTreeSet<String> {
            samples.get(&format!("natrix_{name}")).unwrap_or_else(|| panic!("natrix_{name} missing")).iter().flat_map(|s| s.keys().cloned()).collect()
        };
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        for name in [
            "rx_packets_total",
            "rx_bytes_total",
            "tx_packets_total",
            "tx_bytes_total",
            "tx_dropped_total",
            "rx_refused_total",
            "rx_checksums_completed_total",
            "rx_kernel_dropped_total",
            "translated_packets_total",
            "generated_packets_total",
            "nptv6_translated_packets_total",
        ] {
            assert_eq!(labels(name), set(&["interface"]), "{name}");
        }
        assert_eq!(labels("drops_total"), set(&["reason"]));
        assert_eq!(labels("sessions"), set(&["protocol"]));
        assert_eq!(labels("mappings"), set(&["protocol"]));
        assert_eq!(labels("subscribers_port_use"), set(&["at_least"]));
        let at_least: BTreeSet<String> = samples["natrix_subscribers_port_use"].iter().map(|s| s["at_least"].clone()).collect();
        assert_eq!(at_least, set(&["0.5", "0.8", "0.9", "1"]));
        assert_eq!(labels("worker_packets_total"), set(&["worker"]));
        assert_eq!(labels("io_system_calls_total"), set(&["call"]));
        assert_eq!(labels("worker_busy_seconds_total"), set(&["worker"]));
        assert_eq!(labels("worker_received_frames_total"), set(&["worker"]));
        assert_eq!(labels("pcp_requests_total"), set(&["result"]));
        for name in [
            "sessions_created_total",
            "mappings_created_total",
            "subscribers",
            "pool_ports_in_use",
            "pool_ports_total",
            "pcp_requests_ignored_total",
            "log_records_total",
            "log_records_lost_total",
            "handoff_dropped_total",
            "arp_replies_sent_total",
            "arp_requests_sent_total",
            "nd_adverts_sent_total",
            "nd_solicits_sent_total",
            "next_hop_unresolved_total",
            "no_route_total",
            "not_for_us_total",
            "not_ipv4_total",
            "memory_bytes",
        ] {
            assert_eq!(labels(name), BTreeSet::new(), "{name}");
        }
    }

    #[test]
    fn accept_header_picks_the_format() {
        assert_eq!(Format::from_accept(None), Format::Prometheus);
        assert_eq!(Format::from_accept(Some("*/*")), Format::Prometheus);
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
        assert!(Format::OpenMetrics.content_type().starts_with("application/openmetrics-text; version=1.0.0"));
        assert!(Format::Prometheus.content_type().starts_with("text/plain; version=0.0.4"));
    }
}
