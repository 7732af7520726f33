//! Seed 002's load ladder (its section 3.8.2, table 3.2): two frame sizes,
//! each driven at five rates on a 1-2-5 scale. Its frame sizes count the
//! Ethernet header but no FCS (1514 = a 1500-byte MTU + 14), so they are
//! RFC 2544 sizes 132 and 1518 here; its rates are computed on its own
//! sizes, which keeps its frames per second exactly.

use crate::pacing::Rate;

/// One rung: seed 002's frame size (no FCS) and its load in Mbit/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rung {
    pub bytes: usize,
    pub mbps: f64,
}

impl Rung {
    pub fn rate(&self) -> Rate {
        Rate::from_mbps(self.mbps, self.bytes)
    }

    /// The RFC 2544 frame size of this rung's frames.
    pub fn frame_size(&self) -> usize {
        self.bytes + crate::frame::FCS_LEN
    }
}

pub const LADDER: [Rung; 10] = [
    Rung { bytes: 128, mbps: 1.0 },
    Rung { bytes: 128, mbps: 10.0 },
    Rung { bytes: 128, mbps: 20.0 },
    Rung { bytes: 128, mbps: 50.0 },
    Rung { bytes: 128, mbps: 100.0 },
    Rung { bytes: 1514, mbps: 10.0 },
    Rung { bytes: 1514, mbps: 100.0 },
    Rung { bytes: 1514, mbps: 200.0 },
    Rung { bytes: 1514, mbps: 500.0 },
    Rung { bytes: 1514, mbps: 1000.0 },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Table 3.2's "mean pps" column.
    #[test]
    fn the_ladder_gives_table_3_2s_frame_rates() {
        let table = [976.563, 9_765.625, 19_531.250, 48_828.125, 97_656.250, 825.627, 8_256.275, 16_512.550, 41_281.374, 82_562.748];
        for (rung, pps) in LADDER.iter().zip(table) {
            assert!((rung.rate().as_pps() - pps).abs() < 0.001, "{rung:?}: {} vs {pps}", rung.rate().as_pps());
        }
        assert_eq!(LADDER[9].frame_size(), 1518);
        assert_eq!(LADDER[0].frame_size(), 132);
    }
}
