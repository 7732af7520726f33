//! Capture files. In a pcapng input, frames recorded on an interface named
//! `outside` arrived from the outside and all others from the inside; a plain
//! pcap is all inside. The output is a pcapng with two interfaces, `inside`
//! (id 0) and `outside` (id 1), naming the side each frame leaves by.

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use natrix_engine::Side;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapParser, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::{Block, PcapNgParser, PcapNgWriter};
use pcap_file::{DataLink, PcapError, TsResolution};

use crate::output::PendingFile;

const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
const PCAP_MAGICS: [[u8; 4]; 4] = [[0xa1, 0xb2, 0xc3, 0xd4], [0xd4, 0xc3, 0xb2, 0xa1], [0xa1, 0xb2, 0x3c, 0x4d], [0x4d, 0x3c, 0xb2, 0xa1]];
/// pcapng's default timestamp unit (if_tsresol absent): microseconds.
const DEFAULT_TSRESOL: u8 = 6;
const OUTSIDE_NAME: &str = "outside";

#[derive(Debug)]
pub enum CaptureError {
    Open {
        path: PathBuf,
        source: io::Error,
    },
    Format {
        path: PathBuf,
        detail: String,
    },
    Write {
        path: PathBuf,
        detail: String,
    },
    /// The file ends inside a record (what a crashed capture leaves): every
    /// frame before it was read.
    Truncated {
        path: PathBuf,
        frames: u64,
        offset: u64,
        size: u64,
    },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::Open { path, source } => write!(f, "{}: {source}", path.display()),
            CaptureError::Format { path, detail } => write!(f, "{}: {detail}", path.display()),
            CaptureError::Write { path, detail } => write!(f, "{}: cannot write: {detail}", path.display()),
            CaptureError::Truncated { path, frames, offset, size } => {
                write!(f, "{}: truncated after frame {frames} (byte offset {offset}; the last {} bytes are an incomplete record)", path.display(), size - offset)
            }
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

/// A pcapng block larger than this is a corrupt length field, not a frame.
const MAX_RECORD: usize = 64 << 20;
const READ_CHUNK: usize = 1 << 20;

/// The file's bytes, read in chunks; the parsers see what is buffered and
/// say how much they used, so the reader always knows the file offset of
/// the first record it has not finished.
struct Input {
    file: File,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// File offset of `buf[start]`.
    offset: u64,
}

impl Input {
    fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        self.offset += n as u64;
    }

    /// Reads more of the file behind what is buffered; false at its end.
    fn refill(&mut self) -> io::Result<bool> {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        if self.end == self.buf.len() {
            if self.buf.len() >= MAX_RECORD {
                return Err(io::Error::other(format!("a record longer than {} MiB", MAX_RECORD >> 20)));
            }
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = read_some(&mut self.file, &mut self.buf[self.end..])?;
        self.end += n;
        Ok(n > 0)
    }
}

fn read_some(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match file.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// What one parser step gives: the bytes it used and maybe a frame.
type Step = Result<(usize, Option<ReadFrame>), StepError>;

enum StepError {
    /// The buffered bytes end inside a record.
    Incomplete,
    Bad(String),
}

impl StepError {
    fn from_pcap(e: PcapError, what: &str) -> StepError {
        match e {
            PcapError::IncompleteBuffer => StepError::Incomplete,
            e => StepError::Bad(format!("bad {what}: {e}")),
        }
    }
}

enum Format {
    Pcap(PcapParser),
    PcapNg(PcapNgParser),
}

pub struct CaptureReader {
    path: PathBuf,
    input: Input,
    format: Format,
    size: u64,
    frames: u64,
    last_ns: u64,
}

impl CaptureReader {
    pub fn open(path: &Path) -> Result<Self, CaptureError> {
        let open_err = |source| CaptureError::Open { path: path.to_path_buf(), source };
        let format_err = |detail: String| CaptureError::Format { path: path.to_path_buf(), detail };
        let file = File::open(path).map_err(open_err)?;
        let size = file.metadata().map_err(open_err)?.len();
        let mut input = Input { file, buf: vec![0; READ_CHUNK], start: 0, end: 0, offset: 0 };
        let format = loop {
            let header = match input.data().get(..4) {
                None => Err(StepError::Incomplete),
                Some(m) if m == PCAPNG_MAGIC => PcapNgParser::new(input.data())
                    .map(|(rest, p)| (input.data().len() - rest.len(), Format::PcapNg(p)))
                    .map_err(|e| StepError::from_pcap(e, "pcapng section header")),
                Some(m) if PCAP_MAGICS.iter().any(|x| x == m) => {
                    PcapParser::new(input.data()).map(|(rest, p)| (input.data().len() - rest.len(), Format::Pcap(p))).map_err(|e| StepError::from_pcap(e, "pcap header"))
                }
                Some(_) => return Err(format_err("not a pcap or pcapng file".into())),
            };
            match header {
                Ok((used, format)) => {
                    input.consume(used);
                    break format;
                }
                Err(StepError::Bad(detail)) => return Err(format_err(detail)),
                Err(StepError::Incomplete) => {
                    if !input.refill().map_err(open_err)? {
                        return Err(format_err("too short to be a capture file".into()));
                    }
                }
            }
        };
        if let Format::Pcap(p) = &format {
            if p.header().datalink != DataLink::ETHERNET {
                return Err(format_err(format!("link type {:?} is not Ethernet", p.header().datalink)));
            }
        }
        Ok(CaptureReader { path: path.to_path_buf(), input, format, size, frames: 0, last_ns: 0 })
    }

    /// Bytes read so far and the file size.
    pub fn progress(&self) -> (u64, u64) {
        (self.input.offset.min(self.size), self.size)
    }

    /// Reads the next frame into `buf`; `None` at the end of the file. A
    /// file that ends inside a record gives `CaptureError::Truncated` once
    /// every complete frame has been read.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> Result<Option<ReadFrame>, CaptureError> {
        loop {
            let data = self.input.data();
            let step = if data.is_empty() {
                Err(StepError::Incomplete)
            } else {
                match &mut self.format {
                    Format::Pcap(p) => pcap_step(p, data, buf),
                    Format::PcapNg(p) => pcapng_step(p, data, buf, self.last_ns),
                }
            };
            match step {
                Ok((used, frame)) => {
                    self.input.consume(used);
                    if let Some(f) = frame {
                        self.frames += 1;
                        self.last_ns = f.time_ns;
                        return Ok(Some(f));
                    }
                }
                Err(StepError::Bad(detail)) => return Err(CaptureError::Format { path: self.path.clone(), detail }),
                Err(StepError::Incomplete) => {
                    let more = self.input.refill().map_err(|source| CaptureError::Open { path: self.path.clone(), source })?;
                    if !more {
                        return self.at_end();
                    }
                }
            }
        }
    }

    fn at_end(&self) -> Result<Option<ReadFrame>, CaptureError> {
        if self.input.data().is_empty() {
            return Ok(None);
        }
        Err(CaptureError::Truncated { path: self.path.clone(), frames: self.frames, offset: self.input.offset, size: self.input.offset + self.input.data().len() as u64 })
    }
}

fn pcap_step(p: &PcapParser, data: &[u8], buf: &mut Vec<u8>) -> Step {
    let (rest, packet) = p.next_packet(data).map_err(|e| StepError::from_pcap(e, "pcap record"))?;
    buf.clear();
    buf.extend_from_slice(&packet.data);
    Ok((data.len() - rest.len(), Some(ReadFrame { side: Side::Inside, time_ns: duration_ns(packet.timestamp) })))
}

fn pcapng_step(p: &mut PcapNgParser, data: &[u8], buf: &mut Vec<u8>, last_ns: u64) -> Step {
    let (rest, block) = p.next_block(data).map_err(|e| StepError::from_pcap(e, "pcapng block"))?;
    let used = data.len() - rest.len();
    let (iface, raw_ts) = match block {
        Block::EnhancedPacket(pkt) => {
            buf.clear();
            buf.extend_from_slice(&pkt.data);
            (pkt.interface_id, Some(pkt.timestamp))
        }
        // A simple packet block has no timestamp and belongs to interface 0.
        Block::SimplePacket(pkt) => {
            buf.clear();
            buf.extend_from_slice(&pkt.data);
            (0, None)
        }
        _ => return Ok((used, None)),
    };
    let idb = p.interfaces().get(iface as usize).ok_or_else(|| StepError::Bad(format!("packet on undeclared interface {iface}")))?;
    if idb.linktype != DataLink::ETHERNET {
        return Err(StepError::Bad(format!("interface {iface} has link type {:?}, not Ethernet", idb.linktype)));
    }
    let side = if if_name(idb) == Some(OUTSIDE_NAME) { Side::Outside } else { Side::Inside };
    let time_ns = raw_ts.map_or(last_ns, |ts| scale_timestamp(duration_ns(ts), if_tsresol(idb)));
    Ok((used, Some(ReadFrame { side, time_ns })))
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

/// The replay output: a pcapng with interfaces `inside` (0) and `outside`
/// (1), written beside its final name and moved there by `finish`, so a
/// replay that fails leaves no half-written capture under that name.
pub struct CaptureWriter {
    path: PathBuf,
    pending: PendingFile,
    writer: PcapNgWriter<BufWriter<File>>,
}

impl CaptureWriter {
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        let write_err = |detail: String| CaptureError::Write { path: path.to_path_buf(), detail };
        let (pending, file) = PendingFile::create(path).map_err(|source| CaptureError::Open { path: path.to_path_buf(), source })?;
        let mut writer = PcapNgWriter::new(BufWriter::with_capacity(1 << 20, file)).map_err(|e| write_err(e.to_string()))?;
        for side in [Side::Inside, Side::Outside] {
            let idb = InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: 0,
                options: vec![InterfaceDescriptionOption::IfName(Cow::Borrowed(side.name())), InterfaceDescriptionOption::IfTsResol(9)],
            };
            writer.write_pcapng_block(idb).map_err(|e| write_err(e.to_string()))?;
        }
        Ok(CaptureWriter { path: path.to_path_buf(), pending, writer })
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

    /// Flushes the capture and gives it its final name.
    pub fn finish(self) -> Result<(), CaptureError> {
        let CaptureWriter { path, pending, writer } = self;
        let write_err = |e: io::Error| CaptureError::Write { path: path.clone(), detail: e.to_string() };
        let file = writer.into_inner().into_inner().map_err(|e| write_err(e.into_error()))?;
        file.sync_all().map_err(write_err)?;
        pending.commit().map_err(write_err)
    }
}

/// A capture of frames all on one side (a generator's): a classic pcap,
/// with nanosecond time stamps, where the name ends in `.pcap`, for tools
/// that read nothing else; else a pcapng as `CaptureWriter` writes it.
/// Written beside its final name, as `CaptureWriter` is.
pub enum OneSideCapture {
    Pcap { path: PathBuf, pending: PendingFile, writer: PcapWriter<BufWriter<File>> },
    PcapNg(CaptureWriter),
}

impl OneSideCapture {
    pub fn create(path: &Path) -> Result<Self, CaptureError> {
        if !path.extension().is_some_and(|e| e.eq_ignore_ascii_case("pcap")) {
            return CaptureWriter::create(path).map(OneSideCapture::PcapNg);
        }
        let (pending, file) = PendingFile::create(path).map_err(|source| CaptureError::Open { path: path.to_path_buf(), source })?;
        let header = PcapHeader { ts_resolution: TsResolution::NanoSecond, datalink: DataLink::ETHERNET, ..PcapHeader::default() };
        let writer =
            PcapWriter::with_header(BufWriter::with_capacity(1 << 20, file), header).map_err(|e| CaptureError::Write { path: path.to_path_buf(), detail: e.to_string() })?;
        Ok(OneSideCapture::Pcap { path: path.to_path_buf(), pending, writer })
    }

    pub fn write(&mut self, time_ns: u64, data: &[u8]) -> Result<(), CaptureError> {
        match self {
            OneSideCapture::PcapNg(w) => w.write(Side::Inside, time_ns, data),
            OneSideCapture::Pcap { path, writer, .. } => {
                let packet = PcapPacket::new(Duration::from_nanos(time_ns), data.len() as u32, data);
                writer.write_packet(&packet).map(drop).map_err(|e| CaptureError::Write { path: path.clone(), detail: e.to_string() })
            }
        }
    }

    /// "pcap" or "pcapng".
    pub fn format(&self) -> &'static str {
        match self {
            OneSideCapture::Pcap { .. } => "pcap",
            OneSideCapture::PcapNg(_) => "pcapng",
        }
    }

    /// Flushes the capture and gives it its final name.
    pub fn finish(self) -> Result<(), CaptureError> {
        match self {
            OneSideCapture::PcapNg(w) => w.finish(),
            OneSideCapture::Pcap { path, pending, writer } => {
                let write_err = |e: io::Error| CaptureError::Write { path: path.clone(), detail: e.to_string() };
                let file = writer.into_writer().into_inner().map_err(|e| write_err(e.into_error()))?;
                file.sync_all().map_err(write_err)?;
                pending.commit().map_err(write_err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_named_pcap_is_a_classic_pcap_with_nanosecond_stamps() {
        let dir = std::env::temp_dir().join(format!("natrix-one-side-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Classic pcap's nanosecond magic 0xa1b23c4d, in either byte order.
        let nanosecond_pcap = [[0xa1, 0xb2, 0x3c, 0x4d], [0x4d, 0x3c, 0xb2, 0xa1]];
        for (name, magics) in [("gen.pcap", &nanosecond_pcap[..]), ("GEN.PCAP", &nanosecond_pcap[..]), ("gen.pcapng", &[PCAPNG_MAGIC][..])] {
            let path = dir.join(name);
            let mut w = OneSideCapture::create(&path).unwrap();
            w.write(1_500_000_123, &[0xaa; 60]).unwrap();
            w.write(1_500_000_456, &[0xbb; 64]).unwrap();
            w.finish().unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert!(magics.iter().any(|m| bytes[..4] == m[..]), "{name}: {:02x?}", &bytes[..4]);
            let mut r = CaptureReader::open(&path).unwrap();
            let mut buf = Vec::new();
            let first = r.next_into(&mut buf).unwrap().expect("a first frame");
            assert_eq!((first.time_ns, buf.as_slice()), (1_500_000_123, &[0xaa; 60][..]), "{name}");
            let second = r.next_into(&mut buf).unwrap().expect("a second frame");
            assert_eq!((second.time_ns, buf.len()), (1_500_000_456, 64), "{name}");
            assert!(r.next_into(&mut buf).unwrap().is_none());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

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

    /// Reads every frame, then what ended the file.
    fn read_all(path: &Path) -> (Vec<Vec<u8>>, Result<(), CaptureError>) {
        let mut r = CaptureReader::open(path).unwrap();
        let mut frames = Vec::new();
        let mut buf = Vec::new();
        loop {
            match r.next_into(&mut buf) {
                Ok(Some(_)) => frames.push(buf.clone()),
                Ok(None) => return (frames, Ok(())),
                Err(e) => return (frames, Err(e)),
            }
        }
    }

    #[test]
    fn a_capture_cut_short_gives_every_complete_frame_then_says_where_it_ends() {
        let dir = std::env::temp_dir().join(format!("natrix-io-trunc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let full = dir.join("full.pcapng");
        let mut w = CaptureWriter::create(&full).unwrap();
        for i in 0..3u8 {
            w.write(Side::Inside, u64::from(i) * 1000, &[i; 100]).unwrap();
        }
        w.finish().unwrap();
        let bytes = std::fs::read(&full).unwrap();
        // Each frame is an EPB of 28 + 100 + 4 bytes of framing and data.
        let epb = 132usize;
        let third_starts = bytes.len() - epb;
        let cut = dir.join("cut.pcapng");
        for keep in [third_starts + 1, third_starts + 60, bytes.len() - 1] {
            std::fs::write(&cut, &bytes[..keep]).unwrap();
            let (frames, end) = read_all(&cut);
            assert_eq!(frames, vec![vec![0; 100], vec![1; 100]], "cut at {keep}");
            match end {
                Err(CaptureError::Truncated { frames: 2, offset, size, .. }) => {
                    assert_eq!((offset, size), (third_starts as u64, keep as u64));
                }
                other => panic!("cut at {keep}: {other:?}"),
            }
        }
        // A cut exactly between records is a complete, shorter capture.
        std::fs::write(&cut, &bytes[..third_starts]).unwrap();
        let (frames, end) = read_all(&cut);
        assert_eq!(frames.len(), 2);
        assert!(end.is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_classic_pcap_cut_short_is_read_to_its_last_whole_record() {
        // pcap header (24 bytes, microseconds, Ethernet) and two 16 + 60 byte records.
        let mut bytes = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 1, 0, 0, 0];
        for i in 0..2u8 {
            bytes.extend_from_slice(&[i, 0, 0, 0, 0, 0, 0, 0, 60, 0, 0, 0, 60, 0, 0, 0]);
            bytes.extend_from_slice(&[i; 60]);
        }
        let path = std::env::temp_dir().join(format!("natrix-io-trunc-{}.pcap", std::process::id()));
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let (frames, end) = read_all(&path);
        assert_eq!(frames, vec![vec![0; 60]]);
        assert!(matches!(end, Err(CaptureError::Truncated { frames: 1, offset: 100, size: 166, .. })), "{end:?}");
        let msg = end.unwrap_err().to_string();
        assert!(msg.contains("truncated after frame 1") && msg.contains("byte offset 100"), "{msg}");
        std::fs::remove_file(&path).unwrap();
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
