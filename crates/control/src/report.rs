//! The replay report: what went in, what came out, why things were dropped,
//! and how much of the pool and of each subscriber's quota was used.

use std::collections::{BTreeMap, HashMap};

use natrix_engine::{Engine, Event, EventKind, Side};
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
}

impl ReportBuilder {
    pub fn on_event(&mut self, e: &Event) {
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
        }
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
