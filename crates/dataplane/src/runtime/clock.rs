//! Time for the engines and the decision to sleep when there is no work.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How long a thread keeps polling after its last frame before it sleeps
/// (unless busy polling), while its frames come close together: long
/// enough that a steady stream of frames never puts it to sleep between
/// two of them. A poll that empties a socket's ring runs the device's
/// receive work itself (AF_XDP's busy polling), so these polls do the
/// kernel's work for it rather than wait for it.
const SPIN_NS: u64 = 50_000;
/// Frames further apart than this on average (under 100 kpps) are not
/// worth the spin: in the lab, polling through each gap cost more CPU than
/// sleeping and waking, as where the devices defer their receive work to
/// natrix's polls the sleeping thread is woken with a batch at the
/// deferral's timer (docs/BENCHMARKS.md, "Sleeping between sparse
/// frames").
const SPARSE_GAP_NS: u64 = 10_000;
/// The span over which a thread judges how far apart its frames come.
const RATE_WINDOW_NS: u64 = 1_000_000;
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
/// the empty round after its last. A thread polls on after its last frame
/// where frames come close together, so its CPU time is then the whole
/// CPU; this is the part spent on frames (and, in system time, the
/// kernel's work for the frames it sends), less the polls that found the
/// first. The thread's CPU clock is a system call, so it is read where a
/// run starts and ends (and every `READ_EVERY` rounds of a long one), never
/// while the thread polls idle.
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

/// Decides when an idle thread sleeps: at once where its frames come
/// sparsely, after `SPIN_NS` of polling where they come close together.
pub(super) struct Idle {
    /// When the current run of empty rounds began (engine time).
    idle_since: Option<u64>,
    busy_poll: bool,
    /// The current window: when it began, and the frames it has seen.
    window_start: u64,
    window_frames: u64,
    /// Whether the last whole window's frames came sparsely.
    sparse: bool,
}

impl Idle {
    pub(super) fn new(busy_poll: bool) -> Idle {
        Idle { idle_since: None, busy_poll, window_start: 0, window_frames: 0, sparse: false }
    }

    /// After a round that started at `now` (engine time), handled
    /// `frames` and did work or not (frames, or other work such as a
    /// listing). The spin is timed from the first empty round, so a long
    /// working round does not use it up.
    pub(super) fn should_sleep(&mut self, frames: usize, did_work: bool, now: u64) -> bool {
        self.count(frames, now);
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
        self.sparse || now.saturating_sub(since) > SPIN_NS
    }

    /// Counts a round's frames into the current window; a window closes at
    /// the first round a millisecond after it began (a sleeping thread's
    /// closes on waking, over the time it slept), so the judgement follows
    /// the rate within a millisecond or one sleep.
    fn count(&mut self, frames: usize, now: u64) {
        let span = now.saturating_sub(self.window_start);
        if span >= RATE_WINDOW_NS {
            self.sparse = self.window_frames.saturating_mul(SPARSE_GAP_NS) < span;
            self.window_start = now;
            self.window_frames = 0;
        }
        self.window_frames += frames as u64;
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

    /// Rounds of one frame each, `gap_ns` apart, from `start` for 2 ms
    /// (two rate windows); returns when the last one ran.
    fn stream(idle: &mut Idle, start: u64, gap_ns: u64) -> u64 {
        let mut now = start;
        while now < start + 2 * RATE_WINDOW_NS {
            assert!(!idle.should_sleep(1, true, now), "a round with a frame never sleeps");
            now += gap_ns;
        }
        now - gap_ns
    }

    #[test]
    fn a_thread_with_frames_close_together_polls_for_a_while_after_the_last_then_sleeps() {
        let mut idle = Idle::new(false);
        let last = stream(&mut idle, 1_000_000, 5_000);
        assert!(!idle.should_sleep(0, false, last + 100));
        assert!(!idle.should_sleep(0, false, last + 100 + SPIN_NS / 2));
        assert!(idle.should_sleep(0, false, last + 100 + SPIN_NS + 1));
        // A frame starts the spin again.
        let next = last + 2 * SPIN_NS;
        assert!(!idle.should_sleep(1, true, next));
        assert!(!idle.should_sleep(0, false, next + 100));
        assert!(!idle.should_sleep(0, false, next + 100 + SPIN_NS));
    }

    /// At 50 kpps a frame comes every 20 µs: polling through the gaps
    /// took as much CPU again as the frames' work did.
    #[test]
    fn a_thread_with_sparse_frames_sleeps_at_its_first_empty_round() {
        let mut idle = Idle::new(false);
        let last = stream(&mut idle, 1_000_000, 20_000);
        assert!(idle.should_sleep(0, false, last + 100));
        // Frames closer together again: after a window it polls on.
        let last = stream(&mut idle, last + 200, 4_000);
        assert!(!idle.should_sleep(0, false, last + 100));
        assert!(idle.should_sleep(0, false, last + 100 + SPIN_NS + 1));
    }

    #[test]
    fn a_thread_whose_frames_thin_out_sleeps_at_once_again() {
        let mut idle = Idle::new(false);
        let last = stream(&mut idle, 1_000_000, 5_000);
        let last = stream(&mut idle, last + 5_000, 20_000);
        assert!(idle.should_sleep(0, false, last + 100));
        // Close together again, then one frame after a sleep of 100 ms:
        // the window that spans the sleep is judged over all of it.
        let last = stream(&mut idle, last + 200, 5_000);
        assert!(!idle.should_sleep(0, false, last + 100));
        assert!(!idle.should_sleep(1, true, last + 100_000_000));
        assert!(idle.should_sleep(0, false, last + 100_000_100));
    }

    #[test]
    fn the_judgement_turns_at_a_frame_every_10_us() {
        for (gap, sleeps) in [(9_900, false), (10_100, true)] {
            let mut idle = Idle::new(false);
            let last = stream(&mut idle, 1_000_000, gap);
            assert_eq!(idle.should_sleep(0, false, last + 100), sleeps, "a frame every {gap} ns");
        }
    }

    #[test]
    fn a_thread_that_never_had_frames_sleeps_at_once() {
        let mut idle = Idle::new(false);
        assert!(idle.should_sleep(0, false, 1_700_000_000_000_000_000));
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
        let last = stream(&mut idle, 1_000_000, 5_000);
        assert!(!idle.should_sleep(1, true, last + 5_000));
        // The next round starts long after the working one did.
        assert!(!idle.should_sleep(0, false, last + 5_000 + 3 * SPIN_NS), "the first empty round after a long one polls on");
        assert!(idle.should_sleep(0, false, last + 5_000 + 4 * SPIN_NS + 1));
    }

    #[test]
    fn a_busy_polling_thread_never_sleeps() {
        let mut idle = Idle::new(true);
        let last = stream(&mut idle, 1_000_000, 20_000);
        assert!(!idle.should_sleep(0, false, last + 100), "sparse frames");
        assert!(!idle.should_sleep(0, false, last + 10 * SPIN_NS));
    }

    #[test]
    fn engine_time_follows_the_instant_it_is_read_at() {
        let clock = Clock::new();
        let later = clock.start + std::time::Duration::from_micros(7);
        assert_eq!(clock.at(later) - clock.at(clock.start), 7_000);
    }
}
