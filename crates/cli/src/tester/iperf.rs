//! TCP bulk throughput through the device, measured by a real third-party
//! program: iperf3 from nx-sub1 to nx-srv1 with the hosts' own kernel
//! stacks (offloads off, as the lab sets them). It runs before the
//! tester's ports open, since those take every frame of both hosts.
//! Beside the throughput: the device's CPU time per frame, and whether
//! the lab's CPUs were the limit instead.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use natrix_tester::report::{object, Criterion, Line};
use serde_json::{json, Value};

use super::cputime::{each_cpu_busy_ns, EachCpu};
use super::lab::{cpu_set, device_frames_sent, IperfCpus};
use crate::Failure;

const CLIENT_NS: &str = "nx-sub1";
const SERVER_NS: &str = "nx-srv1";
const SERVER: &str = "198.51.100.11";
const PORT: &str = "5201";
const LISTEN_TIMEOUT: Duration = Duration::from_secs(5);

/// A lab CPU this busy over the run was the limit...
const LAB_FULL: f64 = 0.95;
/// ...unless the device's CPUs were this busy too.
const DEVICE_FULL: f64 = 0.90;

/// One iperf3 run of `seconds`, as a `tcp_throughput` result line: with
/// the device on `device_cpus` (none: it shares the tester's), its CPU time
/// per frame it forwarded, and whether the lab's CPUs rather than the
/// device's set the limit (`generator_limited`), as they do where the
/// host has too few to give iperf3's hosts CPUs of their own (`hosts`).
pub fn tcp_throughput(dut: &str, seconds: u32, device_cpus: &[usize], hosts: &IperfCpus) -> Result<Line, Failure> {
    let mut server = Server::start(hosts.server)?;
    server.wait_listening()?;
    let before = Reading::take();
    let out = client(seconds, hosts.client)?;
    let after = Reading::take();
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|_| Failure::Other(format!("iperf3 printed no result: {}", String::from_utf8_lossy(&out.stderr).trim())))?;
    if let Some(e) = v["error"].as_str() {
        return Err(Failure::Other(format!("iperf3: {e}")));
    }
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().ok_or_else(|| Failure::Other("iperf3 reported no received throughput".into()))?;
    let retransmits = v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    let cpu = before.zip(after).and_then(|(b, a)| CpuShares::between(&b, &a, device_cpus));
    let mut result = object([("gbps", json!(bps / 1e9)), ("retransmits", json!(retransmits)), ("seconds", json!(seconds))]);
    if let Some(c) = &cpu {
        result.extend(object([
            ("frames", json!(c.frames)),
            ("dut_ns_per_frame", json!(c.dut_ns_per_frame)),
            ("dut_cpu_busy", json!(c.dut_busy)),
            ("lab_cpu_busy", json!(c.lab_busy)),
            ("lab_busiest_cpu", json!(c.lab_cpu)),
            ("iperf3_cpus", json!({"server": hosts.server.unwrap_or(0), "client": hosts.client.unwrap_or(0)})),
        ]));
    }
    let generator_limited = cpu.is_some_and(|c| c.lab_was_the_limit());
    Ok(Line { test: "tcp_throughput", dut: dut.to_owned(), frame_size: 1518, flows: 1, criterion: Criterion::Zero, method: "iperf3", result, generator_limited })
}

/// iperf3's client in nx-sub1 for `seconds`, on `cpu` if given.
fn client(seconds: u32, cpu: Option<usize>) -> Result<Output, Failure> {
    let secs = seconds.to_string();
    let timeout = (seconds + 20).to_string();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", CLIENT_NS, "timeout", &timeout, "iperf3", "-c", SERVER, "-p", PORT, "-t", &secs, "-J", "--connect-timeout", "3000"]).stdin(Stdio::null());
    on_cpu(&mut cmd, cpu);
    cmd.output().map_err(|e| Failure::Other(format!("iperf3: {e} (apt-get install iperf3)")))
}

/// The program `cmd` starts runs on `cpu`; without one, where the tester
/// runs.
fn on_cpu(cmd: &mut Command, cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    let set = cpu_set(&[cpu]);
    // SAFETY: only sched_setaffinity, async-signal-safe, between fork and
    // exec; set is a live cpu_set_t of the size given.
    unsafe {
        cmd.pre_exec(move || {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        })
    };
}

/// Every CPU's busy time and the frames the device has sent, at one moment.
struct Reading {
    cpus: EachCpu,
    frames: u64,
}

impl Reading {
    fn take() -> Option<Reading> {
        Some(Reading { cpus: each_cpu_busy_ns()?, frames: device_frames_sent()? })
    }
}

/// Where the CPU time of a TCP run went.
#[derive(Debug, PartialEq)]
struct CpuShares {
    /// Frames the device forwarded, data and ACKs.
    frames: u64,
    /// The device's CPUs' busy time per frame: the same count for natrix
    /// and the kernel, whatever ran there on their behalf.
    dut_ns_per_frame: f64,
    /// The device's CPUs' busy share, on average.
    dut_busy: f64,
    /// The busiest of the other CPUs, and its share.
    lab_busy: f64,
    lab_cpu: usize,
}

impl CpuShares {
    /// None where the device has no CPUs of its own, or forwarded nothing.
    fn between(before: &Reading, after: &Reading, device_cpus: &[usize]) -> Option<CpuShares> {
        let elapsed = after.cpus.at_ns.checked_sub(before.cpus.at_ns).filter(|&e| e > 0)? as f64;
        let frames = after.frames.checked_sub(before.frames).filter(|&f| f > 0)?;
        let busy = |cpu: usize| Some(after.cpus.busy.get(cpu)?.saturating_sub(*before.cpus.busy.get(cpu)?) as f64);
        if device_cpus.is_empty() {
            return None;
        }
        let dut_ns = device_cpus.iter().map(|&c| busy(c)).sum::<Option<f64>>()?;
        let (lab_cpu, lab_ns) = (0..after.cpus.busy.len()).filter(|c| !device_cpus.contains(c)).filter_map(|c| Some((c, busy(c)?))).max_by(|a, b| a.1.total_cmp(&b.1))?;
        Some(CpuShares { frames, dut_ns_per_frame: dut_ns / frames as f64, dut_busy: dut_ns / elapsed / device_cpus.len() as f64, lab_busy: lab_ns / elapsed, lab_cpu })
    }

    fn lab_was_the_limit(&self) -> bool {
        self.lab_busy >= LAB_FULL && self.dut_busy < DEVICE_FULL
    }
}

/// `iperf3 -s -1` in nx-srv1: it serves one test and exits; ended on drop otherwise.
struct Server(Child);

impl Server {
    fn start(cpu: Option<usize>) -> Result<Server, Failure> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", SERVER_NS, "iperf3", "-s", "-1", "-B", SERVER, "-p", PORT]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        on_cpu(&mut cmd, cpu);
        let child = cmd.spawn().map_err(|e| Failure::Other(format!("iperf3: {e} (apt-get install iperf3)")))?;
        Ok(Server(child))
    }

    fn wait_listening(&mut self) -> Result<(), Failure> {
        let started = Instant::now();
        while started.elapsed() < LISTEN_TIMEOUT {
            let ss = Command::new("ip").args(["netns", "exec", SERVER_NS, "ss", "-Hltn", &format!("sport = :{PORT}")]).output();
            if ss.is_ok_and(|o| !o.stdout.trim_ascii().is_empty()) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.0.try_wait() {
                return Err(Failure::Other(format!("the iperf3 server exited ({status})")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Failure::Other(format!("the iperf3 server did not listen within {} s", LISTEN_TIMEOUT.as_secs())))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at_ns: u64, busy: &[u64], frames: u64) -> Reading {
        Reading { cpus: EachCpu { at_ns, busy: busy.to_vec() }, frames }
    }

    #[test]
    fn a_full_lab_cpu_beside_a_half_idle_device_is_the_lab_limit() {
        // One second; the device on CPU 1, 500 ms busy for 1,000 frames;
        // the lab's CPU 0 99% busy.
        let before = reading(1_000_000_000, &[0, 0, 0], 10);
        let after = reading(2_000_000_000, &[990_000_000, 500_000_000, 100_000_000], 1_010);
        let c = CpuShares::between(&before, &after, &[1]).unwrap();
        assert_eq!(c, CpuShares { frames: 1_000, dut_ns_per_frame: 500_000.0, dut_busy: 0.5, lab_busy: 0.99, lab_cpu: 0 });
        assert!(c.lab_was_the_limit());
    }

    #[test]
    fn a_full_device_is_its_own_limit_whatever_the_lab() {
        let before = reading(0, &[0, 0, 0, 0], 0);
        // Two device CPUs, 95% busy on average; the lab's CPU 3 full too.
        let after = reading(1_000_000_000, &[200_000_000, 950_000_000, 950_000_000, 1_000_000_000], 100);
        let c = CpuShares::between(&before, &after, &[1, 2]).unwrap();
        assert_eq!((c.dut_busy, c.lab_busy, c.lab_cpu), (0.95, 1.0, 3));
        assert!(!c.lab_was_the_limit());
        // A lab with room is no limit either.
        let after = reading(1_000_000_000, &[200_000_000, 400_000_000, 400_000_000, 600_000_000], 100);
        assert!(!CpuShares::between(&before, &after, &[1, 2]).unwrap().lab_was_the_limit());
    }

    #[test]
    fn no_shares_without_device_cpus_frames_or_time() {
        let before = reading(0, &[0, 0], 0);
        let after = reading(1_000_000_000, &[1, 1], 5);
        assert_eq!(CpuShares::between(&before, &after, &[]), None);
        assert_eq!(CpuShares::between(&before, &reading(1_000_000_000, &[1, 1], 0), &[1]), None);
        assert_eq!(CpuShares::between(&before, &reading(0, &[1, 1], 5), &[1]), None);
        // A device CPU the host does not have.
        assert_eq!(CpuShares::between(&before, &after, &[7]), None);
    }
}
