//! Time for the engines and the decision to sleep when there is no work.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How long a thread keeps polling after its last frame before it sleeps
/// (unless busy polling): long enough that a steady stream of frames never
/// puts it to sleep between two of them, short enough that an idle
/// thread gives its CPU back at once. A poll that finds a socket empty
/// runs the device's receive work itself (AF_XDP's busy polling), so these
/// polls do the kernel's work for it rather than wait for it.
const SPIN_NS: u64 = 50_000;
/// A sleeping thread still wakes this often to run the engine's timers.
pub(super) const SLEEP_MS: i32 = 100;

/// Engine time: Unix nanoseconds that never go backwards, so events carry
/// wall-clock times while timers follow the monotonic clock.
#[derive(Clone, Copy)]
pub(super) struct Clock {
    start: Instant,
    unix_at_start_ns: u64,
}

impl Clock {
    pub(super) fn new() -> Clock {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Clock { start: Instant::now(), unix_at_start_ns: unix }
    }

    /// Engine time at `instant`, for a loop that reads the clock once a round.
    pub(super) fn at(&self, instant: Instant) -> u64 {
        self.unix_at_start_ns + instant.saturating_duration_since(self.start).as_nanos() as u64
    }
}

/// Decides when an idle thread sleeps.
pub(super) struct Idle {
    /// When the current run of empty rounds began (engine time).
    idle_since: Option<u64>,
    busy_poll: bool,
}

impl Idle {
    pub(super) fn new(busy_poll: bool) -> Idle {
        Idle { idle_since: None, busy_poll }
    }

    /// After a round that started at `now` (engine time) and did work or
    /// not. The spin is timed from the first empty round, so a long
    /// working round does not use it up.
    pub(super) fn should_sleep(&mut self, did_work: bool, now: u64) -> bool {
        if did_work {
            self.idle_since = None;
            return false;
        }
        let since = *self.idle_since.get_or_insert(now);
        if self.busy_poll {
            // A thread that never sleeps gives the CPU away after an empty
            // poll: the kernel work that feeds and drains natrix's sockets
            // (veth's NAPI, the softirq of a frame natrix sent) may be
            // queued on this CPU, and a spinning thread holds it off for
            // milliseconds (docs/BENCHMARKS.md, "busy_poll and yielding").
            // Without busy polling the thread soon sleeps instead, and a
            // yield there would only hand other tasks whole time slices.
            std::thread::yield_now();
            return false;
        }
        now.saturating_sub(since) > SPIN_NS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_polling_for_a_while_after_its_last_frame_then_sleeps() {
        let mut idle = Idle::new(false);
        assert!(!idle.should_sleep(true, 1_000_000));
        assert!(!idle.should_sleep(false, 1_000_100));
        assert!(!idle.should_sleep(false, 1_000_100 + SPIN_NS / 2));
        assert!(idle.should_sleep(false, 1_000_100 + SPIN_NS + 1));
        // A frame starts the spin again.
        assert!(!idle.should_sleep(true, 5_000_000));
        assert!(!idle.should_sleep(false, 5_000_100));
        assert!(!idle.should_sleep(false, 5_000_100 + SPIN_NS));
    }

    #[test]
    fn a_long_working_round_does_not_use_up_the_spin() {
        let mut idle = Idle::new(false);
        assert!(!idle.should_sleep(true, 1_000_000));
        // The next round starts long after the working one did.
        assert!(!idle.should_sleep(false, 1_000_000 + 3 * SPIN_NS), "the first empty round after a long one polls on");
        assert!(idle.should_sleep(false, 1_000_000 + 4 * SPIN_NS + 1));
    }

    #[test]
    fn a_busy_polling_thread_never_sleeps() {
        let mut idle = Idle::new(true);
        assert!(!idle.should_sleep(false, 0));
        assert!(!idle.should_sleep(false, 10 * SPIN_NS));
    }

    #[test]
    fn engine_time_follows_the_instant_it_is_read_at() {
        let clock = Clock::new();
        let later = clock.start + std::time::Duration::from_micros(7);
        assert_eq!(clock.at(later) - clock.at(clock.start), 7_000);
    }
}
