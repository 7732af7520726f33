//! The searches of RFC 2544 and RFC 9693, as pure functions over a trial
//! the caller supplies, so that they can be checked against a fake device
//! whose limits are known.
//!
//! - `highest_passing`: RFC 2544 section 26.1's binary search for the
//!   highest rate at which a trial passes (throughput: no frame lost;
//!   RFC 9693 section 4.4's maximum connection establishment rate: every
//!   connection created and validated).
//! - `table_capacity`: RFC 9693 section 4.6's search for the connection
//!   tracking table capacity: an exponential search doubling the number of
//!   connections until the maximum connection establishment rate falls
//!   below `beta` times the last good one, then a binary search between
//!   the last two sizes, where a fall below `gamma` times counts as failure.

/// One trial of a search and its verdict.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Probe {
    pub rate: f64,
    pub passed: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The highest rate that passed; None when none did.
    pub rate: Option<f64>,
    /// The lowest rate that failed; None when the search's upper bound
    /// itself passed (the device kept up with everything offered).
    pub failed_at: Option<f64>,
    pub probes: Vec<Probe>,
}

/// Bounds of a binary search over rates.
#[derive(Debug, Clone, Copy)]
pub struct RateSearch {
    pub lo: f64,
    pub hi: f64,
    /// The search ends when the failing and passing rates are this close.
    pub resolution: f64,
    /// Never try a rate below this (RFC 9693's "stop rate" in the capacity
    /// search: a size that cannot reach it has failed anyway).
    pub give_up_below: f64,
}

/// RFC 2544's binary search: `hi` first (when it passes, the device kept up
/// with the most the tester offers), then halving the interval between the
/// highest rate that passed and the lowest that failed.
pub fn highest_passing<E>(s: RateSearch, mut trial: impl FnMut(f64) -> Result<bool, E>) -> Result<Found, E> {
    let mut probes = Vec::new();
    let mut run = |rate: f64, probes: &mut Vec<Probe>| -> Result<bool, E> {
        let passed = trial(rate)?;
        probes.push(Probe { rate, passed });
        Ok(passed)
    };
    if run(s.hi, &mut probes)? {
        return Ok(Found { rate: Some(s.hi), failed_at: None, probes });
    }
    let (mut lo, mut hi) = (s.lo, s.hi);
    let mut best = None;
    while hi - lo > s.resolution {
        let mut rate = (lo + hi) / 2.0;
        if rate < s.give_up_below {
            // The stop rate itself decides: a device that passes there
            // has not failed, however far below the last probe it is.
            if hi <= s.give_up_below {
                break;
            }
            rate = s.give_up_below;
        }
        if run(rate, &mut probes)? {
            lo = rate;
            best = Some(rate);
        } else {
            hi = rate;
        }
    }
    Ok(Found { rate: best, failed_at: Some(hi), probes })
}

/// Parameters of RFC 9693's table capacity search.
#[derive(Debug, Clone, Copy)]
pub struct CapacitySearch {
    /// A number of connections the table surely holds (RFC 9693's C0).
    pub start: u64,
    /// Sizes above this are not tried: the result then says "at least".
    pub max: u64,
    /// The binary search ends when the sizes are this close (E).
    pub precision: u64,
    /// A size fails the exponential search when its rate falls below beta
    /// times the last good size's rate.
    pub beta: f64,
    /// And the final binary search when it falls below gamma times.
    pub gamma: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Capacity {
    /// The largest size that passed, and its maximum connection
    /// establishment rate.
    pub flows: u64,
    pub rate_pps: f64,
    /// True when `max` itself passed: the capacity is at least `flows`.
    pub at_least: bool,
    /// Every size tried and its rate (0: no rate passed), for plots.
    pub points: Vec<(u64, f64)>,
}

/// RFC 9693 section 4.6. `rate_at(flows, upper, stop)` is the maximum
/// connection establishment rate with `flows` connections, searched below
/// `upper` and abandoned below `stop`; 0.0 when no rate passed. `top` is
/// the highest rate worth trying at all.
pub fn table_capacity<E>(s: CapacitySearch, top: f64, mut rate_at: impl FnMut(u64, f64, f64) -> Result<f64, E>) -> Result<Capacity, E> {
    let mut points = Vec::new();
    let mut measure = |flows: u64, upper: f64, stop: f64, points: &mut Vec<(u64, f64)>| -> Result<f64, E> {
        let r = rate_at(flows, upper, stop)?;
        points.push((flows, r));
        Ok(r)
    };
    let (mut good, mut good_rate) = (s.start, measure(s.start, top, 0.0, &mut points)?);
    // A start the table cannot hold: halve until one passes.
    while good_rate == 0.0 && good > 1 {
        good /= 2;
        good_rate = measure(good, top, 0.0, &mut points)?;
    }
    if good_rate == 0.0 {
        return Ok(Capacity { flows: 0, rate_pps: 0.0, at_least: false, points });
    }
    let mut bad = loop {
        if good >= s.max {
            return Ok(Capacity { flows: good, rate_pps: good_rate, at_least: true, points });
        }
        let next = (good * 2).min(s.max);
        let r = measure(next, good_rate, s.beta * good_rate, &mut points)?;
        if r < s.beta * good_rate {
            break next;
        }
        (good, good_rate) = (next, r);
    };
    while bad - good > s.precision {
        let mid = good + (bad - good) / 2;
        let r = measure(mid, good_rate, s.gamma * good_rate, &mut points)?;
        if r < s.gamma * good_rate {
            bad = mid;
        } else {
            (good, good_rate) = (mid, r);
        }
    }
    Ok(Capacity { flows: good, rate_pps: good_rate, at_least: false, points })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A fake device that loses frames above `limit`.
    fn search_against(limit: f64, hi: f64, resolution: f64) -> Found {
        let s = RateSearch { lo: 0.0, hi, resolution, give_up_below: 0.0 };
        highest_passing(s, |rate| Ok::<_, Infallible>(rate <= limit)).unwrap()
    }

    #[test]
    fn a_device_that_drops_above_a_known_rate_is_found_within_one_step() {
        for limit in [1.0, 999.0, 12_345.0, 123_456.7, 250_000.0, 399_999.0] {
            let f = search_against(limit, 400_000.0, 1_000.0);
            let (best, failed) = (f.rate.unwrap_or(0.0), f.failed_at.unwrap());
            if limit >= 1_000.0 {
                assert!(best <= limit && limit - best <= 1_000.0, "limit {limit}: found {best}");
            }
            assert!(failed > limit && failed - best <= 1_000.0);
            // Every probe's verdict is the device's.
            assert!(f.probes.iter().all(|p| p.passed == (p.rate <= limit)));
        }
    }

    #[test]
    fn a_device_that_takes_everything_is_reported_at_the_upper_bound() {
        let f = search_against(1e9, 400_000.0, 1_000.0);
        assert_eq!((f.rate, f.failed_at, f.probes.len()), (Some(400_000.0), None, 1));
    }

    #[test]
    fn a_device_that_takes_nothing_has_no_rate() {
        let f = search_against(0.0, 400_000.0, 1_000.0);
        assert_eq!(f.rate, None);
        assert!(f.failed_at.unwrap() <= 1_000.0);
    }

    #[test]
    fn the_search_takes_log2_steps() {
        let f = search_against(100_000.0, 409_600.0, 100.0);
        // 409,600 / 2^12 = 100: the upper bound and 12 halvings.
        assert_eq!(f.probes.len(), 13);
    }

    #[test]
    fn giving_up_below_a_stop_rate() {
        let s = RateSearch { lo: 0.0, hi: 1000.0, resolution: 1.0, give_up_below: 400.0 };
        let f = highest_passing(s, |rate| Ok::<_, Infallible>(rate <= 10.0)).unwrap();
        // 1000 and 500 fail; 250 is below the stop rate: the stop rate is
        // tried instead, fails, and nothing lower is.
        assert_eq!(f.probes.iter().map(|p| p.rate).collect::<Vec<_>>(), vec![1000.0, 500.0, 400.0]);
        assert_eq!(f.rate, None);
        assert!(f.probes.iter().all(|p| p.rate >= 400.0));
    }

    #[test]
    fn a_device_between_the_stop_rate_and_the_last_probe_passes() {
        // 1000, 500 and 250 fail; the device takes 220, above the stop
        // rate of 200: the next halving (125) is below it, which must not
        // make the size fail.
        let s = RateSearch { lo: 0.0, hi: 1000.0, resolution: 10.0, give_up_below: 200.0 };
        let f = highest_passing(s, |rate| Ok::<_, Infallible>(rate <= 220.0)).unwrap();
        let best = f.rate.expect("a rate above the stop rate passes");
        assert!((200.0..=220.0).contains(&best) && 220.0 - best <= 10.0, "{best}");
        assert!(f.probes.iter().all(|p| p.rate >= 200.0 && p.passed == (p.rate <= 220.0)));
    }

    #[test]
    fn capacity_with_a_rate_just_above_gamma_is_not_cut_short() {
        // Past 4,000 connections the device's rate drops to 45% of what it
        // was: above gamma (0.4), so 6,000 connections still pass.
        let s = CapacitySearch { start: 1000, max: 8000, precision: 100, beta: 0.2, gamma: 0.4 };
        let c = table_capacity(s, 100_000.0, |flows, upper, stop| {
            let limit = match flows {
                0..=4000 => 100_000.0,
                4001..=6000 => 45_000.0,
                _ => 0.0,
            };
            let f = highest_passing(RateSearch { lo: 0.0, hi: upper, resolution: upper / 64.0, give_up_below: stop }, |r| Ok::<_, Infallible>(r <= limit))?;
            Ok::<_, Infallible>(f.rate.unwrap_or(0.0))
        })
        .unwrap();
        assert!(c.flows <= 6000 && 6000 - c.flows <= 100, "{c:?}");
    }

    /// A fake NAT: a table of `capacity` connections, which it fills at up
    /// to `rate` connections per second; more connections than that fail
    /// at every rate.
    fn capacity_against(capacity: u64, max: u64) -> Capacity {
        let s = CapacitySearch { start: 1000, max, precision: 100, beta: 0.2, gamma: 0.4 };
        table_capacity(s, 500_000.0, |flows, upper, stop| {
            if flows > capacity {
                return Ok::<_, Infallible>(0.0);
            }
            let found = highest_passing(RateSearch { lo: 0.0, hi: upper, resolution: upper / 64.0, give_up_below: stop }, |r| Ok::<_, Infallible>(r <= 200_000.0))?;
            Ok(found.rate.unwrap_or(0.0))
        })
        .unwrap()
    }

    #[test]
    fn table_capacity_is_found_within_the_precision() {
        for capacity in [1_000, 1_500, 100_000, 262_144, 300_001] {
            let c = capacity_against(capacity, 10_000_000);
            assert!(!c.at_least);
            assert!(c.flows <= capacity && capacity - c.flows <= 100, "capacity {capacity}: found {}", c.flows);
            assert!(c.rate_pps > 150_000.0 && c.rate_pps <= 200_000.0);
        }
    }

    #[test]
    fn a_table_larger_than_the_search_says_at_least() {
        let c = capacity_against(5_000_000, 65_536);
        assert_eq!((c.flows, c.at_least), (65_536, true));
    }

    #[test]
    fn a_start_too_large_is_halved() {
        let c = capacity_against(300, 10_000);
        assert!(c.flows <= 300 && c.flows > 200, "{}", c.flows);
    }
}
