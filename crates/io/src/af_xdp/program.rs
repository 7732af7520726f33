//! The XDP program that redirects the interface's frames into the socket,
//! loaded with bpf(2) and kept attached (through a BPF link, or `netlink`
//! on kernels without XDP links) until drop.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::bpf::{
    link_detach, link_xdp, load_xdp, map_create, map_lookup, map_update, possible_cpus, Alu, Asm, Cond, Size, BPF_MAP_TYPE_PERCPU_ARRAY, BPF_MAP_TYPE_XSKMAP, MAP_LOOKUP_ELEM,
    REDIRECT_MAP, XDP_DROP, XDP_MD_DATA, XDP_MD_DATA_END, XDP_MD_RX_QUEUE_INDEX, XDP_PASS,
};
use super::netlink::{
    netlink_socket, set_link_xdp, IFLA_XDP_EXPECTED_FD, IFLA_XDP_FD, IFLA_XDP_FLAGS, XDP_FLAGS_DRV_MODE, XDP_FLAGS_REPLACE, XDP_FLAGS_SKB_MODE, XDP_FLAGS_UPDATE_IF_NOEXIST,
};
use super::offload::Offload;
use super::{os_error, unsupported, MAX_RX_FRAME};
use crate::port::IoError;

/// The redirect program, attached to the interface until drop.
pub(super) struct XdpProgram {
    attachment: Attachment,
    /// Native or generic, for the start-up report.
    mode: XdpAttach,
    /// Frames too long for a receive chunk the program dropped, per
    /// receive queue and CPU (`drop_past_a_chunk`).
    too_long: OwnedFd,
}

/// Where natrix's XDP programs run (`xdp_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpAttach {
    /// Native where the driver takes it, generic elsewhere.
    Auto,
    /// The driver runs the program on each frame as it received it.
    Native,
    /// The kernel runs the program on each frame's skb, before its stack.
    /// On veth this spares the copy native mode makes of every frame
    /// (docs/BENCHMARKS.md, "Generic XDP on veth").
    Generic,
}

impl XdpAttach {
    /// Its name in the configuration and the start-up report.
    pub fn name(self) -> &'static str {
        match self {
            XdpAttach::Auto => "auto",
            XdpAttach::Native => "native",
            XdpAttach::Generic => "generic",
        }
    }

    /// The attach modes to try, in order, with their netlink flags.
    fn modes(self) -> &'static [(u32, XdpAttach)] {
        match self {
            XdpAttach::Auto => &MODES,
            XdpAttach::Native => &MODES[..1],
            XdpAttach::Generic => &MODES[1..],
        }
    }
}

/// How the program is attached.
enum Attachment {
    /// Through a BPF link: the kernel detaches the program when its last
    /// descriptor closes, so one a killed natrix left is gone with it,
    /// flows it forwarded by itself included.
    Link(OwnedFd),
    /// Through rtnetlink, where the kernel has no XDP links (before 5.9):
    /// the program stays until detached.
    Netlink {
        /// Opened in the interface's network namespace at attach time, so
        /// the detach on drop reaches the same interface whichever thread
        /// drops.
        netlink: OwnedFd,
        ifindex: u32,
        /// XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE: detaching names the mode.
        mode: u32,
        program: OwnedFd,
    },
}

/// Native mode spares a NIC driver an skb per frame; generic mode works on
/// every interface.
const MODES: [(u32, XdpAttach); 2] = [(XDP_FLAGS_DRV_MODE, XdpAttach::Native), (XDP_FLAGS_SKB_MODE, XdpAttach::Generic)];

impl XdpProgram {
    /// Attaches a program that sends receive queue q's frames to
    /// `sockets[q]` (and passes frames of other queues to the kernel).
    /// With `offload`, established flows in its table are forwarded by
    /// the program itself (`Offload::fast_path`).
    pub(super) fn attach(sockets: &[RawFd], ifindex: u32, interface: &str, offload: Option<&Offload>, attach: XdpAttach) -> Result<XdpProgram, IoError> {
        let map = xskmap(sockets.len() as u32).map_err(|e| unsupported("creating the XSKMAP", interface, e))?;
        let too_long = per_queue_counts(sockets.len() as u32).map_err(|e| unsupported("creating the XDP program's counters", interface, e))?;
        let program = load_program(&map, &too_long, offload).map_err(|e| unsupported("loading the XDP program", interface, e))?;
        for (queue, &socket) in sockets.iter().enumerate() {
            map_update(&map, &(queue as u32), &socket).map_err(|e| unsupported("adding the socket to the XSKMAP", interface, e))?;
        }
        // The program keeps the map (and the map the socket) alive from here.
        drop(map);
        let mut errors = Vec::new();
        let mut invalid = 0;
        let modes = attach.modes();
        for &(flags, mode) in modes {
            match link_xdp(&program, ifindex, flags) {
                Ok(link) => return Ok(XdpProgram { attachment: Attachment::Link(link), mode, too_long }),
                // Another program is attached: never replace someone else's.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(already_attached(interface, e)),
                Err(e) => {
                    invalid += usize::from(e.raw_os_error() == Some(libc::EINVAL));
                    errors.push(format!("{}: {e}", mode.name()));
                }
            }
        }
        // Refused in every mode tried as invalid: a kernel without XDP
        // links, or a driver refusing native mode (EINVAL too), which the
        // same mode over rtnetlink refuses again, naming it.
        if invalid == modes.len() {
            return attach_by_netlink(program, ifindex, interface, modes).map(|(attachment, mode)| XdpProgram { attachment, mode, too_long });
        }
        Err(unsupported("attaching the XDP program", interface, errors.join("; ")))
    }

    /// Native or generic.
    pub(super) fn mode(&self) -> XdpAttach {
        self.mode
    }

    /// Frames of receive queue `queue` the program dropped as too long
    /// for a receive chunk, summed over the CPUs.
    pub(super) fn frames_too_long(&self, queue: u32) -> u64 {
        read_per_queue_count(&self.too_long, queue)
    }

    /// Detaches the program, if it is still the one attached; a second
    /// detach, or one where the interface is gone, does nothing.
    pub(super) fn detach(&self) {
        match &self.attachment {
            Attachment::Link(link) => {
                let _ = link_detach(link);
            }
            // REPLACE with the expected fd leaves another's program alone.
            Attachment::Netlink { netlink, ifindex, mode, program } => {
                let attrs = [(IFLA_XDP_FD, -1i32 as u32), (IFLA_XDP_FLAGS, mode | XDP_FLAGS_REPLACE), (IFLA_XDP_EXPECTED_FD, program.as_raw_fd() as u32)];
                let _ = set_link_xdp(netlink, *ifindex, &attrs);
            }
        }
    }
}

impl Drop for XdpProgram {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Attaches `program` over rtnetlink in the first of `modes` the interface
/// takes, never replacing another program; the mode it took.
fn attach_by_netlink(program: OwnedFd, ifindex: u32, interface: &str, modes: &[(u32, XdpAttach)]) -> Result<(Attachment, XdpAttach), IoError> {
    let netlink = netlink_socket().map_err(|e| os_error("opening a netlink socket", interface, e))?;
    let mut errors = Vec::new();
    for &(flags, mode) in modes {
        match set_link_xdp(&netlink, ifindex, &[(IFLA_XDP_FD, program.as_raw_fd() as u32), (IFLA_XDP_FLAGS, flags | XDP_FLAGS_UPDATE_IF_NOEXIST)]) {
            Ok(()) => return Ok((Attachment::Netlink { netlink, ifindex, mode: flags, program }, mode)),
            Err(e) => errors.push(format!("{}: {e}", mode.name())),
        }
    }
    Err(unsupported("attaching the XDP program", interface, errors.join("; ")))
}

/// The refusal where another XDP program holds the interface.
fn already_attached(interface: &str, e: io::Error) -> IoError {
    let reason = format!(
        "another XDP program is attached ({e}): another program's, or one a natrix older than its XDP links left when it was killed; \
         `ip link show {interface}` shows it, `ip link set dev {interface} xdp off` removes it if it is not someone else's"
    );
    unsupported("attaching the XDP program", interface, reason)
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
    map_create(BPF_MAP_TYPE_XSKMAP, size_of::<u32>(), size_of::<u32>(), queues, 0)
}

/// The count `drop_past_a_chunk` keeps in `too_long` for `queue`, summed
/// over the CPUs.
fn read_per_queue_count(too_long: &OwnedFd, queue: u32) -> u64 {
    let mut per_cpu = vec![0u64; possible_cpus()];
    map_lookup(too_long, &queue, per_cpu.as_mut_slice()).map_or(0, |()| per_cpu.iter().sum())
}

/// A per-CPU count for each of `queues` receive queues.
fn per_queue_counts(queues: u32) -> io::Result<OwnedFd> {
    map_create(BPF_MAP_TYPE_PERCPU_ARRAY, size_of::<u32>(), size_of::<u64>(), queues, 0)
}

/// Drops a frame longer than a receive chunk takes, counted under its
/// receive queue in `too_long`: the socket would drop it anyway, counted
/// as if natrix had fallen behind. Native programs see none (the MTU is
/// checked at start); generic ones see a sender's segmentation offload's
/// frames (a veth peer's TSO or GSO) whole, which no MTU bounds. A queue
/// without a socket (one the interface gained after start) has no count
/// either, and its frames go to the kernel's stack as they would have
/// (`redirect_to_sockets`). r1 the context, kept for what follows.
fn drop_past_a_chunk(asm: &mut Asm, too_long: RawFd) {
    let (fits, to_stack) = (asm.label(), asm.label());
    asm.load(Size::W, 2, 1, XDP_MD_DATA);
    asm.load(Size::W, 3, 1, XDP_MD_DATA_END);
    asm.alu(Alu::Add, 2, MAX_RX_FRAME as i32 + 1);
    asm.jump_if_reg(Cond::Gt, 2, 3, fits);
    asm.alu_reg(Alu::Mov, 6, 1);
    asm.load(Size::W, 2, 1, XDP_MD_RX_QUEUE_INDEX);
    asm.store(Size::W, 10, -4, 2);
    asm.load_map(1, too_long);
    asm.alu_reg(Alu::Mov, 2, 10);
    asm.alu(Alu::Add, 2, -4);
    asm.call(MAP_LOOKUP_ELEM);
    asm.jump_if(Cond::Eq, 0, 0, to_stack);
    asm.load(Size::DW, 2, 0, 0);
    asm.alu(Alu::Add, 2, 1);
    asm.store(Size::DW, 0, 0, 2);
    asm.alu(Alu::Mov, 0, XDP_DROP);
    asm.exit();
    asm.place(to_stack);
    asm.alu_reg(Alu::Mov, 1, 6);
    asm.place(fits);
}

/// The program: frames too long for a chunk dropped, then the offload's
/// fast path where there is one, then the redirect into the sockets.
fn load_program(xsks: &OwnedFd, too_long: &OwnedFd, offload: Option<&Offload>) -> io::Result<OwnedFd> {
    let mut asm = Asm::default();
    drop_past_a_chunk(&mut asm, too_long.as_raw_fd());
    if let Some(offload) = offload {
        offload.fast_path(&mut asm);
    }
    redirect_to_sockets(&mut asm, xsks.as_raw_fd());
    load_xdp(&asm.finish())
}

#[cfg(test)]
mod tests {
    use super::super::bpf::test_run;
    use super::*;

    #[test]
    fn frames_too_long_for_a_chunk_are_dropped_and_counted_under_their_queue() {
        // SAFETY: no arguments, no failure.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: loading XDP programs needs root");
            return;
        }
        let (xsks, too_long) = (xskmap(1).unwrap(), per_queue_counts(1).unwrap());
        let program = load_program(&xsks, &too_long, None).expect("the verifier takes the program");
        const XDP_DROPPED: u32 = XDP_DROP as u32;
        // The queue's slot is empty, so a frame that fits goes to the stack.
        for (len, expected) in [(60, XDP_PASS as u32), (MAX_RX_FRAME, XDP_PASS as u32), (MAX_RX_FRAME + 1, XDP_DROPPED), (3000, XDP_DROPPED)] {
            let mut frame = vec![0u8; len];
            assert_eq!(test_run(&program, &mut frame).expect("the test run runs"), expected, "a frame of {len} bytes");
        }
        // BPF_PROG_TEST_RUN runs as receive queue 0.
        assert_eq!(read_per_queue_count(&too_long, 0), 2);
    }
}
