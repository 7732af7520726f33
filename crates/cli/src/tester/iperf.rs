//! TCP bulk throughput through the device, measured by a real third-party
//! program: iperf3 from nx-sub1 to nx-srv1 with the hosts' own kernel
//! stacks (offloads off, as the lab sets them). It runs before the
//! tester's ports open, since those take every frame of both hosts.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use natrix_tester::report::{object, Criterion, Line};
use serde_json::{json, Value};

use crate::Failure;

const CLIENT_NS: &str = "nx-sub1";
const SERVER_NS: &str = "nx-srv1";
const SERVER: &str = "198.51.100.11";
const PORT: &str = "5201";
const LISTEN_TIMEOUT: Duration = Duration::from_secs(5);

/// One iperf3 run of `seconds`, as a `tcp_throughput` result line.
pub fn tcp_throughput(dut: &str, seconds: u32) -> Result<Line, Failure> {
    let mut server = Server::start()?;
    server.wait_listening()?;
    let secs = seconds.to_string();
    let timeout = (seconds + 20).to_string();
    let out = Command::new("ip")
        .args(["netns", "exec", CLIENT_NS, "timeout", &timeout, "iperf3", "-c", SERVER, "-p", PORT, "-t", &secs, "-J", "--connect-timeout", "3000"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Failure::Other(format!("iperf3: {e} (apt-get install iperf3)")))?;
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|_| Failure::Other(format!("iperf3 printed no result: {}", String::from_utf8_lossy(&out.stderr).trim())))?;
    if let Some(e) = v["error"].as_str() {
        return Err(Failure::Other(format!("iperf3: {e}")));
    }
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().ok_or_else(|| Failure::Other("iperf3 reported no received throughput".into()))?;
    let retransmits = v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    let result = object([("gbps", json!(bps / 1e9)), ("retransmits", json!(retransmits)), ("seconds", json!(seconds))]);
    Ok(Line { test: "tcp_throughput", dut: dut.to_owned(), frame_size: 1518, flows: 1, criterion: Criterion::Zero, method: "iperf3", result, generator_limited: false })
}

/// `iperf3 -s -1` in nx-srv1: it serves one test and exits; ended on drop otherwise.
struct Server(Child);

impl Server {
    fn start() -> Result<Server, Failure> {
        let child = Command::new("ip")
            .args(["netns", "exec", SERVER_NS, "iperf3", "-s", "-1", "-B", SERVER, "-p", PORT])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Failure::Other(format!("iperf3: {e} (apt-get install iperf3)")))?;
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
