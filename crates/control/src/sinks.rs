//! The NAT event log's sinks together: the JSON-lines file, the IPFIX
//! exporter and the syslog sender that `[logging]` configures, fed the same
//! events. Live natrix and `replay` both log through this; they differ only
//! in where the JSON lines go (appended to the configured file, or written
//! to a new file the replay renames into place) and in the clock IPFIX uses.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use natrix_engine::pipeline::hooks::FunctionRecord;
use natrix_engine::Event;

use crate::config::{LogUnit, LoggingConfig};
use crate::eventlog::{records_event, EventLog};
use crate::ipfix::{Clock, IpfixExporter, LossCounter, SinkStats};
use crate::syslog::{SyslogSender, SyslogTarget};

/// Where the JSON lines go.
pub enum JsonTarget {
    /// Appended to `[logging] json`: a live natrix never truncates its own records.
    Append,
    /// Written to a file the caller opened (replay's, renamed when it completes).
    File(File),
}

/// The open sinks. A configured sink that could not be opened, or failed
/// while writing, counts each record it would have taken as lost.
pub struct LogSinks {
    unit: LogUnit,
    json: Option<EventLog>,
    ipfix: Option<(SocketAddr, IpfixExporter)>,
    syslog: Option<(SyslogTarget, SyslogSender)>,
    /// Configured sinks that are not working.
    failed: u64,
    lost: LossCounter,
    /// The JSON log's first write error, for a caller that must not go on without it.
    json_error: Option<io::Error>,
    /// Whether `[logging] json` is configured, open or not.
    json_wanted: bool,
    /// The file a live JSON log appends to, opened again after it failed
    /// (`retry_json`).
    json_path: Option<PathBuf>,
    /// When the JSON log that failed is next tried, and how often.
    json_retry_at: Instant,
    json_retry: Duration,
    /// The JSON log works again after failing, not yet reported.
    json_recovered: bool,
}

/// How often a live JSON log that failed (a full disk, a directory gone)
/// is opened again.
const JSON_RETRY: Duration = Duration::from_secs(10);

/// What the sinks handed over: the JSON log (for the caller to finish) and
/// what the IPFIX and syslog exporters sent and dropped.
pub struct Finished {
    pub json: Option<EventLog>,
    pub ipfix: Option<SinkStats>,
    pub syslog: Option<SinkStats>,
}

impl LogSinks {
    /// Opens what `cfg` names; the errors say which sinks could not be opened.
    /// On a reload (`old`), an IPFIX exporter or syslog sender whose
    /// destination and unit are unchanged is kept (the collector sees one
    /// continuous stream); the JSON file is reopened, so a rotated file is let go.
    pub fn open(cfg: &LoggingConfig, json: JsonTarget, clock: Clock, lost: &LossCounter, old: Option<LogSinks>) -> (LogSinks, Vec<String>) {
        let mut errors = Vec::new();
        let (mut old_ipfix, mut old_syslog) = match old {
            Some(o) if o.unit == cfg.unit => (o.ipfix, o.syslog),
            _ => (None, None),
        };
        let json_path = matches!(json, JsonTarget::Append).then(|| cfg.json.clone()).flatten();
        let json = match (json, &cfg.json) {
            (JsonTarget::File(f), Some(_)) => Some(EventLog::to_file(f, cfg.unit)),
            (JsonTarget::Append, Some(p)) => EventLog::append(p, cfg.unit).map_err(|e| errors.push(format!("logging.json {}: {e}", p.display()))).ok(),
            (_, None) => None,
        };
        let ipfix = cfg.ipfix.and_then(|addr| match old_ipfix.take() {
            Some((a, x)) if a == addr => Some((a, x)),
            _ => IpfixExporter::connect(addr, cfg.unit, clock, lost.clone()).map(|x| (addr, x)).map_err(|e| errors.push(format!("logging.ipfix {addr}: {e}"))).ok(),
        });
        let syslog = cfg.syslog.as_ref().and_then(|target| match old_syslog.take() {
            Some((t, s)) if &t == target => Some((t, s)),
            _ => SyslogSender::open(target, cfg.unit, lost.clone()).map(|s| (target.clone(), s)).map_err(|e| errors.push(format!("logging.syslog {target}: {e}"))).ok(),
        });
        let failed = errors.len() as u64;
        let sinks = LogSinks {
            unit: cfg.unit,
            json,
            ipfix,
            syslog,
            failed,
            lost: lost.clone(),
            json_error: None,
            json_wanted: cfg.json.is_some(),
            json_path,
            json_retry_at: Instant::now() + JSON_RETRY,
            json_retry: JSON_RETRY,
            json_recovered: false,
        };
        (sinks, errors)
    }

    /// Hands the event to every sink; whether it is a record the configured
    /// sinks keep (for the count of records logged).
    pub fn write(&mut self, e: &Event) -> bool {
        self.retry_json();
        if let Some(Err(err)) = self.json.as_mut().map(|l| l.write(e)) {
            self.json_failed(err);
        }
        if let Some((_, x)) = &mut self.ipfix {
            x.write(e);
        }
        if let Some((_, s)) = &mut self.syslog {
            s.write(e);
        }
        let is_record = records_event(self.unit, e);
        if self.failed > 0 && is_record {
            self.lost.fetch_add(self.failed, Ordering::Relaxed);
        }
        is_record && (self.json.is_some() || self.ipfix.is_some() || self.syslog.is_some())
    }

    /// Marks in the JSON log that `natrix run` starts at `time_ns`, holding
    /// no mapping (`EventLog::write_start`).
    pub fn write_start(&mut self, time_ns: u64) {
        if let Some(Err(err)) = self.json.as_mut().map(|l| l.write_start(time_ns)) {
            self.json_failed(err);
        }
    }

    /// Writes a middlebox function's record (HOST_ID's `log` events) to
    /// the JSON log, the one sink with a place for it; whether it was taken.
    pub fn write_record(&mut self, r: &FunctionRecord) -> bool {
        self.retry_json();
        let written = self.json.as_mut().map(|l| match r {
            FunctionRecord::HostId(e) => l.write_host_id(e),
        });
        match written {
            Some(Ok(())) => true,
            Some(Err(err)) => {
                self.json_failed(err);
                self.lost.fetch_add(1, Ordering::Relaxed);
                false
            }
            // The JSON log that failed, or could not be opened, would have taken it.
            None if self.json_wanted => {
                self.lost.fetch_add(1, Ordering::Relaxed);
                false
            }
            None => false,
        }
    }

    /// Hands over what the JSON log buffered and a partly filled IPFIX message.
    pub fn flush(&mut self) {
        if let Some(Err(err)) = self.json.as_mut().map(EventLog::flush) {
            self.json_failed(err);
        }
        if let Some((_, x)) = &mut self.ipfix {
            x.flush();
        }
    }

    /// The JSON log's write error, once: live natrix reports it and goes on
    /// counting its records as lost; a replay stops.
    pub fn take_json_error(&mut self) -> Option<io::Error> {
        self.json_error.take()
    }

    /// Whether the JSON log works again after it failed, once.
    pub fn take_json_recovered(&mut self) -> bool {
        std::mem::take(&mut self.json_recovered)
    }

    /// A live JSON log that failed, or could not be opened, is opened
    /// again every `json_retry`: once the disk has room again, or the
    /// directory is back, records are written again without a reload.
    fn retry_json(&mut self) {
        let Some(path) = &self.json_path else { return };
        if self.json.is_some() || Instant::now() < self.json_retry_at {
            return;
        }
        self.json_retry_at = Instant::now() + self.json_retry;
        if let Ok(log) = EventLog::append(path, self.unit) {
            self.json = Some(log);
            self.failed -= 1;
            self.json_recovered = true;
        }
    }

    /// Flushes the exporters and hands the JSON log back.
    pub fn finish(mut self) -> Finished {
        let ipfix = self.ipfix.as_mut().map(|(_, x)| {
            x.flush();
            x.stats()
        });
        Finished { json: self.json, ipfix, syslog: self.syslog.as_ref().map(|(_, s)| s.stats()) }
    }

    /// The JSON log failed: the records it still held are lost, and it
    /// is counted with this and every later record.
    fn json_failed(&mut self, err: io::Error) {
        if let Some(l) = self.json.take() {
            self.lost.fetch_add(l.abandon(), Ordering::Relaxed);
        }
        self.failed += 1;
        self.json_error.get_or_insert(err);
        self.json_retry_at = Instant::now() + self.json_retry;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use natrix_engine::host_id::{HostIdEvent, Which};
    use natrix_engine::{EventKind, Proto, Side};

    use super::*;

    /// A log on /dev/full, which takes no byte: every write fails (ENOSPC).
    fn sinks_on_a_full_disk(lost: &LossCounter) -> LogSinks {
        let cfg = LoggingConfig { unit: LogUnit::Mapping, json: Some(PathBuf::from("/dev/full")), ipfix: None, syslog: None };
        let (sinks, errors) = LogSinks::open(&cfg, JsonTarget::Append, Clock::Wall, lost, None);
        assert!(errors.is_empty(), "/dev/full opens: {errors:?}");
        sinks
    }

    fn mapping(port: u16) -> Event {
        Event {
            kind: EventKind::MappingCreated,
            time_ns: 1_795_435_200_000_000_000,
            proto: Proto::Udp,
            int_addr: 0x6440_0002,
            int_port: port,
            ext_addr: 0xcb00_7100,
            ext_port: port,
            ext_port_end: port,
            rem_addr: 0,
            rem_port: 0,
            b4: None,
        }
    }

    fn host_id() -> FunctionRecord {
        let e = HostIdEvent { time_ns: 0, rule: 0, option: Which::Wing, value: Some(7), side: Side::Inside, src: 1, src_port: 2, dst: 3, dst_port: 4 };
        FunctionRecord::HostId(e)
    }

    #[test]
    fn every_record_a_failing_json_log_did_not_take_is_counted_lost() {
        // Enough records to fill the write buffer several times: those it
        // held when the write failed are lost as surely as the later ones.
        let lost = LossCounter::default();
        let mut sinks = sinks_on_a_full_disk(&lost);
        let records = 500;
        for port in 0..records {
            sinks.write(&mapping(1024 + port));
        }
        sinks.flush();
        assert!(sinks.take_json_error().is_some(), "the write failed");
        assert_eq!(lost.load(Ordering::Relaxed), u64::from(records));
    }

    #[test]
    fn records_held_for_a_flush_that_fails_are_counted_lost() {
        let lost = LossCounter::default();
        let mut sinks = sinks_on_a_full_disk(&lost);
        for port in 0..3 {
            sinks.write(&mapping(1024 + port));
        }
        assert_eq!(lost.load(Ordering::Relaxed), 0, "still held in the buffer");
        sinks.flush();
        assert_eq!(lost.load(Ordering::Relaxed), 3);
        sinks.flush();
        assert_eq!(lost.load(Ordering::Relaxed), 3, "each counted once");
    }

    /// A JSON log that cannot be written (here its directory is gone) is
    /// tried again, and takes records again once it can, without a reload;
    /// what it missed meanwhile is counted lost.
    #[test]
    fn a_json_log_that_failed_is_written_again_once_it_can_be() {
        let dir = std::env::temp_dir().join(format!("natrix-sinks-retry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("events.jsonl");
        let cfg = LoggingConfig { unit: LogUnit::Mapping, json: Some(path.clone()), ipfix: None, syslog: None };
        let lost = LossCounter::default();
        let (mut sinks, errors) = LogSinks::open(&cfg, JsonTarget::Append, Clock::Wall, &lost, None);
        assert_eq!(errors.len(), 1, "no directory: {errors:?}");
        (sinks.json_retry, sinks.json_retry_at) = (Duration::ZERO, Instant::now());
        assert!(!sinks.write(&mapping(1024)));
        assert_eq!(lost.load(Ordering::Relaxed), 1);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(sinks.write(&mapping(1025)), "opened again and written");
        assert!(sinks.take_json_recovered() && !sinks.take_json_recovered(), "said once");
        sinks.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("1025"), "{text}");
        assert_eq!(lost.load(Ordering::Relaxed), 1, "only the record it missed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn host_id_records_for_a_failed_json_log_are_counted_lost() {
        let lost = LossCounter::default();
        let mut sinks = sinks_on_a_full_disk(&lost);
        assert!(sinks.write_record(&host_id()), "held in the buffer");
        sinks.flush();
        assert_eq!(lost.load(Ordering::Relaxed), 1);
        assert!(!sinks.write_record(&host_id()));
        assert_eq!(lost.load(Ordering::Relaxed), 2, "the log that failed would have taken it");
    }
}
