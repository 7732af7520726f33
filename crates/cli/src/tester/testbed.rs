//! The tester's `Testbed`s in the lab: the device in nx-nat between the
//! tester's two ports, and the access switch alone between two of them
//! (the generator's own test).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use natrix_tester::engine::{Tester, TrialOutcome, TrialPlan};
use natrix_tester::procedure::{CpuTimes, TestError, Testbed};

use super::cputime::machine_busy_ns;
use super::dut::Dut;
use super::lab::{INSIDE_ROUTER, OUTSIDE_ROUTER};

/// Set by SIGINT or SIGTERM: the run stops at the next trial and cleans up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// How long the device gets to take in the tester's ARP announcements
/// before a trial starts.
const ANNOUNCE_SETTLE: Duration = Duration::from_millis(20);

/// The device under test with the tester around it.
pub struct LabBed {
    pub tester: Tester,
    pub dut: Box<dyn Dut>,
    pub name: &'static str,
}

impl Testbed for LabBed {
    fn dut(&self) -> &str {
        self.name
    }

    fn reset(&mut self) -> Result<(), TestError> {
        self.dut.reset()?;
        self.tester.forget();
        // A restarted natrix knows no neighbours: told now, its first
        // frames do not wait for ARP (nor risk its queue's limit).
        self.tester.announce(u32::from(INSIDE_ROUTER), u32::from(OUTSIDE_ROUTER))?;
        std::thread::sleep(ANNOUNCE_SETTLE);
        Ok(())
    }

    fn delete_all(&mut self) -> Result<Duration, TestError> {
        let took = self.dut.delete_all()?;
        self.tester.forget();
        Ok(took)
    }

    fn trial(&mut self, plan: &TrialPlan) -> Result<TrialOutcome, TestError> {
        if interrupted() {
            return Err(TestError::Interrupted);
        }
        Ok(self.tester.run(plan)?)
    }

    fn cpu(&mut self) -> Option<CpuTimes> {
        Some(CpuTimes { machine_busy_ns: machine_busy_ns()?, dut_ns: self.dut.cpu_ns(), dut_work_ns: self.dut.work_ns(), dut_shared_ns: self.dut.shared_ns() })
    }

    fn note(&mut self, msg: &str) {
        eprintln!("  [{}] {msg}", self.name);
    }
}

/// Two tester ports on one switch: nothing to reset or delete.
pub struct SwitchBed {
    pub tester: Tester,
}

impl Testbed for SwitchBed {
    fn dut(&self) -> &str {
        "none"
    }

    fn reset(&mut self) -> Result<(), TestError> {
        Ok(())
    }

    fn delete_all(&mut self) -> Result<Duration, TestError> {
        Err(TestError::Dut("a switch has no connections to delete".into()))
    }

    fn trial(&mut self, plan: &TrialPlan) -> Result<TrialOutcome, TestError> {
        if interrupted() {
            return Err(TestError::Interrupted);
        }
        Ok(self.tester.run(plan)?)
    }

    fn cpu(&mut self) -> Option<CpuTimes> {
        Some(CpuTimes { machine_busy_ns: machine_busy_ns()?, dut_ns: None, dut_work_ns: None, dut_shared_ns: None })
    }

    fn note(&mut self, msg: &str) {
        eprintln!("  [generator] {msg}");
    }
}
