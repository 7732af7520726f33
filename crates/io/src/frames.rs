//! Both interfaces of a running natrix as one object that lends out the
//! frames it receives: a frame stays where the backend put it, is
//! translated there, and leaves by the other interface's transmit ring
//! without a copy in natrix (AF_XDP with one UMEM shared by every socket).
//! Backends that cannot lend their buffers (AF_PACKET, the in-memory port)
//! are adapted by `CopyingPorts`, which copies each frame once on receive.

use std::os::fd::RawFd;

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

/// What the backends counted for one interface since it opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct PortCounters {
    /// Frames refused on receive (partial checksums, VLAN tags).
    pub refused: u64,
    /// Frames the kernel dropped because natrix fell behind.
    pub kernel_dropped: u64,
    /// Frames lost because the device's transmit queue was full.
    pub tx_dropped: u64,
    /// System calls that made the kernel transmit (sendto, sendmmsg).
    pub transmit_calls: u64,
    /// System calls that made the kernel receive (recvfrom, for busy
    /// polling or a zero-copy driver's need_wakeup).
    pub receive_calls: u64,
}

/// The interfaces natrix forwards between, indexed 0 (inside) and 1
/// (outside). No call makes a system call per frame.
pub trait FramePorts: Send {
    /// Hands up to `max` frames received on `side` to `f`, each writable in
    /// place; `f` returns true to keep the frame (the caller now holds its
    /// id) or false to give it straight back. Returns how many came.
    fn receive(&mut self, side: usize, max: usize, f: &mut dyn FnMut(FrameId, &mut [u8]) -> bool) -> usize;

    /// The bytes of a held frame, writable.
    fn frame(&mut self, id: FrameId) -> &mut [u8];

    /// The bytes of held frames, in the order of `ids`, each writable; the
    /// ids are distinct (each is held once).
    fn frames<'a>(&'a mut self, ids: &[FrameId], out: &mut Vec<&'a mut [u8]>);

    /// Queues a held frame for transmission on `side`, without copying it;
    /// false when the transmit ring is full (the frame is released).
    fn transmit(&mut self, side: usize, id: FrameId) -> bool;

    /// Gives a held frame back unsent.
    fn release(&mut self, id: FrameId);

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
/// a buffer of natrix's own, where it is held and translated; transmitting
/// it hands the port that buffer (which the port copies to the kernel).
pub struct CopyingPorts {
    ports: [Box<dyn PacketPort>; 2],
    buffers: Vec<[u8; MAX_FRAME]>,
    free: Vec<u32>,
}

impl CopyingPorts {
    pub fn new(ports: [Box<dyn PacketPort>; 2]) -> CopyingPorts {
        CopyingPorts { ports, buffers: Vec::new(), free: Vec::new() }
    }
}

impl FramePorts for CopyingPorts {
    fn receive(&mut self, side: usize, max: usize, f: &mut dyn FnMut(FrameId, &mut [u8]) -> bool) -> usize {
        let CopyingPorts { ports, buffers, free } = self;
        ports[side]
            .recv_batch(max, &mut |frame| {
                let len = frame.len().min(MAX_FRAME);
                let b = free.pop().unwrap_or_else(|| {
                    buffers.push([0; MAX_FRAME]);
                    (buffers.len() - 1) as u32
                });
                let buf = &mut buffers[b as usize][..len];
                buf.copy_from_slice(&frame[..len]);
                if !f(FrameId { at: u64::from(b), len: len as u32, queue: 0 }, buf) {
                    free.push(b);
                }
            })
            .unwrap_or(0)
    }

    fn frame(&mut self, id: FrameId) -> &mut [u8] {
        &mut self.buffers[id.at as usize][..id.len as usize]
    }

    fn frames<'a>(&'a mut self, ids: &[FrameId], out: &mut Vec<&'a mut [u8]>) {
        let (base, count) = (self.buffers.as_mut_ptr(), self.buffers.len());
        for id in ids.iter().filter(|id| (id.at as usize) < count && id.len as usize <= MAX_FRAME) {
            // SAFETY: ids are distinct held buffers, so the slices never
            // overlap; they borrow self for 'a, which keeps the buffers.
            out.push(unsafe { std::slice::from_raw_parts_mut(base.add(id.at as usize).cast::<u8>(), id.len as usize) });
        }
    }

    fn transmit(&mut self, side: usize, id: FrameId) -> bool {
        let sent = self.ports[side].send(&self.buffers[id.at as usize][..id.len as usize]);
        self.free.push(id.at as u32);
        sent
    }

    fn release(&mut self, id: FrameId) {
        self.free.push(id.at as u32);
    }

    fn send(&mut self, side: usize, frame: &[u8]) -> bool {
        self.ports[side].send(frame)
    }

    fn flush(&mut self) -> Result<(), IoError> {
        let (a, b) = (self.ports[0].flush(), self.ports[1].flush());
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
            kernel_dropped: p.kernel_dropped(),
            tx_dropped: p.dropped_on_transmit(),
            transmit_calls: p.transmit_calls(),
            receive_calls: 0,
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
            let mut views = Vec::new();
            ports.frames(&held, &mut views);
            assert_eq!(views[0][..2], [round, 0xee]);
            assert!(ports.transmit(1, held[0]));
            ports.flush().unwrap();
            let sent = out_peer.take_sent();
            assert_eq!(sent.len(), 1);
            assert_eq!(sent[0][..2], [round, 0xee]);
            assert_eq!(sent[0].len(), 60);
        }
        assert!(ports.buffers.len() <= 2, "{} buffers for two frames at a time", ports.buffers.len());
    }
}
