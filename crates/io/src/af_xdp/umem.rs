//! The AF_XDP socket, the UMEM it shares with the kernel, and the four
//! rings (fill, RX, TX, completion) mapped into this process.

use std::io;
use std::marker::PhantomData;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{check, os_error, set_option, unsupported, BIND_RETRY_PAUSE, BIND_TRIES, FRAME_SIZE, RX_RING, TX_RING};
use crate::port::IoError;

pub(super) fn xsk_socket(interface: &str) -> Result<OwnedFd, IoError> {
    // SAFETY: plain socket creation.
    let fd = check(unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) }).map_err(|e| unsupported("creating the AF_XDP socket", interface, e))?;
    // SAFETY: fd was just created and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn register_umem(socket: &OwnedFd, umem: &Mmap) -> io::Result<()> {
    let reg = libc::xdp_umem_reg { addr: umem.ptr as u64, len: umem.len as u64, chunk_size: FRAME_SIZE, headroom: 0, flags: 0, tx_metadata_len: 0 };
    set_option(socket, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
}

/// How a socket binds: the first socket of a UMEM says copy or zero-copy;
/// every other socket on it shares that UMEM (its own fill and completion
/// rings, any interface and queue).
#[derive(Clone, Copy)]
pub(super) enum BindAs {
    Copy,
    ZeroCopy,
    SharedWith(RawFd),
}

pub(super) fn bind(socket: &OwnedFd, ifindex: u32, queue: u32, how: BindAs) -> io::Result<()> {
    // need_wakeup lets a zero-copy driver tell us when it wants a kick; in
    // copy mode the TX flag simply stays set (every flush kicks).
    let (flags, shared) = match how {
        BindAs::Copy => (libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP, 0),
        BindAs::ZeroCopy => (libc::XDP_ZEROCOPY | libc::XDP_USE_NEED_WAKEUP, 0),
        // The kernel takes the mode from the UMEM's first socket.
        BindAs::SharedWith(fd) => (libc::XDP_SHARED_UMEM, fd as u32),
    };
    let addr = libc::sockaddr_xdp { sxdp_family: libc::AF_XDP as u16, sxdp_flags: flags, sxdp_ifindex: ifindex, sxdp_queue_id: queue, sxdp_shared_umem_fd: shared };
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
pub(super) struct Mmap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Mmap is the only handle on its mapping; moving it to another
// thread moves that ownership with it.
unsafe impl Send for Mmap {}
// SAFETY: shared, a mapping is only reached through `FrameArea` (the UMEM),
// where who may touch which frame is decided by who holds its id.
unsafe impl Sync for Mmap {}

impl crate::frames::FrameArea for Mmap {
    fn base(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Mmap {
    pub(super) fn anonymous(len: usize) -> io::Result<Mmap> {
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
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe a mapping we own and no reference into it
        // outlives self.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A single-producer single-consumer ring shared with the kernel. This
/// process produces into the fill and TX rings and consumes from the RX and
/// completion rings; `ours` is the index of our side.
pub(super) struct Ring<T> {
    map: Mmap,
    producer: usize,
    consumer: usize,
    flags: usize,
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
        Ok(Ring {
            map,
            producer: offsets.producer as usize,
            consumer: offsets.consumer as usize,
            flags: offsets.flags as usize,
            descs,
            mask: entries - 1,
            ours: 0,
            entry: PhantomData,
        })
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

    pub(super) fn free(&self) -> u32 {
        let consumer = self.index(self.consumer).load(Ordering::Acquire);
        self.mask + 1 - self.ours.wrapping_sub(consumer)
    }

    /// Entries published or pushed that the kernel has not taken yet.
    pub(super) fn unconsumed(&self) -> u32 {
        self.ours.wrapping_sub(self.index(self.consumer).load(Ordering::Acquire))
    }

    /// Writes an entry without publishing it; the caller guarantees room.
    pub(super) fn push(&mut self, entry: T) {
        // SAFETY: the slot is in the mapping and, the ring not being full,
        // not in the kernel's hands.
        unsafe { self.slot(self.ours).write(entry) };
        self.ours = self.ours.wrapping_add(1);
    }

    pub(super) fn publish(&self) {
        self.index(self.producer).store(self.ours, Ordering::Release);
    }

    /// Whether the kernel asks for a system call to look at this ring
    /// (need_wakeup; always so for TX in copy mode).
    pub(super) fn needs_wakeup(&self) -> bool {
        self.index(self.flags).load(Ordering::Acquire) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    // Consumer side (RX, completion). The acquire load of the producer index
    // makes the kernel's descriptors visible; the release store of the
    // consumer index hands their slots back only after we have read them.

    pub(super) fn available(&self) -> u32 {
        self.index(self.producer).load(Ordering::Acquire).wrapping_sub(self.ours)
    }

    /// The i-th entry after the last one released; i < available().
    pub(super) fn read(&self, i: u32) -> T {
        // SAFETY: the kernel published this slot and does not touch it again
        // until we release it.
        unsafe { self.slot(self.ours.wrapping_add(i)).read() }
    }

    pub(super) fn release(&mut self, n: u32) {
        self.ours = self.ours.wrapping_add(n);
        self.index(self.consumer).store(self.ours, Ordering::Release);
    }
}

pub(super) struct Rings {
    pub(super) rx: Ring<libc::xdp_desc>,
    pub(super) tx: Ring<libc::xdp_desc>,
    pub(super) fill: Ring<u64>,
    pub(super) completion: Ring<u64>,
}

impl Rings {
    pub(super) fn map(socket: &OwnedFd, interface: &str) -> Result<Rings, IoError> {
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
