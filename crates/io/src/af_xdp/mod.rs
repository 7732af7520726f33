//! AF_XDP backend in copy mode, over plain system calls: a UMEM shared with
//! the kernel, four rings mapped into this process, and a six-instruction
//! XDP program that redirects the interface's frames into the socket.
//!
//! Receiving costs no system call at all: the kernel copies each frame into
//! a UMEM frame and posts a descriptor on the RX ring; we hand the frame out
//! in place and return it on the fill ring. Transmitting copies the frame
//! into a UMEM frame of our own, and one `sendto` per 32 frames makes the
//! kernel send them (copy mode has no other trigger).
//!
//! Frames the program redirects bypass the kernel's stack entirely. A
//! socket serves one receive queue, so interfaces with several are refused
//! (`IoError::Unsupported`) rather than served in part.
//!
//! The parts: this file is the port (receive, transmit, the kick), `umem`
//! the socket, the shared frame area and the four rings, `program` the BPF
//! program that redirects frames to the socket, and `netlink` attaching
//! that program to the interface.

mod netlink;
mod program;
#[cfg(test)]
mod tests;
mod umem;

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::iface::Interface;
use crate::port::{IoError, PacketPort, MAX_FRAME};
use program::XdpProgram;
use umem::{bind, register_umem, xsk_socket, Mmap, Ring, Rings};

/// UMEM chunk size; one frame per chunk, so a chunk holds the largest frame.
const FRAME_SIZE: u32 = MAX_FRAME as u32;
/// The kernel's XDP_PACKET_HEADROOM, which copy mode leaves at the start of
/// each receive chunk.
const XDP_HEADROOM: usize = 256;
/// The longest frame the kernel can copy into a receive chunk.
const MAX_RX_FRAME: usize = MAX_FRAME - XDP_HEADROOM;
const ETHERNET_HEADER: usize = 14;
/// Receive frames occupy the first half of the UMEM, transmit frames the
/// second, so a frame handed to the fill ring never collides with one
/// waiting for transmission.
const RX_FRAMES: u32 = 2048;
const TX_FRAMES: u32 = 2048;
const UMEM_LEN: usize = ((RX_FRAMES + TX_FRAMES) * FRAME_SIZE) as usize;
/// Every ring holds as many entries as there are frames of its kind, so the
/// fill ring always has room for a returned RX frame, and the TX and
/// completion rings always have room for every TX frame at once.
const RX_RING: u32 = RX_FRAMES;
const TX_RING: u32 = TX_FRAMES;
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

pub struct AfXdpPort {
    // Fields drop in this order: stop the redirect first, then unmap the
    // rings, close the socket and free the UMEM. The program is only held
    // for its drop, which detaches it.
    _program: XdpProgram,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    completion: Ring<u64>,
    socket: OwnedFd,
    umem: Mmap,
    /// UMEM addresses of TX frames neither queued nor in the kernel's hands.
    tx_free: Vec<u64>,
    interface: String,
}

impl AfXdpPort {
    /// Opens queue 0 of `interface`: sets up the socket and its UMEM, binds
    /// in copy mode and attaches the redirect program (native mode where the
    /// driver has it, generic mode otherwise).
    pub fn open(interface: &str) -> Result<AfXdpPort, IoError> {
        let iface = Interface::lookup(interface)?;
        let ifindex = iface.index;
        refuse_multiqueue(interface)?;
        refuse_frames_past_a_chunk(interface, iface.mtu)?;
        let socket = xsk_socket(interface)?;
        let umem = Mmap::anonymous(UMEM_LEN).map_err(|e| os_error("allocating the UMEM", interface, e))?;
        register_umem(&socket, &umem).map_err(|e| os_error("registering the UMEM", interface, e))?;
        let mut rings = Rings::map(&socket, interface)?;
        // Before the program attaches, so that no early frame finds the
        // fill ring empty.
        give_all_rx_frames(&mut rings.fill);
        bind(&socket, ifindex).map_err(|e| unsupported("binding the AF_XDP socket in copy mode", interface, e))?;
        Ok(AfXdpPort {
            _program: XdpProgram::attach(&socket, ifindex, interface)?,
            rx: rings.rx,
            tx: rings.tx,
            fill: rings.fill,
            completion: rings.completion,
            socket,
            umem,
            tx_free: (RX_FRAMES..RX_FRAMES + TX_FRAMES).map(frame_addr).collect(),
            interface: interface.to_owned(),
        })
    }

    /// Moves TX frames the kernel has finished with back to the free list.
    fn reclaim_completions(&mut self) {
        let done = self.completion.available();
        for i in 0..done {
            self.tx_free.push(self.completion.read(i));
        }
        self.completion.release(done);
    }

    /// One `sendto`; Ok(()) also when the kernel asks to be kicked again.
    fn kick(&self) -> Result<(), IoError> {
        // SAFETY: a zero-length sendto with no buffer or address only wakes
        // the socket's transmit path.
        let rc = unsafe { libc::sendto(self.socket.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
        if rc >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // The device queue or the 32-frame budget ran out: kick again.
            Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => Ok(()),
            _ => Err(os_error("kicking transmission", &self.interface, err)),
        }
    }
}

impl PacketPort for AfXdpPort {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<usize, IoError> {
        let n = self.rx.available().min(u32::try_from(max).unwrap_or(u32::MAX));
        for i in 0..n {
            let desc = self.rx.read(i);
            if let Some(frame) = self.umem.slice_mut(desc.addr, desc.len) {
                f(frame);
            }
            // Copy mode puts the frame at an offset inside its chunk; the
            // fill ring takes the chunk's start.
            self.fill.push(desc.addr & !u64::from(FRAME_SIZE - 1));
        }
        self.rx.release(n);
        self.fill.publish();
        Ok(n as usize)
    }

    fn send(&mut self, frame: &[u8]) -> bool {
        if frame.is_empty() || frame.len() > FRAME_SIZE as usize {
            return false;
        }
        if self.tx_free.is_empty() {
            self.reclaim_completions();
        }
        let Some(addr) = self.tx_free.pop() else {
            return false;
        };
        debug_assert!(self.tx.free() > 0, "the TX ring holds every TX frame");
        let len = frame.len() as u32;
        self.umem.slice_mut(addr, len).expect("TX frames lie inside the UMEM").copy_from_slice(frame);
        self.tx.push(libc::xdp_desc { addr, len, options: 0 });
        true
    }

    fn flush(&mut self) -> Result<(), IoError> {
        self.tx.publish();
        for _ in 0..MAX_KICKS {
            if self.tx.unconsumed() == 0 {
                break;
            }
            self.kick()?;
        }
        self.reclaim_completions();
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    fn backend(&self) -> &'static str {
        "af_xdp"
    }

    fn kernel_dropped(&mut self) -> u64 {
        // SAFETY: xdp_statistics is plain data; the kernel fills it.
        let mut st: libc::xdp_statistics = unsafe { zeroed() };
        let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: st and len are live and sized for the call.
        let rc = unsafe { libc::getsockopt(self.socket.as_raw_fd(), libc::SOL_XDP, libc::XDP_STATISTICS, std::ptr::addr_of_mut!(st).cast(), &mut len) };
        if rc != 0 {
            return 0;
        }
        // Cumulative counters: frames dropped for want of room in the RX
        // ring (rx_ring_full) or for want of a chunk (rx_dropped, which
        // rx_fill_ring_empty_descs counts a second time, so it stays out).
        st.rx_dropped + st.rx_ring_full
    }
}

fn give_all_rx_frames(fill: &mut Ring<u64>) {
    for frame in 0..RX_FRAMES {
        fill.push(frame_addr(frame));
    }
    fill.publish();
}

fn frame_addr(frame: u32) -> u64 {
    u64::from(frame) * u64::from(FRAME_SIZE)
}

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

/// A socket takes the frames of one receive queue only, and the program
/// passes other queues' frames to the kernel's stack: on an interface with
/// several queues most traffic would bypass natrix, so AF_XDP declines.
fn refuse_multiqueue(interface: &str) -> Result<(), IoError> {
    match rx_queues(interface) {
        Some(queues) if queues > 1 => Err(IoError::Unsupported {
            interface: interface.to_owned(),
            reason: format!(
                "AF_XDP serves one receive queue and the interface has {queues}; \
                 `ethtool -L {interface} combined 1` leaves one"
            ),
        }),
        _ => Ok(()),
    }
}

const SIOCETHTOOL: libc::Ioctl = 0x8946;
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
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    if interface.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, s) in req.ifr_name.iter_mut().zip(interface.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut channels as *mut EthtoolChannels).cast();
    // SAFETY: a datagram socket only serves as a handle for the ioctl.
    let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }).ok()?;
    // SAFETY: fd was just created and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: req names the interface and points at a live ethtool_channels.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL, &mut req as *mut libc::ifreq) }).ok()?;
    Some(channels.rx_count + channels.combined_count)
}

fn set_option<T>(socket: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value points to a live T of the given size.
    check(unsafe { libc::setsockopt(socket.as_raw_fd(), level, name, (value as *const T).cast(), size_of::<T>() as libc::socklen_t) })?;
    Ok(())
}
