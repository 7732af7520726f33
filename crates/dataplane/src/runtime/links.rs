//! Both interfaces, the router state around them (the gateway), the frames
//! of the current round, and the interfaces' counters: what the thread that
//! owns the interfaces works on. Per-queue workers each have links of
//! their own (their queues' sockets) and share one gateway, so a neighbour
//! any of them learns is known to all; it is locked once per batch.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use natrix_engine::Side;
use natrix_io::{FrameId, FramePorts};

use super::clock::SLEEP_MS;
use super::stage::{Next, Stage, Staged};
use super::{IoSnapshot, BATCH};
use crate::gateway::{plainly_for_the_engine, Gateway, Ingress};
use crate::ring::wait_readable;

pub(super) struct Links {
    pub(super) ports: Box<dyn FramePorts>,
    pub(super) gateway: Arc<Mutex<Gateway>>,
    /// natrix's MAC on each side, for `plainly_for_the_engine`.
    macs: [[u8; 6]; 2],
    pub(super) stage: Stage,
    pub(super) snapshot: IoSnapshot,
    /// Frames the gateway makes while a held frame is being addressed
    /// (requests for next hops), sent after the round's frames.
    requests: Stage,
}

impl Links {
    pub(super) fn new(ports: Box<dyn FramePorts>, gateway: Arc<Mutex<Gateway>>) -> Links {
        let macs = [Side::Inside, Side::Outside].map(|side| lock(&gateway).mac(side));
        Links { ports, gateway, macs, stage: Stage::default(), snapshot: IoSnapshot::default(), requests: Stage::default() }
    }

    pub(super) fn gateway(&self) -> MutexGuard<'_, Gateway> {
        lock(&self.gateway)
    }

    /// Stages the gateway's announcements of natrix's addresses.
    pub(super) fn announce(&mut self) {
        let Links { gateway, stage, .. } = self;
        lock(gateway).announce(&mut |s, f| stage.push_addressed(s, f));
    }

    /// Receives a batch on `side`; `keep` gets each IP frame for the NAT and
    /// returns whether the frame stays held (its id staged for translation)
    /// or is done with (copied elsewhere, or dropped). The gateway is
    /// locked only for frames that are not plainly IP for natrix.
    pub(super) fn receive(&mut self, side: Side, now: u64, keep: &mut dyn FnMut(FrameId, &mut [u8], &mut Stage) -> bool) -> usize {
        let Links { ports, gateway, macs, stage, snapshot, .. } = self;
        let mut locked = None;
        let s = side as usize;
        ports.receive(s, BATCH, &mut |id, frame| {
            snapshot.rx_frames[s] += 1;
            snapshot.rx_bytes[s] += frame.len() as u64;
            let for_the_engine = plainly_for_the_engine(macs[s], frame)
                || locked.get_or_insert_with(|| lock(gateway)).ingress(side, frame, now, &mut |out, f| stage.push_addressed(out, f)) == Ingress::Engine;
            for_the_engine && keep(id, frame, stage)
        })
    }

    /// Sends a copy of a frame through the next-hop logic.
    fn send(&mut self, gateway: &mut Gateway, side: Side, frame: &mut [u8], now: u64) {
        let Links { ports, snapshot, .. } = self;
        gateway.egress(side, frame, now, &mut |out, f| count(snapshot, out, f.len(), ports.send(out as usize, f)));
    }

    /// Sends every staged frame (held ones from where they lie) and kicks
    /// both interfaces.
    pub(super) fn flush(&mut self, now: u64) {
        let mut stage = std::mem::take(&mut self.stage);
        let shared = Arc::clone(&self.gateway);
        let mut gateway = lock(&shared);
        for &(side, frame, next) in &stage.frames {
            debug_assert_ne!(next, Next::Translate, "flush: a received frame was never translated");
            match (frame, next) {
                // SAFETY: the stage held each id once, and flushing gives it up.
                (Staged::Held(id), Next::Route) => unsafe { self.route_held(&mut gateway, side, id, now) },
                (Staged::Held(_), Next::Handed) => {}
                // SAFETY: as above.
                (Staged::Held(id), _) => unsafe { self.ports.release(id) },
                (Staged::Made { at, len }, Next::Route) => self.send(&mut gateway, side, &mut stage.bytes[at..at + len], now),
                (Staged::Made { at, len }, Next::Send) => {
                    let sent = self.ports.send(side as usize, &stage.bytes[at..at + len]);
                    count(&mut self.snapshot, side, len, sent);
                }
                (Staged::Made { .. }, _) => {}
            }
        }
        stage.frames.clear();
        stage.bytes.clear();
        self.stage = stage;
        self.send_requests();
        gateway.expire(now);
        drop(gateway);
        let _ = self.ports.flush();
    }

    /// Addresses a held frame to its next hop and transmits it without a
    /// copy; one whose next hop is unknown waits in the gateway (a copy).
    ///
    /// # Safety
    /// The caller holds `id`, and gives it up.
    unsafe fn route_held(&mut self, gateway: &mut Gateway, side: Side, id: FrameId, now: u64) {
        let Links { ports, requests, snapshot, .. } = self;
        // SAFETY: the caller holds id.
        let frame = unsafe { ports.frame(id) };
        let len = frame.len();
        if gateway.address(side, frame, now, &mut |out, f| requests.push_addressed(out, f)) {
            // SAFETY: as above; the frame is given up here.
            let sent = unsafe { ports.transmit(side as usize, id) };
            count(snapshot, side, len, sent);
        } else {
            // SAFETY: as above; the gateway kept a copy where it waits.
            unsafe { ports.release(id) };
        }
    }

    fn send_requests(&mut self) {
        for &(side, frame, _) in &self.requests.frames {
            if let Staged::Made { at, len } = frame {
                let sent = self.ports.send(side as usize, &self.requests.bytes[at..at + len]);
                count(&mut self.snapshot, side, len, sent);
            }
        }
        self.requests.frames.clear();
        self.requests.bytes.clear();
    }

    pub(super) fn snapshot(&mut self) -> IoSnapshot {
        let mut s = self.snapshot.clone();
        for i in 0..2 {
            let c = self.ports.counters(i);
            s.rx_kernel_dropped[i] = c.kernel_dropped;
            s.rx_refused[i] = c.refused;
            s.tx_dropped[i] += c.tx_dropped;
            s.transmit_calls += c.transmit_calls;
            s.receive_calls += c.receive_calls;
        }
        s.gateway = self.gateway().counters.clone();
        s
    }

    /// Sleeps until a frame or the doorbell `bell` is waiting, or the timer
    /// interval has passed.
    pub(super) fn wait(&mut self, bell: i32) {
        let mut fds = self.ports.fds();
        fds.push(bell);
        self.snapshot.wait_calls += 1;
        wait_readable(&fds, SLEEP_MS);
    }
}

fn lock(gateway: &Mutex<Gateway>) -> MutexGuard<'_, Gateway> {
    gateway.lock().unwrap_or_else(PoisonError::into_inner)
}

fn count(snapshot: &mut IoSnapshot, side: Side, len: usize, sent: bool) {
    let s = side as usize;
    if sent {
        snapshot.tx_frames[s] += 1;
        snapshot.tx_bytes[s] += len as u64;
    } else {
        snapshot.tx_dropped[s] += 1;
    }
}
