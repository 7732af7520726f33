//! bpf(2) without a library: map creation and access, program loading, test
//! runs, and a small assembler for the instructions natrix's XDP programs
//! are written in (uapi/linux/bpf.h and bpf_common.h give every number).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_DETACH: libc::c_long = 34;
/// enum bpf_attach_type: an XDP program on a device's receive path.
const BPF_XDP: u32 = 37;
/// The name natrix's programs carry (`bpftool prog`, `ip link`).
const PROGRAM_NAME: &[u8] = b"natrix";
#[cfg(test)]
const BPF_PROG_TEST_RUN: libc::c_long = 10;

pub(super) const BPF_MAP_TYPE_HASH: u32 = 1;
pub(super) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(super) const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub(super) const BPF_MAP_TYPE_XSKMAP: u32 = 17;
pub(super) const BPF_F_NO_PREALLOC: u32 = 1;
/// An array map whose values this process may map into its memory (Linux 5.5).
pub(super) const BPF_F_MMAPABLE: u32 = 1 << 10;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_PSEUDO_MAP_FD: u8 = 1;

// Helpers.
pub(super) const MAP_LOOKUP_ELEM: i32 = 1;
pub(super) const REDIRECT: i32 = 23;
pub(super) const REDIRECT_MAP: i32 = 51;

// XDP actions.
pub(super) const XDP_DROP: i32 = 1;
pub(super) const XDP_PASS: i32 = 2;

/// Offsets in struct xdp_md.
pub(super) const XDP_MD_DATA: i16 = 0;
pub(super) const XDP_MD_DATA_END: i16 = 4;
pub(super) const XDP_MD_INGRESS_IFINDEX: i16 = 12;
pub(super) const XDP_MD_RX_QUEUE_INDEX: i16 = 16;

// Instruction classes, sizes, modes, sources and operations.
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
const MEM: u8 = 0x60;
const IMM: u8 = 0x00;
const K: u8 = 0x00;
const X: u8 = 0x08;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
const END: u8 = 0xd0;
const TO_BE: u8 = 0x08;

/// Access sizes.
#[derive(Clone, Copy)]
pub(super) enum Size {
    B = 0x10,
    H = 0x08,
    W = 0x00,
    DW = 0x18,
}

/// 64-bit arithmetic operations.
#[derive(Clone, Copy)]
pub(super) enum Alu {
    Add = 0x00,
    Sub = 0x10,
    And = 0x50,
    Lsh = 0x60,
    Rsh = 0x70,
    Mod = 0x90,
    Xor = 0xa0,
    Mov = 0xb0,
}

/// Conditional jumps, unsigned.
#[derive(Clone, Copy)]
pub(super) enum Cond {
    Eq = 0x10,
    Gt = 0x20,
    Ne = 0x50,
    Lt = 0xa0,
    Le = 0xb0,
}

/// struct bpf_insn.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Insn {
    code: u8,
    /// dst_reg and src_reg, four bits each, in bitfield order.
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    let regs = if cfg!(target_endian = "little") { dst | src << 4 } else { dst << 4 | src };
    Insn { code, regs, off, imm }
}

/// A jump target, placed with `Asm::place`.
#[derive(Clone, Copy)]
pub(super) struct Label(usize);

/// Instructions with forward jumps to labels, resolved by `finish`.
#[derive(Default)]
pub(super) struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    jumps: Vec<(usize, usize)>,
}

impl Asm {
    pub(super) fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    pub(super) fn place(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }

    /// dst = *(size *)(src + off)
    pub(super) fn load(&mut self, size: Size, dst: u8, src: u8, off: i16) {
        self.insns.push(insn(LDX | MEM | size as u8, dst, src, off, 0));
    }

    /// *(size *)(dst + off) = src
    pub(super) fn store(&mut self, size: Size, dst: u8, off: i16, src: u8) {
        self.insns.push(insn(STX | MEM | size as u8, dst, src, off, 0));
    }

    /// *(size *)(dst + off) = imm
    pub(super) fn store_imm(&mut self, size: Size, dst: u8, off: i16, imm: i32) {
        self.insns.push(insn(ST | MEM | size as u8, dst, 0, off, imm));
    }

    /// dst op= imm
    pub(super) fn alu(&mut self, op: Alu, dst: u8, imm: i32) {
        self.insns.push(insn(ALU64 | op as u8 | K, dst, 0, 0, imm));
    }

    /// dst op= src
    pub(super) fn alu_reg(&mut self, op: Alu, dst: u8, src: u8) {
        self.insns.push(insn(ALU64 | op as u8 | X, dst, src, 0, 0));
    }

    /// The low 16 bits of dst from network to host order, zero-extended.
    pub(super) fn be16(&mut self, dst: u8) {
        self.insns.push(insn(ALU | END | TO_BE, dst, 0, 0, 16));
    }

    /// dst = the map behind `map` (a two-slot load the verifier resolves).
    pub(super) fn load_map(&mut self, dst: u8, map: RawFd) {
        self.insns.push(insn(LD | Size::DW as u8 | IMM, dst, BPF_PSEUDO_MAP_FD, 0, map));
        self.insns.push(insn(0, 0, 0, 0, 0));
    }

    /// if dst cond imm goto to
    pub(super) fn jump_if(&mut self, cond: Cond, dst: u8, imm: i32, to: Label) {
        self.jumps.push((self.insns.len(), to.0));
        self.insns.push(insn(JMP | cond as u8 | K, dst, 0, 0, imm));
    }

    /// if dst cond src goto to
    pub(super) fn jump_if_reg(&mut self, cond: Cond, dst: u8, src: u8, to: Label) {
        self.jumps.push((self.insns.len(), to.0));
        self.insns.push(insn(JMP | cond as u8 | X, dst, src, 0, 0));
    }

    pub(super) fn goto(&mut self, to: Label) {
        self.jumps.push((self.insns.len(), to.0));
        self.insns.push(insn(JMP, 0, 0, 0, 0));
    }

    pub(super) fn call(&mut self, helper: i32) {
        self.insns.push(insn(JMP | CALL, 0, 0, 0, helper));
    }

    pub(super) fn exit(&mut self) {
        self.insns.push(insn(JMP | EXIT, 0, 0, 0, 0));
    }

    /// The program, every jump pointed at its label.
    pub(super) fn finish(mut self) -> Vec<Insn> {
        for &(at, label) in &self.jumps {
            let target = self.labels[label].expect("every label used is placed");
            self.insns[at].off = i16::try_from(target as isize - at as isize - 1).expect("jumps stay short");
        }
        self.insns
    }
}

/// The leading fields of union bpf_attr for BPF_MAP_CREATE.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// The leading fields of union bpf_attr for the element commands.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The leading fields of union bpf_attr for BPF_PROG_LOAD.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

impl ProgLoadAttr {
    /// An XDP program of `insns`, named, for a link or a device, with the
    /// verifier's log going to `log` where one is given.
    fn xdp(insns: &[Insn], license: &std::ffi::CStr, log: Option<&mut [u8]>) -> ProgLoadAttr {
        let mut prog_name = [0u8; 16];
        prog_name[..PROGRAM_NAME.len()].copy_from_slice(PROGRAM_NAME);
        let (log_level, log_size, log_buf) = match log {
            Some(log) => (1, log.len() as u32, log.as_mut_ptr() as u64),
            None => (0, 0, 0),
        };
        ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level,
            log_size,
            log_buf,
            kern_version: 0,
            prog_flags: 0,
            prog_name,
            prog_ifindex: 0,
            expected_attach_type: BPF_XDP,
        }
    }
}

/// The leading fields of union bpf_attr for BPF_LINK_CREATE.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// Attaches an XDP program to interface `ifindex` in mode `flags`
/// (XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE) through a BPF link (Linux
/// 5.9): the program stays attached while the link's descriptor is open,
/// and no longer once it closes, whether the process exits or is killed.
pub(super) fn link_xdp(program: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    bpf_fd(BPF_LINK_CREATE, &LinkCreateAttr { prog_fd: program.as_raw_fd() as u32, target_ifindex: ifindex, attach_type: BPF_XDP, flags })
}

/// Detaches a link's program now, the descriptor staying open.
pub(super) fn link_detach(link: &OwnedFd) -> io::Result<()> {
    bpf(BPF_LINK_DETACH, &(link.as_raw_fd() as u32)).map(drop)
}

/// bpf(2); the kernel zero-extends an attr shorter than its own union.
fn bpf<A>(cmd: libc::c_long, attr: &A) -> io::Result<libc::c_long> {
    // SAFETY: attr is a live, initialised prefix of union bpf_attr of the
    // given size.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const A, size_of::<A>()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

fn bpf_fd<A>(cmd: libc::c_long, attr: &A) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: these commands return a new file descriptor that only we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub(super) fn map_create(map_type: u32, key_size: usize, value_size: usize, max_entries: u32, map_flags: u32) -> io::Result<OwnedFd> {
    bpf_fd(BPF_MAP_CREATE, &MapCreateAttr { map_type, key_size: key_size as u32, value_size: value_size as u32, max_entries, map_flags })
}

/// Sets `key`'s value (BPF_ANY: created or replaced).
pub(super) fn map_update<K, V>(map: &OwnedFd, key: &K, value: &V) -> io::Result<()> {
    let attr = MapElemAttr { map_fd: map.as_raw_fd() as u32, _pad: 0, key: key as *const K as u64, value: value as *const V as u64, flags: 0 };
    bpf(BPF_MAP_UPDATE_ELEM, &attr).map(drop)
}

/// Reads `key`'s value into `value`, which for a per-CPU map holds one
/// value for each possible CPU.
pub(super) fn map_lookup<K, V: ?Sized>(map: &OwnedFd, key: &K, value: &mut V) -> io::Result<()> {
    let attr = MapElemAttr { map_fd: map.as_raw_fd() as u32, _pad: 0, key: key as *const K as u64, value: value as *mut V as *mut u8 as u64, flags: 0 };
    bpf(BPF_MAP_LOOKUP_ELEM, &attr).map(drop)
}

pub(super) fn map_delete<K>(map: &OwnedFd, key: &K) -> io::Result<()> {
    let attr = MapElemAttr { map_fd: map.as_raw_fd() as u32, _pad: 0, key: key as *const K as u64, value: 0, flags: 0 };
    bpf(BPF_MAP_DELETE_ELEM, &attr).map(drop)
}

/// The values of an array map made with `BPF_F_MMAPABLE`, mapped into
/// this process: read and written without a system call, while programs
/// read and write them too, so only through the raw pointers `at` gives,
/// with volatile or atomic access, never through plain references.
pub(super) struct ArrayView {
    base: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the view is plain shared memory; every access goes through the
// raw pointers `at` hands out, whose users keep to volatile or atomic access.
unsafe impl Send for ArrayView {}
unsafe impl Sync for ArrayView {}

impl ArrayView {
    /// Maps the first `len` bytes of `map`'s values (`max_entries` times
    /// the value size rounded up to 8 bytes, for an array map).
    pub(super) fn map(map: &OwnedFd, len: usize) -> io::Result<ArrayView> {
        // SAFETY: a fresh shared mapping of a map's fd; the kernel checks
        // that the map allows it and that `len` lies within its values.
        let at = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, map.as_raw_fd(), 0) };
        if at == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = std::ptr::NonNull::new(at.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(ArrayView { base, len })
    }

    /// Where the `size` bytes at `offset` lie; panics outside the view.
    pub(super) fn at(&self, offset: usize, size: usize) -> *mut u8 {
        assert!(offset.checked_add(size).is_some_and(|end| end <= self.len), "{offset}+{size} outside a view of {} bytes", self.len);
        // SAFETY: within the mapping, checked above.
        unsafe { self.base.as_ptr().add(offset) }
    }
}

impl Drop for ArrayView {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Loads an XDP program; a refusal carries the verifier's log.
pub(super) fn load_xdp(insns: &[Insn]) -> io::Result<OwnedFd> {
    // bpf_redirect_map is a GPL-only helper.
    let license = c"GPL";
    bpf_fd(BPF_PROG_LOAD, &ProgLoadAttr::xdp(insns, license, None)).map_err(|e| with_verifier_log(insns, license, e))
}

/// Loads the program again with the verifier's log on, for the reason.
fn with_verifier_log(insns: &[Insn], license: &std::ffi::CStr, first: io::Error) -> io::Error {
    let mut log = vec![0u8; 1 << 16];
    let attr = ProgLoadAttr::xdp(insns, license, Some(&mut log));
    if bpf_fd(BPF_PROG_LOAD, &attr).is_ok() {
        return first;
    }
    let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())]).into_owned();
    // The verifier's last lines say what it refused.
    let tail: Vec<&str> = text.lines().rev().take(4).collect();
    io::Error::new(first.kind(), format!("{first}: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" / ")))
}

/// The leading fields of union bpf_attr for BPF_PROG_TEST_RUN.
#[cfg(test)]
#[repr(C)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
}

/// Runs `program` once on `frame`, rewritten in place; returns its action.
#[cfg(test)]
pub(super) fn test_run(program: &OwnedFd, frame: &mut Vec<u8>) -> io::Result<u32> {
    let input = frame.clone();
    frame.resize(input.len() + 256, 0);
    let mut attr = TestRunAttr {
        prog_fd: program.as_raw_fd() as u32,
        retval: 0,
        data_size_in: input.len() as u32,
        data_size_out: frame.len() as u32,
        data_in: input.as_ptr() as u64,
        data_out: frame.as_mut_ptr() as u64,
        repeat: 1,
        duration: 0,
    };
    // SAFETY: attr points at live buffers of the sizes it gives; the kernel
    // writes the results back into attr.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, &mut attr as *mut TestRunAttr, size_of::<TestRunAttr>()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    frame.truncate(attr.data_size_out as usize);
    Ok(attr.retval)
}

/// The number of possible CPUs, for which a per-CPU map holds values:
/// read once, as it does not change while the kernel runs.
pub(super) fn possible_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|s| s.trim().rsplit(['-', ',']).next().and_then(|last| last.parse::<usize>().ok()))
            .map_or(4096, |last| last + 1)
    })
}
