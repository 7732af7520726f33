//! TCP bulk throughput through the device, measured by a real third-party
//! program: iperf3 from nx-sub1 to nx-srv1 with the hosts' own kernel
//! stacks (offloads off, as the lab sets them). It runs before the
//! tester's ports open, since those take every frame of both hosts.
//! Beside the throughput: the device's CPU time per frame, whether the
//! lab's CPUs were the limit instead, and the frames dropped at the
//! device's edges (which TCP retransmits).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use natrix_tester::report::{object, Criterion, Line};
use serde_json::{json, Map, Value};

use super::cputime::{threads_named, ThreadTime};
use super::lab::{cpu_set, EdgeDrops, IperfCpus, QueueFrames};
use super::tcp_meter::{CpuShares, Meter};
use crate::Failure;

const CLIENT_NS: &str = "nx-sub1";
const SERVER_NS: &str = "nx-srv1";
const SERVER: &str = "198.51.100.11";
const BASE_PORT: u16 = 5201;
const LISTEN_TIMEOUT: Duration = Duration::from_secs(5);

/// One TCP run of `seconds`, as a `tcp_throughput` result line: an
/// iperf3 transfer for each of `streams` (where each pair runs), at once,
/// with the device on `device_cpus` (none: it shares the tester's); its
/// CPU time per frame it forwarded, and whether the lab's CPUs rather
/// than the device's set the limit (`generator_limited`, see `tcp_meter`),
/// as they do where the host has too few to give iperf3's hosts CPUs of
/// their own.
pub fn tcp_throughput(dut: &str, seconds: u32, device_cpus: &[usize], streams: &[IperfCpus]) -> Result<Line, Failure> {
    let mut servers = Vec::with_capacity(streams.len());
    for (i, cpus) in streams.iter().enumerate() {
        let (mut server, cpu) = Server::start(port(i), cpus.server)?;
        server.wait_listening()?;
        servers.push((server, cpu));
    }
    let drops_before = EdgeDrops::read();
    let queues_before = QueueFrames::read();
    let threads_before = threads_named(&WATCHED_THREADS);
    let threads_from = Instant::now();
    let meter = Meter::start();
    // A client that fails ends those started before it (`Client`'s drop).
    let clients = streams.iter().enumerate().map(|(i, cpus)| Client::start(port(i), seconds, cpus.client)).collect::<Result<Vec<_>, _>>()?;
    let finished = clients.into_iter().map(Client::finish).collect::<Result<Vec<_>, _>>()?;
    let run_ns = threads_from.elapsed().as_nanos().max(1) as f64;
    let threads = thread_shares(&threads_before, &threads_named(&WATCHED_THREADS), run_ns);
    let cpu = meter.and_then(|m| m.finish(device_cpus));
    let dropped = drops_before.zip(EdgeDrops::read()).map(|(before, after)| after.since(&before));
    let by_queue = queues_before.zip(QueueFrames::read()).and_then(|(before, after)| after.since(&before));
    let (mut bps, mut retransmits, mut each) = (0.0, 0, Vec::with_capacity(finished.len()));
    for ((out, client_cpu), (server, server_cpu)) in finished.iter().zip(&servers) {
        let (stream_bps, stream_retransmits) = received(out, &server.port)?;
        bps += stream_bps;
        retransmits += stream_retransmits;
        each.push(json!({"gbps": stream_bps / 1e9, "retransmits": stream_retransmits, "server_cpu": server_cpu, "client_cpu": client_cpu}));
    }
    let first_pair = servers.first().zip(finished.first()).map_or(Value::Null, |((_, server), (_, client))| json!({"server": server, "client": client}));
    let mut result =
        object([("gbps", json!(bps / 1e9)), ("retransmits", json!(retransmits)), ("seconds", json!(seconds)), ("iperf3_cpus", first_pair), ("streams", Value::Array(each))]);
    if let Some(c) = &cpu {
        result.extend(cost(c));
    }
    if let Some(d) = dropped {
        result.insert("dropped".into(), json!({"into_device": d.into_device, "out_of_device": d.out_of_device}));
    }
    if let Some(links) = by_queue {
        result.insert("frames_by_queue".into(), links.into_iter().map(|(dev, frames)| (dev.to_owned(), json!(frames))).collect::<Map<_, _>>().into());
    }
    result.insert("threads".into(), threads);
    let generator_limited = cpu.is_some_and(|c| c.lab_was_the_limit());
    Ok(Line { test: "tcp_throughput", dut: dut.to_owned(), frame_size: 1518, flows: streams.len() as u64, criterion: Criterion::Zero, method: "iperf3", result, generator_limited })
}

/// The threads whose CPU a TCP result shows: every NAPI thread (the
/// device's links', the switch's) and natrix's workers.
const WATCHED_THREADS: [&str; 2] = ["napi/", "natrix-w"];

/// Each thread seen at both ends of a run of `run_ns` (by id and name):
/// its name, the CPU it last ran on, the share of the run it was running
/// and the share it waited to run, which tells a thread starved behind
/// another on its CPU from one that idled.
fn thread_shares(before: &[ThreadTime], after: &[ThreadTime], run_ns: f64) -> Value {
    let share = |ns: u64| (ns as f64 / run_ns * 1000.0).round() / 1000.0;
    let shares = after.iter().filter_map(|t| {
        let earlier = before.iter().find(|b| b.tid == t.tid && b.name == t.name)?;
        let waiting = t.wait_ns.zip(earlier.wait_ns).map(|(now, then)| share(now.saturating_sub(then)));
        Some(json!({"name": t.name, "cpu": t.last_cpu, "busy": share(t.cpu_ns.saturating_sub(earlier.cpu_ns)), "waiting": waiting}))
    });
    Value::Array(shares.collect())
}

/// The port of stream `i`'s server: iperf3's own, then the ports after it.
fn port(i: usize) -> String {
    (BASE_PORT + i as u16).to_string()
}

/// The bits per second the server on `port` received and the segments
/// the client retransmitted, from the client's JSON report.
fn received(out: &Output, port: &str) -> Result<(f64, u64), Failure> {
    let v: Value =
        serde_json::from_slice(&out.stdout).map_err(|_| Failure::Other(format!("iperf3 to port {port} printed no result: {}", String::from_utf8_lossy(&out.stderr).trim())))?;
    if let Some(e) = v["error"].as_str() {
        return Err(Failure::Other(format!("iperf3 to port {port}: {e}")));
    }
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().ok_or_else(|| Failure::Other(format!("iperf3 to port {port} reported no received throughput")))?;
    Ok((bps, v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0)))
}

/// The result's fields of what the run cost (README, "Measuring", `tcp`).
fn cost(c: &CpuShares) -> Map<String, Value> {
    object([
        ("measured_s", json!(c.ns as f64 / 1e9)),
        ("frames", json!(c.frames)),
        ("dut_ns_per_frame", json!(c.dut_ns_per_frame)),
        ("dut_cpu_busy", json!(c.dut_busy)),
        ("dut_cpu_busy_max", json!(c.dut_busy_max)),
        ("lab_cpu_busy", json!(c.lab_busy)),
        ("lab_busiest_cpu", json!(c.lab_cpu)),
    ])
}

/// An iperf3 client in nx-sub1, running: ended (SIGTERM, which `timeout`
/// passes on to iperf3) and reaped on drop unless finished.
struct Client {
    child: Option<Child>,
    cpu: Option<usize>,
    port: String,
}

impl Client {
    /// A transfer of `seconds` to the server on `port`, on `cpu` if given
    /// (see `spawn_on`).
    fn start(port: String, seconds: u32, cpu: Option<usize>) -> Result<Client, Failure> {
        let secs = seconds.to_string();
        let timeout = (seconds + 20).to_string();
        let command = || {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", CLIENT_NS, "timeout", &timeout, "iperf3", "-c", SERVER, "-p", &port, "-t", &secs, "-J", "--connect-timeout", "3000"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd
        };
        let (child, cpu) = spawn_on(command, cpu, "client")?;
        Ok(Client { child: Some(child), cpu, port })
    }

    /// Its output once it ends, and the CPU it ran on.
    fn finish(mut self) -> Result<(Output, Option<usize>), Failure> {
        let Some(child) = self.child.take() else { return Err(Failure::Other(format!("iperf3 to port {}: finished twice", self.port))) };
        let out = child.wait_with_output().map_err(|e| Failure::Other(format!("iperf3 to port {}: {e}", self.port)))?;
        Ok((out, self.cpu))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                // SAFETY: kill has no memory preconditions; the pid is our
                // own child's, not yet reaped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
            let _ = child.wait();
        }
    }
}

/// Starts what `command` builds on `cpu`, where given and allowed (a
/// cpuset may leave it out: then, said on stderr, where the tester runs).
/// The child, and the CPU it runs on where it is one.
fn spawn_on(command: impl Fn() -> Command, cpu: Option<usize>, role: &str) -> Result<(Child, Option<usize>), Failure> {
    let spawned = |mut cmd: Command| cmd.spawn().map_err(|e| Failure::Other(format!("iperf3: {e} (apt-get install iperf3)")));
    if let Some(cpu) = cpu {
        let mut cmd = command();
        let set = cpu_set(&[cpu]);
        // SAFETY: only sched_setaffinity, async-signal-safe, between fork
        // and exec; set is a live cpu_set_t of the size given.
        unsafe {
            cmd.pre_exec(move || match libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            })
        };
        match cmd.spawn() {
            Ok(child) => return Ok((child, Some(cpu))),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => eprintln!("natrix test: iperf3's {role} cannot run on CPU {cpu} ({e}); it runs where the tester does"),
            Err(e) => return Err(Failure::Other(format!("iperf3: {e}"))),
        }
    }
    Ok((spawned(command())?, own_cpu()))
}

/// The CPU this thread is pinned to, if it is pinned to one.
fn own_cpu() -> Option<usize> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a cpu_set_t of the size given; 0 is this thread.
    if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads inside set for indices below CPU_SETSIZE.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect();
    match cpus[..] {
        [one] => Some(one),
        _ => None,
    }
}

/// `iperf3 -s -1` in nx-srv1: it serves one test and exits; ended on drop otherwise.
struct Server {
    child: Child,
    port: String,
}

impl Server {
    /// The server on `port`, and the CPU it runs on (see `spawn_on`).
    fn start(port: String, cpu: Option<usize>) -> Result<(Server, Option<usize>), Failure> {
        let command = || {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", SERVER_NS, "iperf3", "-s", "-1", "-B", SERVER, "-p", &port]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
            cmd
        };
        let (child, cpu) = spawn_on(command, cpu, "server")?;
        Ok((Server { child, port }, cpu))
    }

    fn wait_listening(&mut self) -> Result<(), Failure> {
        let started = Instant::now();
        while started.elapsed() < LISTEN_TIMEOUT {
            let ss = Command::new("ip").args(["netns", "exec", SERVER_NS, "ss", "-Hltn", &format!("sport = :{}", self.port)]).output();
            if ss.is_ok_and(|o| !o.stdout.trim_ascii().is_empty()) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Failure::Other(format!("the iperf3 server on port {} exited ({status})", self.port)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Failure::Other(format!("the iperf3 server on port {} did not listen within {} s", self.port, LISTEN_TIMEOUT.as_secs())))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
