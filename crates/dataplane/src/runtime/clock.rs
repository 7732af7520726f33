//! Time for the engines and the decision to sleep when there is no work.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How long a thread keeps polling after its last frame before it sleeps
/// (unless busy polling): long enough that a steady stream of frames never
/// puts it to sleep between two of them, short enough that an idle
/// thread gives its CPU back at once. A poll that empties a socket's ring
/// runs the device's receive work itself (AF_XDP's busy polling), so these
/// polls do the kernel's work for it rather than wait for it.
const SPIN_NS: u64 = 50_000;
/// A sleeping thread still wakes this often to run the engine's timers.
pub(super) const SLEEP_MS: i32 = 100;

/// How long an idle thread may sleep at `now_ns`: `SLEEP_MS`, or less where
/// its engine's next timer (`wake_ns`) falls due sooner, rounded up to the
/// millisecond poll() counts in.
pub(super) fn sleep_ms(now_ns: u64, wake_ns: u64) -> i32 {
    let until = wake_ns.saturating_sub(now_ns).div_ceil(1_000_000);
    i32::try_from(until).map_or(SLEEP_MS, |ms| ms.min(SLEEP_MS))
}

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

/// The CPU time a thread spends on frames: each run of rounds that carry
/// frames, from when its first round found some (`begin`) to the end of
/// the empty round after its last. A thread polls on after its last frame,
/// so its CPU time is the whole CPU at moderate rates; this is the part
/// spent on frames (and, in system time, the kernel's work for the frames
/// it sends), less the polls that found the first. The thread's CPU clock
/// is a system call, so it is read where a run starts and ends (and every
/// `READ_EVERY` rounds of a long one), never while the thread polls idle.
#[derive(Default)]
pub(super) struct Work {
    /// The thread's CPU time at the last reading, within a run.
    mark: u64,
    /// Rounds of the run since the last reading; 0 outside a run.
    working: u32,
    pub(super) ns: u64,
}

const READ_EVERY: u32 = 1024;

impl Work {
    /// A round found frames: a run starts here unless one is going on.
    pub(super) fn begin(&mut self) {
        if self.working == 0 {
            self.mark = thread_cpu_ns();
            self.working = 1;
        }
    }

    /// After a round that carried frames (and called `begin`) or not.
    pub(super) fn round(&mut self, did_work: bool) {
        match (did_work, self.working) {
            // Work `begin` did not see (frames handed back to send): the
            // run starts from here.
            (true, 0) => self.begin(),
            (true, n) if n < READ_EVERY => self.working += 1,
            (true, _) => {
                self.settle();
                self.working = 1;
            }
            (false, 0) => {}
            (false, _) => {
                self.settle();
                self.working = 0;
            }
        }
    }

    fn settle(&mut self) {
        let now = thread_cpu_ns();
        self.ns += now.saturating_sub(self.mark);
        self.mark = now;
    }
}

fn thread_cpu_ns() -> u64 {
    // SAFETY: timespec is plain data; all zeroes is valid.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: t is live; the thread's CPU clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
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

    /// An idle thread wakes for its engine's next timer (a SYN
    /// accelerator's copy 15 ms away), not a whole sleep interval late.
    #[test]
    fn a_sleep_ends_by_the_next_timer() {
        assert_eq!(sleep_ms(0, u64::MAX), SLEEP_MS, "no timer");
        assert_eq!(sleep_ms(1_000, 1_000 + 15_000_000), 15);
        assert_eq!(sleep_ms(0, 1_500_000), 2, "rounded up: never wakes early only to sleep again");
        assert_eq!(sleep_ms(10, 5), 0, "due already");
        assert_eq!(sleep_ms(0, 10 * 1_000_000_000), SLEEP_MS);
    }

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

    /// Spinning counts nothing; working counts its CPU time, also when
    /// it never stops.
    #[test]
    fn work_counts_the_cpu_of_working_rounds_only() {
        let spin = |work: &mut Work, rounds: u32, worked: bool| {
            for _ in 0..rounds {
                if worked {
                    work.begin();
                }
                let t = thread_cpu_ns();
                while thread_cpu_ns() - t < 10_000 {}
                work.round(worked);
            }
        };
        let mut work = Work::default();
        spin(&mut work, 200, false);
        assert_eq!(work.ns, 0, "empty rounds are not work");
        spin(&mut work, 100, true);
        work.round(false);
        assert!((1_000_000..1_500_000).contains(&work.ns), "100 rounds of 10 µs: {} ns", work.ns);
        let before = work.ns;
        spin(&mut work, READ_EVERY + 1, true);
        assert!(work.ns >= before + u64::from(READ_EVERY) * 10_000, "a thread never idle is still counted: {} ns", work.ns - before);
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
