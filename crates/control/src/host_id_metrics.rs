//! HOST_ID's metrics (CONTRACTS.md "HOST_ID TCP options"), summed over the
//! workers: `natrix_host_id_no_room_total` (the contract's counter),
//! `_injected_total`, `_corrected_total`, `_removed_total`,
//! `_malformed_total`, ACK mode's `_echoes_removed_total`,
//! `_acks_injected_total` and `_acks_untracked_total`, origin 3's
//! `_no_b4_total`, `log` events lost
//! (`_events_lost_total`), and what each rule decided
//! (`natrix_host_id_rule_matches_total{rule}`, the rule's index in
//! `[[host_id.rule]]`). Exported only where `[host_id]` is configured.

use natrix_dataplane::WorkerSnapshot;
use natrix_engine::host_id::HostIdStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

/// Every worker's HOST_ID counters together.
#[derive(Debug)]
pub struct HostIdFamilies {
    total: HostIdStats,
}

/// The families, or None when no worker runs HOST_ID.
pub fn collector(workers: &[WorkerSnapshot]) -> Option<HostIdFamilies> {
    let mut all = workers.iter().filter_map(|w| w.stats.host_id.as_ref()).peekable();
    all.peek()?;
    let mut total = HostIdStats::default();
    all.for_each(|s| total.merge(s));
    Some(HostIdFamilies { total })
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    ConstCounter::new(v).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl Collector for HostIdFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let t = &self.total;
        counter(&mut encoder, "host_id_no_room", "SYNs that passed without the HOST_ID options they lacked: they would not fit in 40 bytes of options.", t.no_room)?;
        counter(&mut encoder, "host_id_injected", "Segments natrix inserted HOST_ID options into.", t.injected)?;
        counter(&mut encoder, "host_id_corrected", "Enabled HOST_ID options a host sent with wrong content, corrected in place.", t.corrected)?;
        counter(&mut encoder, "host_id_removed", "HOST_ID options present but not enabled (or of the wrong length), overwritten with NOPs.", t.removed)?;
        counter(&mut encoder, "host_id_malformed", "Segments whose TCP options area is malformed: no HOST_ID option inserted.", t.malformed)?;
        counter(&mut encoder, "host_id_echoes_removed", "ACK mode: servers' echoes of HOST_ID_ENABLED removed from SYN-ACKs.", t.echoes_removed)?;
        counter(&mut encoder, "host_id_acks_injected", "ACK mode: clients' first ACKs HOST_ID_BOUCADAIR was written into.", t.acks_injected)?;
        counter(
            &mut encoder,
            "host_id_acks_untracked",
            "SYN-ACKs not remembered (table full), so their first ACK got no HOST_ID_BOUCADAIR and no rule looked at it; and refused connections not kept (refusals holding half the table).",
            t.acks_untracked,
        )?;
        counter(&mut encoder, "host_id_no_b4", "Segments from plain IPv4 subscribers written without HOST_ID_BOUCADAIR origin 3, which needs a DS-Lite B4.", t.no_b4)?;
        counter(&mut encoder, "host_id_events_lost", "HOST_ID log events dropped because their queue was full.", t.events_lost)?;
        let mut m = encoder.encode_descriptor("host_id_rule_matches", "Segments each [[host_id.rule]] decided, by the rule's index.", None, MetricType::Counter)?;
        for (i, &n) in t.rule_matches.iter().enumerate() {
            ConstCounter::new(n).encode(m.encode_family(&[("rule", i.to_string())])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{render, Format};
    use natrix_dataplane::IoSnapshot;

    fn worker(no_room: u64, rules: Vec<u64>) -> WorkerSnapshot {
        let mut w = WorkerSnapshot::default();
        w.stats.host_id = Some(HostIdStats { no_room, injected: 7, rule_matches: rules, ..HostIdStats::default() });
        w
    }

    #[test]
    fn the_contract_names_summed_over_workers() {
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let text = render(&[worker(2, vec![1, 0]), worker(3, vec![4, 5]), WorkerSnapshot::default()], &IoSnapshot::default(), (0, 0), None, format);
            for line in [
                "natrix_host_id_no_room_total 5",
                "natrix_host_id_injected_total 14",
                "natrix_host_id_rule_matches_total{rule=\"0\"} 5",
                "natrix_host_id_rule_matches_total{rule=\"1\"} 5",
            ] {
                assert!(text.lines().any(|l| l == line), "{format:?}: no line {line:?} in\n{text}");
            }
        }
    }

    #[test]
    fn nothing_is_exported_without_host_id() {
        let text = render(&[WorkerSnapshot::default()], &IoSnapshot::default(), (0, 0), None, Format::Prometheus);
        assert!(!text.contains("natrix_host_id_"), "{text}");
    }
}
