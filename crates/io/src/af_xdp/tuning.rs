//! Preferred busy polling for natrix's interfaces: while natrix runs, the
//! kernel defers each device's receive work (`napi_defer_hard_irqs`,
//! `gro_flush_timeout`) so that the polls of natrix's sockets, which
//! prefer busy polling, run it on natrix's thread instead of waking the
//! device's interrupt or NAPI thread for every frame (two context switches
//! a frame on a shared CPU). When natrix sleeps, the device's receive work
//! runs at the latest `gro_flush_timeout` later. Settings an operator made
//! (either value not zero) are left as they are; what natrix changed is
//! put back when it stops.

use std::fs;

/// Empty polls the device's NAPI may complete before it re-enables its
/// interrupt, and how long it waits for a busy poll before it runs its
/// receive work itself (ns): short enough that a sleeping natrix wakes
/// within 0.1 ms of a frame.
const DEFER_HARD_IRQS: u32 = 10;
const GRO_FLUSH_TIMEOUT_NS: u32 = 100_000;

/// The devices natrix tuned, to put back on drop.
pub struct DeviceTuning {
    changed: Vec<String>,
}

/// What became of one interface's settings.
#[derive(Debug, PartialEq, Eq)]
pub enum Tuned {
    /// Set by natrix (both were zero).
    Set,
    /// The operator's own values, left as they are.
    Kept { defer_hard_irqs: u32, gro_flush_timeout: u32 },
    /// Not writable here (a read-only /sys, an old kernel): why.
    Failed(String),
}

impl DeviceTuning {
    /// Tunes each interface where nobody has; returns what became of each.
    pub fn apply(interfaces: &[&str]) -> (DeviceTuning, Vec<Tuned>) {
        let mut tuning = DeviceTuning { changed: Vec::new() };
        let outcomes = interfaces.iter().map(|&name| tuning.apply_one(name)).collect();
        (tuning, outcomes)
    }

    fn apply_one(&mut self, interface: &str) -> Tuned {
        let read = |setting| fs::read_to_string(setting_path(interface, setting)).map(|v| v.trim().parse::<u32>().unwrap_or(0));
        let (defer_hard_irqs, gro_flush_timeout) = match (read("napi_defer_hard_irqs"), read("gro_flush_timeout")) {
            (Ok(d), Ok(g)) => (d, g),
            (Err(e), _) | (_, Err(e)) => return Tuned::Failed(format!("reading {}: {e}", setting_path(interface, "napi_defer_hard_irqs"))),
        };
        if defer_hard_irqs != 0 || gro_flush_timeout != 0 {
            return Tuned::Kept { defer_hard_irqs, gro_flush_timeout };
        }
        let written = write(interface, "gro_flush_timeout", GRO_FLUSH_TIMEOUT_NS).and_then(|()| write(interface, "napi_defer_hard_irqs", DEFER_HARD_IRQS));
        self.changed.push(interface.to_owned());
        match written {
            Ok(()) => Tuned::Set,
            Err(e) => Tuned::Failed(e),
        }
    }
}

impl Drop for DeviceTuning {
    fn drop(&mut self) {
        for interface in &self.changed {
            // Best effort: an interface gone since has nothing to put back.
            let _ = write(interface, "napi_defer_hard_irqs", 0);
            let _ = write(interface, "gro_flush_timeout", 0);
        }
    }
}

fn setting_path(interface: &str, setting: &str) -> String {
    format!("/sys/class/net/{interface}/{setting}")
}

fn write(interface: &str, setting: &str, value: u32) -> Result<(), String> {
    let path = setting_path(interface, setting);
    fs::write(&path, value.to_string()).map_err(|e| format!("writing {path}: {e}"))
}

/// What an operator reads at start-up about an interface's tuning.
pub fn describe(interface: &str, tuned: &Tuned) -> String {
    match tuned {
        Tuned::Set => format!(
            "{interface}: napi_defer_hard_irqs {DEFER_HARD_IRQS} and gro_flush_timeout {GRO_FLUSH_TIMEOUT_NS} ns while natrix runs, so its polls run the device's receive work (prefer_busy_poll = true)"
        ),
        Tuned::Kept { defer_hard_irqs, gro_flush_timeout } => {
            format!("{interface}: napi_defer_hard_irqs {defer_hard_irqs} and gro_flush_timeout {gro_flush_timeout} ns kept as they were set")
        }
        Tuned::Failed(why) => format!("{interface}: not tuned for busy polling ({why}); each frame may wake the device's NAPI thread"),
    }
}
