//! `natrix replay`: the engine over a capture file, time taken from the
//! capture, so the same input and config give the same output byte for byte.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use natrix_control::ipfix::{Clock, LossCounter, SinkStats};
use natrix_control::report::{Report, ReportBuilder, SinkUse, Truncation};
use natrix_control::sinks::{JsonTarget, LogSinks};
use natrix_engine::{Engine, Verdict};
use natrix_io::{same_file, CaptureError, CaptureReader, CaptureWriter, PendingFile};

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
    /// JSON lines, IPFIX and syslog as live; IPFIX on the capture's clock.
    logs: LogSinks,
    /// Where the JSON log is written, beside its final name like the capture.
    json_file: Option<PendingFile>,
    report: ReportBuilder,
}

impl Sinks {
    fn open(cfg: &natrix_control::Config, out: &Path) -> Result<Sinks, Failure> {
        let writer = CaptureWriter::create(out).map_err(|e| Failure::Other(e.to_string()))?;
        let (json_file, json) = match &cfg.logging.json {
            Some(p) => {
                let (pending, file) = PendingFile::create(p).map_err(|e| Failure::Other(format!("logging.json {}: {e}", p.display())))?;
                (Some(pending), JsonTarget::File(file))
            }
            None => (None, JsonTarget::Append),
        };
        let (logs, errors) = LogSinks::open(&cfg.logging, json, Clock::Events, &LossCounter::default(), None);
        if let Some(e) = errors.into_iter().next() {
            return Err(Failure::Other(e));
        }
        Ok(Sinks { writer, logs, json_file, report: ReportBuilder::for_config(&cfg.engine) })
    }

    fn drain(&mut self, engine: &mut Engine) -> Result<(), Failure> {
        let mut result = Ok(());
        engine.drain_output(|f| {
            if result.is_ok() {
                result = self.writer.write(f.side, f.time_ns, &f.data);
            }
        });
        result.map_err(|e| Failure::Other(e.to_string()))?;
        let Sinks { logs, report, .. } = self;
        engine.drain_events(|e| {
            report.on_event(&e);
            logs.write(&e);
        });
        engine.drain_function_records(|r| {
            logs.write_record(&r);
        });
        // IPFIX and syslog losses are counted; a log file that fails ends the replay.
        logs.take_json_error().map_or(Ok(()), |e| Err(Failure::Other(format!("event log: {e}"))))
    }

    /// Gives the capture and the event log their final names and says what
    /// each log sink took and lost.
    fn finish(self) -> Result<(ReportBuilder, Exported), Failure> {
        let Sinks { writer, logs, json_file, report } = self;
        writer.finish().map_err(|e| Failure::Other(e.to_string()))?;
        let finished = logs.finish();
        let mut exported = Exported { json: None, ipfix: finished.ipfix, syslog: finished.syslog };
        if let (Some(log), Some(pending)) = (finished.json, json_file) {
            exported.json = Some(log.volume());
            let dest = pending.dest().to_path_buf();
            let failed = |e: std::io::Error| Failure::Other(format!("event log {}: {e}", dest.display()));
            log.finish().and_then(|f| f.sync_all()).map_err(failed)?;
            pending.commit().map_err(failed)?;
        }
        Ok((report, exported))
    }
}

/// What the log sinks took: the JSON log's records and bytes, and what the
/// IPFIX and syslog exporters handed over and dropped.
struct Exported {
    json: Option<(u64, u64)>,
    ipfix: Option<SinkStats>,
    syslog: Option<SinkStats>,
}

impl Exported {
    /// The report's per-sink view: records sent and lost.
    fn by_sink(&self) -> BTreeMap<&'static str, SinkUse> {
        let mut sinks = BTreeMap::new();
        if let Some((records, _)) = self.json {
            sinks.insert("json", SinkUse { sent: records, lost: 0 });
        }
        for (name, stats) in [("ipfix", self.ipfix), ("syslog", self.syslog)] {
            if let Some(s) = stats {
                sinks.insert(name, SinkUse { sent: s.records, lost: s.lost });
            }
        }
        sinks
    }
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let (cfg, mut engine) = load_engine(&args.config)?;
    refuse_clashing_paths(args, &cfg)?;
    let mut reader = CaptureReader::open(&args.input).map_err(|e| Failure::Other(e.to_string()))?;
    // Opened now, so an unwritable report path fails before the replay, not after it.
    let report_file = match &args.report {
        Some(p) => Some(PendingFile::create(p).map_err(|e| Failure::Other(format!("--report {}: {e}", p.display())))?),
        None => None,
    };
    let mut sinks = Sinks::open(&cfg, &args.out)?;
    let bar = progress_bar(args.quiet, reader.progress().1);
    let started = Instant::now();
    let mut frame = Vec::with_capacity(65_536);
    let mut count = 0u64;
    let mut truncated = None;
    loop {
        let f = match reader.next_into(&mut frame) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(CaptureError::Truncated { frames, offset, .. }) => {
                truncated = Some(Truncation { after_frame: frames, byte_offset: offset });
                break;
            }
            Err(e) => return Err(Failure::Other(e.to_string())),
        };
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
    let (report, exported) = sinks.finish()?;
    let mut report = report.build(&engine);
    report.log_export = exported.by_sink();
    report.input_truncated = truncated;
    if let (Some((pending, file)), Some(path)) = (report_file, &args.report) {
        write_report(&report, pending, file).map_err(|e| Failure::Other(format!("--report {}: {e}", path.display())))?;
    }
    if !args.quiet {
        print_summary(&report, started.elapsed().as_secs_f64(), &exported);
    }
    warn(&report, &args.input);
    Ok(())
}

/// An output that is the input, or two outputs that are one file, would
/// destroy data: refused before anything is opened for writing.
fn refuse_clashing_paths(args: &Args, cfg: &natrix_control::Config) -> Result<(), Failure> {
    let mut outputs: Vec<(&str, &Path)> = vec![("--out", &args.out)];
    if let Some(p) = &args.report {
        outputs.push(("--report", p));
    }
    if let Some(p) = &cfg.logging.json {
        outputs.push(("logging.json", p));
    }
    let inputs = [("--in", args.input.as_path()), ("--config", args.config.as_path())];
    for (i, &(name, path)) in outputs.iter().enumerate() {
        let earlier = inputs.iter().chain(&outputs[..i]);
        if let Some((other, _)) = earlier.into_iter().find(|(_, p)| same_file(path, p)) {
            return Err(Failure::Usage(format!("{name} {} is the same file as {other}: refusing to overwrite it", path.display())));
        }
    }
    Ok(())
}

fn write_report(report: &Report, pending: PendingFile, mut file: std::fs::File) -> std::io::Result<()> {
    use std::io::Write;
    let json = serde_json::to_string_pretty(report).expect("report serializes");
    file.write_all(json.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    pending.commit()
}

/// What an operator must see even with `--quiet`: a capture cut short and
/// log records the exporters lost.
fn warn(r: &Report, input: &Path) {
    if let Some(t) = r.input_truncated {
        eprintln!(
            "natrix: warning: {}: truncated after frame {} (byte offset {}): the incomplete last record was skipped; every frame before it was replayed",
            input.display(),
            t.after_frame,
            t.byte_offset
        );
    }
    for (sink, u) in &r.log_export {
        if u.lost > 0 {
            eprintln!("natrix: warning: logging.{sink}: {} of {} log records lost (collector or syslog unreachable, or too slow)", u.lost, u.sent + u.lost);
        }
    }
    if r.events_lost > 0 {
        eprintln!("natrix: warning: {} NAT events lost (event queue full)", r.events_lost);
    }
}

fn progress_bar(quiet: bool, total_bytes: u64) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total_bytes);
    bar.set_style(ProgressStyle::with_template("{spinner} replay [{bar:40}] {bytes}/{total_bytes} {elapsed} (eta {eta})").expect("valid template").progress_chars("=> "));
    bar
}

fn print_summary(r: &Report, secs: f64, exported: &Exported) {
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
    if let Some((records, bytes)) = exported.json {
        println!("  event log: {records} records, {bytes} bytes");
    }
    if let Some(s) = exported.ipfix {
        println!("  ipfix: {} records in {} messages, {} bytes, {} lost", s.records, s.messages, s.bytes, s.lost);
    }
    if let Some(s) = exported.syslog {
        println!("  syslog: {} records, {} bytes, {} lost", s.records, s.bytes, s.lost);
    }
    let export_lost = exported.ipfix.map_or(0, |s| s.lost) + exported.syslog.map_or(0, |s| s.lost);
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
