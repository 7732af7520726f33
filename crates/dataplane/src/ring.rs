//! Lock-free single-producer single-consumer rings of frames, for handing
//! frames between the first worker (which owns the interfaces) and the
//! others, and doorbells to wake a sleeping thread. A held frame (one the
//! interfaces lent out, `natrix_io::FrameId`) crosses as its id and stays
//! where it lies; a frame natrix made is copied into the ring's next copy
//! buffer, taken in turn. A ring may have fewer copy buffers than slots
//! where copies are rare (between per-queue workers, which hand each
//! other held frames), so that N x N rings stay small. No allocation.

use std::cell::UnsafeCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use natrix_engine::Side;
use natrix_io::{FrameId, SharedFrames, MAX_FRAME};

struct Slot {
    side: Side,
    carries: Carries,
}

/// What a slot holds.
#[derive(Clone, Copy)]
enum Carries {
    /// A copy of `len` bytes, in copy buffer `at`.
    Copy { at: usize, len: usize },
    /// A held frame, where it lies.
    Held(FrameId),
    /// A held frame handed back unsent, for its owner to release.
    Release(FrameId),
}

/// A frame popped from a ring.
pub enum Popped<'a> {
    /// To send, or to translate: its bytes and, for a held frame, its id.
    Frame(Side, &'a mut [u8], Option<FrameId>),
    /// A held frame its taker dropped: the interfaces' owner releases it.
    Release(FrameId),
}

/// Keeps the producer's and consumer's indexes on separate cache lines.
#[repr(align(64))]
struct Padded(AtomicUsize);

struct Shared {
    slots: Box<[UnsafeCell<Slot>]>,
    copies: Box<[UnsafeCell<[u8; MAX_FRAME]>]>,
    /// Where held frames lie.
    frames: SharedFrames,
    mask: usize,
    copy_mask: usize,
    head: Padded,
    tail: Padded,
    /// Copies the consumer is done with; the producer counts those it
    /// made, so the buffers in between are in use, oldest first.
    copies_done: Padded,
}

// SAFETY: a slot is written only by the producer before it publishes the
// tail, and read only by the consumer before it publishes the head; a copy
// buffer is written only by the producer while `copies_done` shows it free,
// and read only by the consumer while the slot naming it is unreleased.
unsafe impl Sync for Shared {}
// SAFETY: as above; the slots and buffers are plain data.
unsafe impl Send for Shared {}

/// The most frames one `pop_batch` hands over: the engine's batch.
pub const MAX_POP: usize = natrix_engine::batch::MAX_BATCH;

pub struct Producer {
    shared: Arc<Shared>,
    /// Copies made so far; the next goes into buffer `copies_made & copy_mask`.
    copies_made: usize,
}
pub struct Consumer(Arc<Shared>);

/// A ring of `capacity` frames with `copies` copy buffers (each rounded up
/// to a power of two, `copies` to at most `capacity`); held frames
/// crossing it lie in `frames`.
pub fn ring(capacity: usize, copies: usize, frames: SharedFrames) -> (Producer, Consumer) {
    let n = capacity.next_power_of_two();
    let c = copies.next_power_of_two().min(n);
    let shared = Arc::new(Shared {
        slots: (0..n).map(|_| UnsafeCell::new(Slot { side: Side::Inside, carries: Carries::Copy { at: 0, len: 0 } })).collect(),
        copies: (0..c).map(|_| UnsafeCell::new([0; MAX_FRAME])).collect(),
        frames,
        mask: n - 1,
        copy_mask: c - 1,
        head: Padded(AtomicUsize::new(0)),
        tail: Padded(AtomicUsize::new(0)),
        copies_done: Padded(AtomicUsize::new(0)),
    });
    (Producer { shared: shared.clone(), copies_made: 0 }, Consumer(shared))
}

impl Producer {
    /// Copies a frame in; false when the ring or its copy buffers are
    /// full, or the frame is too big.
    pub fn push(&mut self, side: Side, frame: &[u8]) -> bool {
        let r = &*self.shared;
        let made = self.copies_made;
        if frame.len() > MAX_FRAME || made.wrapping_sub(r.copies_done.0.load(Ordering::Acquire)) > r.copy_mask {
            return false;
        }
        let at = made & r.copy_mask;
        let put = self.put(side, Carries::Copy { at, len: frame.len() }, || {
            // SAFETY: buffer `at` is free (the consumer is done with every
            // copy before `made`), and invisible to it until put publishes.
            unsafe { (&mut *r.copies[at].get())[..frame.len()].copy_from_slice(frame) }
        });
        self.copies_made = made.wrapping_add(usize::from(put));
        put
    }

    /// Hands a held frame on, without copying it; false when the ring is
    /// full (the caller still holds it).
    pub fn push_held(&mut self, side: Side, id: FrameId) -> bool {
        self.put(side, Carries::Held(id), || {})
    }

    /// Hands a held frame back unsent; false when the ring is full.
    pub fn push_release(&mut self, id: FrameId) -> bool {
        self.put(Side::Inside, Carries::Release(id), || {})
    }

    fn put(&self, side: Side, carries: Carries, fill: impl FnOnce()) -> bool {
        let r = &*self.shared;
        let tail = r.tail.0.load(Ordering::Relaxed);
        if tail.wrapping_sub(r.head.0.load(Ordering::Acquire)) > r.mask {
            return false;
        }
        // SAFETY: the slot at tail is not visible to the consumer until the
        // release store below.
        let slot = unsafe { &mut *r.slots[tail & r.mask].get() };
        slot.side = side;
        slot.carries = carries;
        fill();
        // Also publishes the producer's writes into a held frame's bytes.
        r.tail.0.store(tail.wrapping_add(1), Ordering::Release);
        true
    }
}

/// A slot's frame: its copy, or the held frame where it lies.
///
/// # Safety
/// The consumer owns the slot (published, not yet released), and with it
/// the copy buffer or held frame it names.
#[allow(clippy::mut_from_ref)] // exclusive by the contract above, as with UnsafeCell::get
unsafe fn slot_frame<'a>(slot: &Slot, r: &'a Shared) -> (&'a mut [u8], Option<FrameId>) {
    match slot.carries {
        // SAFETY: the producer handed the frame over with the slot.
        Carries::Held(id) | Carries::Release(id) => (unsafe { r.frames.frame(id) }.unwrap_or_default(), Some(id)),
        // SAFETY: as above, the copy buffer.
        Carries::Copy { at, len } => (unsafe { &mut (&mut *r.copies[at].get())[..len] }, None),
    }
}

impl Consumer {
    /// Hands the oldest entry to `f`, a frame writable where it lies;
    /// false when empty.
    pub fn pop(&mut self, f: impl FnOnce(Popped)) -> bool {
        let r = &*self.0;
        let head = r.head.0.load(Ordering::Relaxed);
        if head == r.tail.0.load(Ordering::Acquire) {
            return false;
        }
        // SAFETY: the producer published this slot and will not touch it
        // until the release store of head below.
        let slot = unsafe { &*r.slots[head & r.mask].get() };
        match slot.carries {
            Carries::Release(id) => f(Popped::Release(id)),
            // SAFETY: the slot is ours until the store below.
            _ => {
                let (frame, held) = unsafe { slot_frame(slot, r) };
                f(Popped::Frame(slot.side, frame, held));
            }
        }
        r.finish(head, 1, usize::from(matches!(slot.carries, Carries::Copy { .. })));
        true
    }

    /// Hands up to `MAX_POP` of the oldest frames to `f` at once, each
    /// writable where it lies, with their sides (`sides[i]` is
    /// `frames[i]`'s) and, for held frames, their ids; returns how many (0
    /// when empty, without calling `f`). Rings that feed workers carry no
    /// releases.
    pub fn pop_batch(&mut self, f: impl FnOnce(&[Side], &mut [&mut [u8]], &[Option<FrameId>])) -> usize {
        let r = &*self.0;
        let head = r.head.0.load(Ordering::Relaxed);
        let n = r.tail.0.load(Ordering::Acquire).wrapping_sub(head).min(MAX_POP);
        if n == 0 {
            return 0;
        }
        let mut sides = [Side::Inside; MAX_POP];
        let mut held = [None; MAX_POP];
        let mut frames: [&mut [u8]; MAX_POP] = std::array::from_fn(|_| &mut [][..]);
        for (i, ((side, frame), id)) in sides.iter_mut().zip(frames.iter_mut()).zip(held.iter_mut()).take(n).enumerate() {
            // SAFETY: the producer published these n distinct slots and will
            // not touch them until the release store of head below; each is
            // borrowed once, as is each copy buffer or held frame they name.
            let slot = unsafe { &*r.slots[head.wrapping_add(i) & r.mask].get() };
            debug_assert!(!matches!(slot.carries, Carries::Release(_)), "a release in a ring that feeds a worker");
            *side = slot.side;
            (*frame, *id) = unsafe { slot_frame(slot, r) };
        }
        f(&sides[..n], &mut frames[..n], &held[..n]);
        r.finish(head, n, held[..n].iter().filter(|id| id.is_none()).count());
        n
    }

    pub fn is_empty(&self) -> bool {
        let r = &*self.0;
        r.head.0.load(Ordering::Relaxed) == r.tail.0.load(Ordering::Acquire)
    }
}

impl Shared {
    /// The consumer is done with `n` slots from `head`, `copies` of them
    /// copies: both go back to the producer.
    fn finish(&self, head: usize, n: usize, copies: usize) {
        if copies > 0 {
            let done = self.copies_done.0.load(Ordering::Relaxed);
            self.copies_done.0.store(done.wrapping_add(copies), Ordering::Release);
        }
        self.head.0.store(head.wrapping_add(n), Ordering::Release);
    }
}

/// Wakes a thread sleeping in poll(). Ringing costs a system call only when
/// the thread has said it is about to sleep.
pub struct Doorbell {
    fd: OwnedFd,
    sleeping: AtomicBool,
}

impl Doorbell {
    pub fn new() -> std::io::Result<Doorbell> {
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is fresh and ours.
        Ok(Doorbell { fd: unsafe { OwnedFd::from_raw_fd(fd) }, sleeping: AtomicBool::new(false) })
    }

    pub fn ring(&self) {
        // Orders the producer's earlier publish (a Release store of the ring
        // tail) before this load; the sleeper fences the other way round.
        // Without both, each side can miss the other's write and the sleeper
        // waits out its timeout with work queued.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            self.ring_always();
        }
    }

    pub fn ring_always(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
    }

    /// Marks the owner asleep; it must re-check for work after this and
    /// before blocking, so a ring in between is not lost.
    pub fn going_to_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), std::ptr::addr_of_mut!(v).cast(), 8) };
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Blocks until one of `fds` is readable or `timeout_ms` passes. Reads
/// (and so clears) the error of a socket that poll reports one for: an
/// AF_PACKET socket's ENETDOWN, set when its link goes down, stays until
/// read, and poll reports it at once every time, so an idle worker would
/// spin for as long as the link stays down. `natrix run` says when a link
/// goes down.
pub fn wait_readable(fds: &[RawFd], timeout_ms: i32) {
    let mut pfds: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: pfds is a live array of pfds.len() pollfds.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    for p in pfds.iter().filter(|p| p.revents & libc::POLLERR != 0) {
        natrix_io::take_socket_error(p.fd);
    }
}

#[cfg(test)]
mod tests {
    use natrix_io::{CopyingPorts, FramePorts, MemoryPort};

    use super::*;

    /// Frame memory for rings in tests, with the ports that lend it.
    fn ports() -> CopyingPorts {
        CopyingPorts::new([Box::new(MemoryPort::pair().unwrap().0), Box::new(MemoryPort::pair().unwrap().0)])
    }

    fn test_ring(capacity: usize) -> (Producer, Consumer) {
        ring(capacity, capacity, ports().shared())
    }

    #[test]
    fn frames_come_out_in_order_with_their_side_and_a_full_ring_refuses() {
        let (mut p, mut c) = test_ring(4);
        for i in 0..4u8 {
            assert!(p.push(if i % 2 == 0 { Side::Inside } else { Side::Outside }, &[i; 60]));
        }
        assert!(!p.push(Side::Inside, &[9; 60]));
        for i in 0..4u8 {
            assert!(c.pop(|popped| {
                let Popped::Frame(side, f, None) = popped else { panic!("a copy") };
                assert_eq!(f, &[i; 60][..]);
                assert_eq!(side == Side::Inside, i % 2 == 0);
            }));
        }
        assert!(!c.pop(|_| panic!("empty")));
    }

    #[test]
    fn a_batch_pop_hands_over_the_oldest_frames_in_order_and_frees_their_slots() {
        let (mut p, mut c) = test_ring(128);
        assert_eq!(c.pop_batch(|_, _, _| panic!("empty")), 0);
        for i in 0..100u8 {
            assert!(p.push(if i % 3 == 0 { Side::Outside } else { Side::Inside }, &[i; 61]));
        }
        let mut seen = Vec::new();
        while seen.len() < 100 {
            let n = c.pop_batch(|sides, frames, held| {
                assert_eq!(sides.len(), frames.len());
                assert!(held.iter().all(Option::is_none));
                for (side, f) in sides.iter().zip(frames.iter_mut()) {
                    let i = f[0];
                    assert_eq!(*f, &[i; 61][..]);
                    assert_eq!(*side == Side::Outside, i % 3 == 0);
                    f[0] = 0xff;
                    seen.push(i);
                }
            });
            assert!(n <= MAX_POP);
        }
        assert_eq!(seen, (0..100).collect::<Vec<u8>>());
        // All 128 slots are free again.
        for i in 0..128u8 {
            assert!(p.push(Side::Inside, &[i; 10]));
        }
        assert!(!p.push(Side::Inside, &[0; 10]));
    }

    #[test]
    fn a_batch_pop_from_a_small_ring_wraps_around_in_order() {
        let (mut p, mut c) = test_ring(8);
        let mut next_in = 0u32;
        let mut next_out = 0u32;
        for round in 0..40 {
            let k = 1 + round % 8;
            for _ in 0..k {
                assert!(p.push(Side::Inside, &next_in.to_be_bytes()));
                next_in += 1;
            }
            let n = c.pop_batch(|_, frames, _| {
                for f in frames.iter() {
                    assert_eq!(**f, next_out.to_be_bytes());
                    next_out += 1;
                }
            });
            assert_eq!(n, k as usize);
        }
        assert_eq!(next_out, next_in);
    }

    #[test]
    fn a_million_frames_cross_threads_intact() {
        let (mut p, mut c) = test_ring(256);
        let t = std::thread::spawn(move || {
            for i in 0..1_000_000u32 {
                while !p.push(Side::Outside, &i.to_be_bytes()) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0u32;
        while next < 1_000_000 {
            c.pop(|popped| {
                let Popped::Frame(_, f, _) = popped else { panic!("a copy") };
                assert_eq!(f, next.to_be_bytes());
                next += 1;
            });
        }
        t.join().unwrap();
    }

    /// Held frames cross as ids: the taker reads and writes the frame where
    /// the interfaces lent it, in another thread, and hands it back; the
    /// lender then sees the taker's writes, and a release comes back as one.
    #[test]
    fn held_frames_cross_threads_where_they_lie_and_come_back() {
        let (inside, peer) = MemoryPort::pair().unwrap();
        let mut ports = CopyingPorts::new([Box::new(inside), Box::new(MemoryPort::pair().unwrap().0)]);
        let (mut to_worker, mut worker_in) = ring(64, 1, ports.shared());
        let (mut worker_out, mut from_worker) = ring(64, 1, ports.shared());
        let mut ids = Vec::new();
        for i in 0..40u8 {
            peer.inject(&[i; 80]);
        }
        ports.receive(0, 64, &mut |id, _| {
            ids.push(id);
            true
        });
        for &id in &ids {
            assert!(to_worker.push_held(Side::Inside, id));
        }
        let worker = std::thread::spawn(move || {
            let mut taken = 0;
            while taken < 40 {
                taken += worker_in.pop_batch(|_, frames, held| {
                    for (f, id) in frames.iter_mut().zip(held) {
                        let id = id.expect("a held frame");
                        assert_eq!(f.len(), 80);
                        f[1] = f[0] ^ 0x5a;
                        let handed = if f[0] % 2 == 0 { worker_out.push_held(Side::Outside, id) } else { worker_out.push_release(id) };
                        assert!(handed);
                    }
                });
            }
        });
        worker.join().unwrap();
        let (mut forwarded, mut released) = (0, 0);
        while from_worker.pop(|popped| match popped {
            Popped::Frame(Side::Outside, f, Some(id)) => {
                assert_eq!(f[1], f[0] ^ 0x5a, "the worker's write, seen where the frame lies");
                forwarded += 1;
                // SAFETY: the worker handed it back; released once.
                unsafe { ports.release(id) };
            }
            Popped::Release(id) => {
                // SAFETY: the worker handed it back; released once.
                unsafe {
                    assert_eq!(ports.frame(id)[0] % 2, 1);
                    ports.release(id);
                }
                released += 1;
            }
            _ => panic!("what went in was held frames"),
        }) {}
        assert_eq!((forwarded, released), (20, 20));
    }

    /// A ring with fewer copy buffers than slots refuses a copy once they
    /// are all in use, still takes held frames and releases, and reuses
    /// the buffers in turn as copies are consumed.
    #[test]
    fn copies_beyond_the_copy_buffers_are_refused_while_held_frames_pass() {
        let (inside, peer) = MemoryPort::pair().unwrap();
        let mut ports = CopyingPorts::new([Box::new(inside), Box::new(MemoryPort::pair().unwrap().0)]);
        let (mut p, mut c) = ring(16, 2, ports.shared());
        peer.inject(&[7; 70]);
        let mut id = None;
        ports.receive(0, 1, &mut |got, _| {
            id = Some(got);
            true
        });
        let id = id.expect("a frame lent");
        assert!(p.push(Side::Inside, &[1; 60]));
        assert!(p.push(Side::Outside, &[2; 60]));
        assert!(!p.push(Side::Inside, &[3; 60]), "both copy buffers are in use");
        assert!(p.push_held(Side::Inside, id), "a held frame needs no copy buffer");
        let mut seen = Vec::new();
        let n = c.pop_batch(|sides, frames, held| {
            for ((side, f), id) in sides.iter().zip(frames.iter()).zip(held) {
                seen.push((*side, f[0], id.is_some()));
            }
        });
        assert_eq!(n, 3);
        assert_eq!(seen, [(Side::Inside, 1, false), (Side::Outside, 2, false), (Side::Inside, 7, true)]);
        assert!(p.push_release(id));
        assert!(c.pop(|popped| assert!(matches!(popped, Popped::Release(r) if r == id))));
        for round in 0..10u8 {
            assert!(p.push(Side::Outside, &[round; 30]) && p.push(Side::Inside, &[round ^ 0xff; 40]));
            assert!(!p.push(Side::Inside, &[0; 10]));
            assert!(c.pop(|popped| assert!(matches!(popped, Popped::Frame(Side::Outside, f, None) if *f == [round; 30]))));
            assert!(p.push(Side::Outside, &[round; 50]), "the first copy's buffer is free again");
            assert!(c.pop(|popped| assert!(matches!(popped, Popped::Frame(Side::Inside, f, None) if *f == [round ^ 0xff; 40]))));
            assert!(c.pop(|popped| assert!(matches!(popped, Popped::Frame(Side::Outside, f, None) if *f == [round; 50]))));
        }
        // SAFETY: the frame came back as a release; released once.
        unsafe { ports.release(id) };
    }

    #[test]
    fn a_million_copies_cross_threads_through_four_buffers_intact() {
        let (mut p, mut c) = ring(256, 4, ports().shared());
        let t = std::thread::spawn(move || {
            for i in 0..1_000_000u32 {
                while !p.push(Side::Outside, &[i.to_be_bytes(), (!i).to_be_bytes()].concat()) {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0u32;
        while next < 1_000_000 {
            c.pop_batch(|_, frames, _| {
                for f in frames.iter() {
                    assert_eq!(**f, [next.to_be_bytes(), (!next).to_be_bytes()].concat()[..]);
                    next += 1;
                }
            });
        }
        t.join().unwrap();
    }

    /// Whether poll reports an error on `fd` within `timeout_ms`.
    fn error_reported(fd: RawFd, timeout_ms: i32) -> bool {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, timeout_ms) };
        p.revents & libc::POLLERR != 0
    }

    #[test]
    fn a_socket_error_poll_reports_is_read_so_the_next_wait_can_sleep() {
        use std::net::UdpSocket;
        use std::os::fd::AsRawFd;
        // A connected UDP socket whose datagram met a closed port holds
        // ECONNREFUSED until it is read, as an AF_PACKET socket holds
        // ENETDOWN while its link is down.
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.connect(("127.0.0.1", port)).unwrap();
        s.send(b"to nobody").unwrap();
        assert!(error_reported(s.as_raw_fd(), 1000), "poll reports the refused datagram's error");
        assert!(error_reported(s.as_raw_fd(), 0), "and again, while nobody reads it");
        wait_readable(&[s.as_raw_fd()], 1000);
        assert!(!error_reported(s.as_raw_fd(), 0), "wait_readable read the error: poll no longer reports it");
    }
}
