//! Prometheus text exposition (format 0.0.4) of a running dataplane.

use std::fmt::Write;

use natrix_dataplane::{IoSnapshot, WorkerSnapshot, PORT_USE_THRESHOLDS};
use natrix_engine::{DropReason, Proto, Side};

const SIDES: [Side; 2] = [Side::Inside, Side::Outside];

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP natrix_{name} {help}\n# TYPE natrix_{name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: u64) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "natrix_{name} {value}");
        } else {
            let _ = writeln!(self.0, "natrix_{name}{{{labels}}} {value}");
        }
    }

    fn sample_f64(&mut self, name: &str, labels: &str, value: f64) {
        let _ = writeln!(self.0, "natrix_{name}{{{labels}}} {value}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: u64) {
        self.family(name, kind, help);
        self.sample(name, "", value);
    }

    fn per_side(&mut self, name: &str, help: &str, values: [u64; 2]) {
        self.family(name, "counter", help);
        for side in SIDES {
            self.sample(name, &format!("interface=\"{}\"", side.name()), values[side as usize]);
        }
    }
}

fn sum(workers: &[WorkerSnapshot], f: impl Fn(&WorkerSnapshot) -> u64) -> u64 {
    workers.iter().map(f).sum()
}

/// `(log_recorded, log_lost)`: records the logger handed to its sinks, and
/// those the sinks dropped (collector down, file unwritable), which add to
/// those the workers could not hand to the logger.
pub fn render(workers: &[WorkerSnapshot], io: &IoSnapshot, (log_recorded, log_lost): (u64, u64)) -> String {
    let mut o = Out(String::with_capacity(8192));
    o.per_side("rx_packets_total", "Frames received on each interface.", io.rx_frames);
    o.per_side("rx_bytes_total", "Bytes received on each interface.", io.rx_bytes);
    o.per_side("rx_kernel_dropped_total", "Frames the kernel dropped because natrix's receive ring was full (natrix fell behind).", io.rx_kernel_dropped);
    o.per_side("tx_packets_total", "Frames sent on each interface.", io.tx_frames);
    o.per_side("tx_bytes_total", "Bytes sent on each interface.", io.tx_bytes);
    o.per_side("tx_dropped_total", "Frames lost because the interface's transmit queue was full.", io.tx_dropped);
    o.per_side("rx_refused_total", "Frames refused on receive: a partial checksum left by a sender's offload, or a VLAN tag.", io.rx_refused);
    o.per_side("translated_packets_total", "Frames the NAT forwarded, by the interface they left on.", [0, 1].map(|i| sum(workers, |w| w.stats.forwarded[i])));
    o.per_side("generated_packets_total", "Frames natrix generated (ICMP errors), by the interface they left on.", [0, 1].map(|i| sum(workers, |w| w.stats.generated[i])));
    o.family("drops_total", "counter", "Frames the NAT dropped, by reason.");
    for &r in DropReason::ALL {
        o.sample("drops_total", &format!("reason=\"{}\"", r.name()), sum(workers, |w| w.stats.drops.get(r)));
    }
    o.family("sessions", "gauge", "Sessions in the table, by protocol.");
    for p in Proto::ALL {
        o.sample("sessions", &format!("protocol=\"{}\"", p.name()), sum(workers, |w| u64::from(w.sessions_by_proto[p as usize])));
    }
    o.family("mappings", "gauge", "Mappings (external address and port bindings), by protocol.");
    for p in Proto::ALL {
        o.sample("mappings", &format!("protocol=\"{}\"", p.name()), sum(workers, |w| u64::from(w.mappings_by_proto[p as usize])));
    }
    o.one("sessions_created_total", "counter", "Sessions created.", sum(workers, |w| w.stats.sessions_created));
    o.one("mappings_created_total", "counter", "Mappings created.", sum(workers, |w| w.stats.mappings_created));
    o.one("subscribers", "gauge", "Subscribers holding state.", sum(workers, |w| w.subscribers));
    o.one("pool_ports_in_use", "gauge", "External ports held by mappings or blocks.", sum(workers, |w| w.ports_in_use));
    // Each worker's allocator covers its slice of every address; together they are the pool.
    o.one("pool_ports_total", "gauge", "External ports in the pool (addresses x protocols x port range).", sum(workers, |w| w.total_ports));
    o.family("subscribers_port_use", "gauge", "Subscribers whose external port use is at least this share of max_ports_per_subscriber.");
    for (i, t) in PORT_USE_THRESHOLDS.iter().enumerate() {
        o.sample("subscribers_port_use", &format!("at_least=\"{t}\""), sum(workers, |w| w.port_use_over[i]));
    }
    o.one("memory_bytes", "gauge", "Bytes held by tables, allocator and subscriber state.", sum(workers, |w| w.memory_bytes));
    o.one(
        "log_records_lost_total",
        "counter",
        "NAT event records dropped: logger behind, collector unreachable or log file unwritable.",
        sum(workers, |w| w.events_lost) + log_lost,
    );
    o.one("log_records_total", "counter", "NAT event records handed to the configured log sinks (JSON, IPFIX, syslog).", log_recorded);
    o.one("handoff_dropped_total", "counter", "Frames dropped because a ring between threads was full.", io.handoff_dropped + sum(workers, |w| w.handoff_dropped));
    o.family("worker_packets_total", "counter", "Frames each worker processed.");
    for (i, w) in workers.iter().enumerate() {
        o.sample("worker_packets_total", &format!("worker=\"{i}\""), w.stats.received.iter().sum());
    }
    o.family("worker_busy_seconds_total", "counter", "Time each worker spent processing frames; its rate is the worker's load (1 = fully busy).");
    for (i, w) in workers.iter().enumerate() {
        o.sample_f64("worker_busy_seconds_total", &format!("worker=\"{i}\""), w.busy_ns as f64 / 1e9);
    }
    o.family("pcp_requests_total", "counter", "PCP requests answered, by result code (RFC 6887 section 7.4).");
    for code in 0..16u8 {
        let n = sum(workers, |w| w.pcp.results[usize::from(code)]);
        if n > 0 || code == 0 {
            o.sample("pcp_requests_total", &format!("result=\"{}\"", natrix_wire::pcp::result::name(code)), n);
        }
    }
    o.one("pcp_requests_ignored_total", "counter", "PCP datagrams not answered (too short, bad checksum, over the rate limit).", sum(workers, |w| w.pcp.ignored));
    let g = &io.gateway;
    o.one("arp_replies_sent_total", "counter", "ARP replies natrix sent for its addresses.", g.arp_replies_sent);
    o.one("arp_requests_sent_total", "counter", "ARP requests natrix sent to find next hops.", g.arp_requests_sent);
    o.one("next_hop_unresolved_total", "counter", "Frames dropped because their next hop did not answer ARP.", g.unresolved);
    o.one("no_route_total", "counter", "Frames with no next hop (off-link inside, or no outside gateway).", g.no_route);
    o.one("not_for_us_total", "counter", "Unicast frames for another host's MAC address.", g.not_for_us);
    o.one("not_ipv4_total", "counter", "Frames that are neither IPv4 nor ARP.", g.not_ipv4);
    o.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_declared_once_and_samples_parse() {
        let mut w = WorkerSnapshot::default();
        w.stats.drops.count(DropReason::NoMapping);
        w.sessions_by_proto = [3, 2, 1];
        let text = render(&[w.clone(), w], &IoSnapshot::default(), (5, 7));
        let mut families = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                assert!(families.insert(rest.split(' ').next().unwrap().to_owned()), "{line}");
            } else if !line.starts_with('#') {
                let (name, value) = line.rsplit_once(' ').unwrap();
                assert!(value.parse::<f64>().is_ok(), "{line}");
                let family = name.split('{').next().unwrap();
                assert!(families.contains(family), "sample before its TYPE: {line}");
            }
        }
        assert!(text.contains("natrix_drops_total{reason=\"no_mapping\"} 2"));
        assert!(text.contains("natrix_sessions{protocol=\"tcp\"} 6"));
        assert!(text.contains("natrix_log_records_lost_total 7"));
        assert!(text.contains("natrix_log_records_total 5"));
    }
}
