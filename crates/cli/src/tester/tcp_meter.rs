//! What a TCP run cost the device and the lab: every CPU's busy time and
//! the frames the device sent into the lab, sampled while iperf3 runs.
//! Over the intervals that carried the transfer (not its connect, not its
//! end), the device's CPU time per frame, and whether the lab's CPUs
//! rather than the device's set the rate.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::cputime::{each_cpu_busy_ns, EachCpu};
use super::lab::SwitchCounters;

const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// An interval carried the transfer where it forwarded frames at least at
/// this share of the busiest interval's rate.
const CARRIED: f64 = 0.5;
/// A lab CPU this busy was the limit...
const LAB_FULL: f64 = 0.95;
/// ...unless a device CPU was this busy too.
const DEVICE_FULL: f64 = 0.90;

/// Every CPU's busy time and the frames the device has sent, at one moment.
pub struct Reading {
    cpus: EachCpu,
    frames: u64,
}

/// Samples in a thread of its own (on the tester's CPU) until `finish`.
pub struct Meter {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Reading>>,
}

impl Meter {
    /// None where nx-sw's counters cannot be read.
    pub fn start() -> Option<Meter> {
        let mut counters = SwitchCounters::open()?;
        let stop = Arc::new(AtomicBool::new(false));
        let told = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tcp-meter".into())
            .spawn(move || {
                let mut readings = Vec::new();
                loop {
                    if let Some(r) = each_cpu_busy_ns().zip(counters.device_frames()) {
                        readings.push(Reading { cpus: r.0, frames: r.1 });
                    }
                    if told.load(Relaxed) {
                        return readings;
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
            .ok()?;
        Some(Meter { stop, thread })
    }

    /// The shares over the run, with the device on `device_cpus`.
    pub fn finish(self, device_cpus: &[usize]) -> Option<CpuShares> {
        self.stop.store(true, Relaxed);
        CpuShares::over(&self.thread.join().ok()?, device_cpus)
    }
}

/// Where the CPU time of a TCP run went, over the intervals that carried it.
#[derive(Debug, PartialEq)]
pub struct CpuShares {
    /// Frames the device forwarded, data and ACKs.
    pub frames: u64,
    /// The device's CPUs' busy time per frame: the same count for natrix
    /// and the kernel, whatever ran there on their behalf.
    pub dut_ns_per_frame: f64,
    /// The device's CPUs' busy share, on average and the busiest one's.
    pub dut_busy: f64,
    pub dut_busy_max: f64,
    /// The busiest of the other CPUs, and its share.
    pub lab_busy: f64,
    pub lab_cpu: usize,
}

/// One interval between readings: its length, frames, and each CPU's
/// busy time (None for one offline at either end).
struct Interval {
    ns: u64,
    frames: u64,
    busy: Vec<Option<u64>>,
}

impl Interval {
    fn between(a: &Reading, b: &Reading) -> Option<Interval> {
        let ns = b.cpus.at_ns.checked_sub(a.cpus.at_ns).filter(|&ns| ns > 0)?;
        let busy = a.cpus.busy.iter().zip(&b.cpus.busy).map(|(a, b)| Some(b.as_ref()?.saturating_sub(*a.as_ref()?))).collect();
        Some(Interval { ns, frames: b.frames.saturating_sub(a.frames), busy })
    }

    fn rate(&self) -> f64 {
        self.frames as f64 / self.ns as f64
    }
}

impl CpuShares {
    /// None where the device has no CPUs of its own, or forwarded nothing.
    pub fn over(readings: &[Reading], device_cpus: &[usize]) -> Option<CpuShares> {
        if device_cpus.is_empty() {
            return None;
        }
        let intervals: Vec<Interval> = readings.windows(2).filter_map(|w| Interval::between(&w[0], &w[1])).collect();
        let peak = intervals.iter().map(Interval::rate).fold(0.0, f64::max);
        let carried: Vec<&Interval> = intervals.iter().filter(|i| i.frames > 0 && i.rate() >= CARRIED * peak).collect();
        let (ns, frames) = carried.iter().fold((0, 0), |(ns, frames), i| (ns + i.ns, frames + i.frames));
        if frames == 0 {
            return None;
        }
        let cpus = carried.iter().map(|i| i.busy.len()).min()?;
        let busy = |cpu: usize| carried.iter().map(|i| i.busy.get(cpu).copied().flatten()).sum::<Option<u64>>().map(|b| b as f64);
        let share = |busy: f64| busy / ns as f64;
        let dut: Vec<f64> = device_cpus.iter().map(|&c| busy(c)).collect::<Option<_>>()?;
        let (lab_cpu, lab_ns) = (0..cpus).filter(|c| !device_cpus.contains(c)).filter_map(|c| Some((c, busy(c)?))).max_by(|a, b| a.1.total_cmp(&b.1))?;
        let dut_ns: f64 = dut.iter().sum();
        Some(CpuShares {
            frames,
            dut_ns_per_frame: dut_ns / frames as f64,
            dut_busy: share(dut_ns) / dut.len() as f64,
            dut_busy_max: dut.iter().copied().map(share).fold(0.0, f64::max),
            lab_busy: share(lab_ns),
            lab_cpu,
        })
    }

    /// A lab CPU was full while no device CPU was.
    pub fn lab_was_the_limit(&self) -> bool {
        self.lab_busy >= LAB_FULL && self.dut_busy_max < DEVICE_FULL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn reading(at_ns: u64, busy: &[u64], frames: u64) -> Reading {
        Reading { cpus: EachCpu { at_ns, busy: busy.iter().map(|&b| Some(b)).collect() }, frames }
    }

    #[test]
    fn a_full_lab_cpu_beside_a_half_idle_device_is_the_lab_limit() {
        // One second; the device on CPU 1, 500 ms busy for 1,000 frames;
        // the lab's CPU 0 99% busy.
        let r = [reading(S, &[0, 0, 0], 10), reading(2 * S, &[990_000_000, 500_000_000, 100_000_000], 1_010)];
        let c = CpuShares::over(&r, &[1]).unwrap();
        assert_eq!(c, CpuShares { frames: 1_000, dut_ns_per_frame: 500_000.0, dut_busy: 0.5, dut_busy_max: 0.5, lab_busy: 0.99, lab_cpu: 0 });
        assert!(c.lab_was_the_limit());
    }

    #[test]
    fn one_full_device_cpu_is_a_device_limit_whatever_the_others_and_the_lab() {
        // Two device CPUs: one full, one idle (one TCP flow is one queue).
        let r = [reading(0, &[0, 0, 0, 0], 0), reading(S, &[200_000_000, 950_000_000, 0, 1_000_000_000], 100)];
        let c = CpuShares::over(&r, &[1, 2]).unwrap();
        assert_eq!((c.dut_busy, c.dut_busy_max, c.lab_busy, c.lab_cpu), (0.475, 0.95, 1.0, 3));
        assert!(!c.lab_was_the_limit());
        // A lab with room is no limit either.
        let r = [reading(0, &[0, 0, 0, 0], 0), reading(S, &[200_000_000, 400_000_000, 400_000_000, 600_000_000], 100)];
        assert!(!CpuShares::over(&r, &[1, 2]).unwrap().lab_was_the_limit());
    }

    #[test]
    fn only_the_intervals_that_carried_the_transfer_count() {
        // A quiet connect (10 frames), a second at 1,000 frames with the
        // lab full, a quiet end: the quiet quarter-seconds are left out.
        let q = S / 4;
        let r = [
            reading(0, &[0, 0], 0),
            reading(q, &[50_000_000, 10_000_000], 10),
            reading(q + S, &[50_000_000 + S, 610_000_000], 1_010),
            reading(2 * q + S, &[100_000_000 + S, 620_000_000], 1_015),
        ];
        let c = CpuShares::over(&r, &[1]).unwrap();
        assert_eq!((c.frames, c.lab_busy, c.dut_busy), (1_000, 1.0, 0.6));
        assert!(c.lab_was_the_limit());
    }

    #[test]
    fn no_shares_without_device_cpus_frames_or_time() {
        let before = reading(0, &[0, 0], 0);
        assert_eq!(CpuShares::over(&[reading(0, &[0, 0], 0), reading(S, &[1, 1], 5)], &[]), None);
        assert_eq!(CpuShares::over(&[reading(0, &[0, 0], 0), reading(S, &[1, 1], 0)], &[1]), None);
        assert_eq!(CpuShares::over(&[reading(0, &[0, 0], 0), reading(0, &[1, 1], 5)], &[1]), None);
        assert_eq!(CpuShares::over(&[before], &[1]), None);
        // A device CPU the host does not have, or has offline.
        assert_eq!(CpuShares::over(&[reading(0, &[0, 0], 0), reading(S, &[1, 1], 5)], &[7]), None);
        let offline = Reading { cpus: EachCpu { at_ns: S, busy: vec![Some(1), None] }, frames: 5 };
        assert_eq!(CpuShares::over(&[reading(0, &[0, 0], 0), offline], &[1]), None);
    }
}
