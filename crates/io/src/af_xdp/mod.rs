//! AF_XDP backend over plain system calls: a UMEM shared with the kernel,
//! four rings per socket mapped into this process, and a small XDP program
//! that redirects each receive queue's frames into its socket, after, with
//! the flow offload, forwarding established flows' frames itself.
//!
//! `XdpPorts` is the dataplane's: every interface natrix forwards between,
//! one socket per receive queue, all sockets on one UMEM, so a frame is
//! received, translated and transmitted where it lies. `AfXdpPort` is one
//! queue of one interface as a `PacketPort` (the tester's generator).
//!
//! Receiving costs no system call at all: the kernel copies each frame into
//! a UMEM chunk (copy mode; zero-copy drivers DMA into it) and posts a
//! descriptor on the RX ring. Transmitting posts a descriptor on the TX
//! ring and, in copy mode, one `sendto` per 32 frames makes the kernel send
//! them. Frames the program redirects bypass the kernel's stack entirely.
//!
//! The parts: `ports` the sockets and the chunk ledger, this file the
//! single port and what both share, `umem` the socket, the shared frame
//! area and the rings, `program` the BPF program that redirects frames to
//! the sockets, `offload` the fast path for established flows it may start
//! with and the flow table behind it, `bpf` the bpf(2) calls and the
//! assembler both are written with (and the BPF links that attach the
//! program), and `netlink` reading what an interface's driver can do and
//! attaching the program where the kernel has no XDP links.

mod bpf;
mod netlink;
pub mod offload;
mod ports;
mod program;
#[cfg(test)]
pub(crate) mod tests;
mod tuning;
mod umem;

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::ethtool;
use crate::frames::FramePorts;
use crate::port::{IoError, PacketPort, MAX_FRAME};
pub use ports::{XdpMode, XdpPorts};
pub use program::XdpAttach;
pub use tuning::{describe as describe_tuning, DeviceTuning, Tuned};

/// UMEM chunk size; one frame per chunk, so a chunk holds the largest frame.
/// Exactly `MAX_FRAME`, in aligned mode: `FrameId::placed` and
/// `SharedFrames::buffer` find the end of a frame's chunk by that alignment.
const FRAME_SIZE: u32 = MAX_FRAME as u32;
/// The kernel's XDP_PACKET_HEADROOM, which copy mode leaves at the start of
/// each receive chunk.
const XDP_HEADROOM: usize = 256;
/// The longest frame the kernel can copy into a receive chunk.
const MAX_RX_FRAME: usize = MAX_FRAME - XDP_HEADROOM;
const ETHERNET_HEADER: usize = 14;
/// Ring sizes: a fill and an RX ring hold every chunk a socket lends the
/// kernel; TX and completion rings are as large.
const RX_RING: u32 = ports::FILL_CHUNKS;
const TX_RING: u32 = 2048;
/// How long `open` waits for a queue a closed socket still holds.
const BIND_TRIES: u32 = 50;
const BIND_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);
/// One copy-mode `sendto` moves at most this many frames.
const KICK_BATCH: u32 = 32;
/// Enough kicks to drain a full TX ring, plus a few for a device that
/// pushes back; what is still queued after that waits for the next flush.
const MAX_KICKS: u32 = TX_RING / KICK_BATCH + 8;

// The ring offsets of the AF_XDP mmap interface need a 64-bit off_t.
const _: () = assert!(size_of::<libc::off_t>() == 8);
const _: () = assert!(FRAME_SIZE.is_power_of_two());

/// Queue 0 of one interface as a `PacketPort`: received frames are handed
/// out in place and given back at once; sent frames are copied into chunks.
pub struct AfXdpPort {
    ports: XdpPorts,
}

impl AfXdpPort {
    /// Opens queue 0 of `interface`, refusing interfaces with several
    /// receive queues (the others' frames would bypass the port).
    pub fn open(interface: &str) -> Result<AfXdpPort, IoError> {
        refuse_multiqueue(interface)?;
        Ok(AfXdpPort { ports: XdpPorts::open_queues(&[(interface, 1)], false)? })
    }
}

impl PacketPort for AfXdpPort {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<usize, IoError> {
        Ok(self.ports.receive(0, max, &mut |_, frame| {
            f(frame);
            false
        }))
    }

    fn send(&mut self, frame: &[u8]) -> bool {
        self.ports.send(0, frame)
    }

    fn flush(&mut self) -> Result<(), IoError> {
        self.ports.flush()
    }

    fn fd(&self) -> RawFd {
        self.ports.first_fd()
    }

    fn backend(&self) -> &'static str {
        "af_xdp"
    }

    fn kernel_dropped(&mut self) -> u64 {
        self.ports.counters(0).kernel_dropped
    }
}

/// Frames the kernel dropped for want of room in the socket's RX ring
/// (rx_ring_full) or for want of a chunk (rx_dropped, which
/// rx_fill_ring_empty_descs counts a second time, so it stays out), since
/// the socket opened.
fn kernel_dropped(socket: &OwnedFd) -> u64 {
    // SAFETY: xdp_statistics is plain data; the kernel fills it.
    let mut st: libc::xdp_statistics = unsafe { zeroed() };
    let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
    // SAFETY: st and len are live and sized for the call.
    let rc = unsafe { libc::getsockopt(socket.as_raw_fd(), libc::SOL_XDP, libc::XDP_STATISTICS, std::ptr::addr_of_mut!(st).cast(), &mut len) };
    if rc != 0 {
        return 0;
    }
    st.rx_dropped + st.rx_ring_full
}

/// SO_PREFER_BUSY_POLL with a busy-poll budget (Linux 5.11): the device's
/// receive work runs when natrix polls instead of in softirq, on natrix's
/// own thread. Best effort: older kernels refuse and nothing changes.
fn prefer_busy_poll(socket: &OwnedFd) {
    let _ = set_option(socket, libc::SOL_SOCKET, libc::SO_PREFER_BUSY_POLL, &1i32);
    let _ = set_option(socket, libc::SOL_SOCKET, libc::SO_BUSY_POLL, &BUSY_POLL_US);
    let _ = set_option(socket, libc::SOL_SOCKET, libc::SO_BUSY_POLL_BUDGET, &BUSY_POLL_BUDGET);
}

/// How long one busy poll may spin, and how many frames it may take: one
/// receive batch's worth.
const BUSY_POLL_US: i32 = 20;
const BUSY_POLL_BUDGET: i32 = 64;

fn os_error(op: &'static str, interface: &str, source: io::Error) -> IoError {
    IoError::Os { op, interface: interface.to_owned(), source }
}

/// For refusals that mean "use another backend": the caller falls back.
fn unsupported(op: &str, interface: &str, err: impl std::fmt::Display) -> IoError {
    IoError::Unsupported { interface: interface.to_owned(), reason: format!("AF_XDP: {op} failed: {err}") }
}

/// Turns a -1 return into the thread's errno.
fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// In copy mode the kernel writes a frame after XDP_PACKET_HEADROOM bytes
/// of its chunk and drops one that does not fit: an MTU that allows such
/// frames is refused (AF_PACKET takes them; `auto` falls back).
fn refuse_frames_past_a_chunk(interface: &str, mtu: u16) -> Result<(), IoError> {
    let largest = usize::from(mtu) + ETHERNET_HEADER;
    if largest > MAX_RX_FRAME {
        return Err(IoError::Unsupported {
            interface: interface.to_owned(),
            reason: format!("AF_XDP takes frames of up to {MAX_RX_FRAME} bytes and MTU {mtu} allows {largest}; io = \"af_packet\" takes up to {MAX_FRAME}"),
        });
    }
    Ok(())
}

/// The single port takes the frames of one receive queue only, and the
/// program passes other queues' frames to the kernel's stack: on an
/// interface with several queues most traffic would bypass it, so it
/// declines (`XdpPorts` opens a socket per queue instead).
fn refuse_multiqueue(interface: &str) -> Result<(), IoError> {
    match rx_queues(interface) {
        Some(queues) if queues > 1 => Err(IoError::Unsupported {
            interface: interface.to_owned(),
            reason: format!(
                "this AF_XDP port serves one receive queue and the interface has {queues}; \
                 `ethtool -L {interface} combined 1` leaves one"
            ),
        }),
        _ => Ok(()),
    }
}

const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// struct ethtool_channels.
#[repr(C)]
#[derive(Default)]
struct EthtoolChannels {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// The interface's receive queues, or None where the driver does not say
/// (virtual drivers without channels have one).
fn rx_queues(interface: &str) -> Option<u32> {
    let mut channels = EthtoolChannels { cmd: ETHTOOL_GCHANNELS, ..Default::default() };
    // SAFETY: ETHTOOL_GCHANNELS fills a struct ethtool_channels.
    unsafe { ethtool::request(interface, &mut channels).ok()? };
    Some(channels.rx_count + channels.combined_count)
}

fn set_option<T>(socket: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value points to a live T of the given size.
    check(unsafe { libc::setsockopt(socket.as_raw_fd(), level, name, (value as *const T).cast(), size_of::<T>() as libc::socklen_t) })?;
    Ok(())
}
