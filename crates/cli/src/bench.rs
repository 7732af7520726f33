//! `natrix bench`: the real engine on real 60-byte frames (64 on the wire),
//! following seed 004's method. For N unique flows (RFC 4814 pseudorandom
//! ports, 64 flows per subscriber, half TCP and half UDP): a **new** pass in
//! which every outbound frame opens its flow and its reply comes back through
//! the outside, then an **established** pass of the same frames. Frames are
//! built between timed batches, so generation is not counted; every reply
//! is checked to reach its subscriber's original address and port.

use std::sync::Barrier;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use natrix_engine::rng::Rng;
use natrix_engine::{Engine, EngineConfig, Side, Verdict};
use natrix_tester::flows::Permutation;
use natrix_wire::{checksum, get_u16_at, get_u32_at, ipv4, proto, set_u16_at};
use serde::Serialize;

use crate::Failure;

mod buffers;
mod dslite;
mod host_id;
mod nptv6;
mod sctp;
mod syn_accel;

#[derive(clap::Args)]
pub struct Args {
    /// What to measure: NAPT44 (new and established flows), NPTv6 (stateless IPv6 prefix translation), or a function beside NAPT44.
    #[arg(long, value_enum, default_value_t = Mode::Nat44)]
    mode: Mode,
    /// Flows in total (default: 1K, 64K, 1M and 16M in turn).
    #[arg(long)]
    flows: Option<u64>,
    /// Workers, each a thread with its own engine and a slice of the pool (default: 1, then all cores).
    #[arg(long)]
    workers: Option<u32>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// The order each pass presents the flows in.
    #[arg(long, value_enum, default_value_t = Order::Created)]
    order: Order,
    /// `--mode syn-accel`: the share of attempts the servers answer (0 to 1).
    #[arg(long, default_value_t = 0.5)]
    answered: f64,
    /// `--mode syn-accel`: first SYNs offered per second of simulated time.
    #[arg(long, default_value_t = 1_400_000)]
    rate: u64,
}

/// The translator a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// NAPT44 on IPv4 frames: a new pass and an established pass.
    Nat44,
    /// NPTv6 (RFC 6296) on IPv6 frames: one stateless pass, out and back.
    Nptv6,
    /// The SYN accelerator (seed 003): a stream of first SYNs to accelerated
    /// destinations, `--answered` of them answered; `--flows` SYNs (default 2M).
    SynAccel,
    /// SCTP associations (seed 001): setup (INIT, INIT-ACK) and established
    /// (DATA both ways) passes; `--flows` associations (default 1M), one worker.
    Sctp,
    /// HOST_ID (seed 000): first SYNs with and without HOST_ID_WING and
    /// HOST_ID_BOUCADAIR inserted, then their data segments; `--flows` SYNs
    /// (default 1M), one worker.
    HostId,
    /// DS-Lite (RFC 6333): established packets through softwires beside
    /// NAPT44 alone, both ways, and bytes per session; `--flows` flows
    /// (default 1M), one worker.
    Dslite,
}

/// The order in which a pass presents its flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Order {
    /// Creation order, both passes: seed 004's method. Records are then read
    /// in the order they were allocated.
    Created,
    /// Each pass its own pseudorandom order, so that neither subscribers nor
    /// records come in allocation order: what live traffic looks like.
    Random,
}

impl Order {
    fn name(self) -> &'static str {
        match self {
            Order::Created => "created",
            Order::Random => "random",
        }
    }
}

const DEFAULT_FLOWS: [u64; 4] = [1 << 10, 1 << 16, 1 << 20, 1 << 24];
const BATCH: usize = 64;
const FLOWS_PER_SUBSCRIBER: u64 = 64;
const FRAME_LEN: usize = 60;
/// Pool: 198.19.0.0/22; servers: 198.18.0.0/16 (RFC 2544 benchmarking space).
const POOL_BASE: u32 = 0xc613_0000;
const POOL_SIZE: u32 = 1024;
const SERVER_BASE: u32 = 0xc612_0000;
const SUBSCRIBER_BASE: u32 = 0x6440_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    New,
    Established,
}

#[derive(Serialize)]
struct Line {
    /// "nat44" or "nptv6".
    mode: &'static str,
    flows: u64,
    workers: u32,
    pass: &'static str,
    order: &'static str,
    ns_per_packet: f64,
    mpps: f64,
    new_mappings_per_second: Option<f64>,
    bytes_per_session: f64,
    table_bytes_per_session: f64,
    batch_p50_ns: u64,
    batch_p99_ns: u64,
    packets: u64,
    errors: u64,
}

/// What one worker measured in one pass.
#[derive(Default)]
struct PassResult {
    packets: u64,
    busy_ns: u64,
    errors: u64,
    batch_ns: Vec<u32>,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    if !matches!(args.mode, Mode::Nat44 | Mode::Nptv6) && args.workers.is_some_and(|w| w != 1) {
        return Err(Failure::Usage(format!(
            "--mode {}: runs one worker, so --workers does not apply",
            clap::ValueEnum::to_possible_value(&args.mode).map_or_else(String::new, |v| v.get_name().to_owned())
        )));
    }
    let defaults = match args.mode {
        Mode::Nat44 => &DEFAULT_FLOWS[..],
        Mode::Nptv6 => &nptv6::DEFAULT_FLOWS[..],
        Mode::SynAccel => return syn_accel::run(args.flows, args.answered, args.rate, args.json),
        Mode::Sctp => return sctp::run(args.flows, args.json),
        Mode::HostId => return host_id::run(args.flows, args.json),
        Mode::Dslite => return dslite::run(args.flows, args.json),
    };
    let sizes: Vec<u64> = args.flows.map_or(defaults.to_vec(), |n| vec![n]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let worker_counts: Vec<u32> = match args.workers {
        Some(w) => vec![w.max(1)],
        None if cores > 1 => vec![1, cores],
        None => vec![1],
    };
    if !args.json {
        if args.mode == Mode::Nptv6 {
            println!("NPTv6 (RFC 6296) on {}-byte IPv6/UDP frames, each host out through the inside and back", nptv6::FRAME_LEN);
        } else if args.order == Order::Random {
            println!("each pass presents the flows in its own random order");
        }
        println!("{:>10} {:>7} {:>12} {:>8} {:>8} {:>12} {:>9} {:>9} {:>9}", "flows", "workers", "pass", "ns/pkt", "Mpps", "new map/s", "B/sess", "batch p50", "batch p99");
    }
    let mut errors = 0;
    for &flows in &sizes {
        for &workers in &worker_counts {
            let lines = match args.mode {
                Mode::Nat44 => bench_one(flows, workers, args.order)?,
                Mode::Nptv6 => vec![nptv6::bench_one(flows, workers)?],
                Mode::SynAccel | Mode::Sctp | Mode::HostId | Mode::Dslite => unreachable!("--mode syn-accel, sctp, host-id and dslite returned at the start of run"),
            };
            for line in lines {
                errors += line.errors;
                if args.json {
                    println!("{}", serde_json::to_string(&line).expect("serializable"));
                } else {
                    print_row(&line);
                }
            }
        }
    }
    if errors > 0 {
        return Err(Failure::Other(format!("{errors} packets did not round-trip correctly")));
    }
    Ok(())
}

fn print_row(l: &Line) {
    let new_maps = l.new_mappings_per_second.map_or("-".to_string(), |v| format!("{:.2}M", v / 1e6));
    println!(
        "{:>10} {:>7} {:>12} {:>8.1} {:>8.2} {:>12} {:>9.1} {:>9} {:>9}",
        l.flows, l.workers, l.pass, l.ns_per_packet, l.mpps, new_maps, l.bytes_per_session, l.batch_p50_ns, l.batch_p99_ns
    );
}

fn bench_one(flows: u64, workers: u32, order: Order) -> Result<Vec<Line>, Failure> {
    if flows < u64::from(workers) {
        return Err(Failure::Other("--flows must be at least --workers".into()));
    }
    if share(flows, workers, 0).div_ceil(FLOWS_PER_SUBSCRIBER) * u64::from(workers) > (1 << 22) {
        return Err(Failure::Other("at most 268M flows: the subscribers must fit in 100.64.0.0/10".into()));
    }
    // Memory an earlier size freed would otherwise be reused unseen.
    release_free_heap();
    let rss_before = rss_bytes();
    let barrier = Barrier::new(workers as usize);
    let sync = &barrier;
    let bar = progress_bar(flows, workers);
    let progress = &bar;
    let results: Vec<Result<WorkerResult, Failure>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers).map(|w| s.spawn(move || run_worker(w, workers, flows, order, sync, progress))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Failure::Other("bench worker panicked".into())))).collect()
    });
    bar.finish_and_clear();
    let results: Vec<WorkerResult> = results.into_iter().collect::<Result<_, _>>()?;
    let sessions: u64 = results.iter().map(|r| r.sessions).sum();
    let table_bytes: u64 = results.iter().map(|r| r.table_bytes).sum();
    let rss_peak: u64 = results.iter().map(|r| r.rss_at_peak).max().unwrap_or(0);
    let sessions_f = sessions.max(1) as f64;
    let mut lines = Vec::new();
    for pass in [Pass::New, Pass::Established] {
        let parts: Vec<&PassResult> = results.iter().map(|r| if pass == Pass::New { &r.new } else { &r.established }).collect();
        let packets: u64 = parts.iter().map(|p| p.packets).sum();
        // Each worker runs on its own core: the box's rate is the sum of theirs.
        let mpps: f64 = parts.iter().map(|p| p.packets as f64 / p.busy_ns.max(1) as f64 * 1e3).sum();
        let mut batches: Vec<u32> = parts.iter().flat_map(|p| p.batch_ns.iter().copied()).collect();
        batches.sort_unstable();
        let busy_s: f64 = parts.iter().map(|p| p.busy_ns as f64 / 1e9).fold(0.0, f64::max);
        lines.push(Line {
            mode: "nat44",
            flows,
            workers,
            pass: if pass == Pass::New { "new" } else { "established" },
            order: order.name(),
            ns_per_packet: 1e3 / mpps * f64::from(workers),
            mpps,
            new_mappings_per_second: (pass == Pass::New).then(|| sessions as f64 / busy_s.max(1e-9)),
            bytes_per_session: rss_peak.saturating_sub(rss_before) as f64 / sessions_f,
            table_bytes_per_session: table_bytes as f64 / sessions_f,
            batch_p50_ns: percentile(&batches, 50),
            batch_p99_ns: percentile(&batches, 99),
            packets,
            errors: parts.iter().map(|p| p.errors).sum(),
        });
    }
    Ok(lines)
}

/// Progress on stderr (drawn only on a terminal): a 65.5 M-flow run takes
/// over a minute. Counts packets of both passes.
fn progress_bar(flows: u64, workers: u32) -> ProgressBar {
    let bar = ProgressBar::new(4 * flows);
    bar.set_style(
        ProgressStyle::with_template("{spinner} bench {msg} [{bar:40}] {human_pos}/{human_len} packets {elapsed} (eta {eta})").expect("valid template").progress_chars("=> "),
    );
    bar.set_message(format!("{flows} flows, {workers} worker(s)"));
    bar
}

fn percentile(sorted: &[u32], pct: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    u64::from(sorted[((pct * sorted.len()).div_ceil(100)).max(1) - 1])
}

struct WorkerResult {
    new: PassResult,
    established: PassResult,
    sessions: u64,
    table_bytes: u64,
    rss_at_peak: u64,
}

fn worker_config(worker: u32, workers: u32, flows: u64) -> EngineConfig {
    let slice = (POOL_SIZE / workers).max(1);
    let first = POOL_BASE + worker * slice;
    let subscribers = flows.div_ceil(FLOWS_PER_SUBSCRIBER);
    EngineConfig {
        pool: (first..first + slice).collect(),
        max_sessions: u32::try_from(flows).unwrap_or(u32::MAX),
        max_subscribers: u32::try_from(subscribers + 16).unwrap_or(u32::MAX),
        max_ports_per_subscriber: 2 * FLOWS_PER_SUBSCRIBER as u32,
        event_capacity: 1024,
        ..EngineConfig::default()
    }
}

/// Worker `worker`'s share of `total` flows among `workers`: the remainder
/// goes one each to the first workers, so the shares add up to `total`.
pub(crate) fn share(total: u64, workers: u32, worker: u32) -> u64 {
    total / u64::from(workers) + u64::from(u64::from(worker) < total % u64::from(workers))
}

/// Worker `worker`'s run over its share of `total` flows. `sync` holds
/// every worker between the passes, so the resident memory is read once
/// all tables are full and the established passes run side by side.
fn run_worker(worker: u32, workers: u32, total: u64, order: Order, sync: &Barrier, progress: &ProgressBar) -> Result<WorkerResult, Failure> {
    let flows = share(total, workers, worker);
    let mut engine = match Engine::new(worker_config(worker, workers, flows)) {
        Ok(e) => e,
        Err(e) => {
            sync.wait();
            sync.wait();
            return Err(Failure::Other(e.to_string()));
        }
    };
    // Each worker's subscribers apart from the others', the largest share apart.
    let first_sub = u64::from(worker) * share(total, workers, 0).div_ceil(FLOWS_PER_SUBSCRIBER);
    let shuffle = |pass: u64| (order == Order::Random).then(|| Permutation::new(flows, u64::from(worker) << 1 | pass));
    let new = run_pass(&mut engine, first_sub, flows, Pass::New, shuffle(0).as_ref(), progress);
    let sessions = engine.tables().session_count() as u64;
    let rss_at_peak = if sync.wait().is_leader() { rss_bytes() } else { 0 };
    sync.wait();
    let established = run_pass(&mut engine, first_sub, flows, Pass::Established, shuffle(1).as_ref(), progress);
    Ok(WorkerResult { new, established, sessions, table_bytes: engine.memory_bytes() as u64, rss_at_peak })
}

/// One flow's outbound identity, derived from its index (RFC 4814 style
/// pseudorandom ports, distinct per subscriber).
#[derive(Clone, Copy)]
struct Flow {
    tcp: bool,
    sub: u32,
    sport: u16,
    server: u32,
    dport: u16,
}

fn flow(first_sub: u64, i: u64) -> Flow {
    let sub_index = first_sub + i / FLOWS_PER_SUBSCRIBER;
    let j = i % FLOWS_PER_SUBSCRIBER;
    let r = Rng::new(i ^ first_sub << 40).next_u64();
    Flow {
        tcp: i % 2 == 1,
        sub: SUBSCRIBER_BASE + sub_index as u32,
        sport: 1024 + ((j * 7919 + sub_index * 31) % 64512) as u16,
        server: SERVER_BASE + (r & 0xffff) as u32,
        dport: 1 + ((r >> 16) % 49151) as u16,
    }
}

/// Packets between progress updates: rare enough that workers do not
/// contend for the bar's counter.
const PROGRESS_STEP: u64 = 1 << 15;

fn run_pass(engine: &mut Engine, first_sub: u64, flows: u64, pass: Pass, shuffle: Option<&Permutation>, progress: &ProgressBar) -> PassResult {
    let nth = |i: u64| flow(first_sub, shuffle.map_or(i, |s| s.get(i)));
    let mut res = PassResult { batch_ns: Vec::with_capacity((flows as usize / BATCH + 1) * 2), ..PassResult::default() };
    let mut out = vec![[0u8; FRAME_LEN]; BATCH];
    let mut back = vec![[0u8; FRAME_LEN]; BATCH];
    let mut now_ns = 1_000_000_000u64;
    let (out_flags, back_flags) = match pass {
        Pass::New => (TCP_SYN, TCP_SYN | TCP_ACK),
        Pass::Established => (TCP_ACK, TCP_ACK),
    };
    let (mut start, mut reported) = (0u64, 0u64);
    while start < flows {
        let n = (flows - start).min(BATCH as u64) as usize;
        for (k, frame) in out.iter_mut().enumerate().take(n) {
            let f = nth(start + k as u64);
            build(frame, f.tcp, f.sub, f.sport, f.server, f.dport, out_flags);
        }
        let mut verdicts = [Verdict::Held; BATCH];
        time_batch(&mut res, || engine.process_batch(&mut out[..n], Side::Inside, now_ns, &mut verdicts[..n]));
        for k in 0..n {
            let t = &out[k];
            let (ext, eport) = (get_u32_at(t, 26), get_u16_at(t, 34));
            build(&mut back[k], t[23] == 6, get_u32_at(t, 30), get_u16_at(t, 36), ext, eport, back_flags);
        }
        // A flow whose first frame was refused gets a reply built from the
        // untranslated frame: it cannot come back right, and counts as an error.
        time_batch(&mut res, || engine.process_batch(&mut back[..n], Side::Outside, now_ns, &mut verdicts[..n]));
        for k in 0..n {
            let f = nth(start + k as u64);
            let ok = verdicts[k] == Verdict::Forward(Side::Inside) && get_u32_at(&back[k], 30) == f.sub && get_u16_at(&back[k], 36) == f.sport;
            res.errors += u64::from(!ok);
        }
        engine.drain_events(|_| {});
        engine.drain_output(|_| {});
        res.packets += 2 * n as u64;
        start += n as u64;
        now_ns += 1_000;
        if res.packets - reported >= PROGRESS_STEP {
            progress.inc(res.packets - reported);
            reported = res.packets;
        }
    }
    progress.inc(res.packets - reported);
    res
}

fn time_batch(res: &mut PassResult, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    let ns = t.elapsed().as_nanos() as u64;
    res.busy_ns += ns;
    res.batch_ns.push(u32::try_from(ns).unwrap_or(u32::MAX));
}

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// Writes a 60-byte Ethernet/IPv4/TCP-or-UDP frame with valid checksums.
fn build(f: &mut [u8; FRAME_LEN], tcp: bool, src: u32, sport: u16, dst: u32, dport: u16, tcp_flags: u8) {
    const L4: usize = 34;
    *f = [0; FRAME_LEN];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let (protocol, l4_len) = if tcp { (proto::TCP, 20) } else { (proto::UDP, FRAME_LEN - L4) };
    ipv4::emit_header(&mut f[14..L4], src, dst, protocol, (20 + l4_len) as u16, 64, 0);
    set_u16_at(f, L4, sport);
    set_u16_at(f, L4 + 2, dport);
    let ck_at = if tcp {
        f[L4 + 12] = 0x50;
        f[L4 + 13] = tcp_flags;
        set_u16_at(f, L4 + 14, u16::MAX);
        L4 + 16
    } else {
        set_u16_at(f, L4 + 4, l4_len as u16);
        L4 + 6
    };
    let sum = checksum::add(checksum::pseudo_header_sum(src, dst, protocol, l4_len as u16), checksum::sum(&f[L4..L4 + l4_len]));
    let c = !checksum::fold(sum);
    // RFC 768: a computed UDP checksum of zero is sent as all ones.
    set_u16_at(f, ck_at, if !tcp && c == 0 { 0xffff } else { c });
}

/// Hands the allocator's free memory back to the kernel, so that resident
/// memory grows by what the next engine really takes.
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused heap pages; it has no
    // preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Resident memory of the process, from /proc (0 where unavailable).
fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = s.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bench_round_trips_every_packet_both_passes() {
        for order in [Order::Created, Order::Random] {
            let lines = bench_one(2048, 2, order).unwrap();
            assert_eq!(lines.len(), 2);
            for l in &lines {
                assert_eq!(l.errors, 0, "pass {} in {order:?} order", l.pass);
                assert_eq!(l.packets, 4096);
                assert!(l.table_bytes_per_session > 0.0);
            }
        }
    }

    #[test]
    fn flows_that_do_not_divide_among_the_workers_are_all_measured() {
        // CONTRACTS: with --workers, --flows is the total across workers.
        let lines = bench_one(1001, 2, Order::Created).unwrap();
        for l in &lines {
            assert_eq!((l.flows, l.errors), (1001, 0), "pass {}", l.pass);
            assert_eq!(l.packets, 1001 * 2, "every flow, out and back, in pass {}", l.pass);
        }
        assert_eq!((0..3).map(|w| share(10, 3, w)).collect::<Vec<_>>(), [4, 3, 3]);
    }

    #[test]
    fn flows_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            let f = flow(0, i);
            assert!(seen.insert((f.tcp, f.sub, f.sport, f.server, f.dport)));
        }
    }
}
