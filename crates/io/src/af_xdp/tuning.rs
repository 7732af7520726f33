//! Preferred busy polling for natrix's interfaces: while natrix runs, the
//! kernel defers each device's receive work (`napi_defer_hard_irqs`,
//! `gro_flush_timeout`) so that the polls of natrix's sockets, which
//! prefer busy polling, run it on natrix's thread instead of waking the
//! device's interrupt or NAPI thread for every frame (two context switches
//! a frame on a shared CPU). When natrix sleeps, the device's receive work
//! runs at the latest `gro_flush_timeout` later. Settings an operator made
//! are left as they are; what natrix changed is put back when it stops,
//! unless someone changed it again meanwhile. natrix's own values found at
//! start (left by a natrix that was killed) count as natrix's.

use std::fs;

/// Empty polls the device's NAPI may complete before it re-enables its
/// interrupt, and how long it waits for a busy poll before it runs its
/// receive work itself (ns): short enough that a sleeping natrix wakes
/// within 0.1 ms of a frame.
const DEFER_HARD_IRQS: u64 = 10;
const GRO_FLUSH_TIMEOUT_NS: u64 = 100_000;
const UNTUNED: (u64, u64) = (0, 0);
const TUNED: (u64, u64) = (DEFER_HARD_IRQS, GRO_FLUSH_TIMEOUT_NS);

/// The devices natrix tuned, to put back on drop.
pub struct DeviceTuning {
    changed: Vec<String>,
}

/// What became of one interface's settings.
#[derive(Debug, PartialEq, Eq)]
pub enum Tuned {
    /// Set by natrix (both were zero, or natrix's own already).
    Set,
    /// The operator's own values, left as they are.
    Kept { defer_hard_irqs: u64, gro_flush_timeout: u64 },
    /// Not done (a read-only or another namespace's /sys, an old kernel): why.
    Failed(String),
}

impl DeviceTuning {
    /// Tunes each interface (name, ifindex) where nobody else has; returns
    /// what became of each.
    pub fn apply(interfaces: &[(&str, u32)]) -> (DeviceTuning, Vec<Tuned>) {
        let mut tuning = DeviceTuning { changed: Vec::new() };
        let outcomes = interfaces.iter().map(|&(name, ifindex)| tuning.apply_one(name, ifindex)).collect();
        (tuning, outcomes)
    }

    fn apply_one(&mut self, interface: &str, ifindex: u32) -> Tuned {
        if let Err(why) = same_device(interface, ifindex) {
            return Tuned::Failed(why);
        }
        let found = match settings(interface) {
            Ok(found) => found,
            Err(why) => return Tuned::Failed(why),
        };
        if found != UNTUNED && found != TUNED {
            return Tuned::Kept { defer_hard_irqs: found.0, gro_flush_timeout: found.1 };
        }
        if let Err(why) = set(interface, TUNED) {
            // Nothing half-set stays behind.
            let _ = set(interface, UNTUNED);
            return Tuned::Failed(why);
        }
        self.changed.push(interface.to_owned());
        Tuned::Set
    }
}

impl Drop for DeviceTuning {
    fn drop(&mut self) {
        for interface in &self.changed {
            // Best effort: an interface gone since has nothing to put back,
            // and values changed again meanwhile are someone else's.
            if settings(interface) == Ok(TUNED) {
                let _ = set(interface, UNTUNED);
            }
        }
    }
}

/// /sys/class/net shows the network namespace of whoever mounted /sys,
/// which need not be natrix's: the device there must be natrix's own.
fn same_device(interface: &str, ifindex: u32) -> Result<(), String> {
    let path = setting_path(interface, "ifindex");
    match fs::read_to_string(&path).map(|v| v.trim().parse::<u32>()) {
        Ok(Ok(index)) if index == ifindex => Ok(()),
        Ok(_) => Err(format!("{path} belongs to another network namespace's {interface}; mount /sys in natrix's")),
        Err(e) => Err(format!("reading {path}: {e}")),
    }
}

/// (napi_defer_hard_irqs, gro_flush_timeout).
fn settings(interface: &str) -> Result<(u64, u64), String> {
    Ok((read(interface, "napi_defer_hard_irqs")?, read(interface, "gro_flush_timeout")?))
}

fn set(interface: &str, (defer_hard_irqs, gro_flush_timeout): (u64, u64)) -> Result<(), String> {
    write(interface, "gro_flush_timeout", gro_flush_timeout)?;
    write(interface, "napi_defer_hard_irqs", defer_hard_irqs)
}

fn setting_path(interface: &str, setting: &str) -> String {
    format!("/sys/class/net/{interface}/{setting}")
}

fn read(interface: &str, setting: &str) -> Result<u64, String> {
    let path = setting_path(interface, setting);
    let text = fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    text.trim().parse().map_err(|e| format!("reading {path}: {e}"))
}

fn write(interface: &str, setting: &str, value: u64) -> Result<(), String> {
    let path = setting_path(interface, setting);
    fs::write(&path, value.to_string()).map_err(|e| format!("writing {path}: {e}"))
}

/// What an operator reads at start-up about an interface's tuning, asked
/// for by `reason`.
pub fn describe(interface: &str, tuned: &Tuned, reason: &str) -> String {
    match tuned {
        Tuned::Set => format!(
            "{interface}: napi_defer_hard_irqs {DEFER_HARD_IRQS} and gro_flush_timeout {GRO_FLUSH_TIMEOUT_NS} ns while natrix runs, so its polls run the device's receive work ({reason})"
        ),
        Tuned::Kept { defer_hard_irqs, gro_flush_timeout } => {
            format!("{interface}: napi_defer_hard_irqs {defer_hard_irqs} and gro_flush_timeout {gro_flush_timeout} ns kept as they were set ({reason})")
        }
        Tuned::Failed(error) => format!(
            "{interface}: not tuned for busy polling ({error}), which {reason} asks for; each batch may wake the device's interrupt or NAPI thread, and natrix may forward less for more CPU (docs/BENCHMARKS.md, \"A fair lab\")"
        ),
    }
}
