//! Statistics over measured delays, as RFC 8219 and seed 002 define them.
//!
//! - Typical latency is the median and worst-case latency the 99.9th
//!   percentile of the frames' latencies (RFC 8219 section 7.2).
//! - Packet delay variation is the 99.9th percentile of one-way delay less
//!   its minimum (RFC 8219 section 7.3, after RFC 5481's PDV form).
//! - Jitter, seed 002's "rolling window based estimator" (the one iperf
//!   reports), is RFC 3550 section 6.4.1's interarrival jitter: each
//!   frame's transit time differs from the previous one's by D, and
//!   J += (|D| - J) / 16.
//!
//! Percentiles are nearest-rank: the smallest value with at least p% of
//! the samples at or below it, so the 99.9th percentile is always a delay
//! some frame really had.

/// The nearest-rank `pct` percentile of ascending `sorted`; None if empty.
pub fn percentile(sorted: &[u32], pct: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    // In thousandths of a percent, in integers: 99.9% of 1000 samples is
    // rank 999 exactly, which floating point would make 999.0000000000001.
    let thousandths = (pct.clamp(0.0, 100.0) * 1000.0).round() as u64;
    let rank = (thousandths * sorted.len() as u64).div_ceil(100_000) as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of ascending `sorted`: the middle value, or the mean of the
/// two middle values.
pub fn median(sorted: &[u32]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(f64::from(sorted[n / 2])),
        _ => Some((f64::from(sorted[n / 2 - 1]) + f64::from(sorted[n / 2])) / 2.0),
    }
}

pub fn mean(values: &[u32]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    Some(values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64)
}

/// RFC 8219's packet delay variation of ascending one-way delays:
/// D(99.9th percentile) - D(min).
pub fn pdv(sorted: &[u32]) -> Option<u32> {
    Some(percentile(sorted, 99.9)? - *sorted.first()?)
}

/// RFC 3550's running interarrival jitter, fed one transit time at a time
/// in arrival order.
#[derive(Debug, Default, Clone, Copy)]
pub struct Jitter {
    last_transit: Option<i64>,
    j: f64,
}

impl Jitter {
    pub fn add(&mut self, transit_ns: i64) {
        if let Some(last) = self.last_transit {
            let d = (transit_ns - last).abs() as f64;
            self.j += (d - self.j) / 16.0;
        }
        self.last_transit = Some(transit_ns);
    }

    pub fn ns(&self) -> f64 {
        self.j
    }
}

/// Summary of a set of delays in nanoseconds, for reports.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    pub samples: usize,
    pub min_us: f64,
    pub median_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl Summary {
    /// Sorts `delays_ns` in place and summarises them; None if empty.
    pub fn of(delays_ns: &mut [u32]) -> Option<Summary> {
        delays_ns.sort_unstable();
        let us = |ns: u32| f64::from(ns) / 1e3;
        Some(Summary {
            samples: delays_ns.len(),
            min_us: us(*delays_ns.first()?),
            median_us: median(delays_ns)? / 1e3,
            p99_us: us(percentile(delays_ns, 99.0)?),
            p999_us: us(percentile(delays_ns, 99.9)?),
            max_us: us(*delays_ns.last()?),
            mean_us: mean(delays_ns)? / 1e3,
        })
    }
}

/// The points of an empirical cumulative distribution, thinned to at most
/// `points` (always keeping the minimum and the maximum), for plots.
pub fn cdf(sorted: &[u32], points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 || points < 2 {
        return Vec::new();
    }
    let step = (n as f64 / points as f64).max(1.0);
    let mut out = Vec::with_capacity(points + 1);
    let mut i = 0.0;
    while (i as usize) < n {
        let k = i as usize;
        out.push((f64::from(sorted[k]), (k + 1) as f64 / n as f64));
        i += step;
    }
    if out.last().is_some_and(|&(_, p)| p < 1.0) {
        out.push((f64::from(sorted[n - 1]), 1.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&v, 50.0), Some(500));
        assert_eq!(percentile(&v, 99.9), Some(999));
        assert_eq!(percentile(&v, 100.0), Some(1000));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.9), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
        // 10 samples: the 99.9th percentile is the largest.
        let ten: Vec<u32> = (1..=10).collect();
        assert_eq!(percentile(&ten, 99.9), Some(10));
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[1, 2, 9]), Some(2.0));
        assert_eq!(median(&[1, 2, 4, 9]), Some(3.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn pdv_is_the_999th_percentile_less_the_minimum() {
        // 10,000 frames at 100 us, and 5 (0.05%) late at 900 us: below the
        // 99.9th percentile, so PDV sees none of them; 20 (0.2%) late show.
        let mut d = vec![100_000u32; 9_995];
        d.extend([900_000; 5]);
        d.sort_unstable();
        assert_eq!(pdv(&d), Some(0));
        let mut d = vec![100_000u32; 9_980];
        d.extend([900_000; 20]);
        d.sort_unstable();
        assert_eq!(pdv(&d), Some(800_000));
        let mut d: Vec<u32> = vec![50_000, 70_000, 60_000];
        d.sort_unstable();
        assert_eq!(pdv(&d), Some(20_000));
    }

    #[test]
    fn jitter_follows_rfc_3550() {
        let mut j = Jitter::default();
        for t in [1000, 1000, 1000] {
            j.add(t);
        }
        assert_eq!(j.ns(), 0.0);
        // Alternating transit times 1000 apart: J approaches 1000.
        let mut j = Jitter::default();
        for i in 0..1000 {
            j.add(if i % 2 == 0 { 0 } else { 1000 });
        }
        assert!((j.ns() - 1000.0).abs() < 1.0, "{}", j.ns());
        // One step of 160 from zero: J = 160 / 16 = 10.
        let mut j = Jitter::default();
        j.add(0);
        j.add(160);
        assert_eq!(j.ns(), 10.0);
    }

    #[test]
    fn summary_of_known_delays() {
        let mut d: Vec<u32> = (1..=1000).map(|i| i * 1000).collect();
        d.reverse();
        let s = Summary::of(&mut d).unwrap();
        assert_eq!((s.samples, s.min_us, s.median_us, s.p999_us, s.max_us), (1000, 1.0, 500.5, 999.0, 1000.0));
        assert_eq!(Summary::of(&mut []), None);
    }

    #[test]
    fn a_cdf_ends_at_one_and_is_thinned() {
        let v: Vec<u32> = (1..=10_000).collect();
        let c = cdf(&v, 100);
        assert!(c.len() <= 102);
        assert_eq!(c.first(), Some(&(1.0, 0.0001)));
        assert_eq!(c.last(), Some(&(10_000.0, 1.0)));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    }
}
