//! The XDP program that redirects the interface's frames into the socket,
//! loaded with bpf(2) and kept attached (through `netlink`) until drop.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::bpf::{load_xdp, map_create, map_update, Alu, Asm, Size, BPF_MAP_TYPE_XSKMAP, REDIRECT_MAP, XDP_MD_RX_QUEUE_INDEX, XDP_PASS};
use super::netlink::{
    netlink_socket, set_link_xdp, IFLA_XDP_EXPECTED_FD, IFLA_XDP_FD, IFLA_XDP_FLAGS, XDP_FLAGS_DRV_MODE, XDP_FLAGS_REPLACE, XDP_FLAGS_SKB_MODE, XDP_FLAGS_UPDATE_IF_NOEXIST,
};
use super::offload::Offload;
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
    /// With `offload`, established flows in its table are forwarded by
    /// the program itself (`Offload::fast_path`).
    pub(super) fn attach(sockets: &[RawFd], ifindex: u32, interface: &str, offload: Option<&Offload>) -> Result<XdpProgram, IoError> {
        let map = xskmap(sockets.len() as u32).map_err(|e| unsupported("creating the XSKMAP", interface, e))?;
        let program = load_program(&map, offload).map_err(|e| unsupported("loading the XDP program", interface, e))?;
        for (queue, &socket) in sockets.iter().enumerate() {
            map_update(&map, &(queue as u32), &socket).map_err(|e| unsupported("adding the socket to the XSKMAP", interface, e))?;
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

/// `return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);`, r1
/// holding ctx. Only key 0 holds a socket: should the interface gain queues
/// after open, their frames, which a socket bound to queue 0 could not take
/// anyway, go to the kernel's stack rather than being dropped.
pub(super) fn redirect_to_sockets(asm: &mut Asm, xsks: RawFd) {
    asm.load(Size::W, 2, 1, XDP_MD_RX_QUEUE_INDEX);
    asm.load_map(1, xsks);
    // The low bits of the flags are the action when the slot is empty.
    asm.alu(Alu::Mov, 3, XDP_PASS);
    asm.call(REDIRECT_MAP);
    asm.exit();
}

/// An XSKMAP with one entry per receive queue, keyed by the queue's index.
fn xskmap(queues: u32) -> io::Result<OwnedFd> {
    map_create(BPF_MAP_TYPE_XSKMAP, size_of::<u32>(), size_of::<u32>(), queues)
}

/// The program: the offload's fast path first where there is one, then
/// the redirect into the sockets.
fn load_program(xsks: &OwnedFd, offload: Option<&Offload>) -> io::Result<OwnedFd> {
    let mut asm = Asm::default();
    if let Some(offload) = offload {
        offload.fast_path(&mut asm);
    }
    redirect_to_sockets(&mut asm, xsks.as_raw_fd());
    load_xdp(&asm.finish())
}
