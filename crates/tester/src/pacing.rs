//! When each frame is due. Frame k of a stream at rate r is due at
//! start + k/r, computed afresh for every k in integer nanoseconds, so no
//! error accumulates however long the stream runs. Seed 002 (section
//! 3.8.3.3) found bwping underfilling links by up to 9% because it added a
//! truncated integer interval frame after frame; computing each due time
//! from k keeps every frame within a nanosecond of its ideal time.

/// A frame rate, exact to a micro-frame per second (seed 002's ladder has
/// rates like 976.5625 frames/s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rate {
    micro_pps: u64,
}

impl Rate {
    pub fn pps(pps: f64) -> Rate {
        Rate { micro_pps: (pps * 1e6).round().max(1.0) as u64 }
    }

    /// The frame rate that loads a link with `mbps` megabits per second of
    /// `bytes`-byte frames (seed 002, table 3.2).
    pub fn from_mbps(mbps: f64, bytes: usize) -> Rate {
        Rate::pps(mbps * 1e6 / (bytes as f64 * 8.0))
    }

    pub fn as_pps(self) -> f64 {
        self.micro_pps as f64 / 1e6
    }

    /// Frames in `ns` nanoseconds at this rate (rounded down).
    pub fn frames_in(self, ns: u64) -> u64 {
        (u128::from(ns) * u128::from(self.micro_pps) / 1_000_000_000_000_000) as u64
    }
}

/// Due times of one stream: frames go out in bursts of `burst` (1: evenly
/// spaced); burst b is due at start + b * burst / rate.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    start_ns: u64,
    rate: Rate,
    burst: u64,
}

impl Schedule {
    pub fn new(start_ns: u64, rate: Rate, burst: u32) -> Schedule {
        Schedule { start_ns, rate, burst: u64::from(burst.max(1)) }
    }

    /// When frame `k` is due.
    pub fn due(&self, k: u64) -> u64 {
        let first_of_burst = k - k % self.burst;
        self.start_ns + (u128::from(first_of_burst) * 1_000_000_000_000_000 / u128::from(self.rate.micro_pps)) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 002's load ladder (table 3.2): every rate, for one minute,
    /// ends within a nanosecond of the ideal time.
    #[test]
    fn no_error_accumulates_over_seed_002s_ladder() {
        let ladder = [(128, 1.0), (128, 10.0), (128, 20.0), (128, 50.0), (128, 100.0), (1514, 10.0), (1514, 100.0), (1514, 200.0), (1514, 500.0), (1514, 1000.0)];
        for (bytes, mbps) in ladder {
            let rate = Rate::from_mbps(mbps, bytes);
            let s = Schedule::new(1_000, rate, 1);
            for k in [1u64, 1000, 1_000_000, rate.frames_in(60_000_000_000)] {
                let ideal = 1_000.0 + k as f64 * 1e9 / rate.as_pps();
                assert!((s.due(k) as f64 - ideal).abs() <= 1.0, "{bytes} B at {mbps} Mbit/s, frame {k}: {} vs {ideal}", s.due(k));
            }
        }
    }

    #[test]
    fn seed_002s_table_rates_come_out_exactly() {
        assert_eq!(Rate::from_mbps(1.0, 128).as_pps(), 976.5625);
        assert!((Rate::from_mbps(10.0, 1514).as_pps() - 825.627).abs() < 0.001);
        assert!((Rate::from_mbps(1000.0, 1514).as_pps() - 82_562.748).abs() < 0.001);
    }

    #[test]
    fn bursts_share_one_due_time_and_keep_the_mean_rate() {
        let s = Schedule::new(0, Rate::pps(1000.0), 10);
        assert_eq!(s.due(0), 0);
        assert_eq!(s.due(9), 0);
        assert_eq!(s.due(10), 10_000_000);
        assert_eq!(s.due(10_000), 10_000_000_000);
    }

    #[test]
    fn frames_in_a_duration() {
        assert_eq!(Rate::pps(976.5625).frames_in(1_000_000_000), 976);
        assert_eq!(Rate::pps(300_000.0).frames_in(2_000_000_000), 600_000);
    }
}
