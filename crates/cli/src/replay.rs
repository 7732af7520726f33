//! `natrix replay`: the engine over a capture file, time taken from the
//! capture, so the same input and config give the same output byte for byte.

use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use natrix_control::eventlog::EventLog;
use natrix_control::ipfix::{Clock, IpfixExporter, LossCounter, SinkStats};
use natrix_control::report::{Report, ReportBuilder};
use natrix_control::syslog::SyslogSender;
use natrix_engine::{Engine, Verdict};
use natrix_io::{CaptureReader, CaptureWriter};

use crate::{load_engine, Failure};

#[derive(clap::Args)]
pub struct Args {
    /// The TOML configuration file.
    #[arg(long)]
    config: PathBuf,
    /// Input capture: pcap (all frames inside) or pcapng (interface `outside` = outside).
    #[arg(long = "in")]
    input: PathBuf,
    /// Output pcapng with interfaces `inside` and `outside`.
    #[arg(long)]
    out: PathBuf,
    /// Write the JSON report here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// No progress bar and no summary.
    #[arg(long)]
    quiet: bool,
}

/// Frames between progress-bar updates.
const PROGRESS_EVERY: u64 = 4096;

/// Everything that consumes the engine's output.
struct Sinks {
    writer: CaptureWriter,
    log: Option<EventLog>,
    /// IPFIX and syslog as live, on the capture's clock; what they drop is counted, not fatal.
    ipfix: Option<IpfixExporter>,
    syslog: Option<SyslogSender>,
    report: ReportBuilder,
}

impl Sinks {
    fn drain(&mut self, engine: &mut Engine) -> Result<(), Failure> {
        let mut result = Ok(());
        engine.drain_output(|f| {
            if result.is_ok() {
                result = self.writer.write(f.side, f.time_ns, &f.data);
            }
        });
        result.map_err(|e| Failure::Other(e.to_string()))?;
        let mut log_err = None;
        let Sinks { log, ipfix, syslog, report, .. } = self;
        engine.drain_events(|e| {
            report.on_event(&e);
            if let Some(l) = log.as_mut() {
                if let Err(err) = l.write(&e) {
                    log_err.get_or_insert(err);
                }
            }
            if let Some(x) = ipfix.as_mut() {
                x.write(&e);
            }
            if let Some(s) = syslog.as_mut() {
                s.write(&e);
            }
        });
        log_err.map_or(Ok(()), |e| Err(Failure::Other(format!("event log: {e}"))))
    }
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let (cfg, mut engine) = load_engine(&args.config)?;
    let mut reader = CaptureReader::open(&args.input).map_err(|e| Failure::Other(e.to_string()))?;
    let writer = CaptureWriter::create(&args.out).map_err(|e| Failure::Other(e.to_string()))?;
    let log = match &cfg.logging.json {
        Some(p) => Some(EventLog::create(p, cfg.logging.unit).map_err(|e| Failure::Other(format!("logging.json {}: {e}", p.display())))?),
        None => None,
    };
    let lost = LossCounter::default();
    let ipfix = match cfg.logging.ipfix {
        Some(addr) => Some(IpfixExporter::connect(addr, cfg.logging.unit, Clock::Events, lost.clone()).map_err(|e| Failure::Other(format!("logging.ipfix {addr}: {e}")))?),
        None => None,
    };
    let syslog = match &cfg.logging.syslog {
        Some(t) => Some(SyslogSender::open(t, cfg.logging.unit, lost.clone()).map_err(|e| Failure::Other(format!("logging.syslog {t}: {e}")))?),
        None => None,
    };
    let mut sinks = Sinks { writer, log, ipfix, syslog, report: ReportBuilder::for_config(&cfg.engine) };
    let bar = progress_bar(args.quiet, reader.progress().1);
    let started = Instant::now();
    let mut frame = Vec::with_capacity(65_536);
    let mut count = 0u64;
    while let Some(f) = reader.next_into(&mut frame).map_err(|e| Failure::Other(e.to_string()))? {
        // Time-driven output (answers to held SYNs) precedes this frame.
        engine.advance(f.time_ns);
        sinks.drain(&mut engine)?;
        if let Verdict::Forward(side) = engine.process(&mut frame, f.side, f.time_ns) {
            sinks.writer.write(side, f.time_ns, &frame).map_err(|e| Failure::Other(e.to_string()))?;
        }
        sinks.drain(&mut engine)?;
        count += 1;
        if count.is_multiple_of(PROGRESS_EVERY) {
            bar.set_position(reader.progress().0);
        }
    }
    engine.finish();
    sinks.drain(&mut engine)?;
    bar.finish_and_clear();
    let Sinks { writer, log, mut ipfix, syslog, report } = sinks;
    let exporters = ExportVolume {
        ipfix: ipfix.as_mut().map(|x| {
            x.flush();
            x.stats()
        }),
        syslog: syslog.as_ref().map(SyslogSender::stats),
    };
    writer.finish().map_err(|e| Failure::Other(e.to_string()))?;
    let log_volume = match log {
        Some(l) => {
            let v = l.volume();
            l.finish().map_err(|e| Failure::Other(format!("event log: {e}")))?;
            Some(v)
        }
        None => None,
    };
    let report = report.build(&engine);
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&report).expect("report serializes");
        std::fs::write(path, json + "\n").map_err(|e| Failure::Other(format!("{}: {e}", path.display())))?;
    }
    if !args.quiet {
        print_summary(&report, started.elapsed().as_secs_f64(), log_volume, &exporters);
    }
    Ok(())
}

fn progress_bar(quiet: bool, total_bytes: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total_bytes);
    bar.set_style(ProgressStyle::with_template("{spinner} replay [{bar:40}] {bytes}/{total_bytes} {elapsed} (eta {eta})").expect("valid template").progress_chars("=> "));
    bar
}

/// What the IPFIX and syslog sinks handed over and dropped.
struct ExportVolume {
    ipfix: Option<SinkStats>,
    syslog: Option<SinkStats>,
}

fn print_summary(r: &Report, secs: f64, log_volume: Option<(u64, u64)>, exporters: &ExportVolume) {
    let p = &r.packets;
    println!("replayed {} frames in {secs:.2}s ({} inside, {} outside)", p.input, p.in_inside, p.in_outside);
    println!("  out      {:>10}  ({} inside, {} outside, {} generated by natrix)", p.out, p.out_inside, p.out_outside, p.generated);
    println!("  dropped  {:>10}", p.dropped);
    for (reason, n) in &r.drops {
        println!("    {reason:<24} {n:>10}");
    }
    println!("  mappings created {}, sessions created {}, peak sessions {}, peak mappings {}", r.mappings_created, r.sessions_created, r.peak_sessions, r.peak_mappings);
    let pp = &r.ports_per_subscriber;
    println!("  subscribers {}, external ports per subscriber p50 {} p99 {} max {}", r.subscribers, pp.p50, pp.p99, pp.max);
    println!("  pool: {} addresses, peak {} of {} ports in use ({:.4}%)", r.pool.addresses, r.pool.peak_ports_used, r.pool.ports, r.pool.peak_utilisation * 100.0);
    if let Some((records, bytes)) = log_volume {
        println!("  event log: {records} records, {bytes} bytes");
    }
    if let Some(s) = exporters.ipfix {
        println!("  ipfix: {} records in {} messages, {} bytes, {} lost", s.records, s.messages, s.bytes, s.lost);
    }
    if let Some(s) = exporters.syslog {
        println!("  syslog: {} records, {} bytes, {} lost", s.records, s.bytes, s.lost);
    }
    let export_lost = exporters.ipfix.map_or(0, |s| s.lost) + exporters.syslog.map_or(0, |s| s.lost);
    if export_lost > 0 {
        println!("  WARNING: {export_lost} log records lost by the exporters (collector or syslog unreachable, or too slow)");
    }
    for line in r.log_volume.summary_lines() {
        println!("{line}");
    }
    if r.events_lost > 0 {
        println!("  WARNING: {} NAT events lost (event queue full)", r.events_lost);
    }
}
