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

const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// An interval carried the transfer where it forwarded frames at least at
/// this share of the busiest interval's rate; the first and last such
/// are left out where others remain, since the transfer began or ended
/// somewhere inside them.
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

/// Samples in a thread of its own (on the tester's CPU) until `finish`,
/// or until dropped (a run that failed).
pub struct Meter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Reading>>>,
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
        Some(Meter { stop, thread: Some(thread) })
    }

    /// The shares over the run, with the device on `device_cpus`.
    pub fn finish(mut self, device_cpus: &[usize]) -> Option<CpuShares> {
        self.stop.store(true, Relaxed);
        CpuShares::over(&self.thread.take()?.join().ok()?, device_cpus)
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// Where the CPU time of a TCP run went, over the intervals that carried it.
#[derive(Debug, PartialEq)]
pub struct CpuShares {
    /// How long those intervals were together, and the frames the device
    /// forwarded in them, data and ACKs.
    pub ns: u64,
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
        let mut carried: Vec<&Interval> = intervals.iter().filter(|i| i.frames > 0 && i.rate() >= CARRIED * peak).collect();
        if carried.len() > 2 {
            carried = carried[1..carried.len() - 1].to_vec();
        }
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
            ns,
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
        assert_eq!(c, CpuShares { ns: S, frames: 1_000, dut_ns_per_frame: 500_000.0, dut_busy: 0.5, dut_busy_max: 0.5, lab_busy: 0.99, lab_cpu: 0 });
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

    /// Readings from 0 of intervals (length ns, frames, busy ns per CPU).
    fn run(intervals: &[(u64, u64, [u64; 2])]) -> Vec<Reading> {
        let mut r = vec![reading(0, &[0, 0], 0)];
        for &(ns, frames, busy) in intervals {
            let last = r.last().unwrap();
            let was: Vec<u64> = last.cpus.busy.iter().map(|b| b.unwrap()).collect();
            r.push(reading(last.cpus.at_ns + ns, &[was[0] + busy[0], was[1] + busy[1]], last.frames + frames));
        }
        r
    }

    #[test]
    fn only_the_intervals_that_carried_the_transfer_count() {
        let q = S / 4;
        // A quiet connect, a partial first interval (half the peak rate: a
        // carried one, but an edge), three that carried it, of different
        // lengths and loads, a dip to 0.45 of the peak, a partial last one.
        let r = run(&[
            (q, 10, [q / 10, q / 100]),
            (q, 500, [q / 2, q / 4]),
            (q, 1_000, [q, q / 2]),
            (S, 2_200, [S, 3 * S / 5]),
            (q, 550, [q, q / 5]),
            (q, 450, [q / 2, q / 2]),
            (q, 1_000, [q, q]),
            (q, 600, [q / 2, q / 4]),
        ]);
        let c = CpuShares::over(&r, &[1]).unwrap();
        // Kept: the 1,000 in q, 2,200 in S, 550 in q, 1,000 in q (the dip
        // below half the peak of 4,000/s, and both edges, left out).
        let ns = 3 * q + S;
        assert_eq!((c.ns, c.frames), (ns, 4_750));
        assert_eq!(c.lab_busy, 1.0);
        let dut = (q / 2 + 3 * S / 5 + q / 5 + q) as f64;
        assert!((c.dut_busy - dut / ns as f64).abs() < 1e-12, "{c:?}");
        assert!((c.dut_ns_per_frame - dut / 4_750.0).abs() < 1e-9, "{c:?}");
        assert!(c.lab_was_the_limit());
    }

    #[test]
    fn a_lab_cpu_offline_at_a_reading_is_left_out_not_the_run() {
        let mut r = vec![reading(0, &[0, 0, 0], 0), reading(S, &[S, S / 2, S / 10], 1_000)];
        r[1].cpus.busy[2] = None;
        let c = CpuShares::over(&r, &[1]).unwrap();
        assert_eq!((c.lab_cpu, c.lab_busy, c.dut_busy), (0, 1.0, 0.5));
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
