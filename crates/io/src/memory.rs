//! An in-memory port: a `PacketPort` whose wire is a test (or any program)
//! holding the other end, a `MemoryPeer`. The peer injects frames as if
//! they had arrived on the interface and collects the frames the port
//! transmitted, so the dataplane runs whole, threads and all, without root
//! and without interfaces (as smoltcp's loopback device serves its tests).
//!
//! The port's file descriptor is an eventfd that is readable exactly while
//! injected frames wait, so a dataplane thread sleeping in poll() wakes for
//! them as it would for a real interface. Transmitted frames reach the peer
//! at `flush`, as a real backend hands its queue to the kernel there.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::port::{IoError, PacketPort, MAX_FRAME};

/// Frames `send` queues between two flushes, by default: a real backend's
/// transmit ring is about this size.
pub const DEFAULT_TX_CAPACITY: usize = 2048;

/// The dataplane's end: give it to the dataplane as an interface's port.
pub struct MemoryPort {
    shared: Arc<Shared>,
    /// Sent since the last flush.
    queued: Vec<Vec<u8>>,
    tx_capacity: usize,
    tx_dropped: u64,
}

/// The wire's end, for the test: inject frames, collect what was sent.
#[derive(Clone)]
pub struct MemoryPeer {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled at every flush that hands frames over.
    sent_cv: Condvar,
    /// Readable while `state.rx` holds frames.
    event: OwnedFd,
}

#[derive(Default)]
struct State {
    rx: VecDeque<Vec<u8>>,
    sent: VecDeque<Vec<u8>>,
    /// Frames the port has received in all, for `MemoryPeer::received`.
    taken: u64,
}

impl MemoryPort {
    /// A port and the peer that drives it.
    pub fn pair() -> Result<(MemoryPort, MemoryPeer), IoError> {
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(IoError::os("creating an eventfd", "memory"));
        }
        // SAFETY: fd is fresh and ours alone.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), sent_cv: Condvar::new(), event });
        let port = MemoryPort { shared: shared.clone(), queued: Vec::new(), tx_capacity: DEFAULT_TX_CAPACITY, tx_dropped: 0 };
        Ok((port, MemoryPeer { shared }))
    }

    /// How many frames `send` accepts between two flushes; past that it
    /// refuses them, as a full transmit ring does.
    pub fn with_tx_capacity(mut self, frames: usize) -> MemoryPort {
        self.tx_capacity = frames;
        self
    }
}

impl PacketPort for MemoryPort {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<usize, IoError> {
        let mut batch: Vec<Vec<u8>> = {
            let mut state = self.shared.lock();
            let n = max.min(state.rx.len());
            let batch = state.rx.drain(..n).collect();
            state.taken += n as u64;
            if state.rx.is_empty() {
                // Under the lock, so an injection cannot slip in between
                // the check and the reset and leave its frame unannounced.
                self.shared.reset_event();
            }
            batch
        };
        for frame in &mut batch {
            f(frame);
        }
        Ok(batch.len())
    }

    fn send(&mut self, frame: &[u8]) -> bool {
        if self.queued.len() >= self.tx_capacity || frame.is_empty() || frame.len() > MAX_FRAME {
            return false;
        }
        self.queued.push(frame.to_vec());
        true
    }

    /// As a real port: what it refuses here was handed over, so it counts.
    fn send_from(&mut self, frames: &[&[u8]]) -> Result<(), IoError> {
        for frame in frames {
            if !self.send(frame) {
                self.tx_dropped += 1;
            }
        }
        self.flush()
    }

    fn flush(&mut self) -> Result<(), IoError> {
        if self.queued.is_empty() {
            return Ok(());
        }
        self.shared.lock().sent.extend(self.queued.drain(..));
        self.shared.sent_cv.notify_all();
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.shared.event.as_raw_fd()
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    fn dropped_on_transmit(&self) -> u64 {
        self.tx_dropped
    }
}

impl MemoryPeer {
    /// Puts a frame on the wire towards the port; the port's fd turns readable.
    pub fn inject(&self, frame: &[u8]) {
        let mut state = self.shared.lock();
        state.rx.push_back(frame.to_vec());
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.shared.event.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
    }

    /// Injected frames the port has not received yet.
    pub fn waiting(&self) -> usize {
        self.shared.lock().rx.len()
    }

    /// Frames the port has received since it was made.
    pub fn received(&self) -> u64 {
        self.shared.lock().taken
    }

    /// Every frame the port has sent and the peer not yet taken, oldest first.
    pub fn take_sent(&self) -> Vec<Vec<u8>> {
        self.shared.lock().sent.drain(..).collect()
    }

    /// Waits up to `timeout` for the first sent frame `matches` accepts and
    /// takes it, leaving the others; None when none came in time.
    pub fn wait_for(&self, timeout: Duration, mut matches: impl FnMut(&[u8]) -> bool) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if let Some(i) = state.sent.iter().position(|f| matches(f)) {
                return state.sent.remove(i);
            }
            let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
            state = self.shared.sent_cv.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Waits up to `timeout` until the port has sent at least `count`
    /// frames not yet taken, then takes them all (fewer on a timeout).
    pub fn wait_sent(&self, count: usize, timeout: Duration) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while state.sent.len() < count {
            let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else { break };
            state = self.shared.sent_cv.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        state.sent.drain(..).collect()
    }
}

impl Shared {
    /// A panic elsewhere while holding the lock leaves plain queues behind,
    /// which stay usable.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reset_event(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; EAGAIN (already
        // zero) is fine.
        unsafe { libc::read(self.event.as_raw_fd(), std::ptr::addr_of_mut!(v).cast(), 8) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; timeout 0 never blocks.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    #[test]
    fn injected_frames_arrive_in_batches_in_order_and_the_fd_says_when_they_wait() {
        let (mut port, peer) = MemoryPort::pair().unwrap();
        assert!(!readable(port.fd()));
        assert_eq!(port.recv_batch(8, &mut |_| panic!("nothing injected")).unwrap(), 0);
        for i in 0..5u8 {
            peer.inject(&[i; 60]);
        }
        assert!(readable(port.fd()));
        let mut seen = Vec::new();
        assert_eq!(port.recv_batch(3, &mut |f| seen.push(f[0])).unwrap(), 3);
        assert!(readable(port.fd()), "two frames still wait");
        assert_eq!(port.recv_batch(8, &mut |f| seen.push(f[0])).unwrap(), 2);
        assert_eq!(seen, [0, 1, 2, 3, 4]);
        assert!(!readable(port.fd()), "drained: the fd is quiet again");
        assert_eq!((peer.waiting(), peer.received()), (0, 5));
    }

    #[test]
    fn sent_frames_reach_the_peer_at_flush_and_a_full_queue_refuses() {
        let (port, peer) = MemoryPort::pair().unwrap();
        let mut port = port.with_tx_capacity(2);
        assert!(port.send(&[1; 60]) && port.send(&[2; 60]));
        assert!(!port.send(&[3; 60]), "queue full until the flush");
        assert!(peer.take_sent().is_empty(), "nothing leaves before the flush");
        port.flush().unwrap();
        assert_eq!(port.dropped_on_transmit(), 0, "a refused send is the caller's to count");
        assert!(port.send(&[4; 60]));
        port.flush().unwrap();
        assert_eq!(peer.wait_for(Duration::ZERO, |f| f[0] == 2), Some(vec![2; 60]));
        assert_eq!(peer.take_sent(), [vec![1; 60], vec![4; 60]]);
        assert!(!port.send(&[]) && !port.send(&[0; MAX_FRAME + 1]));
        port.send_from(&[&[5; 60], &[6; 60], &[7; 60]]).unwrap();
        assert_eq!(port.dropped_on_transmit(), 1, "what send_from could not take was handed over: counted");
    }

    #[test]
    fn a_waiting_peer_wakes_for_frames_sent_from_another_thread() {
        let (mut port, peer) = MemoryPort::pair().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            port.send(&[7; 64]);
            port.flush().unwrap();
        });
        assert_eq!(peer.wait_sent(1, Duration::from_secs(5)), [vec![7; 64]]);
        assert_eq!(peer.wait_for(Duration::from_millis(10), |_| true), None);
        t.join().unwrap();
    }
}
