//! Capture files. In a pcapng input, frames recorded on an interface named
//! `outside` arrived from the outside and all others from the inside; a plain
//! pcap is all inside. The output is a pcapng with two interfaces, `inside`
//! (id 0) and `outside` (id 1), naming the side each frame leaves by.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use natrix_engine::Side;
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::{Block, PcapNgReader, PcapNgWriter};
use pcap_file::DataLink;

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
const PCAP_MAGICS: [[u8; 4]; 4] = [[0xa1, 0xb2, 0xc3, 0xd4], [0xd4, 0xc3, 0xb2, 0xa1], [0xa1, 0xb2, 0x3c, 0x4d], [0x4d, 0x3c, 0xb2, 0xa1]];
/// pcapng's default timestamp unit (if_tsresol absent): microseconds.
const DEFAULT_TSRESOL: u8 = 6;
const OUTSIDE_NAME: &str = "outside";

#[derive(Debug)]
pub enum CaptureError {
    Open { path: PathBuf, source: io::Error },
    Format { path: PathBuf, detail: String },
    Write { path: PathBuf, detail: String },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::Open { path, source } => write!(f, "{}: {source}", path.display()),
            CaptureError::Format { path, detail } => write!(f, "{}: {detail}", path.display()),
            CaptureError::Write { path, detail } => write!(f, "{}: cannot write: {detail}", path.display()),
        }
    }
}

impl std::error::Error for CaptureError {}

/// One frame read from a capture; the bytes were copied into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadFrame {
    pub side: Side,
    pub time_ns: u64,
}

/// Counts the bytes the parser has pulled from the file, for progress.
struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

type Source = Counting<BufReader<File>>;

enum Format {
    Pcap(PcapReader<Source>),
    PcapNg(PcapNgReader<Source>),
}

pub struct CaptureReader {
    path: PathBuf,
    format: Format,
    read: Rc<Cell<u64>>,
    size: u64,
    last_ns: u64,
}

impl CaptureReader {
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let open_err = |source| CaptureError::Open { path: path.to_path_buf(), source };
        let format_err = |detail: String| CaptureError::Format { path: path.to_path_buf(), detail };
        let file = File::open(path).map_err(open_err)?;
        let size = file.metadata().map_err(open_err)?.len();
        let mut inner = BufReader::with_capacity(1 << 20, file);
        // Peek at the magic number; the parsers read it again from the buffer.
        let magic: [u8; 4] = inner.fill_buf().map_err(open_err)?.get(..4).and_then(|m| m.try_into().ok()).ok_or_else(|| format_err("too short to be a capture file".into()))?;
        let read = Rc::new(Cell::new(0));
        let source = Counting { inner, read: Rc::clone(&read) };
        let format = if magic == PCAPNG_MAGIC {
            Format::PcapNg(PcapNgReader::new(source).map_err(|e| format_err(format!("bad pcapng section header: {e}")))?)
        } else if PCAP_MAGICS.contains(&magic) {
            let r = PcapReader::new(source).map_err(|e| format_err(format!("bad pcap header: {e}")))?;
            if r.header().datalink != DataLink::ETHERNET {
                return Err(format_err(format!("link type {:?} is not Ethernet", r.header().datalink)));
            }
            Format::Pcap(r)
        } else {
            return Err(format_err("not a pcap or pcapng file".into()));
        };
        Ok(CaptureReader { path: path.to_path_buf(), format, read, size, last_ns: 0 })
    }

    /// File size and bytes consumed so far.
    pub fn progress(&self) -> (u64, u64) {
        (self.read.get().min(self.size), self.size)
    }

    /// Reads the next frame into `buf`; `None` at the end of the file.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<ReadFrame>, CaptureError> {
        let frame = match &mut self.format {
            Format::Pcap(r) => next_pcap(r, buf),
            Format::PcapNg(r) => next_pcapng(r, buf, self.last_ns),
        };
        match frame {
            Ok(Some(f)) => {
                self.last_ns = f.time_ns;
                Ok(Some(f))
            }
            Ok(None) => Ok(None),
            Err(detail) => Err(CaptureError::Format { path: self.path.clone(), detail }),
        }
    }
}

fn next_pcap(r: &mut PcapReader<Source>, buf: &mut Vec<u8>) -> Result<Option<ReadFrame>, String> {
    match r.next_packet() {
        None => Ok(None),
        Some(Err(e)) => Err(format!("bad pcap record: {e}")),
        Some(Ok(p)) => {
            buf.clear();
            buf.extend_from_slice(&p.data);
            Ok(Some(ReadFrame { side: Side::Inside, time_ns: duration_ns(p.timestamp) }))
        }
    }
}

fn next_pcapng(r: &mut PcapNgReader<Source>, buf: &mut Vec<u8>, last_ns: u64) -> Result<Option<ReadFrame>, String> {
    loop {
        let (iface, raw_ts) = match r.next_block() {
            None => return Ok(None),
            Some(Err(e)) => return Err(format!("bad pcapng block: {e}")),
            Some(Ok(Block::EnhancedPacket(p))) => {
                buf.clear();
                buf.extend_from_slice(&p.data);
                (p.interface_id, Some(p.timestamp))
            }
            // A simple packet block has no timestamp and belongs to interface 0.
            Some(Ok(Block::SimplePacket(p))) => {
                buf.clear();
                buf.extend_from_slice(&p.data);
                (0, None)
            }
            Some(Ok(_)) => continue,
        };
        let idb = r.interfaces().get(iface as usize).ok_or_else(|| format!("packet on undeclared interface {iface}"))?;
        if idb.linktype != DataLink::ETHERNET {
            return Err(format!("interface {iface} has link type {:?}, not Ethernet", idb.linktype));
        }
        let side = if if_name(idb) == Some(OUTSIDE_NAME) { Side::Outside } else { Side::Inside };
        let time_ns = raw_ts.map_or(last_ns, |ts| scale_timestamp(duration_ns(ts), if_tsresol(idb)));
        return Ok(Some(ReadFrame { side, time_ns }));
    }
}

fn if_name<'a>(idb: &'a InterfaceDescriptionBlock) -> Option<&'a str> {
    idb.options.iter().find_map(|o| match o {
        InterfaceDescriptionOption::IfName(n) => Some(n.as_ref()),
        _ => None,
    })
}

fn if_tsresol(idb: &InterfaceDescriptionBlock) -> u8 {
    idb.options
        .iter()
        .find_map(|o| match o {
            InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
            _ => None,
        })
        .unwrap_or(DEFAULT_TSRESOL)
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// pcap-file hands the raw 64-bit EPB timestamp over as nanoseconds whatever
/// the interface's unit; `tsresol` (pcapng section 4.2) says what it counts:
/// 10^-n seconds, or 2^-n seconds when the top bit is set.
fn scale_timestamp(raw: u64, tsresol: u8) -> u64 {
    let raw = u128::from(raw);
    let ns = if tsresol & 0x80 == 0 {
        let exp = u32::from(tsresol);
        if exp <= 9 {
            raw * 10u128.pow(9 - exp)
        } else {
            raw / 10u128.pow((exp - 9).min(38))
        }
    } else {
        let exp = u32::from(tsresol & 0x7f).min(127);
        (raw * 1_000_000_000) >> exp
    };
    u64::try_from(ns).unwrap_or(u64::MAX)
}

/// The replay output: a pcapng with interfaces `inside` (0) and `outside` (1).
pub struct CaptureWriter {
    path: PathBuf,
    writer: PcapNgWriter<BufWriter<File>>,
}

impl CaptureWriter {
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        let write_err = |detail: String| CaptureError::Write { path: path.to_path_buf(), detail };
        let file = File::create(path).map_err(|source| CaptureError::Open { path: path.to_path_buf(), source })?;
        let mut writer = PcapNgWriter::new(BufWriter::with_capacity(1 << 20, file)).map_err(|e| write_err(e.to_string()))?;
        for side in [Side::Inside, Side::Outside] {
            let idb = InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: 0,
                options: vec![InterfaceDescriptionOption::IfName(Cow::Borrowed(side.name())), InterfaceDescriptionOption::IfTsResol(9)],
            };
            writer.write_pcapng_block(idb).map_err(|e| write_err(e.to_string()))?;
        }
        Ok(CaptureWriter { path: path.to_path_buf(), writer })
    }

    pub fn write(&mut self, side: Side, time_ns: u64, data: &[u8]) -> Result<(), CaptureError> {
        let epb = EnhancedPacketBlock {
            interface_id: side as u32,
            timestamp: Duration::from_nanos(time_ns),
            original_len: data.len() as u32,
            data: Cow::Borrowed(data),
            options: Vec::new(),
        };
        self.writer.write_pcapng_block(epb).map_err(|e| CaptureError::Write { path: self.path.clone(), detail: e.to_string() })?;
        Ok(())
    }

    pub fn finish(self) -> Result<(), CaptureError> {
        use std::io::Write;
        let path = self.path;
        self.writer.into_inner().flush().map_err(|e| CaptureError::Write { path, detail: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_scale_by_interface_resolution() {
        assert_eq!(scale_timestamp(1_500_000, 6), 1_500_000_000);
        assert_eq!(scale_timestamp(7, 9), 7);
        assert_eq!(scale_timestamp(3, 0), 3_000_000_000);
        assert_eq!(scale_timestamp(1 << 10, 0x80 | 10), 1_000_000_000);
        assert_eq!(scale_timestamp(12_000, 12), 12);
    }

    #[test]
    fn written_capture_reads_back_with_sides_and_times() {
        let dir = std::env::temp_dir().join(format!("natrix-io-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rt.pcapng");
        let mut w = CaptureWriter::create(&path).unwrap();
        w.write(Side::Inside, 1_000_000_123, &[1; 60]).unwrap();
        w.write(Side::Outside, 2_000_000_456, &[2; 64]).unwrap();
        w.finish().unwrap();
        let mut r = CaptureReader::open(&path).unwrap();
        let mut buf = Vec::new();
        assert_eq!(r.next_into(&mut buf).unwrap(), Some(ReadFrame { side: Side::Inside, time_ns: 1_000_000_123 }));
        assert_eq!(buf, vec![1; 60]);
        assert_eq!(r.next_into(&mut buf).unwrap(), Some(ReadFrame { side: Side::Outside, time_ns: 2_000_000_456 }));
        assert_eq!(buf, vec![2; 64]);
        assert_eq!(r.next_into(&mut buf).unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_files_that_are_not_captures() {
        let path = std::env::temp_dir().join(format!("natrix-io-bad-{}", std::process::id()));
        std::fs::write(&path, b"hello world, not a capture").unwrap();
        let err = CaptureReader::open(&path).err().unwrap().to_string();
        assert!(err.contains("not a pcap or pcapng"), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
