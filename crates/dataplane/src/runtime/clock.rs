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
        !self.busy_poll && self.spins > SPINS_BEFORE_SLEEP
    }
}
