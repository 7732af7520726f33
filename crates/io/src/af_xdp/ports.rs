//! Every interface natrix forwards between, over AF_XDP sockets that share
//! one UMEM: one socket per receive queue of each interface, each with its
//! own four rings. A frame received on any socket can leave by any other,
//! so forwarding moves a descriptor from an RX ring to a TX ring and the
//! frame itself never moves in natrix.
//!
//! Chunk ownership: a chunk is on a fill ring or in an RX descriptor (the
//! kernel's, counted in `Xsk::lent`), held by natrix (a `FrameId`), queued
//! on a TX ring or waiting on a completion ring (the kernel's again), or on
//! the free list. Completions and released frames go back to the free
//! list, and fill rings are topped up from it.
//!
//! Per-queue workers (`open_per_queue`): the sockets are dealt out in sets,
//! receive queue q of every interface to set q % sets, and each set is one
//! worker's own, with a free list of its own. A frame one worker received
//! and another transmitted completes on the transmitter's completion ring,
//! so chunks drift towards the workers that transmit more; a set with more
//! than its share gives the surplus to a depot the sets share, and one
//! running short takes from it, a few hundred chunks at a time.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::offload::Offload;
use super::program::{XdpAttach, XdpProgram};
use super::umem::{bind, register_umem, xsk_socket, BindAs, Mmap, Ring, Rings};
use super::{os_error, unsupported, FRAME_SIZE, MAX_KICKS};
use crate::frames::{FrameId, FramePorts, PortCounters, SharedFrames};
use crate::iface::Interface;
use crate::port::IoError;

/// Chunks each socket keeps on its fill ring for the kernel to receive into.
pub(super) const FILL_CHUNKS: u32 = 2048;
/// Chunks beyond the fill rings': frames natrix holds, frames queued for
/// transmission and frames natrix makes.
pub(super) const SPARE_CHUNKS: u32 = 4096;
/// How far a set's free list may stray from its share before chunks move
/// to or from the depot.
const DEPOT_SLACK: usize = SPARE_CHUNKS as usize / 8;

/// Chunks the sets of per-queue workers pool, and whether a set went
/// short while it was empty (the others then give down to their share).
#[derive(Default)]
struct Depot {
    chunks: Mutex<Vec<u64>>,
    wanted: AtomicBool,
}

impl Depot {
    fn chunks(&self) -> MutexGuard<'_, Vec<u64>> {
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One socket: one receive queue of one interface.
pub(super) struct Xsk {
    /// The interface's receive queue the socket is bound to.
    queue: u32,
    // Rings before the socket: they are unmapped before it closes.
    pub(super) rx: Ring<libc::xdp_desc>,
    pub(super) tx: Ring<libc::xdp_desc>,
    pub(super) fill: Ring<u64>,
    pub(super) completion: Ring<u64>,
    pub(super) socket: OwnedFd,
    /// Chunks on the fill ring or in RX descriptors not yet read.
    pub(super) lent: u32,
    /// System calls made to transmit and to receive, since the socket opened.
    pub(super) transmit_calls: u64,
    pub(super) receive_calls: u64,
}

impl Xsk {
    /// Gives the kernel chunks from `free` until `FILL_CHUNKS` are lent.
    fn top_up(&mut self, free: &mut Vec<u64>) {
        let want = (FILL_CHUNKS - self.lent).min(free.len() as u32);
        if want == 0 {
            return;
        }
        for chunk in free.drain(free.len() - want as usize..) {
            self.fill.push(chunk);
        }
        self.fill.publish();
        self.lent += want;
    }

    /// Moves chunks the kernel has transmitted to `free`.
    fn reclaim(&mut self, free: &mut Vec<u64>) {
        let done = self.completion.available();
        for i in 0..done {
            free.push(chunk_of(self.completion.read(i)));
        }
        self.completion.release(done);
    }

    /// Publishes queued TX descriptors and kicks the kernel until it has
    /// taken them (copy mode sends at most 32 per system call).
    /// A kick that moves nothing means the device's queue is full: the
    /// rest waits for the next flush rather than spinning here.
    fn kick(&mut self, interface: &str) -> Result<(), IoError> {
        self.tx.publish();
        for _ in 0..MAX_KICKS {
            let waiting = self.tx.unconsumed();
            if waiting == 0 || !self.tx.needs_wakeup() {
                break;
            }
            self.transmit_calls += 1;
            wake(&self.socket, interface)?;
            if self.tx.unconsumed() == waiting {
                break;
            }
        }
        Ok(())
    }

    fn kernel_dropped(&self) -> u64 {
        super::kernel_dropped(&self.socket)
    }
}

/// A zero-length sendto, which makes the kernel look at the TX ring; Ok
/// also when it asks to be kicked again.
fn wake(socket: &OwnedFd, interface: &str) -> Result<(), IoError> {
    // SAFETY: a zero-length sendto with no buffer or address only wakes
    // the socket's transmit path.
    let rc = unsafe { libc::sendto(socket.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
    if rc >= 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        // The device queue or the 32-frame budget ran out: kick again.
        Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR) => Ok(()),
        _ => Err(os_error("kicking transmission", interface, err)),
    }
}

/// A zero-length recvfrom: where busy polling is on, it runs the device's
/// receive work on this thread; in zero-copy mode it answers the fill
/// ring's need_wakeup.
fn poke_receive(socket: &OwnedFd) {
    // SAFETY: a zero-length, non-blocking recvfrom into no buffer.
    unsafe { libc::recvfrom(socket.as_raw_fd(), std::ptr::null_mut(), 0, libc::MSG_DONTWAIT, std::ptr::null_mut(), std::ptr::null_mut()) };
}

/// The receive queues sysfs lists for a driver that does not answer
/// ETHTOOL_GCHANNELS: a socket is needed on each, or the program would
/// pass their frames to the kernel's stack.
fn sysfs_rx_queues(interface: &str) -> Option<u32> {
    let dir = std::fs::read_dir(format!("/sys/class/net/{interface}/queues")).ok()?;
    let n = dir.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("rx-"))).count();
    u32::try_from(n).ok().filter(|&n| n > 0)
}

/// Each interface with its receive queues, one where nothing says.
fn with_their_queues<'a>(interfaces: &[&'a str]) -> Vec<(&'a str, u32)> {
    interfaces.iter().map(|&name| (name, super::rx_queues(name).or_else(|| sysfs_rx_queues(name)).unwrap_or(1))).collect()
}

fn chunk_of(addr: u64) -> u64 {
    addr & !u64::from(FRAME_SIZE - 1)
}

/// How the sockets were bound, for the start-up report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    Copy,
    ZeroCopy,
}

pub struct XdpPorts {
    // Fields drop in this order: detach the programs (no more redirects),
    // close the sockets, then free the UMEM. Sets of per-queue workers
    // share the programs, and the first set to drop detaches them (`Drop`).
    programs: Arc<[XdpProgram]>,
    sockets: Vec<Xsk>,
    /// Interface i's sockets are sockets[first[i]..first[i + 1]], socket q
    /// of them serving receive queue q.
    first: Vec<usize>,
    /// The UMEM, shared with the threads that are handed held frames
    /// (`FramePorts::shared`): the last handle unmaps it.
    frames: SharedFrames,
    free: Vec<u64>,
    /// Where the sets of per-queue workers pool surplus chunks; None for
    /// one set of every socket.
    depot: Option<Arc<Depot>>,
    interfaces: Vec<String>,
    ifindexes: Vec<u32>,
    mode: XdpMode,
    busy_poll: bool,
    /// Per interface, the socket its next `receive` reads first: each
    /// round starts one further, so that a busy queue does not take every
    /// round's budget from the ones after it.
    first_read: Vec<usize>,
}

impl XdpPorts {
    /// Opens a socket on every receive queue of every interface, all on one
    /// UMEM: zero-copy where every interface's driver offers it, copy mode
    /// otherwise. The sockets prefer busy polling: a receive that empties
    /// a socket's ring runs its device's receive work on the calling
    /// thread (where the kernel has busy polling), so a busy thread does
    /// that work itself instead of waiting for the kernel's softirq or
    /// NAPI thread to be scheduled.
    ///
    /// The sockets are dealt out in `sets` sets for as many workers:
    /// queue q of each interface to set q % sets. With one set, or where
    /// an interface has fewer queues than `sets` (a set would have no
    /// socket to send from on it), there is one set of every socket.
    ///
    /// With `offload`, the interfaces' programs forward the flows in its
    /// table themselves.
    pub fn open_per_queue(interfaces: &[&str], sets: usize, offload: Option<&Offload>, attach: XdpAttach) -> Result<Vec<XdpPorts>, IoError> {
        let with_queues = with_their_queues(interfaces);
        let fewest = with_queues.iter().map(|&(_, q)| q as usize).min().unwrap_or(1);
        if sets <= 1 || fewest < sets {
            return Ok(vec![XdpPorts::open_queues_with(&with_queues, true, 1, offload, attach)?]);
        }
        Ok(XdpPorts::open_queues_with(&with_queues, true, sets as u32, offload, attach)?.split(sets))
    }

    /// Opens the first `queues` receive queues of each interface, the
    /// sockets preferring busy polling or not.
    pub(super) fn open_queues(interfaces: &[(&str, u32)], busy_poll: bool) -> Result<XdpPorts, IoError> {
        XdpPorts::open_queues_with(interfaces, busy_poll, 1, None, XdpAttach::Auto)
    }

    /// As `open_queues`, with spare chunks for `sets` sets.
    fn open_queues_with(interfaces: &[(&str, u32)], busy_poll: bool, sets: u32, offload: Option<&Offload>, attach: XdpAttach) -> Result<XdpPorts, IoError> {
        // Zero-copy is the driver's, for its native programs.
        if attach == XdpAttach::Generic {
            return XdpPorts::open_as(interfaces, busy_poll, XdpMode::Copy, sets, offload, attach);
        }
        match XdpPorts::open_as(interfaces, busy_poll, XdpMode::ZeroCopy, sets, offload, attach) {
            // One interface's driver took zero-copy and another's did not:
            // the UMEM's mode is its first socket's, so all go copy mode.
            Err(_) => XdpPorts::open_as(interfaces, busy_poll, XdpMode::Copy, sets, offload, attach),
            ok => ok,
        }
    }

    fn open_as(interfaces: &[(&str, u32)], busy_poll: bool, wanted: XdpMode, sets: u32, offload: Option<&Offload>, attach: XdpAttach) -> Result<XdpPorts, IoError> {
        let mut looked_up = Vec::with_capacity(interfaces.len());
        for &(name, queues) in interfaces {
            let iface = Interface::lookup(name)?;
            super::refuse_frames_past_a_chunk(name, iface.mtu)?;
            looked_up.push((iface.index, queues.max(1)));
        }
        let count: u32 = looked_up.iter().map(|&(_, q)| q).sum();
        let chunks = count * FILL_CHUNKS + sets * SPARE_CHUNKS;
        let umem = Mmap::anonymous((chunks * FRAME_SIZE) as usize).map_err(|e| os_error("allocating the UMEM", interfaces[0].0, e))?;
        let mut free: Vec<u64> = (0..chunks).rev().map(|c| u64::from(c) * u64::from(FRAME_SIZE)).collect();
        let mut mode = wanted;
        let mut sockets: Vec<Xsk> = Vec::with_capacity(count as usize);
        let mut first = vec![0];
        let mut programs = Vec::with_capacity(interfaces.len());
        for (&(name, _), &(ifindex, queues)) in interfaces.iter().zip(&looked_up) {
            for queue in 0..queues {
                let shared = sockets.first().map(|s| s.socket.as_raw_fd());
                let (xsk, bound) = open_socket(name, ifindex, queue, shared, mode, &umem, &mut free, busy_poll)?;
                mode = bound;
                sockets.push(xsk);
            }
            let fds: Vec<RawFd> = sockets[first[first.len() - 1]..].iter().map(|s| s.socket.as_raw_fd()).collect();
            programs.push(XdpProgram::attach(&fds, ifindex, name, offload, attach)?);
            first.push(sockets.len());
        }
        let interfaces: Vec<String> = interfaces.iter().map(|&(name, _)| name.to_owned()).collect();
        let frames = SharedFrames::new(Arc::new(umem));
        let ifindexes = looked_up.iter().map(|&(index, _)| index).collect();
        let first_read = vec![0; interfaces.len()];
        Ok(XdpPorts { programs: programs.into(), sockets, first, frames, free, depot: None, interfaces, ifindexes, mode, busy_poll, first_read })
    }

    /// Deals the sockets out in `sets` sets, receive queue q of each
    /// interface to set q % sets, and the free chunks evenly; every
    /// interface has at least `sets` queues.
    fn split(mut self, sets: usize) -> Vec<XdpPorts> {
        let depot = Arc::new(Depot::default());
        let mut parts: Vec<XdpPorts> = (0..sets)
            .map(|_| XdpPorts {
                programs: self.programs.clone(),
                sockets: Vec::new(),
                first: vec![0],
                frames: self.frames.clone(),
                free: Vec::new(),
                depot: Some(depot.clone()),
                interfaces: self.interfaces.clone(),
                ifindexes: self.ifindexes.clone(),
                mode: self.mode,
                busy_poll: self.busy_poll,
                first_read: vec![0; self.interfaces.len()],
            })
            .collect();
        // What is left of self, without sockets, detaches nothing on drop.
        let (first, mut free) = (std::mem::take(&mut self.first), std::mem::take(&mut self.free));
        let mut sockets = std::mem::take(&mut self.sockets).into_iter();
        for side in 0..self.interfaces.len() {
            for (q, socket) in sockets.by_ref().take(first[side + 1] - first[side]).enumerate() {
                parts[q % sets].sockets.push(socket);
            }
            for part in &mut parts {
                part.first.push(part.sockets.len());
            }
        }
        let share = free.len() / sets;
        for part in &mut parts {
            part.free = free.split_off(free.len() - share);
        }
        depot.chunks().append(&mut free);
        parts
    }

    /// Interface `side`'s index, which names it in the offload's table.
    pub fn ifindex(&self, side: usize) -> u32 {
        self.ifindexes[side]
    }

    /// The receive queues of interface `side` this set serves.
    pub fn served_queues(&self, side: usize) -> Vec<u32> {
        self.sockets[self.first[side]..self.first[side + 1]].iter().map(|s| s.queue).collect()
    }

    /// Gives the depot what this set's free list holds past its share and
    /// its slack (past its share alone while another set is short), or
    /// takes back up to its share when it falls as far short. The chunks
    /// given are those freed longest ago, the least likely to be in cache.
    fn balance(&mut self) {
        let Some(depot) = &self.depot else { return };
        let share = SPARE_CHUNKS as usize;
        let have = self.free.len();
        let keep = if depot.wanted.load(Ordering::Relaxed) { share } else { share + DEPOT_SLACK };
        if have > keep {
            depot.chunks().extend(self.free.drain(..have - share));
            depot.wanted.store(false, Ordering::Relaxed);
        } else if have + DEPOT_SLACK < share {
            let mut chunks = depot.chunks();
            let take = (share - have).min(chunks.len());
            let from = chunks.len() - take;
            self.free.extend(chunks.drain(from..));
            depot.wanted.store(have + take < share, Ordering::Relaxed);
        }
    }

    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// The mode each interface's XDP program runs in (native or generic),
    /// in the order the interfaces were opened.
    pub fn program_modes(&self) -> Vec<XdpAttach> {
        self.programs.iter().map(XdpProgram::mode).collect()
    }

    /// The first socket's descriptor: the single port's only one.
    pub(super) fn first_fd(&self) -> RawFd {
        self.sockets[0].socket.as_raw_fd()
    }

    /// Sockets (receive queues) of interface `side`.
    pub fn queues(&self, side: usize) -> usize {
        self.first[side + 1] - self.first[side]
    }

    /// The socket that sends a frame of receive queue `queue` out of `side`.
    fn tx_socket(&self, side: usize, queue: u16) -> usize {
        self.first[side] + usize::from(queue) % self.queues(side)
    }

    /// Chunks on the free list, for the tests' ledger.
    #[cfg(test)]
    pub(super) fn chunks_not_lent(&self) -> usize {
        self.free.len()
    }

    /// Chunks in the depot the sets share, for the tests' ledger.
    #[cfg(test)]
    pub(super) fn chunks_in_depot(&self) -> usize {
        self.depot.as_ref().map_or(0, |d| d.chunks().len())
    }

    /// Chunks lent to the kernel for receiving, for the tests' ledger.
    #[cfg(test)]
    pub(super) fn chunks_lent(&self) -> u32 {
        self.sockets.iter().map(|s| s.lent).sum()
    }

    fn reclaim_all(&mut self) {
        for s in &mut self.sockets {
            s.reclaim(&mut self.free);
        }
    }
}

/// A socket on `queue`, sharing the UMEM of socket `shared` or, for the
/// first, registering it and binding in `mode` (falling back from
/// zero-copy to copy where the driver has no zero-copy); returns the mode
/// it was bound in.
#[allow(clippy::too_many_arguments)]
fn open_socket(
    interface: &str,
    ifindex: u32,
    queue: u32,
    shared: Option<RawFd>,
    mode: XdpMode,
    umem: &Mmap,
    free: &mut Vec<u64>,
    busy_poll: bool,
) -> Result<(Xsk, XdpMode), IoError> {
    let socket = xsk_socket(interface)?;
    if shared.is_none() {
        register_umem(&socket, umem).map_err(|e| os_error("registering the UMEM", interface, e))?;
    }
    let rings = Rings::map(&socket, interface)?;
    let mut xsk = Xsk { queue, rx: rings.rx, tx: rings.tx, fill: rings.fill, completion: rings.completion, socket, lent: 0, transmit_calls: 0, receive_calls: 0 };
    // Before the program attaches, so that no early frame finds the fill
    // ring empty.
    xsk.top_up(free);
    let bound = match (shared, mode) {
        (Some(fd), _) => bind(&xsk.socket, ifindex, queue, BindAs::SharedWith(fd)).map(|()| mode),
        (None, XdpMode::ZeroCopy) => match bind(&xsk.socket, ifindex, queue, BindAs::ZeroCopy) {
            Ok(()) => Ok(XdpMode::ZeroCopy),
            // A failed bind leaves the socket and its rings as they were.
            Err(_) => bind(&xsk.socket, ifindex, queue, BindAs::Copy).map(|()| XdpMode::Copy),
        },
        (None, XdpMode::Copy) => bind(&xsk.socket, ifindex, queue, BindAs::Copy).map(|()| XdpMode::Copy),
    };
    let bound = bound.map_err(|e| unsupported("binding the AF_XDP socket", interface, e))?;
    if busy_poll {
        super::prefer_busy_poll(&xsk.socket);
    }
    Ok((xsk, bound))
}

impl FramePorts for XdpPorts {
    fn receive(&mut self, side: usize, max: usize, f: &mut dyn FnMut(FrameId, &mut [u8]) -> bool) -> usize {
        let mut got = 0;
        let XdpPorts { sockets, first, frames, free, busy_poll, first_read, .. } = self;
        let served = &mut sockets[first[side]..first[side + 1]];
        let count = served.len();
        let start = first_read[side] % count.max(1);
        first_read[side] = (start + 1) % count.max(1);
        for queue in (start..count).chain(0..start) {
            let s = &mut served[queue];
            let available = s.rx.available();
            let n = available.min((max - got) as u32);
            for i in 0..n {
                let desc = s.rx.read(i);
                let id = FrameId { at: desc.addr, len: desc.len, queue: queue as u16 };
                // SAFETY: the kernel handed this chunk over in the RX
                // descriptor; until f keeps or returns it, nobody else has it.
                let kept = unsafe { frames.frame(id) }.is_some_and(|frame| f(id, frame));
                if !kept {
                    free.push(chunk_of(desc.addr));
                }
            }
            s.rx.release(n);
            s.lent -= n;
            s.top_up(free);
            // A ring read empty gets the device's receive work run at once,
            // so that what arrived meanwhile is there next round.
            if (*busy_poll && n == available) || s.fill.needs_wakeup() {
                s.receive_calls += 1;
                poke_receive(&s.socket);
            }
            got += n as usize;
        }
        got
    }

    fn memory(&self) -> &SharedFrames {
        &self.frames
    }

    unsafe fn transmit(&mut self, side: usize, id: FrameId) -> bool {
        let k = self.tx_socket(side, id.queue);
        let s = &mut self.sockets[k];
        if s.tx.free() == 0 {
            self.free.push(chunk_of(id.at));
            return false;
        }
        s.tx.push(libc::xdp_desc { addr: id.at, len: id.len, options: 0 });
        true
    }

    unsafe fn release(&mut self, id: FrameId) {
        self.free.push(chunk_of(id.at));
    }

    fn low_on_buffers(&self) -> bool {
        self.free.len() < SPARE_CHUNKS as usize / 4
    }

    fn send(&mut self, side: usize, frame: &[u8]) -> bool {
        if frame.is_empty() || frame.len() > FRAME_SIZE as usize {
            return false;
        }
        if self.free.is_empty() {
            self.reclaim_all();
            self.balance();
        }
        let Some(chunk) = self.free.pop() else { return false };
        let len = frame.len() as u32;
        let id = FrameId { at: chunk, len, queue: 0 };
        // SAFETY: the chunk was free, so nobody else holds it.
        unsafe { self.frames.frame(id) }.expect("chunks lie inside the UMEM").copy_from_slice(frame);
        // SAFETY: the chunk is ours, given up here.
        unsafe { self.transmit(side, id) }
    }

    fn flush(&mut self) -> Result<(), IoError> {
        let mut result = Ok(());
        for (side, name) in self.interfaces.iter().enumerate() {
            for s in &mut self.sockets[self.first[side]..self.first[side + 1]] {
                if let Err(e) = s.kick(name) {
                    result = Err(e);
                }
            }
        }
        self.reclaim_all();
        self.balance();
        for s in &mut self.sockets {
            s.top_up(&mut self.free);
        }
        result
    }

    fn fds(&self) -> Vec<RawFd> {
        self.sockets.iter().map(|s| s.socket.as_raw_fd()).collect()
    }

    fn backend(&self) -> &'static str {
        "af_xdp"
    }

    fn counters(&mut self, side: usize) -> PortCounters {
        let sockets = &self.sockets[self.first[side]..self.first[side + 1]];
        let program = &self.programs[side];
        PortCounters {
            refused: sockets.iter().map(|s| program.frames_too_long(s.queue)).sum(),
            kernel_dropped: sockets.iter().map(Xsk::kernel_dropped).sum(),
            transmit_calls: sockets.iter().map(|s| s.transmit_calls).sum(),
            receive_calls: sockets.iter().map(|s| s.receive_calls).sum(),
            ..PortCounters::default()
        }
    }
}

impl Drop for XdpPorts {
    /// Detaches the programs before this set's sockets close: frames of
    /// queues whose socket is gone would otherwise pass to the kernel's
    /// stack while other sets still run. A set without sockets (what
    /// `split` leaves) detaches nothing.
    fn drop(&mut self) {
        if !self.sockets.is_empty() {
            for program in self.programs.iter() {
                program.detach();
            }
        }
    }
}
