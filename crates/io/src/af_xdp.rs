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

use std::ffi::c_void;
use std::io;
use std::marker::PhantomData;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::iface::Interface;
use crate::port::{IoError, PacketPort, MAX_FRAME};

/// UMEM chunk size; one frame per chunk, so a chunk holds the largest frame.
const FRAME_SIZE: u32 = MAX_FRAME as u32;
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
        let ifindex = Interface::lookup(interface)?.index;
        refuse_multiqueue(interface)?;
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
        // Cumulative counters: frames dropped for want of room, in the RX
        // ring or in the fill ring.
        st.rx_dropped + st.rx_ring_full + st.rx_fill_ring_empty_descs
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

// ---------------------------------------------------------------------------
// Socket and UMEM

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

fn xsk_socket(interface: &str) -> Result<OwnedFd, IoError> {
    // SAFETY: plain socket creation.
    let fd = check(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) }).map_err(|e| unsupported("creating the AF_XDP socket", interface, e))?;
    // SAFETY: fd was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_option<T>(socket: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value points to a live T of the given size.
    check(unsafe { libc::setsockopt(socket.as_raw_fd(), level, name, (value as *const T).cast(), size_of::<T>() as libc::socklen_t) })?;
    Ok(())
}

fn register_umem(socket: &OwnedFd, umem: &Mmap) -> io::Result<()> {
    let reg = libc::xdp_umem_reg { addr: umem.ptr as u64, len: umem.len as u64, chunk_size: FRAME_SIZE, headroom: 0, flags: 0, tx_metadata_len: 0 };
    set_option(socket, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
}

fn bind(socket: &OwnedFd, ifindex: u32) -> io::Result<()> {
    // Copy mode: veth and most drivers have no zero-copy support, and copy
    // mode costs one copy per frame, which natrix's rates afford.
    let addr = libc::sockaddr_xdp { sxdp_family: libc::AF_XDP as u16, sxdp_flags: libc::XDP_COPY, sxdp_ifindex: ifindex, sxdp_queue_id: 0, sxdp_shared_umem_fd: 0 };
    let len = size_of::<libc::sockaddr_xdp>() as libc::socklen_t;
    let mut tries = BIND_TRIES;
    loop {
        // SAFETY: addr is a valid sockaddr_xdp of that length.
        let rc = unsafe { libc::bind(socket.as_raw_fd(), (&addr as *const libc::sockaddr_xdp).cast(), len) };
        let err = match check(rc) {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        tries -= 1;
        // The kernel frees the queue of a closed socket in a work item
        // shortly after the close; a port reopened at once (a restart)
        // finds it still busy for a moment.
        if err.raw_os_error() != Some(libc::EBUSY) || tries == 0 {
            return Err(err);
        }
        std::thread::sleep(BIND_RETRY_PAUSE);
    }
}

/// An mmap()ed region, unmapped on drop.
struct Mmap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Mmap is the only handle on its mapping; moving it to another
// thread moves that ownership with it.
unsafe impl Send for Mmap {}

impl Mmap {
    fn anonymous(len: usize) -> io::Result<Mmap> {
        let map = Mmap::new(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1, 0)?;
        // Huge pages spare the copy loops TLB misses; without them (the
        // kernel may refuse) everything still works.
        // SAFETY: the range is our own mapping.
        unsafe { libc::madvise(map.ptr.cast(), len, libc::MADV_HUGEPAGE) };
        Ok(map)
    }

    fn new(len: usize, flags: libc::c_int, fd: RawFd, offset: libc::off_t) -> io::Result<Mmap> {
        // SAFETY: a fresh mapping chosen by the kernel overlaps nothing of ours.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, offset) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mmap { ptr: ptr.cast(), len })
    }

    /// `len` bytes at `offset`, or None when they would leave the mapping.
    fn slice_mut(&mut self, offset: u64, len: u32) -> Option<&mut [u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len as usize)?;
        if end > self.len {
            return None;
        }
        // SAFETY: start..end lies inside the mapping, and &mut self makes
        // this the only reference into it.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len as usize) })
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping we own and no reference into it
        // outlives self.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// ---------------------------------------------------------------------------
// Rings

/// A single-producer single-consumer ring shared with the kernel. This
/// process produces into the fill and TX rings and consumes from the RX and
/// completion rings; `ours` is the index of our side.
struct Ring<T> {
    map: Mmap,
    producer: usize,
    consumer: usize,
    descs: usize,
    mask: u32,
    ours: u32,
    entry: PhantomData<T>,
}

impl<T: Copy> Ring<T> {
    fn map(socket: &OwnedFd, offsets: &libc::xdp_ring_offset, pgoff: libc::off_t, entries: u32) -> io::Result<Ring<T>> {
        let descs = offsets.desc as usize;
        let len = descs + entries as usize * size_of::<T>();
        let map = Mmap::new(len, libc::MAP_SHARED | libc::MAP_POPULATE, socket.as_raw_fd(), pgoff)?;
        // Fresh rings start with both indexes at zero.
        Ok(Ring { map, producer: offsets.producer as usize, consumer: offsets.consumer as usize, descs, mask: entries - 1, ours: 0, entry: PhantomData })
    }

    fn index(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: the kernel placed an aligned u32 index at this offset of
        // the mapping, which lives as long as self; the kernel writes it
        // concurrently, so it is only ever accessed atomically.
        unsafe { &*self.map.ptr.add(offset).cast::<AtomicU32>() }
    }

    fn slot(&self, index: u32) -> *mut T {
        // SAFETY: index & mask < entries, and the mapping holds `entries`
        // descriptors from `descs` on.
        unsafe { self.map.ptr.add(self.descs).cast::<T>().add((index & self.mask) as usize) }
    }

    // Producer side (fill, TX). The acquire load of the consumer index makes
    // sure the kernel is done reading the slots we are about to overwrite;
    // the release store of the producer index publishes what we wrote.

    fn free(&self) -> u32 {
        let consumer = self.index(self.consumer).load(Ordering::Acquire);
        self.mask + 1 - self.ours.wrapping_sub(consumer)
    }

    /// Entries published or pushed that the kernel has not taken yet.
    fn unconsumed(&self) -> u32 {
        self.ours.wrapping_sub(self.index(self.consumer).load(Ordering::Acquire))
    }

    /// Writes an entry without publishing it; the caller guarantees room.
    fn push(&mut self, entry: T) {
        // SAFETY: the slot is in the mapping and, the ring not being full,
        // not in the kernel's hands.
        unsafe { self.slot(self.ours).write(entry) };
        self.ours = self.ours.wrapping_add(1);
    }

    fn publish(&self) {
        self.index(self.producer).store(self.ours, Ordering::Release);
    }

    // Consumer side (RX, completion). The acquire load of the producer index
    // makes the kernel's descriptors visible; the release store of the
    // consumer index hands their slots back only after we have read them.

    fn available(&self) -> u32 {
        self.index(self.producer).load(Ordering::Acquire).wrapping_sub(self.ours)
    }

    /// The i-th entry after the last one released; i < available().
    fn read(&self, i: u32) -> T {
        // SAFETY: the kernel published this slot and does not touch it again
        // until we release it.
        unsafe { self.slot(self.ours.wrapping_add(i)).read() }
    }

    fn release(&mut self, n: u32) {
        self.ours = self.ours.wrapping_add(n);
        self.index(self.consumer).store(self.ours, Ordering::Release);
    }
}

struct Rings {
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    completion: Ring<u64>,
}

impl Rings {
    fn map(socket: &OwnedFd, interface: &str) -> Result<Rings, IoError> {
        let size = |name, entries: u32, op| set_option(socket, libc::SOL_XDP, name, &entries).map_err(|e| os_error(op, interface, e));
        size(libc::XDP_UMEM_FILL_RING, RX_RING, "sizing the fill ring")?;
        size(libc::XDP_UMEM_COMPLETION_RING, TX_RING, "sizing the completion ring")?;
        size(libc::XDP_RX_RING, RX_RING, "sizing the RX ring")?;
        size(libc::XDP_TX_RING, TX_RING, "sizing the TX ring")?;
        let off = mmap_offsets(socket).map_err(|e| os_error("reading the ring offsets", interface, e))?;
        let fill_pgoff = libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t;
        let completion_pgoff = libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t;
        Ok(Rings {
            rx: Ring::map(socket, &off.rx, libc::XDP_PGOFF_RX_RING, RX_RING).map_err(|e| os_error("mapping the RX ring", interface, e))?,
            tx: Ring::map(socket, &off.tx, libc::XDP_PGOFF_TX_RING, TX_RING).map_err(|e| os_error("mapping the TX ring", interface, e))?,
            fill: Ring::map(socket, &off.fr, fill_pgoff, RX_RING).map_err(|e| os_error("mapping the fill ring", interface, e))?,
            completion: Ring::map(socket, &off.cr, completion_pgoff, TX_RING).map_err(|e| os_error("mapping the completion ring", interface, e))?,
        })
    }
}

fn mmap_offsets(socket: &OwnedFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: xdp_mmap_offsets is plain integers; all zeroes is valid.
    let mut off: libc::xdp_mmap_offsets = unsafe { zeroed() };
    let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: off is writable for len bytes and len is updated in place.
    check(unsafe { libc::getsockopt(socket.as_raw_fd(), libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, (&mut off as *mut libc::xdp_mmap_offsets).cast(), &mut len) })?;
    // Kernels before 5.4 answer with a shorter layout (no flags field).
    if len as usize != size_of::<libc::xdp_mmap_offsets>() {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "kernel uses the pre-5.4 ring layout"));
    }
    Ok(off)
}

// ---------------------------------------------------------------------------
// The XDP program (bpf(2)) and its attachment (rtnetlink)

/// The redirect program, attached to the interface until drop.
struct XdpProgram {
    /// Opened in the interface's network namespace at attach time, so the
    /// detach on drop reaches the same interface whichever thread drops.
    netlink: OwnedFd,
    ifindex: u32,
    /// XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE: detaching names the mode.
    mode: u32,
    program: OwnedFd,
}

impl XdpProgram {
    fn attach(socket: &OwnedFd, ifindex: u32, interface: &str) -> Result<XdpProgram, IoError> {
        let map = xskmap().map_err(|e| unsupported("creating the XSKMAP", interface, e))?;
        let program = load_program(&map).map_err(|e| unsupported("loading the XDP program", interface, e))?;
        map_insert(&map, 0, socket.as_raw_fd()).map_err(|e| unsupported("adding the socket to the XSKMAP", interface, e))?;
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

impl Drop for XdpProgram {
    fn drop(&mut self) {
        // REPLACE with the expected fd detaches only if our program is still
        // the attached one. A failure (the interface is gone) leaves nothing
        // to clean up, and drop has no one to report to.
        let attrs = [(IFLA_XDP_FD, -1i32 as u32), (IFLA_XDP_FLAGS, self.mode | XDP_FLAGS_REPLACE), (IFLA_XDP_EXPECTED_FD, self.program.as_raw_fd() as u32)];
        let _ = set_link_xdp(&self.netlink, self.ifindex, &attrs);
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

fn xskmap() -> io::Result<OwnedFd> {
    let key_size = size_of::<u32>() as u32;
    bpf_fd(BPF_MAP_CREATE, &MapCreateAttr { map_type: BPF_MAP_TYPE_XSKMAP, key_size, value_size: key_size, max_entries: 1 })
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

// uapi/linux/if_link.h and uapi/linux/netlink.h
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_EXPECTED_FD: u16 = 8;
const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1 << 0;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_FLAGS_REPLACE: u32 = 1 << 4;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_HDRLEN: usize = 4;
const NLMSG_HDRLEN: usize = 16;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NLM_F_ACK_TLVS: u16 = 0x200;
const NLMSGERR_ATTR_MSG: u16 = 1;

fn netlink_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation.
    let fd = check(unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) })?;
    // SAFETY: fd was just created and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Extended acks carry the driver's reason for refusing a program;
    // capped acks leave our request out of the answer.
    set_option(&fd, libc::SOL_NETLINK, NETLINK_EXT_ACK, &1i32)?;
    set_option(&fd, libc::SOL_NETLINK, NETLINK_CAP_ACK, &1i32)?;
    Ok(fd)
}

/// RTM_SETLINK with a nested IFLA_XDP holding `attrs` (all 32-bit); on
/// failure, the errno and whatever reason the kernel gave.
fn set_link_xdp(netlink: &OwnedFd, ifindex: u32, attrs: &[(u16, u32)]) -> Result<(), String> {
    let request = setlink_request(ifindex, attrs);
    // SAFETY: request is a readable buffer of its length; an unconnected
    // netlink socket sends to the kernel.
    let sent = unsafe { libc::send(netlink.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    let mut answer = [0u8; 4096];
    // SAFETY: answer is writable for its length.
    let got = unsafe { libc::recv(netlink.as_raw_fd(), answer.as_mut_ptr().cast::<c_void>(), answer.len(), 0) };
    if got < 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    parse_ack(&answer[..got as usize])
}

fn setlink_request(ifindex: u32, attrs: &[(u16, u32)]) -> Vec<u8> {
    let nested_len = NLA_HDRLEN + attrs.len() * (NLA_HDRLEN + 4);
    let ifinfomsg_len = size_of::<libc::ifinfomsg>();
    let total = NLMSG_HDRLEN + ifinfomsg_len + nested_len;
    let mut msg = Vec::with_capacity(total);
    // struct nlmsghdr
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_SETLINK.to_ne_bytes());
    msg.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence number
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
                                                // struct ifinfomsg: family AF_UNSPEC, then the index; the rest stays zero.
    let index_at = msg.len() + 4;
    msg.resize(msg.len() + ifinfomsg_len, 0);
    msg[index_at..index_at + 4].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    push_attr_header(&mut msg, nested_len, IFLA_XDP | NLA_F_NESTED);
    for &(kind, value) in attrs {
        push_attr_header(&mut msg, NLA_HDRLEN + 4, kind);
        msg.extend_from_slice(&value.to_ne_bytes());
    }
    msg
}

fn push_attr_header(msg: &mut Vec<u8>, len: usize, kind: u16) {
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
}

fn ne_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn ne_i32(bytes: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Reads an NLMSG_ERROR answer: error 0 is the ack, anything else a
/// negative errno followed, with extended acks, by attributes such as a
/// message.
fn parse_ack(answer: &[u8]) -> Result<(), String> {
    if ne_u16(answer, 4) != Some(libc::NLMSG_ERROR as u16) {
        return Err("unexpected netlink answer".into());
    }
    let error = ne_i32(answer, NLMSG_HDRLEN).ok_or("short netlink answer")?;
    if error == 0 {
        return Ok(());
    }
    let errno = io::Error::from_raw_os_error(-error);
    let flags = ne_u16(answer, 6).unwrap_or(0);
    // Capped: nlmsgerr is the error and the request's header only.
    let tlvs = answer.get(NLMSG_HDRLEN + 4 + NLMSG_HDRLEN..).unwrap_or(&[]);
    match (flags & NLM_F_ACK_TLVS != 0).then(|| ack_message(tlvs)).flatten() {
        Some(message) => Err(format!("{errno} ({message})")),
        None => Err(errno.to_string()),
    }
}

fn ack_message(mut tlvs: &[u8]) -> Option<String> {
    while let (Some(len), Some(kind)) = (ne_u16(tlvs, 0), ne_u16(tlvs, 2)) {
        let len = len as usize;
        let value = tlvs.get(NLA_HDRLEN..len)?;
        if kind == NLMSGERR_ATTR_MSG {
            let text = value.split(|&b| b == 0).next().unwrap_or(value);
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        tlvs = tlvs.get(len.next_multiple_of(4)..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    use super::*;

    /// The local experimental ethertype: no kernel protocol answers it.
    const TEST_ETHERTYPE: u16 = 0x88b5;
    const PORT_IF: &str = "xsk0";
    const PEER_IF: &str = "peer0";

    #[test]
    fn missing_interface_is_named_in_the_error() {
        let err = AfXdpPort::open("nx-no-such0").err().expect("no such interface").to_string();
        assert!(err.contains("nx-no-such0"), "{err}");
    }

    #[test]
    fn parses_acks_and_extended_error_messages() {
        let mut answer = vec![0u8; NLMSG_HDRLEN + 4 + NLMSG_HDRLEN];
        answer[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        assert_eq!(parse_ack(&answer), Ok(()));
        answer[NLMSG_HDRLEN..NLMSG_HDRLEN + 4].copy_from_slice(&(-libc::EBUSY).to_ne_bytes());
        answer[6..8].copy_from_slice(&NLM_F_ACK_TLVS.to_ne_bytes());
        push_attr_header(&mut answer, NLA_HDRLEN + 5, NLMSGERR_ATTR_MSG);
        answer.extend_from_slice(b"busy\0\0\0\0");
        let busy = io::Error::from_raw_os_error(libc::EBUSY);
        assert_eq!(parse_ack(&answer), Err(format!("{busy} (busy)")));
    }

    /// Frames cross in both directions, in rounds that together pass more
    /// frames than the UMEM has of either kind, so every frame is recycled;
    /// each round's burst needs several 32-frame kicks.
    #[test]
    fn frames_cross_a_veth_pair_both_ways() {
        const ROUNDS: u32 = 12;
        const BURST: u32 = 200;
        let Some(ns) = Netns::with_veth_pair("both") else {
            return;
        };
        ns.run(|| {
            let mut port = AfXdpPort::open(PORT_IF).expect("AF_XDP opens on veth");
            assert_eq!(port.backend(), "af_xdp");
            let peer = RawSocket::open(PEER_IF);
            let port_mac = Interface::lookup(PORT_IF).unwrap().mac;
            let peer_mac = Interface::lookup(PEER_IF).unwrap().mac;
            for round in 0..ROUNDS {
                let seqs = round * BURST..(round + 1) * BURST;
                let inbound: Vec<Vec<u8>> = seqs.clone().map(|seq| test_frame(port_mac, peer_mac, seq)).collect();
                for frame in &inbound {
                    peer.send(frame);
                }
                assert!(receive_on_port(&mut port, inbound.len()) == inbound, "round {round}: frames into the port differ");

                let outbound: Vec<Vec<u8>> = seqs.map(|seq| test_frame(peer_mac, port_mac, seq)).collect();
                for frame in &outbound {
                    assert!(port.send(frame), "round {round}: TX ring full");
                }
                port.flush().expect("flush");
                assert!(peer.receive(outbound.len()) == outbound, "round {round}: frames out of the port differ");
            }
        });
    }

    #[test]
    fn one_port_per_queue_and_drop_detaches_the_program() {
        let Some(ns) = Netns::with_veth_pair("drop") else {
            return;
        };
        ns.run(|| {
            let port = AfXdpPort::open(PORT_IF).expect("AF_XDP opens on veth");
            assert!(ns.ip(&["link", "show", PORT_IF]).contains("prog/xdp"));
            match AfXdpPort::open(PORT_IF) {
                Err(IoError::Unsupported { interface, .. }) => assert_eq!(interface, PORT_IF),
                other => panic!("a second socket on queue 0: {:?}", other.map(|_| ())),
            }
            drop(port);
            assert!(!ns.ip(&["link", "show", PORT_IF]).contains("prog/xdp"));
            AfXdpPort::open(PORT_IF).expect("reopens after drop");
        });
    }

    #[test]
    fn interfaces_with_several_receive_queues_are_refused() {
        let Some(ns) = Netns::with_veth_pair("queues") else {
            return;
        };
        ns.ethtool(&["-L", PORT_IF, "rx", "2"]);
        ns.run(|| match AfXdpPort::open(PORT_IF) {
            Err(IoError::Unsupported { reason, .. }) => {
                assert!(reason.contains("ethtool -L"), "{reason}")
            }
            other => panic!("two receive queues: {:?}", other.map(|_| ())),
        });
    }

    /// 60 to 1514 bytes: addresses, the test ethertype, the sequence number
    /// and a pattern that differs per frame.
    fn test_frame(dst: [u8; 6], src: [u8; 6], seq: u32) -> Vec<u8> {
        let len = 60 + (seq as usize * 151) % 1455;
        let mut frame = Vec::with_capacity(len);
        frame.extend_from_slice(&dst);
        frame.extend_from_slice(&src);
        frame.extend_from_slice(&TEST_ETHERTYPE.to_be_bytes());
        frame.extend_from_slice(&seq.to_be_bytes());
        frame.extend((frame.len()..len).map(|i| (i as u32 ^ seq) as u8));
        frame
    }

    /// Collects `count` test frames from the port, skipping the kernel's own
    /// traffic (IPv6 neighbour discovery from the peer).
    fn receive_on_port(port: &mut AfXdpPort, count: usize) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut frames = Vec::new();
        while frames.len() < count && Instant::now() < deadline {
            let mut pfd = libc::pollfd { fd: port.fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 100) };
            port.recv_batch(64, &mut |frame| {
                if frame.get(12..14) == Some(&TEST_ETHERTYPE.to_be_bytes()[..]) {
                    frames.push(frame.to_vec());
                }
            })
            .expect("recv_batch");
        }
        frames
    }

    /// An AF_PACKET socket on the peer interface that sees only test frames.
    struct RawSocket(OwnedFd);

    impl RawSocket {
        fn open(interface: &str) -> RawSocket {
            let protocol = TEST_ETHERTYPE.to_be();
            // SAFETY: plain socket creation.
            let fd = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, i32::from(protocol)) }).expect("AF_PACKET socket");
            // SAFETY: fd was just created and nothing else owns it.
            let socket = RawSocket(unsafe { OwnedFd::from_raw_fd(fd) });
            // Room for a whole burst of full-size frames.
            set_option(&socket.0, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(8 << 20)).expect("SO_RCVBUFFORCE");
            let timeout = libc::timeval { tv_sec: 5, tv_usec: 0 };
            set_option(&socket.0, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout).expect("SO_RCVTIMEO");
            // SAFETY: sockaddr_ll is plain data; all zeroes is valid.
            let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = protocol;
            addr.sll_ifindex = Interface::lookup(interface).unwrap().index as i32;
            let len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: addr is a valid sockaddr_ll of that length.
            check(unsafe { libc::bind(fd, (&addr as *const libc::sockaddr_ll).cast(), len) }).expect("bind AF_PACKET");
            socket
        }

        fn send(&self, frame: &[u8]) {
            // SAFETY: frame is readable for its length; the bound interface
            // is the destination.
            let sent = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
            assert_eq!(sent, frame.len() as isize, "AF_PACKET send: {}", io::Error::last_os_error());
        }

        fn receive(&self, count: usize) -> Vec<Vec<u8>> {
            let mut frames = Vec::new();
            let mut buf = [0u8; MAX_FRAME];
            while frames.len() < count {
                // SAFETY: buf is writable for its length.
                let got = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if got < 0 {
                    break; // the receive timeout: report what arrived
                }
                frames.push(buf[..got as usize].to_vec());
            }
            frames
        }
    }

    /// A network namespace of our own holding a veth pair, deleted (with the
    /// pair) on drop, also when a test fails.
    struct Netns {
        name: String,
    }

    impl Netns {
        /// None, after saying why, where the test cannot run here.
        fn with_veth_pair(tag: &str) -> Option<Netns> {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                eprintln!("skipped: AF_XDP tests need root");
                return None;
            }
            let name = format!("nxtest-xdp-{}-{tag}", std::process::id());
            match Command::new("ip").args(["netns", "add", &name]).status() {
                Ok(status) if status.success() => {}
                other => {
                    eprintln!("skipped: cannot create a network namespace: {other:?}");
                    return None;
                }
            }
            let ns = Netns { name };
            ns.ip(&["link", "add", PORT_IF, "type", "veth", "peer", "name", PEER_IF]);
            for interface in [PORT_IF, PEER_IF] {
                // Offloads would leave kernel-built frames with partial
                // checksums or merged by GRO.
                ns.ethtool(&["-K", interface, "rx", "off", "tx", "off", "tso", "off", "gso", "off", "gro", "off"]);
                ns.ip(&["link", "set", interface, "up"]);
            }
            Some(ns)
        }

        fn ip(&self, args: &[&str]) -> String {
            run_command(&[&["ip", "-n", &self.name], args].concat())
        }

        fn ethtool(&self, args: &[&str]) {
            run_command(&[&["ip", "netns", "exec", &self.name, "ethtool"], args].concat());
        }

        /// Runs `f` on a thread that has entered the namespace; setns moves
        /// only the calling thread, so the test's own thread stays put.
        fn run(&self, f: impl FnOnce() + Send) {
            let path = std::ffi::CString::new(format!("/run/netns/{}", self.name)).unwrap();
            std::thread::scope(|s| {
                s.spawn(|| {
                    // SAFETY: path is a valid C string.
                    let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) }).expect("open the namespace");
                    // SAFETY: fd was just opened and nothing else owns it.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    // SAFETY: fd refers to a network namespace.
                    check(unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) }).expect("setns");
                    f();
                });
            });
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
        }
    }

    /// Runs a command line, panicking with its stderr when it fails.
    fn run_command(argv: &[&str]) -> String {
        let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap_or_else(|e| panic!("{}: {e}", argv[0]));
        assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
