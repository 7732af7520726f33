//! The XDP program that redirects the interface's frames into the socket,
//! loaded with bpf(2) and kept attached (through `netlink`) until drop.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::netlink::{
    netlink_socket, set_link_xdp, IFLA_XDP_EXPECTED_FD, IFLA_XDP_FD, IFLA_XDP_FLAGS, XDP_FLAGS_DRV_MODE, XDP_FLAGS_REPLACE, XDP_FLAGS_SKB_MODE, XDP_FLAGS_UPDATE_IF_NOEXIST,
};
use super::{os_error, unsupported};
use crate::port::IoError;

/// The redirect program, attached to the interface until drop.
pub(super) struct XdpProgram {
    /// Opened in the interface's network namespace at attach time, so the
    /// detach on drop reaches the same interface whichever thread drops.
    netlink: OwnedFd,
    ifindex: u32,
    /// XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE: detaching names the mode.
    mode: u32,
    program: OwnedFd,
}

impl XdpProgram {
    /// Attaches a program that sends receive queue q's frames to
    /// `sockets[q]` (and passes frames of other queues to the kernel).
    pub(super) fn attach(sockets: &[RawFd], ifindex: u32, interface: &str) -> Result<XdpProgram, IoError> {
        let map = xskmap(sockets.len() as u32).map_err(|e| unsupported("creating the XSKMAP", interface, e))?;
        let program = load_program(&map).map_err(|e| unsupported("loading the XDP program", interface, e))?;
        for (queue, &socket) in sockets.iter().enumerate() {
            map_insert(&map, queue as u32, socket).map_err(|e| unsupported("adding the socket to the XSKMAP", interface, e))?;
        }
        // The program keeps the map (and the map the socket) alive from here.
        drop(map);
        let netlink = netlink_socket().map_err(|e| os_error("opening a netlink socket", interface, e))?;
        let mut errors = Vec::new();
        // Native mode spares a NIC driver an skb per frame; generic mode
        // works on every interface.
        for (mode, name) in [(XDP_FLAGS_DRV_MODE, "native"), (XDP_FLAGS_SKB_MODE, "generic")] {
            // UPDATE_IF_NOEXIST: never replace someone else's program.
            match set_link_xdp(&netlink, ifindex, &[(IFLA_XDP_FD, program.as_raw_fd() as u32), (IFLA_XDP_FLAGS, mode | XDP_FLAGS_UPDATE_IF_NOEXIST)]) {
                Ok(()) => return Ok(XdpProgram { netlink, ifindex, mode, program }),
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        Err(unsupported("attaching the XDP program", interface, errors.join("; ")))
    }
}

impl XdpProgram {
    /// Detaches the program, if it is still the one attached. REPLACE with
    /// the expected fd leaves another's program alone, and makes a second
    /// detach fail harmlessly. A failure (the interface is gone) leaves
    /// nothing to clean up, and there is no one to report it to.
    pub(super) fn detach(&self) {
        let attrs = [(IFLA_XDP_FD, -1i32 as u32), (IFLA_XDP_FLAGS, self.mode | XDP_FLAGS_REPLACE), (IFLA_XDP_EXPECTED_FD, self.program.as_raw_fd() as u32)];
        let _ = set_link_xdp(&self.netlink, self.ifindex, &attrs);
    }
}

impl Drop for XdpProgram {
    fn drop(&mut self) {
        self.detach();
    }
}

// uapi/linux/bpf.h
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const XDP_PASS: i32 = 2;
/// Offset of rx_queue_index in struct xdp_md.
const XDP_MD_RX_QUEUE_INDEX: i16 = 16;
// Instruction classes, sizes, modes and operations.
const BPF_LD: u8 = 0x00;
const BPF_LDX: u8 = 0x01;
const BPF_JMP: u8 = 0x05;
const BPF_ALU64: u8 = 0x07;
const BPF_W: u8 = 0x00;
const BPF_DW: u8 = 0x18;
const BPF_IMM: u8 = 0x00;
const BPF_MEM: u8 = 0x60;
const BPF_K: u8 = 0x00;
const BPF_MOV: u8 = 0xb0;
const BPF_CALL: u8 = 0x80;
const BPF_EXIT: u8 = 0x90;

/// struct bpf_insn.
#[repr(C)]
#[derive(Clone, Copy)]
struct BpfInsn {
    code: u8,
    /// dst_reg and src_reg, four bits each, in bitfield order.
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
    let regs = if cfg!(target_endian = "little") { dst | src << 4 } else { dst << 4 | src };
    BpfInsn { code, regs, off, imm }
}

/// `return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);`
/// Only key 0 holds a socket: should the interface gain queues after open,
/// their frames, which a socket bound to queue 0 could not take anyway, go
/// to the kernel's stack rather than being dropped.
fn redirect_program(map: RawFd) -> [BpfInsn; 6] {
    [
        insn(BPF_LDX | BPF_MEM | BPF_W, 2, 1, XDP_MD_RX_QUEUE_INDEX, 0),
        // A two-slot 64-bit load; the verifier swaps the fd for the map.
        insn(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, map),
        insn(0, 0, 0, 0, 0),
        // The low bits of the flags are the action when the slot is empty.
        insn(BPF_ALU64 | BPF_MOV | BPF_K, 3, 0, 0, XDP_PASS),
        insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
    ]
}

/// The leading fields of union bpf_attr for BPF_MAP_CREATE.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

/// The leading fields of union bpf_attr for BPF_MAP_UPDATE_ELEM.
#[repr(C)]
struct MapUpdateAttr {
    map_fd: u32,
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

/// An XSKMAP with one entry per receive queue, keyed by the queue's index.
fn xskmap(queues: u32) -> io::Result<OwnedFd> {
    let key_size = size_of::<u32>() as u32;
    bpf_fd(BPF_MAP_CREATE, &MapCreateAttr { map_type: BPF_MAP_TYPE_XSKMAP, key_size, value_size: key_size, max_entries: queues })
}

fn map_insert(map: &OwnedFd, key: u32, socket: RawFd) -> io::Result<()> {
    let attr = MapUpdateAttr { map_fd: map.as_raw_fd() as u32, key: &key as *const u32 as u64, value: &socket as *const RawFd as u64, flags: 0 };
    bpf(BPF_MAP_UPDATE_ELEM, &attr)?;
    Ok(())
}

fn load_program(map: &OwnedFd) -> io::Result<OwnedFd> {
    let insns = redirect_program(map.as_raw_fd());
    // bpf_redirect_map is a GPL-only helper.
    let license = c"GPL";
    let attr = ProgLoadAttr { prog_type: BPF_PROG_TYPE_XDP, insn_cnt: insns.len() as u32, insns: insns.as_ptr() as u64, license: license.as_ptr() as u64 };
    bpf_fd(BPF_PROG_LOAD, &attr)
}
