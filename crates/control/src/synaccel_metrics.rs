//! The SYN accelerator's metrics (CONTRACTS.md "SYN accelerator"), summed
//! over the workers that run it: `natrix_synaccel_syns_total`,
//! `_retransmits_total`, `_answered_total`, `_resets_total`, the
//! handshake-time histogram `natrix_synaccel_handshake_seconds`, the
//! handshake time learned per destination
//! (`natrix_synaccel_learned_handshake_seconds{destination}`), attempts
//! pending and first SYNs left untracked. Exported only where
//! `[syn_accel]` is configured.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use natrix_dataplane::WorkerSnapshot;
use natrix_engine::syn_accel::{SynAccelStats, HANDSHAKE_BUCKETS_S};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// Every worker's accelerator counters together.
#[derive(Debug)]
pub struct SynAccelFamilies {
    total: SynAccelStats,
}

/// The families, or None when no worker runs the accelerator.
pub fn collector(workers: &[WorkerSnapshot]) -> Option<SynAccelFamilies> {
    let all: Vec<&SynAccelStats> = workers.iter().filter_map(|w| w.stats.syn_accel.as_ref()).collect();
    (!all.is_empty()).then(|| SynAccelFamilies { total: merge(&all) })
}

fn merge(all: &[&SynAccelStats]) -> SynAccelStats {
    let mut t = SynAccelStats::default();
    // Per destination: the mean of the workers' learned times, weighted by their samples.
    let mut learned: BTreeMap<u32, (u128, u64)> = BTreeMap::new();
    for s in all {
        t.syns += s.syns;
        t.retransmits += s.retransmits;
        t.answered += s.answered;
        t.resets += s.resets;
        t.untracked += s.untracked;
        t.pending += s.pending;
        t.handshake.merge(&s.handshake);
        for l in &s.learned {
            let e = learned.entry(l.destination).or_default();
            e.0 += u128::from(l.handshake_ns) * u128::from(l.samples);
            e.1 += u64::from(l.samples);
        }
    }
    t.learned = learned
        .into_iter()
        .map(|(destination, (weighted, samples))| natrix_engine::syn_accel::LearnedHandshake {
            destination,
            handshake_ns: (weighted / u128::from(samples.max(1))) as u64,
            samples: samples.min(u64::from(u32::MAX)) as u32,
        })
        .collect();
    t
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    ConstCounter::new(v).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl Collector for SynAccelFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let t = &self.total;
        counter(&mut encoder, "synaccel_syns", "Callers' first SYNs the SYN accelerator tracked.", t.syns)?;
        counter(&mut encoder, "synaccel_retransmits", "SYNs the SYN accelerator sent again (byte copies of the caller's first).", t.retransmits)?;
        counter(&mut encoder, "synaccel_answered", "Tracked attempts ended by an answer before the deadline (SYN-ACK, RST, simultaneous open, ICMP error).", t.answered)?;
        counter(&mut encoder, "synaccel_resets", "RSTs the SYN accelerator sent to callers at the deadline.", t.resets)?;
        counter(&mut encoder, "synaccel_untracked", "First SYNs to accelerated destinations passed on untracked (table full, or a SYN with data too long to keep).", t.untracked)?;
        ConstGauge::new(t.pending as i64).encode(encoder.encode_descriptor(
            "synaccel_pending",
            "Connection attempts the SYN accelerator is tracking.",
            None,
            MetricType::Gauge,
        )?)?;
        let h = &t.handshake;
        let buckets: Vec<(f64, u64)> = HANDSHAKE_BUCKETS_S.iter().copied().chain([f64::INFINITY]).zip(h.buckets).collect();
        let mut m =
            encoder.encode_descriptor("synaccel_handshake", "Time from a caller's first SYN to the server's SYN-ACK or RST.", Some(&Unit::Seconds), MetricType::Histogram)?;
        m.encode_histogram::<NoLabelSet>(h.sum_ns as f64 / 1e9, h.count, &buckets, None)?;
        let mut m = encoder.encode_descriptor(
            "synaccel_learned_handshake",
            "Handshake time learned per destination (smoothed; its interval is 1.5 times this with interval = \"rtt\").",
            Some(&Unit::Seconds),
            MetricType::Gauge,
        )?;
        for l in &t.learned {
            let labels = [("destination", Ipv4Addr::from(l.destination).to_string())];
            ConstGauge::new(l.handshake_ns as f64 / 1e9).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{render, Format};
    use natrix_dataplane::IoSnapshot;
    use natrix_engine::syn_accel::LearnedHandshake;

    fn worker(destination_ns: u64) -> WorkerSnapshot {
        let mut w = WorkerSnapshot::default();
        let mut s = SynAccelStats { syns: 5, retransmits: 6, answered: 2, resets: 3, untracked: 1, pending: 4, ..SynAccelStats::default() };
        s.handshake.buckets[6] = 2;
        s.handshake.sum_ns = 150_000_000;
        s.handshake.count = 2;
        s.learned = vec![LearnedHandshake { destination: 0xc633_6407, handshake_ns: destination_ns, samples: 1 }];
        w.stats.syn_accel = Some(s);
        w
    }

    #[test]
    fn the_contract_names_summed_over_workers_in_both_formats() {
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let text = render(&[worker(100_000_000), worker(200_000_000), WorkerSnapshot::default()], &IoSnapshot::default(), (0, 0), None, format);
            for line in [
                "natrix_synaccel_syns_total 10",
                "natrix_synaccel_retransmits_total 12",
                "natrix_synaccel_answered_total 4",
                "natrix_synaccel_resets_total 6",
                "natrix_synaccel_pending 8",
                "natrix_synaccel_handshake_seconds_bucket{le=\"0.1\"} 4",
                "natrix_synaccel_handshake_seconds_count 4",
                "natrix_synaccel_handshake_seconds_sum 0.3",
                "natrix_synaccel_learned_handshake_seconds{destination=\"198.51.100.7\"} 0.15",
            ] {
                assert!(text.lines().any(|l| l == line), "{format:?}: no line {line:?} in\n{text}");
            }
            assert!(text.contains("# TYPE natrix_synaccel_handshake_seconds histogram"), "{text}");
        }
    }

    #[test]
    fn nothing_is_exported_without_the_accelerator() {
        let text = render(&[WorkerSnapshot::default()], &IoSnapshot::default(), (0, 0), None, Format::Prometheus);
        assert!(!text.contains("synaccel"));
    }
}
