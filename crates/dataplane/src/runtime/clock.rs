//! Time for the engines and the decision to sleep when there is no work.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Empty polls before a thread sleeps (unless busy polling).
const SPINS_BEFORE_SLEEP: u32 = 200;
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

    pub(super) fn now_ns(&self) -> u64 {
        self.unix_at_start_ns + self.start.elapsed().as_nanos() as u64
    }
}

/// Decides when an idle thread sleeps.
pub(super) struct Idle {
    spins: u32,
    busy_poll: bool,
}

impl Idle {
    pub(super) fn new(busy_poll: bool) -> Idle {
        Idle { spins: 0, busy_poll }
    }

    pub(super) fn should_sleep(&mut self, did_work: bool) -> bool {
        if did_work {
            self.spins = 0;
            return false;
        }
        self.spins += 1;
        if self.busy_poll {
            // A thread that never sleeps gives the CPU away after an empty
            // poll: the kernel work that feeds and drains natrix's sockets
            // (veth's NAPI, the softirq of a frame natrix sent) may be
            // queued on this CPU, and a spinning thread holds it off for
            // milliseconds (docs/BENCHMARKS.md, "busy_poll and yielding").
            // Without busy polling the thread soon sleeps instead, and a
            // yield there would only hand other tasks whole time slices.
            std::thread::yield_now();
        }
        !self.busy_poll && self.spins > SPINS_BEFORE_SLEEP
    }
}
