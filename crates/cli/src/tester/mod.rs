//! `natrix test`: RFC 9693's benchmarks of a stateful NAT (with RFC 2544's
//! throughput and frame loss, RFC 8219's latency and PDV) and seed 002's
//! goodput, RTT and jitter, against natrix or the kernel's nftables NAT in
//! the namespace lab. The procedures are in the natrix-tester crate; this
//! module builds the lab, starts and resets the device, runs the tests in
//! order and writes what they found.

mod cputime;
mod dut;
mod iperf;
mod lab;
mod output;
mod tcp_meter;
mod testbed;

use std::path::{Path, PathBuf};

use natrix_tester::engine::Tester;
use natrix_tester::ports::Io;
use natrix_tester::procedure::{self as p, Results, Settings, TestError};
use natrix_tester::report::{object, Criterion, Line};
use natrix_tester::search::CapacitySearch;
use natrix_tester::seed002::LADDER;
use natrix_tester::sys::{exact_timers, now_ns, pin_current_thread, raise_priority};
use serde_json::json;

use crate::Failure;
use lab::{Kind, Lab, LabOptions, SwitchNapi};
use output::{Output, PlotData};
use testbed::{interrupted, LabBed, SwitchBed};

/// Latency is measured at the throughput rate (RFC 8219), but at most at
/// this share of the generator's ceiling.
const LATENCY_HEADROOM: f64 = 0.9;

/// Every test, in the order they run.
const TESTS: [&str; 11] = ["generator", "tcp", "connection_rate", "teardown_rate", "table_capacity", "throughput", "frame_loss", "latency", "goodput", "syn_flood", "cpu"];

#[derive(clap::Args)]
pub struct Args {
    /// The NAT to measure: natrix, kernel, or both one after the other (natrix,kernel).
    #[arg(long, value_delimiter = ',', required = true, value_parser = ["natrix", "kernel"])]
    dut: Vec<String>,
    /// One JSON object per result line on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// The short profile (under a minute; for CI): few connections, short trials, coarse searches.
    #[arg(long)]
    quick: bool,
    /// Tests to run, of: generator, tcp (iperf3), connection_rate, teardown_rate, table_capacity, throughput,
    /// frame_loss, latency (with PDV), goodput (seed 002), syn_flood (seed 003), cpu. Default: all.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    tests: Vec<String>,
    /// Frame sizes of the throughput, frame loss and latency tests, FCS included (RFC 2544).
    #[arg(long, value_delimiter = ',', value_name = "BYTES")]
    sizes: Vec<usize>,
    /// Connections of the real test phase (RFC 9693's N).
    #[arg(long, value_name = "N")]
    flows: Option<u32>,
    /// The largest table the capacity search tries.
    #[arg(long, value_name = "N")]
    max_flows: Option<u64>,
    /// Seconds of each throughput and frame loss trial.
    #[arg(long, value_name = "S")]
    trial_seconds: Option<f64>,
    /// Seconds of the latency and PDV trial.
    #[arg(long, value_name = "S")]
    latency_seconds: Option<f64>,
    /// The highest rate searches try (default: the generator's ceiling, measured first).
    #[arg(long, value_name = "PPS")]
    max_rate: Option<f64>,
    /// Rate of the preliminary phases that fill the table before a test.
    #[arg(long, value_name = "PPS")]
    fill_rate: Option<f64>,
    /// Loss the throughput may have: 0 (RFC 2544's zero loss) or a share such as 0.001.
    #[arg(long, default_value_t = 0.0, value_name = "SHARE")]
    loss: f64,
    /// Send the real test phase's frames both ways (RFC 2544 bidirectional).
    #[arg(long)]
    bidirectional: bool,
    /// Rate at which the CPU time per forwarded frame is measured.
    #[arg(long, value_name = "PPS")]
    cpu_rate: Option<f64>,
    /// SYNs per second of the syn_flood test (seed 003's synbomber; default 10,000).
    #[arg(long, value_name = "PPS")]
    syn_rate: Option<f64>,
    /// SYNs per burst of the syn_flood test (default 50: seed 003's 50 every 5 ms at 10,000 a second).
    #[arg(long, value_name = "N")]
    syn_burst: Option<u32>,
    /// natrix with its SYN accelerator (seed 003) on for the tester's server, 198.51.100.21:
    /// `[syn_accel] destinations` added to the lab's configuration.
    #[arg(long, conflicts_with = "config")]
    syn_accel: bool,
    /// natrix's `workers`. The device, natrix or the kernel, runs on as many CPUs after the tester's CPU 0 (the
    /// kernel's receive work steered there by RPS), where the host has them.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// natrix's `io`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "af_xdp", "af_packet"])]
    io: String,
    /// Where the switch receives what the device sends: in softirq on the CPU that sent it (the device's,
    /// veth's way), or in NAPI threads on the lab's CPUs, for hosts where the lab has CPUs of its own.
    #[arg(long, value_enum, default_value_t = SwitchNapi::Sender)]
    switch_napi: SwitchNapi,
    /// Receive queues of the device's two interfaces in a lab the tester builds (`natrix lab up --queues`):
    /// with as many as --workers, natrix runs per-queue workers, and the kernel gets each queue's receive
    /// work steered to the device's CPUs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    queues: u32,
    /// Parallel TCP transfers of the tcp test, each its own iperf3 client and server (each pair on lab CPUs of
    /// its own where the host has them): one flow uses one receive queue of the device, so per-queue workers
    /// share TCP only over several flows, which veth spreads over the queues by hash (two share one queue about
    /// half the time with two queues; `frames_by_queue` says how they fell, for natrix).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    tcp_streams: u32,
    /// Frames the switch's ports towards the device hold while its receive ring is full, in a lab the tester
    /// builds (`natrix lab up --port-buffer`); 0: none, veth's own way, which drops them.
    #[arg(long, value_name = "FRAMES", default_value_t = 0)]
    port_buffer: u32,
    /// The natrix executable to measure (default: this one), to compare builds under one tester.
    #[arg(long, value_name = "PATH")]
    natrix: Option<PathBuf>,
    /// The tester's own packet backend.
    #[arg(long, default_value = "auto", value_parser = ["auto", "af_xdp", "af_packet"])]
    tester_io: String,
    /// natrix's configuration, used as it is (default: the lab's, with per-subscriber limits lifted and the session
    /// table sized as the kernel's conntrack table).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where results.jsonl, the plots and side-by-side.md go.
    #[arg(long, value_name = "DIR", default_value = "out/natrix-test")]
    out: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// How long and how large: the default profile and --quick.
struct Profile {
    settings: Settings,
    sizes: Vec<usize>,
    generator_rates: Vec<f64>,
    generator_ns: u64,
    syn_rate: f64,
    syn_burst: u32,
    tcp_seconds: u32,
    /// Alternating rounds of the generator's and trafgen's ceilings.
    ceiling_rounds: u32,
}

impl Profile {
    fn new(args: &Args) -> Profile {
        let quick = args.quick;
        let flows = args.flows.unwrap_or(if quick { 256 } else { 10_000 });
        let max_flows = args.max_flows.unwrap_or(if quick { 1024 } else { 1 << 19 });
        let secs = |v: Option<f64>, full: f64, short: f64| (v.unwrap_or(if quick { short } else { full }) * 1e9) as u64;
        let settings = Settings {
            flows,
            trial_ns: secs(args.trial_seconds, 2.0, 0.25),
            latency_ns: secs(args.latency_seconds, 5.0, 0.5),
            goodput_ns: secs(None, 2.0, 0.1),
            // Replaced by the generator's measured ceiling unless given.
            max_rate: args.max_rate.unwrap_or(1e6),
            resolution: if quick { 1.0 / 8.0 } else { 1.0 / 64.0 },
            fill_rate: args.fill_rate.unwrap_or(if quick { 5_000.0 } else { 20_000.0 }),
            criterion: Criterion::from_fraction(args.loss),
            // RFC 9693 leaves beta and gamma to the tester (its authors'
            // script uses 0.2 and 0.4); 0.5 tries at most two rates for a
            // size past the capacity, where every rate fails, each trial
            // filling hundreds of thousands of connections.
            capacity: CapacitySearch { start: u64::from(flows), max: max_flows, precision: (max_flows / 64).max(1), beta: 0.5, gamma: 0.5 },
            bidirectional: args.bidirectional,
            drain_ns: if quick { 200_000_000 } else { 500_000_000 },
            teardown_repeats: if quick { 1 } else { 3 },
            cpu_rate: args.cpu_rate.unwrap_or(if quick { 5_000.0 } else { 50_000.0 }),
            cpu_ns: if quick { 500_000_000 } else { 5_000_000_000 },
            seed: args.seed,
        };
        let sizes = if !args.sizes.is_empty() {
            args.sizes.clone()
        } else if quick {
            vec![64]
        } else {
            vec![64, 128, 1518]
        };
        let generator_rates = if quick { vec![10_000.0, f64::INFINITY] } else { vec![1_000.0, 10_000.0, 100_000.0, 200_000.0, 300_000.0, f64::INFINITY] };
        Profile {
            settings,
            sizes,
            generator_rates,
            generator_ns: if quick { 300_000_000 } else { 2_000_000_000 },
            syn_rate: args.syn_rate.unwrap_or(if quick { 5_000.0 } else { 10_000.0 }),
            syn_burst: args.syn_burst.unwrap_or(if quick { 8 } else { 50 }),
            tcp_seconds: if quick { 1 } else { 5 },
            ceiling_rounds: if quick { 1 } else { 3 },
        }
    }
}

pub fn run(args: &Args) -> Result<(), Failure> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::Other("natrix test must run as root: it builds network namespaces and opens packet sockets (try sudo)".into()));
    }
    let tests = selected_tests(args)?;
    for size in &args.sizes {
        if !(natrix_tester::frame::MIN_FRAME_SIZE..=natrix_tester::frame::MAX_FRAME_SIZE).contains(size) {
            return Err(Failure::Usage(format!("--sizes {size}: frames are 64 to 1518 bytes (RFC 2544 sizes, FCS included)")));
        }
    }
    let exe = std::env::current_exe().map_err(|e| Failure::Other(format!("cannot find the natrix executable: {e}")))?;
    let mut profile = Profile::new(args);
    check_connections(&profile.settings, lab::flow_space().capacity())?;
    let kinds: Vec<Kind> = args.dut.iter().map(|name| if name == "kernel" { Kind::Kernel } else { Kind::Natrix }).collect();
    lab::check_existing_lab(&kinds)?;
    std::fs::create_dir_all(&args.out).map_err(|e| Failure::Other(format!("{}: {e}", args.out.display())))?;
    let workdir = WorkDir::create()?;
    let natrix_log = args.out.join("natrix.log");
    let _ = std::fs::remove_file(&natrix_log);
    testbed::catch_interrupts();
    exact_timers();
    // The tester's loop runs on CPU 0, the device on the CPUs after it
    // (`lab::dut_cpus`), both ahead of the ordinary work of a shared machine.
    let _ = pin_current_thread(0);
    let _ = raise_priority();
    let mut out = Output::create(args.json, &args.out)?;
    let mut plots = PlotData::default();
    let mut failures = 0;
    for (i, &kind) in kinds.iter().enumerate() {
        eprintln!("natrix test: {}: preparing the lab", kind.name());
        let lab = Lab::prepare(
            kind,
            &exe,
            &LabOptions { workers: args.workers, switch_napi: args.switch_napi, queues: args.queues, port_buffer: args.port_buffer, io: &args.io, workdir: &workdir.0 },
        )?;
        if i == 0 && (tests.contains(&"generator") || args.max_rate.is_none()) {
            let ceiling = generator_tests(&lab, &profile, tests.contains(&"generator"), args, &workdir.0, &mut out)?;
            if args.max_rate.is_none() {
                profile.settings.max_rate = ceiling;
            }
        }
        let dut = start_dut(&lab, kind, args, args.natrix.as_deref().unwrap_or(&exe), &workdir.0, &natrix_log)?;
        if tests.contains(&"tcp") {
            match iperf::tcp_throughput(kind.name(), profile.tcp_seconds, &lab::dut_cpus(args.workers), &lab::iperf_cpus(args.workers, args.tcp_streams)) {
                Ok(line) => out.emit(line),
                Err(e) => {
                    failures += 1;
                    eprintln!("natrix test: {}: tcp failed: {e}", kind.name());
                }
            }
        }
        let bed = open_bed(&lab, kind, args, dut)?;
        failures += run_tests(bed, &profile, &tests, &mut out, &mut plots);
        drop(lab);
        if interrupted() {
            return Err(Failure::Other("interrupted; the lab is removed".into()));
        }
    }
    finish(args, &out, &plots)?;
    if failures > 0 {
        return Err(Failure::Other(format!("{failures} test(s) could not finish (see above)")));
    }
    Ok(())
}

/// The connections asked for must be distinct 4-tuples of the lab's
/// restricted port space (RFC 9693 section 4): past its size the tuples
/// repeat, and the device would hold fewer connections than counted.
fn check_connections(s: &Settings, space: u64) -> Result<(), Failure> {
    if s.flows == 0 {
        return Err(Failure::Usage("--flows must be at least 1".into()));
    }
    for (what, n) in [("--flows", u64::from(s.flows)), ("--max-flows", s.capacity.max)] {
        if n > space {
            return Err(Failure::Usage(format!("{what} {n}: the tester's port space holds {space} distinct connections")));
        }
    }
    Ok(())
}

fn selected_tests(args: &Args) -> Result<Vec<&'static str>, Failure> {
    if args.tests.is_empty() {
        return Ok(TESTS.to_vec());
    }
    let mut chosen = Vec::new();
    for t in &args.tests {
        let known = TESTS.iter().find(|k| **k == t.as_str() || (t == "pdv" && **k == "latency"));
        match known {
            Some(k) => chosen.push(*k),
            None => return Err(Failure::Usage(format!("--tests: no test {t:?}; the tests are {}", TESTS.join(", ")))),
        }
    }
    // Run in the standard order, whatever order they were named in.
    Ok(TESTS.into_iter().filter(|k| chosen.contains(k)).collect())
}

/// A scratch directory for configurations and logs, removed at the end.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> Result<WorkDir, Failure> {
        let dir = std::env::temp_dir().join(format!("natrix-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Failure::Other(format!("{}: {e}", dir.display())))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tester_io(args: &Args) -> Io {
    match args.tester_io.as_str() {
        "af_xdp" => Io::AfXdp,
        "af_packet" => Io::AfPacket,
        _ => Io::Auto,
    }
}

/// Where the tester's ports go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Around the device: nx-sub1 and nx-srv1.
    Device,
    /// nx-sub1 to nx-sub2 across the switch, receiving there.
    Switch,
    /// nx-sub1 sending across the switch, nothing receiving.
    SendOnly,
}

fn open_tester(lab: &Lab, args: &Args, placement: Placement) -> Result<Tester, Failure> {
    let mut notes = Vec::new();
    let io = tester_io(args);
    let t = match placement {
        Placement::Device => lab.tester(io, &mut notes),
        Placement::Switch => lab.switch_tester(io, true, &mut notes),
        Placement::SendOnly => lab.switch_tester(io, false, &mut notes),
    }?;
    for n in notes {
        eprintln!("natrix test: {n}");
    }
    Ok(t)
}

/// The device, started (natrix) or reached (the kernel's conntrack).
fn start_dut(lab: &Lab, kind: Kind, args: &Args, exe: &Path, workdir: &Path, log: &Path) -> Result<Box<dyn dut::Dut>, Failure> {
    Ok(match kind {
        Kind::Kernel => Box::new(dut::Kernel::open(lab::dut_cpus(args.workers)).map_err(|e| Failure::Other(e.to_string()))?),
        Kind::Natrix => {
            let config = natrix_config(lab, args, workdir)?;
            Box::new(dut::Natrix::start(exe, &config, log, lab::dut_cpus(args.workers), lab::subscribers()).map_err(|e| Failure::Other(e.to_string()))?)
        }
    })
}

/// The device in the lab with the tester around it.
fn open_bed(lab: &Lab, kind: Kind, args: &Args, dut: Box<dyn dut::Dut>) -> Result<LabBed, Failure> {
    let tester = open_tester(lab, args, Placement::Device)?;
    let (a, b) = tester.backends();
    eprintln!("natrix test: {}: tester ports {a} (subscribers) and {b} (server)", kind.name());
    Ok(LabBed { tester, dut, name: kind.name() })
}

/// natrix's configuration for the tests: --config as it is, or the lab's
/// with the limits that would cap the tests before the table does lifted:
/// ports and sessions per subscriber (the tester's 16 subscribers hold
/// every connection), and `max_sessions` set to the kernel's conntrack
/// table size, so both devices have tables of the same size.
fn natrix_config(lab: &Lab, args: &Args, workdir: &Path) -> Result<PathBuf, Failure> {
    if let Some(c) = &args.config {
        return Ok(c.clone());
    }
    let base = lab.natrix_config.as_ref().ok_or_else(|| Failure::Other("the lab has no natrix configuration: pass --config".into()))?;
    let text = std::fs::read_to_string(base).map_err(|e| Failure::Other(format!("{}: {e} (pass --config)", base.display())))?;
    let mut cfg: toml::Table = text.parse().map_err(|e| Failure::Config(format!("{}: {e}", base.display())))?;
    // A lab left up may have been built for other workers: the device's
    // CPUs are sized by --workers (`lab::dut_cpus`), so natrix runs as many.
    cfg.insert("workers".into(), toml::Value::Integer(i64::from(args.workers)));
    let conntrack_max: i64 = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(262_144);
    let nat = cfg.entry("nat").or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(nat) = nat.as_table_mut() {
        nat.insert("max_ports_per_subscriber".into(), toml::Value::Integer(64_512));
        nat.insert("max_sessions_per_subscriber".into(), toml::Value::Integer(conntrack_max.max(1 << 20)));
        nat.insert("max_sessions".into(), toml::Value::Integer(conntrack_max));
    }
    if args.syn_accel {
        let server = format!("{}/32", lab::SERVER);
        let mut accel = toml::Table::new();
        accel.insert("destinations".into(), toml::Value::Array(vec![toml::Value::String(server)]));
        cfg.insert("syn_accel".into(), toml::Value::Table(accel));
    }
    let path = workdir.join("natrix-test.toml");
    std::fs::write(&path, toml::to_string(&cfg).map_err(|e| Failure::Other(e.to_string()))?).map_err(|e| Failure::Other(format!("{}: {e}", path.display())))?;
    natrix_control::Config::load(&path).map_err(|e| Failure::Config(format!("{}: {e}", path.display())))?;
    Ok(path)
}

/// The generator's own accuracy across the access switch (and trafgen's
/// ceiling beside it, when installed); returns the generator's ceiling.
fn generator_tests(lab: &Lab, profile: &Profile, report: bool, args: &Args, workdir: &Path, out: &mut Output) -> Result<f64, Failure> {
    let mut bed = SwitchBed { tester: open_tester(lab, args, Placement::Switch)? };
    let rates: Vec<f64> = if report { profile.generator_rates.clone() } else { vec![f64::INFINITY] };
    let mut ceiling = 0.0;
    for rate in rates {
        let line = p::generator_accuracy(&mut bed, &profile.settings, rate, profile.generator_ns).map_err(|e| Failure::Other(e.to_string()))?;
        if !rate.is_finite() {
            ceiling = line.result.get("sent_pps").and_then(|v| v.as_f64()).unwrap_or(0.0);
        }
        if report {
            out.emit(line);
        }
    }
    drop(bed);
    if report {
        // Sending alone against trafgen sending alone, in alternation.
        for _ in 0..profile.ceiling_rounds {
            let mut bed = SwitchBed { tester: open_tester(lab, args, Placement::SendOnly)? };
            let mut line = p::generator_accuracy(&mut bed, &profile.settings, f64::INFINITY, profile.generator_ns).map_err(|e| Failure::Other(e.to_string()))?;
            line.method = "natrix, sending only";
            out.emit(line);
            drop(bed);
            if let Some(line) = trafgen_ceiling(lab, profile, workdir)? {
                out.emit(line);
            }
        }
    }
    if ceiling <= 0.0 {
        return Err(Failure::Other("the generator sent nothing in its ceiling test".into()));
    }
    Ok(ceiling)
}

/// trafgen (netsniff-ng) at full speed on the same path, one process on
/// CPU 0, counted by nx-sub1's transmit counter: the comparator the
/// generator has to outrun.
fn trafgen_ceiling(lab: &Lab, profile: &Profile, workdir: &Path) -> Result<Option<Line>, Failure> {
    if std::process::Command::new("trafgen").arg("-v").output().is_err() {
        eprintln!("natrix test: trafgen is not installed (apt-get install netsniff-ng): no comparison with it");
        return Ok(None);
    }
    let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    let cfg = workdir.join("trafgen.cfg");
    let text = format!(
        "{{ eth(da={}, sa=02:00:00:00:00:01), ipv4(sa=100.64.1.1, da=198.51.100.21, ttl=64), udp(sp=drnd(1024, 65535), dp=drnd(5001, 5064)), fill(0, 18) }}\n",
        mac(lab.sub2_mac()?)
    );
    std::fs::write(&cfg, text).map_err(|e| Failure::Other(format!("{}: {e}", cfg.display())))?;
    let seconds = format!("{:.3}", profile.generator_ns as f64 / 1e9);
    let before = lab.sub1_tx_packets()?;
    let started = now_ns();
    // trafgen's defaults are its fastest: the qdisc bypassed, a TX ring.
    let run = std::process::Command::new("ip")
        .args(["netns", "exec", lab.sub1_ns(), "timeout", "-s", "INT", &seconds, "trafgen", "-i"])
        .arg(&cfg)
        .args(["-o", "eth0", "-P", "1", "--no-sock-mem", "-Q"])
        .current_dir(workdir)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| Failure::Other(format!("trafgen: {e}")))?;
    let wall = (now_ns() - started) as f64 / 1e9;
    let sent = lab.sub1_tx_packets()?.saturating_sub(before);
    if sent == 0 {
        eprintln!("natrix test: trafgen sent nothing ({}): no comparison with it", run.status);
        return Ok(None);
    }
    // Its own time on the CPU it sent from, without its start-up; the
    // wall clock when it does not say.
    let elapsed = trafgen_seconds(&String::from_utf8_lossy(&run.stdout)).unwrap_or(wall);
    let result = object([("rate_pps", json!("max")), ("sent_pps", json!(sent as f64 / elapsed)), ("sent", json!(sent)), ("seconds", json!(elapsed))]);
    eprintln!("  [generator] trafgen: {:.1} kpps", sent as f64 / elapsed / 1e3);
    Ok(Some(Line {
        test: "generator",
        dut: "none".into(),
        frame_size: 64,
        flows: 0,
        criterion: Criterion::Zero,
        method: "trafgen, sending only",
        result,
        generator_limited: false,
    }))
}

/// The sending time trafgen reports at exit ("N sec, M usec on CPU0").
fn trafgen_seconds(said: &str) -> Option<f64> {
    let words: Vec<&str> = said.split_whitespace().collect();
    let at = words.windows(4).position(|w| w[1] == "sec," && w[3] == "usec")?;
    let secs: f64 = words[at].parse().ok()?;
    let usecs: f64 = words[at + 2].parse().ok()?;
    Some(secs + usecs / 1e6).filter(|&s| s > 0.0)
}

/// Runs the selected tests against one device; how many could not finish.
fn run_tests(mut bed: LabBed, profile: &Profile, tests: &[&str], out: &mut Output, plots: &mut PlotData) -> usize {
    let mut run = DutRun { s: profile.settings.clone(), results: Results::default(), conn_rate: None, throughputs: Vec::new() };
    let mut failures = 0;
    for &test in tests {
        if interrupted() {
            break;
        }
        if let Err(e) = run.test(&mut bed, profile, test) {
            failures += 1;
            eprintln!("natrix test: {}: {test} failed: {e}", bed.name);
        }
        for l in run.results.lines.drain(..) {
            out.emit(l);
        }
    }
    let name = bed.name.to_owned();
    if !run.results.capacity_points.is_empty() {
        plots.capacity.push((name.clone(), std::mem::take(&mut run.results.capacity_points)));
    }
    plots.latencies.extend(run.results.latencies.drain(..).map(|(size, l)| (name.clone(), size, l)));
    failures
}

/// One device's tests in progress, and what later tests take from earlier ones.
struct DutRun {
    s: Settings,
    results: Results,
    /// The maximum connection establishment rate, once measured.
    conn_rate: Option<f64>,
    /// (frame size, throughput) found so far.
    throughputs: Vec<(usize, f64)>,
}

impl DutRun {
    fn test(&mut self, bed: &mut LabBed, profile: &Profile, test: &str) -> Result<(), TestError> {
        let s = &self.s;
        match test {
            "connection_rate" => {
                let l = p::connection_rate(bed, s)?;
                self.conn_rate = l.result.get("rate_pps").and_then(|v| v.as_f64()).filter(|&r| r > 0.0);
                self.results.lines.push(l);
                // Later preliminary phases fill the table at no more than
                // half the rate the device was found to take.
                if let Some(r) = self.conn_rate {
                    self.s.fill_rate = self.s.fill_rate.min(r / 2.0);
                }
            }
            "teardown_rate" => self.results.lines.push(p::teardown_rate(bed, s)?),
            "table_capacity" => {
                let (l, points) = p::table_capacity(bed, s, self.conn_rate.unwrap_or(s.max_rate))?;
                self.results.lines.push(l);
                self.results.capacity_points = points;
            }
            "throughput" => {
                for &size in &profile.sizes {
                    let (l, rate) = p::throughput(bed, &self.s, size)?;
                    self.results.lines.push(l);
                    self.throughputs.extend(rate.map(|r| (size, r)));
                }
            }
            "frame_loss" => {
                for &size in &profile.sizes {
                    self.results.lines.extend(p::frame_loss(bed, s, size)?);
                }
            }
            "latency" => {
                for &size in &profile.sizes {
                    self.latency(bed, size)?;
                }
            }
            "goodput" => self.results.lines.extend(p::goodput(bed, s, &LADDER)?),
            "syn_flood" => self.results.lines.push(p::syn_flood(bed, s, profile.syn_rate, profile.syn_burst)?),
            "cpu" => self.results.lines.extend(p::cpu_cost(bed, s)?),
            _ => {}
        }
        Ok(())
    }

    /// Latency and PDV at the size's throughput rate (RFC 8219 section
    /// 7.2), found by the throughput test when it ran, else searched now.
    fn latency(&mut self, bed: &mut LabBed, size: usize) -> Result<(), TestError> {
        let known = self.throughputs.iter().find(|(s, _)| *s == size).map(|&(_, r)| r);
        let throughput = match known {
            Some(r) => r,
            None => p::throughput(bed, &self.s, size)?.1.ok_or_else(|| TestError::Setup(format!("no throughput at {size} B: no rate to measure latency at")))?,
        };
        // Stamping and receiving in time needs headroom: at its own
        // ceiling the generator's queues, not the device's, would show.
        let rate = throughput.min(LATENCY_HEADROOM * self.s.max_rate);
        let (lines, delays) = p::latency_and_pdv(bed, &self.s, size, rate)?;
        self.results.lines.extend(lines);
        self.results.latencies.push((size, delays));
        Ok(())
    }
}

fn finish(args: &Args, out: &Output, plots: &PlotData) -> Result<(), Failure> {
    let files = output::write_plots(&args.out, plots)?;
    let side = output::side_by_side(&out.lines);
    if let Some(md) = &side {
        let path = args.out.join("side-by-side.md");
        std::fs::write(&path, md).map_err(|e| Failure::Other(format!("{}: {e}", path.display())))?;
        if !args.json {
            println!("\n{md}");
        }
    }
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    eprintln!("natrix test: results in {}; plots {}", args.out.join("results.jsonl").display(), names.join(", "));
    let log = args.out.join("natrix.log");
    if log.exists() {
        eprintln!("natrix test: natrix's own log in {}", log.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_beyond_the_port_space_are_refused() {
        let space = lab::flow_space().capacity();
        let s = |flows: u32, max: u64| {
            let mut s = quick_settings();
            (s.flows, s.capacity.max) = (flows, max);
            s
        };
        assert!(check_connections(&s(10_000, 1 << 19), space).is_ok());
        assert!(check_connections(&s(10_000, space), space).is_ok());
        assert!(check_connections(&s(10_000, space + 1), space).is_err());
        assert!(check_connections(&s(0, 1024), space).is_err());
        // The lab's space: 16 subscribers, 64 destination ports, 64,512 source ports.
        assert_eq!(space, 16 * 64 * 64_512);
        assert!(u32::try_from(space).is_ok(), "every connection index fits the tag's u32");
    }

    fn quick_settings() -> Settings {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        Profile::new(&Cli::parse_from(["natrix-test", "--dut", "kernel", "--quick"]).args).settings
    }

    #[test]
    fn trafgen_reports_its_sending_time() {
        let said = "\n  1492937 packets outgoing\n  89576220 bytes outgoing\n  2 sec, 11442 usec on CPU0 (1492937 packets)\n";
        assert_eq!(trafgen_seconds(said), Some(2.011442));
        assert_eq!(trafgen_seconds("nothing"), None);
    }
}
