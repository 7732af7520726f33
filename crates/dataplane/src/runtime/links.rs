//! Both interfaces, the router state around them (the gateway), the frames
//! of the current round, and the interfaces' counters: what the thread that
//! owns the interfaces works on. Per-queue workers each have links of
//! their own (their queues' sockets) and share one gateway, so a neighbour
//! any of them learns is known to all: it is locked once per round to
//! address what leaves (and never while sending), and on receipt only for
//! frames that are not plainly IP for natrix.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use natrix_engine::Side;
use natrix_io::{FrameId, FramePorts};

use super::stage::{Next, Stage, Staged};
use super::{IoSnapshot, BATCH};
use crate::gateway::{plainly_for_the_engine, Gateway, Ingress};
use crate::ring::wait_readable;

/// How often a thread with nothing to route still expires the frames
/// waiting for a next hop (they may wait 3 s).
const EXPIRY_INTERVAL_NS: u64 = 100_000_000;

pub(super) struct Links {
    pub(super) ports: Box<dyn FramePorts>,
    pub(super) gateway: Arc<Mutex<Gateway>>,
    /// natrix's MAC on each side, for `plainly_for_the_engine`.
    macs: [[u8; 6]; 2],
    /// When this thread last dropped frames that waited too long for a
    /// next hop.
    expired_at: u64,
    pub(super) stage: Stage,
    pub(super) snapshot: IoSnapshot,
    /// Frames the gateway makes while a held frame is being addressed
    /// (requests for next hops), sent after the round's frames.
    requests: Stage,
}

impl Links {
    pub(super) fn new(ports: Box<dyn FramePorts>, gateway: Arc<Mutex<Gateway>>) -> Links {
        let macs = [Side::Inside, Side::Outside].map(|side| lock(&gateway).mac(side));
        Links { ports, gateway, macs, expired_at: 0, stage: Stage::default(), snapshot: IoSnapshot::default(), requests: Stage::default() }
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
        let s = side as usize;
        ports.receive(s, BATCH, &mut |id, frame| {
            snapshot.rx_frames[s] += 1;
            snapshot.rx_bytes[s] += frame.len() as u64;
            let for_the_engine = plainly_for_the_engine(macs[s], frame) || lock(gateway).ingress(side, frame, now, &mut |out, f| stage.push_addressed(out, f)) == Ingress::Engine;
            for_the_engine && keep(id, frame, stage)
        })
    }

    /// Sends every staged frame (held ones from where they lie) and kicks
    /// both interfaces.
    pub(super) fn flush(&mut self, now: u64) {
        let mut stage = std::mem::take(&mut self.stage);
        self.address_routed(&mut stage, now);
        for &(side, frame, next) in &stage.frames {
            debug_assert_ne!(next, Next::Translate, "flush: a received frame was never translated");
            match (frame, next) {
                (Staged::Held(id), Next::Send) => {
                    // SAFETY: the stage held each id once, and flushing gives it up.
                    let sent = unsafe { self.ports.transmit(side as usize, id) };
                    count(&mut self.snapshot, side, id.len(), sent);
                }
                (Staged::Held(_), Next::Handed) => {}
                // SAFETY: as above; a frame waiting for its next hop waits as a copy.
                (Staged::Held(id), _) => unsafe { self.ports.release(id) },
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
        let _ = self.ports.flush();
    }

    /// Writes the next hop's addresses into every frame staged to be
    /// routed, under one lock of the gateway and before anything is sent:
    /// each becomes ready to send, or is done with where the gateway keeps
    /// a copy until its next hop answers (its request queued) or has no
    /// route for it. Frames that waited too long are dropped here too.
    fn address_routed(&mut self, stage: &mut Stage, now: u64) {
        let Stage { frames, bytes, .. } = stage;
        let routed = frames.iter().any(|&(_, _, next)| next == Next::Route);
        if !routed && now.saturating_sub(self.expired_at) < EXPIRY_INTERVAL_NS {
            return;
        }
        let Links { ports, gateway, requests, .. } = self;
        let mut gateway = lock(gateway);
        for (side, frame, next) in frames.iter_mut().filter(|f| f.2 == Next::Route) {
            let frame = match *frame {
                // SAFETY: the stage holds id.
                Staged::Held(id) => unsafe { ports.frame(id) },
                Staged::Made { at, len } => &mut bytes[at..at + len],
            };
            let ready = gateway.address(*side, frame, now, &mut |out, f| requests.push_addressed(out, f));
            *next = if ready { Next::Send } else { Next::Nothing };
        }
        gateway.expire(now, &mut |out, f| requests.push_addressed(out, f));
        self.expired_at = now;
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
            s.rx_checksums_completed[i] = c.checksums_completed;
            // Counted as sent when the port took them: lost after all.
            s.tx_frames[i] = s.tx_frames[i].saturating_sub(c.tx_dropped);
            s.tx_dropped[i] += c.tx_dropped;
            s.transmit_calls += c.transmit_calls;
            s.receive_calls += c.receive_calls;
        }
        s.gateway = self.gateway().counters.clone();
        s
    }

    /// Sleeps until a frame or the doorbell `bell` is waiting, or
    /// `timeout_ms` (`clock::sleep_ms`) has passed.
    pub(super) fn wait(&mut self, bell: i32, timeout_ms: i32) {
        let mut fds = self.ports.fds();
        fds.push(bell);
        self.snapshot.wait_calls += 1;
        wait_readable(&fds, timeout_ms);
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
