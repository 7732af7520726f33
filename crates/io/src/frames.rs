//! Both interfaces of a running natrix as one object that lends out the
//! frames it receives: a frame stays where the backend put it, is
//! translated there, and leaves by the other interface's transmit ring
//! without a copy in natrix (AF_XDP with one UMEM shared by every socket).
//! Backends that cannot lend their buffers (AF_PACKET, the in-memory port)
//! are adapted by `CopyingPorts`, which copies each frame once on receive.

use std::cell::UnsafeCell;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::port::{IoError, PacketPort, MAX_FRAME};

/// A received frame natrix holds: it stays valid, and nobody else writes
/// it, until it is transmitted or released. Every id a port hands out must
/// go back to that port exactly once, through `transmit` or `release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameId {
    /// Where the frame lies (a UMEM offset, a buffer's index).
    pub(crate) at: u64,
    pub(crate) len: u32,
    /// The receive queue it came from: its flow leaves by the same queue
    /// index, which keeps a flow's frames in order.
    pub(crate) queue: u16,
}

impl FrameId {
    /// The frame's length in bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the frame starts in its buffer.
    pub fn offset(&self) -> usize {
        (self.at % MAX_FRAME as u64) as usize
    }

    /// The frame changed where it lies (made longer or shorter, its start
    /// moved): now `len` bytes from `start` bytes into its buffer; never
    /// outside the buffer.
    pub fn placed(self, start: usize, len: usize) -> FrameId {
        // A start at the buffer's end would name the next buffer.
        let start = start.min(MAX_FRAME - 1);
        FrameId { at: buffer_of(self.at) + start as u64, len: len.min(MAX_FRAME - start) as u32, ..self }
    }
}

/// The start of the buffer a frame starting at `at` lies in: every backend
/// lays frames in `MAX_FRAME`-byte buffers (AF_XDP chunks, the copying
/// pool's buffers) aligned to `MAX_FRAME` from the start of their memory.
fn buffer_of(at: u64) -> u64 {
    at - at % MAX_FRAME as u64
}

/// The memory held frames lie in, for the dataplane's other threads: a
/// thread handed a frame's id (over a ring that orders memory) reads and
/// writes the frame through this until it hands the id on or back, while
/// the port's owner leaves the frame alone. The memory stays mapped while
/// any handle lives.
#[derive(Clone)]
pub struct SharedFrames {
    area: Arc<dyn FrameArea>,
}

/// A region held frames lie in, at `FrameId::at` bytes from its start.
pub(crate) trait FrameArea: Send + Sync {
    fn base(&self) -> *mut u8;
    fn len(&self) -> usize;
}

impl SharedFrames {
    pub(crate) fn new(area: Arc<dyn FrameArea>) -> SharedFrames {
        SharedFrames { area }
    }

    /// The bytes of a held frame; None for an id that does not lie here.
    ///
    /// # Safety
    /// The calling thread holds `id`: it was handed the frame and has not
    /// handed it on or back, so nothing else reads or writes these bytes
    /// while the slice lives.
    #[allow(clippy::mut_from_ref)] // exclusive by the contract above, as with UnsafeCell::get
    pub unsafe fn frame(&self, id: FrameId) -> Option<&mut [u8]> {
        let start = usize::try_from(id.at).ok()?;
        let end = start.checked_add(id.len as usize)?;
        if end > self.area.len() {
            return None;
        }
        // SAFETY: start..end lies in the area, which this handle keeps
        // mapped; the caller's contract makes the slice the only access.
        Some(unsafe { std::slice::from_raw_parts_mut(self.area.base().add(start), id.len as usize) })
    }

    /// A held frame's whole buffer: the room before it (`id.offset()`
    /// bytes), its bytes and the room after them; None for an id that
    /// does not lie here.
    ///
    /// # Safety
    /// As `frame`: the calling thread holds `id`.
    #[allow(clippy::mut_from_ref)] // exclusive by the contract of `frame`
    pub unsafe fn buffer(&self, id: FrameId) -> Option<&mut [u8]> {
        // SAFETY: the caller holds id; the buffer around it is the frame's alone.
        unsafe { self.frame(id.placed(0, MAX_FRAME)) }
    }
}

/// What the backends counted for one interface since it opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct PortCounters {
    /// Frames refused on receive (VLAN tags, frames longer than natrix's
    /// buffers, partial checksums the port cannot finish).
    pub refused: u64,
    /// Frames received with a transport checksum their sender's offload
    /// left partial that the port finished (AF_PACKET, which is told).
    pub checksums_completed: u64,
    /// Frames the kernel dropped because natrix fell behind.
    pub kernel_dropped: u64,
    /// Frames lost after the port took them (`transmit` or `send` said
    /// true): the kernel refused them, or the device's queue was full.
    pub tx_dropped: u64,
    /// System calls that made the kernel transmit (sendto, sendmmsg).
    pub transmit_calls: u64,
    /// System calls that made the kernel receive (recvfrom, for busy
    /// polling or a zero-copy driver's need_wakeup).
    pub receive_calls: u64,
}

/// The interfaces natrix forwards between, indexed 0 (inside) and 1
/// (outside). No call makes a system call per frame.
///
/// The calls that take a `FrameId` are unsafe: the caller must hold the
/// frame (the port handed it out, and it has not been transmitted,
/// released, or handed to another thread since), and a held frame goes
/// back exactly once. A frame released twice would be received into twice
/// at once; the port cannot tell.
pub trait FramePorts: Send {
    /// Hands up to `max` frames received on `side` to `f`, each writable in
    /// place; `f` returns true to keep the frame (the caller now holds its
    /// id) or false to give it straight back. Returns how many came.
    fn receive(&mut self, side: usize, max: usize, f: &mut dyn FnMut(FrameId, &mut [u8]) -> bool) -> usize;

    /// The memory held frames lie in.
    fn memory(&self) -> &SharedFrames;

    /// The bytes of a held frame, writable.
    ///
    /// # Safety
    /// The caller holds `id`.
    unsafe fn frame(&mut self, id: FrameId) -> &mut [u8] {
        // SAFETY: the caller holds id, and &mut self keeps this the port's
        // only view of it.
        unsafe { self.memory().frame(id) }.expect("held frames lie in the port's memory")
    }

    /// The frames' memory, for handing held frames to other threads.
    fn shared(&self) -> SharedFrames {
        self.memory().clone()
    }

    /// Puts the buffers of held frames (`SharedFrames::buffer`: each frame
    /// and the room around it), writable, into `out` in the order of `ids`
    /// (as many as both have); returns how many.
    ///
    /// # Safety
    /// The caller holds every id, and they are distinct (so are their
    /// buffers: a backend lays one frame in each).
    unsafe fn buffers<'a>(&'a mut self, ids: &[FrameId], out: &mut [&'a mut [u8]]) -> usize {
        let memory: &'a SharedFrames = self.memory();
        let mut n = 0;
        for (id, slot) in ids.iter().zip(out.iter_mut()) {
            // SAFETY: the caller holds these distinct ids, whose buffers are
            // distinct, so the slices never overlap; they borrow the port for
            // 'a, which keeps the memory.
            *slot = unsafe { memory.buffer(*id) }.expect("held frames lie in the port's memory");
            n += 1;
        }
        n
    }

    /// Queues a held frame for transmission on `side`, without copying it;
    /// false when the transmit ring is full (the frame is released).
    ///
    /// # Safety
    /// The caller holds `id`, and gives it up.
    unsafe fn transmit(&mut self, side: usize, id: FrameId) -> bool;

    /// Gives a held frame back unsent.
    ///
    /// # Safety
    /// The caller holds `id`, and gives it up.
    unsafe fn release(&mut self, id: FrameId);

    /// Whether few free buffers are left: a caller about to hand held
    /// frames to a thread that may fall behind should copy them instead,
    /// so the interfaces keep buffers to receive into.
    fn low_on_buffers(&self) -> bool;

    /// Queues a copy of `frame` (a frame natrix made) on `side`; false when
    /// there is no room.
    fn send(&mut self, side: usize, frame: &[u8]) -> bool;

    /// Makes the kernel transmit everything queued and takes back what it
    /// has finished with.
    fn flush(&mut self) -> Result<(), IoError>;

    /// Readable when frames are waiting, for poll().
    fn fds(&self) -> Vec<RawFd>;

    /// "af_xdp", "af_packet" or "memory" (tests), for logs and metrics.
    fn backend(&self) -> &'static str;

    fn counters(&mut self, side: usize) -> PortCounters;
}

/// Two `PacketPort`s as `FramePorts`: a received frame is copied once into
/// a buffer of natrix's own (`HEADROOM` bytes in), where it is held and
/// translated; transmitting it queues that buffer, and a flush hands the
/// port the queued buffers in order where they lie (`send_from`: AF_PACKET's
/// sendmmsg reads them there), so a frame is copied once in natrix, on
/// receive, and frames natrix makes join the same queue.
pub struct CopyingPorts {
    ports: [Box<dyn PacketPort>; 2],
    /// The buffer pool (`Pool`).
    memory: SharedFrames,
    /// Offsets of the buffers nobody holds.
    free: Vec<u64>,
    /// Frames queued for each side, in the order they leave.
    queued: [Vec<FrameId>; 2],
    /// Frames dropped on receive because every buffer was held.
    starved: [u64; 2],
}

/// Buffers held frames are copied into.
const COPY_BUFFERS: usize = 4096;
/// Frames queued for one side past which a transmit flushes them first.
const QUEUE_LIMIT: usize = 512;
/// Frames handed to a port's `send_from` at a time: AF_PACKET's sendmmsg batch.
const SEND_CHUNK: usize = 256;

/// Room the pool leaves before each frame it copies, as AF_XDP's copy mode
/// leaves XDP_PACKET_HEADROOM: a frame may start earlier where it lies
/// (a reply to a DS-Lite softwire host gets its outer IPv6 header there).
const HEADROOM: usize = 128;

/// Where in its buffer a received frame of `len` bytes is copied: after
/// the headroom, or at the buffer's start for a frame too long to have it
/// (a jumbo frame), which then makes any longer frame as a copy.
fn start_in_buffer(len: usize) -> usize {
    if len + HEADROOM <= MAX_FRAME {
        HEADROOM
    } else {
        0
    }
}

/// `COPY_BUFFERS` frame buffers in one allocation that never moves.
struct Pool {
    _bytes: UnsafeCell<Box<[u8]>>,
    base: *mut u8,
}

// SAFETY: the pool is plain bytes; which thread may touch which buffer is
// decided by who holds its id (`SharedFrames::frame`'s contract).
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Pool {
    fn new() -> Pool {
        let bytes = UnsafeCell::new(vec![0u8; COPY_BUFFERS * MAX_FRAME].into_boxed_slice());
        // SAFETY: nothing else references the fresh allocation yet.
        let base = unsafe { (&mut *bytes.get()).as_mut_ptr() };
        Pool { _bytes: bytes, base }
    }
}

impl FrameArea for Pool {
    fn base(&self) -> *mut u8 {
        self.base
    }

    fn len(&self) -> usize {
        COPY_BUFFERS * MAX_FRAME
    }
}

impl CopyingPorts {
    pub fn new(ports: [Box<dyn PacketPort>; 2]) -> CopyingPorts {
        let free = (0..COPY_BUFFERS as u64).rev().map(|b| b * MAX_FRAME as u64).collect();
        CopyingPorts { ports, memory: SharedFrames::new(Arc::new(Pool::new())), free, queued: [Vec::with_capacity(QUEUE_LIMIT), Vec::with_capacity(QUEUE_LIMIT)], starved: [0; 2] }
    }

    /// Hands side `side`'s port its queued frames where they lie, in
    /// order, and frees their buffers.
    fn send_queued(&mut self, side: usize) -> Result<(), IoError> {
        let CopyingPorts { ports, memory, free, queued, .. } = self;
        let mut result = Ok(());
        for chunk in queued[side].chunks(SEND_CHUNK) {
            let mut views: [&[u8]; SEND_CHUNK] = [&[]; SEND_CHUNK];
            for (view, &id) in views.iter_mut().zip(chunk) {
                // SAFETY: a queued id's buffer is this pool's, and nobody
                // else holds it until it is freed below.
                *view = unsafe { memory.frame(id) }.expect("buffers lie in the pool");
            }
            if let Err(e) = ports[side].send_from(&views[..chunk.len()]) {
                result = Err(e);
            }
        }
        if queued[side].is_empty() {
            // What the port queued itself (a made frame when every buffer was held).
            result = ports[side].flush();
        }
        free.extend(queued[side].drain(..).map(|id| buffer_of(id.at)));
        result
    }
}

impl FramePorts for CopyingPorts {
    fn receive(&mut self, side: usize, max: usize, f: &mut dyn FnMut(FrameId, &mut [u8]) -> bool) -> usize {
        let CopyingPorts { ports, memory, free, starved, .. } = self;
        ports[side]
            .recv_batch(max, &mut |frame| {
                let Some(at) = free.pop() else {
                    starved[side] += 1;
                    return;
                };
                let len = frame.len().min(MAX_FRAME);
                let id = FrameId { at: at + start_in_buffer(len) as u64, len: len as u32, queue: 0 };
                // SAFETY: the buffer at `at` was free, so nobody else holds it.
                let buf = unsafe { memory.frame(id) }.expect("buffers lie in the pool");
                buf.copy_from_slice(&frame[..buf.len()]);
                if !f(id, buf) {
                    free.push(at);
                }
            })
            .unwrap_or(0)
    }

    fn memory(&self) -> &SharedFrames {
        &self.memory
    }

    unsafe fn transmit(&mut self, side: usize, id: FrameId) -> bool {
        if self.queued[side].len() >= QUEUE_LIMIT {
            // A failure is the port's to count; the frame still queues.
            let _ = self.send_queued(side);
        }
        self.queued[side].push(id);
        true
    }

    unsafe fn release(&mut self, id: FrameId) {
        self.free.push(buffer_of(id.at));
    }

    fn low_on_buffers(&self) -> bool {
        self.free.len() < COPY_BUFFERS / 4
    }

    fn send(&mut self, side: usize, frame: &[u8]) -> bool {
        if frame.is_empty() || frame.len() > MAX_FRAME {
            return false;
        }
        // With every buffer held (workers fallen behind), the port's own
        // queue takes it: it then leaves ahead of the side's queued frames,
        // which beats losing an ARP answer or a flow's frame.
        let Some(at) = self.free.pop() else { return self.ports[side].send(frame) };
        let id = FrameId { at, len: frame.len() as u32, queue: 0 };
        // SAFETY: the buffer at `at` was free, so nobody else holds it.
        unsafe { self.memory.frame(id) }.expect("buffers lie in the pool").copy_from_slice(frame);
        // SAFETY: the buffer is ours, given up to the queue.
        unsafe { self.transmit(side, id) }
    }

    fn flush(&mut self) -> Result<(), IoError> {
        let (a, b) = (self.send_queued(0), self.send_queued(1));
        a.and(b)
    }

    fn fds(&self) -> Vec<RawFd> {
        vec![self.ports[0].fd(), self.ports[1].fd()]
    }

    fn backend(&self) -> &'static str {
        self.ports[0].backend()
    }

    fn counters(&mut self, side: usize) -> PortCounters {
        let p = &mut self.ports[side];
        PortCounters {
            refused: p.dropped_on_receive(),
            kernel_dropped: p.kernel_dropped() + self.starved[side],
            tx_dropped: p.dropped_on_transmit(),
            transmit_calls: p.transmit_calls(),
            receive_calls: 0,
            checksums_completed: p.checksums_completed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryPort;

    /// A frame held across receives is still intact; a transmitted one
    /// reaches the other side's wire as it was written in place; released
    /// buffers are reused, so holding and releasing does not grow memory.
    #[test]
    fn held_frames_stay_intact_and_released_buffers_are_reused() {
        let (inside, in_peer) = MemoryPort::pair().unwrap();
        let (outside, out_peer) = MemoryPort::pair().unwrap();
        let mut ports = CopyingPorts::new([Box::new(inside), Box::new(outside)]);
        for round in 0..50u8 {
            in_peer.inject(&[round; 60]);
            in_peer.inject(&[round.wrapping_add(100); 70]);
            let mut held = Vec::new();
            ports.receive(0, 64, &mut |id, frame| {
                frame[1] = 0xee;
                let keep = frame[0] == round;
                if keep {
                    held.push(id);
                }
                keep
            });
            assert_eq!(held.len(), 1);
            let mut views: [&mut [u8]; 1] = [&mut []];
            // SAFETY: held came from receive and each id is held once.
            unsafe { ports.buffers(&held, &mut views) };
            let at = held[0].offset();
            assert_eq!(at, HEADROOM, "the pool leaves room before a frame");
            assert_eq!(views[0].len(), MAX_FRAME, "the frame and the room around it");
            assert_eq!(views[0][at..at + 2], [round, 0xee]);
            // Every other round the frame grows into its room: 4 bytes
            // before it (as an encapsulation would) and 4 after it.
            let id = if round % 2 == 0 {
                views[0][at - 4..at].copy_from_slice(&[0xcd; 4]);
                views[0][at + 60..at + 64].copy_from_slice(&[0xab; 4]);
                held[0].placed(at - 4, 68)
            } else {
                held[0]
            };
            // SAFETY: as above; transmitting gives it up.
            assert!(unsafe { ports.transmit(1, id) });
            ports.flush().unwrap();
            let sent = out_peer.take_sent();
            assert_eq!(sent.len(), 1);
            if round % 2 == 0 {
                assert_eq!(sent[0].len(), 68);
                assert_eq!(sent[0][..6], [0xcd, 0xcd, 0xcd, 0xcd, round, 0xee]);
                assert_eq!(sent[0][64..], [0xab; 4]);
            } else {
                assert_eq!(sent[0][..2], [round, 0xee]);
                assert_eq!(sent[0].len(), 60);
            }
        }
        assert_eq!(ports.free.len(), COPY_BUFFERS, "every buffer is free again");
    }

    /// Transmitted frames wait in their buffers until the flush, which
    /// hands them over in the order they were queued, frames natrix made
    /// among them: a buffer is not reused for a frame received meanwhile.
    #[test]
    fn queued_frames_leave_in_order_from_their_own_buffers() {
        let (inside, in_peer) = MemoryPort::pair().unwrap();
        let (outside, out_peer) = MemoryPort::pair().unwrap();
        let mut ports = CopyingPorts::new([Box::new(inside), Box::new(outside)]);
        let receive_one = |ports: &mut CopyingPorts, byte: u8| {
            in_peer.inject(&[byte; 60]);
            let mut got = None;
            ports.receive(0, 1, &mut |id, _| {
                got = Some(id);
                true
            });
            got.expect("received")
        };
        let first = receive_one(&mut ports, 1);
        // SAFETY: each id is received once and given up once.
        assert!(unsafe { ports.transmit(1, first) });
        assert!(ports.send(1, &[2; 42]));
        let third = receive_one(&mut ports, 3);
        // SAFETY: as above.
        assert!(unsafe { ports.transmit(1, third) });
        // Frames received meanwhile take other buffers, and leave the
        // queued ones as they were.
        for byte in 10..20 {
            let id = receive_one(&mut ports, byte);
            // SAFETY: as above.
            unsafe { ports.frame(id) }.fill(0xff);
            // SAFETY: as above.
            unsafe { ports.release(id) };
        }
        assert!(out_peer.take_sent().is_empty(), "nothing leaves before the flush");
        ports.flush().unwrap();
        assert_eq!(out_peer.take_sent(), vec![vec![1; 60], vec![2; 42], vec![3; 60]]);
        assert_eq!(ports.free.len(), COPY_BUFFERS, "every buffer is free again");
    }

    /// A side that queues more than its limit between flushes sends the
    /// earlier frames first, in order, and loses none.
    #[test]
    fn a_long_queue_is_sent_early_and_in_order() {
        let (outside, out_peer) = MemoryPort::pair().unwrap();
        let mut ports = CopyingPorts::new([Box::new(MemoryPort::pair().unwrap().0), Box::new(outside)]);
        let count = QUEUE_LIMIT * 2 + 3;
        for i in 0..count {
            assert!(ports.send(1, &(i as u32).to_be_bytes()));
        }
        let mut sent = out_peer.take_sent();
        assert_eq!(sent.len(), 2 * QUEUE_LIMIT, "each full queue went before the next frame joined it");
        ports.flush().unwrap();
        sent.extend(out_peer.take_sent());
        let order: Vec<u32> = sent.iter().map(|f| u32::from_be_bytes(f[..4].try_into().unwrap())).collect();
        assert_eq!(order, (0..count as u32).collect::<Vec<_>>());
    }

    /// A frame too long to have the headroom (a jumbo frame up to the
    /// buffer's size) is received whole, from its buffer's start.
    #[test]
    fn a_frame_too_long_for_the_headroom_is_received_whole() {
        let (inside, peer) = MemoryPort::pair().unwrap();
        let mut ports = CopyingPorts::new([Box::new(inside), Box::new(MemoryPort::pair().unwrap().0)]);
        for len in [MAX_FRAME - HEADROOM, MAX_FRAME - HEADROOM + 1, MAX_FRAME] {
            let frame: Vec<u8> = (0..len).map(|i| i as u8).collect();
            peer.inject(&frame);
            let mut got = None;
            ports.receive(0, 1, &mut |id, bytes| {
                got = Some((id.offset(), bytes.to_vec()));
                false
            });
            let (offset, bytes) = got.expect("received");
            assert_eq!(bytes, frame, "{len} bytes arrive whole");
            assert_eq!(offset, if len == MAX_FRAME - HEADROOM { HEADROOM } else { 0 });
        }
    }

    /// A frame never grows past the end of the buffer it lies in.
    #[test]
    fn a_frame_grows_at_most_to_its_buffers_end() {
        let id = FrameId { at: 3 * MAX_FRAME as u64 + 256, len: 100, queue: 0 };
        assert_eq!(id.offset(), 256);
        assert_eq!(id.placed(256, 200).len(), 200);
        assert_eq!(id.placed(256, MAX_FRAME).len(), MAX_FRAME - 256);
        assert_eq!(id.placed(256, MAX_FRAME).at, id.at);
        let inner = id.placed(296, 60);
        assert_eq!((inner.at, inner.len()), (id.at + 40, 60));
        let outer = id.placed(216, 140);
        assert_eq!((outer.at, outer.len()), (id.at - 40, 140), "its start moved into the room before it");
        let beyond = id.placed(MAX_FRAME + 5, 10);
        assert_eq!((buffer_of(beyond.at), beyond.len()), (3 * MAX_FRAME as u64, 1), "never outside its buffer");
        assert_eq!(buffer_of(inner.at), 3 * MAX_FRAME as u64);
    }

    /// Holding most buffers (a worker fallen behind with frames handed to
    /// it) raises the low-water flag before the last quarter goes, and
    /// giving them back lowers it.
    #[test]
    fn holding_most_buffers_says_so_before_they_run_out() {
        let (inside, peer) = MemoryPort::pair().unwrap();
        let mut ports = CopyingPorts::new([Box::new(inside), Box::new(MemoryPort::pair().unwrap().0)]);
        let mut held = Vec::new();
        while !ports.low_on_buffers() {
            peer.inject(&[7; 64]);
            ports.receive(0, 1, &mut |id, _| {
                held.push(id);
                true
            });
        }
        assert!(held.len() > COPY_BUFFERS / 2 && held.len() <= COPY_BUFFERS * 3 / 4 + 1, "{} held", held.len());
        for id in held {
            // SAFETY: each id was received once and is released once.
            unsafe { ports.release(id) };
        }
        assert!(!ports.low_on_buffers());
    }
}
