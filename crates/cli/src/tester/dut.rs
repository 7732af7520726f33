//! The two devices under test in the lab's nx-nat: natrix (a `natrix run`
//! the tester starts, restarts to empty its table, and empties through its
//! management API to time the tear-down), and the kernel's nftables NAT
//! (conntrack emptied over ctnetlink, as `conntrack -F` does).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use natrix_tester::procedure::TestError;
use natrix_tester::sys::in_netns;

use super::cputime::{cpu_busy_ns, process_cpu_ns, softirq_ns};
use super::lab::NAT_NS;

/// What the tester asks of a device beyond forwarding.
pub trait Dut {
    /// An empty connection table.
    fn reset(&mut self) -> Result<(), TestError>;
    /// Deletes every connection at once; how long that took.
    fn delete_all(&mut self) -> Result<Duration, TestError>;
    /// CPU time the device has spent, where it can be told apart from the
    /// tester's and the lab's.
    fn cpu_ns(&self) -> Option<u64>;
    /// The part of that time spent working on frames: all of it, unless
    /// the device also spends time waiting for them.
    fn work_ns(&self) -> Option<u64> {
        self.cpu_ns()
    }
    /// The part of that time that is whole CPUs' busy time, other
    /// tenants' included (a quiet spell's rate of it is background).
    fn shared_ns(&self) -> Option<u64> {
        None
    }
}

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_GRACE: Duration = Duration::from_secs(10);
const API: &str = "127.0.0.1:9300";

/// `natrix run` in nx-nat, its output in a log file.
pub struct Natrix {
    exe: PathBuf,
    config: PathBuf,
    log: PathBuf,
    /// Its CPUs (empty: all).
    cpus: Vec<usize>,
    /// The subscribers whose sessions `delete_all` clears.
    subscribers: Vec<Ipv4Addr>,
    child: Option<Child>,
    /// Whether its links run no native XDP program (generic programs, or
    /// AF_PACKET): they then have no NAPI threads, and their receive work
    /// runs in softirq on its CPUs (RPS puts it there, as for the kernel).
    no_napi_threads: bool,
}

impl Natrix {
    pub fn start(exe: &Path, config: &Path, log: &Path, cpus: Vec<usize>, subscribers: Vec<Ipv4Addr>) -> Result<Natrix, TestError> {
        let mut n = Natrix { exe: exe.to_owned(), config: config.to_owned(), log: log.to_owned(), cpus, subscribers, child: None, no_napi_threads: false };
        n.launch()?;
        Ok(n)
    }

    fn launch(&mut self) -> Result<(), TestError> {
        let log = File::options().create(true).append(true).open(&self.log).map_err(|e| dut_error(&self.log, e))?;
        let err = log.try_clone().map_err(|e| dut_error(&self.log, e))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", NAT_NS]).arg(&self.exe).arg("run").arg("--config").arg(&self.config).stdin(Stdio::null()).stdout(log).stderr(err);
        let pinned = (!self.cpus.is_empty()).then(|| super::lab::cpu_set(&self.cpus));
        // SAFETY: only sched_setaffinity and setpriority between fork and
        // exec, both async-signal-safe; natrix and its threads inherit the
        // CPU mask and the nice value (the tester's, see sys::NICE).
        unsafe {
            cmd.pre_exec(move || {
                if let Some(set) = pinned {
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                }
                libc::setpriority(libc::PRIO_PROCESS, 0, natrix_tester::sys::NICE);
                Ok(())
            })
        };
        let logged_before = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        self.child = Some(cmd.spawn().map_err(|e| TestError::Dut(format!("cannot start natrix: {e}")))?);
        self.wait_ready(logged_before)?;
        self.no_napi_threads = match super::lab::links_run_native_xdp() {
            Some(native) => !native,
            None => {
                eprintln!("natrix test: could not tell how natrix's XDP programs run (`ip -d link show` in nx-nat failed): taken as native, with NAPI threads");
                false
            }
        };
        if !self.cpus.is_empty() && !self.no_napi_threads {
            for failure in super::lab::napi_on_cpus(&self.cpus) {
                eprintln!("natrix test: {failure}");
            }
        }
        Ok(())
    }

    /// natrix's links' receive work (running its XDP programs, copying
    /// frames into the UMEM): its NAPI threads' time, or where its links
    /// have none, the time its CPUs were busy outside its process, since
    /// softirq runs that work wherever it lands, from idle too, and
    /// charges the process only when it interrupts it (`process_ns`, read
    /// only then). None where natrix has no CPUs of its own to tell that
    /// time apart.
    fn receive_work_ns(&self, process_ns: impl FnOnce() -> Option<u64>) -> Option<u64> {
        if !self.no_napi_threads {
            return Some(napi_ns());
        }
        if self.cpus.is_empty() {
            return None;
        }
        Some(busy_outside(cpu_busy_ns(&self.cpus)?, process_ns()?))
    }

    fn process_ns(&self) -> Option<u64> {
        process_cpu_ns(self.child.as_ref()?.id())
    }

    /// Waits for natrix's `ready` line in the log, after `offset`.
    fn wait_ready(&mut self, offset: u64) -> Result<(), TestError> {
        let started = Instant::now();
        while started.elapsed() < READY_TIMEOUT {
            let said = self.log_since(offset);
            // Its own line: "already in use" must not pass for it.
            if said.lines().any(|l| l.contains("natrix: ready:")) {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(TestError::Dut(format!("natrix exited ({status}) before it was ready:\n{}", tail(&said))));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(TestError::Dut(format!("natrix printed no \"ready\" within {} s:\n{}", READY_TIMEOUT.as_secs(), tail(&self.log_since(offset)))))
    }

    fn log_since(&self, offset: u64) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let mut all = Vec::new();
            let _ = f.read_to_end(&mut all);
            s = String::from_utf8_lossy(all.get(offset as usize..).unwrap_or_default()).into_owned();
        }
        s
    }

    /// SIGTERM, and SIGKILL if it does not exit in time.
    fn stop(&mut self) -> Result<(), TestError> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        if child.try_wait().ok().flatten().is_some() {
            return Err(TestError::Dut("natrix had exited during the test".into()));
        }
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(TestError::Dut(format!("natrix did not stop within {} s of SIGTERM", STOP_GRACE.as_secs())))
    }
}

impl Dut for Natrix {
    fn reset(&mut self) -> Result<(), TestError> {
        self.stop()?;
        self.launch()
    }

    /// Clears every subscriber's sessions through the management API
    /// (`POST /api/clear`), from inside nx-nat where it listens.
    fn delete_all(&mut self) -> Result<Duration, TestError> {
        let subscribers = self.subscribers.clone();
        let cleared = in_netns(NAT_NS, || {
            let started = Instant::now();
            for sub in &subscribers {
                clear(*sub)?;
            }
            Ok::<_, TestError>(started.elapsed())
        });
        cleared.map_err(|e| TestError::Dut(format!("entering {NAT_NS}: {e}")))?
    }

    /// natrix's process, all threads: its NAT work and, in system time,
    /// the kernel sending its frames on; and its links' receive work
    /// (`receive_work_ns`), which RPS puts on the kernel's CPUs for the
    /// kernel's run.
    fn cpu_ns(&self) -> Option<u64> {
        let process = self.process_ns()?;
        Some(process + self.receive_work_ns(|| Some(process))?)
    }

    /// natrix's workers poll on for 50 µs after a frame where frames come
    /// faster than 100 kpps, so their CPU time is then all of their CPUs. Their
    /// work is the CPU time of the rounds that carried frames
    /// (`natrix_worker_busy_seconds_total`), and its links' receive work.
    fn work_ns(&self) -> Option<u64> {
        let busy = in_netns(NAT_NS, busy_ns).ok()??;
        Some(busy + self.receive_work_ns(|| self.process_ns())?)
    }

    /// Where natrix's links have no NAPI threads, their receive work is
    /// its CPUs' busy time outside its process: other tenants' time there
    /// is in it, as in the kernel's figure.
    fn shared_ns(&self) -> Option<u64> {
        if self.no_napi_threads {
            self.receive_work_ns(|| self.process_ns())
        } else {
            None
        }
    }
}

/// The busy time of natrix's CPUs that its process did not spend: its
/// threads run only there, so the rest is other work on those CPUs.
fn busy_outside(cpus_busy_ns: u64, process_ns: u64) -> u64 {
    cpus_busy_ns.saturating_sub(process_ns)
}

/// CPU time of the NAPI threads of natrix's links (see `lab::napi_on_cpus`).
fn napi_ns() -> u64 {
    super::lab::napi_threads().into_iter().filter_map(|pid| process_cpu_ns(pid as u32)).sum()
}

/// The workers' busy time so far, from natrix's metrics.
fn busy_ns() -> Option<u64> {
    let answer = ask_api("GET /metrics", Duration::from_secs(5)).ok()?;
    Some((busy_seconds(&answer)? * 1e9) as u64)
}

/// One request to natrix's management API, `request` its method and
/// path; the whole answer, headers included.
fn ask_api(request: &str, timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect(API)?;
    s.set_read_timeout(Some(timeout))?;
    write!(s, "{request} HTTP/1.1\r\nHost: {API}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The sum of `natrix_worker_busy_seconds_total` over the workers.
fn busy_seconds(metrics: &str) -> Option<f64> {
    let samples: Vec<f64> = metrics.lines().filter(|l| l.starts_with("natrix_worker_busy_seconds_total{")).filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

impl Drop for Natrix {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// One `POST /api/clear?subscriber=A`, answered 200.
fn clear(sub: Ipv4Addr) -> Result<(), TestError> {
    let answer = ask_api(&format!("POST /api/clear?subscriber={sub}"), Duration::from_secs(30)).map_err(|e| TestError::Dut(format!("natrix's management API at {API}: {e}")))?;
    match answer.split_whitespace().nth(1) {
        Some("200") => Ok(()),
        _ => Err(TestError::Dut(format!("clearing {sub}: {}", answer.lines().next().unwrap_or("no answer")))),
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(8)..].iter().map(|l| format!("    natrix: {l}")).collect::<Vec<_>>().join("\n")
}

fn dut_error(path: &Path, e: std::io::Error) -> TestError {
    TestError::Dut(format!("{}: {e}", path.display()))
}

/// The kernel's nftables masquerade in nx-nat; its table is conntrack's.
pub struct Kernel {
    /// A ctnetlink socket opened inside nx-nat.
    netlink: OwnedFd,
    /// The CPUs its forwarding is steered to; empty: all of them.
    cpus: Vec<usize>,
}

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

impl Kernel {
    pub fn open(cpus: Vec<usize>) -> Result<Kernel, TestError> {
        let socket = || {
            // SAFETY: plain socket creation.
            let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: fd is fresh and ours alone.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        };
        let netlink = in_netns(NAT_NS, socket).and_then(|r| r).map_err(|e| TestError::Dut(format!("a ctnetlink socket in {NAT_NS}: {e}")))?;
        Ok(Kernel { netlink, cpus })
    }

    /// Deletes every IPv4 conntrack entry of nx-nat: IPCTNL_MSG_CT_DELETE
    /// with no tuple, acknowledged once the kernel has removed them all.
    fn flush(&self) -> Result<(), TestError> {
        let mut msg = Vec::with_capacity(20);
        msg.extend_from_slice(&20u32.to_ne_bytes());
        msg.extend_from_slice(&(NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE).to_ne_bytes());
        msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
        msg.extend_from_slice(&1u32.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0]);
        let fd = self.netlink.as_raw_fd();
        // SAFETY: msg is a live buffer of the length given.
        if unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) } < 0 {
            return Err(TestError::Dut(format!("flushing conntrack: {}", std::io::Error::last_os_error())));
        }
        let mut answer = [0u8; 256];
        // SAFETY: answer is a live buffer of the length given.
        let n = unsafe { libc::recv(fd, answer.as_mut_ptr().cast(), answer.len(), 0) };
        if n < 20 {
            return Err(TestError::Dut(format!("flushing conntrack: no answer ({})", std::io::Error::last_os_error())));
        }
        // NLMSG_ERROR carries the request's result: 0 is success.
        let kind = u16::from_ne_bytes([answer[4], answer[5]]);
        let error = i32::from_ne_bytes([answer[16], answer[17], answer[18], answer[19]]);
        if kind != libc::NLMSG_ERROR as u16 || error != 0 {
            return Err(TestError::Dut(format!("flushing conntrack: {}", std::io::Error::from_raw_os_error(-error))));
        }
        Ok(())
    }
}

impl Dut for Kernel {
    fn reset(&mut self) -> Result<(), TestError> {
        self.flush()
    }

    fn delete_all(&mut self) -> Result<Duration, TestError> {
        let started = Instant::now();
        self.flush()?;
        Ok(started.elapsed())
    }

    /// The kernel forwards in softirq context, on an interrupt's way out,
    /// in ksoftirqd once it is loaded or in NAPI threads: with the NAT's
    /// receive steered to the device's CPUs (RPS, see `lab`) and what it
    /// sends steered off them, their busy time (`cpu_busy_ns`) is the
    /// kernel's forwarding, NAT and sending on, wherever it ran. Without
    /// CPUs of its own, the machine's softirq time.
    fn cpu_ns(&self) -> Option<u64> {
        if self.cpus.is_empty() {
            return softirq_ns();
        }
        cpu_busy_ns(&self.cpus)
    }

    fn shared_ns(&self) -> Option<u64> {
        self.cpu_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_seconds_add_up_every_worker() {
        let metrics = "# TYPE natrix_worker_busy_seconds_total counter\nnatrix_worker_busy_seconds_total{worker=\"0\"} 1.5\nnatrix_worker_busy_seconds_total{worker=\"1\"} 0.25\nnatrix_worker_packets_total{worker=\"0\"} 7\n";
        assert_eq!(busy_seconds(metrics), Some(1.75));
        assert_eq!(busy_seconds("natrix_worker_packets_total{worker=\"0\"} 7\n"), None);
    }
}
