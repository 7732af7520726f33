//! What every live packet backend offers the dataplane: batched receive,
//! queued transmit, and a file descriptor to sleep on. AF_XDP, AF_PACKET
//! and the in-memory port of the tests (`memory`) implement it.

use std::os::fd::RawFd;

/// Largest frame a backend hands over or accepts (no jumbo frames).
pub const MAX_FRAME: usize = 2048;
/// An untagged Ethernet header: what a frame adds to the MTU's packet.
const ETHERNET_HEADER: usize = 14;

/// Refuses an interface whose MTU admits frames longer than `MAX_FRAME`.
pub fn check_frames_fit(interface: &str, mtu: u16) -> Result<(), IoError> {
    if usize::from(mtu) + ETHERNET_HEADER > MAX_FRAME {
        return Err(IoError::FrameTooLarge { interface: interface.to_owned(), mtu });
    }
    Ok(())
}

/// Reads a socket's pending error, which clears it. A packet socket holds
/// ENETDOWN while its link is down, and poll reports it at once every time
/// until it is read: a loop that sleeps in poll must read it, or spin.
pub fn take_socket_error(fd: RawFd) {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err and len live for the call; len gives err's size.
    unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, std::ptr::addr_of_mut!(err).cast(), &mut len) };
}

/// An error of a live backend, naming the operation and the interface.
#[derive(Debug)]
pub enum IoError {
    /// A system call failed.
    Os { op: &'static str, interface: String, source: std::io::Error },
    /// The backend cannot work on this interface or kernel (for example
    /// AF_XDP on a kernel without it); `auto` falls back on this.
    Unsupported { interface: String, reason: String },
    /// The interface's MTU allows frames longer than natrix's frame buffers
    /// (`MAX_FRAME`): no backend takes it, since jumbo frames would arrive
    /// cut short or not at all.
    FrameTooLarge { interface: String, mtu: u16 },
}

impl IoError {
    pub fn os(op: &'static str, interface: &str) -> IoError {
        IoError::Os { op, interface: interface.to_owned(), source: std::io::Error::last_os_error() }
    }
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoError::Os { op, interface, source } => write!(f, "{interface}: {op} failed: {source}"),
            IoError::Unsupported { interface, reason } => write!(f, "{interface}: {reason}"),
            IoError::FrameTooLarge { interface, mtu } => write!(
                f,
                "{interface}: MTU {mtu} allows frames of {} bytes, and natrix handles frames of up to {MAX_FRAME} bytes \
                 (no jumbo frames): lower the MTU to {} or less (ip link set dev {interface} mtu 1500)",
                usize::from(*mtu) + ETHERNET_HEADER,
                MAX_FRAME - ETHERNET_HEADER
            ),
        }
    }
}

impl std::error::Error for IoError {}

/// One interface's frames in and out. Implementations never make a system
/// call per frame: `recv_batch` drains a ring, `send` only queues, `flush`
/// kicks the kernel once for everything queued.
pub trait PacketPort: Send {
    /// Hands up to `max` received frames to `f`, each writable in place;
    /// returns how many. Returns 0 at once when nothing is waiting.
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<usize, IoError>;

    /// Queues a copy of `frame` for transmission; false when the transmit
    /// ring is full (the caller counts the frame as dropped).
    fn send(&mut self, frame: &[u8]) -> bool;

    /// Makes the kernel transmit everything queued.
    fn flush(&mut self) -> Result<(), IoError>;

    /// Transmits what `send` queued, then `frames` in order, now: a port
    /// that can hands the kernel the frames where they lie, without a copy.
    /// Frames the port cannot take are lost: the ports natrix forwards
    /// with (AF_PACKET's, the tests' memory port) count them in
    /// `dropped_on_transmit`; this default, which only `send`s, cannot.
    fn send_from(&mut self, frames: &[&[u8]]) -> Result<(), IoError> {
        for frame in frames {
            self.send(frame);
        }
        self.flush()
    }

    /// Readable when frames are waiting; for poll().
    fn fd(&self) -> RawFd;

    /// "af_xdp", "af_packet" or "memory" (tests), for logs and metrics.
    fn backend(&self) -> &'static str;

    /// Frames the backend refused on receive (a VLAN tag, a frame longer
    /// than its buffers, a partial checksum it cannot finish).
    fn dropped_on_receive(&self) -> u64 {
        0
    }

    /// Frames received with a transport checksum their sender's offload
    /// left partial, which the backend finished before handing them on.
    fn checksums_completed(&self) -> u64 {
        0
    }

    /// Frames the kernel dropped because natrix's receive ring was full
    /// (natrix fell behind), since the port opened.
    fn kernel_dropped(&mut self) -> u64 {
        0
    }

    /// Frames lost after the port took them (`send_from`, a flush the
    /// kernel refused): those `send` refused are the caller's to count.
    fn dropped_on_transmit(&self) -> u64 {
        0
    }

    /// System calls `flush` made, since the port opened.
    fn transmit_calls(&self) -> u64 {
        0
    }
}
