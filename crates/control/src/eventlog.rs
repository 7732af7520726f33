//! NAT event log as JSON lines (RFC 6888 section 4: who held which external
//! address and port, when). One object per line; `time` is RFC 3339 UTC and
//! `nat_event` the RFC 8158 natEvent value, so IPFIX and JSON say the same.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::Ipv4Addr;
use std::path::Path;

use natrix_engine::host_id::{HostIdEvent, Which};
use natrix_engine::{Event, EventKind};

use crate::config::LogUnit;
use serde::Serialize;

#[derive(Serialize)]
struct Line {
    time: String,
    event: &'static str,
    nat_event: u8,
    proto: &'static str,
    subscriber: Ipv4Addr,
    /// A DS-Lite host's B4 (RFC 6333); `subscriber` is then its address in the softwire.
    #[serde(skip_serializing_if = "Option::is_none")]
    b4: Option<std::net::Ipv6Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subscriber_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    external: Option<Ipv4Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    external_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    port_range_end: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote: Option<Ipv4Addr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remote_port: Option<u16>,
}

/// A `[[host_id.rule]]` with `action = "log"` (seed 000 section 8.4):
/// the segment's endpoints as it arrived, the option and its value.
#[derive(Serialize)]
struct HostIdLine {
    time: String,
    event: &'static str,
    rule: usize,
    option: &'static str,
    /// WING's 2 data bytes or BOUCADAIR's 8 bytes after the length, as
    /// the rules compare them; absent for ENABLED.
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_hex: Option<String>,
    side: &'static str,
    src: Ipv4Addr,
    src_port: u16,
    dst: Ipv4Addr,
    dst_port: u16,
}

/// `natrix run` began: it holds no mapping then, so every mapping the log
/// shows open before this line ended by this time at the latest, though a
/// natrix that stopped uncleanly logged no deletion (`natrix whois`).
#[derive(Serialize)]
struct StartLine {
    time: String,
    event: &'static str,
}

/// The `event` of the line `natrix run` writes as it starts.
pub const START_EVENT: &str = "natrix_start";

pub struct EventLog {
    out: BufWriter<File>,
    unit: LogUnit,
    written: u64,
    bytes: u64,
}

impl EventLog {
    /// Writes to a file the caller opened (replay writes a new log beside
    /// the old one and renames it into place when the replay succeeds).
    pub fn to_file(file: File, unit: LogUnit) -> Self {
        EventLog { out: BufWriter::new(file), unit, written: 0, bytes: 0 }
    }

    /// Opens for appending: a live natrix never truncates its own records.
    /// A last line a failed write left without its newline gets one, so
    /// that it does not swallow the next record.
    pub fn append(path: &Path, unit: LogUnit) -> io::Result<Self> {
        let open = |read| std::fs::OpenOptions::new().create(true).append(true).read(read).open(path);
        // A file natrix may write but not read is appended to unlooked at.
        let (mut file, readable) = match open(true) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => (open(false)?, false),
            other => (other?, true),
        };
        if readable && ends_mid_line(&file)? {
            file.write_all(b"\n")?;
        }
        Ok(EventLog { out: BufWriter::new(file), unit, written: 0, bytes: 0 })
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Lets the log go after a write failed, without another try, and
    /// says how many records it loses: those whose line has not reached the
    /// file whole (each ends with a newline, and a write that failed leaves
    /// what it did not write in the buffer).
    pub fn abandon(self) -> u64 {
        let lost = self.out.buffer().iter().filter(|&&b| b == b'\n').count() as u64;
        drop(self.out.into_parts());
        lost
    }

    /// Writes the event if the configured unit records it.
    pub fn write(&mut self, e: &Event) -> io::Result<()> {
        if !records_event(self.unit, e) {
            return Ok(());
        }
        let mut line = serde_json::to_vec(&line_for(e)).map_err(io::Error::other)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.written += 1;
        self.bytes += line.len() as u64;
        Ok(())
    }

    /// Writes a HOST_ID policy event (every unit records them: a rule asked for it).
    /// Marks natrix's start at `time_ns` (`StartLine`); not a record.
    pub fn write_start(&mut self, time_ns: u64) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(&StartLine { time: rfc3339(time_ns), event: START_EVENT }).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.out.write_all(&bytes)?;
        self.bytes += bytes.len() as u64;
        self.out.flush()
    }

    pub fn write_host_id(&mut self, e: &HostIdEvent) -> io::Result<()> {
        let hex_digits = if e.option == Which::Boucadair { 16 } else { 4 };
        let line = HostIdLine {
            time: rfc3339(e.time_ns),
            event: "host_id",
            rule: e.rule,
            option: e.option.name(),
            value: e.value,
            value_hex: e.value.map(|v| format!("0x{v:0hex_digits$x}")),
            side: e.side.name(),
            src: Ipv4Addr::from(e.src),
            src_port: e.src_port,
            dst: Ipv4Addr::from(e.dst),
            dst_port: e.dst_port,
        };
        let mut bytes = serde_json::to_vec(&line).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.out.write_all(&bytes)?;
        self.written += 1;
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    /// Records and bytes written so far.
    pub fn volume(&self) -> (u64, u64) {
        (self.written, self.bytes)
    }

    /// Flushes what is buffered and hands the file back.
    pub fn finish(self) -> io::Result<File> {
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

/// In block mode one record per block replaces the per-mapping ones;
/// exhaustion and quota events are always recorded.
pub fn records(unit: LogUnit, kind: EventKind) -> bool {
    use EventKind::*;
    match kind {
        MappingCreated | MappingDeleted => unit != LogUnit::Block,
        SessionCreated | SessionDeleted => unit == LogUnit::Session,
        BlockAllocated | BlockReleased => unit == LogUnit::Block,
        AddressesExhausted | PortsExhausted | QuotaExceeded => true,
    }
}

/// Whether a regular file's last byte is not a newline.
fn ends_mid_line(file: &File) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() == 0 {
        return Ok(false);
    }
    let mut last = [0u8];
    file.read_exact_at(&mut last, meta.len() - 1)?;
    Ok(last[0] != b'\n')
}

/// Whether the configured unit records event `e`. SCTP associations hold no
/// port block (their ports are never translated), so their mapping records
/// are kept in block mode too: without them `whois` could not answer.
pub fn records_event(unit: LogUnit, e: &Event) -> bool {
    records(unit, e.kind) || (e.proto == natrix_engine::Proto::Sctp && matches!(e.kind, EventKind::MappingCreated | EventKind::MappingDeleted))
}

/// Bytes of the event's JSON line, newline included: the replay report's
/// log volume is measured in the log's own format.
pub fn line_len(e: &Event) -> u64 {
    serde_json::to_vec(&line_for(e)).map_or(0, |v| v.len() as u64 + 1)
}

fn line_for(e: &Event) -> Line {
    let is_block = matches!(e.kind, EventKind::BlockAllocated | EventKind::BlockReleased);
    let is_session = matches!(e.kind, EventKind::SessionCreated | EventKind::SessionDeleted);
    let nonzero_addr = |a: u32| (a != 0).then(|| Ipv4Addr::from(a));
    Line {
        time: rfc3339(e.time_ns),
        event: e.kind.name(),
        nat_event: e.kind as u8,
        proto: e.proto.name(),
        subscriber: Ipv4Addr::from(e.int_addr),
        b4: e.b4,
        subscriber_port: (!is_block).then_some(e.int_port),
        external: nonzero_addr(e.ext_addr),
        external_port: (e.ext_addr != 0).then_some(e.ext_port),
        port_range_end: is_block.then_some(e.ext_port_end),
        remote: if is_session { nonzero_addr(e.rem_addr) } else { None },
        remote_port: is_session.then_some(e.rem_port),
    }
}

/// RFC 3339 UTC with milliseconds, from nanoseconds since the Unix epoch.
pub fn rfc3339(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let ms = (ns / 1_000_000) % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_unit_logs_blocks_not_mappings() {
        assert!(records(LogUnit::Block, EventKind::BlockAllocated));
        assert!(!records(LogUnit::Block, EventKind::MappingCreated));
        assert!(!records(LogUnit::Mapping, EventKind::BlockAllocated));
        assert!(!records(LogUnit::Mapping, EventKind::SessionCreated));
        assert!(records(LogUnit::Session, EventKind::SessionDeleted));
        assert!(records(LogUnit::Block, EventKind::QuotaExceeded));
    }

    #[test]
    fn a_log_reopened_after_a_torn_line_starts_on_a_line_of_its_own() {
        let dir = std::env::temp_dir().join(format!("natrix-eventlog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.jsonl");
        std::fs::write(&path, b"{\"whole\":1}\n{\"torn").unwrap();
        drop(EventLog::append(&path, LogUnit::Mapping).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"whole\":1}\n{\"torn\n");
        drop(EventLog::append(&path, LogUnit::Mapping).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"whole\":1}\n{\"torn\n", "a whole last line is left alone");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rfc3339_matches_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_435_200_123_000_000), "2026-11-23T12:00:00.123Z");
    }
}
